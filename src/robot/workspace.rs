//! The Cartesian box the tool point must stay in, checked by forward kinematics along the
//! chain (configured by `[workspace]`).

use super::KinematicChain;

#[derive(Clone, Debug)]
pub struct Workspace {
    pub(crate) chain: KinematicChain,
    pub min: [f64; 3],
    pub max: [f64; 3],
}

impl Workspace {
    pub(crate) fn contains(&self, q: &[f64]) -> bool {
        let p = self.chain.tool_position(q);
        (0..3).all(|i| p[i] >= self.min[i] && p[i] <= self.max[i])
    }
}

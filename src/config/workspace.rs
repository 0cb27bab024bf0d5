//! `[workspace]`: a Cartesian box for the tool point, checked by forward kinematics.

use super::check::Check;
use super::raw::RawWorkspace;
use super::ConfigError;
use crate::robot::urdf::UrdfModel;
use crate::robot::KinematicChain;

#[derive(Clone, Debug)]
pub struct Workspace {
    pub chain: KinematicChain,
    pub min: [f64; 3],
    pub max: [f64; 3],
}

impl Workspace {
    pub fn contains(&self, q: &[f64]) -> bool {
        let p = self.chain.tool_position(q);
        (0..3).all(|i| p[i] >= self.min[i] && p[i] <= self.max[i])
    }
}

pub fn validate(
    c: &Check,
    w: &RawWorkspace,
    model: &UrdfModel,
    names: &[String],
) -> Result<Workspace, ConfigError> {
    // Each bound is within its range (`ranges::RANGES`).
    for i in 0..3 {
        if !(w.min[i] < w.max[i]) {
            return c.fail(
                "workspace",
                format!(
                    "min[{i}] = {} must be below max[{i}] = {}",
                    w.min[i], w.max[i]
                ),
            );
        }
    }
    let chain = KinematicChain::from_urdf(model, &w.base_link, &w.tool_link, names)?;
    Ok(Workspace {
        chain,
        min: w.min,
        max: w.max,
    })
}

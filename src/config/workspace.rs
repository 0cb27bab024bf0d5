//! `[workspace]`: parsing and validation of the Cartesian box for the tool point (the box
//! itself, checked by forward kinematics, is `robot::Workspace`).

use super::check::Check;
use super::raw::RawWorkspace;
use super::ConfigError;
use crate::robot::urdf::UrdfModel;
use crate::robot::{KinematicChain, Workspace};

pub(crate) fn validate(
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

//! What the daemon knows about the arm: per-joint limits (URDF merged with config) and the
//! kinematic chain used for the Cartesian workspace check.

#[cfg(test)]
pub(crate) mod jtc_model;
pub(crate) mod kinematics;
pub(crate) mod limits;
pub(crate) mod lookahead;
pub(crate) mod urdf;
pub(crate) mod workspace;

pub(crate) use kinematics::KinematicChain;
pub(crate) use limits::SoftLimit;
pub use limits::{JointKind, JointLimits, RobotLimits};
pub(crate) use workspace::Workspace;

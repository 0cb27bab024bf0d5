//! What the daemon knows about the arm: per-joint limits (URDF merged with config) and the
//! kinematic chain used for the Cartesian workspace check.

pub mod kinematics;
pub mod limits;
pub mod urdf;
pub mod workspace;

pub use kinematics::KinematicChain;
pub use limits::{JointKind, JointLimits, RobotLimits, SoftLimit};
pub use workspace::Workspace;

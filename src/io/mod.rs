//! Transports between the daemon and the robot. They all meet at the `Blackboard`: the latest
//! inputs (joint state, camera frames, prompt, e-stop) and the latest command, readable by the
//! control thread without blocking.

pub mod board;
pub mod latest;
pub mod ros;
pub mod sim;

pub use board::{Blackboard, CommandOut, ControlDrill, RobotInputs, SupervisorFlags};
pub use latest::Latest;

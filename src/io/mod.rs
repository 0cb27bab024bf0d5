//! Transports between the daemon and the robot. They all meet at the `Blackboard`: the latest
//! inputs (joint state, camera frames, prompt, e-stop) and the latest command, readable by the
//! control thread without blocking.

pub(crate) mod board;
pub(crate) mod latest;
pub(crate) mod ros;
pub(crate) mod sim;

pub(crate) use board::Blackboard;
pub(crate) use board::ControlDrill;
pub(crate) use latest::Latest;

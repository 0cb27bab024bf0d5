//! The last stage before every command: limits, chunk validation, watchdogs, the safety state
//! machine, and an independent monitor that counts any limit the commands still break.

pub mod governor;
pub mod monitor;
pub mod state;
pub mod validate;

pub use governor::{Governor, GovernorReport, Target};
pub use monitor::LimitMonitor;
pub use state::{HoldReason, Mode, SafetyEvent, Waiting};

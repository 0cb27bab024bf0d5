//! Everything that can stop the arm: the safety supervisor (e-stop latch and reset, watchdogs,
//! which chunks may run, target checks), the governor's smoothing law and the hard limits it
//! ends with (`limiter`), whole-chunk validation, and an independent monitor that counts any
//! limit the commands still break.

pub mod governor;
pub mod limiter;
pub mod monitor;
pub mod reconfigure;
pub mod state;
pub mod supervisor;
pub mod validate;

pub use governor::{Governor, GovernorReport, Target};
pub use monitor::LimitMonitor;
pub use state::{HoldReason, Mode, ModeKind, SafetyEvent, Waiting};
pub use supervisor::{Supervisor, Verdict};

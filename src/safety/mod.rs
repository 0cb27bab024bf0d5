//! Everything that can stop the arm: the safety supervisor (e-stop latch and reset, watchdogs,
//! which chunks may run, target checks), the governor's smoothing law and the hard limits it
//! ends with (`limiter`), whole-chunk validation, and an independent monitor that counts any
//! limit the commands still break.

pub(crate) mod governor;
pub(crate) mod limiter;
pub(crate) mod monitor;
pub(crate) mod reconfigure;
pub(crate) mod state;
pub mod supervisor;
pub(crate) mod validate;

pub(crate) use governor::{Governor, GovernorReport, Target};
pub(crate) use monitor::LimitMonitor;
pub(crate) use state::{HoldReason, Mode, SafetyEvent};
pub(crate) use state::{ModeKind, Waiting};
pub(crate) use supervisor::Verdict;

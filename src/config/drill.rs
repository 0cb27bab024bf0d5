//! `[[drill]]`: deliberate faults at set times of a run, so that commissioning and
//! hardware-in-the-loop tests can see the robot, the service manager and the operators react
//! (a frozen control loop stops the systemd watchdog pings; a dead ROS thread ends in a fault
//! stop). Never for production: `check` and the start-up log warn about every drill.

use serde::Deserialize;

use super::check::Check;
use super::ConfigError;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawDrill {
    /// Seconds after the run starts (the service's READY).
    pub(crate) at_s: f64,
    pub(crate) event: DrillName,
    /// `stall_control` only.
    pub(crate) duration_s: Option<f64>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum DrillName {
    CrashControl,
    StallControl,
    CrashIo,
    GovernorFault,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum DrillKind {
    /// The control thread panics.
    CrashControl,
    /// The control thread stops ticking for this long (a deadlock, a page-fault storm).
    StallControl { duration_s: f64 },
    /// The I/O thread (ROS, or the simulator) panics, as a malformed frame once made it.
    CrashIo,
    /// One command from the governor jumps, as a governor bug would make it: the independent
    /// monitor must refuse it and stop the arm.
    GovernorFault,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Drill {
    pub at_s: f64,
    pub kind: DrillKind,
}

pub(crate) fn validate(c: &Check, raw: &[RawDrill]) -> Result<Vec<Drill>, ConfigError> {
    let mut drills = Vec::with_capacity(raw.len());
    for (i, d) in raw.iter().enumerate() {
        let field = |k: &str| format!("drill[{i}].{k}");
        // Times and durations are within their ranges (`ranges::RANGES`).
        let at_s = d.at_s;
        c.unused(
            &field("duration_s"),
            d.duration_s.is_some() && d.event != DrillName::StallControl,
            "only stall_control lasts",
        );
        let kind = match d.event {
            DrillName::CrashControl => DrillKind::CrashControl,
            DrillName::CrashIo => DrillKind::CrashIo,
            DrillName::GovernorFault => DrillKind::GovernorFault,
            DrillName::StallControl => {
                let Some(s) = d.duration_s else {
                    return c.fail(
                        &field("duration_s"),
                        "missing: how long the control thread stops ticking (s)",
                    );
                };
                DrillKind::StallControl { duration_s: s }
            }
        };
        c.warn(
            &format!("drill[{i}]"),
            format!(
                "fault drill `{}` at {at_s} s: for commissioning and tests, never in production",
                name(kind)
            ),
        );
        drills.push(Drill { at_s, kind });
    }
    drills.sort_by(|a, b| a.at_s.total_cmp(&b.at_s));
    Ok(drills)
}

/// The drill's name as configured.
pub(crate) fn name(kind: DrillKind) -> &'static str {
    match kind {
        DrillKind::CrashControl => "crash_control",
        DrillKind::StallControl { .. } => "stall_control",
        DrillKind::CrashIo => "crash_io",
        DrillKind::GovernorFault => "governor_fault",
    }
}

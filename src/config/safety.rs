//! `[safety]`: watchdog timeouts and whole-chunk validation thresholds.

use super::raw::RawSafety;

#[derive(Clone, Debug)]
pub(crate) struct SafetyConfig {
    pub joint_state_timeout_s: f64,
    pub camera_timeout_s: f64,
    pub overrun_streak: u32,
    /// A chunk target further than this outside a joint's limits rejects the whole chunk.
    pub(crate) chunk_position_tolerance: f64,
    /// A chunk whose consecutive steps move a joint faster than this multiple of its velocity
    /// limit is rejected as a jump.
    pub(crate) chunk_step_velocity_factor: f64,
    /// A measured position further than this outside a joint's limits is a sensor fault: the
    /// sample is refused (never taken as a position), as a non-finite one is.
    pub(crate) measured_position_tolerance: f64,
}

/// Each value is within its range (`ranges::RANGES`); nothing here depends on another.
pub(crate) fn validate(rs: &RawSafety) -> SafetyConfig {
    SafetyConfig {
        joint_state_timeout_s: rs.joint_state_timeout_s,
        camera_timeout_s: rs.camera_timeout_s,
        overrun_streak: rs.overrun_streak,
        chunk_position_tolerance: rs.chunk_position_tolerance,
        chunk_step_velocity_factor: rs.chunk_step_velocity_factor,
        measured_position_tolerance: rs.measured_position_tolerance,
    }
}

//! `[safety]`: watchdog timeouts and whole-chunk validation thresholds.

use super::check::Check;
use super::raw::RawSafety;
use super::ConfigError;

#[derive(Clone, Debug)]
pub struct SafetyConfig {
    pub joint_state_timeout_s: f64,
    pub camera_timeout_s: f64,
    pub overrun_streak: u32,
    /// A chunk target further than this outside a joint's limits rejects the whole chunk.
    pub chunk_position_tolerance: f64,
    /// A chunk whose consecutive steps move a joint faster than this multiple of its velocity
    /// limit is rejected as a jump.
    pub chunk_step_velocity_factor: f64,
}

pub fn validate(c: &Check, rs: &RawSafety) -> Result<SafetyConfig, ConfigError> {
    Ok(SafetyConfig {
        joint_state_timeout_s: c
            .positive("safety.joint_state_timeout_s", rs.joint_state_timeout_s)?,
        camera_timeout_s: c.positive("safety.camera_timeout_s", rs.camera_timeout_s)?,
        overrun_streak: if rs.overrun_streak >= 1 {
            rs.overrun_streak
        } else {
            return c.fail("safety.overrun_streak", "expected at least 1, found 0");
        },
        chunk_position_tolerance: c.non_negative(
            "safety.chunk_position_tolerance",
            rs.chunk_position_tolerance,
        )?,
        chunk_step_velocity_factor: c.in_range(
            "safety.chunk_step_velocity_factor",
            rs.chunk_step_velocity_factor,
            1.0,
            100.0,
        )?,
    })
}

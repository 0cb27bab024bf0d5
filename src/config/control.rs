//! `[control]`: the control loop's rate, chunk execution and lifecycle timings.

use std::time::Duration;

use serde::Deserialize;

use super::check::Check;
use super::raw::{MergeKind, RawControl};
use super::ConfigError;

/// How the target moves between chunk steps.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Interpolation {
    Linear,
    Cubic,
    Quintic,
}

/// How a newly arrived chunk takes over from the one being executed.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum MergeMode {
    /// New chunk's targets, reached from the current commanded state through a C2 blend.
    Blend,
    /// New chunk's targets at once; only the shortest C2 transition (two control periods).
    LatestOnly,
    /// LeRobot-style: overlapping steps are `old_weight * old + (1 - old_weight) * new`, then blended.
    WeightedAverage { old_weight: f64 },
}

#[derive(Clone, Debug)]
pub struct ControlConfig {
    pub rate_hz: f64,
    pub period: Duration,
    pub interpolation: Interpolation,
    pub merge: MergeMode,
    pub blend_window_s: f64,
    pub request_threshold_s: f64,
    pub warmup_chunks: u32,
    pub status_interval_s: f64,
    pub stop_timeout_s: f64,
    /// The arm must leave `starting` (run its first chunk) within this long after the control
    /// loop starts, or the daemon stops with its own exit code.
    pub start_timeout_s: f64,
    /// `[control.rtc]` (validated with the policy, whose chunk length it needs).
    pub rtc: super::RtcConfig,
}

/// LeRobot's default weight of the old chunk.
const WEIGHTED_AVERAGE_OLD: f64 = 0.3;

pub fn validate(c: &Check, rc: &RawControl) -> Result<ControlConfig, ConfigError> {
    let rate_hz = c.in_range("control.rate_hz", rc.rate_hz, 10.0, 1000.0)?;
    let merge = match rc.merge {
        MergeKind::Blend => MergeMode::Blend,
        MergeKind::LatestOnly => MergeMode::LatestOnly,
        MergeKind::WeightedAverage => MergeMode::WeightedAverage {
            old_weight: c.in_range(
                "control.weighted_average_old",
                rc.weighted_average_old.unwrap_or(WEIGHTED_AVERAGE_OLD),
                0.0,
                1.0,
            )?,
        },
    };
    c.unused(
        "control.weighted_average_old",
        rc.weighted_average_old.is_some() && rc.merge != MergeKind::WeightedAverage,
        "only control.merge = \"weighted_average\" uses it",
    );
    let period_s = 1.0 / rate_hz;
    let blend_window_s = c.positive("control.blend_window_s", rc.blend_window_s)?;
    if blend_window_s < 2.0 * period_s {
        return c.fail(
            "control.blend_window_s",
            format!(
                "expected at least two control periods ({:.4} s), found {blend_window_s}",
                2.0 * period_s
            ),
        );
    }
    Ok(ControlConfig {
        rate_hz,
        period: Duration::from_secs_f64(period_s),
        interpolation: rc.interpolation,
        merge,
        blend_window_s,
        request_threshold_s: c
            .non_negative("control.request_threshold_s", rc.request_threshold_s)?,
        warmup_chunks: rc.warmup_chunks,
        status_interval_s: c.positive("control.status_interval_s", rc.status_interval_s)?,
        stop_timeout_s: c.positive("control.stop_timeout_s", rc.stop_timeout_s)?,
        start_timeout_s: c.positive("control.start_timeout_s", rc.start_timeout_s)?,
        rtc: Default::default(),
    })
}

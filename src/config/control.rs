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
    pub(crate) warmup_chunks: u32,
    pub(crate) status_interval_s: f64,
    pub(crate) stop_timeout_s: f64,
    /// The arm must leave `starting` (run its first chunk) within this long after the control
    /// loop starts, or the daemon stops with its own exit code.
    pub start_timeout_s: f64,
    /// `[control.rtc]` (validated with the policy, whose chunk length it needs).
    pub rtc: super::RtcConfig,
}

/// LeRobot's default weight of the old chunk.
const WEIGHTED_AVERAGE_OLD: f64 = 0.3;

/// Each value is within its range (`ranges::RANGES`); what depends on other settings is
/// checked here.
pub(crate) fn validate(c: &Check, rc: &RawControl) -> Result<ControlConfig, ConfigError> {
    let rate_hz = rc.rate_hz;
    let merge = match rc.merge {
        MergeKind::Blend => MergeMode::Blend,
        MergeKind::LatestOnly => MergeMode::LatestOnly,
        MergeKind::WeightedAverage => MergeMode::WeightedAverage {
            old_weight: rc.weighted_average_old.unwrap_or(WEIGHTED_AVERAGE_OLD),
        },
    };
    c.unused(
        "control.weighted_average_old",
        rc.weighted_average_old.is_some() && rc.merge != MergeKind::WeightedAverage,
        "only control.merge = \"weighted_average\" uses it",
    );
    let period_s = 1.0 / rate_hz;
    let blend_window_s = rc.blend_window_s;
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
        request_threshold_s: rc.request_threshold_s,
        warmup_chunks: rc.warmup_chunks,
        status_interval_s: rc.status_interval_s,
        stop_timeout_s: rc.stop_timeout_s,
        start_timeout_s: rc.start_timeout_s,
        rtc: Default::default(),
    })
}

/// How long `joint` may take to brake to rest from its velocity limit: the governor plans a
/// stop at half the acceleration limit and 0.8 of the jerk limit (`safety::governor`), a
/// jerk-limited ramp down from v; before it, the acceleration the joint can have built
/// (at most the limit, at most sqrt(v j) on the way to v) is taken back at the jerk limit.
pub(crate) fn braking_time_s(joint: &crate::robot::JointLimits) -> f64 {
    let (v, a, j) = (joint.velocity, joint.acceleration, joint.jerk);
    let (a_plan, j_plan) = (0.5 * a, 0.8 * j);
    let ramp_down = if v * j_plan >= a_plan * a_plan {
        v / a_plan + a_plan / j_plan
    } else {
        2.0 * (v / j_plan).sqrt()
    };
    ramp_down + a.min((v * j).sqrt()) / j
}

/// The stop must be able to finish: `control.stop_timeout_s` at least the slowest joint's
/// braking time from its velocity limit (an upper bound: the governor's own stops take about
/// half of it) and ten control periods.
pub(crate) fn stop_fits(
    c: &Check,
    control: &ControlConfig,
    limits: &crate::robot::RobotLimits,
) -> Result<(), ConfigError> {
    let Some((joint, t)) = limits
        .joints
        .iter()
        .map(|j| (j, braking_time_s(j)))
        .max_by(|a, b| a.1.total_cmp(&b.1))
    else {
        return Ok(());
    };
    let need = t + 10.0 / control.rate_hz;
    if control.stop_timeout_s < need {
        return c.fail(
            "control.stop_timeout_s",
            format!(
                "{} s is too short for a stop to finish: joint `{}` needs up to {t:.2} s to \
                 brake to rest from its velocity limit {} at acceleration {} and jerk {} \
                 (limits.scale applied), so expected at least {need:.2} s (or lower the \
                 joint's velocity limit or raise its acceleration limit)",
                control.stop_timeout_s,
                joint.name,
                unit(joint, joint.velocity, "/s"),
                unit(joint, joint.acceleration, "/s²"),
                unit(joint, joint.jerk, "/s³"),
            ),
        );
    }
    Ok(())
}

fn unit(joint: &crate::robot::JointLimits, x: f64, per: &str) -> String {
    let base = match joint.kind {
        crate::robot::JointKind::Prismatic => "m",
        _ => "rad",
    };
    format!("{} {base}{per}", super::ranges::number(x))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::joints::JointVector;
    use crate::robot::{JointKind, JointLimits, RobotLimits};
    use crate::safety::{Governor, Target};
    use std::f64::consts::PI;

    /// The governor itself, driven to its velocity limit and then stopped: rest comes within
    /// `braking_time_s`, over the ranges' corners and the bundled arms' limits.
    #[test]
    fn when_governor_stops_from_velocity_limit_expect_rest_within_braking_time() {
        let mut worst: f64 = 0.0;
        for (v, a, j) in [
            (PI, 6.0, 150.0),
            (0.1, 0.5, 20.0),
            (PI, 3.0, 150.0),
            (1.0, 4.0, 80.0),
            (100.0, 1e4, 1e6),
            (100.0, 1e4, 1e-2),
            (100.0, 1e-3, 1e6),
            (1e-3, 1e-3, 1e-2),
            (1e-3, 1e4, 1e6),
            (1.0, 1e-1, 1e6),
            (2.0, 1e3, 1e-2),
        ] {
            for dt in [0.001, 0.005, 0.1] {
                let joint = JointLimits {
                    name: "j".into(),
                    kind: JointKind::Revolute,
                    lower: -1000.0,
                    upper: 1000.0,
                    velocity: v,
                    acceleration: a,
                    jerk: j,
                    effort: 0.0,
                    soft: None,
                    max_step: f64::INFINITY,
                };
                let t = braking_time_s(&joint);
                let mut g = Governor::new(
                    RobotLimits::new(vec![joint]),
                    dt,
                    JointVector::from_slice(&[-999.0]),
                );
                let far = JointVector::from_slice(&[999.0]);
                let meas = JointVector::from_slice(&[-999.0]);
                // Up to the velocity limit, or as fast as 30 s of travel allows.
                let mut ticks = 0;
                while g.state().velocity[0] < 0.999 * v && (ticks as f64) * dt < 30.0 {
                    g.step(Target::Track(&far), &meas);
                    ticks += 1;
                }
                let mut stop = 0;
                while !g.step(Target::Stop, &meas).at_rest {
                    stop += 1;
                    assert!(stop < 10_000_000, "v {v} a {a} j {j} dt {dt}: no rest");
                }
                let took = stop as f64 * dt;
                worst = worst.max(took / (t + 10.0 * dt));
                eprintln!("v {v} a {a} j {j} dt {dt}: {took:.3} s of {t:.3} s");
            }
        }
        assert!(worst <= 1.0, "worst {worst}");
    }
}

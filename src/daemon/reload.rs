//! SIGHUP: the configuration file is read again and what can change safely while the arm runs
//! is applied: the prompt, the status line's interval, and limits that are only tighter
//! (applied at rest: a running arm holds first, then resumes with a fresh chunk). Anything else
//! that changed is refused with a log line naming the field; the running configuration stays.

use crate::config::Config;
use crate::joints::JointVector;
use crate::robot::RobotLimits;

/// What a reload changes, and what it refuses (field, why).
#[derive(Debug, Default)]
pub struct Reload {
    pub prompt: Option<String>,
    pub status_interval_s: Option<f64>,
    pub limits: Option<RobotLimits>,
    pub refused: Vec<(String, String)>,
}

const RESTART: &str = "changed; restart pi0d to apply it";

/// Compares the running configuration with the file's; `measured` is the arm's position now
/// (tighter position limits must still contain it).
pub fn plan(old: &Config, new: &Config, measured: &JointVector) -> Reload {
    let mut r = Reload::default();
    let mut refuse = |field: &str, why: &str| r.refused.push((field.to_string(), why.to_string()));
    macro_rules! same {
        ($($section:ident . $field:ident),+ $(,)?) => {
            $(if format!("{:?}", old.$section.$field) != format!("{:?}", new.$section.$field) {
                refuse(concat!(stringify!($section), ".", stringify!($field)), RESTART);
            })+
        };
    }
    same!(
        control.rate_hz,
        control.interpolation,
        control.merge,
        control.blend_window_s,
        control.request_threshold_s,
        control.warmup_chunks,
        control.stop_timeout_s,
        control.start_timeout_s,
        control.rtc,
        safety.joint_state_timeout_s,
        safety.camera_timeout_s,
        safety.overrun_streak,
        safety.chunk_position_tolerance,
        safety.chunk_step_velocity_factor,
        policy.action_map,
        policy.state,
        policy.chunk_steps,
        policy.step_period_s,
        policy.fault,
    );
    for (field, a, b) in [
        (
            "policy",
            format!("{:?}", old.policy.source),
            format!("{:?}", new.policy.source),
        ),
        (
            "robot.urdf",
            format!("{:?}", old.urdf),
            format!("{:?}", new.urdf),
        ),
        (
            "workspace",
            format!("{:?}", old.workspace),
            format!("{:?}", new.workspace),
        ),
        ("ros", format!("{:?}", old.io), format!("{:?}", new.io)),
        ("sim", format!("{:?}", old.sim), format!("{:?}", new.sim)),
        (
            "realtime",
            format!("{:?}", old.realtime),
            format!("{:?}", new.realtime),
        ),
    ] {
        if a != b {
            refuse(field, RESTART);
        }
    }
    let limits = limits_change(&old.limits, &new.limits, measured);
    match limits {
        Ok(l) => r.limits = l,
        Err(refusals) => r.refused.extend(refusals),
    }
    if old.policy.prompt != new.policy.prompt {
        r.prompt = Some(new.policy.prompt.clone());
    }
    if old.control.status_interval_s != new.control.status_interval_s {
        r.status_interval_s = Some(new.control.status_interval_s);
    }
    r
}

/// The new limits if they differ and are nowhere looser (and the arm stands inside them).
fn limits_change(
    old: &RobotLimits,
    new: &RobotLimits,
    measured: &JointVector,
) -> Result<Option<RobotLimits>, Vec<(String, String)>> {
    let names = |l: &RobotLimits| l.joints.iter().map(|j| j.name.clone()).collect::<Vec<_>>();
    if names(old) != names(new) {
        return Err(vec![("robot.joints".into(), RESTART.into())]);
    }
    let mut refused = Vec::new();
    let mut changed = false;
    for (i, (a, b)) in old.joints.iter().zip(&new.joints).enumerate() {
        let field = |f: &str| format!("limits.joints.{}.{f}", a.name);
        for (f, was, now, looser) in [
            ("lower", a.lower, b.lower, b.lower < a.lower),
            ("upper", a.upper, b.upper, b.upper > a.upper),
            ("velocity", a.velocity, b.velocity, b.velocity > a.velocity),
            (
                "acceleration",
                a.acceleration,
                b.acceleration,
                b.acceleration > a.acceleration,
            ),
            ("jerk", a.jerk, b.jerk, b.jerk > a.jerk),
            ("max_step", a.max_step, b.max_step, b.max_step > a.max_step),
        ] {
            if looser {
                refused.push((
                    field(f),
                    format!(
                        "{now} is looser than the running {was}: only tighter limits are reloaded"
                    ),
                ));
            } else if now != was {
                changed = true;
            }
        }
        let p = if i < measured.len() {
            measured[i]
        } else {
            f64::NAN
        };
        if !(p >= b.lower && p <= b.upper) {
            refused.push((
                field("lower"),
                format!(
                    "the arm stands at {p:.4}, outside the new range {} .. {}",
                    b.lower, b.upper
                ),
            ));
        }
    }
    if refused.is_empty() {
        Ok(changed.then(|| new.clone()))
    } else {
        Err(refused)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn sim(edit: impl Fn(&mut toml::Table)) -> Config {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let text = std::fs::read_to_string(root.join("config/sim.toml")).unwrap();
        let mut t: toml::Table = text.parse().unwrap();
        edit(&mut t);
        Config::parse(&root.join("config/sim.toml"), &toml::to_string(&t).unwrap()).unwrap()
    }

    fn start(c: &Config) -> JointVector {
        c.sim.initial_position
    }

    #[test]
    fn prompt_and_tighter_limits_are_taken_and_everything_else_refused_by_name() {
        let old = sim(|_| {});
        let new = sim(|t| {
            t["policy"]["prompt"] = "stack the cups".into();
            t["limits"]["acceleration"] = 3.0.into();
            t["control"]["rate_hz"] = 500.into();
        });
        let r = plan(&old, &new, &start(&old));
        assert_eq!(r.prompt.as_deref(), Some("stack the cups"));
        let l = r.limits.expect("tighter acceleration");
        assert!(l
            .joints
            .iter()
            .filter(|j| j.name != "gripper")
            .all(|j| j.acceleration == 3.0));
        assert_eq!(r.refused.len(), 1, "{:?}", r.refused);
        assert_eq!(r.refused[0].0, "control.rate_hz");
    }

    #[test]
    fn looser_limits_are_refused_naming_the_joint_and_field() {
        let old = sim(|_| {});
        let new = sim(|t| t["limits"]["jerk"] = 300.0.into());
        let r = plan(&old, &new, &start(&old));
        assert!(r.limits.is_none());
        assert!(
            r.refused
                .iter()
                .any(|(f, why)| f == "limits.joints.elbow.jerk" && why.contains("looser")),
            "{:?}",
            r.refused
        );
        // Nothing changed: nothing to do.
        let r = plan(&old, &old, &start(&old));
        assert!(r.prompt.is_none() && r.limits.is_none() && r.refused.is_empty());
    }
}

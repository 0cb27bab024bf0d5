//! The control tick under reloaded limits and under a faulty governor, in synthetic time:
//! a reload can never make a command leave the limits in force (a tighter range is applied only
//! where the arm comes to rest inside it, or refused), and a command the independent monitor
//! finds outside the limits is never commanded: the arm brakes and the stop is latched.

use proptest::prelude::*;

use crate::chunk::JointChunk;
use crate::config::{Interpolation, MergeMode};
use crate::control::{Controller, ControllerSettings, Executor, TickInputs, TickReport};
use crate::joints::{JointMeasurement, JointVector, MotionState};
use crate::robot::lookahead::Lookahead;
use crate::robot::{JointKind, JointLimits, RobotLimits};
use crate::safety::reconfigure::Reconfigure;
use crate::safety::supervisor::SafetyInputs;
use crate::safety::{HoldReason, Mode};
use crate::time::MonoTime;

const CHUNK_STEPS: usize = 50;
const STEP_S: f64 = 0.02;
/// A new chunk every this long (half a chunk), as a policy slower than the control loop sends.
const CHUNK_EVERY_S: f64 = 0.5;

fn joint(name: &str, lower: f64, upper: f64, velocity: f64, acceleration: f64) -> JointLimits {
    JointLimits {
        name: name.into(),
        kind: JointKind::Revolute,
        lower,
        upper,
        velocity,
        acceleration,
        jerk: 50.0 * acceleration,
        effort: 0.0,
        soft: None,
        max_step: f64::INFINITY,
    }
}

/// Each joint follows `amplitude * sin(2 pi f t)` from its start, as the scripted policy does.
#[derive(Clone, Debug)]
struct Motion {
    amplitude: Vec<f64>,
    hz: Vec<f64>,
}

impl Motion {
    fn at(&self, start: &[f64], t: f64) -> JointVector {
        let p: Vec<f64> = (0..start.len())
            .map(|j| start[j] + self.amplitude[j] * (std::f64::consts::TAU * self.hz[j] * t).sin())
            .collect();
        JointVector::from_slice(&p)
    }
}

struct Rig {
    ctl: Controller,
    t0: MonoTime,
    dt: f64,
    start: Vec<f64>,
    measured: JointMeasurement,
    seq: u64,
    next_chunk_s: f64,
}

impl Rig {
    fn new(limits: RobotLimits, rate_hz: f64, start: &[f64]) -> Rig {
        let dt = 1.0 / rate_hz;
        let t0 = MonoTime::from_nanos(1_000_000_000_000);
        let measured = JointMeasurement {
            stamp: t0,
            position: JointVector::from_slice(start),
        };
        let executor = Executor::new(Interpolation::Cubic, MergeMode::Blend, 0.2, dt);
        let settings = ControllerSettings {
            joint_state_timeout_s: 0.1,
            camera_timeout_s: 0.5,
            overrun_streak: 10,
            request_threshold_s: 0.5,
            warmup_chunks: 0,
            trajectory_joints: Vec::new(),
            trajectory_coast_s: 0.05,
            trajectory_interval_s: 0.0,
        };
        let ctl = Controller::new(limits, dt, executor, None, settings, &measured, t0)
            .expect("starts inside its limits");
        Rig {
            ctl,
            t0,
            dt,
            start: start.to_vec(),
            measured,
            seq: 0,
            next_chunk_s: 0.0,
        }
    }

    /// One tick at `t` s; a chunk of `motion` from an observation 10 ms old arrives every
    /// `CHUNK_EVERY_S`.
    fn tick(&mut self, t: f64, motion: &Motion) -> TickReport {
        let now = self.t0.offset_seconds(t);
        let mut new_chunk = None;
        if t >= self.next_chunk_s {
            self.next_chunk_s += CHUNK_EVERY_S;
            let obs_t = (t - 0.01).max(1e-6);
            let mut c = JointChunk::with_capacity(CHUNK_STEPS);
            c.obs_stamp = self.t0.offset_seconds(obs_t);
            c.period_s = STEP_S;
            c.seq = self.seq;
            self.seq += 1;
            for i in 0..CHUNK_STEPS {
                c.positions
                    .push(motion.at(&self.start, obs_t + i as f64 * STEP_S));
            }
            c.update_derivatives();
            new_chunk = Some(Box::new(c));
        }
        let report = self.ctl.tick(
            TickInputs {
                safety: SafetyInputs::quiet(now, &self.measured),
                new_chunk,
                inference_in_flight: false,
                trajectories_sent: None,
            },
            &mut |_| {},
        );
        // A perfect arm: it is where it was commanded, measured 1 ms ago.
        self.measured = JointMeasurement {
            stamp: now.offset_seconds(-0.001),
            position: report.command.position,
        };
        report
    }
}

/// Finite differences of consecutive commands against the limits in force at each.
struct Judge {
    dt: f64,
    prev: Option<JointVector>,
    prev_v: Option<Vec<f64>>,
}

impl Judge {
    fn check(
        &mut self,
        k: usize,
        limits: &RobotLimits,
        c: &JointVector,
    ) -> Result<(), TestCaseError> {
        let mut v = vec![0.0; c.len()];
        for (j, l) in limits.joints.iter().enumerate() {
            let p = c[j];
            if !(p >= l.lower - 1e-9 && p <= l.upper + 1e-9) {
                return Err(TestCaseError::fail(format!(
                    "tick {k} joint {j}: {p} outside [{}, {}]",
                    l.lower, l.upper
                )));
            }
            if let Some(prev) = &self.prev {
                v[j] = (p - prev[j]) / self.dt;
                if v[j].abs() > l.velocity * (1.0 + 1e-6) + 1e-9 {
                    return Err(TestCaseError::fail(format!(
                        "tick {k} joint {j}: velocity {} > {}",
                        v[j], l.velocity
                    )));
                }
                if let Some(pv) = &self.prev_v {
                    let a = (v[j] - pv[j]) / self.dt;
                    if a.abs() > l.acceleration * (1.0 + 1e-6) + 1e-5 {
                        return Err(TestCaseError::fail(format!(
                            "tick {k} joint {j}: acceleration {a} > {}",
                            l.acceleration
                        )));
                    }
                }
            }
        }
        if self.prev.is_some() {
            self.prev_v = Some(v);
        }
        self.prev = Some(*c);
        Ok(())
    }
}

/// Runs `motion` for `duration_s`, reloading `new` at `reload_at_s`; checks every command
/// against the limits in force and returns what became of the reload (at most one outcome).
fn run_with_reload(
    old: RobotLimits,
    new: RobotLimits,
    rate_hz: f64,
    start: &[f64],
    motion: &Motion,
    reload_at_s: f64,
    duration_s: f64,
) -> Result<Vec<Reconfigure>, TestCaseError> {
    let mut rig = Rig::new(old.clone(), rate_hz, start);
    let mut judge = Judge {
        dt: rig.dt,
        prev: Some(JointVector::from_slice(start)),
        prev_v: Some(vec![0.0; start.len()]),
    };
    let mut in_force = old;
    let mut to_send = Some(new.clone());
    let mut outcomes = Vec::new();
    let ticks = (duration_s / rig.dt) as usize;
    for k in 1..=ticks {
        let t = k as f64 * rig.dt;
        if t >= reload_at_s {
            if let Some(l) = to_send.take() {
                rig.ctl.request_limits(Box::new(l));
            }
        }
        let report = rig.tick(t, motion);
        if let Some(r) = report.reconfigured {
            if r == Reconfigure::Applied {
                in_force = new.clone();
            }
            outcomes.push(r);
        }
        judge.check(k, &in_force, &report.command.position)?;
        check_tail(k, &in_force, &rig.ctl.lookahead(), &report.command)?;
        if rig.ctl.monitor().violations != 0 {
            return Err(TestCaseError::fail(format!(
                "tick {k}: the monitor counted {} violations",
                rig.ctl.monitor().violations
            )));
        }
    }
    Ok(outcomes)
}

/// The braking tail a trajectory output sends after the command (planned with the look-ahead
/// the controller hands the transports) keeps the limits in force as well: a reload that the
/// governor follows but the tail did not would let a controller coast past the new range.
fn check_tail(
    k: usize,
    limits: &RobotLimits,
    lookahead: &Lookahead,
    command: &MotionState,
) -> Result<(), TestCaseError> {
    let mut plan = Vec::new();
    lookahead.plan(command, 0.005, &mut plan);
    for point in &plan {
        let s = &point.state;
        for j in 0..limits.len() {
            let (p, v, a) = (s.position[j], s.velocity[j], s.acceleration[j]);
            if p < limits.lower[j] - 1e-9
                || p > limits.upper[j] + 1e-9
                || v.abs() > limits.velocity[j] * (1.0 + 1e-9)
                || a.abs() > limits.acceleration[j] * (1.0 + 1e-9)
            {
                return Err(TestCaseError::fail(format!(
                    "tick {k}: the tail of {command:?} reaches {p} rad, {v} rad/s, {a} rad/s² \
                     on joint {j} at {} s, outside {:?}",
                    point.t_s, limits.joints[j]
                )));
            }
        }
    }
    Ok(())
}

/// The filed case's shape: a joint limited to 0.2 rad/s² following 2 rad at 0.1 Hz; at 3 s
/// (0.70 rad, moving up at 0.2 rad/s) its upper limit is reloaded as 0.75. The arm stands
/// inside the new range, but braking under the running limits it comes to rest near 0.80:
/// the new range is refused (applied at rest it would clamp the command 0.05 rad in one 5 ms
/// tick), and the arm runs on under the limits in force.
#[test]
fn when_tighter_range_reloaded_mid_motion_expect_no_jump_and_refusal_naming_the_joint() {
    let old = RobotLimits::new(vec![joint("shoulder_pan", -3.0, 3.0, 2.0, 0.2)]);
    let mut tighter = old.joints[0].clone();
    tighter.upper = 0.75;
    let new = RobotLimits::new(vec![tighter]);
    let motion = Motion {
        amplitude: vec![2.0],
        hz: vec![0.1],
    };
    let outcomes = run_with_reload(old, new, 200.0, &[0.0], &motion, 3.0, 8.0).unwrap();
    match outcomes.as_slice() {
        [Reconfigure::Refused(o)] => {
            assert_eq!(o.joint, 0);
            assert!(o.position > 0.75 && o.position < 3.0, "{o:?}");
            assert_eq!(o.upper, 0.75);
        }
        other => panic!("expected one refusal, got {other:?}"),
    }
}

/// A range that still holds where the arm comes to rest: the arm holds, the limits apply at
/// rest, and it resumes with a fresh chunk under them.
#[test]
fn when_tighter_range_contains_the_stop_expect_hold_then_applied_at_rest_then_running() {
    let old = RobotLimits::new(vec![joint("shoulder_pan", -3.0, 3.0, 2.0, 0.2)]);
    let mut tighter = old.joints[0].clone();
    tighter.upper = 2.5;
    tighter.velocity = 1.0;
    let new = RobotLimits::new(vec![tighter]);
    let motion = Motion {
        amplitude: vec![2.0],
        hz: vec![0.1],
    };
    let mut rig = Rig::new(old, 200.0, &[0.0]);
    let mut modes = Vec::new();
    let mut outcomes = Vec::new();
    for k in 1..=(10.0 / rig.dt) as usize {
        let t = k as f64 * rig.dt;
        if k == (3.0 / rig.dt) as usize {
            rig.ctl.request_limits(Box::new(new.clone()));
        }
        let r = rig.tick(t, &motion);
        outcomes.extend(r.reconfigured);
        if modes.last() != Some(&r.mode) {
            modes.push(r.mode);
        }
    }
    assert_eq!(outcomes, vec![Reconfigure::Applied]);
    let hold = modes
        .iter()
        .position(|m| *m == Mode::Holding(HoldReason::Reconfigure))
        .expect("held to apply them");
    assert!(modes[hold + 1..].contains(&Mode::Running), "{modes:?}");
    assert_eq!(rig.ctl.monitor().violations, 0);
}

fn tighter(l: &JointLimits, shrink_lower: f64, shrink_upper: f64, scale: f64) -> JointLimits {
    let width = l.upper - l.lower;
    JointLimits {
        lower: l.lower + shrink_lower * width,
        upper: l.upper - shrink_upper * width,
        velocity: l.velocity * scale,
        acceleration: l.acceleration * scale,
        jerk: l.jerk * scale,
        ..l.clone()
    }
}

/// A case: joints, a motion, and a reload of tighter limits at a random time.
#[derive(Clone, Debug)]
struct ReloadCase {
    old: Vec<JointLimits>,
    new: Vec<JointLimits>,
    motion: Motion,
    rate_hz: f64,
    reload_at_s: f64,
}

fn reload_case() -> impl Strategy<Value = ReloadCase> {
    (1usize..=4)
        .prop_flat_map(|n| {
            (
                prop::collection::vec(
                    (
                        -3.0f64..-0.5,
                        0.5f64..3.0,
                        0.3f64..3.0,
                        0.1f64..8.0,
                        0.0f64..0.45,
                        0.0f64..0.45,
                        0.2f64..1.0,
                        0.0f64..2.5,
                        0.05f64..1.0,
                    ),
                    n,
                ),
                prop_oneof![Just(100.0), Just(200.0), Just(500.0)],
                0.2f64..4.0,
            )
        })
        .prop_map(|(joints, rate_hz, reload_at_s)| {
            let mut old = Vec::new();
            let mut new = Vec::new();
            let mut motion = Motion {
                amplitude: Vec::new(),
                hz: Vec::new(),
            };
            for (lower, upper, v, a, sl, su, scale, amp, hz) in joints {
                let l = joint("j", lower, upper, v, a);
                new.push(tighter(&l, sl, su, scale));
                old.push(l);
                motion.amplitude.push(amp);
                motion.hz.push(hz);
            }
            ReloadCase {
                old,
                new,
                motion,
                rate_hz,
                reload_at_s,
            }
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Whatever the motion and whenever the reload: every command stays inside the limits in
    /// force (the old ones until the controller applies the new), and a reload is decided
    /// exactly once when the arm is not stopping.
    #[test]
    fn when_tighter_limits_reloaded_at_random_expect_commands_inside_the_limits_in_force(
        case in reload_case()
    ) {
        let start = vec![0.0; case.old.len()];
        let r = run_with_reload(
            RobotLimits::new(case.old.clone()),
            RobotLimits::new(case.new.clone()),
            case.rate_hz,
            &start,
            &case.motion,
            case.reload_at_s,
            case.reload_at_s + 4.0,
        );
        match r {
            Err(e) => prop_assert!(false, "{e}"),
            Ok(outcomes) => prop_assert!(
                outcomes.len() <= 1 && !outcomes.contains(&Reconfigure::Abandoned),
                "{outcomes:?}"
            ),
        }
    }
}

/// The independent monitor acts: a governor that makes one command jump (the fault drill) has
/// that command refused before it is commanded, the arm braking from the last good one within
/// the limits, and the stop latched (no later chunk runs).
#[test]
fn when_governor_makes_a_command_jump_expect_monitor_refuses_it_and_latches_the_stop() {
    let limits = RobotLimits::new(vec![
        joint("a", -3.0, 3.0, 2.0, 4.0),
        joint("b", -3.0, 3.0, 2.0, 4.0),
    ]);
    let motion = Motion {
        amplitude: vec![0.8, 0.5],
        hz: vec![0.2, 0.3],
    };
    let mut rig = Rig::new(limits.clone(), 200.0, &[0.0, 0.0]);
    let mut judge = Judge {
        dt: rig.dt,
        prev: Some(JointVector::zeros(2)),
        prev_v: Some(vec![0.0; 2]),
    };
    let mut flagged = Vec::new();
    let mut last = None;
    for k in 1..=(5.0 / rig.dt) as usize {
        let t = k as f64 * rig.dt;
        if k == (1.5 / rig.dt) as usize {
            rig.ctl.inject_governor_fault(0.2);
        }
        let r = rig.tick(t, &motion);
        judge.check(k, &limits, &r.command.position).unwrap();
        if r.limit_violation {
            flagged.push(k);
        }
        last = Some(r);
    }
    assert_eq!(
        flagged,
        vec![(1.5 / rig.dt) as usize],
        "flagged once, at the fault"
    );
    let last = last.unwrap();
    assert_eq!(last.mode, Mode::Holding(HoldReason::LimitViolation));
    assert!(last.command.velocity.iter().all(|v| *v == 0.0), "at rest");
    assert_eq!(
        rig.ctl.monitor().violations,
        1,
        "the refused command counted"
    );
}

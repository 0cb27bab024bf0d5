//! Property tests of the whole tick (executor + state machine + governor) over random limits,
//! random chunks (NaN, Inf, huge steps, targets far outside the limits), random merge and
//! interpolation modes, random arrival times and e-stops, with or without real-time chunking
//! (each chunk's first steps following the running chunk's plan, as RTC makes them): every
//! command is finite and inside
//! the position, velocity and acceleration limits, and the jerk limit holds wherever no hard
//! limit overrides it (and always when no position limit is within reach, chunk switches
//! included).
//!
//! It sits in `daemon`, above both `control` and `policy`: real-time chunking's weights
//! (`policy::rtc`) shape the chunks the control tick is given.

use proptest::prelude::*;
use proptest::strategy::ValueTree;

use crate::chunk::JointChunk;
use crate::config::{Interpolation, MergeMode};
use crate::control::{Controller, ControllerSettings, Executor, TickInputs};
use crate::joints::JointMeasurement;
use crate::joints::JointVector;
use crate::robot::{JointKind, JointLimits, RobotLimits};
use crate::safety::supervisor::SafetyInputs;
use crate::safety::SafetyEvent;
use crate::time::MonoTime;

#[derive(Clone, Debug)]
enum Fault {
    None,
    Nan(usize, usize),
    Inf(usize, usize),
    Jump(usize, f64),
    FarOutside(f64),
}

#[derive(Clone, Debug)]
struct ChunkSpec {
    arrival_s: f64,
    latency_s: f64,
    /// Offset of the chunk's start from the current command, per joint.
    start_offset: Vec<f64>,
    /// Per-step increments, per joint.
    walk: Vec<Vec<f64>>,
    fault: Fault,
}

#[derive(Clone, Debug)]
struct Case {
    limits: Vec<JointLimits>,
    rate_hz: f64,
    start: Vec<f64>,
    chunks: Vec<ChunkSpec>,
    interpolation: Interpolation,
    merge: MergeMode,
    blend_window_s: f64,
    estop: Option<(f64, f64)>,
    /// Real-time chunking's (inference delay, execution horizon) in steps: each new chunk is
    /// pulled towards the running one's plan as RTC's linear schedule weighs it.
    rtc: Option<(usize, usize)>,
}

const STEPS: usize = 50;
const PERIOD: f64 = 0.02;
const DURATION_S: f64 = 2.5;

/// Joint limits: an arm's joints, or (`slow`) a gripper's, whose small acceleration and jerk
/// limits let it pass near zero velocity while still accelerating.
fn joint_limits(continuous: bool, slow: bool) -> impl Strategy<Value = JointLimits> {
    let (velocity, acceleration, jerk) = if slow {
        (0.05f64..0.2, 0.2f64..1.0, 5.0f64..30.0)
    } else {
        (0.2f64..4.0, 1.0f64..20.0, 20.0f64..500.0)
    };
    (
        -2.0f64..0.0,
        0.2f64..4.0,
        velocity,
        acceleration,
        jerk,
        prop_oneof![Just(f64::INFINITY), 0.05f64..1.0],
    )
        .prop_map(
            move |(lower, width, velocity, acceleration, jerk, max_step)| JointLimits {
                name: "j".into(),
                kind: if continuous {
                    JointKind::Continuous
                } else {
                    JointKind::Revolute
                },
                lower: if continuous { f64::NEG_INFINITY } else { lower },
                upper: if continuous {
                    f64::INFINITY
                } else {
                    lower + width
                },
                velocity,
                acceleration,
                jerk,
                effort: 0.0,
                soft: None,
                max_step,
            },
        )
}

/// How far chunks stray: `Wild` walks at up to 4 rad/s and starts up to 1.5 rad away (many
/// cases end in a limit brake), `Gentle` stays within what most limits allow (tracking),
/// `Slow` is a gripper's few millimetres on slow joints.
#[derive(Clone, Copy, Debug)]
enum Spread {
    Wild,
    Gentle,
    Slow,
}

fn chunk_spec(n: usize, faults: bool, spread: Spread) -> impl Strategy<Value = ChunkSpec> {
    let (offset, step) = match spread {
        Spread::Wild => (1.5, 0.08),
        Spread::Gentle => (0.1, 0.004),
        Spread::Slow => (0.005, 0.0005),
    };
    let fault = if faults {
        prop_oneof![
            4 => Just(Fault::None),
            1 => (0..STEPS, 0..n).prop_map(|(s, j)| Fault::Nan(s, j)),
            1 => (0..STEPS, 0..n).prop_map(|(s, j)| Fault::Inf(s, j)),
            1 => (1..STEPS, -20.0f64..20.0).prop_map(|(s, d)| Fault::Jump(s, d)),
            1 => (-50.0f64..50.0).prop_map(Fault::FarOutside),
        ]
        .boxed()
    } else {
        Just(Fault::None).boxed()
    };
    (
        0.0f64..DURATION_S,
        0.0f64..1.3,
        prop::collection::vec(-offset..offset, n),
        prop::collection::vec(prop::collection::vec(-step..step, n), STEPS),
        fault,
    )
        .prop_map(
            |(arrival_s, latency_s, start_offset, walk, fault)| ChunkSpec {
                arrival_s,
                latency_s,
                start_offset,
                walk,
                fault,
            },
        )
}

fn case(continuous: bool, faults: bool, spread: Spread) -> impl Strategy<Value = Case> {
    (1usize..=6)
        .prop_flat_map(move |n| {
            (
                prop::collection::vec(joint_limits(continuous, matches!(spread, Spread::Slow)), n),
                prop_oneof![Just(100.0), Just(200.0), Just(500.0), Just(1000.0)],
                prop::collection::vec(0.0f64..1.0, n),
                prop::collection::vec(chunk_spec(n, faults, spread), 1..8),
                prop_oneof![
                    Just(Interpolation::Linear),
                    Just(Interpolation::Cubic),
                    Just(Interpolation::Quintic)
                ],
                prop_oneof![
                    Just(MergeMode::Blend),
                    Just(MergeMode::LatestOnly),
                    (0.0f64..1.0).prop_map(|w| MergeMode::WeightedAverage { old_weight: w })
                ],
                0.02f64..0.5,
                prop::option::of((0.0f64..DURATION_S, 0.0f64..1.0)),
                prop::option::of((0usize..15, 1usize..30).prop_map(|(d, x)| (d, d + x))),
            )
        })
        .prop_map(
            |(limits, rate_hz, frac, chunks, interpolation, merge, blend_window_s, estop, rtc)| {
                let start = limits
                    .iter()
                    .zip(&frac)
                    .map(|(l, f)| {
                        if l.lower.is_finite() {
                            l.lower + f * (l.upper - l.lower)
                        } else {
                            4.0 * f - 2.0
                        }
                    })
                    .collect();
                Case {
                    limits,
                    rate_hz,
                    start,
                    chunks,
                    interpolation,
                    merge,
                    blend_window_s,
                    estop,
                    rtc,
                }
            },
        )
}

fn build_chunk(spec: &ChunkSpec, from: &JointVector, obs: MonoTime, seq: u64) -> Box<JointChunk> {
    let n = from.len();
    let mut c = JointChunk::with_capacity(STEPS);
    c.obs_stamp = obs;
    c.period_s = PERIOD;
    c.seq = seq;
    let mut p: Vec<f64> = (0..n).map(|j| from[j] + spec.start_offset[j]).collect();
    for (s, step) in spec.walk.iter().enumerate() {
        for (x, d) in p.iter_mut().zip(step) {
            *x += d;
        }
        let mut q = JointVector::from_slice(&p);
        match spec.fault {
            Fault::Nan(fs, fj) if fs == s => q[fj] = f64::NAN,
            Fault::Inf(fs, fj) if fs == s => q[fj] = f64::INFINITY,
            Fault::Jump(fs, d) if s >= fs => q.as_mut_slice().iter_mut().for_each(|x| *x += d),
            Fault::FarOutside(d) => q.as_mut_slice().iter_mut().for_each(|x| *x += d),
            _ => {}
        }
        c.positions.push(q);
    }
    c.update_derivatives();
    Box::new(c)
}

/// `chunk` as real-time chunking makes it: step `i` pulled towards the running chunk's plan at
/// the same instant, with RTC's linear prefix weights (faults stay where they were).
fn guide(chunk: &mut JointChunk, running: &JointChunk, (delay, horizon): (usize, usize)) {
    use crate::config::Schedule;
    use crate::policy::rtc::prefix_weights;
    let offset = (chunk.obs_stamp.seconds_since(running.obs_stamp) / PERIOD).round();
    let w = prefix_weights(Schedule::Linear, delay, horizon, chunk.steps());
    for (i, p) in chunk.positions.iter_mut().enumerate() {
        let k = offset + i as f64;
        if k < 0.0 || k as usize >= running.steps() || w[i] == 0.0 {
            continue;
        }
        let old = &running.positions[k as usize];
        for j in 0..p.len() {
            let w = w[i] as f64;
            p[j] = w * old[j] + (1.0 - w) * p[j];
        }
    }
    chunk.update_derivatives();
}

struct Outcome {
    commands: Vec<JointVector>,
    overridden: Vec<bool>,
    violations: u64,
    dt: f64,
    accepted: u32,
}

fn simulate(case: &Case) -> Outcome {
    let dt = 1.0 / case.rate_hz;
    let limits = RobotLimits::new(case.limits.clone());
    let t0 = MonoTime::from_nanos(1_000_000_000_000);
    let start = JointMeasurement {
        stamp: t0,
        position: JointVector::from_slice(&case.start),
    };
    let executor = Executor::new(
        case.interpolation,
        case.merge,
        case.blend_window_s.max(2.0 * dt),
        dt,
    );
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
    let mut ctl = Controller::new(limits, dt, executor, None, settings, &start, t0)
        .expect("start inside limits");
    let mut chunks = case.chunks.clone();
    chunks.sort_by(|a, b| a.arrival_s.total_cmp(&b.arrival_s));
    let mut next = 0;
    let mut measured = start;
    let mut resets = 0;
    let ticks = (DURATION_S / dt) as usize;
    let mut out = Outcome {
        commands: Vec::with_capacity(ticks),
        overridden: Vec::with_capacity(ticks),
        violations: 0,
        dt,
        accepted: 0,
    };
    let mut accepted = 0;
    // The latest chunk handed over: the plan an RTC chunk follows.
    let mut running: Option<Box<JointChunk>> = None;
    for k in 1..=ticks {
        let t = k as f64 * dt;
        let now = t0.offset_seconds(t);
        let mut new_chunk = None;
        if next < chunks.len() && chunks[next].arrival_s <= t {
            let spec = &chunks[next];
            let obs = now
                .offset_seconds(-spec.latency_s)
                .max(t0.offset_seconds(1e-6));
            let mut c = build_chunk(spec, &measured.position, obs, next as u64);
            if let (Some(rtc), Some(run)) = (case.rtc, &running) {
                guide(&mut c, run, rtc);
            }
            running = Some(c.clone());
            new_chunk = Some(c);
            next += 1;
        }
        let estop = case.estop.is_some_and(|(at, len)| t >= at && t < at + len);
        if case.estop.is_some_and(|(at, len)| t >= at + len + 0.3) && resets == 0 {
            resets = 1;
        }
        let before = ctl.event_counts()[SafetyEvent::JerkOverride as usize];
        let report = ctl.tick(
            TickInputs {
                safety: SafetyInputs {
                    estop,
                    resets,
                    ..SafetyInputs::quiet(now, &measured)
                },
                new_chunk,
                inference_in_flight: false,
                trajectories_sent: None,
            },
            &mut |_| {},
        );
        if matches!(
            report.chunk,
            Some(crate::control::ChunkOutcome::Accepted { .. })
        ) {
            accepted += 1;
        }
        // A perfect arm: the measurement is the command, 1 ms old.
        measured = JointMeasurement {
            stamp: now.offset_seconds(-0.001),
            position: report.command.position,
        };
        out.commands.push(report.command.position);
        out.overridden
            .push(ctl.event_counts()[SafetyEvent::JerkOverride as usize] > before);
    }
    out.violations = ctl.monitor().violations;
    out.accepted = accepted;
    out
}

/// Checks finite differences of the commands against the limits; returns the first failure.
fn check(case: &Case, o: &Outcome, jerk_everywhere: bool) -> Result<(), TestCaseError> {
    let dt = o.dt;
    let n = case.limits.len();
    let mut prev = JointVector::from_slice(&case.start);
    let (mut pv, mut pa) = (vec![0.0; n], vec![0.0; n]);
    for (k, c) in o.commands.iter().enumerate() {
        for j in 0..n {
            let l = &case.limits[j];
            let p = c[j];
            if !p.is_finite() {
                return Err(TestCaseError::fail(format!(
                    "tick {k} joint {j}: non-finite command {p}"
                )));
            }
            if p < l.lower - 1e-9 || p > l.upper + 1e-9 {
                return Err(TestCaseError::fail(format!(
                    "tick {k} joint {j}: position {p} outside [{}, {}]",
                    l.lower, l.upper
                )));
            }
            let v = (p - prev[j]) / dt;
            let a = (v - pv[j]) / dt;
            let jerk = (a - pa[j]) / dt;
            if v.abs() > l.velocity * (1.0 + 1e-6) + 1e-9 {
                return Err(TestCaseError::fail(format!(
                    "tick {k} joint {j}: velocity {v} > {}",
                    l.velocity
                )));
            }
            if a.abs() > l.acceleration * (1.0 + 1e-6) + 1e-5 {
                return Err(TestCaseError::fail(format!(
                    "tick {k} joint {j}: acceleration {a} > {}",
                    l.acceleration
                )));
            }
            let jerk_checked = jerk_everywhere || !o.overridden[k];
            if jerk_checked && jerk.abs() > l.jerk * (1.0 + 1e-6) + 1e-2 {
                return Err(TestCaseError::fail(format!(
                    "tick {k} joint {j}: jerk {jerk} > {} (overridden: {})",
                    l.jerk, o.overridden[k]
                )));
            }
            pv[j] = v;
            pa[j] = a;
        }
        prev = *c;
    }
    if o.violations != 0 {
        return Err(TestCaseError::fail(format!(
            "the controller's own monitor counted {} violations",
            o.violations
        )));
    }
    Ok(())
}

/// The properties above are not vacuous: a plain chunk is executed and moves the arm.
#[test]
fn when_chunk_is_plain_expect_it_executed_and_the_arm_moving() {
    let strategy = case(false, false, Spread::Gentle);
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    let mut moved = 0;
    let mut accepted = 0;
    for _ in 0..40 {
        let case = strategy.new_tree(&mut runner).unwrap().current();
        let o = simulate(&case);
        check(&case, &o, false).unwrap();
        accepted += o.accepted;
        let first = &o.commands[0];
        let travel: f64 = o
            .commands
            .iter()
            .map(|c| (0..c.len()).map(|j| (c[j] - first[j]).abs()).sum::<f64>())
            .fold(0.0, f64::max);
        if travel > 0.05 {
            moved += 1;
        }
    }
    assert!(
        accepted >= 40,
        "only {accepted} chunks executed in 40 cases"
    );
    assert!(moved >= 20, "the arm moved in only {moved} of 40 cases");
}

/// With no position limit in reach: every command inside the limits, the jerk limit included,
/// and never overridden.
fn jerk_bounded_everywhere(case: &Case) -> Result<(), TestCaseError> {
    let o = simulate(case);
    if let Err(e) = check(case, &o, true) {
        prop_assert!(false, "{e}");
    }
    prop_assert!(
        !o.overridden.iter().any(|x| *x),
        "jerk override without a position limit"
    );
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn when_chunks_are_random_or_faulty_expect_commands_inside_limits(case in case(false, true, Spread::Wild)) {
        let o = simulate(&case);
        if let Err(e) = check(&case, &o, false) {
            prop_assert!(false, "{e}");
        }
    }

    #[test]
    fn when_chunks_are_gentle_expect_commands_inside_limits(case in case(false, true, Spread::Gentle)) {
        let o = simulate(&case);
        if let Err(e) = check(&case, &o, false) {
            prop_assert!(false, "{e}");
        }
    }

    #[test]
    fn when_no_position_limit_in_reach_expect_jerk_bounded_across_switches(case in case(true, false, Spread::Wild)) {
        jerk_bounded_everywhere(&case)?;
    }

    #[test]
    fn when_slow_joints_stop_and_switch_expect_jerk_bounded(case in case(true, false, Spread::Slow)) {
        jerk_bounded_everywhere(&case)?;
    }
}

//! The control loop's step driven tick by tick with the real inference worker on its own
//! thread: it allocates nothing (a counting global allocator watches the control thread), and a
//! reset cannot lift a latched thread fault. Simulated time at the nominal period; the worker
//! runs in wall time, so each phase runs until the state it leads to is reached.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::sync_channel;
use std::sync::Arc;
use std::time::Duration;

use super::{ControlEvent, ControlLoop, StepOutcome};
use crate::config::record::{RecordConfig, RecordTarget};
use crate::config::Config;
use crate::control::Controller;
use crate::counting_alloc;
use crate::daemon::worker::{self, WorkerSetup, WorkerStats};
use crate::io::Blackboard;
use crate::joints::JointMeasurement;
use crate::record::{RecordSetup, Recorder, Topics};
use crate::telemetry::LiveStats;
use crate::test_dirs::{repo_path, TempDir};
use crate::time::MonoTime;

/// config/sim.toml with the scripted policy: the tick does not depend on the policy, and the
/// scripted one keeps chunks coming in a debug build.
pub(super) fn scripted_sim_config() -> Config {
    let mut cfg = Config::load(&repo_path("config/sim.toml")).expect("config/sim.toml loads");
    cfg.policy.source = crate::config::PolicySource::Scripted {
        amplitude: 0.3,
        frequency_hz: 0.2,
    };
    cfg
}

/// The control tick allocates (and frees) nothing: the counting allocator watches the control
/// thread while `ControlLoop::step` runs through chunk switches, an e-stop, a reset, a
/// stale-input hold and the final stop, with the real inference worker on its own thread and
/// the run recorded (the tick hands every sample to the MCAP recorder).
#[test]
fn when_control_tick_runs_expect_no_allocation() {
    let cfg = scripted_sim_config();
    let board = Arc::new(Blackboard::new(cfg.sim.cameras.len(), "test"));
    let initial = cfg.sim.initial_position;
    // A perfect arm: it stands where it was last commanded (before the first command: where it started).
    let set_inputs = |now: MonoTime, fresh: bool| {
        if fresh {
            let (stamp, cmd) = board.command.load();
            let position = if stamp == MonoTime::ZERO {
                initial
            } else {
                cmd.position
            };
            board.inputs.joint_state.store(JointMeasurement {
                stamp: now,
                position,
            });
            for s in &board.inputs.camera_stamps {
                s.store(now.as_nanos(), Ordering::Relaxed);
            }
        }
    };
    let start = MonoTime::now();
    set_inputs(start, true);
    let stop = Arc::new(AtomicBool::new(false));
    let (handle, worker_thread) = worker::spawn(
        crate::policy::from_config(&cfg).unwrap(),
        WorkerSetup::from_config(&cfg),
        board.clone(),
        Arc::new(WorkerStats::default()),
        stop.clone(),
    )
    .unwrap();
    let ctl = Controller::from_config(&cfg, &board.inputs.joint_state.load(), start).unwrap();
    let live = Arc::new(LiveStats::default());
    let stop_requested = Arc::new(AtomicBool::new(false));
    let (events_tx, events_rx) = sync_channel(1024);
    let dir = TempDir::new("test-no-alloc-record");
    let recorder = Recorder::start(
        RecordSetup {
            cfg: RecordConfig {
                target: RecordTarget::Directory(dir.to_path_buf()),
                max_bytes: 100_000_000,
                max_duration_s: None,
                camera_hz: 0.0,
            },
            topics: Topics {
                joint_names: cfg.limits.names().map(str::to_string).collect(),
                joint_states: "/joint_states".into(),
                cameras: Vec::new(),
                node: "pi0d".into(),
            },
            metadata: Default::default(),
            control_rate_hz: cfg.control.rate_hz,
        },
        board.clone(),
        Arc::new(LiveStats::default()),
        || {},
    )
    .unwrap();
    let mut lp = ControlLoop::new(
        ctl,
        handle,
        board.clone(),
        live.clone(),
        stop_requested.clone(),
        events_tx,
        1,
        3.0,
    )
    .with_recorder(recorder.ticks.clone());

    let mut allocations_per_phase = Vec::new();
    // Phases: warm-up (not watched), running with chunk switches, e-stop, reset and resume,
    // stale joint states, resume, stop. Each runs at least its minimum number of ticks and then
    // until the state it leads to is reached (the inference worker runs in wall time, so a busy
    // machine may need more ticks), within a generous bound.
    let phases: [(&str, usize, Option<&str>, bool); 7] = [
        ("warm-up", 150, Some("running"), false),
        ("running", 400, None, true),
        ("estop", 100, Some("estopped"), true),
        ("reset", 100, Some("running"), true),
        ("stale", 10, Some("holding(stale_joint_state)"), true),
        ("resume", 50, Some("running"), true),
        ("stop", 2000, None, true), // ends when the arm is at rest
    ];
    let mut outcome = StepOutcome::Continue;
    let period_s = cfg.control.period.as_secs_f64();
    let mut tick = 0u64;
    let mut states: Vec<String> = Vec::new();
    let mut chunks = 0;
    for (name, min_steps, until, watched) in phases {
        match name {
            "estop" => board.inputs.set_estop(true),
            "reset" => {
                board.inputs.set_estop(false);
                board.inputs.request_reset();
            }
            "stop" => stop_requested.store(true, Ordering::SeqCst),
            _ => {}
        }
        let mut allocations = 0;
        let seen_before = states.len();
        let mut steps = 0;
        for step in 0..20_000 {
            steps = step + 1;
            // Simulated time at the nominal 5 ms period, 2 ms of wall time per tick for the worker.
            std::thread::sleep(Duration::from_millis(2));
            tick += 1;
            let now = start.offset_seconds(tick as f64 * period_s);
            set_inputs(now, name != "stale");
            if watched {
                let (o, n) = counting_alloc::watched(|| lp.step(now));
                outcome = o;
                allocations += n;
            } else {
                outcome = lp.step(now);
            }
            for e in events_rx.try_iter() {
                match e {
                    ControlEvent::Transition(t) => states.push(t.to.to_string()),
                    ControlEvent::Chunk(_) => chunks += 1,
                    ControlEvent::ResetRefused => states.push("reset refused".into()),
                    ControlEvent::Reconfigured(r) => states.push(format!("{r:?}")),
                    ControlEvent::LimitViolation => states.push("limit violation".into()),
                }
            }
            if outcome != StepOutcome::Continue {
                break;
            }
            let reached = until.is_none_or(|u| states[seen_before..].iter().any(|s| s == u));
            if step + 1 >= min_steps && reached {
                break;
            }
        }
        allocations_per_phase.push((name, allocations));
        eprintln!(
            "phase {name}: {steps} ticks, states so far {:?}",
            &states[seen_before..]
        );
    }
    stop.store(true, Ordering::SeqCst);
    worker_thread.join().unwrap();
    let recording = recorder.finish();
    assert_eq!(recording.dropped, 0, "{recording:?}");
    assert!(
        recording.messages > tick,
        "{recording:?} after {tick} ticks"
    );

    // The run went through what it claims to have gone through.
    for want in [
        "running",
        "estopped",
        "holding(after_reset)",
        "holding(stale_joint_state)",
        "stopping",
    ] {
        assert!(
            states.iter().any(|s| s == want),
            "never reached {want}: {states:?}"
        );
    }
    assert!(
        chunks >= 5,
        "only {chunks} chunks reached the control thread"
    );
    assert_eq!(LiveStats::get(&live.chunks_received), chunks);
    assert_eq!(outcome, StepOutcome::Done, "stopped at rest");
    for (name, n) in &allocations_per_phase[1..] {
        assert_eq!(*n, 0, "phase {name}: {n} allocations or frees on the control thread ({allocations_per_phase:?})");
    }
}

/// The binary cannot show this one: in the sim only the (dead) simulator thread delivers resets,
/// and the daemon exits once at rest. So the control loop itself: the supervisor's fault latch,
/// then a released e-stop and a reset as the sim or ROS would deliver them.
#[test]
fn when_reset_arrives_after_a_latched_thread_fault_expect_control_loop_stays_estopped() {
    let cfg = scripted_sim_config();
    let board = Arc::new(Blackboard::new(cfg.sim.cameras.len(), "test"));
    let start = MonoTime::now();
    // A perfect arm: it stands where it was last commanded.
    let fresh = |now: MonoTime| {
        let (stamp, cmd) = board.command.load();
        let position = if stamp == MonoTime::ZERO {
            cfg.sim.initial_position
        } else {
            cmd.position
        };
        board.inputs.joint_state.store(JointMeasurement {
            stamp: now,
            position,
        });
        for s in &board.inputs.camera_stamps {
            s.store(now.as_nanos(), Ordering::Relaxed);
        }
    };
    fresh(start);
    let stop = Arc::new(AtomicBool::new(false));
    let setup = WorkerSetup::from_config(&cfg);
    let policy = crate::policy::from_config(&cfg).unwrap();
    let stats = Arc::new(WorkerStats::default());
    let (handle, worker_thread) =
        worker::spawn(policy, setup, board.clone(), stats, stop.clone()).unwrap();
    let ctl = Controller::from_config(&cfg, &board.inputs.joint_state.load(), start);
    let (tx, rx) = sync_channel(1024);
    let live = Arc::new(LiveStats::default());
    let stop_requested = Arc::new(AtomicBool::new(false));
    let mut lp = ControlLoop::new(
        ctl.unwrap(),
        handle,
        board.clone(),
        live,
        stop_requested.clone(),
        tx,
        1,
        3.0,
    );
    let mut states: Vec<String> = Vec::new();
    let mut tick = 0u64;
    let mut steps = |n: usize, until: Option<&str>, states: &mut Vec<String>| {
        for i in 0..n {
            std::thread::sleep(Duration::from_millis(2));
            tick += 1;
            let now = start.offset_seconds(tick as f64 * cfg.control.period.as_secs_f64());
            fresh(now);
            let outcome = lp.step(now);
            for e in rx.try_iter() {
                if let ControlEvent::Transition(t) = e {
                    states.push(t.to.to_string());
                }
            }
            if outcome != StepOutcome::Continue
                || until.is_some_and(|u| states.iter().any(|s| s == u)) && i > 10
            {
                return outcome;
            }
        }
        StepOutcome::Continue
    };
    steps(5_000, Some("running"), &mut states);
    assert!(states.iter().any(|s| s == "running"), "{states:?}");
    // What the supervisor does on a thread fault.
    board.supervisor.latch_fault();
    steps(400, None, &mut states);
    assert_eq!(
        states.last().map(String::as_str),
        Some("estopped"),
        "{states:?}"
    );
    let before = states.len();
    board.inputs.set_estop(false);
    board.inputs.request_reset();
    steps(400, None, &mut states);
    assert!(states.len() == before, "the reset moved it on: {states:?}");
    stop_requested.store(true, Ordering::SeqCst);
    assert_eq!(
        steps(2_000, None, &mut states),
        StepOutcome::Done,
        "{states:?}"
    );
    assert_eq!(states.last().map(String::as_str), Some("estopped"));
    stop.store(true, Ordering::SeqCst);
    worker_thread.join().unwrap();
}

/// The allocator the tick's test relies on is registered and counts: the watched thread's
/// allocation is seen, another thread's at the same time is not.
#[test]
fn when_the_watched_thread_allocates_expect_only_its_allocations_counted() {
    let (kept, n) = counting_alloc::watched(|| Box::new([7u8; 64]));
    assert_eq!(kept[0], 7);
    assert!(n >= 1, "the watched thread's allocation was not counted");
    // The other thread allocates (and frees) a thousand boxes; starting and joining it costs
    // this thread a handful of allocations.
    const OTHERS: usize = 1000;
    let (sum, n) = counting_alloc::watched(|| {
        std::thread::scope(|s| {
            s.spawn(|| {
                (0..OTHERS)
                    .map(|i| *std::hint::black_box(Box::new(i)))
                    .sum::<usize>()
            })
            .join()
        })
    });
    assert_eq!(sum.ok(), Some(OTHERS * (OTHERS - 1) / 2));
    assert!(
        n < OTHERS as u64,
        "{n} counted: another thread's allocations were counted"
    );
}

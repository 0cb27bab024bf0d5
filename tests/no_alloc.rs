//! The control tick allocates (and frees) nothing: a counting global allocator watches the
//! control thread while `ControlLoop::step` runs through chunk switches, an e-stop, a reset, a
//! stale-input hold and the final stop, with the real inference worker on its own thread and
//! the run recorded (the tick hands every sample to the MCAP recorder).

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::sync_channel;
use std::sync::Arc;
use std::time::Duration;

use pi0d::config::record::{RecordConfig, RecordTarget};
use pi0d::config::Config;
use pi0d::control::Controller;
use pi0d::joints::JointMeasurement;
use pi0d::record::{RecordSetup, Recorder, Topics};
use pi0d::telemetry::LiveStats;
use pi0d::testing::worker::{self, WorkerSetup, WorkerStats};
use pi0d::testing::{Blackboard, ControlEvent, ControlLoop, StepOutcome};
use pi0d::time::MonoTime;

#[global_allocator]
static ALLOCATOR: common::counting_alloc::Counting = common::counting_alloc::Counting;

#[test]
fn when_control_tick_runs_expect_no_allocation() {
    let mut cfg =
        Config::load(&std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("config/sim.toml"))
            .unwrap();
    // The tick does not depend on the policy; the scripted one keeps chunks coming in a debug build.
    cfg.policy.source = pi0d::config::PolicySource::Scripted {
        amplitude: 0.3,
        frequency_hz: 0.2,
    };
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
        pi0d::policy::from_config(&cfg).unwrap(),
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
    let dir = common::scratch_dir("no-alloc-record");
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
                let (o, n) = common::counting_alloc::watched(|| lp.step(now));
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

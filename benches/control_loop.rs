//! Control-loop benchmark (`cargo bench --bench control_loop [-- --seconds S]`).
//!
//! 1. The real daemon (config/sim.toml: simulated arm, the tiny pi0 inferring) at 200 Hz, 500 Hz
//!    and 1 kHz for S seconds while another thread burns a core: tick jitter p50/p99/max and
//!    overruns, with the normal scheduler and with SCHED_FIFO where permitted; then
//!    200 Hz with the MCAP recorder on; then 200 Hz SCHED_FIFO on an idle and on a loaded host,
//!    each with and without the PM QoS wake-up latency request (`realtime.cpu_latency_us`).
//! 2. The cost of one tick for 14 joints, in nanoseconds: state machine, chunk executor with
//!    quintic interpolation and blend, governor and limit monitor, with a chunk switch every
//!    100 ticks.

use std::hint::black_box;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use pi0d::chunk::JointChunk;
use pi0d::config::{Config, Interpolation, MergeMode};
use pi0d::control::{Controller, ControllerSettings, Executor, TickInputs};
use pi0d::daemon::{self, RunOptions};
use pi0d::joints::JointMeasurement;
use pi0d::joints::JointVector;
use pi0d::robot::{JointKind, JointLimits, RobotLimits};
use pi0d::safety::supervisor::SafetyInputs;
use pi0d::time::MonoTime;

/// One run of the daemon: its scheduling, and what else the host does.
#[derive(Clone, Copy)]
struct LoopRun {
    rate_hz: f64,
    priority: i32,
    spin_us: f64,
    record: bool,
    /// Another thread burns a core meanwhile.
    load: bool,
    /// `realtime.cpu_latency_us` (`None`: not asked).
    cpu_latency_us: Option<u32>,
}

impl LoopRun {
    fn loaded(rate_hz: f64, priority: i32, spin_us: f64) -> LoopRun {
        LoopRun {
            rate_hz,
            priority,
            spin_us,
            record: false,
            load: true,
            cpu_latency_us: Some(0),
        }
    }
}

fn run_loop(run: LoopRun, seconds: f64) {
    let LoopRun {
        rate_hz,
        priority,
        spin_us,
        record,
        load,
        cpu_latency_us,
    } = run;
    let mut cfg = Config::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join("config/sim.toml"))
        .expect("config/sim.toml loads");
    cfg.control.rate_hz = rate_hz;
    cfg.control.period = Duration::from_secs_f64(1.0 / rate_hz);
    cfg.realtime.priority = priority;
    cfg.realtime.lock_memory = priority > 0;
    cfg.realtime.spin_us = spin_us;
    cfg.realtime.cpu_latency_us = cpu_latency_us;
    let dir = std::env::temp_dir().join(format!("pi0d-bench-record-{}", std::process::id()));
    if record {
        cfg.record = Some(pi0d::config::record::RecordConfig {
            target: pi0d::config::record::RecordTarget::Directory(dir.clone()),
            max_bytes: 1 << 30,
            max_duration_s: None,
            camera_hz: 5.0,
        });
    }
    let burn = Arc::new(AtomicBool::new(load));
    let burner = {
        let burn = burn.clone();
        std::thread::spawn(move || {
            let mut x = 1.0f64;
            while burn.load(Ordering::Relaxed) {
                for _ in 0..10_000 {
                    x = black_box(x * 1.000_000_1 + 1e-9);
                }
            }
            x
        })
    };
    let s = daemon::run(
        cfg,
        RunOptions {
            duration_s: Some(seconds),
            summary: None,
            status: false,
            dry_run: false,
            state_dir: None,
            reload_from: None,
            signals: None,
        },
    )
    .expect("daemon runs");
    burn.store(false, Ordering::Relaxed);
    let _ = burner.join();
    let recorded = s
        .recording
        .as_ref()
        .map(|r| format!(" | recorded {} messages, {} dropped", r.messages, r.dropped))
        .unwrap_or_default();
    let _ = std::fs::remove_dir_all(&dir);
    println!(
        "loop {:>5.0} Hz {:<11} spin {:>3.0} us{}{}{} | ticks {:>6} | overruns {:>3} | jitter p50 {:>6.1} us  p99 {:>6.1} us  max {:>7.1} us | limit violations {}{recorded}",
        rate_hz,
        if priority > 0 { "SCHED_FIFO" } else { "SCHED_OTHER" },
        spin_us,
        if record { " +record" } else { "" },
        if load { "" } else { " idle host" },
        match cpu_latency_us {
            Some(us) => format!(" pm_qos {us} us"),
            None => " no pm_qos".into(),
        },
        s.ticks,
        s.overruns,
        s.jitter_us.p50,
        s.jitter_us.p99,
        s.jitter_us.max,
        s.limit_violations
    );
}

fn fifo_permitted() -> bool {
    let param = libc::sched_param { sched_priority: 1 };
    // SAFETY: probing on a short-lived thread; its policy dies with it.
    std::thread::spawn(move || unsafe {
        libc::pthread_setschedparam(libc::pthread_self(), libc::SCHED_FIFO, &param) == 0
    })
    .join()
    .unwrap_or(false)
}

fn tick_cost(joints: usize, ticks: usize) {
    let rate_hz = 500.0;
    let dt = 1.0 / rate_hz;
    let limits = RobotLimits::new(
        (0..joints)
            .map(|j| JointLimits {
                name: format!("j{j}"),
                kind: JointKind::Revolute,
                lower: -3.0,
                upper: 3.0,
                velocity: 2.0,
                acceleration: 10.0,
                jerk: 200.0,
                effort: 0.0,
                soft: None,
                max_step: 0.5,
            })
            .collect(),
    );
    let t0 = MonoTime::from_nanos(1_000_000_000_000);
    let start = JointMeasurement {
        stamp: t0,
        position: JointVector::zeros(joints),
    };
    let settings = ControllerSettings {
        joint_state_timeout_s: 0.1,
        camera_timeout_s: 0.5,
        overrun_streak: 10,
        request_threshold_s: 0.5,
        warmup_chunks: 1,
        trajectory_joints: Vec::new(),
        trajectory_coast_s: 0.05,
        trajectory_interval_s: 0.0,
    };
    let executor = Executor::new(Interpolation::Quintic, MergeMode::Blend, 0.2, dt);
    let mut ctl = Controller::new(limits, dt, executor, None, settings, &start, t0).unwrap();
    let make_chunk = |obs: MonoTime, phase: f64| {
        let mut c = JointChunk::with_capacity(50);
        c.obs_stamp = obs;
        c.period_s = 0.02;
        for i in 0..50 {
            let t = phase + i as f64 * 0.02;
            let p: Vec<f64> = (0..joints)
                .map(|j| 0.3 * (1.0 - (t * (1.0 + 0.1 * j as f64)).cos()))
                .collect();
            c.positions.push(JointVector::from_slice(&p));
        }
        c.update_derivatives();
        Box::new(c)
    };
    let mut pool: Vec<Box<JointChunk>> = (0..ticks / 100 + 2)
        .map(|k| {
            make_chunk(
                t0.offset_seconds(k as f64 * 100.0 * dt - 0.05),
                k as f64 * 100.0 * dt,
            )
        })
        .collect();
    pool.reverse();
    let mut measured = start;
    let mut spent = Duration::ZERO;
    let mut recycled = Vec::with_capacity(pool.len() + 2);
    for k in 1..=ticks {
        let now = t0.offset_seconds(k as f64 * dt);
        let new_chunk = if k % 100 == 1 { pool.pop() } else { None };
        let began = Instant::now();
        let report = ctl.tick(
            TickInputs {
                safety: SafetyInputs {
                    now,
                    measured: &measured,
                    camera_stamps: &[],
                    estop: false,
                    thread_fault: false,
                    estop_presses: 0,
                    resets: 0,
                    overrun_streak: 0,
                    stop_requested: false,
                },
                new_chunk,
                inference_in_flight: true,
                trajectories_sent: None,
            },
            &mut |c| recycled.push(c),
        );
        spent += began.elapsed();
        measured = JointMeasurement {
            stamp: now,
            position: report.command.position,
        };
    }
    assert_eq!(ctl.monitor().violations, 0);
    println!(
        "tick cost, {joints} joints (quintic + blend + governor + monitor): {:.0} ns per tick over {ticks} ticks",
        spent.as_nanos() as f64 / ticks as f64
    );
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let seconds = args
        .iter()
        .position(|a| a == "--seconds")
        .and_then(|i| args.get(i + 1))
        .and_then(|s| s.parse().ok())
        .unwrap_or(10.0);
    tracing_subscriber::fmt().with_env_filter("warn").init();
    println!("pi0d control-loop benchmark, {} CPUs, {seconds} s per run, one core burned by another thread", std::thread::available_parallelism().map_or(0, |n| n.get()));
    tick_cost(14, 200_000);
    tick_cost(7, 200_000);
    let fifo = fifo_permitted();
    let fifo_priority = if fifo { 80 } else { 0 };
    for rate in [200.0, 500.0, 1000.0] {
        for spin_us in [0.0, 60.0] {
            run_loop(LoopRun::loaded(rate, 0, spin_us), seconds);
            if fifo {
                run_loop(LoopRun::loaded(rate, 80, spin_us), seconds);
            }
        }
    }
    // The recorder on (its own thread, a queue the loop never waits on): the same loop.
    run_loop(
        LoopRun {
            record: true,
            ..LoopRun::loaded(200.0, fifo_priority, 0.0)
        },
        seconds,
    );
    // An idle host wakes the control thread from deep C-states unless PM QoS holds them off.
    for load in [false, true] {
        for cpu_latency_us in [None, Some(0)] {
            run_loop(
                LoopRun {
                    load,
                    cpu_latency_us,
                    ..LoopRun::loaded(200.0, fifo_priority, 0.0)
                },
                seconds,
            );
        }
    }
    if !fifo {
        println!("SCHED_FIFO not permitted here: real-time runs skipped");
    }
}

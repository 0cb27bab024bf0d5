//! Daemon lifecycle: start-up (inputs, start gate, policy worker, control thread), supervision
//! (status line, signals, duration, systemd notify/watchdog), and shutdown (decelerate to rest,
//! summary).

pub mod control;
pub mod notify;
pub mod rt;
pub mod summary;
pub mod worker;

use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{sync_channel, Receiver};
use std::sync::Arc;
use std::time::Duration;

use crate::config::Config;
use crate::config::Io;
use crate::control::controller::{ChunkOutcome, StartRefused};
use crate::control::stats::{mode_name, LiveStats};
use crate::control::Controller;
use crate::io::ros::{RosError, RosIo};
use crate::io::sim::SimArm;
use crate::io::Blackboard;
use crate::joints::JointMeasurement;
use crate::policy::PolicyBuildError;
use crate::safety::{Mode, SafetyEvent};
use crate::time::MonoTime;
use control::{ControlEvent, ControlLoop, ControlResult};
use summary::{Percentiles, Summary, TransitionRecord};
use worker::{WorkerSetup, WorkerStats};

/// Process exit codes, distinct so systemd and people can tell failures apart.
pub mod exit {
    pub const OK: i32 = 0;
    /// Bad configuration, URDF or other input file.
    pub const CONFIG: i32 = 1;
    /// The arm stands outside its limits: refusing to start.
    pub const START_REFUSED: i32 = 3;
    /// No joint state arrived at start-up.
    pub const NO_INPUT: i32 = 4;
    /// Internal fault: the control thread died, or the arm did not come to rest on shutdown.
    pub const FAULT: i32 = 5;
}

#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error(transparent)]
    StartRefused(#[from] StartRefused),
    #[error("no joint state received within {0:.1} s of start-up")]
    NoJointState(f64),
    #[error(transparent)]
    Policy(#[from] PolicyBuildError),
    #[error("cannot start thread: {0}")]
    Spawn(#[from] std::io::Error),
    #[error(transparent)]
    Ros(#[from] RosError),
}

impl DaemonError {
    pub fn exit_code(&self) -> i32 {
        match self {
            DaemonError::StartRefused(_) => exit::START_REFUSED,
            DaemonError::NoJointState(_) => exit::NO_INPUT,
            DaemonError::Policy(_) => exit::CONFIG,
            DaemonError::Spawn(_) => exit::FAULT,
            DaemonError::Ros(_) => exit::NO_INPUT,
        }
    }
}

pub struct RunOptions {
    pub duration_s: Option<f64>,
    pub summary: Option<PathBuf>,
    /// Print the live status line (off for tests that only read the summary).
    pub status: bool,
}

/// How long start-up waits for the first joint state (DDS discovery takes a moment).
const FIRST_INPUT_TIMEOUT_S: f64 = 10.0;
/// Supervisor poll period.
const SUPERVISE_PERIOD: Duration = Duration::from_millis(20);

/// Runs the daemon until `--duration` passes or SIGINT/SIGTERM; returns the summary.
pub fn run(cfg: Config, opts: RunOptions) -> Result<Summary, DaemonError> {
    if cfg.realtime.lock_memory {
        rt::lock_memory();
    }
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        // A second signal while stopping exits at once.
        let _ = signal_hook::flag::register_conditional_shutdown(sig, 130, stop.clone());
        let _ = signal_hook::flag::register(sig, stop.clone());
    }
    let io_stop = Arc::new(AtomicBool::new(false));
    let board = Arc::new(Blackboard::new(cfg.camera_count(), &cfg.policy.prompt));
    let start = MonoTime::now();
    let live = Arc::new(LiveStats::default());
    let io_thread = match &cfg.io {
        Io::Sim => SimArm::new(cfg.sim.clone(), &cfg.limits).spawn(
            board.clone(),
            io_stop.clone(),
            start,
        )?,
        Io::Ros(ros) => {
            let names = cfg.limits.names().map(str::to_string).collect();
            RosIo::new((**ros).clone(), names, cfg.control.period).spawn(
                board.clone(),
                live.clone(),
                io_stop.clone(),
            )?
        }
    };

    let result = supervise(&cfg, &opts, &board, &live, &stop, &io_stop, start);
    io_stop.store(true, Ordering::SeqCst);
    let _ = io_thread.join();
    notify::Notifier::from_env().stopping();
    let summary = result?;
    if let Some(path) = &opts.summary {
        match serde_json::to_string_pretty(&summary) {
            Ok(json) => {
                if let Err(e) = std::fs::write(path, json) {
                    tracing::error!(file = %path.display(), error = %e, "cannot write summary");
                }
            }
            Err(e) => tracing::error!(error = %e, "cannot encode summary"),
        }
    }
    Ok(summary)
}

fn wait_first_joint_state(board: &Blackboard) -> Option<JointMeasurement> {
    let deadline = MonoTime::now().offset_seconds(FIRST_INPUT_TIMEOUT_S);
    while MonoTime::now() < deadline {
        let js = board.joint_state.load();
        if js.stamp != MonoTime::ZERO {
            return Some(js);
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    None
}

#[allow(clippy::too_many_arguments)]
fn supervise(
    cfg: &Config,
    opts: &RunOptions,
    board: &Arc<Blackboard>,
    live: &Arc<LiveStats>,
    stop: &Arc<AtomicBool>,
    io_stop: &Arc<AtomicBool>,
    start: MonoTime,
) -> Result<Summary, DaemonError> {
    let first =
        wait_first_joint_state(board).ok_or(DaemonError::NoJointState(FIRST_INPUT_TIMEOUT_S))?;
    let controller = Controller::from_config(cfg, &first, MonoTime::now())?;
    tracing::info!(
        joints = cfg.limits.len(),
        rate_hz = cfg.control.rate_hz,
        start = ?first.position,
        "start gate passed: motion starts from the measured position"
    );

    let policy = crate::policy::from_config(cfg)?;
    let worker_stats = Arc::new(WorkerStats::default());
    let (worker, worker_thread) = worker::spawn(
        policy,
        WorkerSetup {
            limits: cfg.limits.clone(),
            map: cfg.policy.action_map.clone(),
            safety: cfg.safety.clone(),
            chunk_steps: cfg.policy.chunk_steps,
        },
        board.clone(),
        worker_stats.clone(),
        io_stop.clone(),
    )?;

    let stop_requested = Arc::new(AtomicBool::new(false));
    let (events_tx, events_rx) = sync_channel::<ControlEvent>(256);
    let control = {
        let board = board.clone();
        let live = live.clone();
        let stop_requested = stop_requested.clone();
        let rt_cfg = cfg.realtime.clone();
        let period_ns = cfg.control.period.as_nanos() as u64;
        let stop_timeout_s = cfg.control.stop_timeout_s;
        let cameras = cfg.camera_count();
        std::thread::Builder::new()
            .name("pi0d-control".into())
            .spawn(move || {
                rt::apply_to_current_thread(&rt_cfg);
                let lp = ControlLoop::new(
                    controller,
                    worker,
                    board,
                    live,
                    stop_requested,
                    events_tx,
                    cameras,
                    stop_timeout_s,
                );
                lp.run(period_ns, (rt_cfg.spin_us * 1e3) as u64)
            })?
    };
    let notifier = notify::Notifier::from_env();
    notifier.ready();

    let watchdog_usec = notify::watchdog_usec();
    let watchdog = watchdog_usec.is_some();
    let watchdog_period = Duration::from_micros(watchdog_usec.unwrap_or(0) / 2);
    let mut last_watchdog = MonoTime::now();
    let mut last_ticks_seen = 0u64;

    let mut log = EventLog::default();
    let mut last_status = MonoTime::now();
    let mut status_line = StatusLine::new(opts.status);
    let run_start = MonoTime::now();

    while !control.is_finished() {
        std::thread::sleep(SUPERVISE_PERIOD);
        let now = MonoTime::now();
        log.drain(&events_rx, start);
        let over = opts
            .duration_s
            .is_some_and(|d| now.seconds_since(run_start) >= d);
        if (over || stop.load(Ordering::Relaxed)) && !stop_requested.load(Ordering::Relaxed) {
            tracing::info!("stopping: decelerating to rest");
            stop_requested.store(true, Ordering::SeqCst);
        }
        if now.seconds_since(last_status) >= cfg.control.status_interval_s {
            last_status = now;
            status_line.show(live, &worker_stats, now.seconds_since(run_start));
            notifier.status(&format!(
                "{} | {} ticks",
                mode_name(LiveStats::get(&live.mode)),
                LiveStats::get(&live.ticks)
            ));
        }
        if watchdog && now.seconds_since(last_watchdog) >= watchdog_period.as_secs_f64() {
            // Only a control loop that still ticks keeps systemd's watchdog fed.
            let ticks = LiveStats::get(&live.ticks);
            if ticks != last_ticks_seen {
                notifier.watchdog();
                last_ticks_seen = ticks;
            }
            last_watchdog = now;
        }
    }
    status_line.finish();
    io_stop.store(true, Ordering::SeqCst);
    let _ = worker_thread.join();
    let result = match control.join() {
        Ok(r) => r,
        Err(_) => {
            tracing::error!("control thread panicked");
            return Ok(Summary {
                exit: "control_panic".into(),
                ..Summary::default()
            });
        }
    };
    log.drain(&events_rx, start);
    Ok(build_summary(
        cfg,
        &result,
        &worker_stats,
        log,
        MonoTime::now().seconds_since(run_start),
    ))
}

/// What the control thread reported, collected by the supervisor for the log and the summary.
#[derive(Default)]
struct EventLog {
    transitions: Vec<TransitionRecord>,
    late_rejections: BTreeMap<String, u64>,
    accepted: u64,
    reset_refused: u64,
}

impl EventLog {
    fn drain(&mut self, rx: &Receiver<ControlEvent>, start: MonoTime) {
        while let Ok(e) = rx.try_recv() {
            match e {
                ControlEvent::Transition(t) => {
                    let t_s = t.at.seconds_since(start);
                    match t.to {
                        Mode::Holding(_) | Mode::EStopped => {
                            tracing::warn!(t_s = format!("{t_s:.3}"), from = %t.from, to = %t.to, "state")
                        }
                        _ => {
                            tracing::info!(t_s = format!("{t_s:.3}"), from = %t.from, to = %t.to, "state")
                        }
                    }
                    self.transitions.push(TransitionRecord {
                        t_s,
                        from: t.from.to_string(),
                        to: t.to.to_string(),
                    });
                }
                ControlEvent::Chunk(ChunkOutcome::Accepted { .. }) => self.accepted += 1,
                ControlEvent::Chunk(ChunkOutcome::Rejected { reason, seq }) => {
                    let n = self
                        .late_rejections
                        .entry(reason.name().to_string())
                        .or_default();
                    if (*n).is_multiple_of(20) {
                        tracing::warn!(
                            seq,
                            reason = reason.name(),
                            total = *n + 1,
                            "chunk not executed"
                        );
                    }
                    *n += 1;
                }
                ControlEvent::ResetRefused => {
                    self.reset_refused += 1;
                    tracing::warn!(
                        "reset refused: arm not at rest or outside its limits; still e-stopped"
                    );
                }
            }
        }
    }
}

fn build_summary(
    cfg: &Config,
    r: &ControlResult,
    ws: &WorkerStats,
    log: EventLog,
    duration_s: f64,
) -> Summary {
    let EventLog {
        transitions,
        late_rejections: late,
        accepted,
        reset_refused,
    } = log;
    let us = |ns: u64| ns as f64 / 1e3;
    let ms = |ns: u64| ns as f64 / 1e6;
    let names: Vec<String> = cfg.limits.names().map(str::to_string).collect();
    let per_joint = |v: &crate::joints::JointVector| -> BTreeMap<String, f64> {
        names.iter().cloned().zip(v.iter().copied()).collect()
    };
    let mut by_reason: BTreeMap<String, u64> = late;
    for (k, n) in ws.rejected_by_reason() {
        if n > 0 {
            by_reason.insert(k.to_string(), n);
        }
    }
    let ctl = &r.controller;
    let mon = ctl.monitor();
    Summary {
        duration_s,
        rate_hz: cfg.control.rate_hz,
        ticks: r.ticks,
        overruns: r.overruns,
        jitter_us: Percentiles {
            p50: us(r.jitter.quantile_ns(0.5)),
            p99: us(r.jitter.quantile_ns(0.99)),
            max: us(r.jitter.max_ns()),
        },
        chunks_received: ws.produced.load(Ordering::Relaxed)
            + ws.policy_errors.load(Ordering::Relaxed)
            + ws.policy_panics.load(Ordering::Relaxed),
        chunks_accepted: accepted,
        chunks_rejected: by_reason.values().sum(),
        chunks_rejected_by_reason: by_reason,
        inference_requests: ws.requests.load(Ordering::Relaxed),
        latency_ms: Percentiles {
            p50: ms(ctl.latency.quantile_ns(0.5)),
            p99: ms(ctl.latency.quantile_ns(0.99)),
            max: ms(ctl.latency.max_ns()),
        },
        safety_events: SafetyEvent::ALL
            .iter()
            .map(|e| (e.name().to_string(), ctl.event_counts()[*e as usize]))
            .collect(),
        limit_violations: mon.violations,
        max_abs_velocity: per_joint(&mon.max_abs_velocity),
        max_abs_acceleration: per_joint(&mon.max_abs_acceleration),
        max_abs_jerk: per_joint(&mon.max_abs_jerk),
        reset_refused,
        final_mode: ctl.mode().to_string(),
        transitions,
        exit: if r.reached_rest {
            "clean"
        } else {
            "stop_timeout"
        }
        .into(),
    }
}

/// The live one-line status: rewritten in place on a terminal, one log line per interval
/// otherwise (journald).
struct StatusLine {
    enabled: bool,
    tty: bool,
    last_ticks: u64,
    last_t: f64,
}

impl StatusLine {
    fn new(enabled: bool) -> StatusLine {
        StatusLine {
            enabled,
            tty: std::io::stderr().is_terminal(),
            last_ticks: 0,
            last_t: 0.0,
        }
    }

    fn show(&mut self, live: &LiveStats, ws: &WorkerStats, t: f64) {
        let ticks = LiveStats::get(&live.ticks);
        let rate = (ticks - self.last_ticks) as f64 / (t - self.last_t).max(1e-9);
        self.last_ticks = ticks;
        self.last_t = t;
        if !self.enabled {
            return;
        }
        let line = format!(
            "{:>7.1}s | {:6.1} Hz | jitter {:4} us (max {:5}) | overruns {} | latency {:5.1} ms | infer {:5.1} ms | {:<9} | chunks {} ({} rejected) | safety events {}",
            t,
            rate,
            LiveStats::get(&live.last_jitter_ns) / 1000,
            LiveStats::get(&live.max_jitter_ns) / 1000,
            LiveStats::get(&live.overruns),
            LiveStats::get(&live.last_latency_us) as f64 / 1e3,
            ws.last_infer_us.load(Ordering::Relaxed) as f64 / 1e3,
            mode_name(LiveStats::get(&live.mode)),
            LiveStats::get(&live.chunks_received),
            LiveStats::get(&live.chunks_rejected) + ws.rejected_by_reason().iter().map(|(_, n)| n).sum::<u64>(),
            LiveStats::get(&live.safety_events),
        );
        if self.tty {
            eprint!("\r{line}\x1b[K");
        } else {
            tracing::info!(target: "pi0d::status", "{line}");
        }
    }

    fn finish(&self) {
        if self.enabled && self.tty {
            eprintln!();
        }
    }
}

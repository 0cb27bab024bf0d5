//! Daemon lifecycle: start-up (inputs, start gate, policy worker, control thread), supervision
//! (every thread watched for death and liveness, status line, signals, duration, start timeout,
//! systemd notify/watchdog), and shutdown (decelerate to rest, summary).
//!
//! The death of any thread is never silent: the inference, ROS or simulator thread dying (or
//! stalling) latches the e-stop, the arm decelerates to rest, the watchdog pings stop and the
//! run ends with `ExitReason::ThreadFault`; the control thread dying or stalling ends it at once
//! with `ExitReason::ControlFault` (nothing else can command the arm).

pub(crate) mod control;
mod diff;
mod drill;
pub mod exit;
pub(crate) mod latch;
pub(crate) mod lifecycle;
pub mod load;
pub mod log;
pub(crate) mod metrics;
pub(crate) mod notify;
pub mod reload;
pub(crate) mod report;
pub mod rt;
#[cfg(test)]
mod safety_properties_tests;
pub mod signals;
#[cfg(test)]
mod sim_task_tests;
mod status_line;
pub(crate) mod summary;
pub mod supervise;
pub(crate) mod worker;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::sync_channel;
use std::sync::Arc;
use std::time::Duration;

use crate::config::{Config, Io};
use crate::control::Controller;
use crate::io::ros::{RosError, RosIo};
use crate::io::sim::SimArm;
use crate::io::Blackboard;
use crate::joints::JointMeasurement;
use crate::policy::PolicyBuildError;
use crate::record::{RecordSetup, Recorder, Topics};
use crate::safety::supervisor::StartRefused;
use crate::safety::Waiting;
use crate::telemetry::{mode_name, LiveStats};
use crate::time::MonoTime;
use control::{ControlEvent, ControlLoop, ControlResult, DrillHook};
use exit::ExitReason;
use lifecycle::{ControlEnd, Lifecycle, IO_STALL_S};
use report::{build_summary, camera_names, waiting_detail, EventLog, StatusLine};
use signals::Signals;
use summary::Summary;
use supervise::{Health, Role, Supervised};
use worker::{WorkerSetup, WorkerStats};

#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error(transparent)]
    StartRefused(#[from] StartRefused),
    #[error("no joint state received within {0:.1} s of start-up{1}")]
    NoJointState(f64, String),
    #[error(transparent)]
    Policy(#[from] PolicyBuildError),
    #[error("cannot start the {thread} thread")]
    Spawn {
        thread: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Ros(#[from] RosError),
    #[error("the {0} thread died during start-up: {1}")]
    StartupThread(&'static str, String),
    /// The middleware library panicked while creating its node (typically: it could not
    /// create its threads or sockets).
    #[error("the ROS 2 middleware failed while starting")]
    MiddlewarePanic(#[source] crate::panics::Panic),
    #[error(transparent)]
    Latch(#[from] latch::LatchError),
    #[error(transparent)]
    Record(#[from] crate::record::RecordError),
    #[error("metrics.listen: cannot serve the metrics on {listen}")]
    Metrics {
        listen: std::net::SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

impl DaemonError {
    pub fn exit_reason(&self) -> ExitReason {
        match self {
            DaemonError::StartRefused(_) => ExitReason::StartRefused,
            DaemonError::NoJointState(..) => ExitReason::NoJointState,
            DaemonError::Policy(_)
            | DaemonError::Latch(_)
            | DaemonError::Record(
                crate::record::RecordError::Exists { .. }
                | crate::record::RecordError::TooSmall { .. },
            ) => ExitReason::InvalidInput,
            DaemonError::Record(_) => ExitReason::RuntimeFailure,
            DaemonError::Spawn { .. }
            | DaemonError::Ros(_)
            | DaemonError::MiddlewarePanic(_)
            | DaemonError::Metrics { .. } => ExitReason::RuntimeFailure,
            DaemonError::StartupThread(..) => ExitReason::ThreadFault,
        }
    }
}

pub struct RunOptions {
    pub duration_s: Option<f64>,
    pub summary: Option<PathBuf>,
    /// Print the live status line (off for tests that only read the summary).
    pub status: bool,
    /// Commands go to the shadow topic (ROS) or nowhere (sim): nothing moves.
    pub dry_run: bool,
    /// Where the fault latch is kept (`$STATE_DIRECTORY` under systemd); none: no latch.
    pub state_dir: Option<PathBuf>,
    /// The configuration file and ROS arguments it came from, read again on SIGHUP.
    pub reload_from: Option<(PathBuf, crate::config::ros_args::RosArgs)>,
    /// The signal handlers, when `main` installed them first thing; none: installed here.
    pub signals: Option<Signals>,
}

/// How long start-up waits for the first joint state (DDS discovery takes a moment).
const FIRST_INPUT_TIMEOUT_S: f64 = 10.0;
/// Supervisor poll period.
const SUPERVISE_PERIOD: Duration = Duration::from_millis(20);
/// How long shutdown waits for a thread to finish before leaving it to the process exit.
const JOIN_WAIT_S: f64 = 2.0;

/// Waits up to `JOIN_WAIT_S` for a thread to finish, then joins it; a stuck one is left to the
/// process exit rather than hanging shutdown.
fn join_bounded<T>(thread: Supervised<T>) {
    let deadline = MonoTime::now().offset_seconds(JOIN_WAIT_S);
    while !thread.is_finished() && MonoTime::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    if thread.is_finished() {
        thread.join();
    } else {
        tracing::error!(
            "the {} thread did not finish; leaving it",
            thread.role.name()
        );
    }
}

/// Runs the daemon until `--duration` passes, a stop signal arrives or a fault ends it;
/// returns the summary (its `exit` says which, and is what the process exits with: it is
/// settled after the fault latch's last update, and only then written).
pub fn run(cfg: Config, mut opts: RunOptions) -> Result<Summary, DaemonError> {
    let signals = opts.signals.take().unwrap_or_else(Signals::install);
    let latch = match &opts.state_dir {
        Some(dir) => Some(latch::FaultLatch::open(dir)?),
        None => None,
    };
    let latched = latch.as_ref().and_then(|l| l.latched()).map(str::to_string);
    let mut result = run_latched(cfg, &opts, signals, latched.clone());
    if let Some(mut latch) = latch {
        // A reset accepted during the run lifts the latch (the e-stop's own transition).
        if let Ok(s) = &result {
            if latched.is_some() && s.resets > 0 {
                if let Err(e) = latch.reset() {
                    // Not lifted: the marker still latches, and the end below says why.
                    let error = exit::error_chain(&e);
                    tracing::error!(%error, "the fault latch could not be lifted");
                }
            }
        }
        let how = match &result {
            Ok(s) => s.exit,
            Err(e) => e.exit_reason(),
        };
        let end = latch.finish(how);
        match &mut result {
            Ok(s) => s.settle_fault_latch(end),
            Err(_) => {
                if let Err(e) = end {
                    let error = exit::error_chain(&e);
                    tracing::error!(%error, "the fault latch could not be updated");
                }
            }
        }
    }
    if let (Ok(s), Some(path)) = (&result, &opts.summary) {
        report::write_summary(path, s);
    }
    result
}

/// `run`; `latched`: the previous run ended with a fault, so this one starts e-stopped.
fn run_latched(
    cfg: Config,
    opts: &RunOptions,
    mut signals: Signals,
    latched: Option<String>,
) -> Result<Summary, DaemonError> {
    if cfg.realtime.lock_memory {
        rt::lock_memory();
    }
    // Held until the run returns: the request ends with it.
    let _cpu_latency = cfg
        .realtime
        .cpu_latency_us
        .and_then(rt::CpuLatency::request);
    let io_stop = Arc::new(AtomicBool::new(false));
    let board = Arc::new(Blackboard::new(cfg.camera_count(), &cfg.policy.prompt));
    let start = MonoTime::now();
    let live = Arc::new(LiveStats::default());
    if let Some(why) = &latched {
        // As an e-stop pressed and released: the arm holds until an explicit reset.
        board.inputs.count_press();
        LiveStats::set(&live.fault_latched, 1);
        tracing::warn!(
            previous_run = %why,
            "fault latch: the previous run ended with {why}; the arm stays e-stopped until a reset"
        );
    }
    let spawn_err = |thread| move |source| DaemonError::Spawn { thread, source };
    // The thread that talks to the robot (or is it).
    let io = match &cfg.io {
        Io::Sim => {
            let mut sim = SimArm::new(cfg.sim.clone(), &cfg.limits);
            sim.dry_run = opts.dry_run;
            if opts.dry_run {
                tracing::warn!("dry run: the simulated arm ignores the commands");
            }
            let (board, stop) = (board.clone(), io_stop.clone());
            let rt_cfg = cfg.realtime.clone();
            supervise::spawn(Role::Sim, move |h| {
                // A real arm's hardware keeps its rate whatever the host runs: so does this one.
                rt::apply_to_io_thread(&rt_cfg, "simulator");
                sim.run(&board, &stop, start, &|| h.beat())
            })
            .map_err(spawn_err("simulator"))?
        }
        Io::Ros(ros) => {
            let mut ros = (**ros).clone();
            ros.dry_run = opts.dry_run;
            if opts.dry_run {
                for g in &ros.commands {
                    tracing::warn!(
                        "dry run: commands go to {}, nothing to the robot's {}",
                        ros.shadow_topic(g),
                        g.topic
                    );
                }
            }
            let dds = ros.middleware == crate::config::Middleware::Dds;
            let node = RosIo::new(
                ros,
                cfg.limits.clone(),
                cfg.safety.measured_position_tolerance,
                cfg.control.period,
            );
            // The middleware's own threads are created here; a library that panics when it
            // cannot create them becomes a start-up error. RustDDS's threads share locks with
            // the ROS thread's writes: they run at its priority (Zenoh's runtime keeps the
            // normal scheduler).
            let connect = move || supervise::caught(move || node.connect());
            let node = if dds {
                rt::start_at_io_priority(&cfg.realtime, "DDS middleware", connect)
                    .map_err(spawn_err("DDS middleware"))?
            } else {
                connect()
            }
            .map_err(DaemonError::MiddlewarePanic)??;
            let (board, live, stop) = (board.clone(), live.clone(), io_stop.clone());
            let rt_cfg = cfg.realtime.clone();
            supervise::spawn(Role::Ros, move |h| {
                rt::apply_to_io_thread(&rt_cfg, "ROS");
                // Decoding runs below the ROS thread, with inference.
                let decoding = || rt::lower_current_thread(rt::INFERENCE_NICE);
                node.run(&board, &live, &stop, &|| h.beat(), &decoding)
            })
            .map_err(spawn_err("ROS"))?
        }
    };

    let result = supervise(
        &cfg,
        opts,
        &board,
        &live,
        &mut signals,
        &io_stop,
        start,
        &io,
    );
    io_stop.store(true, Ordering::SeqCst);
    join_bounded(io);
    notify::Notifier::from_env().stopping();
    let mut summary = result?;
    summary.signals_ignored = signals.ignored_total();
    summary.inputs_rejected = LiveStats::get(&live.inputs_rejected);
    summary.input_decoder_faults = LiveStats::get(&live.input_decoder_faults);
    summary.log_lines_lost = log::lost_lines();
    summary.log_lines_suppressed = crate::telemetry::log_lines_suppressed();
    summary.dry_run = opts.dry_run;
    summary.limits_scale = cfg.limits.scale;
    summary.fault_latch = latched;
    Ok(summary)
}

/// What every status line starts with: a dry run, and scaled-down limits.
fn status_tags(cfg: &Config, opts: &RunOptions) -> String {
    let mut tags = String::new();
    if opts.dry_run {
        match &cfg.io {
            Io::Ros(r) => {
                let shadows: Vec<String> = r.commands.iter().map(|g| r.shadow_topic(g)).collect();
                tags += &format!("DRY RUN (commands on {}) | ", shadows.join(", "))
            }
            Io::Sim => tags += "DRY RUN (the arm ignores commands) | ",
        }
    }
    if cfg.limits.scale < 1.0 {
        tags += &format!("limits x{} | ", cfg.limits.scale);
    }
    tags
}

/// The first joint state, or `None` on a stop signal; an I/O thread that dies meanwhile is an
/// error.
fn wait_first_joint_state(
    cfg: &Config,
    board: &Blackboard,
    io: &Supervised<()>,
    stop: &AtomicBool,
) -> Result<Option<JointMeasurement>, DaemonError> {
    let deadline = MonoTime::now().offset_seconds(FIRST_INPUT_TIMEOUT_S);
    while MonoTime::now() < deadline {
        let js = board.inputs.joint_state.load();
        if js.stamp != MonoTime::ZERO {
            return Ok(Some(js));
        }
        match io.health(MonoTime::now(), Some(IO_STALL_S)) {
            Health::Alive => {}
            h => return Err(DaemonError::StartupThread(io.role.name(), h.to_string())),
        }
        if stop.load(Ordering::Relaxed) {
            return Ok(None);
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    let seen = board
        .inputs
        .startup_note
        .lock()
        .map(|n| n.clone())
        .unwrap_or_default();
    Err(DaemonError::NoJointState(
        FIRST_INPUT_TIMEOUT_S,
        match &cfg.io {
            Io::Ros(r) => {
                let q = r.qos.joint_states;
                format!(
                    " on {} (sensor_msgs/JointState, {} keep-last {}, domain {}{}): {}; check the topic, the domain (ROS_DOMAIN_ID), ros.loopback_only, the QoS (a reliable subscription does not match a best-effort publisher), and that the messages name every joint in robot.joints",
                    r.joint_states,
                    if q.reliable { "reliable" } else { "best effort" },
                    q.depth,
                    r.domain_id,
                    if r.loopback_only { ", loopback only" } else { "" },
                    if seen.is_empty() { "nothing arrived".to_string() } else { seen },
                )
            }
            Io::Sim => String::new(),
        },
    ))
}

/// What the recording is told about this run: topic names and the file's metadata.
fn record_setup(cfg: &Config, r: &crate::config::record::RecordConfig) -> RecordSetup {
    let (joint_states, node) = match &cfg.io {
        Io::Ros(ros) => (ros.joint_states.clone(), ros.node.clone()),
        Io::Sim => ("/joint_states".to_string(), "pi0d".to_string()),
    };
    let cameras = cfg
        .camera_sources()
        .iter()
        .enumerate()
        .map(|(i, c)| c.model_name.clone().unwrap_or_else(|| format!("camera{i}")))
        .collect();
    let metadata = [
        ("version", env!("CARGO_PKG_VERSION").to_string()),
        ("config", cfg.file.display().to_string()),
        ("policy", cfg.policy.source.describe()),
        ("prompt", cfg.policy.prompt.clone()),
        (
            "io",
            match &cfg.io {
                Io::Ros(_) => "ros".to_string(),
                Io::Sim => "sim".to_string(),
            },
        ),
        ("control_rate_hz", cfg.control.rate_hz.to_string()),
        ("joints", cfg.limits.names().collect::<Vec<_>>().join(",")),
        // What `pi0d plot` draws the limits from (JSON; a continuous joint has no range).
        ("limits", limits_json(&cfg.limits)),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    RecordSetup {
        cfg: r.clone(),
        topics: Topics {
            joint_names: cfg.limits.names().map(str::to_string).collect(),
            joint_states,
            cameras,
            node,
        },
        metadata,
        control_rate_hz: cfg.control.rate_hz,
    }
}

/// `{"joint": {"lower": .., "upper": .., "velocity": ..}, ..}`, the commanded ranges.
fn limits_json(limits: &crate::robot::RobotLimits) -> String {
    let finite = |v: f64| v.is_finite().then_some(v);
    let map: serde_json::Map<String, serde_json::Value> = limits
        .joints
        .iter()
        .map(|j| {
            (
                j.name.clone(),
                serde_json::json!({
                    "lower": finite(j.lower),
                    "upper": finite(j.upper),
                    "velocity": j.velocity,
                    "acceleration": j.acceleration,
                }),
            )
        })
        .collect();
    serde_json::Value::Object(map).to_string()
}

#[allow(clippy::too_many_arguments)]
fn supervise(
    cfg: &Config,
    opts: &RunOptions,
    board: &Arc<Blackboard>,
    live: &Arc<LiveStats>,
    signals: &mut Signals,
    io_stop: &Arc<AtomicBool>,
    start: MonoTime,
    io: &Supervised<()>,
) -> Result<Summary, DaemonError> {
    let Some(first) = wait_first_joint_state(cfg, board, io, &signals.stop)? else {
        tracing::info!("stop requested before the first joint state: nothing moved");
        return Ok(Summary::default());
    };
    // The start gate, before the load: an arm outside its limits refuses the start at once.
    Controller::from_config(cfg, &first, MonoTime::now())?;
    let worker_stats = Arc::new(WorkerStats::default());
    let ends_at = opts.duration_s.map(|d| start.offset_seconds(d));
    let loaded = load::load(cfg, board, &worker_stats, &signals.stop, ends_at, io)?;
    let policy = match loaded.into_policy() {
        Ok(p) => p,
        Err(ended) => return Ok(*ended),
    };
    // Motion starts from where the arm is now, not where it was before the load.
    let first = board.inputs.joint_state.load();
    let controller = Controller::from_config(cfg, &first, MonoTime::now())?;
    tracing::info!(
        joints = cfg.limits.len(),
        rate_hz = cfg.control.rate_hz,
        start = ?first.position,
        "start gate passed: motion starts from the measured position"
    );
    // Before any motion: an address that cannot be served stops the start, not a run.
    let chunk_latency = match &cfg.metrics {
        Some(m) => {
            let endpoint = Arc::new(metrics::Metrics::new(
                live.clone(),
                worker_stats.clone(),
                board.clone(),
            ));
            let h = endpoint.chunk_latency.clone();
            metrics::serve(m.listen, endpoint, io_stop.clone()).map_err(|source| {
                DaemonError::Metrics {
                    listen: m.listen,
                    source,
                }
            })?;
            Some(h)
        }
        None => None,
    };
    // Before READY: a recording that cannot be created stops the start.
    let recorder = match &cfg.record {
        Some(r) => Some(Recorder::start(
            record_setup(cfg, r),
            board.clone(),
            live.clone(),
            || rt::lower_current_thread(rt::INFERENCE_NICE),
        )?),
        None => None,
    };
    let mut setup = WorkerSetup::from_config(cfg);
    setup.record = recorder.as_ref().map(|r| r.notes.clone());
    let (worker, worker_thread) = worker::spawn(
        policy,
        setup,
        board.clone(),
        worker_stats.clone(),
        io_stop.clone(),
    )
    .map_err(|source| DaemonError::Spawn {
        thread: "inference",
        source,
    })?;

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
        let tap = recorder.as_ref().map(|r| r.ticks.clone());
        let drills = cfg
            .drills_control_thread()
            .then(|| DrillHook::new(board.clone()));
        supervise::spawn(Role::Control, move |_| {
            rt::apply_to_current_thread(&rt_cfg);
            let mut lp = ControlLoop::new(
                controller,
                worker,
                board,
                live,
                stop_requested,
                events_tx,
                cameras,
                stop_timeout_s,
            );
            if let Some(tap) = tap {
                lp = lp.with_recorder(tap);
            }
            if let Some(drills) = drills {
                lp = lp.with_drills(drills);
            }
            lp.run(period_ns, (rt_cfg.spin_us * 1e3) as u64)
        })
        .map_err(|source| DaemonError::Spawn {
            thread: "control",
            source,
        })?
    };
    let notifier = notify::Notifier::from_env();
    notifier.ready();

    let mut log = EventLog {
        chunk_latency,
        record: recorder.as_ref().map(|r| r.notes.clone()),
        cameras: camera_names(cfg),
        joints: cfg.limits.joints.iter().map(|j| j.name.clone()).collect(),
        ..EventLog::default()
    };
    // What a reload compares with: the configuration as started, with what reloads applied.
    let mut running = cfg.clone();
    let mut reloader = reload::Reloader::new(opts.reload_from.clone());
    let mut status_line = StatusLine::new(opts.status, &status_tags(cfg, opts), cfg.control.period);
    let mut faults: Vec<String> = Vec::new();
    let mut drills = drill::Drills::new(&cfg.drills);
    let run_start = MonoTime::now();
    let mut lifecycle = Lifecycle::new(
        lifecycle::Settings {
            start_timeout_s: cfg.control.start_timeout_s,
            duration_s: opts.duration_s,
            status_interval_s: cfg.control.status_interval_s,
            watchdog_period_s: notify::watchdog_usec().map(|us| us as f64 / 2e6),
        },
        run_start,
    );
    let mut abandoned = false;
    while !control.is_finished() {
        std::thread::sleep(SUPERVISE_PERIOD);
        let now = MonoTime::now();
        drills.fire_due(lifecycle.elapsed_s(now), board);
        log.drain(&events_rx, start);
        if signals.take_reload() {
            reloader.request();
        }
        if let Some(loaded) = reloader.poll() {
            if let Some(l) = reload::apply(&mut running, loaded, board) {
                lifecycle.limits_sent(l);
            }
            lifecycle.set_status_interval(running.control.status_interval_s);
        }
        signals.log_ignored();
        let observed = lifecycle::Observed {
            now,
            ticks: LiveStats::get(&live.ticks),
            control_finished: control.is_finished(),
            inference: worker_thread.beat(),
            io_role: io.role,
            io: io.beat(),
            limit_violation: LiveStats::get(&live.limit_violation) == 1,
            fault_latched: LiveStats::get(&live.fault_latched) == 1,
            resets: log.resets,
            // Every chunk the control loop saw was accepted or rejected.
            started: LiveStats::get(&live.chunks_received) > LiveStats::get(&live.chunks_rejected),
            waiting: Waiting::from_code(LiveStats::get(&live.waiting)),
            stop_signal: signals.stop.load(Ordering::Relaxed),
            reconfigured: log.reconfigured.take(),
            accelerator: worker_stats.accelerator_fault(),
        };
        let step = lifecycle.poll(&observed);
        if !carry_out(
            &step,
            &observed,
            cfg,
            &worker_stats,
            board,
            live,
            &stop_requested,
            &mut running,
            &mut faults,
        ) {
            abandoned = step.abandon;
            break;
        }
        if step.show_status {
            let t = lifecycle.elapsed_s(now);
            status_line.show(
                live,
                &worker_stats,
                t,
                &board.command.load().1,
                &cfg.limits,
                board.inputs.task.load(),
            );
            // When stderr has failed, systemd's status line is where the loss still shows.
            let lost = log::lost_lines();
            notifier.status(&format!(
                "{} | {} ticks{}",
                mode_name(LiveStats::get(&live.mode)),
                LiveStats::get(&live.ticks),
                if lost > 0 {
                    format!(" | {lost} log lines lost (stderr failed)")
                } else {
                    String::new()
                }
            ));
        }
        if step.feed_watchdog {
            notifier.watchdog();
        }
    }
    status_line.finish();
    io_stop.store(true, Ordering::SeqCst);
    join_bounded(worker_thread);
    let waiting = lifecycle
        .start_waiting()
        .unwrap_or_else(|| Waiting::from_code(LiveStats::get(&live.waiting)));
    let (end, result): (ControlEnd, Option<ControlResult>) = if abandoned {
        (ControlEnd::Abandoned, None)
    } else {
        match control.health(MonoTime::now(), None) {
            Health::Panicked(m) => {
                tracing::error!("control thread panicked: {m}");
                faults.push(format!("control thread panicked: {m}"));
                (ControlEnd::Panicked, None)
            }
            _ => match control.join() {
                Some(r) => (
                    ControlEnd::Returned {
                        reached_rest: r.reached_rest,
                    },
                    Some(r),
                ),
                None => (ControlEnd::Panicked, None),
            },
        }
    };
    let exit = lifecycle.finish(end);
    log.drain(&events_rx, start);
    // The control thread is done (or gone): the file gets the last of it, then closes.
    log.record = None;
    let recording = recorder.map(Recorder::finish);
    let duration_s = MonoTime::now().seconds_since(run_start);
    let Some(result) = result else {
        return Ok(Summary {
            duration_s,
            faults,
            resets: log.resets,
            transitions: log.transitions,
            recording,
            exit,
            exit_code: exit.code(),
            ..Summary::default()
        });
    };
    let mut summary = build_summary(cfg, &result, &worker_stats, log, duration_s, exit);
    summary.faults = faults;
    summary.recording = recording;
    summary.waiting_for = (waiting != Waiting::Nothing).then(|| waiting.name().to_string());
    summary.sim_task = board.inputs.task.load();
    Ok(summary)
}

/// Carries out one poll's decisions (the logging and the shared flags); false when
/// supervision is over (the control thread ended, or is stuck).
#[allow(clippy::too_many_arguments)]
fn carry_out(
    step: &lifecycle::Step,
    observed: &lifecycle::Observed,
    cfg: &Config,
    worker_stats: &WorkerStats,
    board: &Blackboard,
    live: &LiveStats,
    stop_requested: &AtomicBool,
    running: &mut Config,
    faults: &mut Vec<String>,
) -> bool {
    if let Some(gap) = step.suspended_s {
        tracing::warn!(
            "the daemon was suspended for {gap:.1} s (SIGSTOP or a paused machine): the arm got no commands meanwhile; watchdogs hold it until inputs are fresh"
        );
    }
    if let Some(l) = &step.limits_in_force {
        running.limits = l.clone();
    }
    if step.lift_fault_latch {
        LiveStats::set(&live.fault_latched, 0);
        tracing::info!("fault latch lifted by the reset");
    }
    if let Some(fault) = &step.fault {
        match fault {
            lifecycle::Fault::ControlStalled(_) => {
                tracing::error!("{fault}: no controlled stop is possible; exiting")
            }
            lifecycle::Fault::Thread(..) => {
                tracing::error!("{fault}: e-stop latched, decelerating to rest, then exiting")
            }
            lifecycle::Fault::LimitViolation => {
                tracing::error!("{fault}: braking to rest, then exiting")
            }
            lifecycle::Fault::Accelerator(_) => tracing::error!(
                last_error = worker_stats
                    .last_policy_error
                    .lock()
                    .ok()
                    .and_then(|e| e.clone()),
                "{fault}: decelerating to rest, then exiting"
            ),
        }
        faults.push(fault.to_string());
    }
    if step.latch_estop() {
        board.supervisor.latch_fault();
    }
    if let Some(t) = step.start_warning {
        tracing::warn!(
            "not started after {t:.1} s: waiting for {} (gives up at control.start_timeout_s = {} s)",
            waiting_detail(cfg, observed.waiting, worker_stats),
            cfg.control.start_timeout_s
        );
    }
    match step.stop {
        Some(lifecycle::StopCause::StartTimeout) => tracing::error!(
            "the arm could not start within control.start_timeout_s = {} s: waiting for {}; stopping",
            cfg.control.start_timeout_s,
            waiting_detail(cfg, observed.waiting, worker_stats)
        ),
        Some(lifecycle::StopCause::DurationBeforeStart) => tracing::error!(
            "the run's --duration ended before the arm started: waiting for {}; stopping",
            waiting_detail(cfg, observed.waiting, worker_stats)
        ),
        Some(lifecycle::StopCause::Requested) => tracing::info!("stopping: decelerating to rest"),
        _ => {}
    }
    if step.stop.is_some() {
        stop_requested.store(true, Ordering::SeqCst);
    }
    !(step.abandon || step.finished)
}

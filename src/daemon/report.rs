//! What the supervisor tells people while the daemon runs and after: state transitions and chunk
//! outcomes from the control thread (`EventLog`), the live status line, and the JSON summary.

use crate::io::sim::task::TaskProgress;
use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::mpsc::Receiver;

use super::control::{ControlEvent, ControlResult};
use super::exit::ExitReason;
use super::log;
use super::summary::{Percentiles, Summary, TransitionRecord};
use super::worker::WorkerStats;
use crate::config::Config;
use crate::control::controller::ChunkOutcome;
use crate::record::{Note, NoteTap};
use crate::safety::reconfigure::Reconfigure;
use crate::safety::{HoldReason, Mode, SafetyEvent, Waiting};
use crate::telemetry::{mode_name, LiveStats};
use crate::time::MonoTime;

/// What the control thread reported, collected by the supervisor for the log and the summary.
#[derive(Default)]
pub(crate) struct EventLog {
    pub(crate) transitions: Vec<TransitionRecord>,
    pub(crate) late_rejections: BTreeMap<String, u64>,
    pub(crate) accepted: u64,
    pub(crate) reset_refused: u64,
    /// Per chunk switch, the distance its blend bridged.
    pub(crate) blend_corrections: Vec<f64>,
    /// The metrics endpoint's latency histogram, when there is one.
    pub(crate) chunk_latency: Option<prometheus_client::metrics::histogram::Histogram>,
    /// The recorder, when the run is recorded: every event goes there too.
    pub(crate) record: Option<NoteTap>,
    /// How the configuration names each camera, for the stale-camera holds.
    pub(crate) cameras: Vec<String>,
    /// The joints in command order, for reload refusals.
    pub(crate) joints: Vec<String>,
    /// Resets granted (each lifts a fault latch).
    pub(crate) resets: u64,
    /// The newest reload decision not yet taken by the supervisor.
    pub(crate) reconfigured: Option<Reconfigure>,
    /// Commands the independent monitor refused.
    pub(crate) limit_violations: u64,
}

impl EventLog {
    pub(crate) fn drain(&mut self, rx: &Receiver<ControlEvent>, start: MonoTime) {
        while let Ok(e) = rx.try_recv() {
            if let Some(r) = &self.record {
                let note = match e {
                    ControlEvent::Transition(t) => Some(Note::Transition(t)),
                    ControlEvent::Chunk(c) => Some(Note::Outcome(c)),
                    ControlEvent::ResetRefused => Some(Note::ResetRefused),
                    // Shown by the transitions they cause (or not: a refused reload).
                    ControlEvent::Reconfigured(_) | ControlEvent::LimitViolation => None,
                };
                if let Some(n) = note {
                    r.send(n);
                }
            }
            match e {
                ControlEvent::Transition(t) => {
                    let t_s = t.at.seconds_since(start);
                    // The safety event that caused a hold, as a field of its own (journald).
                    let event = match t.to {
                        Mode::Holding(r) => SafetyEvent::for_hold(r).map(SafetyEvent::name),
                        Mode::EStopped => Some(SafetyEvent::EStop.name()),
                        _ => None,
                    };
                    let camera = match t.to {
                        Mode::Holding(HoldReason::StaleCamera(k)) => {
                            self.cameras.get(usize::from(k)).cloned()
                        }
                        _ => None,
                    };
                    let t_ms = format!("{t_s:.3}");
                    match (event, &camera) {
                        (Some(event), Some(camera)) => {
                            tracing::warn!(t_s = t_ms, mode = t.to.name(), safety_event = event, camera = %camera, from = %t.from, to = %t.to, "state")
                        }
                        (Some(event), None) => {
                            tracing::warn!(t_s = t_ms, mode = t.to.name(), safety_event = event, from = %t.from, to = %t.to, "state")
                        }
                        (None, _) => {
                            tracing::info!(t_s = t_ms, mode = t.to.name(), from = %t.from, to = %t.to, "state")
                        }
                    }
                    self.resets += u64::from(t.is_reset());
                    self.transitions.push(TransitionRecord {
                        t_s,
                        from: t.from.to_string(),
                        to: t.to.to_string(),
                        camera,
                    });
                }
                ControlEvent::Chunk(ChunkOutcome::Accepted {
                    blend_correction,
                    latency_s,
                    ..
                }) => {
                    self.accepted += 1;
                    if let Some(h) = &self.chunk_latency {
                        h.observe(latency_s);
                    }
                    if let Some(c) = blend_correction {
                        if self.blend_corrections.len() < 10_000 {
                            self.blend_corrections.push(c);
                        }
                    }
                }
                ControlEvent::Chunk(ChunkOutcome::Rejected { reason, seq }) => {
                    let n = self
                        .late_rejections
                        .entry(reason.name().to_string())
                        .or_default();
                    if (*n).is_multiple_of(20) {
                        tracing::warn!(
                            chunk_seq = seq,
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
                        "reset refused: arm not at rest, outside its limits, or stopped by a limit violation; still e-stopped"
                    );
                }
                ControlEvent::Reconfigured(r) => {
                    self.log_reconfigure(r);
                    self.reconfigured = Some(r);
                }
                ControlEvent::LimitViolation => {
                    self.limit_violations += 1;
                    if self.limit_violations == 1 {
                        tracing::error!(
                            safety_event = SafetyEvent::LimitViolation.name(),
                            "the independent monitor refused a command outside the limits (a governor fault): the arm brakes from the last command that kept them, and pi0d stops"
                        );
                    }
                }
            }
        }
    }
}

impl EventLog {
    fn log_reconfigure(&self, r: Reconfigure) {
        match r {
            Reconfigure::Applied => {
                tracing::info!(
                    "SIGHUP: the reloaded limits are in force (the arm at rest inside them)"
                )
            }
            Reconfigure::Refused(o) => {
                let joint = self.joints.get(o.joint).map_or("?", String::as_str);
                tracing::warn!(
                    joint,
                    "SIGHUP: reloaded limits refused: joint `{joint}` would come to rest at {:.4}, outside its new range [{:.4}, {:.4}]; the running limits stay (move the arm inside the new range, then reload again)",
                    o.position,
                    o.lower,
                    o.upper
                )
            }
            Reconfigure::Abandoned => {
                tracing::info!("SIGHUP: reloaded limits not applied: stopping first")
            }
        }
    }
}

/// Why the arm is not running yet, in words, with the worker's side of it.
pub(crate) fn waiting_detail(cfg: &Config, waiting: Waiting, ws: &WorkerStats) -> String {
    match waiting {
        Waiting::JointState => format!(
            "{waiting}: joint states are older than safety.joint_state_timeout_s = {} s (sensor stalled, delayed or clock skew?)",
            cfg.safety.joint_state_timeout_s
        ),
        Waiting::Camera(k) => format!(
            "{waiting} ({}): its frames are older than safety.camera_timeout_s = {} s (or none came)",
            camera_name(cfg, k as usize),
            cfg.safety.camera_timeout_s
        ),
        Waiting::Chunk => {
            let rejected: Vec<String> = ws
                .rejected_by_reason()
                .iter()
                .filter(|(_, n)| *n > 0)
                .map(|(k, n)| format!("{n} {k}"))
                .collect();
            // A policy that never answers (a remote server down) is named by its own error.
            let errors = ws.policy_errors.load(Ordering::Relaxed);
            let latest = match ws.last_policy_error.lock() {
                Ok(e) => e.clone(),
                Err(poisoned) => poisoned.into_inner().clone(),
            };
            format!(
                "{waiting}: {} inference request(s), {} chunk(s) produced{}{}",
                ws.requests.load(Ordering::Relaxed),
                ws.produced.load(Ordering::Relaxed),
                if rejected.is_empty() {
                    String::new()
                } else {
                    format!(", rejected: {}", rejected.join(", "))
                },
                match latest {
                    Some(e) if errors > 0 => format!("; the latest policy error: {e}"),
                    _ => String::new(),
                }
            )
        }
        other => other.to_string(),
    }
}

/// How the configuration names each camera, in the model's order.
pub(crate) fn camera_names(cfg: &Config) -> Vec<String> {
    let count = match &cfg.io {
        crate::config::Io::Sim => cfg.sim.cameras.len(),
        crate::config::Io::Ros(r) => r.cameras.len(),
    };
    (0..count).map(|k| camera_name(cfg, k)).collect()
}

/// How the configuration names camera `k`: the simulated camera's name, or its ROS topic.
fn camera_name(cfg: &Config, k: usize) -> String {
    match &cfg.io {
        crate::config::Io::Sim => cfg.sim.cameras.get(k).map(|c| format!("`{}`", c.name)),
        crate::config::Io::Ros(r) => r.cameras.get(k).map(|t| format!("topic {t}")),
    }
    .unwrap_or_else(|| "?".into())
}

pub(crate) fn build_summary(
    cfg: &Config,
    r: &ControlResult,
    ws: &WorkerStats,
    log: EventLog,
    duration_s: f64,
    exit: ExitReason,
) -> Summary {
    let EventLog {
        transitions,
        late_rejections: late,
        accepted,
        reset_refused,
        blend_corrections,
        resets,
        ..
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
        peak_rss_mb: super::load::peak_resident_bytes() as f64 / 1e6,
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
        policy_errors_by_kind: crate::policy::RemoteFault::ALL
            .iter()
            .map(|f| {
                (
                    f.name().to_string(),
                    ws.remote_faults[*f as usize].load(Ordering::Relaxed),
                )
            })
            .filter(|(_, n)| *n > 0)
            .collect(),
        last_policy_error: ws.last_policy_error.lock().ok().and_then(|e| e.clone()),
        remote_policy: ws.remote.lock().ok().and_then(|r| r.clone()),
        inference_requests: ws.requests.load(Ordering::Relaxed),
        chunk_switches: switch_summary(cfg, ws, blend_corrections),
        inference_stages_ms: {
            let s = ws.stages.lock().map(|s| s.clone()).unwrap_or_default();
            super::summary::StageSummary {
                queue: percentiles(s.queue),
                preprocess: percentiles(s.preprocess),
                prefix: percentiles(s.prefix),
                steps: percentiles(s.steps),
                postprocess: percentiles(s.postprocess),
            }
        },
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
        exit,
        exit_code: exit.code(),
        resets,
        ..Summary::default()
    }
}

fn percentiles(mut v: Vec<f64>) -> Percentiles {
    v.sort_by(f64::total_cmp);
    let q = |p: f64| {
        v.get(((v.len() as f64 - 1.0) * p).round() as usize)
            .copied()
            .unwrap_or(0.0)
    };
    Percentiles {
        p50: q(0.5),
        p99: q(0.99),
        max: v.last().copied().unwrap_or(0.0),
    }
}

fn switch_summary(
    cfg: &Config,
    ws: &WorkerStats,
    blend_corrections: Vec<f64>,
) -> super::summary::SwitchSummary {
    let s = ws.switches.lock().map(|s| s.clone()).unwrap_or_default();
    super::summary::SwitchSummary {
        rtc: cfg.control.rtc.enabled,
        guided: s.guided,
        switches: s.prefix_distance.len() as u64,
        prefix_distance: percentiles(s.prefix_distance),
        blend_correction: percentiles(blend_corrections),
        delay_steps_max: s.delay_steps_max,
    }
}

/// Writes the summary whole or not at all (a temporary file renamed into place).
pub(crate) fn write_summary(path: &Path, s: &Summary) {
    let json = match serde_json::to_string_pretty(s) {
        Ok(j) => j,
        Err(e) => {
            tracing::error!(error = %e, "cannot encode summary");
            return;
        }
    };
    let tmp = path.with_extension(format!("tmp-{}", std::process::id()));
    let r = std::fs::write(&tmp, json).and_then(|()| std::fs::rename(&tmp, path));
    if let Err(e) = r {
        let _ = std::fs::remove_file(&tmp);
        tracing::error!(file = %path.display(), error = %e, "cannot write summary");
    }
}

/// The live one-line status: rewritten in place on a terminal, one log line per interval
/// otherwise (journald).
/// What the arm is doing, in words: at rest, or its fastest joint (as a share of that joint's
/// velocity limit).
fn motion(c: &crate::joints::MotionState, limits: &crate::robot::RobotLimits) -> String {
    let fastest = c
        .velocity
        .iter()
        .enumerate()
        .map(|(j, v)| (j, v.abs()))
        .fold(None::<(usize, f64)>, |best, (j, v)| match best {
            Some((_, b)) if b >= v => best,
            _ => Some((j, v)),
        });
    match fastest {
        Some((j, v)) if v > 1e-3 => {
            let Some(l) = limits.joints.get(j) else {
                return "moving".to_string();
            };
            let unit = if l.kind == crate::robot::JointKind::Prismatic {
                "m/s"
            } else {
                "rad/s"
            };
            let share = 100.0 * v / l.velocity.max(1e-9);
            format!(
                "moving: {} {v:.2} {unit} ({share:.0}% of its limit)",
                l.name
            )
        }
        _ => "at rest".to_string(),
    }
}

pub(crate) struct StatusLine {
    enabled: bool,
    /// Said at the start of every line (a dry run, scaled limits).
    tags: String,
    tty: bool,
    /// The control period jitter and overruns are judged against.
    period: std::time::Duration,
    last_ticks: u64,
    last_t: f64,
}

impl StatusLine {
    pub(crate) fn new(enabled: bool, tags: &str, period: std::time::Duration) -> StatusLine {
        StatusLine {
            enabled,
            tags: tags.to_string(),
            tty: std::io::stderr().is_terminal(),
            period,
            last_ticks: 0,
            last_t: 0.0,
        }
    }

    /// `command`: the latest command, to say what the arm is doing.
    pub(crate) fn show(
        &mut self,
        live: &LiveStats,
        ws: &WorkerStats,
        t: f64,
        command: &crate::joints::MotionState,
        limits: &crate::robot::RobotLimits,
        task: Option<TaskProgress>,
    ) {
        let remote = ws.remote.lock().ok().and_then(|r| r.clone());
        if let Some(r) = &remote {
            let us = |ms: f64| (ms * 1e3) as u64;
            LiveStats::set(&live.remote_active, 1);
            LiveStats::set(&live.remote_connected, r.connected as u64);
            LiveStats::set(&live.remote_rtt_p50_us, us(r.rtt_ms_p50));
            LiveStats::set(&live.remote_rtt_p99_us, us(r.rtt_ms_p99));
            LiveStats::set(&live.remote_server_infer_us, us(r.server_infer_ms_p50));
            LiveStats::set(&live.remote_reconnects, r.reconnects);
            let errors: u64 = ws
                .remote_faults
                .iter()
                .map(|c| c.load(Ordering::Relaxed))
                .sum();
            LiveStats::set(&live.remote_errors, errors);
        }
        if let Some((queue, t)) = ws.stages.lock().ok().and_then(|s| s.last) {
            let us = |ms: f64| (ms * 1e3) as u64;
            LiveStats::set(&live.stage_queue_us, us(queue));
            LiveStats::set(&live.stage_preprocess_us, us(t.preprocess_ms));
            LiveStats::set(&live.stage_prefix_us, us(t.prefix_ms));
            LiveStats::set(&live.stage_steps_us, us(t.steps_ms));
            LiveStats::set(&live.stage_postprocess_us, us(t.postprocess_ms));
        }
        let ticks = LiveStats::get(&live.ticks);
        let rate = ticks.saturating_sub(self.last_ticks) as f64 / (t - self.last_t).max(1e-9);
        self.last_ticks = ticks;
        self.last_t = t;
        if !self.enabled {
            return;
        }
        let mode = mode_name(LiveStats::get(&live.mode));
        let waiting = Waiting::from_code(LiveStats::get(&live.waiting));
        let state = match waiting {
            Waiting::Nothing => mode.to_string(),
            w => format!("{mode}, waiting for {}", w.name()),
        };
        let fields = super::status_line::StatusFields {
            t,
            rate_hz: rate,
            ticks,
            // The worst since the last line, not the last tick's: what the summary's p99 sees.
            jitter_max_us: live.interval_max_jitter_ns.swap(0, Ordering::Relaxed) / 1000,
            jitter_run_us: LiveStats::get(&live.max_jitter_ns) / 1000,
            overruns: LiveStats::get(&live.overruns),
            latency_ms: LiveStats::get(&live.last_latency_us) as f64 / 1e3,
            infer_ms: ws.last_infer_us.load(Ordering::Relaxed) as f64 / 1e3,
            state,
            chunks: LiveStats::get(&live.chunks_received),
            rejected: LiveStats::get(&live.chunks_rejected)
                + ws.rejected_by_reason().iter().map(|(_, n)| n).sum::<u64>(),
            safety_events: LiveStats::get(&live.safety_events),
            motion: motion(command, limits),
            server: remote.as_ref().map(|r| (r.rtt_ms_p50, r.connected)),
            task: task.map(|t| t.text()).unwrap_or_default(),
        };
        // Measured at every line: the terminal may have been resized.
        let width = super::status_line::stderr_width(self.tty);
        let line = super::status_line::status_text(&self.tags, &fields, width, self.period);
        if self.tty {
            log::write_status(&line);
        } else {
            tracing::info!(target: "pi0d::status", "{line}");
        }
    }

    pub(crate) fn finish(&self) {
        if self.enabled && self.tty {
            log::close_status();
        }
    }
}

//! One control tick, without threads or clocks of its own: read inputs, run the safety state
//! machine, pick the target from the executing chunk, pass it through the governor, and report.
//! `daemon::control_thread` drives it at the configured rate; tests and benches drive it directly.

use super::executor::{ChunkRejection, Executor};
use super::stats::Histogram;
use crate::chunk::JointChunk;
use crate::config::{Config, Workspace};
use crate::joints::{JointMeasurement, JointVector, MotionState};
use crate::robot::RobotLimits;
use crate::safety::{Governor, HoldReason, LimitMonitor, Mode, SafetyEvent, Target, Waiting};
use crate::time::MonoTime;

pub struct TickInputs<'a> {
    pub now: MonoTime,
    pub measured: &'a JointMeasurement,
    /// Capture time of each camera's latest frame (`MonoTime::ZERO`: none yet).
    pub camera_stamps: &'a [MonoTime],
    pub estop: bool,
    /// Count of reset requests so far; a change is one request.
    pub resets: u64,
    pub new_chunk: Option<Box<JointChunk>>,
    /// Consecutive control ticks that overran their deadline.
    pub overrun_streak: u32,
    pub stop_requested: bool,
    pub inference_in_flight: bool,
}

/// Why a chunk that reached the control thread was not executed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LateRejection {
    Stale,
    OutOfOrder,
    /// From an observation taken before the current hold, e-stop or reset.
    NotFresh,
    /// Arrived while inputs were stale, e-stopped or stopping.
    NotRunnable,
}

impl LateRejection {
    pub fn name(self) -> &'static str {
        match self {
            LateRejection::Stale => "stale",
            LateRejection::OutOfOrder => "out_of_order",
            LateRejection::NotFresh => "not_fresh",
            LateRejection::NotRunnable => "not_runnable",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ChunkOutcome {
    Accepted { latency_s: f64, seq: u64 },
    Rejected { reason: LateRejection, seq: u64 },
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Transition {
    pub at: MonoTime,
    pub from: Mode,
    pub to: Mode,
}

/// What one tick did; `Copy`, so reporting it never allocates.
#[derive(Clone, Copy, Debug)]
pub struct TickReport {
    pub mode: Mode,
    pub command: MotionState,
    pub request_inference: bool,
    pub transitions: [Option<Transition>; 2],
    pub chunk: Option<ChunkOutcome>,
    /// A reset was refused because the measured position is outside the limits.
    pub reset_refused: bool,
    /// Stopping has reached rest: the daemon may exit.
    pub done: bool,
    /// What the arm waits for while starting, holding or e-stopped.
    pub waiting: Waiting,
}

/// Starting is refused when the arm stands outside its limits.
#[derive(Debug, thiserror::Error)]
#[error("measured position of joint `{joint}` is {position:.4}, outside its limits [{lower:.4}, {upper:.4}]: refusing to start")]
pub struct StartRefused {
    pub joint: String,
    pub position: f64,
    pub lower: f64,
    pub upper: f64,
}

pub struct ControllerSettings {
    pub joint_state_timeout_s: f64,
    pub camera_timeout_s: f64,
    pub overrun_streak: u32,
    pub request_threshold_s: f64,
    pub warmup_chunks: u32,
}

pub struct Controller {
    settings: ControllerSettings,
    dt: f64,
    executor: Executor,
    governor: Governor,
    monitor: LimitMonitor,
    workspace: Option<Workspace>,
    mode: Mode,
    /// Chunks must come from observations after this time (hold start, reset, start-up).
    fresh_after: MonoTime,
    last_tick: MonoTime,
    seen_resets: u64,
    accepted: u64,
    events: [u64; SafetyEvent::COUNT],
    pub latency: Histogram,
}

fn check_start(limits: &RobotLimits, position: &JointVector) -> Result<(), StartRefused> {
    match limits.first_outside(position) {
        None => Ok(()),
        Some((l, p)) => Err(StartRefused {
            joint: l.name.clone(),
            position: p,
            lower: l.lower,
            upper: l.upper,
        }),
    }
}

impl Controller {
    pub fn from_config(
        cfg: &Config,
        start: &JointMeasurement,
        now: MonoTime,
    ) -> Result<Controller, StartRefused> {
        let settings = ControllerSettings {
            joint_state_timeout_s: cfg.safety.joint_state_timeout_s,
            camera_timeout_s: cfg.safety.camera_timeout_s,
            overrun_streak: cfg.safety.overrun_streak,
            request_threshold_s: cfg.control.request_threshold_s,
            warmup_chunks: cfg.control.warmup_chunks,
        };
        let dt = cfg.control.period.as_secs_f64();
        let executor = Executor::new(
            cfg.control.interpolation,
            cfg.control.merge,
            cfg.control.blend_window_s,
            dt,
        );
        Controller::new(
            cfg.limits.clone(),
            dt,
            executor,
            cfg.workspace.clone(),
            settings,
            start,
            now,
        )
    }

    pub fn new(
        limits: RobotLimits,
        dt: f64,
        executor: Executor,
        workspace: Option<Workspace>,
        settings: ControllerSettings,
        start: &JointMeasurement,
        now: MonoTime,
    ) -> Result<Controller, StartRefused> {
        check_start(&limits, &start.position)?;
        let mut executor = executor;
        executor.set_limits(&limits.velocity, &limits.acceleration);
        let mut monitor = LimitMonitor::new(limits.clone(), dt);
        monitor.reset_at(&start.position);
        Ok(Controller {
            settings,
            dt,
            executor,
            governor: Governor::new(limits, dt, start.position),
            monitor,
            workspace,
            mode: Mode::Starting,
            // Any observation from the start-gate measurement on is fresh.
            fresh_after: start
                .stamp
                .saturating_sub(std::time::Duration::from_nanos(1)),
            last_tick: now,
            seen_resets: 0,
            accepted: 0,
            events: [0; SafetyEvent::COUNT],
            latency: Histogram::new(100_000, 100_000),
        })
    }

    pub fn mode(&self) -> Mode {
        self.mode
    }

    pub fn commanded(&self) -> &MotionState {
        self.governor.state()
    }

    pub fn monitor(&self) -> &LimitMonitor {
        &self.monitor
    }

    pub fn event_counts(&self) -> &[u64; SafetyEvent::COUNT] {
        &self.events
    }

    fn count(&mut self, e: SafetyEvent) {
        self.events[e as usize] += 1;
    }

    fn set_mode(&mut self, to: Mode, now: MonoTime, report: &mut TickReport) {
        if to == self.mode {
            return;
        }
        let t = Transition {
            at: now,
            from: self.mode,
            to,
        };
        match &mut report.transitions {
            [slot @ None, _] | [Some(_), slot @ None] => *slot = Some(t),
            [_, last] => *last = Some(t),
        }
        self.mode = to;
    }

    /// Enters a hold: the chunk is dropped (never replayed) and only chunks from later
    /// observations are taken.
    fn hold(
        &mut self,
        reason: HoldReason,
        now: MonoTime,
        report: &mut TickReport,
        recycle: &mut impl FnMut(Box<JointChunk>),
    ) {
        if self.mode == Mode::Holding(reason) {
            return;
        }
        if let Some(e) = SafetyEvent::for_hold(reason) {
            self.count(e);
        }
        if let Some(c) = self.executor.clear() {
            recycle(c);
        }
        self.fresh_after = now;
        self.set_mode(Mode::Holding(reason), now, report);
    }

    /// The first watchdog that fires on stale inputs, if any.
    fn stale_input(&self, i: &TickInputs) -> Option<HoldReason> {
        if i.now.seconds_since(i.measured.stamp) > self.settings.joint_state_timeout_s {
            return Some(HoldReason::StaleJointState);
        }
        i.camera_stamps
            .iter()
            .position(|s| i.now.seconds_since(*s) > self.settings.camera_timeout_s)
            .map(|k| HoldReason::StaleCamera(k.min(255) as u8))
    }

    pub fn tick(
        &mut self,
        mut i: TickInputs,
        recycle: &mut impl FnMut(Box<JointChunk>),
    ) -> TickReport {
        let now = i.now;
        let mut report = TickReport {
            mode: self.mode,
            command: *self.governor.state(),
            request_inference: false,
            transitions: [None, None],
            chunk: None,
            reset_refused: false,
            done: false,
            waiting: Waiting::Nothing,
        };

        // Latched e-stop and reset.
        if i.estop && self.mode != Mode::EStopped {
            self.count(SafetyEvent::EStop);
            if let Some(c) = self.executor.clear() {
                recycle(c);
            }
            self.set_mode(Mode::EStopped, now, &mut report);
        }
        if i.resets != self.seen_resets {
            self.seen_resets = i.resets;
            if self.mode == Mode::EStopped && !i.estop {
                if self.governor.state().velocity.iter().any(|v| *v != 0.0) {
                    // Not yet at rest: remember nothing; the operator resets again once stopped.
                    report.reset_refused = true;
                } else if check_start(self.governor.limits(), &i.measured.position).is_err() {
                    report.reset_refused = true;
                } else {
                    self.count(SafetyEvent::Reset);
                    // Motion restarts from where the arm really is (it may have been moved by hand).
                    self.governor.reset_at(&i.measured.position);
                    self.monitor.reset_at(&i.measured.position);
                    self.fresh_after = now;
                    self.set_mode(Mode::Holding(HoldReason::AfterReset), now, &mut report);
                }
            }
        }
        if i.stop_requested && !matches!(self.mode, Mode::Stopping | Mode::EStopped) {
            if let Some(c) = self.executor.clear() {
                recycle(c);
            }
            self.set_mode(Mode::Stopping, now, &mut report);
        }

        // Watchdogs.
        let stale = self.stale_input(&i);
        let active = matches!(self.mode, Mode::Running | Mode::Starting | Mode::Holding(_));
        if let (Some(reason), Mode::Running) = (stale, self.mode) {
            self.hold(reason, now, &mut report, recycle);
        }
        if self.mode == Mode::Running && i.overrun_streak >= self.settings.overrun_streak {
            self.hold(HoldReason::Overruns, now, &mut report, recycle);
        }

        // A newly arrived chunk.
        // While stopping, a chunk still in flight is simply returned to the pool.
        let incoming = match i.new_chunk.take() {
            Some(c) if self.mode == Mode::Stopping => {
                recycle(c);
                None
            }
            other => other,
        };
        if let Some(chunk) = incoming {
            let seq = chunk.seq;
            let outcome = if !active || stale.is_some() {
                recycle(chunk);
                ChunkOutcome::Rejected {
                    reason: LateRejection::NotRunnable,
                    seq,
                }
            } else if chunk.obs_stamp <= self.fresh_after {
                recycle(chunk);
                ChunkOutcome::Rejected {
                    reason: LateRejection::NotFresh,
                    seq,
                }
            } else {
                let latency_s = now.seconds_since(chunk.obs_stamp);
                let commanded = *self.governor.state();
                match self.executor.accept(chunk, now, self.last_tick, &commanded) {
                    Ok(old) => {
                        if let Some(old) = old {
                            recycle(old);
                        }
                        self.accepted += 1;
                        if self.accepted > self.settings.warmup_chunks as u64 {
                            self.latency.record((latency_s.max(0.0) * 1e9) as u64);
                        }
                        self.set_mode(Mode::Running, now, &mut report);
                        ChunkOutcome::Accepted { latency_s, seq }
                    }
                    Err((chunk, why)) => {
                        recycle(chunk);
                        let reason = match why {
                            ChunkRejection::Stale => LateRejection::Stale,
                            ChunkRejection::OutOfOrder => LateRejection::OutOfOrder,
                        };
                        ChunkOutcome::Rejected { reason, seq }
                    }
                }
            };
            report.chunk = Some(outcome);
        }

        // Pick the target (sampled once per tick; `JointVector` is Copy, no allocation).
        let mut target: Option<JointVector> = None;
        if self.mode == Mode::Running {
            match self.executor.target(now).copied() {
                None => self.hold(HoldReason::ChunkStarved, now, &mut report, recycle),
                Some(t) if !t.all_finite() => {
                    self.hold(HoldReason::NonFiniteTarget, now, &mut report, recycle)
                }
                Some(t) => {
                    let outside = self
                        .workspace
                        .as_ref()
                        .is_some_and(|w| !w.contains(t.as_slice()));
                    if outside {
                        self.hold(HoldReason::Workspace, now, &mut report, recycle);
                    } else {
                        target = Some(t);
                    }
                }
            }
        }
        let gov = match &target {
            Some(t) => self.governor.step(Target::Track(t), &i.measured.position),
            None => self.governor.step(Target::Stop, &i.measured.position),
        };
        if gov.position_clamped {
            self.count(SafetyEvent::PositionClamped);
        }
        if gov.max_step_clamped {
            self.count(SafetyEvent::MaxStepClamped);
        }
        if gov.jerk_override {
            self.count(SafetyEvent::JerkOverride);
        }
        if gov.limit_brake {
            self.hold(HoldReason::PositionLimit, now, &mut report, recycle);
        }
        let command = *self.governor.state();
        self.monitor.observe(&command.position);

        // Ask for the next chunk early enough that the robot never pauses.
        let wants_chunk = match self.mode {
            Mode::Running => self.executor.remaining_s(now) < self.settings.request_threshold_s,
            Mode::Starting | Mode::Holding(_) => true,
            Mode::EStopped | Mode::Stopping => false,
        };
        report.request_inference = wants_chunk && stale.is_none() && !i.inference_in_flight;
        // An e-stopped arm stays latched while the daemon shuts down; it is already holding.
        report.done = gov.at_rest
            && (self.mode == Mode::Stopping || (i.stop_requested && self.mode == Mode::EStopped));
        report.waiting = match (self.mode, stale) {
            (Mode::EStopped, _) => Waiting::Reset,
            (Mode::Starting | Mode::Holding(_), Some(HoldReason::StaleCamera(k))) => {
                Waiting::Camera(k)
            }
            (Mode::Starting | Mode::Holding(_), Some(_)) => Waiting::JointState,
            (Mode::Starting | Mode::Holding(_), None) => Waiting::Chunk,
            _ => Waiting::Nothing,
        };
        report.mode = self.mode;
        report.command = command;
        self.last_tick = now;
        report
    }

    pub fn dt(&self) -> f64 {
        self.dt
    }
}

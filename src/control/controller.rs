//! One control tick, without threads or clocks of its own. The tick reads as its steps:
//! 1. the safety supervisor takes the operator's inputs and the watchdogs (e-stop latch and
//!    reset, stop request, stale inputs, overruns);
//! 2. a newly arrived chunk is admitted (fresh, runnable) and merged by the executor;
//! 3. the target is sampled once from the executing chunk and checked (finite, workspace);
//! 4. the governor moves the command toward it within the limits (or brakes to rest);
//! 5. an independent monitor checks what was commanded;
//! 6. the next inference is requested early enough that the arm never pauses.
//!
//! `daemon::control` drives it at the configured rate; tests and benches drive it directly.

use super::executor::{ChunkRejection, Executor};
use super::stats::Histogram;
use crate::chunk::JointChunk;
use crate::config::{Config, Workspace};
use crate::joints::{JointMeasurement, JointVector, MotionState};
use crate::robot::RobotLimits;
use crate::safety::supervisor::{
    Gate, LateRejection, SafetyInputs, StartRefused, Supervisor, SupervisorSettings, Transitions,
};
use crate::safety::{
    Governor, GovernorReport, HoldReason, LimitMonitor, Mode, SafetyEvent, Target, Verdict, Waiting,
};
use crate::time::MonoTime;

/// The longest stall a tick catches up on (s); a longer one is the overrun watchdog's.
const MAX_CATCH_UP_S: f64 = 0.1;

pub struct TickInputs<'a> {
    /// What the safety supervisor reads: time, measurements, operator inputs, overruns.
    pub safety: SafetyInputs<'a>,
    pub new_chunk: Option<Box<JointChunk>>,
    pub inference_in_flight: bool,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ChunkOutcome {
    /// `blend_correction`: for a chunk that replaced a running one, the largest joint
    /// distance (rad or m) the blend had to bridge between the command and the new chunk.
    Accepted {
        latency_s: f64,
        seq: u64,
        blend_correction: Option<f64>,
    },
    Rejected {
        reason: LateRejection,
        seq: u64,
    },
}

/// What one tick did; `Copy`, so reporting it never allocates.
#[derive(Clone, Copy, Debug)]
pub struct TickReport {
    pub mode: Mode,
    pub command: MotionState,
    pub request_inference: bool,
    pub transitions: Transitions,
    pub chunk: Option<ChunkOutcome>,
    /// A reset was refused because the arm still moves or stands outside its limits.
    pub reset_refused: bool,
    /// Stopping has reached rest: the daemon may exit.
    pub done: bool,
    /// What the arm waits for while starting, holding or e-stopped.
    pub waiting: Waiting,
    /// The `seq` of the chunk being executed, if one is.
    pub running_chunk: Option<u64>,
}

pub struct ControllerSettings {
    pub joint_state_timeout_s: f64,
    pub camera_timeout_s: f64,
    pub overrun_streak: u32,
    pub request_threshold_s: f64,
    pub warmup_chunks: u32,
}

pub struct Controller {
    request_threshold_s: f64,
    warmup_chunks: u32,
    dt: f64,
    executor: Executor,
    governor: Governor,
    monitor: LimitMonitor,
    safety: Supervisor,
    last_tick: MonoTime,
    accepted: u64,
    pub latency: Histogram,
    /// Tighter limits from a reload, applied once the arm is at rest.
    pending_limits: Option<Box<RobotLimits>>,
    at_rest: bool,
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
        let safety = Supervisor::new(
            SupervisorSettings {
                joint_state_timeout_s: settings.joint_state_timeout_s,
                camera_timeout_s: settings.camera_timeout_s,
                overrun_streak: settings.overrun_streak,
            },
            limits.clone(),
            workspace,
            start,
        )?;
        let mut executor = executor;
        executor.set_limits(&limits.velocity, &limits.acceleration);
        let mut monitor = LimitMonitor::new(limits.clone(), dt);
        monitor.reset_at(&start.position);
        Ok(Controller {
            request_threshold_s: settings.request_threshold_s,
            warmup_chunks: settings.warmup_chunks,
            dt,
            executor,
            governor: Governor::new(limits, dt, start.position),
            monitor,
            safety,
            last_tick: now,
            accepted: 0,
            pending_limits: None,
            at_rest: true,
            latency: Histogram::new(100_000, 100_000),
        })
    }

    pub fn mode(&self) -> Mode {
        self.safety.mode()
    }

    pub fn commanded(&self) -> &MotionState {
        self.governor.state()
    }

    pub fn monitor(&self) -> &LimitMonitor {
        &self.monitor
    }

    pub fn event_counts(&self) -> &[u64; SafetyEvent::COUNT] {
        self.safety.event_counts()
    }

    pub fn dt(&self) -> f64 {
        self.dt
    }

    fn drop_chunk(&mut self, recycle: &mut impl FnMut(Box<JointChunk>)) {
        if let Some(c) = self.executor.clear() {
            recycle(c);
        }
    }

    fn hold(
        &mut self,
        reason: HoldReason,
        now: MonoTime,
        t: &mut Transitions,
        recycle: &mut impl FnMut(Box<JointChunk>),
    ) {
        if self.safety.hold(reason, now, t) {
            self.drop_chunk(recycle);
        }
    }

    /// Tighter limits (a configuration reload): a running arm holds first; they apply at rest
    /// and the arm resumes with a fresh chunk, as after any hold.
    pub fn request_limits(&mut self, limits: Box<RobotLimits>) {
        self.pending_limits = Some(limits);
    }

    fn apply_pending_limits(
        &mut self,
        now: MonoTime,
        t: &mut Transitions,
        recycle: &mut impl FnMut(Box<JointChunk>),
    ) {
        if self.pending_limits.is_none() {
            return;
        }
        match self.safety.mode() {
            Mode::Running => self.hold(HoldReason::Reconfigure, now, t, recycle),
            Mode::Stopping => self.pending_limits = None,
            _ if self.at_rest => {
                if let Some(l) = self.pending_limits.take() {
                    self.executor.set_limits(&l.velocity, &l.acceleration);
                    self.governor.set_limits((*l).clone());
                    self.monitor.set_limits((*l).clone());
                    self.safety.set_limits(*l);
                }
            }
            _ => {}
        }
    }

    pub fn tick(
        &mut self,
        mut i: TickInputs,
        recycle: &mut impl FnMut(Box<JointChunk>),
    ) -> TickReport {
        let now = i.safety.now;
        let mut t: Transitions = [None, None];
        self.apply_pending_limits(now, &mut t, recycle);

        // 1. Operator inputs and watchdogs.
        let gate = self
            .safety
            .observe(&i.safety, self.governor.state(), &mut t);
        if let Some(p) = gate.reset_at {
            self.governor.reset_at(&p);
            self.monitor.reset_at(&p);
        }
        if gate.drop_chunk {
            self.drop_chunk(recycle);
        }

        // 2. A newly arrived chunk (none while reloaded limits wait for the arm to rest).
        let chunk = match i.new_chunk.take() {
            Some(c) if self.pending_limits.is_some() => {
                recycle(c);
                None
            }
            c => c.and_then(|c| self.take_chunk(c, now, &gate, &mut t, recycle)),
        };

        // 3-5. The target, the governor and the independent monitor, once per control period
        // since the last tick: after a stall (a host that did not run this thread) the command
        // moves on with the time that passed, as the controller it feeds extrapolated it did,
        // instead of lagging that by the stall and having it brake back.
        let periods = self.periods_since_last_tick(now);
        for m in (1..periods).rev() {
            if self.safety.mode() != Mode::Running {
                break;
            }
            let at = now.offset_seconds(-(m as f64) * self.dt);
            self.govern(at, &i.safety.measured.position, &mut t, recycle);
        }
        let gov = self.govern(now, &i.safety.measured.position, &mut t, recycle);
        let command = *self.governor.state();

        // 6. The next inference, early enough that the arm never pauses.
        let mode = self.safety.mode();
        let wants_chunk = match mode {
            Mode::Running => self.executor.remaining_s(now) < self.request_threshold_s,
            Mode::Starting | Mode::Holding(_) => true,
            Mode::EStopped | Mode::Stopping => false,
        };
        self.last_tick = now;
        TickReport {
            mode,
            command,
            request_inference: wants_chunk && gate.stale.is_none() && !i.inference_in_flight,
            transitions: t,
            chunk,
            reset_refused: gate.reset_refused,
            // An e-stopped arm stays latched while the daemon shuts down; it is already holding.
            done: gov.at_rest
                && (mode == Mode::Stopping || (i.safety.stop_requested && mode == Mode::EStopped)),
            waiting: self.safety.waiting(gate.stale),
            running_chunk: self.executor.active_seq(),
        }
    }

    /// Admits and merges a newly arrived chunk; while stopping, one still in flight simply
    /// goes back to the pool.
    fn take_chunk(
        &mut self,
        chunk: Box<JointChunk>,
        now: MonoTime,
        gate: &Gate,
        t: &mut Transitions,
        recycle: &mut impl FnMut(Box<JointChunk>),
    ) -> Option<ChunkOutcome> {
        if self.safety.mode() == Mode::Stopping {
            recycle(chunk);
            return None;
        }
        let seq = chunk.seq;
        if let Err(reason) = self.safety.admit(chunk.obs_stamp, gate) {
            recycle(chunk);
            return Some(ChunkOutcome::Rejected { reason, seq });
        }
        let latency_s = now.seconds_since(chunk.obs_stamp);
        let commanded = *self.governor.state();
        Some(
            match self.executor.accept(chunk, now, self.last_tick, &commanded) {
                Ok(old) => {
                    let blend_correction = old.is_some().then(|| self.executor.last_correction());
                    if let Some(old) = old {
                        recycle(old);
                    }
                    self.accepted += 1;
                    if self.accepted > self.warmup_chunks as u64 {
                        self.latency.record((latency_s.max(0.0) * 1e9) as u64);
                    }
                    self.safety.run(now, t);
                    ChunkOutcome::Accepted {
                        latency_s,
                        seq,
                        blend_correction,
                    }
                }
                Err((chunk, why)) => {
                    recycle(chunk);
                    let reason = match why {
                        ChunkRejection::Stale => LateRejection::Stale,
                        ChunkRejection::OutOfOrder => LateRejection::OutOfOrder,
                    };
                    ChunkOutcome::Rejected { reason, seq }
                }
            },
        )
    }

    /// The running chunk's target now, if the supervisor lets it run; otherwise the arm holds.
    fn target(
        &mut self,
        now: MonoTime,
        t: &mut Transitions,
        recycle: &mut impl FnMut(Box<JointChunk>),
    ) -> Option<JointVector> {
        if self.safety.mode() != Mode::Running {
            return None;
        }
        let Some(target) = self.executor.target(now).copied() else {
            self.hold(HoldReason::ChunkStarved, now, t, recycle);
            return None;
        };
        match self.safety.check(&target) {
            Verdict::Ok => Some(target),
            Verdict::Hold(reason) => {
                self.hold(reason, now, t, recycle);
                None
            }
        }
    }

    /// Whole control periods from the last tick (or the start) to `now`: 1 on time, at most
    /// `MAX_CATCH_UP_S` worth (a longer stall is the overrun watchdog's). Only a running arm
    /// catches up, so the wait before the first tick never counts.
    fn periods_since_last_tick(&self, now: MonoTime) -> usize {
        let periods = (now.seconds_since(self.last_tick) / self.dt).round();
        let max = (MAX_CATCH_UP_S / self.dt).ceil();
        periods.clamp(1.0, max.max(1.0)) as usize
    }

    /// One control period at `at`: the target sampled and checked, the governor stepped to
    /// it (or to a stop), the monitor shown the command.
    fn govern(
        &mut self,
        at: MonoTime,
        measured: &JointVector,
        t: &mut Transitions,
        recycle: &mut impl FnMut(Box<JointChunk>),
    ) -> GovernorReport {
        let target = self.target(at, t, recycle);
        let gov = match &target {
            Some(p) => self.governor.step(Target::Track(p), measured),
            None => self.governor.step(Target::Stop, measured),
        };
        self.count_governor(&gov);
        self.at_rest = gov.at_rest;
        if gov.limit_brake {
            self.hold(HoldReason::PositionLimit, at, t, recycle);
        }
        self.monitor.observe(&self.governor.state().position);
        gov
    }

    fn count_governor(&mut self, gov: &GovernorReport) {
        for (hit, e) in [
            (gov.position_clamped, SafetyEvent::PositionClamped),
            (gov.max_step_clamped, SafetyEvent::MaxStepClamped),
            (gov.jerk_override, SafetyEvent::JerkOverride),
        ] {
            if hit {
                self.safety.count(e);
            }
        }
    }
}

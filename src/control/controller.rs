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
use super::unsent::Recent;
use crate::chunk::JointChunk;
use crate::config::{CommandType, Config, Io};
use crate::joints::{JointMeasurement, JointVector, MotionState};
use crate::robot::lookahead::Lookahead;
use crate::robot::{RobotLimits, Workspace};
use crate::safety::reconfigure::{self, Reconfigure};
use crate::safety::supervisor::{
    Gate, LateRejection, SafetyInputs, StartRefused, Supervisor, SupervisorSettings, Transitions,
};
use crate::safety::{
    Governor, GovernorReport, HoldReason, LimitMonitor, Mode, SafetyEvent, Target, Verdict, Waiting,
};
use crate::time::MonoTime;

/// The longest stall a tick catches up on (s); a longer one is the overrun watchdog's.
const MAX_CATCH_UP_S: f64 = 0.1;
/// How far ahead a reload's stopping point is foreseen (s); a longer stop is judged at rest.
const STOP_HORIZON_S: f64 = 30.0;

pub struct TickInputs<'a> {
    /// What the safety supervisor reads: time, measurements, operator inputs, overruns.
    pub safety: SafetyInputs<'a>,
    pub new_chunk: Option<Box<JointChunk>>,
    pub inference_in_flight: bool,
    /// The tick (its `now`) of the newest command the transports have sent to the trajectory
    /// controllers; `None` where nothing says (no trajectory output, a simulated robot).
    pub trajectories_sent: Option<MonoTime>,
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
    pub(crate) mode: Mode,
    pub command: MotionState,
    pub(crate) request_inference: bool,
    pub(crate) transitions: Transitions,
    pub chunk: Option<ChunkOutcome>,
    /// A reset was refused because the arm still moves or stands outside its limits.
    pub reset_refused: bool,
    /// Stopping has reached rest: the daemon may exit.
    pub(crate) done: bool,
    /// What the arm waits for while starting, holding or e-stopped.
    pub(crate) waiting: Waiting,
    /// The `seq` of the chunk being executed, if one is.
    pub(crate) running_chunk: Option<u64>,
    /// What became of reloaded limits, in the tick that decided it.
    pub(crate) reconfigured: Option<Reconfigure>,
    /// The independent monitor found this tick's command outside the limits: it was not
    /// commanded, the arm brakes from the last command that kept them, and the daemon stops.
    pub limit_violation: bool,
}

pub struct ControllerSettings {
    pub joint_state_timeout_s: f64,
    pub camera_timeout_s: f64,
    pub overrun_streak: u32,
    pub request_threshold_s: f64,
    pub warmup_chunks: u32,
    /// The joints whose controllers run each command's look-ahead on their own (trajectory
    /// outputs), and how long it coasts before braking (`ros.trajectory_coast_s`).
    pub trajectory_joints: Vec<usize>,
    pub trajectory_coast_s: f64,
    /// The longest time between two messages of a trajectory output (s: 1 / its rate).
    pub trajectory_interval_s: f64,
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
    pub(crate) latency: Histogram,
    /// Tighter limits from a reload, applied once the arm is at rest inside them.
    pending_limits: Option<Box<RobotLimits>>,
    /// A reload decided outside a tick (refused on arrival), reported by the next one.
    reconfigured: Option<Reconfigure>,
    at_rest: bool,
    /// A fault drill: the governor's next command is this far off (rad or m) on joint 0.
    governor_fault: Option<f64>,
    /// What a trajectory's braking tail keeps (the limits in force), and the joints whose
    /// controllers follow it when no newer command comes.
    lookahead: Lookahead,
    trajectory_joints: Vec<usize>,
    trajectory_coast_s: f64,
    /// A gap in the trajectories sent longer than this (s) means the controllers have been
    /// running the look-ahead of the last one they got.
    unsent_after_s: f64,
    /// The last ticks' commands, to find that one; and it, once found, while the gap lasts.
    recent: Recent,
    unsent_anchor: Option<(MonoTime, MotionState)>,
}

impl Controller {
    pub(crate) fn from_config(
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
            trajectory_joints: match &cfg.io {
                Io::Ros(r) => r
                    .commands
                    .iter()
                    .filter(|g| g.kind == CommandType::JointTrajectory)
                    .flat_map(|g| g.indices.iter().copied())
                    .collect(),
                Io::Sim => Vec::new(),
            },
            trajectory_coast_s: match &cfg.io {
                Io::Ros(r) => r.trajectory_coast_s,
                Io::Sim => 0.0,
            },
            trajectory_interval_s: match &cfg.io {
                Io::Ros(r) => r
                    .commands
                    .iter()
                    .filter(|g| g.kind == CommandType::JointTrajectory)
                    .map(|g| 1.0 / g.rate_hz)
                    .fold(0.0, f64::max),
                Io::Sim => 0.0,
            },
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
        let lookahead = Lookahead::new(&limits, settings.trajectory_coast_s);
        // Half the coast without news: the controllers have left the command's line by a
        // hair (its jerk over that time) and are about to brake.
        let unsent_after_s =
            settings.trajectory_interval_s.max(dt) + 0.5 * settings.trajectory_coast_s;
        let kept = (unsent_after_s / dt).ceil() as usize + 2;
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
            reconfigured: None,
            at_rest: true,
            governor_fault: None,
            lookahead,
            trajectory_joints: settings.trajectory_joints,
            trajectory_coast_s: settings.trajectory_coast_s,
            unsent_after_s,
            recent: Recent::new(kept),
            unsent_anchor: None,
            latency: Histogram::new(100_000, 100_000),
        })
    }

    pub(crate) fn mode(&self) -> Mode {
        self.safety.mode()
    }

    /// What the governor last commanded, for the watchdog tests.
    #[cfg(test)]
    pub(crate) fn commanded(&self) -> &MotionState {
        self.governor.state()
    }

    /// What a trajectory's braking tail keeps: the limits in force (a reload changes it).
    pub(crate) fn lookahead(&self) -> Lookahead {
        self.lookahead
    }

    pub fn monitor(&self) -> &LimitMonitor {
        &self.monitor
    }

    pub(crate) fn event_counts(&self) -> &[u64; SafetyEvent::COUNT] {
        self.safety.event_counts()
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

    /// Tighter limits (a configuration reload). Refused at once when the command would come
    /// to rest outside their range if it braked now; otherwise a running arm holds, and they
    /// apply at rest inside them (judged again there), the arm resuming with a fresh chunk.
    /// The outcome is in a later tick's report.
    pub(crate) fn request_limits(&mut self, limits: Box<RobotLimits>) {
        let command = self.governor.state().position;
        let rest = self.governor.stopping_point(&command, STOP_HORIZON_S);
        if let Some(refused) = reconfigure::on_arrival(&limits, rest.as_ref()) {
            self.pending_limits = None;
            self.reconfigured = Some(refused);
        } else {
            self.pending_limits = Some(limits);
        }
    }

    /// A fault drill: the governor's next command is `offset` off on the first joint, as a
    /// governor bug would make it; the independent monitor must catch it.
    pub(crate) fn inject_governor_fault(&mut self, offset: f64) {
        self.governor_fault = Some(offset);
    }

    fn reconfigure(
        &mut self,
        now: MonoTime,
        t: &mut Transitions,
        recycle: &mut impl FnMut(Box<JointChunk>),
    ) -> Option<Reconfigure> {
        let limits = self.pending_limits.as_deref()?;
        let mode = self.safety.mode();
        let command = &self.governor.state().position;
        match reconfigure::step(limits, mode == Mode::Stopping, self.at_rest, command) {
            reconfigure::Step::Wait => {
                if mode == Mode::Running {
                    self.hold(HoldReason::Reconfigure, now, t, recycle);
                }
                None
            }
            reconfigure::Step::Decided(outcome) => {
                if let (Reconfigure::Applied, Some(l)) = (outcome, self.pending_limits.take()) {
                    self.lookahead = Lookahead::new(&l, self.trajectory_coast_s);
                    self.executor.set_limits(&l.velocity, &l.acceleration);
                    self.governor.set_limits((*l).clone());
                    self.monitor.set_limits((*l).clone());
                    self.safety.set_limits(*l);
                }
                self.pending_limits = None;
                Some(outcome)
            }
        }
    }

    pub fn tick(
        &mut self,
        mut i: TickInputs,
        recycle: &mut impl FnMut(Box<JointChunk>),
    ) -> TickReport {
        let now = i.safety.now;
        // What the last tick commanded: where the controllers' look-ahead starts.
        let sent = *self.governor.state();
        let mut t: Transitions = [None, None];
        let reconfigured = self
            .reconfigured
            .take()
            .or_else(|| self.reconfigure(now, &mut t, recycle));

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
        let mut limit_violation = false;
        for m in (1..periods).rev() {
            if self.safety.mode() != Mode::Running {
                break;
            }
            let at = now.offset_seconds(-(m as f64) * self.dt);
            let (_, broken) = self.govern(at, &i.safety.measured.position, &mut t, recycle);
            limit_violation |= broken;
        }
        if gate.reset_at.is_none() {
            self.resume_where_the_lookahead_went(&sent, now);
            self.follow_the_lookahead_while_unsent(i.trajectories_sent, now);
        }
        let (gov, broken) = self.govern(now, &i.safety.measured.position, &mut t, recycle);
        limit_violation |= broken;
        let command = *self.governor.state();
        if !self.trajectory_joints.is_empty() {
            self.recent.push(now, command);
        }

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
            reconfigured,
            limit_violation,
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
        let target = self.executor.target(now).copied();
        match self.safety.check(target.as_ref()) {
            Verdict::Ok => target,
            Verdict::Hold(reason) => {
                self.hold(reason, now, t, recycle);
                None
            }
        }
    }

    /// After a stall (this tick came more than half a period late), the joints whose
    /// controllers run the look-ahead went on without pi0d: along the last command, then
    /// braking to rest. Their command resumes from where that took them by now, not from where
    /// the governor left it, so the next message continues the controller's own motion instead
    /// of pulling it back (or on) in one step. The monitor's history resumes there too: what it
    /// judges next is the step from the controller's state. The last command was due one
    /// period after its tick, so the controller is `now - last tick - dt` into the look-ahead.
    fn resume_where_the_lookahead_went(&mut self, sent: &MotionState, now: MonoTime) {
        let late_s = now.seconds_since(self.last_tick) - self.dt;
        if late_s < 0.5 * self.dt || self.trajectory_joints.is_empty() {
            return;
        }
        let went = self
            .lookahead
            .state_at(sent, &self.trajectory_joints, late_s);
        self.resume_from(&went);
    }

    /// While no trajectory went out for longer than `unsent_after_s` (the I/O thread not run,
    /// the control thread on time), the controllers have been running the look-ahead of the
    /// last command they got, coasting and then braking, while the governor tracked the chunk
    /// on: a message from the governor's command would pull them to it in one step. So the
    /// command follows where that look-ahead took them, until a message goes out again; the
    /// governor moves on from there within its limits.
    fn follow_the_lookahead_while_unsent(&mut self, sent: Option<MonoTime>, now: MonoTime) {
        let Some(sent) = sent else { return };
        let gap_s = now.seconds_since(sent);
        if self.trajectory_joints.is_empty() || gap_s <= self.unsent_after_s {
            self.unsent_anchor = None;
            return;
        }
        let anchor = match self.unsent_anchor {
            Some((tick, cmd)) if tick == sent => cmd,
            _ => match self.recent.find(sent) {
                Some(cmd) => cmd,
                // Older than the ticks kept (a stall of this thread too): the stall's own
                // resume above has taken it from the last command.
                None => return,
            },
        };
        self.unsent_anchor = Some((sent, anchor));
        // The command was due one period after its tick.
        let went = self
            .lookahead
            .state_at(&anchor, &self.trajectory_joints, gap_s - self.dt);
        self.resume_from(&went);
    }

    /// The trajectory joints' command (and the monitor's history) taken from `went`.
    fn resume_from(&mut self, went: &MotionState) {
        let mut state = *self.governor.state();
        for &j in &self.trajectory_joints {
            state.position[j] = went.position[j];
            state.velocity[j] = went.velocity[j];
            state.acceleration[j] = went.acceleration[j];
        }
        self.governor.restore(state);
        self.monitor.resume_at(&state, &self.trajectory_joints);
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
    /// it (or to a stop), its command judged by the independent monitor before it is taken.
    /// A command the monitor refuses is never commanded: the governor brakes instead from the
    /// last command that kept the limits, and the supervisor latches the stop. Returns the
    /// governor's report and whether the monitor refused a command.
    fn govern(
        &mut self,
        at: MonoTime,
        measured: &JointVector,
        t: &mut Transitions,
        recycle: &mut impl FnMut(Box<JointChunk>),
    ) -> (GovernorReport, bool) {
        let target = self.target(at, t, recycle);
        let before = *self.governor.state();
        let mut gov = match &target {
            Some(p) => self.governor.step(Target::Track(p), measured),
            None => self.governor.step(Target::Stop, measured),
        };
        if let Some(offset) = self.governor_fault.take() {
            self.governor.corrupt(offset);
        }
        let refused = self.monitor.judge(&self.governor.state().position);
        // What is commanded, judged once: the governor's command, or the brake that replaces
        // a refused one.
        let mut broken = refused;
        if refused > 0 {
            self.monitor.violations += u64::from(refused);
            self.governor.restore(before);
            gov = self.governor.step(Target::Stop, measured);
            broken = self.monitor.judge(&self.governor.state().position);
        }
        self.count_governor(&gov);
        self.at_rest = gov.at_rest;
        if let Verdict::Hold(reason) = self.safety.judge_command(gov.limit_brake, refused) {
            self.hold(reason, at, t, recycle);
        }
        self.monitor.record(&self.governor.state().position, broken);
        (gov, refused > 0)
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

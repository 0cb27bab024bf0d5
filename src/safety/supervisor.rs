//! The safety state machine in one place: the latched e-stop and its reset, the stop request,
//! the stale-input and overrun watchdogs, which chunks may run, and the checks on each target
//! before it reaches the governor. The controller asks it at fixed points of every tick and
//! gets small `Copy` answers; nothing here allocates.

use super::state::{HoldReason, Mode, SafetyEvent, Waiting};
use crate::joints::{JointMeasurement, JointVector, MotionState};
use crate::robot::{RobotLimits, Workspace};
use crate::time::MonoTime;

/// What the supervisor reads each tick.
#[derive(Clone, Copy, Debug)]
pub struct SafetyInputs<'a> {
    pub now: MonoTime,
    pub measured: &'a JointMeasurement,
    /// Capture time of each camera's latest frame (`MonoTime::ZERO`: none yet).
    pub camera_stamps: &'a [MonoTime],
    /// The e-stop input is pressed now.
    pub estop: bool,
    /// Another daemon thread died or stalled (the supervisor thread saw it): latched as an
    /// e-stop that no reset lifts.
    pub thread_fault: bool,
    /// Count of e-stop presses so far: a press and release between two ticks still latches.
    pub estop_presses: u64,
    /// Count of reset requests so far; a change is one request.
    pub resets: u64,
    /// Consecutive control ticks that overran their deadline.
    pub overrun_streak: u32,
    pub stop_requested: bool,
}

#[cfg(test)]
impl<'a> SafetyInputs<'a> {
    /// Fresh inputs and nothing pressed, requested or overrun: the tests' baseline, changed
    /// field by field with struct-update syntax.
    pub(crate) fn quiet(now: MonoTime, measured: &'a JointMeasurement) -> SafetyInputs<'a> {
        SafetyInputs {
            now,
            measured,
            camera_stamps: &[],
            estop: false,
            thread_fault: false,
            estop_presses: 0,
            resets: 0,
            overrun_streak: 0,
            stop_requested: false,
        }
    }
}

#[derive(Clone, Copy, Debug)]
pub(crate) struct SupervisorSettings {
    pub(crate) joint_state_timeout_s: f64,
    pub(crate) camera_timeout_s: f64,
    pub(crate) overrun_streak: u32,
}

/// The verdict on a target: run it, or hold (the e-stop is decided on the inputs, before).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    Ok,
    Hold(HoldReason),
}

/// Why a chunk that reached the control thread is not executed.
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
    pub(crate) fn name(self) -> &'static str {
        match self {
            LateRejection::Stale => "stale",
            LateRejection::OutOfOrder => "out_of_order",
            LateRejection::NotFresh => "not_fresh",
            LateRejection::NotRunnable => "not_runnable",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Transition {
    pub(crate) at: MonoTime,
    pub(crate) from: Mode,
    pub to: Mode,
}

impl Transition {
    /// An e-stop reset was granted (what lifts a fault latch).
    pub(crate) fn is_reset(&self) -> bool {
        self.from == Mode::EStopped && self.to == Mode::Holding(HoldReason::AfterReset)
    }
}

/// Mode changes of one tick (at most two are kept: the first and the last).
pub(crate) type Transitions = [Option<Transition>; 2];

/// What the inputs decided this tick.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Gate {
    /// The first watchdog that fires (stale joint state or camera), if any.
    pub(crate) stale: Option<HoldReason>,
    /// The executing chunk must be dropped (e-stop, stop request, hold).
    pub(crate) drop_chunk: bool,
    /// A reset was granted: restart the command at rest at this measured position.
    pub(crate) reset_at: Option<JointVector>,
    /// A reset was refused (still moving, or outside the limits).
    pub(crate) reset_refused: bool,
}

/// Starting is refused when the arm stands outside its limits.
#[derive(Debug, thiserror::Error)]
#[error("measured position of joint `{joint}` is {position:.4}, outside its limits [{lower:.4}, {upper:.4}]: refusing to start")]
pub struct StartRefused {
    pub(crate) joint: String,
    pub(crate) position: f64,
    pub(crate) lower: f64,
    pub(crate) upper: f64,
}

pub(crate) fn check_start(
    limits: &RobotLimits,
    position: &JointVector,
) -> Result<(), StartRefused> {
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

pub(crate) struct Supervisor {
    settings: SupervisorSettings,
    limits: RobotLimits,
    workspace: Option<Workspace>,
    mode: Mode,
    /// Chunks must come from observations after this time (hold start, reset, start-up).
    fresh_after: MonoTime,
    seen_resets: u64,
    seen_presses: u64,
    events: [u64; SafetyEvent::COUNT],
    /// The independent monitor saw a limit broken: no chunk runs again in this process.
    violation_latched: bool,
    /// A thread fault was seen: e-stopped for good.
    fault_latched: bool,
}

impl Supervisor {
    /// Starts in `Starting` at the start-gate measurement, refused outside the limits.
    pub(crate) fn new(
        settings: SupervisorSettings,
        limits: RobotLimits,
        workspace: Option<Workspace>,
        start: &JointMeasurement,
    ) -> Result<Supervisor, StartRefused> {
        check_start(&limits, &start.position)?;
        Ok(Supervisor {
            settings,
            limits,
            workspace,
            mode: Mode::Starting,
            // Any observation from the start-gate measurement on is fresh.
            fresh_after: start
                .stamp
                .saturating_sub(std::time::Duration::from_nanos(1)),
            seen_resets: 0,
            seen_presses: 0,
            events: [0; SafetyEvent::COUNT],
            violation_latched: false,
            fault_latched: false,
        })
    }

    pub(crate) fn mode(&self) -> Mode {
        self.mode
    }

    /// New limits (a reload; the arm at rest).
    pub(crate) fn set_limits(&mut self, limits: RobotLimits) {
        self.limits = limits;
    }

    pub(crate) fn event_counts(&self) -> &[u64; SafetyEvent::COUNT] {
        &self.events
    }

    pub(crate) fn count(&mut self, e: SafetyEvent) {
        self.events[e as usize] += 1;
    }

    fn set_mode(&mut self, to: Mode, now: MonoTime, t: &mut Transitions) {
        if to == self.mode {
            return;
        }
        let tr = Transition {
            at: now,
            from: self.mode,
            to,
        };
        match t {
            [slot @ None, _] | [Some(_), slot @ None] => *slot = Some(tr),
            [_, last] => *last = Some(tr),
        }
        self.mode = to;
    }

    /// Enters a hold; returns whether it is new (the caller then drops the running chunk,
    /// which is never replayed). Only chunks from later observations are taken afterwards.
    pub(crate) fn hold(&mut self, reason: HoldReason, now: MonoTime, t: &mut Transitions) -> bool {
        // A latched violation is left only for the stop (or an e-stop), never for another hold.
        if self.mode == Mode::Holding(reason)
            || (self.violation_latched && reason != HoldReason::LimitViolation)
        {
            return false;
        }
        if reason == HoldReason::LimitViolation {
            if self.violation_latched {
                return false;
            }
            self.violation_latched = true;
        }
        if let Some(e) = SafetyEvent::for_hold(reason) {
            self.count(e);
        }
        self.fresh_after = now;
        self.set_mode(Mode::Holding(reason), now, t);
        true
    }

    /// The first watchdog that fires on stale inputs (capture stamps older than their
    /// timeouts), if any.
    pub(crate) fn stale_input(&self, i: &SafetyInputs) -> Option<HoldReason> {
        if i.now.seconds_since(i.measured.stamp) > self.settings.joint_state_timeout_s {
            return Some(HoldReason::StaleJointState);
        }
        i.camera_stamps
            .iter()
            .position(|s| i.now.seconds_since(*s) > self.settings.camera_timeout_s)
            .map(|k| HoldReason::StaleCamera(k.min(255) as u8))
    }

    /// The operator's inputs and the watchdogs, first in every tick: the latched e-stop, a
    /// reset (granted only at rest and inside the limits), the stop request, stale inputs and
    /// overrun streaks.
    pub(crate) fn observe(
        &mut self,
        i: &SafetyInputs,
        commanded: &MotionState,
        t: &mut Transitions,
    ) -> Gate {
        let now = i.now;
        let mut gate = Gate::default();
        self.fault_latched |= i.thread_fault;
        let pressed = i.estop || self.fault_latched || i.estop_presses != self.seen_presses;
        self.seen_presses = i.estop_presses;
        if pressed && self.mode != Mode::EStopped {
            self.count(SafetyEvent::EStop);
            gate.drop_chunk = true;
            self.set_mode(Mode::EStopped, now, t);
        }
        if i.resets != self.seen_resets {
            self.seen_resets = i.resets;
            if self.mode == Mode::EStopped && !i.estop {
                // Not yet at rest, or outside the limits: the operator resets again later.
                if self.violation_latched
                    || self.fault_latched
                    || commanded.velocity.iter().any(|v| *v != 0.0)
                    || check_start(&self.limits, &i.measured.position).is_err()
                {
                    gate.reset_refused = true;
                } else {
                    self.count(SafetyEvent::Reset);
                    // Motion restarts from where the arm really is (it may have been moved).
                    gate.reset_at = Some(i.measured.position);
                    self.fresh_after = now;
                    self.set_mode(Mode::Holding(HoldReason::AfterReset), now, t);
                }
            }
        }
        if i.stop_requested && !matches!(self.mode, Mode::Stopping | Mode::EStopped) {
            gate.drop_chunk = true;
            self.set_mode(Mode::Stopping, now, t);
        }
        gate.stale = self.stale_input(i);
        if self.mode == Mode::Running {
            let watchdog = gate
                .stale
                .or((i.overrun_streak >= self.settings.overrun_streak)
                    .then_some(HoldReason::Overruns));
            if let Some(reason) = watchdog {
                gate.drop_chunk |= self.hold(reason, now, t);
            }
        }
        gate
    }

    /// Whether a chunk observed at `obs_stamp` may be executed now.
    pub(crate) fn admit(&self, obs_stamp: MonoTime, gate: &Gate) -> Result<(), LateRejection> {
        let active = matches!(self.mode, Mode::Running | Mode::Starting | Mode::Holding(_));
        if !active || gate.stale.is_some() || self.violation_latched {
            Err(LateRejection::NotRunnable)
        } else if obs_stamp <= self.fresh_after {
            Err(LateRejection::NotFresh)
        } else {
            Ok(())
        }
    }

    /// A chunk was accepted: the arm runs.
    pub(crate) fn run(&mut self, now: MonoTime, t: &mut Transitions) {
        self.set_mode(Mode::Running, now, t);
    }

    /// Whether the monitor's verdict latched the arm (the daemon then stops).
    #[cfg(test)]
    pub(crate) fn violation_latched(&self) -> bool {
        self.violation_latched
    }

    /// The last check before the governor: there must be a target (the running chunk has not
    /// run out), finite, keeping the tool point inside the workspace.
    pub(crate) fn check(&self, target: Option<&JointVector>) -> Verdict {
        let Some(target) = target else {
            return Verdict::Hold(HoldReason::ChunkStarved);
        };
        if !target.all_finite() {
            // Defence in depth: chunks are checked whole on arrival.
            Verdict::Hold(HoldReason::NonFiniteTarget)
        } else if self
            .workspace
            .as_ref()
            .is_some_and(|w| !w.contains(target.as_slice()))
        {
            Verdict::Hold(HoldReason::Workspace)
        } else {
            Verdict::Ok
        }
    }

    /// What the governor and the independent monitor said of this period's command: a
    /// coordinated brake before a position limit holds the arm; a command the monitor found
    /// outside the limits latches a stop (the governor that made it cannot be trusted).
    pub(crate) fn judge_command(&self, limit_brake: bool, violations: u32) -> Verdict {
        if violations > 0 {
            Verdict::Hold(HoldReason::LimitViolation)
        } else if limit_brake {
            Verdict::Hold(HoldReason::PositionLimit)
        } else {
            Verdict::Ok
        }
    }

    /// What the arm waits for, for the status line and diagnostics.
    pub(crate) fn waiting(&self, stale: Option<HoldReason>) -> Waiting {
        match (self.mode, stale) {
            (Mode::EStopped, _) => Waiting::Reset,
            (Mode::Starting | Mode::Holding(_), Some(HoldReason::StaleCamera(k))) => {
                Waiting::Camera(k)
            }
            (Mode::Starting | Mode::Holding(_), Some(_)) => Waiting::JointState,
            (Mode::Starting | Mode::Holding(_), None) => Waiting::Chunk,
            _ => Waiting::Nothing,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::robot::limits::one_test_joint;

    fn limits() -> RobotLimits {
        one_test_joint(-1.0, 1.0)
    }

    struct Rig {
        s: Supervisor,
        m: JointMeasurement,
        t0: MonoTime,
    }

    impl Rig {
        fn new() -> Rig {
            let t0 = MonoTime::from_nanos(1_000_000_000);
            let m = JointMeasurement {
                stamp: t0,
                position: JointVector::zeros(1),
            };
            let settings = SupervisorSettings {
                joint_state_timeout_s: 0.1,
                camera_timeout_s: 0.5,
                overrun_streak: 3,
            };
            Rig {
                s: Supervisor::new(settings, limits(), None, &m).unwrap(),
                m,
                t0,
            }
        }

        fn observe(&mut self, at_s: f64, presses: u64, estop: bool, resets: u64) -> Gate {
            self.observe_fault(at_s, presses, estop, resets, false)
        }

        fn observe_fault(
            &mut self,
            at_s: f64,
            presses: u64,
            estop: bool,
            resets: u64,
            thread_fault: bool,
        ) -> Gate {
            let now = self.t0.offset_seconds(at_s);
            self.m.stamp = now;
            let i = SafetyInputs {
                estop,
                thread_fault,
                estop_presses: presses,
                resets,
                ..SafetyInputs::quiet(now, &self.m)
            };
            let mut t = [None, None];
            self.s
                .observe(&i, &MotionState::at_rest(JointVector::zeros(1)), &mut t)
        }
    }

    #[test]
    fn when_estop_pressed_and_released_between_ticks_expect_latched() {
        let mut r = Rig::new();
        r.observe(0.01, 0, false, 0);
        assert_eq!(r.s.mode(), Mode::Starting);
        // The input is released again, but a press was counted.
        let g = r.observe(0.02, 1, false, 0);
        assert!(g.drop_chunk);
        assert_eq!(r.s.mode(), Mode::EStopped);
        r.observe(0.03, 1, false, 0);
        assert_eq!(r.s.mode(), Mode::EStopped, "stays latched");
        let g = r.observe(0.04, 1, false, 1);
        assert_eq!(g.reset_at, Some(JointVector::zeros(1)));
        assert_eq!(r.s.mode(), Mode::Holding(HoldReason::AfterReset));
    }

    #[test]
    fn when_a_thread_fault_is_seen_once_expect_estopped_for_good() {
        let mut r = Rig::new();
        let g = r.observe_fault(0.01, 0, false, 0, true);
        assert!(g.drop_chunk);
        assert_eq!(r.s.mode(), Mode::EStopped);
        // Even were the input to clear, no reset lifts it.
        let g = r.observe(0.02, 0, false, 1);
        assert!(g.reset_refused && g.reset_at.is_none());
        assert_eq!(r.s.mode(), Mode::EStopped);
    }

    #[test]
    fn when_reset_while_estop_pressed_expect_still_latched() {
        let mut r = Rig::new();
        r.observe(0.01, 1, true, 0);
        let g = r.observe(0.02, 1, true, 1);
        assert_eq!((g.reset_at, r.s.mode()), (None, Mode::EStopped));
    }

    #[test]
    fn when_chunk_predates_start_or_hold_expect_not_fresh() {
        let mut r = Rig::new();
        let g = r.observe(0.01, 0, false, 0);
        assert_eq!(
            r.s.admit(r.t0.offset_seconds(-0.01), &g),
            Err(LateRejection::NotFresh)
        );
        assert_eq!(r.s.admit(r.t0.offset_seconds(0.005), &g), Ok(()));
        let stale = Gate {
            stale: Some(HoldReason::StaleJointState),
            ..Gate::default()
        };
        assert_eq!(
            r.s.admit(r.t0.offset_seconds(0.005), &stale),
            Err(LateRejection::NotRunnable)
        );
    }

    #[test]
    fn when_target_not_finite_expect_hold_verdict() {
        let r = Rig::new();
        assert_eq!(
            r.s.check(Some(&JointVector::from_slice(&[0.3]))),
            Verdict::Ok
        );
        assert_eq!(
            r.s.check(Some(&JointVector::from_slice(&[f64::NAN]))),
            Verdict::Hold(HoldReason::NonFiniteTarget)
        );
        assert_eq!(r.s.check(None), Verdict::Hold(HoldReason::ChunkStarved));
    }

    #[test]
    fn when_monitor_saw_a_violation_expect_latched_through_holds_estop_and_reset() {
        let mut r = Rig::new();
        let now = r.t0.offset_seconds(0.01);
        let mut t = [None, None];
        assert_eq!(r.s.judge_command(false, 0), Verdict::Ok);
        assert_eq!(
            r.s.judge_command(true, 0),
            Verdict::Hold(HoldReason::PositionLimit)
        );
        let v = r.s.judge_command(true, 2);
        assert_eq!(v, Verdict::Hold(HoldReason::LimitViolation));
        assert!(r.s.hold(HoldReason::LimitViolation, now, &mut t));
        // No other hold replaces it, no chunk is admitted.
        assert!(!r.s.hold(HoldReason::ChunkStarved, now, &mut t));
        assert_eq!(r.s.mode(), Mode::Holding(HoldReason::LimitViolation));
        let g = r.observe(0.02, 0, false, 0);
        assert_eq!(
            r.s.admit(r.t0.offset_seconds(0.015), &g),
            Err(LateRejection::NotRunnable)
        );
        // An e-stop and its reset do not lift it either.
        r.observe(0.03, 1, false, 0);
        assert_eq!(r.s.mode(), Mode::EStopped);
        let g = r.observe(0.04, 1, false, 1);
        assert!(g.reset_refused && g.reset_at.is_none());
        assert!(r.s.violation_latched());
    }
}

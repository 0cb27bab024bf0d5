//! The supervisor's decisions as a pure step: what the daemon observed at one poll goes in,
//! what it must do comes out. No clock, no thread, no shared state: `supervise` (in
//! `daemon/mod.rs`) reads the atomics and the time, calls `Lifecycle::poll`, and carries out
//! the `Step`; tests drive it in synthetic time, at each decision's boundary.
//!
//! The decisions: a control loop that stops ticking (exit at once, nothing else can command
//! the arm), another thread that dies or stalls (latch the e-stop, stop), the independent
//! monitor's refusal (stop), a suspension of the whole process (liveness measured afresh),
//! the start timeout, `--duration` and stop signals, the fault latch lifted by a reset,
//! reloaded limits in force only once the control thread applied them, systemd's watchdog fed
//! only while the loop ticks, and the exit reason. The stop ladder's deadline is `StopLadder`.

use crate::policy::AcceleratorFault;
use crate::robot::RobotLimits;
use crate::safety::reconfigure::Reconfigure;
use crate::safety::Waiting;
use crate::time::MonoTime;

use super::exit::ExitReason;
use super::supervise::{Health, Role};
use super::worker::ACCELERATOR_FAILURES;

/// A control loop that has not ticked for this long (s) is stuck.
pub(crate) const CONTROL_STALL_S: f64 = 1.0;
/// The I/O threads poll every few milliseconds: this much silence (s) means one is stuck.
pub(crate) const IO_STALL_S: f64 = 2.0;
/// While the arm has not started: first warning after this long (s), then again every interval.
pub(crate) const START_WARN_AFTER_S: f64 = 2.0;
pub(crate) const START_WARN_EVERY_S: f64 = 10.0;
/// A poll this late (s) means the whole process was suspended (SIGSTOP, a paused VM): liveness
/// is measured afresh from the resume, not blamed on one thread.
pub(crate) const SUSPENDED_S: f64 = 0.5;

/// What the lifecycle is configured with.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Settings {
    /// `control.start_timeout_s`.
    pub(crate) start_timeout_s: f64,
    /// `--duration`.
    pub(crate) duration_s: Option<f64>,
    /// `control.status_interval_s` (a reload may change it: `Lifecycle::set_status_interval`).
    pub(crate) status_interval_s: f64,
    /// Half of systemd's `WATCHDOG_USEC`, when systemd watches.
    pub(crate) watchdog_period_s: Option<f64>,
}

/// A supervised thread as last seen.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Beat {
    /// Running; its last heartbeat.
    Alive(MonoTime),
    Returned,
    Panicked(String),
}

/// What the supervisor read at one poll.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Observed {
    pub(crate) now: MonoTime,
    /// Control ticks so far.
    pub(crate) ticks: u64,
    pub(crate) control_finished: bool,
    pub(crate) inference: Beat,
    /// The thread that talks to the robot: ROS or the simulator.
    pub(crate) io_role: Role,
    pub(crate) io: Beat,
    /// The independent monitor refused a command.
    pub(crate) limit_violation: bool,
    /// The fault latch (on disk) is set.
    pub(crate) fault_latched: bool,
    /// Resets the control thread took so far.
    pub(crate) resets: u64,
    /// A chunk was accepted: the arm has started.
    pub(crate) started: bool,
    /// What the arm waits for, while not started.
    pub(crate) waiting: Waiting,
    /// SIGINT or SIGTERM arrived.
    pub(crate) stop_signal: bool,
    /// What the control thread did with reloaded limits, when it reported it.
    pub(crate) reconfigured: Option<Reconfigure>,
    /// The policy's accelerator gave out.
    pub(crate) accelerator: Option<AcceleratorFault>,
}

/// A fault found at this poll: reported once, it decides the exit.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Fault {
    /// No control tick for this long (s).
    ControlStalled(f64),
    /// Another thread died or stalled.
    Thread(Role, Health),
    /// The independent monitor refused a command outside the limits.
    LimitViolation,
    /// The policy's accelerator was lost, or failed inference after inference.
    Accelerator(AcceleratorFault),
}

impl std::fmt::Display for Fault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Fault::ControlStalled(s) => {
                write!(
                    f,
                    "control thread stopped ticking ({s:.1} s without a tick)"
                )
            }
            Fault::Thread(role, h) => write!(f, "{} thread {h}", role.name()),
            Fault::LimitViolation => {
                f.write_str("the independent monitor refused a command outside the limits")
            }
            Fault::Accelerator(AcceleratorFault::Lost) => {
                f.write_str("the policy's accelerator answers no more")
            }
            Fault::Accelerator(AcceleratorFault::Failed) => write!(
                f,
                "the policy's accelerator failed {ACCELERATOR_FAILURES} inferences in a row"
            ),
        }
    }
}

/// Why a stop was asked of the control thread.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum StopCause {
    /// `--duration` elapsed, or SIGINT/SIGTERM.
    Requested,
    StartTimeout,
    /// `--duration` elapsed while the arm waited for its first chunk (exit 8 as for the start
    /// timeout).
    DurationBeforeStart,
    ThreadFault,
    LimitViolation,
    /// The policy's accelerator gave out (exit 9).
    AcceleratorFault,
}

/// What the supervisor must do after one poll.
#[derive(Clone, Debug, Default)]
pub(crate) struct Step {
    /// The process was suspended this long (s) before this poll.
    pub(crate) suspended_s: Option<f64>,
    /// A fault found now (log it, keep it for the summary).
    pub(crate) fault: Option<Fault>,
    /// Ask the control thread to decelerate to rest.
    pub(crate) stop: Option<StopCause>,
    /// The control loop is stuck: leave now, no controlled stop is possible.
    pub(crate) abandon: bool,
    /// The control thread ended: supervision is over.
    pub(crate) finished: bool,
    /// Not started after this long (s): warn.
    pub(crate) start_warning: Option<f64>,
    /// A reset lifted the fault latch.
    pub(crate) lift_fault_latch: bool,
    /// Reloaded limits the control thread applied: they are now the running ones.
    pub(crate) limits_in_force: Option<RobotLimits>,
    pub(crate) feed_watchdog: bool,
    pub(crate) show_status: bool,
}

impl Step {
    /// Latch the e-stop: a thread fault (no reset lifts it).
    pub(crate) fn latch_estop(&self) -> bool {
        matches!(self.fault, Some(Fault::Thread(..)))
    }
}

/// How the control thread ended, for the exit reason.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ControlEnd {
    /// It returned; whether stopping reached rest within `control.stop_timeout_s`.
    Returned {
        reached_rest: bool,
    },
    Panicked,
    /// Left behind after it stopped ticking.
    Abandoned,
}

/// The supervisor's state between polls.
#[derive(Debug)]
pub(crate) struct Lifecycle {
    settings: Settings,
    run_start: MonoTime,
    last_poll: MonoTime,
    last_ticks: u64,
    last_tick_change: MonoTime,
    /// Heartbeats older than this (the resume from a suspension) do not count.
    liveness_from: MonoTime,
    next_start_warning: f64,
    last_status: MonoTime,
    last_watchdog: MonoTime,
    stopping: bool,
    exit: ExitReason,
    /// What the arm waited for when the start timed out (once stopping, it waits for nothing).
    start_waiting: Option<Waiting>,
    /// Reloaded limits handed to the control thread, not yet applied.
    pending_limits: Option<RobotLimits>,
}

impl Lifecycle {
    pub(crate) fn new(settings: Settings, now: MonoTime) -> Lifecycle {
        Lifecycle {
            settings,
            run_start: now,
            last_poll: now,
            last_ticks: 0,
            last_tick_change: now,
            liveness_from: now,
            next_start_warning: START_WARN_AFTER_S,
            last_status: now,
            last_watchdog: now,
            stopping: false,
            exit: ExitReason::Clean,
            start_waiting: None,
            pending_limits: None,
        }
    }

    /// Seconds since supervision began.
    pub(crate) fn elapsed_s(&self, now: MonoTime) -> f64 {
        now.seconds_since(self.run_start)
    }

    pub(crate) fn set_status_interval(&mut self, s: f64) {
        self.settings.status_interval_s = s;
    }

    /// Reloaded limits were handed to the control thread.
    pub(crate) fn limits_sent(&mut self, limits: RobotLimits) {
        self.pending_limits = Some(limits);
    }

    #[cfg(test)]
    pub(crate) fn stopping(&self) -> bool {
        self.stopping
    }

    /// What the arm waited for when the start timed out.
    pub(crate) fn start_waiting(&self) -> Option<Waiting> {
        self.start_waiting
    }

    /// The decisions for one poll.
    pub(crate) fn poll(&mut self, o: &Observed) -> Step {
        let now = o.now;
        let mut step = Step::default();
        let gap = now.seconds_since(self.last_poll);
        self.last_poll = now;
        if gap > SUSPENDED_S {
            step.suspended_s = Some(gap);
            self.last_tick_change = now;
            self.liveness_from = now;
        }
        if let Some(r) = o.reconfigured {
            // Refused or abandoned: the running limits stay.
            let pending = self.pending_limits.take();
            if r == Reconfigure::Applied {
                step.limits_in_force = pending;
            }
        }
        if o.limit_violation
            && !matches!(
                self.exit,
                ExitReason::LimitViolation | ExitReason::ThreadFault
            )
        {
            step.fault = Some(Fault::LimitViolation);
            self.stop(&mut step, StopCause::LimitViolation);
            self.exit = ExitReason::LimitViolation;
        }
        step.lift_fault_latch = o.fault_latched && o.resets > 0;

        // Liveness of the control loop first: nothing else matters once it is stuck.
        if o.ticks != self.last_ticks {
            self.last_ticks = o.ticks;
            self.last_tick_change = now;
        } else if now.seconds_since(self.last_tick_change) > CONTROL_STALL_S {
            step.fault = Some(Fault::ControlStalled(
                now.seconds_since(self.last_tick_change),
            ));
            step.abandon = true;
            self.exit = ExitReason::ControlFault;
            return step;
        }
        if o.control_finished {
            step.finished = true;
            return step;
        }
        if let (Some(a), ExitReason::Clean) = (o.accelerator, self.exit) {
            step.fault = Some(Fault::Accelerator(a));
            self.stop(&mut step, StopCause::AcceleratorFault);
            self.exit = ExitReason::RuntimeFailure;
        }
        if self.exit != ExitReason::ThreadFault {
            if let Some(fault) = self.thread_fault(o) {
                step.fault = Some(fault);
                self.stop(&mut step, StopCause::ThreadFault);
                self.exit = ExitReason::ThreadFault;
            }
        }

        let t = self.elapsed_s(now);
        if !o.started && self.exit == ExitReason::Clean {
            if t >= self.settings.start_timeout_s {
                self.stop(&mut step, StopCause::StartTimeout);
                self.exit = ExitReason::StartTimeout;
                self.start_waiting = Some(o.waiting);
            } else if t >= self.next_start_warning {
                step.start_warning = Some(t);
                self.next_start_warning = t + START_WARN_EVERY_S;
            }
        }
        let over = self.settings.duration_s.is_some_and(|d| t >= d);
        if over && !o.started && o.waiting == Waiting::Chunk && self.exit == ExitReason::Clean {
            // Inputs fresh, but the policy never gave a chunk (a remote server down): the run
            // did not do its job, whichever limit ended it. Waiting on the robot's inputs (or
            // a reset) is the robot's state, which the run reports and exits cleanly.
            self.stop(&mut step, StopCause::DurationBeforeStart);
            self.exit = ExitReason::StartTimeout;
            self.start_waiting = Some(o.waiting);
        } else if over || o.stop_signal {
            self.stop(&mut step, StopCause::Requested);
        }

        if now.seconds_since(self.last_status) >= self.settings.status_interval_s {
            self.last_status = now;
            step.show_status = true;
        }
        // Only a control loop that still ticks, in a daemon without a thread fault, keeps
        // systemd's watchdog fed.
        if let Some(period) = self.settings.watchdog_period_s {
            if self.exit != ExitReason::ThreadFault
                && now.seconds_since(self.last_watchdog) >= period
            {
                step.feed_watchdog = now.seconds_since(self.last_tick_change) < period;
                self.last_watchdog = now;
            }
        }
        step
    }

    /// The first stop asked wins; later causes do not ask again.
    fn stop(&mut self, step: &mut Step, cause: StopCause) {
        if !self.stopping {
            self.stopping = true;
            step.stop = Some(cause);
        }
    }

    /// The inference or I/O thread dead, or the I/O thread silent (the inference thread may
    /// block on a long inference: it is judged by its death only).
    fn thread_fault(&self, o: &Observed) -> Option<Fault> {
        let judge = |role: Role, beat: &Beat, stall_after_s: Option<f64>| -> Option<Fault> {
            let health = match beat {
                // Once stopping, the inference worker ends with the control loop.
                Beat::Returned if self.stopping => return None,
                Beat::Returned => Health::Returned,
                Beat::Panicked(m) => Health::Panicked(m.clone()),
                Beat::Alive(last) => {
                    let limit = stall_after_s?;
                    let since = if *last > self.liveness_from {
                        *last
                    } else {
                        self.liveness_from
                    };
                    if o.now.seconds_since(since) <= limit {
                        return None;
                    }
                    Health::Stalled(o.now.seconds_since(*last))
                }
            };
            Some(Fault::Thread(role, health))
        };
        judge(Role::Inference, &o.inference, None)
            .or_else(|| judge(o.io_role, &o.io, Some(IO_STALL_S)))
    }

    /// The exit reason, once the control thread ended as `end`.
    pub(crate) fn finish(&mut self, end: ControlEnd) -> ExitReason {
        match end {
            ControlEnd::Abandoned | ControlEnd::Panicked => self.exit = ExitReason::ControlFault,
            ControlEnd::Returned { reached_rest } => {
                if self.exit == ExitReason::Clean && !reached_rest {
                    self.exit = ExitReason::StopTimeout;
                }
            }
        }
        self.exit
    }
}

/// The stop ladder's deadline in the control thread: from the tick that first sees the stop,
/// the arm has `control.stop_timeout_s` to come to rest.
#[derive(Clone, Copy, Debug)]
pub(crate) struct StopLadder {
    timeout_s: f64,
    deadline: Option<MonoTime>,
}

/// Where the stop ladder stands after a tick.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Rung {
    /// Running, or stopping within the deadline.
    Going,
    /// Stopping reached rest.
    AtRest,
    /// Stopping did not reach rest within the stop timeout.
    TimedOut,
}

impl StopLadder {
    pub(crate) fn new(timeout_s: f64) -> StopLadder {
        StopLadder {
            timeout_s,
            deadline: None,
        }
    }

    /// The tick at `now`: whether a stop is asked, whether the arm is at rest after it.
    pub(crate) fn tick(&mut self, now: MonoTime, stopping: bool, at_rest: bool) -> Rung {
        if stopping && self.deadline.is_none() {
            self.deadline = Some(now.offset_seconds(self.timeout_s));
        }
        if at_rest {
            Rung::AtRest
        } else if self.deadline.is_some_and(|d| now > d) {
            Rung::TimedOut
        } else {
            Rung::Going
        }
    }
}

#[cfg(test)]
#[path = "lifecycle_tests.rs"]
mod tests;

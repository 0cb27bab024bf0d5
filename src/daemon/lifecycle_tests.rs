//! The supervisor's decisions in synthetic time, each at its boundary: one poll before it
//! decides nothing, one poll after it decides. Milliseconds of test time, no threads.

use proptest::prelude::*;

use super::*;
use crate::robot::limits::one_test_joint;
use crate::safety::reconfigure::OutsideRange;

/// A millisecond, and a nanosecond: the steps either side of a boundary.
const MS: f64 = 1e-3;
const NS: f64 = 1e-9;
/// The daemon polls every 20 ms.
const POLL: f64 = 0.02;

fn at(s: f64) -> MonoTime {
    // Time starts at 1 s so that no instant is the `MonoTime::ZERO` "never".
    MonoTime::from_nanos(1_000_000_000 + (s * 1e9).round() as u64)
}

fn settings() -> Settings {
    Settings {
        start_timeout_s: 5.0,
        duration_s: None,
        status_interval_s: 1.0,
        watchdog_period_s: None,
    }
}

/// A lifecycle and the world it watches: a control loop that ticks on every poll, live
/// threads, a started arm, no signal.
struct World {
    lc: Lifecycle,
    o: Observed,
}

impl World {
    fn new(settings: Settings) -> World {
        World {
            lc: Lifecycle::new(settings, at(0.0)),
            o: Observed {
                now: at(0.0),
                ticks: 0,
                control_finished: false,
                inference: Beat::Alive(at(0.0)),
                io_role: Role::Ros,
                io: Beat::Alive(at(0.0)),
                limit_violation: false,
                fault_latched: false,
                resets: 0,
                started: true,
                waiting: Waiting::Nothing,
                stop_signal: false,
                reconfigured: None,
                accelerator: None,
            },
        }
    }

    /// One poll at `t` with a tick and fresh heartbeats since the last one.
    fn poll(&mut self, t: f64) -> Step {
        self.o.ticks += 1;
        self.o.io = Beat::Alive(at(t));
        self.poll_as_is(t)
    }

    /// One poll at `t`, the world as it was left.
    fn poll_as_is(&mut self, t: f64) -> Step {
        self.o.now = at(t);
        let step = self.lc.poll(&self.o);
        self.o.reconfigured = None;
        step
    }

    /// Polls every 20 ms from `from` to `to` (exclusive), each with a tick; none may decide
    /// anything `quiet` rejects.
    fn run(&mut self, from: f64, to: f64, quiet: impl Fn(&Step) -> bool) {
        self.run_with(from, to, true, true, quiet)
    }

    /// Polls every 20 ms from `from` to `to` (exclusive), with control ticks and I/O
    /// heartbeats as asked.
    fn run_with(
        &mut self,
        from: f64,
        to: f64,
        tick: bool,
        beat: bool,
        mut ok: impl FnMut(&Step) -> bool,
    ) {
        let mut t = from;
        while t < to - NS {
            self.o.ticks += u64::from(tick);
            if beat {
                self.o.io = Beat::Alive(at(t));
            }
            let s = self.poll_as_is(t);
            assert!(ok(&s), "at {t:.3} s: {s:?}");
            t += POLL;
        }
    }

    /// One poll at `t` with control ticks and I/O heartbeats as asked.
    fn poll_with(&mut self, t: f64, tick: bool, beat: bool) -> Step {
        self.o.ticks += u64::from(tick);
        if beat {
            self.o.io = Beat::Alive(at(t));
        }
        self.poll_as_is(t)
    }
}

fn no_stop(s: &Step) -> bool {
    s.stop.is_none() && s.fault.is_none() && !s.abandon
}

#[test]
fn when_the_arm_never_starts_expect_the_start_timeout_exactly_at_start_timeout_s() {
    let mut w = World::new(settings());
    w.o.started = false;
    w.o.waiting = Waiting::Chunk;
    w.run(0.0, 5.0 - MS, no_stop);
    assert!(no_stop(&w.poll(5.0 - MS)));
    let s = w.poll(5.0);
    assert_eq!(s.stop, Some(StopCause::StartTimeout));
    assert!(!s.latch_estop());
    assert_eq!(w.lc.start_waiting(), Some(Waiting::Chunk));
    // Asked once; the arm then comes to rest and the run ends with exit 8.
    assert_eq!(w.poll(5.02).stop, None);
    assert_eq!(
        w.lc.finish(ControlEnd::Returned { reached_rest: true }),
        ExitReason::StartTimeout
    );
}

#[test]
fn when_the_arm_started_expect_no_start_timeout_ever() {
    let mut w = World::new(settings());
    w.run(0.0, 60.0, no_stop);
    assert_eq!(
        w.lc.finish(ControlEnd::Returned { reached_rest: true }),
        ExitReason::Clean
    );
}

#[test]
fn when_not_started_expect_a_warning_at_2_s_then_every_10_s() {
    let mut w = World::new(settings());
    w.lc.settings.start_timeout_s = 60.0;
    w.o.started = false;
    let mut warnings = Vec::new();
    let mut t = 0.0;
    while t < 30.0 {
        if let Some(at) = w.poll(t).start_warning {
            warnings.push((at * 1e3).round() / 1e3);
        }
        t += 0.5;
    }
    assert_eq!(warnings, vec![2.0, 12.0, 22.0]);
}

#[test]
fn when_control_stops_ticking_expect_abandon_one_poll_after_control_stall_s() {
    let mut w = World::new(settings());
    w.run(0.0, 3.0, no_stop);
    // The last tick was seen at 2.98 s; the heartbeats of the others go on.
    let last = 3.0 - POLL;
    w.run_with(3.0, last + CONTROL_STALL_S, false, true, no_stop);
    let s = w.poll_with(last + CONTROL_STALL_S, false, true);
    assert!(!s.abandon, "{s:?}");
    let s = w.poll_with(last + CONTROL_STALL_S + MS, false, true);
    assert!(s.abandon);
    assert!(matches!(s.fault, Some(Fault::ControlStalled(x)) if x > CONTROL_STALL_S));
    assert_eq!(
        s.fault.map(|f| f.to_string()).as_deref(),
        Some("control thread stopped ticking (1.0 s without a tick)")
    );
    assert_eq!(w.lc.finish(ControlEnd::Abandoned), ExitReason::ControlFault);
}

#[test]
fn when_the_process_is_suspended_expect_liveness_measured_from_the_resume() {
    let mut w = World::new(settings());
    w.run(0.0, 1.0, no_stop);
    // No poll, no tick, no heartbeat for 10 s (SIGSTOP), then the first poll after it.
    let resume = 1.0 - POLL + 10.0;
    let s = w.poll_as_is(resume);
    assert!(matches!(s.suspended_s, Some(g) if (g - 10.0).abs() < 1e-6));
    assert!(no_stop(&s), "{s:?}");
    // The control loop gets its full grace from the resume: silent until it ends...
    w.run_with(
        resume + POLL,
        resume + CONTROL_STALL_S,
        false,
        true,
        no_stop,
    );
    let s = w.poll_with(resume + CONTROL_STALL_S, false, true);
    assert!(no_stop(&s), "{s:?}");
    // ...and is blamed just after.
    assert!(
        w.poll_with(resume + CONTROL_STALL_S + MS, false, true)
            .abandon
    );
}

#[test]
fn when_a_poll_is_late_by_less_than_the_suspension_threshold_expect_no_suspension() {
    let mut w = World::new(settings());
    w.poll(0.0);
    assert_eq!(w.poll(SUSPENDED_S).suspended_s, None);
    assert!(w.poll(2.0 * SUSPENDED_S + MS).suspended_s.is_some());
}

#[test]
fn when_the_io_thread_goes_silent_expect_a_thread_fault_one_poll_after_io_stall_s() {
    let mut w = World::new(settings());
    w.run(0.0, 1.0, no_stop);
    let silent_from = 1.0 - POLL;
    // Control still ticks; the I/O heartbeat stays at `silent_from`.
    w.run_with(1.0, silent_from + IO_STALL_S, true, false, no_stop);
    let s = w.poll_with(silent_from + IO_STALL_S, true, false);
    assert!(no_stop(&s), "{s:?}");
    let s = w.poll_with(silent_from + IO_STALL_S + MS, true, false);
    assert!(matches!(
        s.fault,
        Some(Fault::Thread(Role::Ros, Health::Stalled(_)))
    ));
    assert!(s.latch_estop());
    assert_eq!(s.stop, Some(StopCause::ThreadFault));
    // Reported once.
    assert_eq!(
        w.poll_with(silent_from + IO_STALL_S + 0.02, true, false)
            .fault,
        None
    );
    assert_eq!(
        w.lc.finish(ControlEnd::Returned { reached_rest: true }),
        ExitReason::ThreadFault
    );
}

#[test]
fn when_a_suspension_ends_expect_the_io_thread_given_io_stall_s_from_the_resume() {
    let mut w = World::new(settings());
    w.run(0.0, 1.0, no_stop);
    let resume = 1.0 - POLL + 5.0;
    // The I/O thread's last beat is 5 s old at the resume; the control loop ticks again.
    assert!(no_stop(&w.poll_with(resume, true, false)));
    w.run_with(resume + POLL, resume + IO_STALL_S, true, false, no_stop);
    assert!(no_stop(&w.poll_with(resume + IO_STALL_S, true, false)));
    let s = w.poll_with(resume + IO_STALL_S + MS, true, false);
    match s.fault {
        // The silence reported is the true one, from its last beat.
        Some(Fault::Thread(Role::Ros, Health::Stalled(x))) => assert!(x > 7.0, "{x}"),
        f => panic!("{f:?}"),
    }
}

#[test]
fn when_the_inference_thread_returns_expect_a_fault_unless_stopping() {
    let mut w = World::new(settings());
    w.poll(0.0);
    w.o.inference = Beat::Returned;
    let s = w.poll(0.02);
    assert_eq!(
        s.fault,
        Some(Fault::Thread(Role::Inference, Health::Returned))
    );
    assert_eq!(
        s.fault.map(|f| f.to_string()).as_deref(),
        Some("inference thread returned unexpectedly")
    );

    // Stopping first (a signal): the worker ending with the loop is no fault.
    let mut w = World::new(settings());
    w.o.stop_signal = true;
    assert_eq!(w.poll(0.0).stop, Some(StopCause::Requested));
    w.o.inference = Beat::Returned;
    assert!(w.poll(0.02).fault.is_none());
    // A panic is one even then.
    w.o.inference = Beat::Panicked("boom".into());
    let s = w.poll(0.04);
    assert_eq!(
        s.fault.as_ref().map(|f| f.to_string()).as_deref(),
        Some("inference thread panicked: boom")
    );
    assert!(s.latch_estop());
    // Already stopping: the stop is not asked again.
    assert_eq!(s.stop, None);
}

#[test]
fn when_the_monitor_refuses_a_command_expect_stop_and_exit_10_unless_a_thread_fault_came_first() {
    let mut w = World::new(settings());
    w.poll(0.0);
    w.o.limit_violation = true;
    let s = w.poll(0.02);
    assert_eq!(s.fault, Some(Fault::LimitViolation));
    assert_eq!(s.stop, Some(StopCause::LimitViolation));
    assert!(!s.latch_estop());
    assert_eq!(w.poll(0.04).fault, None, "reported once");
    // A thread fault after it decides the exit (the e-stop latches).
    w.o.inference = Beat::Panicked("x".into());
    assert!(w.poll(0.06).latch_estop());
    assert_eq!(
        w.lc.finish(ControlEnd::Returned { reached_rest: true }),
        ExitReason::ThreadFault
    );

    let mut w = World::new(settings());
    w.o.inference = Beat::Panicked("x".into());
    w.poll(0.0);
    w.o.limit_violation = true;
    assert_eq!(w.poll(0.02).fault, None);
    assert_eq!(
        w.lc.finish(ControlEnd::Returned { reached_rest: true }),
        ExitReason::ThreadFault
    );

    let mut w = World::new(settings());
    w.o.limit_violation = true;
    w.poll(0.0);
    assert_eq!(
        w.lc.finish(ControlEnd::Returned { reached_rest: true }),
        ExitReason::LimitViolation
    );
}

#[test]
fn when_the_duration_elapses_expect_one_stop_exactly_then() {
    let mut w = World::new(Settings {
        duration_s: Some(3.0),
        ..settings()
    });
    w.run(0.0, 3.0 - MS, no_stop);
    assert!(no_stop(&w.poll(3.0 - MS)));
    assert_eq!(w.poll(3.0).stop, Some(StopCause::Requested));
    assert_eq!(w.poll(3.02).stop, None);
    assert!(w.lc.stopping());
}

#[test]
fn when_the_duration_elapses_before_a_first_chunk_expect_exit_8_naming_what_it_waited_for() {
    let mut w = World::new(Settings {
        duration_s: Some(3.0),
        ..settings()
    });
    w.o.started = false;
    w.o.waiting = Waiting::Chunk;
    w.run(0.0, 3.0 - MS, no_stop);
    assert!(no_stop(&w.poll(3.0 - MS)));
    assert_eq!(w.poll(3.0).stop, Some(StopCause::DurationBeforeStart));
    assert_eq!(w.poll(3.02).stop, None);
    assert_eq!(w.lc.start_waiting(), Some(Waiting::Chunk));
    assert_eq!(
        w.lc.finish(ControlEnd::Returned { reached_rest: true }),
        ExitReason::StartTimeout
    );
    // Waiting on the robot's inputs instead (a skewed clock, a silent sensor) when the duration
    // ends: the robot's state, reported, and a clean exit.
    let mut w = World::new(Settings {
        duration_s: Some(3.0),
        ..settings()
    });
    w.o.started = false;
    w.o.waiting = Waiting::JointState;
    assert_eq!(w.poll(3.0).stop, Some(StopCause::Requested));
    assert_eq!(
        w.lc.finish(ControlEnd::Returned { reached_rest: true }),
        ExitReason::Clean
    );
    // A signal before the start is the operator's choice: a clean exit.
    let mut w = World::new(settings());
    w.o.started = false;
    w.o.stop_signal = true;
    assert_eq!(w.poll(1.0).stop, Some(StopCause::Requested));
    assert_eq!(
        w.lc.finish(ControlEnd::Returned { reached_rest: true }),
        ExitReason::Clean
    );
}

#[test]
fn when_stopping_does_not_reach_rest_expect_exit_5_only_for_a_clean_run() {
    let mut w = World::new(settings());
    w.o.stop_signal = true;
    w.poll(0.0);
    assert_eq!(
        w.lc.finish(ControlEnd::Returned {
            reached_rest: false
        }),
        ExitReason::StopTimeout
    );
    assert_eq!(ExitReason::StopTimeout.code(), 5);
    // A fault already decided the exit: not reaching rest does not hide it.
    let mut w = World::new(settings());
    w.o.limit_violation = true;
    w.poll(0.0);
    assert_eq!(
        w.lc.finish(ControlEnd::Returned {
            reached_rest: false
        }),
        ExitReason::LimitViolation
    );
    let mut w = World::new(settings());
    w.poll(0.0);
    assert_eq!(w.lc.finish(ControlEnd::Panicked), ExitReason::ControlFault);
}

#[test]
fn when_a_reset_arrives_while_the_fault_latch_is_set_expect_it_lifted() {
    let mut w = World::new(settings());
    w.o.fault_latched = true;
    assert!(!w.poll(0.0).lift_fault_latch);
    w.o.resets = 1;
    assert!(w.poll(0.02).lift_fault_latch);
    w.o.fault_latched = false;
    assert!(!w.poll(0.04).lift_fault_latch);
}

#[test]
fn when_reloaded_limits_are_refused_or_abandoned_expect_the_running_ones_kept() {
    let tighter = one_test_joint(-0.5, 0.5);
    let mut w = World::new(settings());
    w.poll(0.0);
    // The control thread has not answered yet: nothing changes.
    w.lc.limits_sent(tighter.clone());
    assert!(w.poll(0.02).limits_in_force.is_none());
    w.o.reconfigured = Some(Reconfigure::Refused(OutsideRange {
        joint: 0,
        position: 0.9,
        lower: -0.5,
        upper: 0.5,
    }));
    assert!(w.poll(0.04).limits_in_force.is_none());
    // A later Applied answers no pending reload: nothing to put in force.
    w.o.reconfigured = Some(Reconfigure::Applied);
    assert!(w.poll(0.06).limits_in_force.is_none());

    w.lc.limits_sent(tighter.clone());
    w.o.reconfigured = Some(Reconfigure::Abandoned);
    assert!(w.poll(0.08).limits_in_force.is_none());

    w.lc.limits_sent(tighter.clone());
    w.o.reconfigured = Some(Reconfigure::Applied);
    let applied = w.poll(0.10).limits_in_force.expect("in force once applied");
    assert_eq!(applied.joints[0].upper, 0.5);
}

#[test]
fn when_systemd_watches_expect_the_watchdog_fed_each_period_only_while_control_ticks() {
    let mut w = World::new(Settings {
        watchdog_period_s: Some(0.5),
        ..settings()
    });
    let mut fed = Vec::new();
    let mut t = 0.0;
    while t < 2.0 - NS {
        if w.poll(t).feed_watchdog {
            fed.push((t * 1e3).round() / 1e3);
        }
        t += POLL;
    }
    assert_eq!(fed, vec![0.5, 1.0, 1.5]);
    // The loop stops ticking after 1.98 s: the period after is not fed (the loop is not yet
    // "stalled" for the supervisor, but systemd must see it).
    let mut fed_quiet = Vec::new();
    let mut t: f64 = 2.0;
    w.run_with(2.0, 2.9, false, true, |s| {
        if s.feed_watchdog {
            fed_quiet.push((t * 1e3).round() / 1e3);
        }
        t += POLL;
        true
    });
    // At 2.0 s the last tick is 20 ms old: fed; at 2.5 s it is 520 ms old: not.
    assert_eq!(fed_quiet, vec![2.0]);
    // Ticking again: fed.
    w.run(2.9, 3.0, |_| true);
    assert!(w.poll(3.0).feed_watchdog);
    // A thread fault ends the feeding at once.
    w.o.inference = Beat::Panicked("x".into());
    w.poll(3.02);
    assert!(!w.poll(3.5).feed_watchdog);
    assert!(!w.poll(4.0).feed_watchdog);
}

#[test]
fn when_the_status_interval_changes_expect_the_new_interval_from_then() {
    let mut w = World::new(settings());
    assert!(!w.poll(1.0 - MS).show_status);
    assert!(w.poll(1.0).show_status);
    w.lc.set_status_interval(0.1);
    assert!(!w.poll(1.1 - MS).show_status);
    assert!(w.poll(1.1).show_status);
}

#[test]
fn when_the_control_thread_finishes_expect_supervision_over() {
    let mut w = World::new(settings());
    w.poll(0.0);
    w.o.control_finished = true;
    assert!(w.poll(0.02).finished);
}

#[test]
fn when_stopping_expect_the_stop_ladder_to_time_out_one_instant_after_stop_timeout_s() {
    let mut ladder = StopLadder::new(2.0);
    // Running: no deadline, however long.
    assert_eq!(ladder.tick(at(0.0), false, false), Rung::Going);
    assert_eq!(ladder.tick(at(100.0), false, false), Rung::Going);
    // The stop is first seen at 100 s.
    assert_eq!(ladder.tick(at(100.0), true, false), Rung::Going);
    assert_eq!(ladder.tick(at(102.0), true, false), Rung::Going);
    assert_eq!(
        ladder.tick(at(102.0 + NS * 2.0), true, false),
        Rung::TimedOut
    );
    // At rest in time.
    let mut ladder = StopLadder::new(2.0);
    ladder.tick(at(0.0), true, false);
    assert_eq!(ladder.tick(at(1.5), true, true), Rung::AtRest);
}

#[test]
fn when_the_stop_timeout_is_huge_expect_no_overflow() {
    let mut ladder = StopLadder::new(1e308);
    ladder.tick(at(0.0), true, false);
    assert_eq!(ladder.tick(at(1e6), true, false), Rung::Going);
}

proptest! {
    /// Whatever the world does: the stop is asked at most once; the e-stop latches only with
    /// a thread fault; systemd is never fed after one, nor when no tick came within the
    /// period; an abandon ends in exit 6.
    #[test]
    fn when_the_world_misbehaves_at_random_expect_the_invariants(
        events in proptest::collection::vec((0u8..12, 1u32..800), 1..200)
    ) {
        let mut w = World::new(Settings {
            watchdog_period_s: Some(0.25),
            duration_s: Some(20.0),
            ..settings()
        });
        w.o.started = false;
        let mut t = 0.0;
        let mut stops = 0;
        let mut thread_fault = false;
        let mut last_tick_t = 0.0;
        for (e, gap_ms) in events {
            t += gap_ms as f64 * 1e-3;
            match e {
                0..=5 => { w.o.ticks += 1; last_tick_t = t; }
                6 => w.o.io = Beat::Alive(at(t)),
                7 => w.o.started = true,
                8 => w.o.limit_violation = true,
                9 => w.o.inference = Beat::Panicked("p".into()),
                10 => w.o.stop_signal = true,
                _ => w.o.inference = Beat::Returned,
            }
            let s = w.poll_as_is(t);
            if s.suspended_s.is_some() {
                // Liveness is measured afresh from a resume.
                last_tick_t = t;
            }
            stops += usize::from(s.stop.is_some());
            prop_assert!(stops <= 1);
            if s.latch_estop() {
                prop_assert!(matches!(s.fault, Some(Fault::Thread(..))));
                thread_fault = true;
            }
            if s.feed_watchdog {
                prop_assert!(!thread_fault);
                prop_assert!(t - last_tick_t < 0.25 + NS);
            }
            if s.abandon {
                prop_assert_eq!(w.lc.finish(ControlEnd::Abandoned), ExitReason::ControlFault);
                break;
            }
        }
    }
}

#[test]
fn when_the_simulator_thread_dies_expect_the_fault_to_name_it() {
    let mut w = World::new(settings());
    w.o.io_role = Role::Sim;
    w.poll(0.0);
    w.o.io = Beat::Panicked("sim event `crash`".into());
    let s = w.poll_as_is(0.02);
    assert_eq!(
        s.fault.map(|f| f.to_string()).as_deref(),
        Some("simulator thread panicked: sim event `crash`")
    );
}

#[test]
fn when_the_accelerator_gives_out_expect_one_controlled_stop_and_exit_9_whatever_comes_after() {
    for fault in [AcceleratorFault::Lost, AcceleratorFault::Failed] {
        let mut w = World::new(settings());
        w.run(0.0, 1.0, no_stop);
        w.o.accelerator = Some(fault);
        let s = w.poll(1.0);
        assert_eq!(s.stop, Some(StopCause::AcceleratorFault), "{fault:?}");
        assert_eq!(s.fault, Some(Fault::Accelerator(fault)));
        assert!(!s.abandon, "the control loop ticks: a controlled stop");
        // Said once; a stop signal during the stop changes nothing.
        w.o.stop_signal = true;
        w.run(1.02, 2.0, |s| s.stop.is_none() && s.fault.is_none());
        let end = ControlEnd::Returned { reached_rest: true };
        assert_eq!(w.lc.finish(end), ExitReason::RuntimeFailure);
    }
}

//! A stall of the whole host (the control thread not run for many periods) in synthetic time.
//! Meanwhile a trajectory controller ran the last command's look-ahead on its own: coasting
//! along it, then braking to rest. The first command after the stall must continue that
//! motion within the limits, not the governor's own (which lagged, or tracked the chunk on),
//! or the controller jumps from where it stands to it.

use proptest::prelude::*;

use crate::chunk::JointChunk;
use crate::control::watchdog_tests::{limits, Rig};
use crate::control::{ControllerSettings, TickReport};
use crate::joints::{JointVector, MotionState};
use crate::robot::jtc_model::Follower;
use crate::robot::lookahead::{Lookahead, TimedState};
use crate::safety::Mode;

const DT: f64 = 0.005;
const COAST_S: f64 = 0.05;
/// The limits of both joints (shared with the watchdog tests).
const VELOCITY: f64 = 1.0;
const ACCELERATION: f64 = 5.0;

/// Running a 0.6 rad/s ramp (opposite ways on the two joints) for 0.3 s; the joints in
/// `trajectory_joints` are sent as trajectories. Generous watchdogs: only the stall is tested.
fn moving(trajectory_joints: &[usize]) -> Rig {
    moving_sent(trajectory_joints, &mut |_, _| {})
}

/// `moving`, with each tick's command handed to `sent` with the tick's time (s).
fn moving_sent(trajectory_joints: &[usize], sent: &mut impl FnMut(f64, &MotionState)) -> Rig {
    let l = limits();
    assert_eq!((l.velocity[1], l.acceleration[1]), (VELOCITY, ACCELERATION));
    let mut rig = Rig::with_settings(ControllerSettings {
        joint_state_timeout_s: 10.0,
        camera_timeout_s: 10.0,
        overrun_streak: 1000,
        request_threshold_s: 0.1,
        warmup_chunks: 0,
        trajectory_joints: trajectory_joints.to_vec(),
        trajectory_coast_s: COAST_S,
        trajectory_interval_s: 0.0,
    });
    let mut c = JointChunk::with_capacity(50);
    c.obs_stamp = rig.now().offset_seconds(-0.01);
    c.period_s = 0.02;
    for i in 0..50 {
        let x = 0.6 * i as f64 * 0.02;
        c.positions.push(JointVector::from_slice(&[x, -x]));
    }
    c.update_derivatives();
    let r = rig.tick(Some(Box::new(c)), 0, false, 0);
    sent(seconds(&rig), &r.command);
    for _ in 0..60 {
        let r = rig.tick(None, 0, false, 0);
        sent(seconds(&rig), &r.command);
    }
    assert_eq!(rig.ctl.mode(), Mode::Running);
    assert!(rig.ctl.commanded().velocity[0] > 0.5, "moving");
    rig
}

/// The rig's last tick's time (s, synthetic).
fn seconds(rig: &Rig) -> f64 {
    rig.k as f64 * DT
}

/// The tick `periods` control periods after the last one.
fn after(rig: &mut Rig, periods: u64, estop: bool) -> TickReport {
    rig.k += periods.max(1) - 1;
    rig.tick(None, 0, estop, 0)
}

/// Where a controller that ran `sent`'s look-ahead stands `stall` periods after the tick that
/// sent it (the command was due one period after its tick).
fn controller_after(sent: &MotionState, stall: u64) -> MotionState {
    Lookahead::new(&limits(), COAST_S).state_at(sent, &[0, 1], (stall - 1) as f64 * DT)
}

/// The step from where the controller stands to the command, as a controller running the
/// next message sees it: within the velocity and acceleration limits on every joint.
fn assert_continues(from: &MotionState, to: &MotionState, joints: &[usize]) {
    for &j in joints {
        let v = (to.position[j] - from.position[j]) / DT;
        let a = (v - from.velocity[j]) / DT;
        assert!(
            v.abs() <= VELOCITY * 1.001 && a.abs() <= ACCELERATION * 1.001,
            "joint {j}: from {from:?} to {to:?}: {v} rad/s, {a} rad/s²"
        );
    }
}

#[test]
fn when_the_host_stalls_past_the_coast_expect_the_command_to_go_on_from_the_braking_arm() {
    let mut rig = moving(&[0, 1]);
    let sent = *rig.ctl.commanded();
    // 150 ms without a tick: 50 ms coasting, then 95 ms braking at 5 rad/s².
    let r = after(&mut rig, 30, false);
    let there = controller_after(&sent, 30);
    assert!(there.velocity[0] < 0.2, "braking: {there:?}");
    assert_continues(&there, &r.command, &[0, 1]);
    assert_eq!(r.mode, Mode::Running);
    assert!(!r.limit_violation);
    // And on from there, every tick within the limits as the monitor judges them.
    for _ in 0..100 {
        let r = after(&mut rig, 1, false);
        assert!(!r.limit_violation);
    }
    assert_eq!(rig.ctl.monitor().violations, 0);
}

#[test]
fn when_the_host_stalls_while_braking_expect_the_brake_to_go_on_from_where_the_arm_went() {
    let mut rig = moving(&[0, 1]);
    after(&mut rig, 1, true);
    for _ in 0..5 {
        after(&mut rig, 1, true);
    }
    assert_eq!(rig.ctl.mode(), Mode::EStopped);
    let sent = *rig.ctl.commanded();
    let r = after(&mut rig, 12, true);
    assert_continues(&controller_after(&sent, 12), &r.command, &[0, 1]);
}

#[test]
fn when_only_some_joints_follow_a_lookahead_expect_the_others_caught_up_as_before() {
    let mut first = moving(&[0]);
    let mut none = moving(&[]);
    let sent = *first.ctl.commanded();
    let (r, plain) = (after(&mut first, 30, false), after(&mut none, 30, false));
    assert_continues(&controller_after(&sent, 30), &r.command, &[0]);
    // Joint 1 (a forward position command, holding its last value) follows the chunk on, as
    // without trajectory outputs.
    assert_eq!(r.command.position[1], plain.command.position[1]);
}

#[test]
fn when_a_tick_is_on_time_expect_the_lookahead_to_change_nothing() {
    let mut with = moving(&[0, 1]);
    let mut without = moving(&[]);
    for _ in 0..50 {
        let (a, b) = (after(&mut with, 1, false), after(&mut without, 1, false));
        assert_eq!(a.command, b.command);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    /// Whatever the stall (one missed tick to a second), its first command continues the
    /// controller's motion within the limits, and the monitor finds nothing after it.
    #[test]
    fn when_any_stall_ends_expect_a_step_within_the_limits(stall in 2u64..200, before in 0u64..40) {
        let mut rig = moving(&[0, 1]);
        for _ in 0..before {
            after(&mut rig, 1, false);
        }
        let sent = *rig.ctl.commanded();
        let r = after(&mut rig, stall, false);
        assert_continues(&controller_after(&sent, stall), &r.command, &[0, 1]);
        for _ in 0..20 {
            prop_assert!(!after(&mut rig, 1, false).limit_violation);
        }
        prop_assert_eq!(rig.ctl.monitor().violations, 0);
    }
}

/// The rig's commands as trajectories to a modelled joint_trajectory_controller (jazzy with
/// `interpolate_from_desired_state`, 500 Hz; the model the interop tests judge pi0d's stream
/// with), each message arriving at its tick as pi0d's ROS thread plans it (due one period out).
struct ToController {
    lookahead: Lookahead,
    jtc: Follower,
    plan: Vec<TimedState>,
}

impl ToController {
    fn new() -> ToController {
        ToController {
            lookahead: Lookahead::new(&limits(), COAST_S),
            jtc: Follower::new(MotionState::at_rest(JointVector::zeros(2)), 0.0, 500.0),
            plan: Vec::new(),
        }
    }

    fn send(&mut self, t: f64, cmd: &MotionState) {
        self.lookahead.plan(cmd, DT, &mut self.plan);
        self.jtc.receive(t, &self.plan);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    /// Whatever the stall, the controller running the look-ahead through it and the messages
    /// after it moves the arm within the bounds the interop tests hold it to: its acceleration
    /// under twice the limit, its jerk under twenty times (a step between the controller's
    /// spline and pi0d's resumed command would show here as a spike).
    #[test]
    fn when_any_stall_ends_expect_the_controllers_motion_within_the_bounds(
        stall in 2u64..200,
        before in 0u64..40,
    ) {
        let mut to = ToController::new();
        let mut rig = moving_sent(&[0, 1], &mut |t, cmd| to.send(t, cmd));
        for _ in 0..before {
            let r = after(&mut rig, 1, false);
            to.send(seconds(&rig), &r.command);
        }
        let r = after(&mut rig, stall, false);
        to.send(seconds(&rig), &r.command);
        for _ in 0..60 {
            let r = after(&mut rig, 1, false);
            to.send(seconds(&rig), &r.command);
        }
        to.jtc.run_until(seconds(&rig) + 1.0);
        let (acc, jerk, at) = to.jtc.motion();
        let at_s = at as f64 / 500.0;
        prop_assert!(acc < 2.0 * ACCELERATION, "{acc} rad/s² at {at_s} s");
        prop_assert!(jerk < 20.0 * limits().jerk[0], "{jerk} rad/s³");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    /// The I/O thread not run while the control thread ticks on: no trajectory goes out, the
    /// controller runs the last one's look-ahead (coasting, then braking) while the chunk moves
    /// on. Whatever the gap, the messages after it continue the controller's motion within
    /// the same bounds: the command followed the look-ahead while nothing went out.
    #[test]
    fn when_the_io_thread_stalls_expect_the_controllers_motion_within_the_bounds(
        stall in 1u64..120,
        before in 0u64..40,
    ) {
        let mut to = ToController::new();
        let mut rig = moving_sent(&[0, 1], &mut |t, cmd| to.send(t, cmd));
        for _ in 0..before {
            let r = after(&mut rig, 1, false);
            to.send(seconds(&rig), &r.command);
        }
        rig.io_stalled = true;
        for _ in 0..stall {
            after(&mut rig, 1, false);
        }
        rig.io_stalled = false;
        for _ in 0..60 {
            let r = after(&mut rig, 1, false);
            to.send(seconds(&rig), &r.command);
        }
        to.jtc.run_until(seconds(&rig) + 1.0);
        let (acc, jerk, at) = to.jtc.motion();
        let at_s = at as f64 / 500.0;
        prop_assert!(acc < 2.0 * ACCELERATION, "{acc} rad/s² at {at_s} s");
        prop_assert!(jerk < 20.0 * limits().jerk[0], "{jerk} rad/s³");
        prop_assert_eq!(rig.ctl.monitor().violations, 0);
    }
}

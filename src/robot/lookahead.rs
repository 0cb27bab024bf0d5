//! The governed command as a short trajectory a position controller can run on its own: the
//! command's velocity held for a moment (the points lie on the line through the command, due
//! `first_s` from now), then every joint braking to rest at its deceleration limit, short of its
//! position limits. The last point is at rest, so a `joint_trajectory_controller` with its
//! default `allow_nonzero_velocity_at_trajectory_end = false` accepts it, and a stream that
//! stops leaves the arm decelerating smoothly instead of halting at the last point.
//!
//! The command's own point is not sent: a controller installs a message at its next update (up
//! to one of its periods late, 2 ms at 500 Hz), and a point due one control period out would
//! turn that delay into a jerk of the whole arm; a point on the same line further out absorbs
//! it. Each message replaces the previous one, so while the stream flows only the start of the
//! coast is ever followed. Nothing here allocates once `out` has its capacity.

use crate::joints::{JointVector, MotionState};
use crate::robot::RobotLimits;

/// One point of the look-ahead: a state `t_s` seconds after the message's start.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct TimedState {
    pub(crate) t_s: f64,
    pub(crate) state: MotionState,
}

/// One point where the coast ends (the first one the controller heads for), three while
/// braking.
const COAST_POINTS: usize = 1;
const BRAKE_POINTS: usize = 3;
/// Points in a whole look-ahead.
pub(crate) const POINTS: usize = COAST_POINTS + BRAKE_POINTS;
/// The first point is never sooner than this after the message's start (s): a controller
/// installs a message at its next update, and a point already past by then is skipped.
pub(crate) const MIN_FIRST_S: f64 = 0.001;

#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Lookahead {
    /// How long the command's velocity is held before braking (if no newer message came).
    coast_s: f64,
    lower: JointVector,
    upper: JointVector,
    velocity: JointVector,
    deceleration: JointVector,
    jerk: JointVector,
}

impl Lookahead {
    pub(crate) fn new(limits: &RobotLimits, coast_s: f64) -> Lookahead {
        Lookahead {
            coast_s: coast_s.max(0.0),
            lower: limits.lower,
            upper: limits.upper,
            velocity: limits.velocity,
            deceleration: limits.acceleration,
            jerk: limits.jerk,
        }
    }

    /// The same for the joints `indices` only (in that order).
    pub(crate) fn select(&self, indices: &[usize]) -> Lookahead {
        Lookahead {
            coast_s: self.coast_s,
            lower: self.lower.select(indices),
            upper: self.upper.select(indices),
            velocity: self.velocity.select(indices),
            deceleration: self.deceleration.select(indices),
            jerk: self.jerk.select(indices),
        }
    }

    /// The points that follow `cmd` into `out` (cleared first): times strictly increasing,
    /// the last point at rest. `due_s` is when the command itself is due after the message's
    /// start: negative for a command that waited (a late wake-up, a busy sender thread). The
    /// points stay on the command's timeline as long as the first one is still ahead, at least
    /// `MIN_FIRST_S` after the start; a command older than that has the whole plan pushed to
    /// start there, rather than a longer coast extrapolating a stale command further.
    pub(crate) fn plan(&self, cmd: &MotionState, due_s: f64, out: &mut Vec<TimedState>) {
        out.clear();
        let n = cmd.position.len();
        let coast_s = self.coast_s;
        // The longest stop from where the coast ends sets the braking points' times (a coast
        // that accelerates ends faster than the command), never shorter than twice the time
        // the jerk limit takes to turn the coast's acceleration into braking: a controller's
        // spline through points closer than that would turn it at many times the limit. Each
        // joint follows its own profile.
        let brake_s = (0..n)
            .map(|j| {
                let (_, v, a) = self.joint_at(j, cmd, coast_s, coast_s);
                let dec = self.deceleration[j];
                (v.abs() / dec).max(2.0 * (a.abs() + dec) / self.jerk[j])
            })
            .fold(0.0, f64::max)
            .max(MIN_FIRST_S);
        let first_s = due_s.max(MIN_FIRST_S - coast_s);
        let times = (1..=COAST_POINTS)
            .map(|k| coast_s * k as f64 / COAST_POINTS as f64)
            .chain((1..=BRAKE_POINTS).map(|k| coast_s + brake_s * k as f64 / BRAKE_POINTS as f64));
        for tau in times {
            let mut s = MotionState::at_rest(cmd.position);
            for j in 0..n {
                let (p, v, a) = self.joint_at(j, cmd, coast_s, tau);
                s.position[j] = p;
                s.velocity[j] = v;
                s.acceleration[j] = a;
            }
            out.push(TimedState {
                t_s: first_s + tau,
                state: s,
            });
        }
        // Exactly at rest: a controller compares the last velocity with a float epsilon.
        if let Some(last) = out.last_mut() {
            last.state.velocity = JointVector::zeros(n);
            last.state.acceleration = JointVector::zeros(n);
        }
    }

    /// Where a controller following the look-ahead of `cmd` has taken the joints `joints`,
    /// `tau` seconds after the command was due, had no newer message come: the states between
    /// the points as this profile has them (a controller's spline through the points stays
    /// within a hair of it). The other joints keep `cmd`'s state. Allocates nothing.
    pub(crate) fn state_at(&self, cmd: &MotionState, joints: &[usize], tau: f64) -> MotionState {
        let mut s = *cmd;
        for &j in joints {
            let (p, v, a) = self.joint_at(j, cmd, self.coast_s, tau.max(0.0));
            s.position[j] = p;
            s.velocity[j] = v;
            s.acceleration[j] = a;
        }
        s
    }

    /// Joint `j`'s position, velocity and acceleration `tau` after the command: coasting for at
    /// most `coast_s` (less where the position limits need the room to stop), then braking at
    /// its deceleration limit, then at rest. While coasting, the command's acceleration goes
    /// on (through zero velocity into a reversal, up to the velocity limit), so a controller
    /// following the points accelerates and brakes with the arm, and the points move
    /// continuously with the command: a coast that stopped at zero velocity would jump by
    /// `a c^2 / 2` the moment the joint reverses.
    fn joint_at(&self, j: usize, cmd: &MotionState, coast_s: f64, tau: f64) -> (f64, f64, f64) {
        let (p, v) = (cmd.position[j], cmd.velocity[j]);
        let dec = self.deceleration[j];
        let a = cmd.acceleration[j].clamp(-dec, dec);
        if v == 0.0 && a == 0.0 {
            return (p, 0.0, 0.0);
        }
        let coast = Coast {
            p,
            v,
            a,
            vmax: self.velocity[j].max(v.abs()),
        };
        let (lower, upper) = (self.lower[j], self.upper[j]);
        // The whole path, coasting `c` and then braking to rest, must stay in the range.
        let fits = |c: f64| {
            let (lo, hi) = coast.extent(c, dec);
            lo >= lower && hi <= upper
        };
        let mut c = coast_s;
        if !fits(c) {
            // Braking at once fits (the governor's velocity band keeps the braking distance).
            let (mut lo, mut hi) = (0.0, c);
            for _ in 0..40 {
                let mid = 0.5 * (lo + hi);
                if fits(mid) {
                    lo = mid;
                } else {
                    hi = mid;
                }
            }
            c = lo;
        }
        if tau <= c {
            return coast.at(tau);
        }
        let (pc, vc, _) = coast.at(c);
        braking(pc, vc, dec, tau - c)
    }
}

/// Braking from `v` at `p` at `dec` for `s`, then at rest: position, velocity, acceleration.
fn braking(p: f64, v: f64, dec: f64, s: f64) -> (f64, f64, f64) {
    let sign = v.signum();
    let stop = v.abs() / dec;
    if s >= stop {
        return (p + 0.5 * v * stop, 0.0, 0.0);
    }
    (
        p + v * s - 0.5 * sign * dec * s * s,
        v - sign * dec * s,
        -sign * dec,
    )
}

/// One joint coasting from `p` at `v` with a constant acceleration `a`, until the velocity
/// reaches `vmax` (either way).
struct Coast {
    p: f64,
    v: f64,
    a: f64,
    vmax: f64,
}

impl Coast {
    fn at(&self, t: f64) -> (f64, f64, f64) {
        let Coast { p, v, a, vmax } = *self;
        if a == 0.0 {
            return (p + v * t, v, 0.0);
        }
        // When the velocity reaches the limit in the acceleration's direction (|v| <= vmax).
        let end = (vmax * a.signum() - v) / a;
        if t >= end {
            let (pe, ve) = (p + v * end + 0.5 * a * end * end, v + a * end);
            (pe + ve * (t - end), ve, 0.0)
        } else {
            (p + v * t + 0.5 * a * t * t, v + a * t, a)
        }
    }

    /// The lowest and highest positions coasting `c` and then braking to rest at `dec`: the
    /// path is monotonic between the start, a reversal while coasting, the coast's end and the
    /// stop.
    fn extent(&self, c: f64, dec: f64) -> (f64, f64) {
        let (pc, vc, _) = self.at(c);
        let stop = braking(pc, vc, dec, f64::INFINITY).0;
        let mut lo = self.p.min(pc).min(stop);
        let mut hi = self.p.max(pc).max(stop);
        if self.a != 0.0 {
            let turn = -self.v / self.a;
            if turn > 0.0 && turn < c {
                let pt = self.at(turn).0;
                lo = lo.min(pt);
                hi = hi.max(pt);
            }
        }
        (lo, hi)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::robot::limits::one_test_joint;
    use proptest::prelude::*;

    fn limits(n: usize) -> RobotLimits {
        RobotLimits::new(
            (0..n)
                .map(|i| {
                    let mut j = one_test_joint(-1.0, 1.0).joints.remove(0);
                    j.name = format!("j{i}");
                    j.acceleration = 2.0 + i as f64;
                    j
                })
                .collect(),
        )
    }

    proptest! {
        /// Whatever the command, the look-ahead ends at rest, its times increase, no joint
        /// leaves its range, and none brakes harder than its limit.
        #[test]
        fn when_any_command_is_planned_expect_a_controller_safe_tail(
            p in prop::collection::vec(-1.0f64..1.0, 1..8),
            vs in prop::collection::vec(-3.0f64..3.0, 8),
            accs in prop::collection::vec(-8.0f64..8.0, 8),
            coast in 0.0f64..0.2,
        ) {
            let n = p.len();
            let lim = limits(n);
            let mut cmd = MotionState::at_rest(JointVector::from_slice(&p));
            for j in 0..n {
                // A velocity the governor could have commanded there: one it can stop from.
                let room = if vs[j] > 0.0 { 1.0 - p[j] } else { p[j] + 1.0 };
                let vmax = (2.0 * lim.acceleration[j] * room).sqrt();
                cmd.velocity[j] = vs[j].clamp(-vmax, vmax);
                cmd.acceleration[j] = accs[j].clamp(-lim.acceleration[j], lim.acceleration[j]);
            }
            let mut out = Vec::new();
            Lookahead::new(&lim, coast).plan(&cmd, 0.005, &mut out);
            prop_assert_eq!(out.len(), POINTS);
            prop_assert!(out[0].t_s > 0.005);
            for w in out.windows(2) {
                prop_assert!(w[1].t_s > w[0].t_s, "{} then {}", w[0].t_s, w[1].t_s);
            }
            let last = out.last().unwrap();
            prop_assert!(last.state.velocity.iter().all(|v| *v == 0.0));
            // The profile itself has come to rest there: the last point is where it stops, so
            // a controller never has to stop harder than the profile between the points.
            let all: Vec<usize> = (0..n).collect();
            let rest = Lookahead::new(&lim, coast).state_at(&cmd, &all, 1e3);
            for j in 0..n {
                prop_assert!(
                    (last.state.position[j] - rest.position[j]).abs() < 1e-12,
                    "joint {}: last point {} but stops at {}", j, last.state.position[j], rest.position[j]
                );
            }
            for s in &out {
                for j in 0..n {
                    let x = s.state.position[j];
                    prop_assert!((-1.0 - 1e-9..=1.0 + 1e-9).contains(&x), "joint {} at {}", j, x);
                    prop_assert!(s.state.acceleration[j].abs() <= lim.acceleration[j] + 1e-12);
                    let v = s.state.velocity[j].abs();
                    prop_assert!(v <= lim.velocity[j].max(cmd.velocity[j].abs()) + 1e-12, "{}", v);
                }
            }
        }
    }

    #[test]
    fn when_moving_freely_expect_coast_then_stop_at_the_braking_distance() {
        let lim = limits(1);
        let mut cmd = MotionState::at_rest(JointVector::from_slice(&[0.0]));
        cmd.velocity[0] = 0.4;
        let mut out = Vec::new();
        Lookahead::new(&lim, 0.05).plan(&cmd, 0.005, &mut out);
        // Coasting at 0.4 rad/s for 50 ms, then 0.4 / 2 s braking at 2 rad/s².
        assert!((out[0].t_s - 0.055).abs() < 1e-12);
        assert!((out[0].state.position[0] - 0.02).abs() < 1e-12);
        assert_eq!(out[0].state.velocity[0], 0.4);
        let end = out.last().unwrap();
        assert!((end.state.position[0] - (0.02 + 0.04)).abs() < 1e-12);
        assert!((end.t_s - (0.005 + 0.05 + 0.2)).abs() < 1e-12);
    }

    #[test]
    fn when_the_command_brakes_expect_the_coast_to_go_on_braking_down_to_rest() {
        let lim = limits(1);
        let mut cmd = MotionState::at_rest(JointVector::from_slice(&[0.0]));
        cmd.velocity[0] = 0.1;
        cmd.acceleration[0] = -1.0;
        let mut out = Vec::new();
        Lookahead::new(&lim, 0.05).plan(&cmd, 0.005, &mut out);
        // 50 ms in: 0.1 - 0.05 rad/s, still decelerating at 1 rad/s².
        assert!(
            (out[0].state.velocity[0] - 0.05).abs() < 1e-12,
            "{:?}",
            out[0]
        );
        assert_eq!(out[0].state.acceleration[0], -1.0);
        // 50 ms at -1 rad/s² (0.1 -> 0.05 rad/s, 3.75 mrad), then braking at 2 rad/s²
        // (0.625 mrad) to rest; it never reverses.
        let end = out.last().unwrap();
        assert!((end.state.position[0] - 0.004375).abs() < 1e-12, "{end:?}");
        assert!(out.iter().all(|p| p.state.velocity[0] >= 0.0));
        // Speeding up goes on too, up to the velocity limit (1 rad/s here).
        cmd.acceleration[0] = 1.0;
        Lookahead::new(&lim, 0.05).plan(&cmd, 0.005, &mut out);
        assert!(
            (out[0].state.velocity[0] - 0.15).abs() < 1e-12,
            "{:?}",
            out[0]
        );
        cmd.velocity[0] = 0.99;
        Lookahead::new(&lim, 0.05).plan(&cmd, 0.005, &mut out);
        assert_eq!(out[0].state.velocity[0], 1.0);
        assert_eq!(out[0].state.acceleration[0], 0.0);
    }

    #[test]
    fn when_a_joint_reverses_expect_the_points_to_move_on_continuously() {
        let lim = limits(1);
        // Just before and just after the velocity changes sign, accelerating at 4 rad/s²: the
        // first point (50 ms out) moves by about the command's own step, not by a c^2 / 2.
        let first = |v: f64| {
            let mut cmd = MotionState::at_rest(JointVector::from_slice(&[0.0]));
            cmd.velocity[0] = v;
            cmd.acceleration[0] = 1.9;
            let mut out = Vec::new();
            Lookahead::new(&lim, 0.05).plan(&cmd, 0.005, &mut out);
            out[0].state
        };
        let (before, after) = (first(-1e-4), first(1e-4));
        assert!(
            (before.position[0] - after.position[0]).abs() < 2e-5,
            "{before:?} then {after:?}"
        );
        // It reverses while coasting: 50 ms at 1.9 rad/s² from -1e-4 rad/s.
        assert!((before.velocity[0] - (-1e-4 + 1.9 * 0.05)).abs() < 1e-12);
        assert!(before.position[0] > 0.0);
    }

    proptest! {
        /// A small change of the command moves every point a little: the controller sees no
        /// jump from one message to the next that the command itself did not make.
        #[test]
        fn when_the_command_changes_slightly_expect_the_points_to_change_slightly(
            p in -0.5f64..0.5,
            v in -1.0f64..1.0,
            a in -2.0f64..2.0,
            dv in -1e-4f64..1e-4,
        ) {
            let lim = limits(1);
            let plan = |v: f64| {
                let mut cmd = MotionState::at_rest(JointVector::from_slice(&[p]));
                cmd.velocity[0] = v;
                cmd.acceleration[0] = a;
                let mut out = Vec::new();
                Lookahead::new(&lim, 0.05).plan(&cmd, 0.005, &mut out);
                out
            };
            let (x, y) = (plan(v), plan(v + dv));
            // A velocity change of dv moves a point by at most dv x its time (under 0.6 s here)
            // plus the braking distance's change (v dv / dec, dec = 2 rad/s²).
            for (a, b) in x.iter().zip(&y) {
                let d = (a.state.position[0] - b.state.position[0]).abs();
                prop_assert!(d <= 1.2 * dv.abs() + 1e-12, "{:?} vs {:?}", a, b);
            }
        }
    }

    #[test]
    fn when_the_command_waited_expect_its_points_on_its_own_timeline_while_they_are_ahead() {
        let lim = limits(1);
        let mut cmd = MotionState::at_rest(JointVector::from_slice(&[0.0]));
        cmd.velocity[0] = 0.4;
        cmd.acceleration[0] = 1.0;
        let la = Lookahead::new(&lim, 0.05);
        let (mut on_time, mut late) = (Vec::new(), Vec::new());
        la.plan(&cmd, 0.005, &mut on_time);
        // Sent 12 ms after its tick (due 7 ms before the message's start): the same points,
        // each 12 ms sooner after the start, so due at the same moments.
        la.plan(&cmd, -0.007, &mut late);
        for (a, b) in on_time.iter().zip(&late) {
            assert!((a.t_s - b.t_s - 0.012).abs() < 1e-12, "{a:?} vs {b:?}");
            assert_eq!(a.state, b.state);
        }
        // Older than the coast: the plan starts MIN_FIRST_S after the start, not in the past.
        la.plan(&cmd, -0.2, &mut late);
        assert!((late[0].t_s - MIN_FIRST_S).abs() < 1e-12, "{:?}", late[0]);
        assert_eq!(late[0].state, on_time[0].state);
    }

    #[test]
    fn when_close_to_a_limit_expect_braking_at_once() {
        let lim = limits(1);
        // 0.04 rad of room: exactly the braking distance from 0.4 rad/s at 2 rad/s².
        let mut cmd = MotionState::at_rest(JointVector::from_slice(&[0.96]));
        cmd.velocity[0] = 0.4;
        let mut out = Vec::new();
        Lookahead::new(&lim, 0.05).plan(&cmd, 0.005, &mut out);
        assert!(out[0].state.velocity[0] < 0.4, "no coasting: {:?}", out[0]);
        assert!((out.last().unwrap().state.position[0] - 1.0).abs() < 1e-12);
    }
}

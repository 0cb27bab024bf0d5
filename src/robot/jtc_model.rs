//! A model of how ros2_control's `joint_trajectory_controller` runs the look-ahead pi0d sends,
//! for tests in synthetic time: written from ros2_controllers' `trajectory.cpp`
//! (`interpolate_between_points`: quintic where both ends give position, velocity and
//! acceleration) and jazzy's `interpolate_from_desired_state` (a new message starts from the
//! state the controller commanded at its previous update), as `tests/peers/jtc_model.py` models
//! it for the interop tests. Each message (zero stamp) is installed at the controller's first
//! update at or after its arrival and starts then; after the last point the controller holds it.
//! A model of the controller, not the controller: no ros2_control runs here.

use crate::joints::{JointVector, MotionState};
use crate::robot::lookahead::TimedState;

/// One joint's quintic between two knots: position, velocity, acceleration at `s` into it.
fn quintic(a: (f64, f64, f64), b: (f64, f64, f64), t: f64, s: f64) -> (f64, f64, f64) {
    let ((p0, v0, a0), (p1, v1, a1)) = (a, b);
    let s = s.clamp(0.0, t);
    let (t2, t3, t4, t5) = (t * t, t * t * t, t.powi(4), t.powi(5));
    let c3 = (-20.0 * p0 + 20.0 * p1 - 3.0 * a0 * t2 + a1 * t2 - 12.0 * v0 * t - 8.0 * v1 * t)
        / (2.0 * t3);
    let c4 =
        (30.0 * p0 - 30.0 * p1 + 3.0 * a0 * t2 - 2.0 * a1 * t2 + 16.0 * v0 * t + 14.0 * v1 * t)
            / (2.0 * t4);
    let c5 =
        (-12.0 * p0 + 12.0 * p1 - a0 * t2 + a1 * t2 - 6.0 * v0 * t - 6.0 * v1 * t) / (2.0 * t5);
    let (s2, s3, s4, s5) = (s * s, s * s * s, s.powi(4), s.powi(5));
    (
        p0 + v0 * s + 0.5 * a0 * s2 + c3 * s3 + c4 * s4 + c5 * s5,
        v0 + a0 * s + 3.0 * c3 * s2 + 4.0 * c4 * s3 + 5.0 * c5 * s4,
        a0 + 6.0 * c3 * s + 12.0 * c4 * s2 + 20.0 * c5 * s3,
    )
}

fn joint(s: &MotionState, j: usize) -> (f64, f64, f64) {
    (s.position[j], s.velocity[j], s.acceleration[j])
}

/// The controller's updates at its own rate, from the desired state.
pub(crate) struct Follower {
    dt: f64,
    /// Time of the next update (s).
    u: f64,
    /// The state commanded at the last update.
    state: MotionState,
    /// The running trajectory: the knot before it, then its points, on the update clock.
    knots: Vec<(f64, MotionState)>,
    pending: Option<Vec<TimedState>>,
    /// Each update's commanded positions.
    pub(crate) positions: Vec<JointVector>,
}

impl Follower {
    /// A controller at `rate_hz` holding `start` from `t` on.
    pub(crate) fn new(start: MotionState, t: f64, rate_hz: f64) -> Follower {
        Follower {
            dt: 1.0 / rate_hz,
            u: t,
            state: start,
            knots: vec![(t, start)],
            pending: None,
            positions: Vec::new(),
        }
    }

    /// A message with `points` arrives at `arrival`: every update before it runs first.
    pub(crate) fn receive(&mut self, arrival: f64, points: &[TimedState]) {
        self.run_until(arrival);
        self.pending = Some(points.to_vec());
    }

    /// Runs the updates due before `t`.
    pub(crate) fn run_until(&mut self, t: f64) {
        while self.u < t - 1e-12 {
            self.update();
        }
    }

    fn update(&mut self) {
        let u = self.u;
        if let Some(points) = self.pending.take() {
            let t0 = u - self.dt;
            self.knots.clear();
            self.knots.push((t0, self.state));
            self.knots
                .extend(points.iter().map(|p| (u + p.t_s, p.state)));
        }
        self.state = self.sample(u);
        self.positions.push(self.state.position);
        self.u += self.dt;
    }

    fn sample(&self, u: f64) -> MotionState {
        let Some(&(t_last, last)) = self.knots.last() else {
            return self.state;
        };
        if u >= t_last {
            return last;
        }
        let mut out = last;
        for w in self.knots.windows(2) {
            let ((ta, a), (tb, b)) = (w[0], w[1]);
            if u < tb {
                for j in 0..out.position.len() {
                    let (p, v, acc) = quintic(joint(&a, j), joint(&b, j), tb - ta, u - ta);
                    out.position[j] = p;
                    out.velocity[j] = v;
                    out.acceleration[j] = acc;
                }
                return out;
            }
        }
        out
    }

    /// The largest acceleration and jerk of the commanded positions, as the interop tests
    /// measure them (finite differences at the update rate), and the update index of the
    /// largest acceleration.
    pub(crate) fn motion(&self) -> (f64, f64, usize) {
        let (dt, p) = (self.dt, &self.positions);
        let (mut acc, mut jerk, mut at) = (0.0f64, 0.0f64, 0);
        for (i, w) in p.windows(4).enumerate() {
            let pairs = w[0].iter().zip(w[1].iter());
            for ((&p0, &p1), (&p2, &p3)) in pairs.zip(w[2].iter().zip(w[3].iter())) {
                jerk = jerk.max((p3 - 3.0 * p2 + 3.0 * p1 - p0).abs() / dt.powi(3));
                let a = (p2 - 2.0 * p1 + p0).abs() / (dt * dt);
                if a > acc {
                    (acc, at) = (a, i + 1);
                }
            }
        }
        (acc, jerk, at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn when_points_lie_on_a_parabola_expect_the_quintic_to_follow_it_exactly() {
        let f = |t: f64| (1.0 + 0.5 * t - 2.0 * t * t, 0.5 - 4.0 * t, -4.0);
        let (p, v, a) = quintic(f(0.0), f(0.3), 0.3, 0.1);
        let want = f(0.1);
        assert!((p - want.0).abs() < 1e-12 && (v - want.1).abs() < 1e-12);
        assert!((a - want.2).abs() < 1e-9, "{a}");
    }

    #[test]
    fn when_a_message_arrives_expect_it_to_start_from_the_desired_state() {
        let rest = MotionState::at_rest(JointVector::from_slice(&[0.0]));
        let mut f = Follower::new(rest, 0.0, 500.0);
        let mut far = rest;
        far.position[0] = 0.01;
        f.receive(
            0.0101,
            &[TimedState {
                t_s: 0.1,
                state: far,
            }],
        );
        f.run_until(0.2);
        // Held until the update after its arrival, then a smooth quintic to the point.
        assert_eq!(f.positions[5], rest.position);
        assert!(f.positions[6][0] > 0.0);
        assert!((f.positions.last().unwrap()[0] - 0.01).abs() < 1e-15);
        let (acc, _, _) = f.motion();
        // A quintic's peak acceleration: 5.77 x 10 mrad / (0.1 s + the update before)².
        let want = 10.0 / 3f64.sqrt() * 0.01 / (0.102 * 0.102);
        assert!((acc - want).abs() < 0.05 * want, "{acc} vs {want}");
    }
}

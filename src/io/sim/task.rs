//! The simulator's reaching task: a sequence of targets (seeded), each held until the tool has
//! stayed within `radius_m` of it for `hold_s` (reached) or `timeout_s` has passed (missed),
//! and the progress the status line and the run summary show.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::config::sim_task::SimTask;
use crate::joints::JointVector;

/// How the task is going, as the simulator last saw it.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
pub(crate) struct TaskProgress {
    /// The target now shown, counted from 1.
    pub(crate) target: u32,
    /// The tool's distance from it across the table (m).
    pub(crate) distance_m: f64,
    pub(crate) reached: u32,
    pub(crate) missed: u32,
}

impl TaskProgress {
    /// "target 4: 23 mm off, reached 2 of 3".
    pub(crate) fn text(&self) -> String {
        format!(
            "target {}: {:.0} mm off, reached {} of {}",
            self.target,
            self.distance_m * 1e3,
            self.reached,
            self.reached + self.missed
        )
    }
}

/// Targets drawn from the task's joint ranges.
pub(crate) struct Targets {
    rng: StdRng,
}

impl Targets {
    pub(crate) fn new(seed: u64) -> Targets {
        Targets {
            rng: StdRng::seed_from_u64(seed),
        }
    }

    /// The next target pose: `base` with the task's joints drawn.
    pub(crate) fn next(&mut self, task: &SimTask, base: &JointVector) -> JointVector {
        let mut q = *base;
        let s: f64 = self.rng.random();
        for r in &task.reach {
            q[r.joint] = r.at(s);
        }
        for w in &task.sweep {
            q[w.joint] = w.at(self.rng.random());
        }
        q
    }
}

/// One target's life: shown at `since`, inside the radius since `inside_since`.
pub(crate) struct Episode {
    pub(crate) pose: JointVector,
    pub(crate) xy: [f64; 2],
    since: f64,
    inside_since: Option<f64>,
}

/// How an episode ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    Going,
    Reached,
    Missed,
}

impl Episode {
    pub(crate) fn new(pose: JointVector, xy: [f64; 2], now: f64) -> Episode {
        Episode {
            pose,
            xy,
            since: now,
            inside_since: None,
        }
    }

    /// The episode's clock starts again at `now`.
    pub(crate) fn restart(&mut self, now: f64) {
        self.since = now;
        self.inside_since = None;
    }

    /// The tool's distance (m) from the target across the table.
    pub(crate) fn distance(&self, tool: [f64; 2]) -> f64 {
        (tool[0] - self.xy[0]).hypot(tool[1] - self.xy[1])
    }

    /// The tool is at `tool` (m) at `now` (s): the distance, and whether the episode is over.
    pub(crate) fn observe(&mut self, task: &SimTask, tool: [f64; 2], now: f64) -> (f64, Outcome) {
        let d = self.distance(tool);
        if d <= task.radius_m {
            let since = *self.inside_since.get_or_insert(now);
            if now - since >= task.hold_s {
                return (d, Outcome::Reached);
            }
        } else {
            self.inside_since = None;
        }
        if now - self.since >= task.timeout_s {
            return (d, Outcome::Missed);
        }
        (d, Outcome::Going)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::sim::demo_task;

    #[test]
    fn when_the_tool_stays_on_the_target_expect_reached_exactly_after_the_hold() {
        let task = demo_task();
        let mut e = Episode::new(JointVector::zeros(7), [0.4, 0.1], 0.0);
        let on = [0.4 + task.radius_m, 0.1]; // on the edge counts
        assert_eq!(e.observe(&task, on, 2.0).1, Outcome::Going);
        let before = 2.0 + task.hold_s - 1e-9;
        assert_eq!(e.observe(&task, on, before).1, Outcome::Going);
        let (d, outcome) = e.observe(&task, on, 2.0 + task.hold_s);
        assert_eq!(outcome, Outcome::Reached);
        assert!((d - task.radius_m).abs() < 1e-12);
    }

    #[test]
    fn when_the_tool_leaves_the_target_expect_the_hold_to_start_again() {
        let task = demo_task();
        let mut e = Episode::new(JointVector::zeros(7), [0.4, 0.1], 0.0);
        assert_eq!(e.observe(&task, [0.4, 0.1], 1.0).1, Outcome::Going);
        let off = [0.4 + task.radius_m + 1e-6, 0.1];
        assert_eq!(e.observe(&task, off, 1.5).1, Outcome::Going);
        assert_eq!(e.observe(&task, [0.4, 0.1], 1.6).1, Outcome::Going);
        // A hold from 1.0 would be over; the one from 1.6 is not.
        assert_eq!(
            e.observe(&task, [0.4, 0.1], 1.0 + task.hold_s + 0.1).1,
            Outcome::Going
        );
        assert_eq!(
            e.observe(&task, [0.4, 0.1], 1.6 + task.hold_s).1,
            Outcome::Reached
        );
    }

    #[test]
    fn when_the_timeout_passes_expect_missed_and_not_a_tick_before() {
        let task = demo_task();
        let mut e = Episode::new(JointVector::zeros(7), [0.4, 0.1], 3.0);
        e.restart(5.0);
        let far = [0.0, 0.0];
        assert_eq!(
            e.observe(&task, far, 5.0 + task.timeout_s - 1e-9).1,
            Outcome::Going
        );
        assert_eq!(
            e.observe(&task, far, 5.0 + task.timeout_s).1,
            Outcome::Missed
        );
    }

    #[test]
    fn when_targets_are_drawn_expect_reach_joints_at_one_fraction_and_the_same_sequence_per_seed() {
        let task = demo_task();
        let base = JointVector::from_slice(&[0.0, 0.3, 0.6, -0.4, 0.0, 0.0, 0.02]);
        let (mut a, mut b) = (Targets::new(7), Targets::new(7));
        for _ in 0..200 {
            let q = a.next(&task, &base);
            assert_eq!(q, b.next(&task, &base));
            let fraction =
                |r: &crate::config::sim_task::TaskJoint| (q[r.joint] - r.from) / (r.to - r.from);
            let f0 = fraction(&task.reach[0]);
            assert!((0.0..=1.0).contains(&f0), "{f0}");
            for r in &task.reach {
                assert!((fraction(r) - f0).abs() < 1e-9);
            }
            for s in &task.sweep {
                assert!(q[s.joint] >= s.from && q[s.joint] <= s.to);
            }
            // Joints the task does not set stay where the base has them.
            assert_eq!(q[6], 0.02);
        }
    }
}

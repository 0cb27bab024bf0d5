//! `[sim.task]`: the simulator's reaching task. It draws a target on the table in its cameras'
//! top-down view and moves it to a new place once the tool has held above it (or after a
//! timeout), so that a trained policy visibly does something and the status line can say how.

use super::check::Check;
use super::raw::RawSimTask;
use super::ConfigError;
use crate::joints::JointVector;
use crate::robot::{RobotLimits, Workspace};

/// One joint a target sets: its index in `robot.joints` and the range it is drawn from.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct TaskJoint {
    pub(crate) joint: usize,
    pub(crate) from: f64,
    pub(crate) to: f64,
}

impl TaskJoint {
    /// The joint's position `fraction` of the way from `from` to `to`.
    pub(crate) fn at(&self, fraction: f64) -> f64 {
        self.from + fraction * (self.to - self.from)
    }
}

#[derive(Clone, Debug)]
pub(crate) struct SimTask {
    pub(crate) seed: u64,
    /// Joints that move together, all at one fraction along their ranges: one arm pose for
    /// each spot on the table, so the camera's picture of the target tells the pose.
    pub(crate) reach: Vec<TaskJoint>,
    /// Joints drawn independently (the pan).
    pub(crate) sweep: Vec<TaskJoint>,
    pub(crate) radius_m: f64,
    pub(crate) hold_s: f64,
    pub(crate) timeout_s: f64,
    /// The table area the cameras see (m, base frame x and y): x grows up the image, y to the
    /// left, as a camera above the table looking down with the arm's base at the bottom sees.
    pub(crate) view_min: [f64; 2],
    pub(crate) view_max: [f64; 2],
    /// `[workspace]`: the base and tool links that place the tool.
    pub(crate) workspace: Workspace,
}

fn joints(
    c: &Check,
    section: &str,
    ranges: &std::collections::BTreeMap<String, [f64; 2]>,
    limits: &RobotLimits,
) -> Result<Vec<TaskJoint>, ConfigError> {
    let mut out = Vec::new();
    for (name, [from, to]) in ranges {
        let field = format!("sim.task.{section}.{name}");
        let Some(joint) = limits.joints.iter().position(|j| &j.name == name) else {
            return c.fail(&field, "no such joint in robot.joints");
        };
        let j = &limits.joints[joint];
        for v in [from, to] {
            if *v < j.lower || *v > j.upper {
                return c.fail(
                    &field,
                    format!(
                        "{v} is outside the joint's position limits (lower {}, upper {}: the URDF's, narrowed by [limits])",
                        j.lower, j.upper
                    ),
                );
            }
        }
        out.push(TaskJoint {
            joint,
            from: *from,
            to: *to,
        });
    }
    Ok(out)
}

pub(crate) fn validate(
    c: &Check,
    raw: &RawSimTask,
    limits: &RobotLimits,
    workspace: Option<&Workspace>,
    initial: &JointVector,
) -> Result<SimTask, ConfigError> {
    let Some(workspace) = workspace else {
        return c.fail(
            "sim.task",
            "needs a [workspace] section: its base_link and tool_link place the tool the target is reached with",
        );
    };
    let reach = joints(c, "reach", &raw.reach, limits)?;
    let sweep = joints(c, "sweep", &raw.sweep, limits)?;
    if reach.is_empty() && sweep.is_empty() {
        return c.fail(
            "sim.task",
            "lists no joint in `reach` or `sweep`: every target would be the same",
        );
    }
    if let Some(j) = reach
        .iter()
        .find(|r| sweep.iter().any(|s| s.joint == r.joint))
    {
        return c.fail(
            &format!("sim.task.sweep.{}", limits.joints[j.joint].name),
            "is also in sim.task.reach: a joint is either reached or swept",
        );
    }
    for i in 0..2 {
        if !(raw.view_min[i] < raw.view_max[i]) {
            return c.fail(
                "sim.task.view_min",
                format!(
                    "[{i}] = {} must be below sim.task.view_max[{i}] = {}",
                    raw.view_min[i], raw.view_max[i]
                ),
            );
        }
    }
    // The extreme targets (each range at either end) must lie where the cameras look.
    let corners = 1usize << sweep.len();
    for end in [0.0, 1.0] {
        for corner in 0..corners {
            let mut q = *initial;
            for r in &reach {
                q[r.joint] = r.at(end);
            }
            for (k, s) in sweep.iter().enumerate() {
                q[s.joint] = s.at((corner >> k & 1) as f64);
            }
            let p = workspace.chain.tool_position(q.as_slice());
            let xy = [p.x, p.y];
            if (0..2).any(|i| xy[i] < raw.view_min[i] || xy[i] > raw.view_max[i]) {
                let pose: Vec<String> = reach
                    .iter()
                    .chain(&sweep)
                    .map(|j| format!("{} {}", limits.joints[j.joint].name, q[j.joint]))
                    .collect();
                return c.fail(
                    "sim.task",
                    format!(
                        "the target at {} (the ends of sim.task.reach and sweep) puts the tool at x {:.3} m, y {:.3} m, outside the view (sim.task.view_min .. view_max)",
                        pose.join(", "),
                        p.x,
                        p.y
                    ),
                );
            }
        }
    }
    Ok(SimTask {
        seed: raw.seed,
        reach,
        sweep,
        radius_m: raw.radius_m,
        hold_s: raw.hold_s,
        timeout_s: raw.timeout_s,
        view_min: raw.view_min,
        view_max: raw.view_max,
        workspace: workspace.clone(),
    })
}

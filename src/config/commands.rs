//! `[[ros.commands]]`: the command outputs. Each is a subset of `robot.joints` with its own
//! topic, message type and rate (an arm to a joint_trajectory_controller, a gripper to a
//! position controller or gripper_action_controller's action); together they cover every joint
//! exactly once, since the governor moves every joint and a joint it moves must reach the robot.
//! Without the section, one output carries every joint (`ros.command_type` on
//! `ros.command_topic`).

use super::check::Check;
use super::raw::{RawCommandGroup, RawRos};
use super::ros::{topic_problem, CommandType};
use super::ConfigError;
use crate::robot::RobotLimits;

/// One command output.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct CommandGroup {
    /// Its joints, in the order the message lists them.
    pub joints: Vec<String>,
    /// Where each is in `robot.joints` (the governed command's order).
    pub indices: Vec<usize>,
    /// The topic, or the action's name for gripper_command.
    pub topic: String,
    pub kind: CommandType,
    /// At most this many messages a second (the control rate by default; for gripper_command
    /// goals, at most `GOAL_RATE_HZ`).
    pub rate_hz: f64,
    /// gripper_command: the effort each goal allows (N or N·m), the URDF's effort limit unless
    /// configured.
    pub max_effort: f64,
}

const DEFAULT_COMMAND_TOPIC: &str = "/arm_controller/joint_trajectory";

/// gripper_command's default goal rate: gripper_action_controller starts a goal handle and a
/// status timer for every goal (monitored at its `action_monitor_rate`, 20 Hz by default).
pub(crate) const GOAL_RATE_HZ: f64 = 20.0;

pub(crate) fn validate(
    c: &Check,
    r: &RawRos,
    limits: &RobotLimits,
    control_rate_hz: f64,
) -> Result<Vec<CommandGroup>, ConfigError> {
    let robot_joints: Vec<String> = limits.names().map(str::to_string).collect();
    let robot_joints = &robot_joints[..];
    if r.commands.is_empty() {
        let topic = r
            .command_topic
            .clone()
            .unwrap_or_else(|| DEFAULT_COMMAND_TOPIC.to_string());
        if let Some(why) = topic_problem(&topic) {
            return c.fail(
                "ros.command_topic",
                format!("\"{topic}\" is not a ROS topic name: it {why}"),
            );
        }
        let kind = r.command_type.unwrap_or(CommandType::JointTrajectory);
        let g = CommandGroup {
            joints: robot_joints.to_vec(),
            indices: (0..robot_joints.len()).collect(),
            topic,
            kind,
            rate_hz: default_rate(kind, control_rate_hz),
            max_effort: limits.joints.first().map_or(0.0, |j| j.effort),
        };
        kind_fits(c, "robot.joints", &g)?;
        return Ok(vec![g]);
    }
    for (field, given) in [
        ("ros.command_topic", r.command_topic.is_some()),
        ("ros.command_type", r.command_type.is_some()),
    ] {
        if given {
            return c.fail(
                field,
                "give either ros.command_topic and ros.command_type (one output for every joint) or [[ros.commands]], not both",
            );
        }
    }
    let mut owner: Vec<Option<usize>> = vec![None; robot_joints.len()];
    let mut out = Vec::with_capacity(r.commands.len());
    for (g, raw) in r.commands.iter().enumerate() {
        out.push(group(c, g, raw, limits, control_rate_hz, &mut owner)?);
        kind_fits(c, &format!("ros.commands[{g}].joints"), &out[g])?;
        let topic = &raw.topic;
        if let Some(h) = r.commands[..g].iter().position(|o| o.topic == *topic) {
            return c.fail(
                &format!("ros.commands[{g}].topic"),
                format!("\"{topic}\" is ros.commands[{h}]'s topic too"),
            );
        }
    }
    if let Some(j) = owner.iter().position(Option::is_none) {
        return c.fail(
            "ros.commands",
            format!(
                "joint `{}` is in no command group: every joint the governor moves must be commanded",
                robot_joints[j]
            ),
        );
    }
    Ok(out)
}

/// The rate an output without `rate_hz` sends at.
fn default_rate(kind: CommandType, control_rate_hz: f64) -> f64 {
    match kind {
        CommandType::GripperCommand => GOAL_RATE_HZ.min(control_rate_hz),
        _ => control_rate_hz,
    }
}

/// Whether `g`'s message type can carry its joints.
fn kind_fits(c: &Check, joints_field: &str, g: &CommandGroup) -> Result<(), ConfigError> {
    if g.kind != CommandType::GripperCommand {
        return Ok(());
    }
    if g.joints.len() != 1 {
        return c.fail(
            joints_field,
            format!(
                "a gripper_command goal carries one joint, found {} ({})",
                g.joints.len(),
                g.joints.join(", ")
            ),
        );
    }
    Ok(())
}

fn group(
    c: &Check,
    g: usize,
    raw: &RawCommandGroup,
    limits: &RobotLimits,
    control_rate_hz: f64,
    owner: &mut [Option<usize>],
) -> Result<CommandGroup, ConfigError> {
    let robot_joints: Vec<&str> = limits.names().collect();
    let field = |f: &str| format!("ros.commands[{g}].{f}");
    if raw.joints.is_empty() {
        return c.fail(&field("joints"), "expected at least one joint");
    }
    let mut indices = Vec::with_capacity(raw.joints.len());
    for name in &raw.joints {
        let Some(j) = robot_joints.iter().position(|n| n == name) else {
            return c.fail(
                &field("joints"),
                format!("joint `{name}` is not in robot.joints"),
            );
        };
        if let Some(h) = owner[j] {
            let other = if h == g {
                "listed twice here".to_string()
            } else {
                format!("also in ros.commands[{h}]")
            };
            return c.fail(&field("joints"), format!("joint `{name}` is {other}"));
        }
        owner[j] = Some(g);
        indices.push(j);
    }
    if let Some(why) = topic_problem(&raw.topic) {
        return c.fail(
            &field("topic"),
            format!("\"{}\" is not a ROS topic name: it {why}", raw.topic),
        );
    }
    let rate_hz = match raw.rate_hz {
        None => default_rate(raw.kind, control_rate_hz),
        Some(r) if r <= control_rate_hz => r,
        Some(r) => {
            return c.fail(
                &field("rate_hz"),
                format!("expected at most the control rate ({control_rate_hz} Hz), found {r}"),
            )
        }
    };
    let max_effort = match raw.max_effort {
        None => limits.joints[indices[0]].effort,
        Some(_) if raw.kind != CommandType::GripperCommand => {
            return c.fail(
                &field("max_effort"),
                format!(
                    "only gripper_command goals carry an effort; this output is {}",
                    raw.kind.name()
                ),
            )
        }
        // Within its range (`ranges::RANGES`).
        Some(e) => e,
    };
    Ok(CommandGroup {
        joints: raw.joints.clone(),
        indices,
        topic: raw.topic.clone(),
        kind: raw.kind,
        rate_hz,
        max_effort,
    })
}

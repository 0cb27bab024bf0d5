//! What `pi0d check` prints about a configuration that loads: the lines a person reads to see
//! what `run` would do with it (rates, limits with their units, where the model comes from,
//! every topic read and written with its message type).

use std::path::Path;

use super::ros::{CommandType, RosConfig};
use super::{Config, Io, PolicySource};
use crate::robot::JointKind;

/// Where a pi0 checkpoint comes from, as far as `pi0d check` can tell.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Provenance {
    /// The repository's `models/tiny-pi0`: random weights, for plumbing only.
    BundledTestModel,
    /// Anything else: taken to be trained weights.
    Checkpoint,
}

/// The file that marks the bundled random-weight test model (`models/tiny-pi0`).
pub(crate) const TEST_MODEL_MARKER: &str = "RANDOM_WEIGHTS";

/// `checkpoint`'s provenance: the bundled test model carries `TEST_MODEL_MARKER` beside its
/// config.json (a bare .safetensors file looks in its directory).
pub(crate) fn provenance(checkpoint: &Path) -> Provenance {
    let dir = if checkpoint.is_dir() {
        checkpoint
    } else {
        checkpoint.parent().unwrap_or(Path::new("."))
    };
    if dir.join(TEST_MODEL_MARKER).is_file() {
        Provenance::BundledTestModel
    } else {
        Provenance::Checkpoint
    }
}

/// The unit of a joint's position (its limits' rows are this, per s, s², s³).
fn position_unit(kind: JointKind) -> &'static str {
    match kind {
        JointKind::Prismatic => "m",
        JointKind::Revolute | JointKind::Continuous => "rad",
    }
}

/// The ROS message type a command output publishes.
fn command_type(kind: CommandType) -> &'static str {
    match kind {
        CommandType::JointTrajectory => "trajectory_msgs/msg/JointTrajectory",
        CommandType::Float64MultiArray => "std_msgs/msg/Float64MultiArray",
        CommandType::JointState => "sensor_msgs/msg/JointState",
        CommandType::GripperCommand => "control_msgs/action/GripperCommand",
    }
}

/// A camera topic's type: image_transport's `.../compressed` is a CompressedImage.
fn camera_type(topic: &str) -> &'static str {
    if topic.ends_with("/compressed") {
        "sensor_msgs/msg/CompressedImage"
    } else {
        "sensor_msgs/msg/Image"
    }
}

/// The limits table: a header naming the units, then a row per joint with its own.
fn limits_table(cfg: &Config, out: &mut Vec<String>) {
    if cfg.limits.scale < 1.0 {
        out.push(format!(
            "limits: scaled to {} of every velocity, acceleration and jerk limit (limits.scale; the table shows the scaled values)",
            cfg.limits.scale
        ));
    }
    out.push(
        "limits in each joint's unit: position (lower, upper, max_step: the farthest a target may be from the measured position) in rad (revolute, continuous) or m (prismatic); vel per s, acc per s², jerk per s³"
            .to_string(),
    );
    out.push(format!(
        "{:<20} {:<10} {:>9} {:>9} {:>8} {:>8} {:>8} {:>8}  {}",
        "joint", "kind", "lower", "upper", "vel", "acc", "jerk", "max_step", "units"
    ));
    for j in &cfg.limits.joints {
        let u = position_unit(j.kind);
        out.push(format!(
            "{:<20} {:<10} {:>9.4} {:>9.4} {:>8.3} {:>8.2} {:>8.1} {:>8.3}  {u}, {u}/s, {u}/s², {u}/s³",
            j.name,
            format!("{:?}", j.kind).to_lowercase(),
            j.lower,
            j.upper,
            j.velocity,
            j.acceleration,
            j.jerk,
            j.max_step
        ));
    }
}

/// Where the policy's weights come from.
fn model_line(source: &PolicySource) -> Option<String> {
    let PolicySource::Pi0 { checkpoint, .. } = source else {
        return None;
    };
    Some(match provenance(checkpoint) {
        Provenance::BundledTestModel => format!(
            "model: {} is the bundled test model with RANDOM weights ({TEST_MODEL_MARKER} in it): the whole pipeline runs, but the arm performs no task; set policy.checkpoint to a trained checkpoint for real work",
            checkpoint.display()
        ),
        Provenance::Checkpoint => format!(
            "model: checkpoint {} (not the bundled random-weight test model)",
            checkpoint.display()
        ),
    })
}

/// Every topic a ROS configuration reads and writes, with its message type.
fn ros_topics(r: &RosConfig, out: &mut Vec<String>) {
    out.push(format!(
        "input:  joint states on {} (sensor_msgs/msg/JointState)",
        r.joint_states
    ));
    for (i, cam) in r.cameras.iter().enumerate() {
        let name = match r.camera_names.get(i) {
            Some(Some(n)) => format!("camera `{n}`"),
            _ => format!("camera {i}"),
        };
        out.push(format!("input:  {name} on {cam} ({})", camera_type(cam)));
    }
    out.push(format!(
        "input:  prompt on {} (std_msgs/msg/String)",
        r.prompt
    ));
    out.push(format!(
        "input:  e-stop on {} (std_msgs/msg/Bool, true stops)",
        r.estop
    ));
    out.push(format!(
        "input:  reset on {} (std_msgs/msg/Bool) and the service {} (std_srvs/srv/Trigger)",
        r.reset, r.reset_service
    ));
    for g in &r.commands {
        let kind = match g.kind {
            CommandType::GripperCommand => format!(
                "GripperCommand goals (max_effort {}, sent when the target moves)",
                g.max_effort
            ),
            k => format!("{k:?}"),
        };
        out.push(format!(
            "output: commands for {} as {kind} on {} at {} Hz ({}; dry run: {})",
            g.joints.join(", "),
            r.command_out(g),
            g.rate_hz,
            command_type(g.kind),
            r.shadow_topic(g),
        ));
    }
    out.push(format!(
        "output: status on {} (std_msgs/msg/String), diagnostics on {} (diagnostic_msgs/msg/DiagnosticArray)",
        r.status_topic, r.diagnostics_topic
    ));
}

/// What `pi0d check` prints about `cfg`, a line each (the verdict and the policy's own check
/// follow it).
pub fn describe(cfg: &Config) -> Vec<String> {
    let mut out = vec![
        format!("config: {}", cfg.file.display()),
        format!("urdf:   {}", cfg.urdf.display()),
        format!(
            "control: {} Hz, {:?} interpolation, {:?} merge, blend {} s, request at {} s left, start within {} s",
            cfg.control.rate_hz,
            cfg.control.interpolation,
            cfg.control.merge,
            cfg.control.blend_window_s,
            cfg.control.request_threshold_s,
            cfg.control.start_timeout_s,
        ),
        format!(
            "watchdogs: joint state {} s, camera {} s, overrun streak {}",
            cfg.safety.joint_state_timeout_s,
            cfg.safety.camera_timeout_s,
            cfg.safety.overrun_streak
        ),
    ];
    limits_table(cfg, &mut out);
    out.push(format!(
        "policy: {}; {} steps x {} s; actions -> joints: {}",
        cfg.policy.source.describe(),
        cfg.policy.chunk_steps,
        cfg.policy.step_period_s,
        cfg.policy.action_map.action_names.join(", ")
    ));
    out.extend(model_line(&cfg.policy.source));
    let rtc = &cfg.control.rtc;
    if rtc.enabled {
        out.push(format!(
            "real-time chunking: {} schedule, guidance up to {}, horizon {} steps, delay {}",
            rtc.settings.schedule,
            rtc.settings.max_guidance_weight,
            rtc.execution_horizon,
            rtc.inference_delay_steps
                .map_or("measured".to_string(), |d| format!("{d} steps"))
        ));
    }
    if let Some(w) = &cfg.workspace {
        out.push(format!(
            "workspace: {} in {} within {:?} .. {:?}",
            w.chain.tool_link, w.chain.base_link, w.min, w.max
        ));
    }
    match &cfg.io {
        Io::Sim => {
            out.push(format!("io: sim, {} camera(s)", cfg.sim.cameras.len()));
            if let Some(t) = &cfg.sim.task {
                out.push(format!(
                    "sim task: the cameras show a red target on the table; reached when the tool's centre stays within {:.0} mm of it for {} s, missed after {} s, then the next one (the status line and the summary's `sim_task` say how it goes)",
                    t.radius_m * 1e3,
                    t.hold_s,
                    t.timeout_s
                ));
            }
        }
        Io::Ros(r) => {
            out.push(format!(
                "io: ros ({:?}), node {}/{}, {} camera(s)",
                r.middleware,
                r.namespace.trim_end_matches('/'),
                r.node,
                r.cameras.len(),
            ));
            ros_topics(r, &mut out);
            if r.sends_trajectories() {
                out.push(format!(
                    "trajectories: stamp 0 (start on receipt), points on the command's course (due +{:.4} s) for {} s, then braking to rest within the limits",
                    cfg.control.period.as_secs_f64(),
                    r.trajectory_coast_s
                ));
            }
        }
    }
    for w in &cfg.warnings {
        out.push(format!("warning: {w}"));
    }
    out
}

#[cfg(test)]
#[path = "describe_tests.rs"]
mod tests;

//! `[ros]`: the ROS 2 node, its topics and QoS. Names follow rcl's rules (`rmw_validate_*`), so a
//! name the middleware would refuse is refused here, by `pi0d check`, not at run time.

use std::path::PathBuf;

use serde::Deserialize;

use super::check::Check;
use super::commands::CommandGroup;
use super::raw::{RawCameras, RawQos, RawRos, Reliability};
use super::ConfigError;

/// Reliability and keep-last depth of a topic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct TopicQos {
    pub(crate) reliable: bool,
    pub(crate) depth: usize,
}

/// QoS per kind of topic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RosQos {
    /// Joint states in (default best effort, keep last 1, as drivers publish them).
    pub(crate) joint_states: TopicQos,
    /// Camera frames in (default best effort, keep last 1).
    pub(crate) cameras: TopicQos,
    /// Prompt, e-stop and reset in, and the reset service (default reliable, 10).
    pub(crate) inputs: TopicQos,
    /// Joint commands out (default reliable, 10).
    pub(crate) commands: TopicQos,
    /// Status and diagnostics out (default reliable, 10).
    pub(crate) status: TopicQos,
}

/// The ROS 2 middleware pi0d speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Middleware {
    /// DDS (RTPS), interoperating with Fast DDS and Cyclone DDS nodes.
    Dds,
    /// Zenoh with rmw_zenoh's key expressions, attachments and liveliness tokens.
    Zenoh,
}

/// How requests and replies are laid on DDS.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum ServiceMappingKind {
    Basic,
    /// Fast DDS (the ROS 2 default RMW).
    Enhanced,
    Cyclone,
}

/// The message commands are published as.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum CommandType {
    /// trajectory_msgs/JointTrajectory, one point (joint_trajectory_controller).
    JointTrajectory,
    /// std_msgs/Float64MultiArray of positions in robot.joints order (forward_command_controller).
    #[serde(rename = "float64_multi_array")]
    Float64MultiArray,
    /// sensor_msgs/JointState with positions and velocities.
    JointState,
    /// control_msgs/action/GripperCommand goals (gripper_action_controller's
    /// `<controller>/gripper_cmd`): one joint's position and the effort it may use. Every goal
    /// preempts the one before, so the newest position is the gripper's target.
    GripperCommand,
}

impl CommandType {
    /// Its name in the configuration.
    pub(crate) fn name(self) -> &'static str {
        match self {
            CommandType::JointTrajectory => "joint_trajectory",
            CommandType::Float64MultiArray => "float64_multi_array",
            CommandType::JointState => "joint_state",
            CommandType::GripperCommand => "gripper_command",
        }
    }
}

#[derive(Clone, Debug)]
pub(crate) struct RosConfig {
    pub(crate) domain_id: u16,
    pub node: String,
    pub namespace: String,
    /// Keep DDS traffic on 127.0.0.1 (tests, single-machine setups).
    pub(crate) loopback_only: bool,
    pub(crate) joint_states: String,
    /// sensor_msgs/Image (or CompressedImage) topics, one per camera slot.
    pub cameras: Vec<String>,
    /// Per slot: the model camera it feeds (`ros.cameras` as a table), or `None` (a list,
    /// matched by position).
    pub(crate) camera_names: Vec<Option<String>>,
    pub(crate) prompt: String,
    pub(crate) estop: String,
    pub(crate) reset: String,
    /// std_srvs/Trigger service that requests a reset.
    pub(crate) reset_service: String,
    pub(crate) service_mapping: ServiceMappingKind,
    /// The command outputs; together they carry every joint once.
    pub commands: Vec<CommandGroup>,
    /// joint_trajectory: the command's velocity is held this long before the braking tail.
    pub trajectory_coast_s: f64,
    /// A dry run publishes each output on this prefix + its topic.
    pub(crate) dry_run_prefix: String,
    /// Set by `pi0d run --dry-run`: commands go to the shadow topics, never to the robot's.
    pub(crate) dry_run: bool,
    pub(crate) status_topic: String,
    pub(crate) diagnostics_topic: String,
    pub(crate) max_image_bytes: usize,
    pub middleware: Middleware,
    // The zenoh_* fields are read by the Zenoh transport alone, built with the `zenoh` feature.
    /// Zenoh session configuration (JSON5), as rmw_zenoh's ZENOH_SESSION_CONFIG_URI.
    #[cfg_attr(not(feature = "zenoh"), allow(dead_code))]
    pub(crate) zenoh_config: Option<PathBuf>,
    /// Zenoh endpoints to connect to (e.g. the router `tcp/localhost:7447`) and listen on.
    #[cfg_attr(not(feature = "zenoh"), allow(dead_code))]
    pub(crate) zenoh_connect: Vec<String>,
    #[cfg_attr(not(feature = "zenoh"), allow(dead_code))]
    pub(crate) zenoh_listen: Vec<String>,
    /// Whether keys and liveliness tokens carry REP-2016 type hashes (rmw_zenoh on Jazzy and
    /// newer) or `TypeHashNotSupported` in their place (rmw_zenoh on Humble).
    #[cfg_attr(not(feature = "zenoh"), allow(dead_code))]
    pub(crate) zenoh_type_hashes: bool,
    /// Whether the session may scout by multicast (any Zenoh peer on the network finds it).
    #[cfg_attr(not(feature = "zenoh"), allow(dead_code))]
    pub(crate) zenoh_multicast_scouting: bool,
    pub(crate) qos: RosQos,
}

/// Ten periods at 200 Hz: a late or lost message or two does not slow the arm.
const DEFAULT_COAST_S: f64 = 0.05;

impl RosConfig {
    /// Where `group`'s commands are published: its shadow topic in a dry run.
    pub(crate) fn command_out(&self, group: &CommandGroup) -> String {
        if self.dry_run {
            self.shadow_topic(group)
        } else {
            group.topic.clone()
        }
    }

    pub(crate) fn shadow_topic(&self, group: &CommandGroup) -> String {
        format!("{}{}", self.dry_run_prefix, group.topic)
    }

    /// Whether any output sends JointTrajectory.
    pub(crate) fn sends_trajectories(&self) -> bool {
        self.commands
            .iter()
            .any(|g| g.kind == CommandType::JointTrajectory)
    }
}

/// rcl's limit on node names and on fully qualified topic names (less the DDS prefix).
const MAX_NAME: usize = 255;

/// Why `token` (between slashes) is not a valid ROS name token, if it is not.
fn bad_token(token: &str) -> Option<&'static str> {
    match token.chars().next() {
        None => Some("has an empty part (`//` or a trailing `/`)"),
        Some(c) if c.is_ascii_digit() => Some("has a part starting with a digit"),
        _ if !token.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') => {
            Some("may only hold letters, digits, `_` and `/`")
        }
        _ => None,
    }
}

/// rcl's node-name rule: `[A-Za-z_][A-Za-z0-9_]*`, at most 255 characters.
pub(crate) fn node_name_problem(name: &str) -> Option<&'static str> {
    if name.len() > MAX_NAME {
        return Some("is longer than 255 characters");
    }
    if name.contains('/') {
        return Some("may not contain `/` (put the path in ros.namespace)");
    }
    bad_token(name)
}

/// rcl's namespace rule: absolute, `/` alone or tokens joined by `/`, no trailing `/`.
pub(crate) fn namespace_problem(ns: &str) -> Option<&'static str> {
    if !ns.starts_with('/') {
        return Some("must be absolute (start with `/`)");
    }
    if ns == "/" {
        return None;
    }
    if ns.len() > MAX_NAME {
        return Some("is longer than 255 characters");
    }
    ns[1..].split('/').find_map(bad_token)
}

/// rcl's rule for a fully qualified topic or service name.
pub(crate) fn topic_problem(topic: &str) -> Option<&'static str> {
    if !topic.starts_with('/') {
        return Some("must be absolute (start with `/`)");
    }
    if topic.len() > MAX_NAME {
        return Some("is longer than 255 characters");
    }
    topic[1..].split('/').find_map(bad_token)
}

pub(crate) fn validate(
    c: &Check,
    r: &RawRos,
    limits: &crate::robot::RobotLimits,
    control_rate_hz: f64,
) -> Result<RosConfig, ConfigError> {
    let domain_id = match r.domain_id {
        Some(d) => d,
        None => match std::env::var("ROS_DOMAIN_ID") {
            Ok(v) => match v.trim().parse::<u16>() {
                Ok(d) if d <= 232 => d,
                _ => {
                    return c.fail(
                        "ros.domain_id",
                        format!("ROS_DOMAIN_ID is \"{v}\", expected 0 to 232"),
                    )
                }
            },
            Err(_) => 0,
        },
    };
    if let Some(why) = node_name_problem(&r.node) {
        return c.fail(
            "ros.node",
            format!("\"{}\" is not a ROS node name: it {why}", r.node),
        );
    }
    if let Some(why) = namespace_problem(&r.namespace) {
        return c.fail(
            "ros.namespace",
            format!("\"{}\" is not a ROS namespace: it {why}", r.namespace),
        );
    }
    let commands = super::commands::validate(c, r, limits, control_rate_hz)?;
    let dry_run_prefix = r
        .dry_run_prefix
        .clone()
        .unwrap_or_else(|| "/pi0d/dry_run".into());
    if dry_run_prefix == "/" {
        return c.fail(
            "ros.dry_run_prefix",
            "\"/\" would put a dry run's commands on the robot's own topics",
        );
    }
    if let Some(why) = namespace_problem(&dry_run_prefix) {
        return c.fail(
            "ros.dry_run_prefix",
            format!("\"{dry_run_prefix}\" is not a ROS namespace: it {why}"),
        );
    }
    let trajectory_coast_s = match r.trajectory_coast_s {
        Some(s) => s,
        None => DEFAULT_COAST_S,
    };
    c.unused(
        "ros.trajectory_coast_s",
        r.trajectory_coast_s.is_some()
            && !commands
                .iter()
                .any(|g| g.kind == CommandType::JointTrajectory),
        "only joint_trajectory outputs use it",
    );
    let topics = [
        ("ros.joint_states", &r.joint_states),
        ("ros.prompt", &r.prompt),
        ("ros.estop", &r.estop),
        ("ros.reset", &r.reset),
        ("ros.reset_service", &r.reset_service),
        ("ros.status_topic", &r.status_topic),
        ("ros.diagnostics_topic", &r.diagnostics_topic),
    ];
    let (camera_fields, camera_topics, camera_names): (
        Vec<String>,
        Vec<String>,
        Vec<Option<String>>,
    ) = match &r.cameras {
        RawCameras::Ordered(list) => (
            (0..list.len())
                .map(|i| format!("ros.cameras[{i}]"))
                .collect(),
            list.clone(),
            vec![None; list.len()],
        ),
        RawCameras::Named(map) => (
            map.keys().map(|k| format!("ros.cameras.{k}")).collect(),
            map.values().cloned().collect(),
            map.keys().cloned().map(Some).collect(),
        ),
    };
    let cameras = camera_fields.iter().cloned().zip(camera_topics.iter());
    for (field, t) in topics
        .iter()
        .map(|(f, t)| (f.to_string(), *t))
        .chain(cameras)
    {
        if let Some(why) = topic_problem(t) {
            return c.fail(&field, format!("\"{t}\" is not a ROS topic name: it {why}"));
        }
    }
    if camera_topics.len() > super::MAX_CAMERAS {
        return c.fail(
            "ros.cameras",
            format!(
                "{} cameras; pi0d takes at most {} (no pi0 or pi0.5 has more than a few)",
                camera_topics.len(),
                super::MAX_CAMERAS
            ),
        );
    }
    for (i, t) in camera_topics.iter().enumerate() {
        if camera_topics[..i].contains(t) {
            return c.fail(&camera_fields[i], format!("topic \"{t}\" is listed twice"));
        }
    }
    let zenoh = r.middleware == Middleware::Zenoh;
    for (field, given) in [
        ("ros.zenoh_config", r.zenoh_config.is_some()),
        ("ros.zenoh_connect", !r.zenoh_connect.is_empty()),
        ("ros.zenoh_listen", !r.zenoh_listen.is_empty()),
        ("ros.zenoh_type_hashes", r.zenoh_type_hashes.is_some()),
        (
            "ros.zenoh_multicast_scouting",
            r.zenoh_multicast_scouting.is_some(),
        ),
    ] {
        c.unused(
            field,
            given && !zenoh,
            "only ros.middleware = \"zenoh\" uses it",
        );
    }
    c.unused(
        "ros.service_mapping",
        r.service_mapping != ServiceMappingKind::Enhanced && zenoh,
        "only DDS lays out services this way",
    );
    if zenoh && !cfg!(feature = "zenoh") {
        return c.fail(
            "ros.middleware",
            "\"zenoh\" needs pi0d built with the `zenoh` feature (cargo build --features zenoh)",
        );
    }
    Ok(RosConfig {
        domain_id,
        node: r.node.clone(),
        namespace: r.namespace.clone(),
        loopback_only: r.loopback_only,
        joint_states: r.joint_states.clone(),
        cameras: camera_topics,
        camera_names,
        prompt: r.prompt.clone(),
        estop: r.estop.clone(),
        reset: r.reset.clone(),
        reset_service: r.reset_service.clone(),
        service_mapping: r.service_mapping,
        commands,
        trajectory_coast_s,
        dry_run_prefix,
        dry_run: false,
        status_topic: r.status_topic.clone(),
        diagnostics_topic: r.diagnostics_topic.clone(),
        max_image_bytes: r.max_image_bytes,
        middleware: r.middleware,
        zenoh_config: r.zenoh_config.as_ref().map(|p| c.resolve(p)),
        zenoh_connect: zenoh_endpoints(c, "ros.zenoh_connect", &r.zenoh_connect)?,
        zenoh_listen: zenoh_endpoints(c, "ros.zenoh_listen", &r.zenoh_listen)?,
        zenoh_type_hashes: r.zenoh_type_hashes.unwrap_or(true),
        zenoh_multicast_scouting: r.zenoh_multicast_scouting.unwrap_or(false),
        qos: RosQos {
            joint_states: topic_qos(r.qos.joint_states.as_ref(), false, 1),
            cameras: topic_qos(r.qos.cameras.as_ref(), false, 1),
            inputs: topic_qos(r.qos.inputs.as_ref(), true, 10),
            commands: topic_qos(r.qos.commands.as_ref(), true, 10),
            status: topic_qos(r.qos.status.as_ref(), true, 10),
        },
    })
}

/// `[ros.qos.<kind>]` over its defaults (the depth within its range, `ranges::RANGES`).
fn topic_qos(raw: Option<&RawQos>, reliable: bool, depth: usize) -> TopicQos {
    let Some(raw) = raw else {
        return TopicQos { reliable, depth };
    };
    TopicQos {
        reliable: match raw.reliability {
            None => reliable,
            Some(r) => r == Reliability::Reliable,
        },
        depth: raw.depth.unwrap_or(depth),
    }
}

/// Zenoh locators: `<protocol>/<address>`, e.g. `tcp/127.0.0.1:7447`.
fn zenoh_endpoints(c: &Check, field: &str, list: &[String]) -> Result<Vec<String>, ConfigError> {
    for e in list {
        let ok = matches!(e.split_once('/'), Some((proto, addr))
            if ["tcp", "udp", "tls", "quic", "unixsock-stream", "ws"].contains(&proto) && !addr.is_empty());
        if !ok {
            return c.fail(
                field,
                format!("\"{e}\" is not a Zenoh locator such as \"tcp/127.0.0.1:7447\""),
            );
        }
    }
    Ok(list.to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn when_names_break_rcl_rules_expect_reason() {
        assert_eq!(node_name_problem("pi0d_arm2"), None);
        assert!(node_name_problem("").is_some());
        assert!(node_name_problem("2arm").is_some());
        assert!(node_name_problem("arm-1").is_some());
        assert!(node_name_problem("a/b").is_some());
        assert_eq!(namespace_problem("/"), None);
        assert_eq!(namespace_problem("/left/arm"), None);
        for bad in ["left", "/left/", "//x", "/1x", "/a b"] {
            assert!(namespace_problem(bad).is_some(), "{bad}");
        }
        assert_eq!(topic_problem("/arm_controller/joint_trajectory"), None);
        for bad in [
            "joint_states",
            "/",
            "/a//b",
            "/a/",
            "/cam/1image",
            "/cam-1",
            "/~/x",
        ] {
            assert!(topic_problem(bad).is_some(), "{bad}");
        }
    }
}

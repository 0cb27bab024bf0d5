//! Validated configuration: the raw TOML (see `raw`) checked field by field into typed values.
//! Every error names the file, the field and what was expected; checks are written so NaN fails.

pub mod raw;
pub mod ros_args;

use crate::policy::graph::acl::AclOptions;
use crate::policy::graph::provider::{ExecutionProvider, OnnxOptions, CANN_PRECISION_MODES};
use crate::policy::pi0::pipeline::BackendOptions;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::joints::{ActionMap, JointVector, MAX_JOINTS};
use crate::robot::urdf::{self, UrdfError};
use crate::robot::{JointKind, JointLimits, KinematicChain, RobotLimits, SoftLimit};
use raw::RawConfig;

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{file}: cannot read: {source}")]
    Io {
        file: PathBuf,
        source: std::io::Error,
    },
    #[error("{file}: {message}")]
    Parse { file: PathBuf, message: String },
    #[error("{file}: `{field}`: {message}")]
    Invalid {
        file: PathBuf,
        field: String,
        message: String,
    },
    #[error(transparent)]
    Urdf(#[from] UrdfError),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Interpolation {
    Linear,
    Cubic,
    Quintic,
}

/// How a newly arrived chunk takes over from the one being executed.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum MergeMode {
    /// New chunk's targets, reached from the current commanded state through a C2 blend.
    Blend,
    /// New chunk's targets at once; only the shortest C2 transition (two control periods).
    LatestOnly,
    /// LeRobot-style: overlapping steps are `old_weight * old + (1 - old_weight) * new`, then blended.
    WeightedAverage { old_weight: f64 },
}

#[derive(Clone, Debug)]
pub struct ControlConfig {
    pub rate_hz: f64,
    pub period: Duration,
    pub interpolation: Interpolation,
    pub merge: MergeMode,
    pub blend_window_s: f64,
    pub request_threshold_s: f64,
    pub warmup_chunks: u32,
    pub status_interval_s: f64,
    pub stop_timeout_s: f64,
}

#[derive(Clone, Debug)]
pub struct SafetyConfig {
    pub joint_state_timeout_s: f64,
    pub camera_timeout_s: f64,
    pub overrun_streak: u32,
    /// A chunk target further than this outside a joint's limits rejects the whole chunk.
    pub chunk_position_tolerance: f64,
    /// A chunk whose consecutive steps move a joint faster than this multiple of its velocity
    /// limit is rejected as a jump.
    pub chunk_step_velocity_factor: f64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultKind {
    Nan,
    Inf,
    Jump,
    Slow,
    Panic,
    Error,
}

#[derive(Clone, Debug)]
pub struct FaultConfig {
    pub kind: FaultKind,
    /// Chunks produced normally before the fault starts.
    pub after_chunks: u32,
    /// Faulty chunks in a row; 0 means forever.
    pub count: u32,
    pub latency_s: f64,
}

#[derive(Clone, Debug)]
pub enum PolicySource {
    /// Smooth sinusoids around the start position.
    Scripted { amplitude: f64, frequency_hz: f64 },
    /// Chunks read from a JSON file, replayed in a loop.
    Replay { file: PathBuf },
    /// The pi0 / pi0.5 model, on the CPU or as exported graphs.
    Pi0 {
        checkpoint: PathBuf,
        arch: Option<PathBuf>,
        tokenizer: Option<PathBuf>,
        threads: usize,
        seed: u64,
        backend: BackendOptions,
    },
}

#[derive(Clone, Debug)]
pub struct PolicyConfig {
    pub source: PolicySource,
    pub action_map: ActionMap,
    pub chunk_steps: usize,
    pub step_period_s: f64,
    /// Extra latency added to every inference (simulates a slower model).
    pub latency_s: f64,
    /// The task prompt until one arrives from outside.
    pub prompt: String,
    pub fault: Option<FaultConfig>,
}

#[derive(Clone, Debug)]
pub struct CameraConfig {
    pub name: String,
    pub width: u32,
    pub height: u32,
    pub fps: f64,
}

#[derive(Clone, Debug, PartialEq)]
pub enum SimEventKind {
    EStop,
    Reset,
    StallJointStates { duration_s: f64 },
    StallCamera { camera: usize, duration_s: f64 },
}

#[derive(Clone, Debug)]
pub struct SimEvent {
    pub at_s: f64,
    pub kind: SimEventKind,
}

#[derive(Clone, Debug)]
pub struct SimConfig {
    pub tau_s: f64,
    pub measurement_delay_s: f64,
    pub rate_hz: f64,
    pub initial_position: JointVector,
    pub cameras: Vec<CameraConfig>,
    pub events: Vec<SimEvent>,
}

/// What the daemon commands: the simulated arm, or a robot over ROS 2.
#[derive(Clone, Debug)]
pub enum Io {
    Sim,
    Ros(Box<RosConfig>),
}

/// Reliability and keep-last depth of a topic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TopicQos {
    pub reliable: bool,
    pub depth: usize,
}

/// QoS per kind of topic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RosQos {
    /// Joint states in (default best effort, keep last 1, as drivers publish them).
    pub joint_states: TopicQos,
    /// Camera frames in (default best effort, keep last 1).
    pub cameras: TopicQos,
    /// Prompt, e-stop and reset in, and the reset service (default reliable, 10).
    pub inputs: TopicQos,
    /// Joint commands out (default reliable, 10).
    pub commands: TopicQos,
    /// Status and diagnostics out (default reliable, 10).
    pub status: TopicQos,
}

/// The ROS 2 middleware pi0d speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Middleware {
    /// DDS (RTPS), interoperating with Fast DDS and Cyclone DDS nodes.
    Dds,
    /// Zenoh with rmw_zenoh's key expressions, attachments and liveliness tokens.
    Zenoh,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ServiceMappingKind {
    Basic,
    Enhanced,
    Cyclone,
}

/// The message commands are published as.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CommandType {
    /// trajectory_msgs/JointTrajectory, one point (joint_trajectory_controller).
    JointTrajectory,
    /// std_msgs/Float64MultiArray of positions in robot.joints order (forward_command_controller).
    Float64MultiArray,
    /// sensor_msgs/JointState with positions and velocities.
    JointState,
}

#[derive(Clone, Debug)]
pub struct RosConfig {
    pub domain_id: u16,
    pub node: String,
    pub namespace: String,
    /// Keep DDS traffic on 127.0.0.1 (tests, single-machine setups).
    pub loopback_only: bool,
    pub joint_states: String,
    /// sensor_msgs/Image topics, in the policy's camera order.
    pub cameras: Vec<String>,
    pub prompt: String,
    pub estop: String,
    pub reset: String,
    /// std_srvs/Trigger service that requests a reset.
    pub reset_service: String,
    /// How requests and replies are laid on DDS: Fast DDS ("enhanced", the ROS 2 default RMW)
    /// or Cyclone DDS ("cyclone").
    pub service_mapping: ServiceMappingKind,
    pub command_type: CommandType,
    pub command_topic: String,
    pub status_topic: String,
    pub diagnostics_topic: String,
    pub max_image_bytes: usize,
    pub middleware: Middleware,
    /// Zenoh session configuration (JSON5), as rmw_zenoh's ZENOH_SESSION_CONFIG_URI.
    pub zenoh_config: Option<PathBuf>,
    /// Zenoh endpoints to connect to (e.g. the router `tcp/localhost:7447`) and listen on.
    pub zenoh_connect: Vec<String>,
    pub zenoh_listen: Vec<String>,
    pub qos: RosQos,
}

#[derive(Clone, Debug, Default)]
pub struct RealtimeConfig {
    /// SCHED_FIFO priority for the control thread; 0 keeps the normal scheduler.
    pub priority: i32,
    pub cpu_affinity: Vec<usize>,
    pub lock_memory: bool,
    /// Busy-wait this long before each deadline instead of sleeping (0: sleep only).
    pub spin_us: f64,
}

#[derive(Clone, Debug)]
pub struct Workspace {
    pub chain: KinematicChain,
    pub min: [f64; 3],
    pub max: [f64; 3],
}

impl Workspace {
    pub fn contains(&self, q: &[f64]) -> bool {
        let p = self.chain.tool_position(q);
        (0..3).all(|i| p[i] >= self.min[i] && p[i] <= self.max[i])
    }
}

#[derive(Clone, Debug)]
pub struct Config {
    pub file: PathBuf,
    pub urdf: PathBuf,
    pub limits: RobotLimits,
    pub workspace: Option<Workspace>,
    pub control: ControlConfig,
    pub safety: SafetyConfig,
    pub policy: PolicyConfig,
    pub sim: SimConfig,
    pub io: Io,
    pub realtime: RealtimeConfig,
}

impl Config {
    /// Camera slots the inputs provide, in order.
    pub fn camera_count(&self) -> usize {
        match &self.io {
            Io::Sim => self.sim.cameras.len(),
            Io::Ros(r) => r.cameras.len(),
        }
    }
}

/// Field checks that name the file and field; comparisons are written so NaN fails.
struct Check<'a> {
    file: &'a Path,
}

impl Check<'_> {
    fn fail<T>(&self, field: &str, message: impl Into<String>) -> Result<T, ConfigError> {
        Err(ConfigError::Invalid {
            file: self.file.to_path_buf(),
            field: field.to_string(),
            message: message.into(),
        })
    }

    fn positive(&self, field: &str, x: f64) -> Result<f64, ConfigError> {
        if x > 0.0 && x.is_finite() {
            Ok(x)
        } else {
            self.fail(field, format!("expected a finite number > 0, found {x}"))
        }
    }

    fn non_negative(&self, field: &str, x: f64) -> Result<f64, ConfigError> {
        if x >= 0.0 && x.is_finite() {
            Ok(x)
        } else {
            self.fail(field, format!("expected a finite number >= 0, found {x}"))
        }
    }

    fn in_range(&self, field: &str, x: f64, lo: f64, hi: f64) -> Result<f64, ConfigError> {
        if x >= lo && x <= hi {
            Ok(x)
        } else {
            self.fail(
                field,
                format!("expected a number in [{lo}, {hi}], found {x}"),
            )
        }
    }

    fn finite(&self, field: &str, x: f64) -> Result<f64, ConfigError> {
        if x.is_finite() {
            Ok(x)
        } else {
            self.fail(field, format!("expected a finite number, found {x}"))
        }
    }
}

impl Config {
    pub fn load(file: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(file).map_err(|source| ConfigError::Io {
            file: file.to_path_buf(),
            source,
        })?;
        Config::parse(file, &text)
    }

    pub fn parse(file: &Path, text: &str) -> Result<Config, ConfigError> {
        Config::parse_with(file, text, &ros_args::RosArgs::default())
    }

    /// Loads `file` with `--ros-args` parameters and remaps applied before validation.
    pub fn load_with(file: &Path, ros: &ros_args::RosArgs) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(file).map_err(|source| ConfigError::Io {
            file: file.to_path_buf(),
            source,
        })?;
        Config::parse_with(file, &text, ros)
    }

    pub fn parse_with(
        file: &Path,
        text: &str,
        ros: &ros_args::RosArgs,
    ) -> Result<Config, ConfigError> {
        let parse_err = |e: &dyn std::fmt::Display| ConfigError::Parse {
            file: file.to_path_buf(),
            message: e.to_string().trim_end().replace('\n', " "),
        };
        let mut table: toml::Table = toml::from_str(text).map_err(|e| parse_err(&e))?;
        ros_args::apply(&mut table, ros)?;
        let raw: RawConfig = toml::Value::Table(table)
            .try_into()
            .map_err(|e| parse_err(&e))?;
        Config::from_raw(file, raw)
    }

    pub fn from_raw(file: &Path, raw: RawConfig) -> Result<Config, ConfigError> {
        let c = Check { file };
        let base_dir = file.parent().unwrap_or(Path::new("."));
        let resolve = |p: &Path| {
            if p.is_absolute() {
                p.to_path_buf()
            } else {
                base_dir.join(p)
            }
        };

        // Robot joints and the URDF.
        let names = &raw.robot.joints;
        if names.is_empty() || names.len() > MAX_JOINTS {
            return c.fail(
                "robot.joints",
                format!(
                    "expected 1 to {MAX_JOINTS} joint names, found {}",
                    names.len()
                ),
            );
        }
        if let Some(dup) = first_duplicate(names) {
            return c.fail("robot.joints", format!("joint `{dup}` is listed twice"));
        }
        let io = match raw.robot.io.as_str() {
            "sim" => Io::Sim,
            "ros" => Io::Ros(Box::new(ros_config(&c, raw.ros.as_ref(), &resolve)?)),
            other => {
                return c.fail(
                    "robot.io",
                    format!("expected \"sim\" or \"ros\", found \"{other}\""),
                )
            }
        };
        let urdf_path = resolve(&raw.robot.urdf);
        let model = urdf::load(&urdf_path)?;
        let limits = joint_limits(&c, &model, names, &raw.limits)?;

        let workspace = match raw.workspace {
            None => None,
            Some(w) => {
                for i in 0..3 {
                    let field = format!("workspace.min[{i}]");
                    c.finite(&field, w.min[i])?;
                    c.finite(&format!("workspace.max[{i}]"), w.max[i])?;
                    if !(w.min[i] < w.max[i]) {
                        return c.fail(
                            "workspace",
                            format!(
                                "min[{i}] = {} must be below max[{i}] = {}",
                                w.min[i], w.max[i]
                            ),
                        );
                    }
                }
                let chain = KinematicChain::from_urdf(&model, &w.base_link, &w.tool_link, names)?;
                Some(Workspace {
                    chain,
                    min: w.min,
                    max: w.max,
                })
            }
        };

        let rc = &raw.control;
        let rate_hz = c.in_range("control.rate_hz", rc.rate_hz, 10.0, 1000.0)?;
        let interpolation = match rc.interpolation.as_str() {
            "linear" => Interpolation::Linear,
            "cubic" => Interpolation::Cubic,
            "quintic" => Interpolation::Quintic,
            other => {
                return c.fail(
                    "control.interpolation",
                    format!("expected \"linear\", \"cubic\" or \"quintic\", found \"{other}\""),
                )
            }
        };
        let merge = match rc.merge.as_str() {
            "blend" => MergeMode::Blend,
            "latest_only" => MergeMode::LatestOnly,
            "weighted_average" => MergeMode::WeightedAverage {
                old_weight: c.in_range(
                    "control.weighted_average_old",
                    rc.weighted_average_old,
                    0.0,
                    1.0,
                )?,
            },
            other => {
                return c.fail(
                    "control.merge",
                    format!(
                        "expected \"blend\", \"latest_only\" or \"weighted_average\", found \"{other}\""
                    ),
                )
            }
        };
        let period_s = 1.0 / rate_hz;
        let blend_window_s = c.positive("control.blend_window_s", rc.blend_window_s)?;
        if blend_window_s < 2.0 * period_s {
            return c.fail(
                "control.blend_window_s",
                format!(
                    "expected at least two control periods ({:.4} s), found {blend_window_s}",
                    2.0 * period_s
                ),
            );
        }
        let control = ControlConfig {
            rate_hz,
            period: Duration::from_secs_f64(period_s),
            interpolation,
            merge,
            blend_window_s,
            request_threshold_s: c
                .non_negative("control.request_threshold_s", rc.request_threshold_s)?,
            warmup_chunks: rc.warmup_chunks,
            status_interval_s: c.positive("control.status_interval_s", rc.status_interval_s)?,
            stop_timeout_s: c.positive("control.stop_timeout_s", rc.stop_timeout_s)?,
        };

        let rs = &raw.safety;
        let safety = SafetyConfig {
            joint_state_timeout_s: c
                .positive("safety.joint_state_timeout_s", rs.joint_state_timeout_s)?,
            camera_timeout_s: c.positive("safety.camera_timeout_s", rs.camera_timeout_s)?,
            overrun_streak: if rs.overrun_streak >= 1 {
                rs.overrun_streak
            } else {
                return c.fail("safety.overrun_streak", "expected at least 1, found 0");
            },
            chunk_position_tolerance: c.non_negative(
                "safety.chunk_position_tolerance",
                rs.chunk_position_tolerance,
            )?,
            chunk_step_velocity_factor: c.in_range(
                "safety.chunk_step_velocity_factor",
                rs.chunk_step_velocity_factor,
                1.0,
                100.0,
            )?,
        };

        let policy = policy_config(&c, &raw.policy, names, &resolve)?;
        if control.request_threshold_s >= policy.chunk_steps as f64 * policy.step_period_s {
            return c.fail(
                "control.request_threshold_s",
                format!(
                    "must be shorter than the chunk horizon ({} steps x {} s)",
                    policy.chunk_steps, policy.step_period_s
                ),
            );
        }

        let sim = sim_config(&c, raw.sim.as_ref(), &limits)?;

        let realtime = RealtimeConfig {
            priority: if (0..=99).contains(&raw.realtime.priority) {
                raw.realtime.priority
            } else {
                return c.fail(
                    "realtime.priority",
                    format!("expected 0 (off) to 99, found {}", raw.realtime.priority),
                );
            },
            cpu_affinity: raw.realtime.cpu_affinity.clone(),
            lock_memory: raw.realtime.lock_memory,
            spin_us: c.in_range(
                "realtime.spin_us",
                raw.realtime.spin_us,
                0.0,
                0.25e6 / rate_hz,
            )?,
        };

        Ok(Config {
            file: file.to_path_buf(),
            urdf: urdf_path,
            limits,
            workspace,
            control,
            safety,
            policy,
            sim,
            io,
            realtime,
        })
    }
}

fn ros_config(
    c: &Check,
    raw: Option<&raw::RawRos>,
    resolve: &dyn Fn(&Path) -> PathBuf,
) -> Result<RosConfig, ConfigError> {
    let Some(r) = raw else {
        return c.fail("ros", "a [ros] section is required when robot.io = \"ros\"");
    };
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
    if domain_id > 232 {
        return c.fail(
            "ros.domain_id",
            format!("expected 0 to 232, found {domain_id}"),
        );
    }
    let topics = [
        ("ros.joint_states", &r.joint_states),
        ("ros.prompt", &r.prompt),
        ("ros.estop", &r.estop),
        ("ros.reset", &r.reset),
        ("ros.reset_service", &r.reset_service),
        ("ros.command_topic", &r.command_topic),
        ("ros.status_topic", &r.status_topic),
        ("ros.diagnostics_topic", &r.diagnostics_topic),
    ];
    for (field, t) in topics
        .iter()
        .copied()
        .chain(r.cameras.iter().map(|t| ("ros.cameras", t)))
    {
        let ok = t.starts_with('/')
            && t.len() > 1
            && !t.contains("//")
            && t.chars()
                .all(|ch| ch.is_ascii_alphanumeric() || ch == '_' || ch == '/');
        if !ok {
            return c.fail(field, format!("\"{t}\" is not an absolute ROS topic name"));
        }
    }
    Ok(RosConfig {
        domain_id,
        node: r.node.clone(),
        namespace: r.namespace.clone(),
        loopback_only: r.loopback_only,
        joint_states: r.joint_states.clone(),
        cameras: r.cameras.clone(),
        prompt: r.prompt.clone(),
        estop: r.estop.clone(),
        reset: r.reset.clone(),
        reset_service: r.reset_service.clone(),
        service_mapping: match r.service_mapping.as_str() {
            "basic" => ServiceMappingKind::Basic,
            "enhanced" => ServiceMappingKind::Enhanced,
            "cyclone" => ServiceMappingKind::Cyclone,
            other => {
                return c.fail(
                    "ros.service_mapping",
                    format!("expected \"enhanced\" (Fast DDS), \"cyclone\" or \"basic\", found \"{other}\""),
                )
            }
        },
        command_type: match r.command_type.as_str() {
            "joint_trajectory" => CommandType::JointTrajectory,
            "float64_multi_array" => CommandType::Float64MultiArray,
            "joint_state" => CommandType::JointState,
            other => {
                return c.fail(
                    "ros.command_type",
                    format!("expected \"joint_trajectory\", \"float64_multi_array\" or \"joint_state\", found \"{other}\""),
                )
            }
        },
        command_topic: r.command_topic.clone(),
        status_topic: r.status_topic.clone(),
        diagnostics_topic: r.diagnostics_topic.clone(),
        max_image_bytes: r.max_image_bytes,
        middleware: match r.middleware.as_str() {
            "dds" => Middleware::Dds,
            "zenoh" if cfg!(feature = "zenoh") => Middleware::Zenoh,
            "zenoh" => {
                return c.fail(
                    "ros.middleware",
                    "\"zenoh\" needs pi0d built with the `zenoh` feature (cargo build --features zenoh)",
                )
            }
            other => {
                return c.fail(
                    "ros.middleware",
                    format!("expected \"dds\" or \"zenoh\", found \"{other}\""),
                )
            }
        },
        zenoh_config: r.zenoh_config.as_ref().map(|p| resolve(p)),
        zenoh_connect: zenoh_endpoints(c, "ros.zenoh_connect", &r.zenoh_connect)?,
        zenoh_listen: zenoh_endpoints(c, "ros.zenoh_listen", &r.zenoh_listen)?,
        qos: RosQos {
            joint_states: topic_qos(c, "joint_states", r.qos.joint_states.as_ref(), false, 1)?,
            cameras: topic_qos(c, "cameras", r.qos.cameras.as_ref(), false, 1)?,
            inputs: topic_qos(c, "inputs", r.qos.inputs.as_ref(), true, 10)?,
            commands: topic_qos(c, "commands", r.qos.commands.as_ref(), true, 10)?,
            status: topic_qos(c, "status", r.qos.status.as_ref(), true, 10)?,
        },
    })
}

/// `[ros.qos.<kind>]` over its defaults.
fn topic_qos(
    c: &Check,
    kind: &str,
    raw: Option<&raw::RawQos>,
    reliable: bool,
    depth: usize,
) -> Result<TopicQos, ConfigError> {
    let Some(raw) = raw else {
        return Ok(TopicQos { reliable, depth });
    };
    let reliable = match raw.reliability.as_deref() {
        None => reliable,
        Some("reliable") => true,
        Some("best_effort") => false,
        Some(other) => {
            return c.fail(
                &format!("ros.qos.{kind}.reliability"),
                format!("expected \"reliable\" or \"best_effort\", found \"{other}\""),
            )
        }
    };
    let depth = raw.depth.unwrap_or(depth);
    if !(1..=1000).contains(&depth) {
        return c.fail(
            &format!("ros.qos.{kind}.depth"),
            format!("expected 1 to 1000, found {depth}"),
        );
    }
    Ok(TopicQos { reliable, depth })
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

fn first_duplicate(names: &[String]) -> Option<&str> {
    names
        .iter()
        .enumerate()
        .find(|(i, n)| names[..*i].contains(n))
        .map(|(_, n)| n.as_str())
}

fn joint_limits(
    c: &Check,
    model: &urdf::UrdfModel,
    names: &[String],
    raw: &raw::RawLimits,
) -> Result<RobotLimits, ConfigError> {
    for name in raw.joints.keys() {
        if !names.contains(name) {
            return c.fail(
                &format!("limits.joints.{name}"),
                "no such joint in robot.joints",
            );
        }
    }
    let mut out = Vec::with_capacity(names.len());
    for name in names {
        let uj = model.joints.get(name).ok_or_else(|| ConfigError::Invalid {
            file: c.file.to_path_buf(),
            field: "robot.joints".into(),
            message: format!(
                "joint `{name}` is not a movable joint of {}",
                model.file.display()
            ),
        })?;
        let over = raw.joints.get(name);
        let pick = |f: fn(&raw::RawJointLimits) -> Option<f64>| over.and_then(f);
        let field = |key: &str| format!("limits.joints.{name}.{key}");

        let velocity = match pick(|o| o.velocity).or(uj.velocity) {
            Some(v) => c.positive(&field("velocity"), v)?,
            None => {
                return c.fail(
                    &field("velocity"),
                    "the URDF gives no velocity limit for this joint: set one here",
                )
            }
        };
        let acceleration = match pick(|o| o.acceleration).or(raw.acceleration) {
            Some(a) => c.positive(&field("acceleration"), a)?,
            None => {
                return c.fail(
                    "limits.acceleration",
                    format!(
                        "URDF has no acceleration limits: set limits.acceleration or {}",
                        field("acceleration")
                    ),
                )
            }
        };
        let jerk = match pick(|o| o.jerk).or(raw.jerk) {
            Some(j) => c.positive(&field("jerk"), j)?,
            None => {
                return c.fail(
                    "limits.jerk",
                    format!(
                        "URDF has no jerk limits: set limits.jerk or {}",
                        field("jerk")
                    ),
                )
            }
        };
        let margin = c.non_negative(
            &field("position_margin"),
            pick(|o| o.position_margin)
                .or(raw.position_margin)
                .unwrap_or(0.0),
        )?;
        let max_step = match pick(|o| o.max_step).or(raw.max_step) {
            Some(s) => c.positive(&field("max_step"), s)?,
            None => f64::INFINITY,
        };

        let (kind, lower, upper) = match uj.position {
            None => {
                if pick(|o| o.lower).is_some() || pick(|o| o.upper).is_some() {
                    // A continuous joint may still be given a range by config (a cable-limited wrist).
                    let lo = c.finite(
                        &field("lower"),
                        pick(|o| o.lower).unwrap_or(f64::NEG_INFINITY),
                    )?;
                    let hi =
                        c.finite(&field("upper"), pick(|o| o.upper).unwrap_or(f64::INFINITY))?;
                    (JointKind::Revolute, lo + margin, hi - margin)
                } else {
                    (JointKind::Continuous, f64::NEG_INFINITY, f64::INFINITY)
                }
            }
            Some((lo, hi)) => {
                let lo = c.finite(&field("lower"), pick(|o| o.lower).unwrap_or(lo))?;
                let hi = c.finite(&field("upper"), pick(|o| o.upper).unwrap_or(hi))?;
                (uj.kind, lo + margin, hi - margin)
            }
        };
        let (mut lower, mut upper) = (lower, upper);
        if let Some(SoftLimit {
            lower: sl,
            upper: su,
            ..
        }) = uj.soft
        {
            if kind != JointKind::Continuous {
                lower = lower.max(sl);
                upper = upper.min(su);
            }
        }
        if !(lower < upper) {
            return c.fail(
                &field("position_margin"),
                format!(
                    "no range left: lower {lower} >= upper {upper} after margins and soft limits"
                ),
            );
        }
        out.push(JointLimits {
            name: name.clone(),
            kind,
            lower,
            upper,
            velocity,
            acceleration,
            jerk,
            effort: uj.effort,
            soft: uj.soft.filter(|_| kind != JointKind::Continuous),
            max_step,
        });
    }
    Ok(RobotLimits::new(out))
}

fn policy_config(
    c: &Check,
    raw: &raw::RawPolicy,
    names: &[String],
    resolve: &dyn Fn(&Path) -> PathBuf,
) -> Result<PolicyConfig, ConfigError> {
    if raw.action_joints.is_empty() {
        return c.fail("policy.action_joints", "expected at least one joint name");
    }
    if let Some(dup) = first_duplicate(&raw.action_joints) {
        return c.fail(
            "policy.action_joints",
            format!("joint `{dup}` is listed twice"),
        );
    }
    let mut joint_of_action = Vec::new();
    for name in &raw.action_joints {
        match names.iter().position(|n| n == name) {
            Some(j) => joint_of_action.push(j),
            None => {
                return c.fail(
                    "policy.action_joints",
                    format!("joint `{name}` is not in robot.joints"),
                )
            }
        }
    }
    let source = match raw.kind.as_str() {
        "scripted" => PolicySource::Scripted {
            amplitude: c.non_negative("policy.amplitude", raw.amplitude)?,
            frequency_hz: c.in_range("policy.frequency_hz", raw.frequency_hz, 0.0, 5.0)?,
        },
        "replay" => match &raw.replay_file {
            Some(f) => PolicySource::Replay { file: resolve(f) },
            None => {
                return c.fail(
                    "policy.replay_file",
                    "required when policy.kind = \"replay\"",
                )
            }
        },
        "pi0" => match &raw.checkpoint {
            Some(f) => PolicySource::Pi0 {
                checkpoint: resolve(f),
                arch: raw.arch.as_deref().map(resolve),
                tokenizer: raw.tokenizer.as_deref().map(resolve),
                threads: if (1..=256).contains(&raw.threads) {
                    raw.threads
                } else {
                    return c.fail(
                        "policy.threads",
                        format!("expected 1 to 256, found {}", raw.threads),
                    );
                },
                seed: raw.seed,
                backend: backend_options(c, raw, &resolve)?,
            },
            None => return c.fail("policy.checkpoint", "required when policy.kind = \"pi0\""),
        },
        other => {
            return c.fail(
                "policy.kind",
                format!("expected \"scripted\", \"replay\" or \"pi0\", found \"{other}\""),
            )
        }
    };
    let chunk_steps = raw.chunk_steps;
    if !(2..=1000).contains(&chunk_steps) {
        return c.fail(
            "policy.chunk_steps",
            format!("expected 2 to 1000, found {chunk_steps}"),
        );
    }
    let fault = match &raw.fault {
        None => None,
        Some(f) => Some(FaultConfig {
            kind: match f.kind.as_str() {
                "nan" => FaultKind::Nan,
                "inf" => FaultKind::Inf,
                "jump" => FaultKind::Jump,
                "slow" => FaultKind::Slow,
                "panic" => FaultKind::Panic,
                "error" => FaultKind::Error,
                other => {
                    return c.fail(
                        "policy.fault.kind",
                        format!(
                            "expected one of nan, inf, jump, slow, panic, error; found \"{other}\""
                        ),
                    )
                }
            },
            after_chunks: f.after_chunks,
            count: f.count,
            latency_s: c.non_negative("policy.fault.latency_s", f.latency_s)?,
        }),
    };
    Ok(PolicyConfig {
        source,
        action_map: ActionMap {
            action_names: raw.action_joints.clone(),
            joint_of_action,
        },
        chunk_steps,
        step_period_s: c.in_range("policy.step_period_s", raw.step_period_s, 0.001, 1.0)?,
        latency_s: c.non_negative("policy.latency_s", raw.latency_s)?,
        prompt: raw.prompt.clone(),
        fault,
    })
}

fn sim_config(
    c: &Check,
    raw: Option<&raw::RawSim>,
    limits: &RobotLimits,
) -> Result<SimConfig, ConfigError> {
    let empty = raw::RawSim {
        tau_s: 0.03,
        measurement_delay_s: 0.005,
        rate_hz: 500.0,
        initial_position: BTreeMap::new(),
        cameras: Vec::new(),
        events: Vec::new(),
    };
    let raw = raw.unwrap_or(&empty);
    let mut initial = JointVector::zeros(limits.len());
    for (name, value) in &raw.initial_position {
        let field = format!("sim.initial_position.{name}");
        match limits.joints.iter().position(|j| &j.name == name) {
            Some(i) => initial[i] = c.finite(&field, *value)?,
            None => return c.fail(&field, "no such joint in robot.joints"),
        }
    }
    for (i, j) in limits.joints.iter().enumerate() {
        if !raw.initial_position.contains_key(&j.name) && j.lower.is_finite() {
            // Unlisted joints start mid-range.
            initial[i] = 0.5 * (j.lower + j.upper);
        }
    }
    let mut cameras = Vec::new();
    for (i, cam) in raw.cameras.iter().enumerate() {
        if cam.width == 0 || cam.height == 0 || cam.width > 4096 || cam.height > 4096 {
            return c.fail(
                &format!("sim.cameras[{i}]"),
                format!(
                    "width and height must be 1..=4096, found {}x{}",
                    cam.width, cam.height
                ),
            );
        }
        cameras.push(CameraConfig {
            name: cam.name.clone(),
            width: cam.width,
            height: cam.height,
            fps: c.in_range(&format!("sim.cameras[{i}].fps"), cam.fps, 0.5, 240.0)?,
        });
    }
    let mut events = Vec::new();
    for (i, e) in raw.events.iter().enumerate() {
        let field = |k: &str| format!("sim.events[{i}].{k}");
        let at_s = c.non_negative(&field("at_s"), e.at_s)?;
        let duration_s = c.non_negative(&field("duration_s"), e.duration_s)?;
        let kind = match e.event.as_str() {
            "estop" => SimEventKind::EStop,
            "reset" => SimEventKind::Reset,
            "stall_joint_states" => SimEventKind::StallJointStates { duration_s },
            "stall_camera" => {
                let name = e.camera.as_deref().unwrap_or("");
                match cameras.iter().position(|cam| cam.name == name) {
                    Some(camera) => SimEventKind::StallCamera { camera, duration_s },
                    None => {
                        return c.fail(&field("camera"), format!("no sim camera named \"{name}\""))
                    }
                }
            }
            other => {
                return c.fail(
                    &field("event"),
                    format!(
                    "expected estop, reset, stall_joint_states or stall_camera; found \"{other}\""
                ),
                )
            }
        };
        events.push(SimEvent { at_s, kind });
    }
    Ok(SimConfig {
        tau_s: c.positive("sim.tau_s", raw.tau_s)?,
        measurement_delay_s: c.in_range(
            "sim.measurement_delay_s",
            raw.measurement_delay_s,
            0.0,
            1.0,
        )?,
        rate_hz: c.in_range("sim.rate_hz", raw.rate_hz, 10.0, 5000.0)?,
        initial_position: initial,
        cameras,
        events,
    })
}

/// `policy.backend` and `[policy.onnx]`.
fn backend_options(
    c: &Check,
    raw: &raw::RawPolicy,
    resolve: &dyn Fn(&Path) -> PathBuf,
) -> Result<BackendOptions, ConfigError> {
    match (raw.backend.as_str(), &raw.onnx) {
        ("cpu", _) => Ok(BackendOptions::Cpu),
        ("onnx", None) => c.fail(
            "policy.onnx",
            "required when policy.backend = \"onnx\" (at least model_dir)",
        ),
        ("onnx", Some(o)) => {
            let Some(dir) = &o.model_dir else {
                return c.fail(
                    "policy.onnx.model_dir",
                    "required: the directory `pi0d export` wrote",
                );
            };
            if o.device_id < 0 {
                return c.fail(
                    "policy.onnx.device_id",
                    format!("expected 0 or more, found {}", o.device_id),
                );
            }
            if !(0..=256).contains(&o.threads) {
                return c.fail(
                    "policy.onnx.threads",
                    format!("expected 0 (runtime default) to 256, found {}", o.threads),
                );
            }
            let provider = match o.provider.as_str() {
                "cpu" => ExecutionProvider::Cpu,
                "cuda" => ExecutionProvider::Cuda {
                    device_id: o.device_id,
                },
                "tensorrt" => ExecutionProvider::TensorRt {
                    device_id: o.device_id,
                    fp16: o.tensorrt_fp16,
                    engine_cache: o.tensorrt_cache.as_deref().map(resolve),
                },
                "cann" => ExecutionProvider::Cann {
                    device_id: o.device_id,
                    graph: o.cann_graph,
                    precision_mode: match &o.precision_mode {
                        Some(m) if !CANN_PRECISION_MODES.contains(&m.as_str()) => {
                            return c.fail(
                                "policy.onnx.precision_mode",
                                format!("expected one of {CANN_PRECISION_MODES:?}, found \"{m}\""),
                            )
                        }
                        m => m.clone(),
                    },
                },
                other => {
                    return c.fail(
                        "policy.onnx.provider",
                        format!(
                        "expected \"cpu\", \"cuda\", \"tensorrt\" or \"cann\", found \"{other}\""
                    ),
                    )
                }
            };
            Ok(BackendOptions::Onnx {
                model_dir: resolve(dir),
                options: OnnxOptions {
                    library: o.library.as_deref().map(resolve),
                    provider,
                    threads: o.threads,
                },
            })
        }
        ("acl", _) => {
            let Some(a) = &raw.acl else {
                return c.fail(
                    "policy.acl",
                    "required when policy.backend = \"acl\" (at least model_dir)",
                );
            };
            let Some(dir) = &a.model_dir else {
                return c.fail(
                    "policy.acl.model_dir",
                    "required: the directory `pi0d export` wrote, with the .om files ATC made",
                );
            };
            if a.device_id < 0 {
                return c.fail(
                    "policy.acl.device_id",
                    format!("expected 0 or more, found {}", a.device_id),
                );
            }
            Ok(BackendOptions::Acl {
                model_dir: resolve(dir),
                options: AclOptions {
                    library: a.library.as_deref().map(resolve),
                    device_id: a.device_id,
                },
            })
        }
        (other, _) => c.fail(
            "policy.backend",
            format!("expected \"cpu\", \"onnx\" or \"acl\", found \"{other}\""),
        ),
    }
}

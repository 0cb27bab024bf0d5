//! The configuration file as written: plain serde structs, unknown fields refused, choices as
//! serde enums (an unknown value is refused naming the field and the allowed values).
//! Fields that only some kinds use are `Option`s, so validation can tell "not given" from the
//! default and warn about settings the chosen kind ignores. `super::Config::parse_with` turns
//! this into the validated, typed configuration.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::Deserialize;

use super::control::Interpolation;
use super::policy::FaultKind;
use super::ros::{CommandType, Middleware, ServiceMappingKind};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawConfig {
    pub robot: RawRobot,
    #[serde(default)]
    pub limits: RawLimits,
    pub workspace: Option<RawWorkspace>,
    #[serde(default)]
    pub control: RawControl,
    #[serde(default)]
    pub safety: RawSafety,
    pub policy: RawPolicy,
    pub sim: Option<RawSim>,
    pub ros: Option<RawRos>,
    #[serde(default)]
    pub realtime: RawRealtime,
    pub serve: Option<super::serve::RawServe>,
    pub metrics: Option<super::metrics::RawMetrics>,
    pub record: Option<super::record::RawRecord>,
    #[serde(default)]
    pub drill: Vec<super::drill::RawDrill>,
}

/// `robot.io`: where inputs come from and commands go.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum IoKind {
    #[default]
    Sim,
    Ros,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRobot {
    pub urdf: PathBuf,
    pub joints: Vec<String>,
    #[serde(default)]
    pub io: IoKind,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawLimits {
    /// Scales every velocity, acceleration and jerk limit (0 < scale <= 1), for a first run.
    pub scale: Option<f64>,
    pub acceleration: Option<f64>,
    pub jerk: Option<f64>,
    pub position_margin: Option<f64>,
    pub max_step: Option<f64>,
    #[serde(default)]
    pub joints: BTreeMap<String, RawJointLimits>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawJointLimits {
    pub lower: Option<f64>,
    pub upper: Option<f64>,
    pub velocity: Option<f64>,
    pub acceleration: Option<f64>,
    pub jerk: Option<f64>,
    pub position_margin: Option<f64>,
    pub max_step: Option<f64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawWorkspace {
    pub base_link: String,
    pub tool_link: String,
    pub min: [f64; 3],
    pub max: [f64; 3],
}

/// `control.merge`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MergeKind {
    Blend,
    LatestOnly,
    WeightedAverage,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawControl {
    pub rate_hz: f64,
    pub interpolation: Interpolation,
    pub merge: MergeKind,
    pub blend_window_s: f64,
    /// `weighted_average` only (default 0.3).
    pub weighted_average_old: Option<f64>,
    pub request_threshold_s: f64,
    pub warmup_chunks: u32,
    pub status_interval_s: f64,
    pub stop_timeout_s: f64,
    pub start_timeout_s: f64,
    pub rtc: super::rtc::RawRtc,
}

impl Default for RawControl {
    fn default() -> Self {
        RawControl {
            rate_hz: 200.0,
            interpolation: Interpolation::Quintic,
            merge: MergeKind::Blend,
            blend_window_s: 0.2,
            weighted_average_old: None,
            request_threshold_s: 0.6,
            warmup_chunks: 1,
            status_interval_s: 1.0,
            stop_timeout_s: 3.0,
            start_timeout_s: 30.0,
            rtc: Default::default(),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawSafety {
    pub joint_state_timeout_s: f64,
    pub camera_timeout_s: f64,
    pub overrun_streak: u32,
    pub chunk_position_tolerance: f64,
    pub chunk_step_velocity_factor: f64,
}

impl Default for RawSafety {
    fn default() -> Self {
        RawSafety {
            joint_state_timeout_s: 0.1,
            camera_timeout_s: 0.5,
            overrun_streak: 10,
            chunk_position_tolerance: 0.5,
            chunk_step_velocity_factor: 3.0,
        }
    }
}

/// `policy.kind`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PolicyKind {
    Pi0,
    Scripted,
    Replay,
}

/// `policy.backend`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum BackendKind {
    #[default]
    Cpu,
    Onnx,
    Acl,
    /// A remote server speaking openpi's websocket protocol.
    Openpi,
    /// Servers answering Zenoh queries (`pi0d serve --zenoh KEY`).
    Zenoh,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawPolicy {
    pub kind: PolicyKind,
    pub action_joints: Vec<String>,
    #[serde(default = "default_chunk_steps")]
    pub chunk_steps: usize,
    #[serde(default = "default_step_period")]
    pub step_period_s: f64,
    #[serde(default)]
    pub prompt: String,
    /// scripted and replay: extra latency per inference (default 0).
    pub latency_s: Option<f64>,
    /// scripted (defaults 0.3 and 0.2 Hz).
    pub amplitude: Option<f64>,
    pub frequency_hz: Option<f64>,
    /// replay.
    pub replay_file: Option<PathBuf>,
    /// pi0.
    pub checkpoint: Option<PathBuf>,
    pub arch: Option<PathBuf>,
    pub tokenizer: Option<PathBuf>,
    pub threads: Option<usize>,
    pub seed: Option<u64>,
    pub backend: Option<BackendKind>,
    pub onnx: Option<RawOnnx>,
    pub acl: Option<RawAcl>,
    pub openpi: Option<super::openpi::RawOpenpi>,
    pub zenoh: Option<super::openpi::RawOpenpi>,
    pub fault: Option<RawFault>,
    /// pi0: model cameras that may have no source; they are fed as missing (masked) images.
    #[serde(default)]
    pub optional_cameras: Vec<String>,
    /// The state vector entry by entry: joint names and constants (default: action_joints).
    pub state: Option<Vec<RawStateEntry>>,
}

/// One entry of `policy.state`.
#[derive(Debug, Deserialize)]
#[serde(
    untagged,
    expecting = "a joint name (its measured position) or a number (a constant)"
)]
pub enum RawStateEntry {
    Joint(String),
    Constant(f64),
}

fn default_chunk_steps() -> usize {
    50
}
fn default_step_period() -> f64 {
    0.02
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawAcl {
    pub model_dir: Option<PathBuf>,
    #[serde(default)]
    pub device_id: i32,
    pub library: Option<PathBuf>,
}

/// `policy.onnx.provider`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum ProviderKind {
    #[default]
    Cpu,
    Cuda,
    Tensorrt,
    Cann,
}

/// `policy.onnx.precision_mode`: CANN's precision modes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CannPrecision {
    ForceFp32,
    ForceFp16,
    AllowFp32ToFp16,
    MustKeepOriginDtype,
    AllowMixPrecision,
}

impl CannPrecision {
    pub fn as_str(self) -> &'static str {
        match self {
            CannPrecision::ForceFp32 => "force_fp32",
            CannPrecision::ForceFp16 => "force_fp16",
            CannPrecision::AllowFp32ToFp16 => "allow_fp32_to_fp16",
            CannPrecision::MustKeepOriginDtype => "must_keep_origin_dtype",
            CannPrecision::AllowMixPrecision => "allow_mix_precision",
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawOnnx {
    pub model_dir: Option<PathBuf>,
    #[serde(default)]
    pub provider: ProviderKind,
    /// cuda, tensorrt and cann (default 0).
    pub device_id: Option<i32>,
    pub library: Option<PathBuf>,
    #[serde(default)]
    pub threads: usize,
    /// cann (default true).
    pub cann_graph: Option<bool>,
    /// cann.
    pub precision_mode: Option<CannPrecision>,
    /// tensorrt (default false).
    pub tensorrt_fp16: Option<bool>,
    /// tensorrt.
    pub tensorrt_cache: Option<PathBuf>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawFault {
    pub kind: FaultKind,
    #[serde(default)]
    pub after_chunks: u32,
    #[serde(default)]
    pub count: u32,
    #[serde(default)]
    pub latency_s: f64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawSim {
    #[serde(default = "default_tau")]
    pub tau_s: f64,
    #[serde(default = "default_delay")]
    pub measurement_delay_s: f64,
    #[serde(default = "default_sim_rate")]
    pub rate_hz: f64,
    #[serde(default)]
    pub initial_position: BTreeMap<String, f64>,
    #[serde(default)]
    pub cameras: Vec<RawCamera>,
    #[serde(default)]
    pub events: Vec<RawEvent>,
}

impl Default for RawSim {
    fn default() -> Self {
        RawSim {
            tau_s: default_tau(),
            measurement_delay_s: default_delay(),
            rate_hz: default_sim_rate(),
            initial_position: BTreeMap::new(),
            cameras: Vec::new(),
            events: Vec::new(),
        }
    }
}

fn default_tau() -> f64 {
    0.03
}
fn default_delay() -> f64 {
    0.005
}
fn default_sim_rate() -> f64 {
    500.0
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawCamera {
    pub name: String,
    #[serde(default = "default_width")]
    pub width: u32,
    #[serde(default = "default_height")]
    pub height: u32,
    #[serde(default = "default_fps")]
    pub fps: f64,
}

fn default_width() -> u32 {
    320
}
fn default_height() -> u32 {
    240
}
fn default_fps() -> f64 {
    30.0
}

/// `sim.events[].event`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SimEventName {
    Estop,
    Reset,
    StallJointStates,
    StallCamera,
    Crash,
    CrashControl,
    StallControl,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawEvent {
    pub at_s: f64,
    pub event: SimEventName,
    /// Stall events only.
    pub duration_s: Option<f64>,
    /// `stall_camera` only.
    pub camera: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRos {
    pub domain_id: Option<u16>,
    #[serde(default = "default_node")]
    pub node: String,
    #[serde(default = "default_namespace")]
    pub namespace: String,
    #[serde(default)]
    pub loopback_only: bool,
    #[serde(default = "default_joint_states")]
    pub joint_states: String,
    #[serde(default)]
    pub cameras: RawCameras,
    #[serde(default = "default_prompt_topic")]
    pub prompt: String,
    #[serde(default = "default_estop_topic")]
    pub estop: String,
    #[serde(default = "default_reset_topic")]
    pub reset: String,
    #[serde(default = "default_reset_topic")]
    pub reset_service: String,
    #[serde(default = "default_service_mapping")]
    pub service_mapping: ServiceMappingKind,
    /// One output for every joint (default joint_trajectory on
    /// /arm_controller/joint_trajectory), unless `commands` lists the outputs.
    pub command_type: Option<CommandType>,
    pub command_topic: Option<String>,
    #[serde(default)]
    pub commands: Vec<RawCommandGroup>,
    /// joint_trajectory only: how long a trajectory holds the command's velocity before its
    /// braking tail (default 0.05 s).
    pub trajectory_coast_s: Option<f64>,
    /// `pi0d run --dry-run` sends each output's commands to this prefix + its topic
    /// (default `/pi0d/dry_run`).
    pub dry_run_prefix: Option<String>,
    #[serde(default = "default_status_topic")]
    pub status_topic: String,
    #[serde(default = "default_diagnostics_topic")]
    pub diagnostics_topic: String,
    #[serde(default = "default_max_image_bytes")]
    pub max_image_bytes: usize,
    #[serde(default = "default_middleware")]
    pub middleware: Middleware,
    /// zenoh only.
    pub zenoh_config: Option<PathBuf>,
    #[serde(default)]
    pub zenoh_connect: Vec<String>,
    #[serde(default)]
    pub zenoh_listen: Vec<String>,
    #[serde(default)]
    pub qos: RawQosSet,
}

/// `[[ros.commands]]`: one command output.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawCommandGroup {
    pub joints: Vec<String>,
    pub topic: String,
    #[serde(rename = "type", default = "default_command_type")]
    pub kind: CommandType,
    pub rate_hz: Option<f64>,
    /// gripper_command only: the goal's max_effort (default the joint's URDF effort limit).
    pub max_effort: Option<f64>,
}

/// `ros.cameras`: a table from the model's camera names to topics, or (for policies whose
/// cameras have no names) a list of topics in the policy's camera order.
#[derive(Debug, Deserialize)]
#[serde(
    untagged,
    expecting = "a table of model camera name = topic (e.g. { front = \"/camera/image_raw\" }), or a list of topics"
)]
pub enum RawCameras {
    Named(BTreeMap<String, String>),
    Ordered(Vec<String>),
}

impl Default for RawCameras {
    fn default() -> Self {
        RawCameras::Ordered(Vec::new())
    }
}

/// `[ros.qos]`: QoS per kind of topic.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawQosSet {
    pub joint_states: Option<RawQos>,
    pub cameras: Option<RawQos>,
    pub inputs: Option<RawQos>,
    pub commands: Option<RawQos>,
    pub status: Option<RawQos>,
}

/// `ros.qos.*.reliability`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Reliability {
    Reliable,
    BestEffort,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawQos {
    pub reliability: Option<Reliability>,
    pub depth: Option<usize>,
}

fn default_middleware() -> Middleware {
    Middleware::Dds
}
fn default_node() -> String {
    "pi0d".into()
}
fn default_namespace() -> String {
    "/".into()
}
fn default_joint_states() -> String {
    "/joint_states".into()
}
fn default_prompt_topic() -> String {
    "/pi0d/prompt".into()
}
fn default_estop_topic() -> String {
    "/pi0d/estop".into()
}
fn default_reset_topic() -> String {
    "/pi0d/reset".into()
}
fn default_service_mapping() -> ServiceMappingKind {
    ServiceMappingKind::Enhanced
}
fn default_command_type() -> CommandType {
    CommandType::JointTrajectory
}
fn default_status_topic() -> String {
    "/pi0d/status".into()
}
fn default_diagnostics_topic() -> String {
    "/diagnostics".into()
}
fn default_max_image_bytes() -> usize {
    8 << 20
}

fn default_priority() -> i32 {
    80
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRealtime {
    /// SCHED_FIFO for the control thread (0: the normal scheduler).
    #[serde(default = "default_priority")]
    pub priority: i32,
    /// SCHED_FIFO for the ROS thread, below the control thread (0: the normal scheduler;
    /// default: 10 below `priority`).
    pub io_priority: Option<i32>,
    #[serde(default)]
    pub cpu_affinity: Vec<usize>,
    #[serde(default)]
    pub lock_memory: bool,
    #[serde(default)]
    pub spin_us: f64,
    /// PM QoS: the CPUs' wake-up latency held at most this (us) while running; -1: not asked.
    #[serde(default)]
    pub cpu_latency_us: i64,
}

impl Default for RawRealtime {
    fn default() -> Self {
        RawRealtime {
            priority: default_priority(),
            io_priority: None,
            cpu_affinity: Vec::new(),
            lock_memory: false,
            spin_us: 0.0,
            cpu_latency_us: 0,
        }
    }
}

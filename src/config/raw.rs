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
pub(crate) struct RawConfig {
    pub(crate) robot: RawRobot,
    #[serde(default)]
    pub(crate) limits: RawLimits,
    pub(crate) workspace: Option<RawWorkspace>,
    #[serde(default)]
    pub(crate) control: RawControl,
    #[serde(default)]
    pub(crate) safety: RawSafety,
    pub(crate) policy: RawPolicy,
    pub(crate) sim: Option<RawSim>,
    pub(crate) ros: Option<RawRos>,
    #[serde(default)]
    pub(crate) realtime: RawRealtime,
    pub(crate) serve: Option<super::serve::RawServe>,
    pub(crate) metrics: Option<super::metrics::RawMetrics>,
    pub(crate) record: Option<super::record::RawRecord>,
    #[serde(default)]
    pub(crate) drill: Vec<super::drill::RawDrill>,
}

/// `robot.io`: where inputs come from and commands go.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub(crate) enum IoKind {
    #[default]
    Sim,
    Ros,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRobot {
    pub(crate) urdf: PathBuf,
    pub(crate) joints: Vec<String>,
    #[serde(default)]
    pub(crate) io: IoKind,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawLimits {
    /// Scales every velocity, acceleration and jerk limit (0 < scale <= 1), for a first run.
    pub(crate) scale: Option<f64>,
    pub(crate) acceleration: Option<f64>,
    pub(crate) jerk: Option<f64>,
    pub(crate) position_margin: Option<f64>,
    pub(crate) max_step: Option<f64>,
    #[serde(default)]
    pub(crate) joints: BTreeMap<String, RawJointLimits>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawJointLimits {
    pub(crate) lower: Option<f64>,
    pub(crate) upper: Option<f64>,
    pub(crate) velocity: Option<f64>,
    pub(crate) acceleration: Option<f64>,
    pub(crate) jerk: Option<f64>,
    pub(crate) position_margin: Option<f64>,
    pub(crate) max_step: Option<f64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawWorkspace {
    pub(crate) base_link: String,
    pub(crate) tool_link: String,
    pub(crate) min: [f64; 3],
    pub(crate) max: [f64; 3],
}

/// `control.merge`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum MergeKind {
    Blend,
    LatestOnly,
    WeightedAverage,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct RawControl {
    pub(crate) rate_hz: f64,
    pub(crate) interpolation: Interpolation,
    pub(crate) merge: MergeKind,
    pub(crate) blend_window_s: f64,
    /// `weighted_average` only (default 0.3).
    pub(crate) weighted_average_old: Option<f64>,
    pub(crate) request_threshold_s: f64,
    pub(crate) warmup_chunks: u32,
    pub(crate) status_interval_s: f64,
    pub(crate) stop_timeout_s: f64,
    pub(crate) start_timeout_s: f64,
    pub(crate) rtc: super::rtc::RawRtc,
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
pub(crate) struct RawSafety {
    pub(crate) joint_state_timeout_s: f64,
    pub(crate) camera_timeout_s: f64,
    pub(crate) overrun_streak: u32,
    pub(crate) chunk_position_tolerance: f64,
    pub(crate) chunk_step_velocity_factor: f64,
    pub(crate) measured_position_tolerance: f64,
}

impl Default for RawSafety {
    fn default() -> Self {
        RawSafety {
            joint_state_timeout_s: 0.1,
            camera_timeout_s: 0.5,
            overrun_streak: 10,
            chunk_position_tolerance: 0.5,
            chunk_step_velocity_factor: 3.0,
            measured_position_tolerance: 0.5,
        }
    }
}

/// `policy.kind`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum PolicyKind {
    Pi0,
    Scripted,
    Replay,
}

/// `policy.backend`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub(crate) enum BackendKind {
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
pub(crate) struct RawPolicy {
    pub(crate) kind: PolicyKind,
    pub(crate) action_joints: Vec<String>,
    #[serde(default = "default_chunk_steps")]
    pub(crate) chunk_steps: usize,
    #[serde(default = "default_step_period")]
    pub(crate) step_period_s: f64,
    #[serde(default)]
    pub(crate) prompt: String,
    /// scripted and replay: extra latency per inference (default 0).
    pub(crate) latency_s: Option<f64>,
    /// scripted (defaults 0.3 and 0.2 Hz).
    pub(crate) amplitude: Option<f64>,
    pub(crate) frequency_hz: Option<f64>,
    /// replay.
    pub(crate) replay_file: Option<PathBuf>,
    /// pi0.
    pub(crate) checkpoint: Option<PathBuf>,
    pub(crate) arch: Option<PathBuf>,
    pub(crate) tokenizer: Option<PathBuf>,
    pub(crate) threads: Option<usize>,
    pub(crate) seed: Option<u64>,
    pub(crate) backend: Option<BackendKind>,
    pub(crate) onnx: Option<RawOnnx>,
    pub(crate) acl: Option<RawAcl>,
    pub(crate) openpi: Option<super::openpi::RawOpenpi>,
    pub(crate) zenoh: Option<super::openpi::RawOpenpi>,
    pub(crate) fault: Option<RawFault>,
    /// pi0: model cameras that may have no source; they are fed as missing (masked) images.
    #[serde(default)]
    pub(crate) optional_cameras: Vec<String>,
    /// The state vector entry by entry: joint names and constants (default: action_joints).
    pub(crate) state: Option<Vec<RawStateEntry>>,
    /// pi0 with an openpi checkpoint: its delta actions, as openpi's `make_bool_mask` counts.
    pub(crate) openpi_delta_actions: Option<Vec<i64>>,
}

/// One entry of `policy.state`.
#[derive(Debug, Deserialize)]
#[serde(
    untagged,
    expecting = "a joint name (its measured position) or a number (a constant)"
)]
pub(crate) enum RawStateEntry {
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
pub(crate) struct RawAcl {
    pub(crate) model_dir: Option<PathBuf>,
    #[serde(default)]
    pub(crate) device_id: i32,
    pub(crate) library: Option<PathBuf>,
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
pub(crate) enum CannPrecision {
    ForceFp32,
    ForceFp16,
    AllowFp32ToFp16,
    MustKeepOriginDtype,
    AllowMixPrecision,
}

impl CannPrecision {
    pub(crate) fn as_str(self) -> &'static str {
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
pub(crate) struct RawOnnx {
    pub(crate) model_dir: Option<PathBuf>,
    #[serde(default)]
    pub(crate) provider: ProviderKind,
    /// cuda, tensorrt and cann (default 0).
    pub(crate) device_id: Option<i32>,
    pub(crate) library: Option<PathBuf>,
    #[serde(default)]
    pub(crate) threads: usize,
    /// cann (default true).
    pub(crate) cann_graph: Option<bool>,
    /// cann.
    pub(crate) precision_mode: Option<CannPrecision>,
    /// tensorrt (default false).
    pub(crate) tensorrt_fp16: Option<bool>,
    /// tensorrt.
    pub(crate) tensorrt_cache: Option<PathBuf>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawFault {
    pub(crate) kind: FaultKind,
    #[serde(default)]
    pub(crate) after_chunks: u32,
    #[serde(default)]
    pub(crate) count: u32,
    #[serde(default)]
    pub(crate) latency_s: f64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawSim {
    #[serde(default = "default_tau")]
    pub(crate) tau_s: f64,
    #[serde(default = "default_delay")]
    pub(crate) measurement_delay_s: f64,
    #[serde(default = "default_sim_rate")]
    pub(crate) rate_hz: f64,
    #[serde(default)]
    pub(crate) initial_position: BTreeMap<String, f64>,
    #[serde(default)]
    pub(crate) cameras: Vec<RawCamera>,
    #[serde(default)]
    pub(crate) events: Vec<RawEvent>,
    pub(crate) task: Option<RawSimTask>,
}

/// `[sim.task]`: a target the simulator draws and moves between episodes.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawSimTask {
    #[serde(default)]
    pub(crate) seed: u64,
    #[serde(default)]
    pub(crate) reach: BTreeMap<String, [f64; 2]>,
    #[serde(default)]
    pub(crate) sweep: BTreeMap<String, [f64; 2]>,
    #[serde(default = "default_task_radius")]
    pub(crate) radius_m: f64,
    #[serde(default = "default_task_hold")]
    pub(crate) hold_s: f64,
    #[serde(default = "default_task_timeout")]
    pub(crate) timeout_s: f64,
    pub(crate) view_min: [f64; 2],
    pub(crate) view_max: [f64; 2],
}

fn default_task_radius() -> f64 {
    0.04
}
fn default_task_hold() -> f64 {
    1.0
}
fn default_task_timeout() -> f64 {
    8.0
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
            task: None,
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
pub(crate) struct RawCamera {
    pub(crate) name: String,
    #[serde(default = "default_width")]
    pub(crate) width: u32,
    #[serde(default = "default_height")]
    pub(crate) height: u32,
    #[serde(default = "default_fps")]
    pub(crate) fps: f64,
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
pub(crate) enum SimEventName {
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
pub(crate) struct RawEvent {
    pub(crate) at_s: f64,
    pub(crate) event: SimEventName,
    /// Stall events only.
    pub(crate) duration_s: Option<f64>,
    /// `stall_camera` only.
    pub(crate) camera: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRos {
    pub(crate) domain_id: Option<u16>,
    #[serde(default = "default_node")]
    pub(crate) node: String,
    #[serde(default = "default_namespace")]
    pub(crate) namespace: String,
    #[serde(default)]
    pub(crate) loopback_only: bool,
    #[serde(default = "default_joint_states")]
    pub(crate) joint_states: String,
    #[serde(default)]
    pub(crate) cameras: RawCameras,
    #[serde(default = "default_prompt_topic")]
    pub(crate) prompt: String,
    #[serde(default = "default_estop_topic")]
    pub(crate) estop: String,
    #[serde(default = "default_reset_topic")]
    pub(crate) reset: String,
    #[serde(default = "default_reset_topic")]
    pub(crate) reset_service: String,
    #[serde(default = "default_service_mapping")]
    pub(crate) service_mapping: ServiceMappingKind,
    /// One output for every joint (default joint_trajectory on
    /// /arm_controller/joint_trajectory), unless `commands` lists the outputs.
    pub(crate) command_type: Option<CommandType>,
    pub(crate) command_topic: Option<String>,
    #[serde(default)]
    pub(crate) commands: Vec<RawCommandGroup>,
    /// joint_trajectory only: how long a trajectory holds the command's velocity before its
    /// braking tail (default 0.05 s).
    pub(crate) trajectory_coast_s: Option<f64>,
    /// `pi0d run --dry-run` sends each output's commands to this prefix + its topic
    /// (default `/pi0d/dry_run`).
    pub(crate) dry_run_prefix: Option<String>,
    #[serde(default = "default_status_topic")]
    pub(crate) status_topic: String,
    #[serde(default = "default_diagnostics_topic")]
    pub(crate) diagnostics_topic: String,
    #[serde(default = "default_max_image_bytes")]
    pub(crate) max_image_bytes: usize,
    #[serde(default = "default_middleware")]
    pub(crate) middleware: Middleware,
    /// zenoh only.
    pub(crate) zenoh_config: Option<PathBuf>,
    #[serde(default)]
    pub(crate) zenoh_connect: Vec<String>,
    #[serde(default)]
    pub(crate) zenoh_listen: Vec<String>,
    /// zenoh only: false for rmw_zenoh on Humble (default true).
    pub(crate) zenoh_type_hashes: Option<bool>,
    /// zenoh only: allow multicast scouting (default false, as rmw_zenoh).
    pub(crate) zenoh_multicast_scouting: Option<bool>,
    #[serde(default)]
    pub(crate) qos: RawQosSet,
}

/// `[[ros.commands]]`: one command output.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawCommandGroup {
    pub(crate) joints: Vec<String>,
    pub(crate) topic: String,
    #[serde(rename = "type", default = "default_command_type")]
    pub(crate) kind: CommandType,
    pub(crate) rate_hz: Option<f64>,
    /// gripper_command only: the goal's max_effort (default the joint's URDF effort limit).
    pub(crate) max_effort: Option<f64>,
}

/// `ros.cameras`: a table from the model's camera names to topics, or (for policies whose
/// cameras have no names) a list of topics in the policy's camera order.
#[derive(Debug, Deserialize)]
#[serde(
    untagged,
    expecting = "a table of model camera name = topic (e.g. { front = \"/camera/image_raw\" }), or a list of topics"
)]
pub(crate) enum RawCameras {
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
pub(crate) struct RawQosSet {
    pub(crate) joint_states: Option<RawQos>,
    pub(crate) cameras: Option<RawQos>,
    pub(crate) inputs: Option<RawQos>,
    pub(crate) commands: Option<RawQos>,
    pub(crate) status: Option<RawQos>,
}

/// `ros.qos.*.reliability`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Reliability {
    Reliable,
    BestEffort,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawQos {
    pub(crate) reliability: Option<Reliability>,
    pub(crate) depth: Option<usize>,
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
pub(crate) struct RawRealtime {
    /// SCHED_FIFO for the control thread (0: the normal scheduler).
    #[serde(default = "default_priority")]
    pub(crate) priority: i32,
    /// SCHED_FIFO for the ROS thread, below the control thread (0: the normal scheduler;
    /// default: 10 below `priority`).
    pub(crate) io_priority: Option<i32>,
    #[serde(default)]
    pub(crate) cpu_affinity: Vec<usize>,
    #[serde(default)]
    pub(crate) lock_memory: bool,
    #[serde(default)]
    pub(crate) spin_us: f64,
    /// PM QoS: the CPUs' wake-up latency held at most this (us) while running; -1: not asked.
    #[serde(default)]
    pub(crate) cpu_latency_us: i64,
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

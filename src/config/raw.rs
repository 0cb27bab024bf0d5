//! The configuration file as written: plain serde structs, unknown fields refused.
//! `super::Config::from_raw` turns this into the validated, typed configuration.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::Deserialize;

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
    pub cameras: Vec<String>,
    #[serde(default = "default_prompt_topic")]
    pub prompt: String,
    #[serde(default = "default_estop_topic")]
    pub estop: String,
    #[serde(default = "default_reset_topic")]
    pub reset: String,
    #[serde(default = "default_reset_topic")]
    pub reset_service: String,
    #[serde(default = "default_service_mapping")]
    pub service_mapping: String,
    #[serde(default = "default_command_type")]
    pub command_type: String,
    #[serde(default = "default_command_topic")]
    pub command_topic: String,
    #[serde(default = "default_status_topic")]
    pub status_topic: String,
    #[serde(default = "default_diagnostics_topic")]
    pub diagnostics_topic: String,
    #[serde(default = "default_max_image_bytes")]
    pub max_image_bytes: usize,
    /// "dds" or "zenoh".
    #[serde(default = "default_middleware")]
    pub middleware: String,
    pub zenoh_config: Option<PathBuf>,
    #[serde(default)]
    pub zenoh_connect: Vec<String>,
    #[serde(default)]
    pub zenoh_listen: Vec<String>,
    #[serde(default)]
    pub qos: RawQosSet,
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

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawQos {
    pub reliability: Option<String>,
    pub depth: Option<usize>,
}

fn default_middleware() -> String {
    "dds".into()
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
fn default_service_mapping() -> String {
    "enhanced".into()
}
fn default_command_type() -> String {
    "joint_trajectory".into()
}
fn default_command_topic() -> String {
    "/arm_controller/joint_trajectory".into()
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

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRobot {
    pub urdf: PathBuf,
    pub joints: Vec<String>,
    #[serde(default = "default_io")]
    pub io: String,
}

fn default_io() -> String {
    "sim".into()
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawLimits {
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

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawControl {
    pub rate_hz: f64,
    pub interpolation: String,
    pub merge: String,
    pub blend_window_s: f64,
    pub weighted_average_old: f64,
    pub request_threshold_s: f64,
    pub warmup_chunks: u32,
    pub status_interval_s: f64,
    pub stop_timeout_s: f64,
}

impl Default for RawControl {
    fn default() -> Self {
        RawControl {
            rate_hz: 200.0,
            interpolation: "quintic".into(),
            merge: "blend".into(),
            blend_window_s: 0.2,
            weighted_average_old: 0.3,
            request_threshold_s: 0.6,
            warmup_chunks: 1,
            status_interval_s: 1.0,
            stop_timeout_s: 3.0,
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

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawPolicy {
    pub kind: String,
    pub action_joints: Vec<String>,
    #[serde(default = "default_chunk_steps")]
    pub chunk_steps: usize,
    #[serde(default = "default_step_period")]
    pub step_period_s: f64,
    #[serde(default)]
    pub latency_s: f64,
    #[serde(default = "default_amplitude")]
    pub amplitude: f64,
    #[serde(default = "default_frequency")]
    pub frequency_hz: f64,
    pub replay_file: Option<PathBuf>,
    pub checkpoint: Option<PathBuf>,
    pub arch: Option<PathBuf>,
    pub tokenizer: Option<PathBuf>,
    #[serde(default)]
    pub prompt: String,
    #[serde(default = "default_threads")]
    pub threads: usize,
    #[serde(default)]
    pub seed: u64,
    /// "cpu" or "onnx".
    #[serde(default = "default_backend")]
    pub backend: String,
    pub onnx: Option<RawOnnx>,
    pub acl: Option<RawAcl>,
    pub fault: Option<RawFault>,
}

fn default_backend() -> String {
    "cpu".into()
}

fn default_true() -> bool {
    true
}

fn default_provider() -> String {
    "cpu".into()
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawAcl {
    pub model_dir: Option<PathBuf>,
    #[serde(default)]
    pub device_id: i32,
    pub library: Option<PathBuf>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawOnnx {
    pub model_dir: Option<PathBuf>,
    #[serde(default = "default_provider")]
    pub provider: String,
    #[serde(default)]
    pub device_id: i32,
    pub library: Option<PathBuf>,
    #[serde(default)]
    pub threads: usize,
    #[serde(default = "default_true")]
    pub cann_graph: bool,
    pub precision_mode: Option<String>,
    #[serde(default)]
    pub tensorrt_fp16: bool,
    pub tensorrt_cache: Option<PathBuf>,
}

fn default_threads() -> usize {
    1
}

fn default_chunk_steps() -> usize {
    50
}
fn default_step_period() -> f64 {
    0.02
}
fn default_amplitude() -> f64 {
    0.3
}
fn default_frequency() -> f64 {
    0.2
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawFault {
    pub kind: String,
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

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawEvent {
    pub at_s: f64,
    pub event: String,
    #[serde(default)]
    pub duration_s: f64,
    pub camera: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRealtime {
    #[serde(default)]
    pub priority: i32,
    #[serde(default)]
    pub cpu_affinity: Vec<usize>,
    #[serde(default)]
    pub lock_memory: bool,
    #[serde(default)]
    pub spin_us: f64,
}

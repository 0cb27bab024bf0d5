//! Validated configuration. The TOML file (and any `--ros-args` parameters applied to it) is read
//! into plain serde structs (`raw`), then each section is validated by its own module into typed
//! values. Every error names where the value came from (file or parameter), the field and what
//! was expected; checks are written so NaN fails. Settings that are valid but ignored, or that
//! widen the URDF's limits, are kept as warnings.

pub(crate) mod check;
pub(crate) mod commands;
pub(crate) mod control;
pub mod describe;
pub mod drill;
pub(crate) mod file;
pub(crate) mod metrics;
pub mod openpi;
pub(crate) mod policy;
pub mod ranges;
pub mod raw;
pub(crate) mod realtime;
pub mod record;
pub(crate) mod robot;
pub(crate) mod ros;
pub mod ros_args;
pub(crate) mod rtc;
pub(crate) mod safety;
pub mod serve;
pub(crate) mod sim;
pub(crate) mod sim_task;
pub(crate) mod workspace;

use std::path::{Path, PathBuf};

pub(crate) use check::{ConfigWarning, Origin, Origins};
pub(crate) use commands::CommandGroup;
pub(crate) use control::ControlConfig;
pub use control::{Interpolation, MergeMode};
pub(crate) use openpi::ExtraValue;
pub use openpi::OpenpiOptions;
pub use policy::{AclOptions, BackendOptions, ExecutionProvider, OnnxOptions, PolicySource};
pub(crate) use policy::{FaultConfig, FaultKind, PolicyConfig};
pub(crate) use realtime::RealtimeConfig;
pub(crate) use ros::{CommandType, Middleware};
pub(crate) use ros::{RosConfig, ServiceMappingKind, TopicQos};
pub(crate) use rtc::RtcConfig;
pub use rtc::{RtcSettings, Schedule};
pub(crate) use safety::SafetyConfig;
pub(crate) use sim::{SimConfig, SimEventKind};

/// Cameras a configuration (and a recording) may have: far above any pi0 or pi0.5's (one to
/// three), low enough that a list of thousands is refused before anything is subscribed.
pub const MAX_CAMERAS: usize = 16;

use crate::robot::urdf::{self, UrdfError};
use crate::robot::{RobotLimits, Workspace};
use check::Check;
use raw::{IoKind, RawConfig};

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A file an option names cannot be read: missing, not a regular file (a FIFO would
    /// block start-up), or too large.
    #[error("{option} {}: cannot read", file.display())]
    Read {
        option: String,
        file: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{origin}: {message}")]
    Parse { origin: Origin, message: String },
    #[error("{origin}: `{field}`: {message}")]
    Invalid {
        origin: Origin,
        field: String,
        message: String,
    },
    #[error(transparent)]
    Urdf(#[from] UrdfError),
    /// The command line itself is malformed (not a file's content).
    #[error("{0}")]
    Usage(String),
}

/// What the daemon commands: the simulated arm, or a robot over ROS 2.
#[derive(Clone, Debug)]
pub(crate) enum Io {
    Sim,
    Ros(Box<RosConfig>),
}

/// One camera slot of the inputs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct CameraSource {
    /// The model camera it feeds, by name; `None` when matched by position.
    pub model_name: Option<String>,
    /// How the configuration names it (`ros.cameras.front = "/cam"`).
    pub shown: String,
}

#[derive(Clone, Debug)]
pub struct Config {
    pub file: PathBuf,
    pub urdf: PathBuf,
    pub limits: RobotLimits,
    pub workspace: Option<Workspace>,
    pub control: ControlConfig,
    pub(crate) safety: SafetyConfig,
    pub policy: PolicyConfig,
    pub sim: SimConfig,
    pub(crate) io: Io,
    pub realtime: RealtimeConfig,
    /// `[serve]`: read by `pi0d serve --config` only.
    pub serve: serve::ServeConfig,
    /// `[metrics]`: the Prometheus endpoint, when the section is there.
    pub(crate) metrics: Option<metrics::MetricsConfig>,
    /// `[record]`: the MCAP recording, when the section is there.
    pub record: Option<record::RecordConfig>,
    /// `[[drill]]`: deliberate faults at set times of the run, in time order.
    pub drills: Vec<drill::Drill>,
    /// Valid settings that are ignored or widen the URDF (logged at start, shown by `check`).
    pub warnings: Vec<ConfigWarning>,
}

impl Config {
    /// The inputs' camera slots, in order: the model camera each feeds (`None`: matched by
    /// position) and how the configuration names it, for messages.
    pub(crate) fn camera_sources(&self) -> Vec<CameraSource> {
        match &self.io {
            Io::Sim => self
                .sim
                .cameras
                .iter()
                .enumerate()
                .map(|(i, c)| CameraSource {
                    model_name: Some(c.name.clone()),
                    shown: format!("sim.cameras[{i}] (`{}`)", c.name),
                })
                .collect(),
            Io::Ros(r) => r
                .cameras
                .iter()
                .zip(&r.camera_names)
                .enumerate()
                .map(|(i, (topic, name))| CameraSource {
                    model_name: name.clone(),
                    shown: match name {
                        Some(n) => format!("ros.cameras.{n} = \"{topic}\""),
                        None => format!("ros.cameras[{i}] = \"{topic}\""),
                    },
                })
                .collect(),
        }
    }

    /// Whether anything can drill the control thread: a `[[drill]]`, or a simulator event
    /// (`crash_control`, `stall_control`). Without one the control loop runs no drill code.
    pub(crate) fn drills_control_thread(&self) -> bool {
        !self.drills.is_empty()
            || self.sim.events.iter().any(|e| {
                matches!(
                    e.kind,
                    SimEventKind::CrashControl | SimEventKind::StallControl { .. }
                )
            })
    }

    /// Camera slots the inputs provide, in order.
    pub(crate) fn camera_count(&self) -> usize {
        match &self.io {
            Io::Sim => self.sim.cameras.len(),
            Io::Ros(r) => r.cameras.len(),
        }
    }

    pub fn load(file: &Path) -> Result<Config, ConfigError> {
        Config::load_with(file, &ros_args::RosArgs::default())
    }

    pub fn parse(file: &Path, text: &str) -> Result<Config, ConfigError> {
        Config::parse_with(file, text, &ros_args::RosArgs::default())
    }

    /// Loads `file` with `--ros-args` parameters and remaps applied before validation.
    pub(crate) fn load_with(file: &Path, ros: &ros_args::RosArgs) -> Result<Config, ConfigError> {
        Config::load_named(file, "--config", ros)
    }

    /// As `load_with`; `option` is what named the file (`--config`, the `config` parameter),
    /// for the message when it cannot be read.
    pub fn load_named(
        file: &Path,
        option: &str,
        ros: &ros_args::RosArgs,
    ) -> Result<Config, ConfigError> {
        let text =
            file::read_text(file, file::MAX_TEXT_BYTES).map_err(|source| ConfigError::Read {
                option: option.to_string(),
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
        let mut table: toml::Table = toml::from_str(text).map_err(|e| ConfigError::Parse {
            origin: Origin::File(file.to_path_buf()),
            message: e.to_string().trim_end().replace('\n', " "),
        })?;
        let origins = ros_args::apply(&mut table, ros)?;
        // Every number within its setting's range before anything reads it.
        ranges::check(&Check::new(file, &origins), &table)?;
        // The path of a bad value is kept, so the error names the field (and the parameter,
        // when one set it).
        let raw: RawConfig =
            serde_path_to_error::deserialize(toml::Value::Table(table)).map_err(|e| {
                let field = e.path().to_string();
                let text = e.inner().to_string().trim_end().replace('\n', " ");
                // toml appends the key it was reading (without indices); the field is named.
                let message = match text.rfind(" in `") {
                    Some(i) if text.ends_with('`') => text[..i].to_string(),
                    _ => text,
                };
                if field == "." {
                    ConfigError::Parse {
                        origin: Origin::File(file.to_path_buf()),
                        message,
                    }
                } else {
                    ConfigError::Invalid {
                        origin: origins.of(file, &field),
                        field,
                        message,
                    }
                }
            })?;
        Config::from_raw(file, raw, ros, &origins)
    }

    /// Validates each section; `ros` only for the warnings about remaps that match nothing.
    fn from_raw(
        file: &Path,
        raw: RawConfig,
        ros: &ros_args::RosArgs,
        origins: &Origins,
    ) -> Result<Config, ConfigError> {
        let c = Check::new(file, origins);
        let names = robot::joint_names(&c, &raw.robot)?;
        let urdf_path = c.resolve(&raw.robot.urdf);
        let model = urdf::load(&urdf_path)?;
        let limits = robot::joint_limits(&c, &model, names, &raw.limits)?;
        let workspace = raw
            .workspace
            .as_ref()
            .map(|w| workspace::validate(&c, w, &model, names))
            .transpose()?;
        let control = control::validate(&c, &raw.control)?;
        control::stop_fits(&c, &control, &limits)?;
        let safety = safety::validate(&raw.safety);
        let policy = policy::validate(&c, &raw.policy, names)?;
        let mut control = control;
        control.rtc = rtc::validate(&c, &raw.control.rtc, policy.chunk_steps, &policy.source)?;
        if control.request_threshold_s >= policy.chunk_steps as f64 * policy.step_period_s {
            return c.fail(
                "control.request_threshold_s",
                format!(
                    "must be shorter than the chunk horizon (policy.chunk_steps = {} x policy.step_period_s = {} s)",
                    policy.chunk_steps, policy.step_period_s
                ),
            );
        }
        let io = match raw.robot.io {
            IoKind::Sim => {
                c.unused(
                    "ros",
                    raw.ros.is_some(),
                    "robot.io is \"sim\"; the [ros] section is used with robot.io = \"ros\"",
                );
                Io::Sim
            }
            IoKind::Ros => {
                let Some(r) = &raw.ros else {
                    return c.fail("ros", "a [ros] section is required when robot.io = \"ros\"");
                };
                c.unused(
                    "sim",
                    raw.sim.is_some(),
                    "robot.io is \"ros\"; the [sim] section drives only the simulated arm",
                );
                Io::Ros(Box::new(ros::validate(&c, r, &limits, control.rate_hz)?))
            }
        };
        let sim = sim::validate(
            &c,
            raw.sim.as_ref().unwrap_or(&Default::default()),
            &limits,
            workspace.as_ref(),
        )?;
        if matches!(io, Io::Sim) && !(sim.measurement_delay_s < safety.joint_state_timeout_s) {
            return c.fail(
                "sim.measurement_delay_s",
                format!(
                    "{} s is not below safety.joint_state_timeout_s = {} s: every joint state would arrive stale and the arm could never start",
                    sim.measurement_delay_s, safety.joint_state_timeout_s
                ),
            );
        }
        let realtime = realtime::validate(&c, &raw.realtime, control.rate_hz)?;
        let serve = raw
            .serve
            .as_ref()
            .map(|r| serve::validate(&c, r))
            .transpose()?
            .unwrap_or_default();
        let metrics = raw
            .metrics
            .as_ref()
            .map(|m| metrics::validate(&c, m))
            .transpose()?;
        let record = raw
            .record
            .as_ref()
            .map(|r| record::validate(&c, r))
            .transpose()?;
        let drills = drill::validate(&c, &raw.drill)?;
        match &io {
            Io::Ros(r) => {
                for (from, to) in ros_args::unmatched_remaps(ros, &ros_topics(r)) {
                    c.warn(
                        "ros",
                        format!("remap {from}:={to} matches no topic pi0d uses"),
                    );
                }
            }
            Io::Sim if !ros.remaps.is_empty() || ros.node.is_some() || ros.namespace.is_some() => {
                c.warn(
                    "ros",
                    "--ros-args remaps and node names are ignored: robot.io is \"sim\"",
                );
            }
            Io::Sim => {}
        }
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
            serve,
            metrics,
            record,
            drills,
            warnings: c.take_warnings(),
        })
    }
}

/// Every topic (and the service) a ROS configuration names.
fn ros_topics(r: &RosConfig) -> Vec<&str> {
    let mut t = vec![
        r.joint_states.as_str(),
        &r.prompt,
        &r.estop,
        &r.reset,
        &r.reset_service,
        &r.status_topic,
        &r.diagnostics_topic,
    ];
    t.extend(r.cameras.iter().map(String::as_str));
    t.extend(r.commands.iter().map(|g| g.topic.as_str()));
    t
}

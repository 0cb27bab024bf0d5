//! Policies produce action chunks from observations. Inference always runs on the worker thread
//! (`worker`), never on the control thread.

pub(crate) mod cameras;
pub mod export;
pub(crate) mod faulty;
pub mod graph;
pub mod openpi;
#[cfg(feature = "zenoh")]
pub(crate) mod openpi_zenoh;
pub mod pi0;
pub(crate) mod replay;
pub(crate) mod rtc;
pub(crate) mod scripted;
pub(crate) mod staging;

use crate::chunk::ActionChunk;
use crate::config::{Config, PolicySource};
use crate::observation::Observation;

#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    /// `policy.fault.kind = "error"`.
    #[error("policy failed: injected error")]
    Injected,
    /// The model here could not run on this observation.
    #[error("policy failed")]
    Model(#[source] pi0::pipeline::PipelineError),
    /// The running chunk's leftover cannot guide the model (real-time chunking).
    #[error("policy failed: the running chunk's leftover cannot guide the model")]
    Guidance(#[source] pi0::pipeline::PipelineError),
    #[error("policy returned {found} action values per step, expected {expected}")]
    WrongDimension { expected: usize, found: usize },
    #[error("policy server ({}): {message}", fault.name())]
    Remote { fault: RemoteFault, message: String },
}

/// How the accelerator a policy runs on failed, beyond the observation at hand.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AcceleratorFault {
    /// It answers no more (the device lost, its driver failed): nothing runs on it again in
    /// this process.
    Lost,
    /// An execution failed; the next one may run.
    Failed,
}

impl PolicyError {
    /// The accelerator's fault behind this error, if the error is one.
    pub fn accelerator_fault(&self) -> Option<AcceleratorFault> {
        match self {
            PolicyError::Model(e) | PolicyError::Guidance(e) => e.accelerator_fault(),
            _ => None,
        }
    }
}

/// Why a remote policy gave no chunk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RemoteFault {
    /// Not connected (refused, unreachable, waiting to reconnect).
    Down,
    /// No reply within the request timeout.
    Timeout,
    /// The connection closed during a request.
    Closed,
    /// The server answered with an error.
    ServerError,
    /// The reply is not msgpack-numpy, or has no `actions`.
    Malformed,
    /// The reply's actions have the wrong shape.
    Shape,
    /// A frame came that answers no request (a second reply, anything waiting before a
    /// request is sent): openpi's replies carry no id, so the connection is dropped.
    Unsolicited,
}

impl RemoteFault {
    pub(crate) const ALL: [RemoteFault; 7] = [
        RemoteFault::Down,
        RemoteFault::Timeout,
        RemoteFault::Closed,
        RemoteFault::ServerError,
        RemoteFault::Malformed,
        RemoteFault::Shape,
        RemoteFault::Unsolicited,
    ];

    pub(crate) fn name(self) -> &'static str {
        match self {
            RemoteFault::Down => "server_down",
            RemoteFault::Timeout => "timeout",
            RemoteFault::Closed => "closed",
            RemoteFault::ServerError => "server_error",
            RemoteFault::Malformed => "malformed_reply",
            RemoteFault::Shape => "wrong_shape",
            RemoteFault::Unsolicited => "unsolicited_reply",
        }
    }
}

/// Where one inference's time went (ms): frames, state and prompt into model inputs; the
/// prefix (vision and language); the denoising steps; the actions out (unnormalization).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct StageTiming {
    pub(crate) preprocess_ms: f64,
    pub(crate) prefix_ms: f64,
    pub(crate) steps_ms: f64,
    pub(crate) postprocess_ms: f64,
}

/// A remote policy's link, for the summary and the logs.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct RemoteStats {
    pub(crate) url: String,
    pub(crate) requests: u64,
    pub(crate) replies: u64,
    /// Connections opened after the first.
    pub reconnects: u64,
    pub connected: bool,
    /// Request-to-reply round trip, ms (the latest 1000 replies).
    pub(crate) rtt_ms_p50: f64,
    pub(crate) rtt_ms_p99: f64,
    pub(crate) rtt_ms_max: f64,
    /// The server's own `server_timing.infer_ms`, median.
    pub(crate) server_infer_ms_p50: f64,
    /// Replies to a request already answered, dropped (a second reply to a Zenoh query).
    pub replies_dropped: u64,
}

pub trait Policy: Send {
    fn name(&self) -> &str;
    /// Computes a chunk for `obs`; step 0 must be due at `obs.stamp`.
    fn infer(&mut self, obs: &Observation) -> Result<ActionChunk, PolicyError>;
    /// A remote policy's link statistics.
    fn remote_stats(&self) -> Option<RemoteStats> {
        None
    }

    /// The latest inference's stages, for a policy that runs a model here.
    fn stage_timing(&self) -> Option<StageTiming> {
        None
    }

    /// Bytes of model weights this policy holds in memory, for a model that runs here on the
    /// CPU (`pi0d check` compares it with the machine's memory).
    fn weight_bytes(&self) -> Option<u64> {
        None
    }

    /// What the policy does around its model, in words (`pi0d check`): a checkpoint's
    /// processor steps as they will run.
    fn describe(&self) -> Vec<String> {
        Vec::new()
    }

    /// Made ready before the first real request (the daemon says READY after it): a model
    /// runs one inference on `obs` (caches, page faults, lazy initialization), a remote
    /// policy connects. Nothing it returns is executed.
    fn warm_up(&mut self, obs: &Observation) -> Result<(), PolicyError> {
        let _ = obs;
        Ok(())
    }
}

#[derive(Debug, thiserror::Error)]
pub enum PolicyBuildError {
    #[error("{file}: {message}")]
    Replay { file: String, message: String },
    #[error(transparent)]
    Model(#[from] pi0::pipeline::PipelineError),
    #[error(
        "{checkpoint}: the model acts on {model} joints (output_features.action, {width_source}) but policy.action_joints lists {config}"
    )]
    ActionWidth {
        checkpoint: String,
        model: usize,
        config: usize,
        /// Where the model's width came from.
        width_source: String,
    },
    #[error("{checkpoint}: {cause}")]
    Cameras {
        checkpoint: String,
        cause: cameras::BindError,
    },
    #[error("policy.openpi ({url})")]
    Remote {
        url: String,
        #[source]
        source: openpi::OpenpiError,
    },
    #[error(
        "{checkpoint}: the model's state (input_features.observation.state) has {model} entries ({width_source}) but {layout} lists {config}"
    )]
    StateWidth {
        checkpoint: String,
        model: usize,
        config: usize,
        width_source: String,
        layout: &'static str,
    },
}

/// Builds the configured policy (with its fault injector, if any).
pub fn from_config(cfg: &Config) -> Result<Box<dyn Policy>, PolicyBuildError> {
    let p = &cfg.policy;
    let mut policy: Box<dyn Policy> = match &p.source {
        PolicySource::Scripted {
            amplitude,
            frequency_hz,
        } => Box::new(scripted::ScriptedPolicy::new(
            &cfg.limits,
            &p.action_map,
            *amplitude,
            *frequency_hz,
            p.chunk_steps,
            p.step_period_s,
            p.latency_s,
        )),
        PolicySource::Replay { file } => Box::new(replay::ReplayPolicy::load(
            file,
            p.action_map.action_dim(),
            p.latency_s,
        )?),
        PolicySource::Openpi(opts) => {
            let cameras: Vec<String> = cfg
                .camera_sources()
                .iter()
                .enumerate()
                .map(|(i, c)| c.model_name.clone().unwrap_or_else(|| format!("camera{i}")))
                .collect();
            Box::new(
                openpi::OpenpiPolicy::new(
                    opts,
                    &cameras,
                    p.action_map.action_dim(),
                    p.chunk_steps,
                    p.step_period_s,
                )
                .map_err(|source| PolicyBuildError::Remote {
                    url: opts.url.clone(),
                    source,
                })?,
            )
        }
        PolicySource::Pi0 {
            checkpoint,
            arch,
            tokenizer,
            threads,
            seed,
            backend,
            openpi_delta_actions,
        } => {
            let mut pipeline = pi0::pipeline::Pi0Pipeline::load(&pi0::pipeline::PipelineOptions {
                checkpoint: checkpoint.clone(),
                arch: arch.clone(),
                tokenizer: tokenizer.clone(),
                threads: *threads,
                backend: backend.clone(),
                openpi_delta_actions: openpi_delta_actions.clone(),
            })?;
            if pipeline.action_dim != p.action_map.action_dim() {
                return Err(PolicyBuildError::ActionWidth {
                    checkpoint: checkpoint.display().to_string(),
                    model: pipeline.action_dim,
                    config: p.action_map.action_dim(),
                    width_source: pipeline.width_source.clone(),
                });
            }
            if pipeline.state_dim != p.state.len() {
                return Err(PolicyBuildError::StateWidth {
                    checkpoint: checkpoint.display().to_string(),
                    model: pipeline.state_dim,
                    config: p.state.len(),
                    width_source: pipeline.width_source.clone(),
                    layout: p.state.field,
                });
            }
            let names_from = if checkpoint.is_dir() {
                checkpoint.join("config.json").display().to_string()
            } else {
                format!("{} (no config.json)", checkpoint.display())
            };
            let renames = pipeline.camera_renames();
            let model = cameras::ModelCameras {
                names: &pipeline.camera_names,
                count: pipeline.cameras,
                source: &names_from,
                renames: &renames,
            };
            let slots = cameras::bind(&model, &cfg.camera_sources(), &p.optional_cameras).map_err(
                |cause| PolicyBuildError::Cameras {
                    checkpoint: checkpoint.display().to_string(),
                    cause,
                },
            )?;
            pipeline.set_camera_slots(slots);
            let rtc = cfg.control.rtc;
            Box::new(
                pi0::policy::Pi0Policy::new(pipeline, p.step_period_s, *seed)
                    .with_rtc(rtc.enabled.then_some(rtc.settings))
                    .with_action_names(p.action_map.action_names.clone()),
            )
        }
    };
    if let Some(fault) = &p.fault {
        policy = Box::new(faulty::FaultyPolicy::new(policy, fault.clone()));
    }
    Ok(policy)
}

//! `[policy]`: which policy produces the chunks and, for pi0, where the model runs. The backend
//! options are plain data here; the backends (`policy::graph`) consume them.

use std::path::PathBuf;

use serde::Deserialize;

use super::check::{first_duplicate, Check};
use super::raw::{
    BackendKind, PolicyKind, ProviderKind, RawAcl, RawOnnx, RawPolicy, RawStateEntry,
};
use super::ConfigError;
use crate::joints::{ActionMap, StateLayout, StateSource};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum FaultKind {
    Nan,
    Inf,
    Jump,
    Slow,
    Panic,
    Error,
}

#[derive(Clone, Debug)]
pub(crate) struct FaultConfig {
    pub(crate) kind: FaultKind,
    /// Chunks produced normally before the fault starts.
    pub(crate) after_chunks: u32,
    /// Faulty chunks in a row; 0 means forever.
    pub(crate) count: u32,
    pub(crate) latency_s: f64,
}

/// An ONNX Runtime execution provider and its options.
#[derive(Clone, Debug, PartialEq)]
pub enum ExecutionProvider {
    Cpu,
    Cuda {
        device_id: i32,
    },
    TensorRt {
        device_id: i32,
        fp16: bool,
        /// Where built engines are cached (building one takes minutes).
        engine_cache: Option<PathBuf>,
    },
    Cann {
        device_id: i32,
        /// Run each graph as one CANN graph (`enable_cann_graph`).
        graph: bool,
        /// CANN `precision_mode` (one of `CANN_PRECISION_MODES`).
        precision_mode: Option<String>,
    },
}

/// The CANN execution provider's `precision_mode` values (read by the `onnx` backend).
#[cfg(feature = "onnx")]
pub(crate) const CANN_PRECISION_MODES: &[&str] = &[
    "force_fp32",
    "force_fp16",
    "allow_fp32_to_fp16",
    "must_keep_origin_dtype",
    "allow_mix_precision",
];

impl ExecutionProvider {
    pub(crate) fn name(&self) -> &'static str {
        match self {
            ExecutionProvider::Cpu => "cpu",
            ExecutionProvider::Cuda { .. } => "cuda",
            ExecutionProvider::TensorRt { .. } => "tensorrt",
            ExecutionProvider::Cann { .. } => "cann",
        }
    }

    /// A provider with its options defaulted but `device_id`.
    pub fn with_defaults(kind: ProviderKind, device_id: i32) -> ExecutionProvider {
        match kind {
            ProviderKind::Cpu => ExecutionProvider::Cpu,
            ProviderKind::Cuda => ExecutionProvider::Cuda { device_id },
            ProviderKind::Tensorrt => ExecutionProvider::TensorRt {
                device_id,
                fp16: false,
                engine_cache: None,
            },
            ProviderKind::Cann => ExecutionProvider::Cann {
                device_id,
                graph: true,
                precision_mode: None,
            },
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct OnnxOptions {
    /// The ONNX Runtime shared library; default `ORT_DYLIB_PATH`, else `libonnxruntime.so` from
    /// the loader's search path.
    pub library: Option<PathBuf>,
    pub provider: ExecutionProvider,
    /// Intra-op threads for the CPU provider (0: ONNX Runtime's default).
    pub threads: usize,
}

impl Default for OnnxOptions {
    fn default() -> Self {
        OnnxOptions {
            library: None,
            provider: ExecutionProvider::Cpu,
            threads: 0,
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct AclOptions {
    /// `libascendcl.so`; default: `$ASCEND_HOME_PATH/lib64`, CANN's install paths, the loader's.
    pub library: Option<PathBuf>,
    pub device_id: i32,
}

/// Where the pi0 model runs.
#[derive(Clone, Debug, PartialEq)]
pub enum BackendOptions {
    /// pi0d's own CPU implementation, from the checkpoint's weights.
    Cpu,
    /// Graphs written by `pi0d export` (`model_dir`) on ONNX Runtime.
    Onnx {
        model_dir: PathBuf,
        options: OnnxOptions,
    },
    /// The same graphs compiled by ATC (`.om`) on an Ascend NPU through AscendCL.
    Acl {
        model_dir: PathBuf,
        options: AclOptions,
    },
}

#[derive(Clone, Debug)]
pub enum PolicySource {
    /// Smooth sinusoids around the start position.
    Scripted { amplitude: f64, frequency_hz: f64 },
    /// Chunks read from a JSON file, replayed in a loop.
    Replay { file: PathBuf },
    /// A policy server speaking openpi's websocket protocol (`policy.backend = "openpi"`).
    Openpi(super::openpi::OpenpiOptions),
    /// The pi0 / pi0.5 model, on the CPU or as exported graphs.
    Pi0 {
        checkpoint: PathBuf,
        arch: Option<PathBuf>,
        tokenizer: Option<PathBuf>,
        threads: usize,
        seed: u64,
        backend: BackendOptions,
        /// An openpi checkpoint's delta actions (`policy.openpi_delta_actions`).
        openpi_delta_actions: Option<Vec<bool>>,
    },
}

impl PolicySource {
    /// One line for people (`pi0d check`); a key is never shown.
    pub(crate) fn describe(&self) -> String {
        match self {
            PolicySource::Scripted {
                amplitude,
                frequency_hz,
            } => format!("scripted motion ({amplitude} rad at {frequency_hz} Hz)"),
            PolicySource::Replay { file } => format!("replay of {}", file.display()),
            PolicySource::Openpi(o) => {
                let link = match &o.zenoh {
                    Some(z) => format!("Zenoh key {}", z.key),
                    None => format!("openpi server {}", o.url),
                };
                let images = match &o.images {
                    Some(m) => m
                        .iter()
                        .map(|(c, k)| format!("{c} -> {k}"))
                        .collect::<Vec<_>>()
                        .join(", "),
                    None => "observation.images.<camera>".into(),
                };
                format!(
                    "{link}, API key {}, images {images}, state {}, prompt {}, request timeout {} s",
                    if o.api_key.is_some() { "***" } else { "none" },
                    o.state_key,
                    o.prompt_key,
                    o.request_timeout_s
                )
            }
            PolicySource::Pi0 {
                checkpoint,
                threads,
                seed,
                backend,
                ..
            } => {
                let on = match backend {
                    BackendOptions::Cpu => format!(
                        "the CPU ({threads} thread{})",
                        if *threads == 1 { "" } else { "s" }
                    ),
                    BackendOptions::Onnx { model_dir, options } => format!(
                        "ONNX Runtime ({} provider), graphs in {}",
                        options.provider.name(),
                        model_dir.display()
                    ),
                    BackendOptions::Acl { model_dir, options } => format!(
                        "an Ascend NPU (device {}), models in {}",
                        options.device_id,
                        model_dir.display()
                    ),
                };
                format!("pi0 from {} on {on}, seed {seed}", checkpoint.display())
            }
        }
    }
}

#[derive(Clone, Debug)]
pub struct PolicyConfig {
    pub source: PolicySource,
    pub action_map: ActionMap,
    /// The state vector the policy is given.
    pub(crate) state: StateLayout,
    pub chunk_steps: usize,
    pub step_period_s: f64,
    /// Extra latency added to every inference (simulates a slower model).
    pub(crate) latency_s: f64,
    /// The task prompt until one arrives from outside.
    pub(crate) prompt: String,
    pub(crate) fault: Option<FaultConfig>,
    /// Model cameras that may have no source (fed as missing, masked images).
    pub optional_cameras: Vec<String>,
}

impl PolicyConfig {
    /// Compute threads the policy asks for (the matmul pool).
    pub fn threads(&self) -> usize {
        match &self.source {
            PolicySource::Pi0 { threads, .. } => *threads,
            _ => 1,
        }
    }
}

/// Longest task prompt accepted (the model truncates its tokens far earlier).
pub const MAX_PROMPT_BYTES: usize = 1024;

pub(crate) fn validate(
    c: &Check,
    raw: &RawPolicy,
    names: &[String],
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
    warn_unused(c, raw);
    let source = match raw.kind {
        PolicyKind::Scripted => PolicySource::Scripted {
            amplitude: raw.amplitude.unwrap_or(0.3),
            frequency_hz: raw.frequency_hz.unwrap_or(0.2),
        },
        PolicyKind::Replay => match &raw.replay_file {
            Some(f) => PolicySource::Replay { file: c.resolve(f) },
            None => {
                return c.fail(
                    "policy.replay_file",
                    "required when policy.kind = \"replay\"",
                )
            }
        },
        PolicyKind::Pi0 if raw.backend == Some(BackendKind::Zenoh) => {
            remote(c, "zenoh", "key", &raw.zenoh, super::openpi::validate_zenoh)?
        }
        PolicyKind::Pi0 if raw.backend == Some(BackendKind::Openpi) => {
            remote(c, "openpi", "url", &raw.openpi, super::openpi::validate)?
        }
        PolicyKind::Pi0 => match &raw.checkpoint {
            Some(f) => PolicySource::Pi0 {
                checkpoint: c.resolve(f),
                arch: raw.arch.as_deref().map(|p| c.resolve(p)),
                tokenizer: raw.tokenizer.as_deref().map(|p| c.resolve(p)),
                threads: raw.threads.unwrap_or(1),
                seed: raw.seed.unwrap_or(0),
                backend: backend_options(c, raw)?,
                openpi_delta_actions: raw
                    .openpi_delta_actions
                    .as_deref()
                    .map(|d| delta_mask(c, d, raw.action_joints.len()))
                    .transpose()?,
            },
            None => return c.fail("policy.checkpoint", "required when policy.kind = \"pi0\""),
        },
    };
    if let PolicySource::Openpi(o) = &source {
        action_dim_fits(c, o, raw.action_joints.len())?;
    }
    let chunk_steps = raw.chunk_steps;
    if raw.prompt.len() > MAX_PROMPT_BYTES {
        return c.fail(
            "policy.prompt",
            format!(
                "{} bytes, expected at most {MAX_PROMPT_BYTES}",
                raw.prompt.len()
            ),
        );
    }
    if let Some(dup) = first_duplicate(&raw.optional_cameras) {
        return c.fail(
            "policy.optional_cameras",
            format!("camera `{dup}` is listed twice"),
        );
    }
    let fault = raw.fault.as_ref().map(|f| FaultConfig {
        kind: f.kind,
        after_chunks: f.after_chunks,
        count: f.count,
        latency_s: f.latency_s,
    });
    Ok(PolicyConfig {
        source,
        state: state_layout(c, raw, names, &joint_of_action)?,
        action_map: ActionMap {
            action_names: raw.action_joints.clone(),
            joint_of_action,
        },
        chunk_steps,
        step_period_s: raw.step_period_s,
        latency_s: raw.latency_s.unwrap_or(0.0),
        prompt: raw.prompt.clone(),
        fault,
        optional_cameras: raw.optional_cameras.clone(),
    })
}

/// `policy.openpi_delta_actions` as openpi's `make_bool_mask` builds it: `n > 0` delta
/// dimensions, `n < 0` absolute ones, in order (`[6, -1]`: six joints relative to the state, the
/// gripper absolute); it must cover at most the action joints and make at least one delta.
fn delta_mask(c: &Check, counts: &[i64], joints: usize) -> Result<Vec<bool>, ConfigError> {
    let field = "policy.openpi_delta_actions";
    let mut mask = Vec::new();
    for &n in counts {
        let size = usize::try_from(n.unsigned_abs()).unwrap_or(usize::MAX);
        if size > joints.saturating_sub(mask.len()) {
            return c.fail(
                field,
                format!("{counts:?} covers more than the {joints} actions of policy.action_joints"),
            );
        }
        mask.extend(std::iter::repeat_n(n > 0, size));
    }
    if !mask.contains(&true) {
        return c.fail(
            field,
            format!("{counts:?} makes no dimension a delta (positive counts are delta, negative absolute, as openpi's make_bool_mask)"),
        );
    }
    Ok(mask)
}

/// A reply row must give one action per action joint: the worker takes chunks of exactly
/// `policy.action_joints` columns, so any other `action_dim` would refuse every chunk.
fn action_dim_fits(
    c: &Check,
    o: &super::openpi::OpenpiOptions,
    joints: usize,
) -> Result<(), ConfigError> {
    match o.action_dim {
        Some(d) if d != joints => {
            let section = if o.zenoh.is_some() { "zenoh" } else { "openpi" };
            c.fail(
                &format!("policy.{section}.action_dim"),
                format!(
                    "{d} reply columns, but policy.action_joints lists {joints} joints: each \
                     chunk needs one action per action joint (the reply's first {joints} \
                     columns are used); set {joints} or leave it out"
                ),
            )
        }
        _ => Ok(()),
    }
}

/// A remote backend's source from its `[policy.<backend>]` section (`required`: the one field
/// it cannot do without, for the message when the section is missing).
fn remote(
    c: &Check,
    backend: &str,
    required: &str,
    section: &Option<super::openpi::RawOpenpi>,
    validate: fn(
        &Check,
        &super::openpi::RawOpenpi,
    ) -> Result<super::openpi::OpenpiOptions, ConfigError>,
) -> Result<PolicySource, ConfigError> {
    match section {
        Some(o) => Ok(PolicySource::Openpi(validate(c, o)?)),
        None => c.fail(
            &format!("policy.{backend}"),
            format!("required when policy.backend = \"{backend}\" (at least {required})"),
        ),
    }
}

/// `policy.state`, or the measured positions in action order.
fn state_layout(
    c: &Check,
    raw: &RawPolicy,
    names: &[String],
    joint_of_action: &[usize],
) -> Result<StateLayout, ConfigError> {
    let Some(entries) = &raw.state else {
        return Ok(StateLayout {
            sources: joint_of_action
                .iter()
                .map(|&j| StateSource::Joint(j))
                .collect(),
            field: "policy.action_joints (the state's default layout)",
        });
    };
    if entries.is_empty() {
        return c.fail("policy.state", "expected at least one entry");
    }
    let mut sources = Vec::with_capacity(entries.len());
    for (i, e) in entries.iter().enumerate() {
        sources.push(match e {
            RawStateEntry::Joint(name) => match names.iter().position(|n| n == name) {
                Some(j) => StateSource::Joint(j),
                None => {
                    return c.fail(
                        &format!("policy.state[{i}]"),
                        format!("joint `{name}` is not in robot.joints"),
                    )
                }
            },
            RawStateEntry::Constant(x) => StateSource::Constant(*x),
        });
    }
    Ok(StateLayout {
        sources,
        field: "policy.state",
    })
}

/// Settings the chosen kind and backend do not read.
fn warn_unused(c: &Check, raw: &RawPolicy) {
    let kind = match raw.kind {
        PolicyKind::Pi0 => "pi0",
        PolicyKind::Scripted => "scripted",
        PolicyKind::Replay => "replay",
    };
    let not = |field: &str, given: bool, users: &str| {
        c.unused(
            field,
            given,
            &format!("policy.kind is \"{kind}\"; only {users} uses it"),
        )
    };
    let pi0 = raw.kind == PolicyKind::Pi0;
    let scripted = raw.kind == PolicyKind::Scripted;
    not(
        "policy.optional_cameras",
        !raw.optional_cameras.is_empty() && !pi0,
        "pi0",
    );
    not("policy.state", raw.state.is_some() && !pi0, "pi0");
    not(
        "policy.openpi_delta_actions",
        raw.openpi_delta_actions.is_some() && !pi0,
        "pi0",
    );
    not(
        "policy.amplitude",
        raw.amplitude.is_some() && !scripted,
        "scripted",
    );
    not(
        "policy.frequency_hz",
        raw.frequency_hz.is_some() && !scripted,
        "scripted",
    );
    not(
        "policy.replay_file",
        raw.replay_file.is_some() && raw.kind != PolicyKind::Replay,
        "replay",
    );
    not(
        "policy.latency_s",
        raw.latency_s.is_some() && pi0,
        "scripted or replay",
    );
    for (field, given) in [
        ("policy.checkpoint", raw.checkpoint.is_some()),
        ("policy.arch", raw.arch.is_some()),
        ("policy.tokenizer", raw.tokenizer.is_some()),
        ("policy.threads", raw.threads.is_some()),
        ("policy.seed", raw.seed.is_some()),
        ("policy.backend", raw.backend.is_some()),
        ("policy.onnx", raw.onnx.is_some()),
        ("policy.acl", raw.acl.is_some()),
        ("policy.openpi", raw.openpi.is_some()),
        ("policy.zenoh", raw.zenoh.is_some()),
    ] {
        not(field, given && !pi0, "pi0");
    }
    if pi0 {
        let backend = raw.backend.unwrap_or_default();
        c.unused(
            "policy.openpi",
            raw.openpi.is_some() && backend != BackendKind::Openpi,
            "only policy.backend = \"openpi\" uses it",
        );
        c.unused(
            "policy.zenoh",
            raw.zenoh.is_some() && backend != BackendKind::Zenoh,
            "only policy.backend = \"zenoh\" uses it",
        );
        let remote = matches!(backend, BackendKind::Openpi | BackendKind::Zenoh);
        for (field, given) in [
            ("policy.checkpoint", raw.checkpoint.is_some()),
            ("policy.arch", raw.arch.is_some()),
            ("policy.tokenizer", raw.tokenizer.is_some()),
            ("policy.threads", raw.threads.is_some()),
            ("policy.seed", raw.seed.is_some()),
        ] {
            c.unused(
                field,
                given && remote,
                "the policy runs on a server (policy.backend): the server has the model",
            );
        }
        c.unused(
            "policy.onnx",
            raw.onnx.is_some() && backend != BackendKind::Onnx,
            "only policy.backend = \"onnx\" uses it",
        );
        c.unused(
            "policy.acl",
            raw.acl.is_some() && backend != BackendKind::Acl,
            "only policy.backend = \"acl\" uses it",
        );
    }
}

/// `policy.backend` with `[policy.onnx]` / `[policy.acl]`.
fn backend_options(c: &Check, raw: &RawPolicy) -> Result<BackendOptions, ConfigError> {
    match raw.backend.unwrap_or_default() {
        BackendKind::Cpu => Ok(BackendOptions::Cpu),
        BackendKind::Onnx => match &raw.onnx {
            None => c.fail(
                "policy.onnx",
                "required when policy.backend = \"onnx\" (at least model_dir)",
            ),
            Some(o) => onnx_options(c, o),
        },
        BackendKind::Acl => match &raw.acl {
            None => c.fail(
                "policy.acl",
                "required when policy.backend = \"acl\" (at least model_dir)",
            ),
            Some(a) => acl_options(c, a),
        },
        // Taken apart in `validate`: there is no local model.
        BackendKind::Openpi | BackendKind::Zenoh => {
            c.fail("policy.backend", "a remote backend has no local model")
        }
    }
}

fn onnx_options(c: &Check, o: &RawOnnx) -> Result<BackendOptions, ConfigError> {
    let Some(dir) = &o.model_dir else {
        return c.fail(
            "policy.onnx.model_dir",
            "required: the directory `pi0d export` wrote",
        );
    };
    let device_id = o.device_id.unwrap_or(0);
    let p = o.provider;
    let only = |users: &str| format!("only provider {users} uses it");
    c.unused(
        "policy.onnx.device_id",
        o.device_id.is_some() && p == ProviderKind::Cpu,
        &only("cuda, tensorrt or cann"),
    );
    c.unused(
        "policy.onnx.cann_graph",
        o.cann_graph.is_some() && p != ProviderKind::Cann,
        &only("cann"),
    );
    c.unused(
        "policy.onnx.precision_mode",
        o.precision_mode.is_some() && p != ProviderKind::Cann,
        &only("cann"),
    );
    c.unused(
        "policy.onnx.tensorrt_fp16",
        o.tensorrt_fp16.is_some() && p != ProviderKind::Tensorrt,
        &only("tensorrt"),
    );
    c.unused(
        "policy.onnx.tensorrt_cache",
        o.tensorrt_cache.is_some() && p != ProviderKind::Tensorrt,
        &only("tensorrt"),
    );
    let provider = match ExecutionProvider::with_defaults(p, device_id) {
        ExecutionProvider::TensorRt { device_id, .. } => ExecutionProvider::TensorRt {
            device_id,
            fp16: o.tensorrt_fp16.unwrap_or(false),
            engine_cache: o.tensorrt_cache.as_deref().map(|p| c.resolve(p)),
        },
        ExecutionProvider::Cann { device_id, .. } => ExecutionProvider::Cann {
            device_id,
            graph: o.cann_graph.unwrap_or(true),
            precision_mode: o.precision_mode.map(|m| m.as_str().to_string()),
        },
        other => other,
    };
    Ok(BackendOptions::Onnx {
        model_dir: c.resolve(dir),
        options: OnnxOptions {
            library: o.library.as_deref().map(|p| c.resolve(p)),
            provider,
            threads: o.threads,
        },
    })
}

fn acl_options(c: &Check, a: &RawAcl) -> Result<BackendOptions, ConfigError> {
    let Some(dir) = &a.model_dir else {
        return c.fail(
            "policy.acl.model_dir",
            "required: the directory `pi0d export` wrote, with the .om files ATC made",
        );
    };
    Ok(BackendOptions::Acl {
        model_dir: c.resolve(dir),
        options: AclOptions {
            library: a.library.as_deref().map(|p| c.resolve(p)),
            device_id: a.device_id,
        },
    })
}

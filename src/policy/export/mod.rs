//! `pi0d export`: pi0 / pi0.5 checkpoints to static ONNX graphs (prefix + denoise step, or the
//! steps unrolled) with a `manifest.json`, built in Rust from the checkpoint's tensors. No Python
//! is involved; ONNX Runtime, TensorRT and Ascend's ATC take the result.

pub mod atc;
pub(crate) mod builder;
pub mod calibration;
pub mod cost;
pub mod pi0;
pub mod proto;
pub(crate) mod write;

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::policy::graph::manifest::{self, CheckpointInfo, Graphs, Manifest};
use crate::policy::pi0::checkpoint::{ArchOverrides, Checkpoint, CheckpointError};
use crate::policy::pi0::model::{Arch, Variant};
use crate::policy::pi0::quant::calibrate::{collect_any, Purpose};
use crate::policy::pi0::quant::{ActivationRange, QuantizeError, Scheme};
use crate::policy::staging::{Staging, StagingError};
use pi0::{ExportDtype, GraphSizes, Pi0GraphBuilder};
pub(crate) use write::ClampReport;
pub use write::ExternalData;

#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    /// Writing the export failed (the machine's fault: exit 9).
    #[error("{path}: cannot write it")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: cannot read it")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: not an ONNX model")]
    NotOnnx {
        path: PathBuf,
        #[source]
        source: prost::DecodeError,
    },
    #[error("tensor `{tensor}`: {count} values exceed float16's range (largest magnitude {max_abs}): refusing to write Inf; pass --clamp-f16 to saturate them to +-65504 instead")]
    F16Overflow {
        tensor: String,
        count: usize,
        max_abs: f32,
    },
    #[error("tensor `{tensor}`: non-finite value at index {index}")]
    NonFinite { tensor: String, index: usize },
    #[error("tensor `{tensor}` cannot be quantized")]
    Quantize {
        tensor: String,
        #[source]
        source: pi0d_kernels::quant::QuantError,
    },
    #[error("{0}")]
    Invalid(String),
    /// Running the float model on `--calibration`'s inputs failed.
    #[error(transparent)]
    Calibration(#[from] QuantizeError),
}

impl From<StagingError> for ExportError {
    fn from(e: StagingError) -> ExportError {
        match e {
            StagingError::Io { path, source } => ExportError::Io { path, source },
            StagingError::Refused(message) => ExportError::Invalid(message),
        }
    }
}

impl ExportError {
    /// The checkpoint or the options were at fault (exit 1), rather than writing (exit 9).
    pub fn is_input_error(&self) -> bool {
        !matches!(self, ExportError::Io { .. })
    }
}

#[derive(Clone, Debug)]
pub struct ExportOptions {
    pub checkpoint: PathBuf,
    pub arch: Option<PathBuf>,
    pub out: PathBuf,
    pub cameras: usize,
    pub batch: usize,
    /// Prompt tokens (default: the checkpoint's tokenizer length, else 48 / 200 for pi0.5).
    pub prompt_len: Option<usize>,
    pub dtype: ExportDtype,
    pub unroll: bool,
    /// Real-time chunking's guidance as inputs of the unrolled graph.
    pub rtc: bool,
    pub external: ExternalData,
    pub clamp_f16: bool,
    /// Quantize the float linear weights of `pi0d quantize`'s default groups (`w8` or `w4`);
    /// a checkpoint `pi0d quantize` wrote keeps its own scheme without it.
    pub quant: Option<Scheme>,
    /// The graphs are for Ascend's ATC (`--atc`), which takes no quantized weights.
    pub for_atc: bool,
    pub progress: bool,
    /// Recordings or `pi0d infer` inputs the float model is run on to measure its activations'
    /// magnitudes against float16's range (`ExportReport::activations`).
    pub calibration: Vec<PathBuf>,
}

impl ExportOptions {
    /// f32 graphs for batch 1 and the checkpoint's prompt length, steps looped, weights inline
    /// unless too large, no progress bar.
    pub fn new(checkpoint: PathBuf, out: PathBuf, cameras: usize) -> ExportOptions {
        ExportOptions {
            checkpoint,
            arch: None,
            out,
            cameras,
            batch: 1,
            prompt_len: None,
            dtype: ExportDtype::F32,
            unroll: false,
            rtc: false,
            external: ExternalData::Auto,
            clamp_f16: false,
            quant: None,
            for_atc: false,
            progress: false,
            calibration: Vec::new(),
        }
    }
}

/// What an export wrote.
pub struct ExportReport {
    pub manifest: Manifest,
    pub clamped: Vec<ClampReport>,
    /// With `--calibration`: the largest activations per layer group, on the CPU in f32.
    pub activations: Vec<ActivationRange>,
    /// With `--atc` and `--calibration`: each graph's inputs written for ATC's int8
    /// calibration (prefix, then denoise).
    pub atc_calibration: Vec<calibration::GraphCalibration>,
}

fn checkpoint_hash(ck: &Checkpoint) -> String {
    let mut h = Sha256::new();
    for (_, bytes) in ck.files() {
        h.update(bytes);
    }
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

pub fn export(opts: &ExportOptions) -> Result<ExportReport, ExportError> {
    let overrides = opts.arch.as_deref().map(ArchOverrides::load).transpose()?;
    let ck = Checkpoint::load(&opts.checkpoint)?;
    let arch = Arch::from_checkpoint(&ck, overrides)?;
    let trained_rtc = ck
        .config
        .trained_rtc(&ck.path, arch.variant == Variant::Pi05)?;
    if let (Some(d), true) = (trained_rtc, opts.rtc) {
        return Err(ExportError::Invalid(format!(
            "--rtc: {}/config.json has rtc_training_max_delay = {d}: this pi0.5 is conditioned on the leftover as it was trained, not guided; its graphs take the clamped steps without --rtc",
            ck.path.display()
        )));
    }
    if opts.cameras == 0 || opts.batch == 0 {
        return Err(ExportError::Invalid(format!(
            "--cameras {} and --batch {} must be at least 1",
            opts.cameras, opts.batch
        )));
    }
    if opts.rtc && !opts.unroll {
        return Err(ExportError::Invalid(
            "--rtc goes with --unroll: looped graphs take real-time chunking on the host, step by step"
                .into(),
        ));
    }
    let pi05 = arch.variant == Variant::Pi05;
    // The tokens the checkpoint's tokenizer step makes, else config.json's length.
    let saved = if opts.checkpoint.is_dir() {
        crate::policy::pi0::processor::saved_prompt_len(&opts.checkpoint)
            .map_err(|e| ExportError::Invalid(e.to_string()))?
    } else {
        None
    };
    let prompt_len = opts
        .prompt_len
        .or(saved)
        .unwrap_or_else(|| crate::policy::pi0::model::prompt_len(&ck.config, arch.variant));
    if prompt_len == 0 {
        return Err(ExportError::Invalid(
            "--prompt-len must be at least 1".into(),
        ));
    }
    let sizes = GraphSizes {
        batch: opts.batch,
        cameras: opts.cameras,
        prompt_len,
    };
    let quant = quant_scheme(&ck, opts)?;
    // The float model runs calibration's inputs on every core.
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let activations = if opts.calibration.is_empty() {
        Vec::new()
    } else {
        collect_any(
            &opts.checkpoint,
            opts.arch.as_deref(),
            &opts.calibration,
            Purpose::Ranges,
            threads,
        )?
        .ranges()
    };
    let mut b = Pi0GraphBuilder::new(&ck, arch.clone(), opts.dtype, sizes);
    b.quant = quant;
    b.trained_rtc = trained_rtc.is_some();
    let prefix = b.prefix_graph();
    let denoise = b.denoise_graph(opts.unroll, opts.rtc);
    // Quantized graphs are for ONNX Runtime (MatMulNBits is its own operator).
    for g in [&prefix, &denoise].into_iter().filter(|_| quant.is_none()) {
        let ops: Vec<&str> = g.nodes.iter().map(|n| n.op_type.as_str()).collect();
        if let Some(op) = ops.iter().find(|op| !atc::ATC_OPS.contains(op)) {
            return Err(ExportError::Invalid(format!(
                "graph {} uses {op}, which is not on the ATC operator list",
                g.name
            )));
        }
    }
    let total: u64 = [&prefix, &denoise]
        .iter()
        .flat_map(|g| &g.initializers)
        .map(|i| i.byte_len() as u64)
        .sum();
    let bar = if opts.progress {
        let bar = indicatif::ProgressBar::new(total);
        // A constant template: if it ever failed to parse, the default style would do.
        if let Ok(style) = indicatif::ProgressStyle::with_template(
            "{msg:8} [{bar:40}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
        ) {
            bar.set_style(style.progress_chars("=> "));
        }
        bar
    } else {
        indicatif::ProgressBar::hidden()
    };
    let sha = checkpoint_hash(&ck);
    let variant = if pi05 { "pi05" } else { "pi0" };
    let dtype_name = serde_json::to_value(opts.dtype)
        .ok()
        .and_then(|v| v.as_str().map(String::from))
        .unwrap_or_default();
    let meta = [
        ("pi0d.variant", variant.to_string()),
        ("pi0d.dtype", dtype_name),
        ("pi0d.checkpoint_sha256", sha.clone()),
    ];
    let staging = Staging::new(&opts.out, manifest::FILE, "export")?;
    let mut writer = write::GraphWriter {
        dir: &staging.tmp,
        external: opts.external,
        clamp_f16: opts.clamp_f16,
        metadata: meta.to_vec(),
        progress: &bar,
        clamped: Vec::new(),
    };
    bar.set_message("prefix");
    let prefix_entry = writer.write(prefix, "prefix.onnx")?;
    bar.set_message("denoise");
    let denoise_file = if opts.unroll {
        "denoise_unrolled.onnx"
    } else {
        "denoise_step.onnx"
    };
    let denoise_entry = writer.write(denoise, denoise_file)?;
    let clamped = writer.clamped;
    bar.finish_and_clear();
    let m = Manifest {
        format: manifest::FORMAT.into(),
        producer: format!("pi0d {}", env!("CARGO_PKG_VERSION")),
        variant: variant.into(),
        dtype: opts.dtype,
        opset: write::OPSET,
        batch: sizes.batch,
        cameras: sizes.cameras,
        prompt_len,
        image_size: arch.image_size,
        tokens_per_image: arch.tokens_per_image(),
        prefix_len: sizes.prefix_len(&arch),
        suffix_len: pi0::suffix_len(&arch),
        chunk: arch.chunk,
        action_dim: arch.action_dim,
        state_dim: arch.state_dim,
        steps: arch.steps,
        dt: -1.0 / arch.steps as f32,
        layers: arch.layers,
        head_dim: arch.head_dim,
        kv_dim: arch.kv_heads * arch.head_dim,
        expert_width: arch.expert_width,
        vocab: arch.vocab,
        mask_value: opts.dtype.mask_value(),
        min_period: ck.config.min_period,
        max_period: ck.config.max_period,
        unrolled: opts.unroll,
        rtc: opts.rtc,
        trained_rtc,
        quant,
        graphs: Graphs {
            prefix: prefix_entry,
            denoise: denoise_entry,
        },
        checkpoint: CheckpointInfo {
            path: opts.checkpoint.display().to_string(),
            sha256: sha,
        },
    };
    let path = staging.tmp.join(manifest::FILE);
    let text = serde_json::to_string_pretty(&m)
        .map_err(|e| ExportError::Invalid(format!("the manifest does not serialize: {e}")))?;
    std::fs::write(&path, text + "\n").map_err(|e| ExportError::Io { path, source: e })?;
    let atc_calibration = if opts.for_atc && !opts.calibration.is_empty() {
        calibration::write_inputs(
            &staging.tmp,
            &m,
            &opts.checkpoint,
            opts.arch.as_deref(),
            &opts.calibration,
            threads,
        )?
        .to_vec()
    } else {
        Vec::new()
    };
    staging.commit()?;
    Ok(ExportReport {
        manifest: m,
        clamped,
        activations,
        atc_calibration,
    })
}

/// The scheme the graphs store their linear weights in: `--quant`'s, or the one `pi0d quantize`
/// wrote the checkpoint in; a conflict between the two, or a quantized export in f16, is
/// refused.
fn quant_scheme(ck: &Checkpoint, opts: &ExportOptions) -> Result<Option<Scheme>, ExportError> {
    let stored = pi0::qlinear::stored_scheme(ck);
    match (opts.quant, stored) {
        (Some(Scheme::Bf16), _) => {
            return Err(ExportError::Invalid(
                "--quant bf16: expected w8 or w4 (bf16 weights are --dtype bf16)".into(),
            ))
        }
        (Some(q), Some(s)) if q != s => {
            return Err(ExportError::Invalid(format!(
                "--quant {q}: {} is already quantized as {s}; export it without --quant, or quantize the float checkpoint it was made from",
                opts.checkpoint.display()
            )))
        }
        _ => {}
    }
    let quant = opts.quant.or(stored);
    if let (Some(q), true) = (quant, opts.for_atc) {
        return Err(ExportError::Invalid(format!(
            "--atc: the weights are {q}, and quantized graphs use ONNX Runtime's MatMulNBits / DequantizeLinear, which ATC does not take: export the float checkpoint for Ascend"
        )));
    }
    if let (Some(q), ExportDtype::F16) = (quant, opts.dtype) {
        return Err(ExportError::Invalid(format!(
            "--dtype f16 with {q} weights: quantized weights are widened to f32 for compute; export with --dtype f32 or bf16"
        )));
    }
    Ok(quant)
}

/// Reads an exported graph file back (tests, self-checks).
pub fn read_model(path: &Path) -> Result<proto::ModelProto, ExportError> {
    let bytes = crate::files::read_regular_bytes(path).map_err(|source| ExportError::Read {
        path: path.into(),
        source,
    })?;
    proto::decode_model(&bytes).map_err(|source| ExportError::NotOnnx {
        path: path.into(),
        source,
    })
}

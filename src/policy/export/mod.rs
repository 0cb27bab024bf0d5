//! `pi0d export`: pi0 / pi0.5 checkpoints to static ONNX graphs (prefix + denoise step, or the
//! steps unrolled) with a `manifest.json`, built in Rust from the checkpoint's tensors. No Python
//! is involved; ONNX Runtime, TensorRT and Ascend's ATC take the result.

pub mod atc;
pub mod builder;
pub mod cost;
pub mod pi0;
pub mod proto;
pub mod write;

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::policy::graph::manifest::{self, CheckpointInfo, Graphs, Manifest};
use crate::policy::pi0::checkpoint::{ArchOverrides, Checkpoint, CheckpointError};
use crate::policy::pi0::model::{Arch, Variant};
use pi0::{ExportDtype, GraphSizes, Pi0GraphBuilder};
pub use write::{ClampReport, ExternalData};

#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("tensor `{tensor}`: {count} values exceed float16's range (largest magnitude {max_abs}): refusing to write Inf; pass --clamp-f16 to saturate them to +-65504 instead")]
    F16Overflow {
        tensor: String,
        count: usize,
        max_abs: f32,
    },
    #[error("tensor `{tensor}`: non-finite value at index {index}")]
    NonFinite { tensor: String, index: usize },
    #[error("{0}")]
    Invalid(String),
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
    pub external: ExternalData,
    pub clamp_f16: bool,
    pub progress: bool,
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
            external: ExternalData::Auto,
            clamp_f16: false,
            progress: false,
        }
    }
}

/// What an export wrote.
pub struct ExportReport {
    pub manifest: Manifest,
    pub clamped: Vec<ClampReport>,
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
    if opts.cameras == 0 || opts.batch == 0 {
        return Err(ExportError::Invalid(format!(
            "--cameras {} and --batch {} must be at least 1",
            opts.cameras, opts.batch
        )));
    }
    let pi05 = arch.variant == Variant::Pi05;
    let prompt_len = opts
        .prompt_len
        .or(ck.config.tokenizer_max_length)
        .unwrap_or(if pi05 { 200 } else { 48 });
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
    std::fs::create_dir_all(&opts.out).map_err(|e| ExportError::Io {
        path: opts.out.clone(),
        source: e,
    })?;
    let b = Pi0GraphBuilder::new(&ck, arch.clone(), opts.dtype, sizes);
    let prefix = b.prefix_graph();
    let denoise = b.denoise_graph(opts.unroll);
    for g in [&prefix, &denoise] {
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
        bar.set_style(
            indicatif::ProgressStyle::with_template(
                "{msg:8} [{bar:40}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
            )
            .expect("static template")
            .progress_chars("=> "),
        );
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
    let mut writer = write::GraphWriter {
        dir: &opts.out,
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
        graphs: Graphs {
            prefix: prefix_entry,
            denoise: denoise_entry,
        },
        checkpoint: CheckpointInfo {
            path: opts.checkpoint.display().to_string(),
            sha256: sha,
        },
    };
    let path = opts.out.join(manifest::FILE);
    let text = serde_json::to_string_pretty(&m).expect("manifest serializes");
    std::fs::write(&path, text + "\n").map_err(|e| ExportError::Io { path, source: e })?;
    Ok(ExportReport {
        manifest: m,
        clamped,
    })
}

/// Reads an exported graph file back (tests, self-checks).
pub fn read_model(path: &Path) -> Result<proto::ModelProto, ExportError> {
    let bytes = std::fs::read(path).map_err(|e| ExportError::Io {
        path: path.into(),
        source: e,
    })?;
    proto::decode_model(&bytes)
        .map_err(|e| ExportError::Invalid(format!("{}: not an ONNX model: {e}", path.display())))
}

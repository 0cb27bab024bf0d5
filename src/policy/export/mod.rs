//! `pi0d export`: pi0 / pi0.5 checkpoints to static ONNX graphs (prefix + denoise step, or the
//! steps unrolled) with a `manifest.json`, built in Rust from the checkpoint's tensors. No Python
//! is involved; ONNX Runtime, TensorRT and Ascend's ATC take the result.

pub mod atc;
pub(crate) mod builder;
pub mod cost;
pub mod pi0;
pub(crate) mod proto;
pub(crate) mod write;

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::policy::graph::manifest::{self, CheckpointInfo, Graphs, Manifest};
use crate::policy::pi0::checkpoint::{ArchOverrides, Checkpoint, CheckpointError};
use crate::policy::pi0::model::{Arch, Variant};
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
    #[error("{0}")]
    Invalid(String),
}

impl ExportError {
    /// The checkpoint or the options were at fault (exit 1), rather than writing (exit 9).
    pub fn is_input_error(&self) -> bool {
        !matches!(self, ExportError::Io { .. })
    }
}

/// The export's directory while it is written: `OUT.tmp-<pid>` beside `OUT` (same filesystem),
/// renamed into place only once everything is written, and removed otherwise (also on panic).
/// An older export at `OUT` is moved aside, replaced, then deleted: `OUT` never holds a mix.
struct Staging {
    out: PathBuf,
    tmp: PathBuf,
    old: PathBuf,
    committed: bool,
}

impl Staging {
    fn new(out: &Path) -> Result<Staging, ExportError> {
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| ExportError::Io { path, source }
        };
        let name = out.file_name().ok_or_else(|| {
            ExportError::Invalid(format!(
                "--out {}: name the export's directory (it is written beside it, then renamed)",
                out.display()
            ))
        })?;
        match std::fs::symlink_metadata(out) {
            Ok(meta) if meta.is_dir() => {
                let empty = std::fs::read_dir(out).map_err(io(out))?.next().is_none();
                if !empty && !out.join(manifest::FILE).is_file() {
                    return Err(ExportError::Invalid(format!(
                        "{} exists and is not a pi0d export (no {}): refusing to replace it",
                        out.display(),
                        manifest::FILE
                    )));
                }
            }
            Ok(_) => {
                return Err(ExportError::Invalid(format!(
                    "{} exists and is not a directory: refusing to replace it",
                    out.display()
                )))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io(out)(e)),
        }
        let parent = match out.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        std::fs::create_dir_all(&parent).map_err(io(&parent))?;
        let beside = |what: &str| {
            let mut n = name.to_os_string();
            n.push(format!(".{what}-{}", std::process::id()));
            parent.join(n)
        };
        let staging = Staging {
            out: out.to_path_buf(),
            tmp: beside("tmp"),
            old: beside("old"),
            committed: false,
        };
        // Left by an earlier run that died with this pid: never anyone's data.
        let _ = std::fs::remove_dir_all(&staging.tmp);
        std::fs::create_dir(&staging.tmp).map_err(io(&staging.tmp))?;
        Ok(staging)
    }

    fn commit(mut self) -> Result<(), ExportError> {
        let had_old = self.out.exists();
        if had_old {
            std::fs::rename(&self.out, &self.old).map_err(|source| ExportError::Io {
                path: self.out.clone(),
                source,
            })?;
        }
        if let Err(source) = std::fs::rename(&self.tmp, &self.out) {
            if had_old {
                let _ = std::fs::rename(&self.old, &self.out);
            }
            return Err(ExportError::Io {
                path: self.out.clone(),
                source,
            });
        }
        self.committed = true;
        if had_old {
            if let Err(e) = std::fs::remove_dir_all(&self.old) {
                tracing::warn!(path = %self.old.display(), error = %e, "cannot remove the replaced export");
            }
        }
        Ok(())
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        if !self.committed {
            let _ = std::fs::remove_dir_all(&self.tmp);
        }
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
            rtc: false,
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
    if opts.rtc && !opts.unroll {
        return Err(ExportError::Invalid(
            "--rtc goes with --unroll: looped graphs take real-time chunking on the host, step by step"
                .into(),
        ));
    }
    let pi05 = arch.variant == Variant::Pi05;
    let prompt_len = opts
        .prompt_len
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
    let b = Pi0GraphBuilder::new(&ck, arch.clone(), opts.dtype, sizes);
    let prefix = b.prefix_graph();
    let denoise = b.denoise_graph(opts.unroll, opts.rtc);
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
    let staging = Staging::new(&opts.out)?;
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
    staging.commit()?;
    Ok(ExportReport {
        manifest: m,
        clamped,
    })
}

/// Reads an exported graph file back (tests, self-checks).
pub fn read_model(path: &Path) -> Result<proto::ModelProto, ExportError> {
    let bytes = std::fs::read(path).map_err(|source| ExportError::Read {
        path: path.into(),
        source,
    })?;
    proto::decode_model(&bytes).map_err(|source| ExportError::NotOnnx {
        path: path.into(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> crate::test_dirs::TempDir {
        crate::test_dirs::TempDir::new(&format!("staging-{name}"))
    }

    /// Names in `dir`, sorted.
    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn when_staging_is_dropped_uncommitted_expect_nothing_left() {
        let dir = scratch("dropped");
        let out = dir.join("graphs");
        let s = Staging::new(&out).unwrap();
        std::fs::write(s.tmp.join("prefix.onnx"), b"half").unwrap();
        drop(s);
        assert!(names(&dir).is_empty(), "{:?}", names(&dir));
    }

    #[test]
    fn when_staging_commits_over_an_older_export_expect_it_replaced_whole() {
        let dir = scratch("replace");
        let out = dir.join("graphs");
        std::fs::create_dir(&out).unwrap();
        for f in [manifest::FILE, "denoise_step.onnx"] {
            std::fs::write(out.join(f), b"old").unwrap();
        }
        let s = Staging::new(&out).unwrap();
        for f in [manifest::FILE, "denoise_unrolled.onnx"] {
            std::fs::write(s.tmp.join(f), b"new").unwrap();
        }
        s.commit().unwrap();
        assert_eq!(names(&dir), ["graphs"]);
        assert_eq!(names(&out), ["denoise_unrolled.onnx", "manifest.json"]);
        assert_eq!(std::fs::read(out.join(manifest::FILE)).unwrap(), b"new");
    }

    #[test]
    fn when_target_is_not_an_export_expect_refusal_and_its_files_kept() {
        let dir = scratch("foreign");
        let notes = dir.join("notes");
        std::fs::create_dir(&notes).unwrap();
        std::fs::write(notes.join("todo.txt"), b"keep me").unwrap();
        let e = Staging::new(&notes).err().unwrap().to_string();
        assert!(
            e.contains("is not a pi0d export (no manifest.json): refusing to replace it"),
            "{e}"
        );
        std::fs::write(dir.join("file"), b"x").unwrap();
        let e = Staging::new(&dir.join("file")).err().unwrap().to_string();
        assert!(e.contains("exists and is not a directory"), "{e}");
        assert!(Staging::new(Path::new("/")).is_err());
        assert_eq!(names(&dir), ["file", "notes"]);
        assert_eq!(std::fs::read(notes.join("todo.txt")).unwrap(), b"keep me");
        // An empty directory (made for the export beforehand) is taken.
        let empty = dir.join("empty");
        std::fs::create_dir(&empty).unwrap();
        Staging::new(&empty).unwrap().commit().unwrap();
        assert!(empty.is_dir());
    }
}

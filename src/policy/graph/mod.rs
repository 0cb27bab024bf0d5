//! pi0 as compiled graphs (written by `pi0d export`): the host-side driver shared by every
//! graph runtime. The driver makes the tables, runs the prefix once per observation and the
//! denoise graph once per step (or once, unrolled); a runtime only moves tensors in and out of
//! its device and keeps the KV cache there between the two graphs.

pub mod acl;
pub mod manifest;
#[cfg(feature = "onnx")]
pub mod onnx;
pub mod provider;
pub mod tables;

use std::time::Instant;

use manifest::Manifest;
use tables::{PrefixTables, SuffixTables};

#[derive(Debug, thiserror::Error)]
pub enum GraphError {
    #[error(transparent)]
    Manifest(#[from] manifest::ManifestError),
    #[error("{0}")]
    Runtime(String),
    #[error("input `{name}`: {message}")]
    Input { name: String, message: String },
}

/// What a graph runtime does; all slices are row-major f32/i64 for the whole batch.
pub trait GraphRuntime: Send {
    /// Runs the prefix graph; the KV cache stays with the runtime.
    fn run_prefix(
        &mut self,
        images: &[&[f32]],
        tokens: &[i64],
        tables: &PrefixTables,
    ) -> Result<(), GraphError>;

    /// Runs every denoising step on the cached KV: `x` goes from noise to actions; `time` holds
    /// each step's embedding (`[steps, B, ew]`). A looped graph runs once per step, an unrolled
    /// one once.
    fn run_denoise(
        &mut self,
        state: Option<&[f32]>,
        x: &mut [f32],
        time: &[f32],
        tables: &SuffixTables,
    ) -> Result<(), GraphError>;
}

impl GraphRuntime for Box<dyn GraphRuntime> {
    fn run_prefix(
        &mut self,
        images: &[&[f32]],
        tokens: &[i64],
        tables: &PrefixTables,
    ) -> Result<(), GraphError> {
        (**self).run_prefix(images, tokens, tables)
    }

    fn run_denoise(
        &mut self,
        state: Option<&[f32]>,
        x: &mut [f32],
        time: &[f32],
        tables: &SuffixTables,
    ) -> Result<(), GraphError> {
        (**self).run_denoise(state, x, time, tables)
    }
}

/// The exported graphs in `dir` on ONNX Runtime.
pub fn load_onnx(
    dir: &std::path::Path,
    manifest: Manifest,
    opts: &provider::OnnxOptions,
) -> Result<GraphModel<Box<dyn GraphRuntime>>, GraphError> {
    #[cfg(feature = "onnx")]
    {
        let rt = onnx::OnnxRuntime::load(dir, &manifest, opts)?;
        Ok(GraphModel::new(manifest, Box::new(rt)))
    }
    #[cfg(not(feature = "onnx"))]
    {
        let _ = (dir, manifest, opts);
        Err(GraphError::Runtime(
            "this pi0d was built without the `onnx` feature (cargo build --features onnx)".into(),
        ))
    }
}

/// The exported graphs in `dir`, compiled by ATC (`.om`), on an Ascend NPU through AscendCL.
pub fn load_acl(
    dir: &std::path::Path,
    manifest: Manifest,
    opts: &acl::AclOptions,
) -> Result<GraphModel<Box<dyn GraphRuntime>>, GraphError> {
    let rt = acl::AclRuntime::load(dir, &manifest, opts)?;
    Ok(GraphModel::new(manifest, Box::new(rt)))
}

/// One batch of model inputs (preprocessed, as `pi0d infer` reads them).
pub struct GraphInputs<'a> {
    /// Per camera: `[B, 3, S, S]` in [-1, 1].
    pub images: Vec<&'a [f32]>,
    /// Per camera: `[B]`.
    pub image_masks: Vec<Vec<bool>>,
    /// `[B, prompt_len]`.
    pub tokens: &'a [i64],
    pub token_masks: &'a [bool],
    /// `[B, state_dim]`, normalized and padded.
    pub state: &'a [f32],
    /// `[B, chunk, action_dim]`.
    pub noise: &'a [f32],
}

#[derive(Clone, Copy, Debug, Default)]
pub struct GraphTiming {
    pub prefix_ms: f64,
    pub steps_ms: f64,
}

/// The host half of graph inference.
pub struct GraphModel<R: GraphRuntime> {
    pub manifest: Manifest,
    runtime: R,
    time: Vec<f32>,
}

impl<R: GraphRuntime> GraphModel<R> {
    pub fn new(manifest: Manifest, runtime: R) -> Self {
        GraphModel {
            time: tables::time_embeddings(&manifest),
            manifest,
            runtime,
        }
    }

    fn check(&self, name: &str, len: usize, want: usize) -> Result<(), GraphError> {
        if len == want {
            Ok(())
        } else {
            Err(GraphError::Input {
                name: name.into(),
                message: format!(
                    "{len} values, the graphs were exported for {want} (batch {}, {} cameras, {} prompt tokens)",
                    self.manifest.batch, self.manifest.cameras, self.manifest.prompt_len
                ),
            })
        }
    }

    /// Actions `[B, chunk, action_dim]` (normalized space) for `inputs`.
    pub fn sample(&mut self, inputs: &GraphInputs) -> Result<(Vec<f32>, GraphTiming), GraphError> {
        let m = &self.manifest;
        let (b, s) = (m.batch, m.image_size);
        if inputs.images.len() != m.cameras || inputs.image_masks.len() != m.cameras {
            return Err(GraphError::Input {
                name: "image0..".into(),
                message: format!(
                    "{} cameras given, the graphs were exported for {}",
                    inputs.images.len(),
                    m.cameras
                ),
            });
        }
        for (i, (img, mask)) in inputs.images.iter().zip(&inputs.image_masks).enumerate() {
            self.check(&format!("image{i}"), img.len(), b * 3 * s * s)?;
            self.check(&format!("img_mask{i}"), mask.len(), b)?;
        }
        self.check("lang_tokens", inputs.tokens.len(), b * m.prompt_len)?;
        self.check("lang_masks", inputs.token_masks.len(), b * m.prompt_len)?;
        self.check("state", inputs.state.len(), b * m.state_dim)?;
        self.check("noise", inputs.noise.len(), b * m.chunk * m.action_dim)?;
        let started = Instant::now();
        // Out-of-range ids are clamped into the vocabulary, as the CPU path does.
        let vocab = m.vocab as i64;
        let tokens: Vec<i64> = inputs
            .tokens
            .iter()
            .map(|t| (*t).clamp(0, vocab - 1))
            .collect();
        let prefix = tables::prefix_tables(m, &inputs.image_masks, inputs.token_masks);
        let suffix = tables::suffix_tables(m, &prefix.pad);
        self.runtime.run_prefix(&inputs.images, &tokens, &prefix)?;
        let prefix_ms = started.elapsed().as_secs_f64() * 1e3;
        let state = (!self.manifest.is_pi05()).then_some(inputs.state);
        let mut x = inputs.noise.to_vec();
        self.runtime
            .run_denoise(state, &mut x, &self.time, &suffix)?;
        let total = started.elapsed().as_secs_f64() * 1e3;
        Ok((
            x,
            GraphTiming {
                prefix_ms,
                steps_ms: total - prefix_ms,
            },
        ))
    }
}

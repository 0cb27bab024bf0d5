//! pi0 as compiled graphs (written by `pi0d export`): the host-side driver shared by every
//! graph runtime. The driver makes the tables, runs the prefix once per observation and the
//! denoise graph once per step (or once, unrolled); a runtime only moves tensors in and out of
//! its device and keeps the KV cache there between the two graphs.

pub(crate) mod acl;
pub mod manifest;
#[cfg(feature = "onnx")]
pub(crate) mod onnx;
#[cfg(feature = "onnx")]
mod onnx_probes;
pub(crate) mod provider;
pub(crate) mod tables;

use std::time::Instant;

use manifest::Manifest;
use tables::{PrefixTables, SuffixTables};

use crate::policy::pi0::infer::{check_actions, NonFiniteActions};
use crate::policy::pi0::model::Euler;
use crate::policy::pi0::quant::ActivationRange;
use crate::policy::rtc::{CleanPrefix, Guidance};

#[derive(Debug, thiserror::Error)]
pub enum GraphError {
    #[error(transparent)]
    Manifest(#[from] manifest::ManifestError),
    /// The runtime could not be set up: its library is missing or too old, a graph file does not
    /// load, the provider is not available. The user's setup (exit 1).
    #[error("{0}")]
    Load(String),
    /// The AscendCL library (CANN) cannot be loaded.
    #[error(transparent)]
    AclLibrary(#[from] acl::ffi::LoadError),
    /// The manifest's graphs, or a model compiled from them, cannot be bound.
    #[error(transparent)]
    AclPlan(#[from] acl::plan::PlanError),
    /// The runtime failed while running the graphs (exit 9).
    #[error("{0}")]
    Runtime(String),
    /// The device the graphs run on answers no more (lost, its driver failed).
    #[error("{0}")]
    DeviceLost(String),
    #[error("input `{name}`: {message}")]
    Input { name: String, message: String },
    #[error(transparent)]
    NonFiniteActions(#[from] NonFiniteActions),
}

impl GraphError {
    /// The user's manifest, setup or inputs were at fault, rather than the run.
    pub fn is_input_error(&self) -> bool {
        !matches!(
            self,
            GraphError::Runtime(_) | GraphError::DeviceLost(_) | GraphError::NonFiniteActions(_)
        )
    }

    /// A run's failure on the device, rather than the inputs' or the model's numbers.
    pub fn accelerator_fault(&self) -> Option<crate::policy::AcceleratorFault> {
        match self {
            GraphError::DeviceLost(_) => Some(crate::policy::AcceleratorFault::Lost),
            GraphError::Runtime(_) => Some(crate::policy::AcceleratorFault::Failed),
            _ => None,
        }
    }
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
    /// one once. `guide`, when given (looped graphs only), is called after each run with the
    /// run's index, its input and its output, which it may change (real-time chunking).
    fn run_denoise(
        &mut self,
        state: Option<&[f32]>,
        x: &mut [f32],
        time: &[f32],
        tables: &SuffixTables,
        guide: Option<&mut StepHook<'_>>,
    ) -> Result<(), GraphError>;

    /// The largest activations per layer group measured so far, for runtimes that measure
    /// them (`load_onnx_probed`).
    fn activations(&self) -> Vec<ActivationRange> {
        Vec::new()
    }
}

/// Called between looped denoising runs: `(run, x before, x after)`.
pub(crate) type StepHook<'a> = dyn FnMut(usize, &[f32], &mut [f32]) + 'a;

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
        guide: Option<&mut StepHook<'_>>,
    ) -> Result<(), GraphError> {
        (**self).run_denoise(state, x, time, tables, guide)
    }

    fn activations(&self) -> Vec<ActivationRange> {
        (**self).activations()
    }
}

/// The exported graphs in `dir` on ONNX Runtime.
pub fn load_onnx(
    dir: &std::path::Path,
    manifest: Manifest,
    opts: &provider::OnnxOptions,
) -> Result<GraphModel<Box<dyn GraphRuntime>>, GraphError> {
    load_onnx_with(dir, manifest, opts, false)
}

/// As `load_onnx`, measuring the largest activation per layer group in the graphs' own
/// precision on every run (`GraphModel::activations`).
pub fn load_onnx_probed(
    dir: &std::path::Path,
    manifest: Manifest,
    opts: &provider::OnnxOptions,
) -> Result<GraphModel<Box<dyn GraphRuntime>>, GraphError> {
    load_onnx_with(dir, manifest, opts, true)
}

fn load_onnx_with(
    dir: &std::path::Path,
    manifest: Manifest,
    opts: &provider::OnnxOptions,
    probed: bool,
) -> Result<GraphModel<Box<dyn GraphRuntime>>, GraphError> {
    #[cfg(feature = "onnx")]
    {
        let rt = onnx::OnnxRuntime::load(dir, &manifest, opts, probed)?;
        Ok(GraphModel::new(manifest, Box::new(rt)))
    }
    #[cfg(not(feature = "onnx"))]
    {
        let _ = (dir, manifest, opts, probed);
        Err(GraphError::Load(
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
    pub(crate) images: Vec<&'a [f32]>,
    /// Per camera: `[B]`.
    pub(crate) image_masks: Vec<Vec<bool>>,
    /// `[B, prompt_len]`.
    pub(crate) tokens: &'a [i64],
    pub(crate) token_masks: &'a [bool],
    /// `[B, state_dim]`, normalized and padded.
    pub(crate) state: &'a [f32],
    /// `[B, chunk, action_dim]`.
    pub(crate) noise: &'a [f32],
    /// Real-time chunking, one per batch element, or none.
    pub(crate) guidance: &'a [Guidance],
    /// Training-time real-time chunking (graphs of a checkpoint trained for it), one per batch
    /// element, or none.
    pub(crate) clean: &'a [CleanPrefix],
}

#[derive(Clone, Copy, Debug, Default)]
pub struct GraphTiming {
    pub prefix_ms: f64,
    pub steps_ms: f64,
}

/// The host half of graph inference.
pub struct GraphModel<R: GraphRuntime> {
    pub(crate) manifest: Manifest,
    runtime: R,
    time: Vec<f32>,
}

impl<R: GraphRuntime> GraphModel<R> {
    pub(crate) fn new(manifest: Manifest, runtime: R) -> Self {
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

    /// The largest activations per layer group the runtime measured over every run so far
    /// (empty unless loaded with `load_onnx_probed`).
    pub fn activations(&self) -> Vec<ActivationRange> {
        self.runtime.activations()
    }

    /// Actions `[B, chunk, action_dim]` (normalized space) for `inputs`: refused when the inputs
    /// do not fit the graphs (sizes, token ids), and when the run produced a NaN or an infinity.
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
        // An id outside the vocabulary would be clamped (or worse) by the runtime's Gather.
        crate::policy::pi0::model::check_vocabulary(inputs.tokens, m.vocab).map_err(|e| {
            GraphError::Input {
                name: "lang_tokens".into(),
                message: match e {
                    crate::policy::pi0::model::TokenError::OutOfVocabulary { index, id, vocab } => {
                        format!(
                            "token id {id} at [{}, {}] is outside the vocabulary (0..{vocab})",
                            index / m.prompt_len.max(1),
                            index % m.prompt_len.max(1)
                        )
                    }
                    other => other.to_string(),
                },
            }
        })?;
        let started = Instant::now();
        let prefix = tables::prefix_tables(m, &inputs.image_masks, inputs.token_masks);
        let mut suffix = tables::suffix_tables(m, &prefix.pad);
        if m.rtc {
            suffix.rtc = Some(tables::rtc_tables(m, inputs.guidance));
        }
        if !inputs.clean.is_empty() && m.trained_rtc.is_none() {
            return Err(GraphError::Input {
                name: "rtc_prev_chunk".into(),
                message: "a clamped leftover (training-time real-time chunking) for graphs not exported from a checkpoint trained for it".into(),
            });
        }
        if m.trained_rtc.is_some() {
            suffix.clean = Some(tables::clean_tables(m, inputs.clean));
        }
        self.runtime
            .run_prefix(&inputs.images, inputs.tokens, &prefix)?;
        let prefix_ms = started.elapsed().as_secs_f64() * 1e3;
        let state = (!self.manifest.is_pi05()).then_some(inputs.state);
        let mut x = inputs.noise.to_vec();
        let mut guide = match inputs.clean {
            [] => rtc_hook(&self.manifest, inputs.guidance)?,
            clean => clamp_hook(&self.manifest, clean, &mut x),
        };
        self.runtime
            .run_denoise(state, &mut x, &self.time, &suffix, guide.as_deref_mut())?;
        check_actions(&x, self.manifest.chunk, self.manifest.action_dim)?;
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

/// Training-time real-time chunking on looped graphs: the clamped steps are the leftover
/// before the first run and after every run (the graph runs their tokens at time 0). Unrolled
/// graphs clamp inside, from `rtc_clean_values`.
fn clamp_hook<'a>(
    m: &Manifest,
    clean: &'a [CleanPrefix],
    x: &mut [f32],
) -> Option<Box<StepHook<'a>>> {
    if m.unrolled {
        return None;
    }
    let per = m.chunk * m.action_dim;
    let clamp = move |x: &mut [f32]| {
        for (e, c) in clean.iter().enumerate() {
            if let Some(row) = x.get_mut(e * per..(e + 1) * per) {
                c.clamp(row);
            }
        }
    };
    clamp(x);
    Some(Box::new(move |_: usize, _: &[f32], after: &mut [f32]| {
        clamp(after)
    }))
}

/// Real-time chunking on looped graphs: each run computed `x + dt v`; the velocity is
/// recovered, guided (`Guidance::apply`, as on the CPU) and the step taken again on the host.
fn rtc_hook<'a>(
    m: &Manifest,
    guidance: &'a [Guidance],
) -> Result<Option<Box<StepHook<'a>>>, GraphError> {
    // Graphs exported with `--rtc` take the guidance as inputs (`tables::rtc_tables`).
    if guidance.is_empty() || m.rtc {
        return Ok(None);
    }
    if guidance.len() != m.batch {
        return Err(GraphError::Input {
            name: "rtc_prev_chunk".into(),
            message: format!("{} leftovers for a batch of {}", guidance.len(), m.batch),
        });
    }
    if m.unrolled {
        return Err(GraphError::Input {
            name: "rtc_prev_chunk".into(),
            message: "these graphs are unrolled (every step in one graph) without real-time \
                      chunking's inputs: export them with --rtc, or looped (without --unroll)"
                .into(),
        });
    }
    let per = m.chunk * m.action_dim;
    let euler = Euler::new(m.steps);
    let mut v = vec![0.0f32; per];
    Ok(Some(Box::new(
        move |run: usize, before: &[f32], after: &mut [f32]| {
            let time = euler.time(run);
            let dtf = euler.dt as f32;
            for (e, g) in guidance.iter().enumerate() {
                let r = e * per..(e + 1) * per;
                let (x0, x1) = (&before[r.clone()], &mut after[r]);
                v.iter_mut()
                    .zip(x0.iter().zip(x1.iter()))
                    .for_each(|(v, (a, b))| *v = (b - a) / dtf);
                g.apply(x0, time, &mut v);
                x1.iter_mut()
                    .zip(x0.iter().zip(&v))
                    .for_each(|(x1, (x0, v))| *x1 = x0 + dtf * v);
            }
        },
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Returns the noise as actions, optionally with one NaN in it.
    struct Echo {
        nan: bool,
    }

    impl GraphRuntime for Echo {
        fn run_prefix(
            &mut self,
            _: &[&[f32]],
            _: &[i64],
            _: &PrefixTables,
        ) -> Result<(), GraphError> {
            Ok(())
        }

        fn run_denoise(
            &mut self,
            _: Option<&[f32]>,
            x: &mut [f32],
            _: &[f32],
            _: &SuffixTables,
            _: Option<&mut StepHook<'_>>,
        ) -> Result<(), GraphError> {
            if self.nan {
                x[32 + 5] = f32::NAN;
            }
            Ok(())
        }
    }

    fn sample(nan: bool, tokens: &[i64]) -> Result<(Vec<f32>, GraphTiming), GraphError> {
        let m = acl::plan::tests::manifest(1, false, "float32");
        let image = vec![0.0f32; 3 * 224 * 224];
        let masks = vec![true; m.prompt_len];
        let state = vec![0.0f32; m.state_dim];
        let noise = vec![0.5f32; m.chunk * m.action_dim];
        GraphModel::new(m, Echo { nan }).sample(&GraphInputs {
            images: vec![&image],
            image_masks: vec![vec![true]],
            tokens,
            token_masks: &masks,
            state: &state,
            noise: &noise,
            guidance: &[],
            clean: &[],
        })
    }

    #[test]
    fn when_token_id_is_outside_the_vocabulary_expect_input_error_naming_it() {
        let mut tokens = vec![1i64; 48];
        sample(false, &tokens).unwrap();
        for id in [320, -1] {
            tokens[5] = id;
            match sample(false, &tokens) {
                Err(GraphError::Input { name, message }) => {
                    assert_eq!(name, "lang_tokens");
                    let want =
                        format!("token id {id} at [0, 5] is outside the vocabulary (0..320)");
                    assert!(message.contains(&want), "{message}");
                }
                other => panic!("expected an input error, got {:?}", other.map(|_| ())),
            }
        }
    }

    #[test]
    fn when_graphs_return_nan_expect_runtime_error_naming_where() {
        match sample(true, &[1; 48]) {
            Err(e @ GraphError::NonFiniteActions(_)) => {
                assert!(!e.is_input_error());
                assert!(e.to_string().contains("batch 0, step 1, dim 5"), "{e}");
            }
            other => panic!("expected non-finite actions, got {:?}", other.map(|_| ())),
        }
    }
}

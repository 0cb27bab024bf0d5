//! The model stage alone, driven by files: `pi0d infer`. This is how the golden tests (and
//! anyone checking a new backend) run the model.

use std::path::Path;

use crate::policy::rtc::{CleanPrefix, Guidance, RtcPrefix, RtcSettings};

use super::model::{Pi0Input, Pi0Model, Workspace};
use super::tensorfile::{write_f32, TensorFile, TensorFileError};

/// The computation produced a NaN or an infinity: `actions[batch, step, dim]` is the first.
/// Never the input's fault (inputs and weights are checked finite): a runtime failure.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error(
    "the model produced a non-finite action ({value} at batch {batch}, step {step}, dim {dim})"
)]
pub struct NonFiniteActions {
    pub batch: usize,
    pub(crate) step: usize,
    pub(crate) dim: usize,
    pub(crate) value: f32,
}

/// Refuses `actions` (`[batch, chunk, action_dim]`) holding a NaN or an infinity.
pub(crate) fn check_actions(
    actions: &[f32],
    chunk: usize,
    action_dim: usize,
) -> Result<(), NonFiniteActions> {
    match actions.iter().position(|x| !x.is_finite()) {
        None => Ok(()),
        Some(i) => {
            let per = (chunk * action_dim).max(1);
            let dim = action_dim.max(1);
            Err(NonFiniteActions {
                batch: i / per,
                step: i % per / dim,
                dim: i % dim,
                value: actions[i],
            })
        }
    }
}

/// A batch element's real-time-chunking inputs that cannot guide the model.
#[derive(Debug, thiserror::Error)]
#[error("real-time chunking, batch element {batch}")]
pub struct RtcBatchError {
    pub(crate) batch: usize,
    #[source]
    pub(crate) source: crate::policy::rtc::RtcError,
}

/// What `pi0d infer`'s library half can fail with beyond reading its files.
#[derive(Debug, thiserror::Error)]
pub enum InferError {
    #[error(transparent)]
    File(#[from] TensorFileError),
    #[error(transparent)]
    NonFiniteActions(#[from] NonFiniteActions),
}

impl InferError {
    /// The user's input was at fault (bad inputs file: exit 1), rather than the computation or
    /// the machine (non-finite actions, a failed write: exit 9).
    pub fn is_input_error(&self) -> bool {
        match self {
            InferError::File(e) => e.is_input_error(),
            InferError::NonFiniteActions(_) => false,
        }
    }
}

/// Whether the error `pi0d infer`, `export` or `quantize` returned (anywhere in its chain) is the
/// user's input (bad checkpoint, inputs, manifest or options: exit 1) rather than a runtime
/// failure (the computation produced NaN, a write failed, the graph runtime failed: exit 9).
/// Errors of other types (e.g. the binary's own messages about flags) count as input errors.
pub fn is_input_error(e: &(dyn std::error::Error + 'static)) -> bool {
    use crate::policy::export::ExportError;
    use crate::policy::graph::GraphError;
    let mut next = Some(e);
    while let Some(e) = next {
        if let Some(e) = e.downcast_ref::<InferError>() {
            return e.is_input_error();
        }
        if let Some(e) = e.downcast_ref::<TensorFileError>() {
            return e.is_input_error();
        }
        if let Some(e) = e.downcast_ref::<GraphError>() {
            return e.is_input_error();
        }
        if let Some(e) = e.downcast_ref::<ExportError>() {
            return e.is_input_error();
        }
        if let Some(e) = e.downcast_ref::<super::quant::QuantizeError>() {
            return e.is_input_error();
        }
        if let Some(e) = e.downcast_ref::<super::pipeline::PipelineError>() {
            return e.is_input_error();
        }
        if e.downcast_ref::<NonFiniteActions>().is_some() {
            return false;
        }
        next = e.source();
    }
    true
}

/// Per-run timings, printed as one JSON line each with `--repeat`. The inputs file already
/// holds model tensors, so preprocessing here is assembling the batch's model inputs and
/// postprocessing is checking the actions (the daemon's image, prompt and state processing
/// shows in its summary's `inference_stages_ms`).
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct RunTiming {
    pub preprocess_ms: f64,
    pub prefix_ms: f64,
    pub steps_ms: f64,
    pub postprocess_ms: f64,
    pub total_ms: f64,
}

impl RunTiming {
    /// `total_ms` from the stages.
    pub fn summed(mut self) -> RunTiming {
        self.total_ms = self.preprocess_ms + self.prefix_ms + self.steps_ms + self.postprocess_ms;
        self
    }
}

fn ms_since(t: std::time::Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

/// The inputs file decoded for a model: per batch element, borrowed slices.
pub struct Batch {
    pub batch: usize,
    images: Vec<Vec<f32>>,
    image_masks: Vec<Vec<bool>>,
    tokens: Vec<i64>,
    token_masks: Vec<bool>,
    seq: usize,
    state: Vec<f32>,
    noise: Vec<f32>,
    state_dim: usize,
    noise_len: usize,
    chunk: usize,
    action_dim: usize,
    /// Real-time chunking, per batch element, when the file has `rtc_prev_chunk`.
    rtc: Vec<RtcPrefix>,
    guidance: Vec<Guidance>,
    /// Training-time RTC (a model trained for it): each element's clamped leftover.
    clean: Vec<CleanPrefix>,
    /// The model's trained maximum delay, for a model trained for real-time chunking.
    trained_rtc: Option<usize>,
}

/// A batch's model inputs, each concatenated over its elements as an inputs file holds them.
pub(crate) struct BatchParts {
    pub(crate) batch: usize,
    /// Per camera: `[B, 3, S, S]`.
    pub(crate) images: Vec<Vec<f32>>,
    /// Per camera: `[B]`.
    pub(crate) image_masks: Vec<Vec<bool>>,
    pub(crate) tokens: Vec<i64>,
    pub(crate) token_masks: Vec<bool>,
    pub(crate) state: Vec<f32>,
    pub(crate) noise: Vec<f32>,
}

/// lerobot's `execution_horizon` default, for files without `rtc_execution_horizon`.
const DEFAULT_EXECUTION_HORIZON: usize = 10;

/// The sizes an inputs file must have (from the model or an exported graph's manifest).
#[derive(Clone, Copy, Debug)]
pub struct BatchDims {
    pub image_size: usize,
    pub state_dim: usize,
    pub chunk: usize,
    pub action_dim: usize,
}

impl From<&super::model::Arch> for BatchDims {
    fn from(a: &super::model::Arch) -> Self {
        BatchDims {
            image_size: a.image_size,
            state_dim: a.state_dim,
            chunk: a.chunk,
            action_dim: a.action_dim,
        }
    }
}

impl Batch {
    /// The inputs for the CPU model: shaped for it, and every prompt within its length and
    /// vocabulary.
    pub fn read(path: &Path, model: &Pi0Model) -> Result<Batch, TensorFileError> {
        let mut batch = Batch::read_for(path, &BatchDims::from(&model.arch))?;
        if let Some(max) = model.trained_rtc {
            batch
                .condition_as_trained(max)
                .map_err(|source| TensorFileError::Rtc {
                    path: path.into(),
                    source,
                })?;
        }
        for b in 0..batch.batch {
            let tokens = &batch.tokens[b * batch.seq..(b + 1) * batch.seq];
            model
                .check_tokens(tokens)
                .map_err(|source| TensorFileError::Tokens {
                    path: path.into(),
                    batch: b,
                    source,
                })?;
        }
        Ok(batch)
    }

    pub fn read_for(path: &Path, a: &BatchDims) -> Result<Batch, TensorFileError> {
        let f = TensorFile::read(path)?;
        let cameras = (0..)
            .take_while(|i| f.tensors.contains_key(&format!("image{i}")))
            .count();
        if cameras == 0 {
            return Err(TensorFileError::Tensor {
                path: path.into(),
                message: "no `image0` tensor".into(),
            });
        }
        let (shape, _) = f.f32(
            "image0",
            &[None, Some(3), Some(a.image_size), Some(a.image_size)],
        )?;
        let batch = shape[0];
        if batch == 0 {
            return Err(TensorFileError::Tensor {
                path: path.into(),
                message: "tensor `image0` has batch size 0: nothing to infer".into(),
            });
        }
        let s = a.image_size;
        let mut images = Vec::new();
        let mut image_masks = Vec::new();
        for i in 0..cameras {
            let (_, v) = f.f32(
                &format!("image{i}"),
                &[Some(batch), Some(3), Some(s), Some(s)],
            )?;
            images.push(v.to_vec());
            image_masks.push(f.mask(&format!("img_mask{i}"), &[Some(batch)])?);
        }
        let (tshape, tokens) = f.i64("lang_tokens", &[Some(batch), None])?;
        let seq = tshape[1];
        let token_masks = f.mask("lang_masks", &[Some(batch), Some(seq)])?;
        let (_, state) = f.f32("state", &[Some(batch), Some(a.state_dim)])?;
        let (_, noise) = f.f32("noise", &[Some(batch), Some(a.chunk), Some(a.action_dim)])?;
        let rtc = read_rtc(&f, batch, a)?;
        let mut out = Batch {
            batch,
            images,
            image_masks,
            tokens: tokens.to_vec(),
            token_masks,
            seq,
            state: state.to_vec(),
            noise: noise.to_vec(),
            state_dim: a.state_dim,
            noise_len: a.chunk * a.action_dim,
            chunk: a.chunk,
            action_dim: a.action_dim,
            rtc,
            guidance: Vec::new(),
            clean: Vec::new(),
            trained_rtc: None,
        };
        out.set_rtc(RtcSettings::default())
            .map_err(|source| TensorFileError::Rtc {
                path: path.into(),
                source,
            })?;
        Ok(out)
    }

    /// A batch of already preprocessed observations (no real-time chunking).
    pub(crate) fn from_parts(p: BatchParts, a: &BatchDims) -> Batch {
        Batch {
            batch: p.batch,
            seq: p.tokens.len() / p.batch.max(1),
            images: p.images,
            image_masks: p.image_masks,
            tokens: p.tokens,
            token_masks: p.token_masks,
            state: p.state,
            noise: p.noise,
            state_dim: a.state_dim,
            noise_len: a.chunk * a.action_dim,
            chunk: a.chunk,
            action_dim: a.action_dim,
            rtc: Vec::new(),
            guidance: Vec::new(),
            clean: Vec::new(),
            trained_rtc: None,
        }
    }

    /// Drops the file's real-time-chunking inputs: plain denoising.
    pub fn clear_rtc(&mut self) {
        self.rtc.clear();
        self.guidance.clear();
        self.clean.clear();
    }

    /// Whether the file asks for real-time chunking (has `rtc_prev_chunk`).
    pub fn has_rtc(&self) -> bool {
        !self.rtc.is_empty()
    }

    /// For a model trained for real-time chunking (up to `max` steps): the file's leftovers
    /// condition it as it was trained (clamped prefixes) instead of guiding it.
    pub fn condition_as_trained(&mut self, max: usize) -> Result<(), RtcBatchError> {
        self.trained_rtc = Some(max);
        self.set_rtc(RtcSettings::default())
    }

    /// The RTC schedule and guidance cap the file's leftovers are guided with (`--rtc-schedule`,
    /// `--rtc-max-guidance`); for a model trained for real-time chunking, the leftovers' clamped
    /// prefixes instead (which take no schedule).
    pub fn set_rtc(&mut self, settings: RtcSettings) -> Result<(), RtcBatchError> {
        if let Some(max) = self.trained_rtc {
            self.guidance.clear();
            self.clean = self
                .rtc
                .iter()
                .enumerate()
                .map(|(b, p)| {
                    CleanPrefix::new(p, self.chunk, self.action_dim, max)
                        .map_err(|source| RtcBatchError { batch: b, source })
                })
                .collect::<Result<_, _>>()?;
            return Ok(());
        }
        self.guidance = self
            .rtc
            .iter()
            .enumerate()
            .map(|(b, p)| {
                Guidance::new(settings, p, self.chunk, self.action_dim)
                    .map_err(|source| RtcBatchError { batch: b, source })
            })
            .collect::<Result<_, _>>()?;
        Ok(())
    }

    pub fn element(&self, b: usize) -> Pi0Input<'_> {
        let img = self.images[0].len() / self.batch;
        Pi0Input {
            images: self
                .images
                .iter()
                .map(|v| &v[b * img..(b + 1) * img])
                .collect(),
            image_masks: self.image_masks.iter().map(|m| m[b]).collect(),
            tokens: &self.tokens[b * self.seq..(b + 1) * self.seq],
            token_masks: &self.token_masks[b * self.seq..(b + 1) * self.seq],
            state: &self.state[b * self.state_dim..(b + 1) * self.state_dim],
            noise: &self.noise[b * self.noise_len..(b + 1) * self.noise_len],
            guidance: self.guidance.get(b),
            clean: self.clean.get(b),
        }
    }
}

/// `rtc_prev_chunk` `[B, T, A']` (T up to the chunk, A' up to the model's action width),
/// `rtc_inference_delay` (a scalar or `[B]`), `rtc_execution_horizon` (a scalar, default 10).
fn read_rtc(
    f: &TensorFile,
    batch: usize,
    a: &BatchDims,
) -> Result<Vec<RtcPrefix>, TensorFileError> {
    let err = |message: String| TensorFileError::Tensor {
        path: f.path.clone(),
        message,
    };
    if !f.tensors.contains_key("rtc_prev_chunk") {
        for name in ["rtc_inference_delay", "rtc_execution_horizon"] {
            if f.tensors.contains_key(name) {
                return Err(err(format!(
                    "tensor `{name}` without `rtc_prev_chunk`: real-time chunking needs the leftover too"
                )));
            }
        }
        return Ok(Vec::new());
    }
    let (shape, leftover) = f.f32("rtc_prev_chunk", &[Some(batch), None, None])?;
    let (steps, width) = (shape[1], shape[2]);
    if steps > a.chunk || width > a.action_dim || steps == 0 || width == 0 {
        return Err(err(format!(
            "tensor `rtc_prev_chunk` has shape {shape:?}; expected [{batch}, 1..={}, 1..={}] (the              leftover in the model's action space, at most its chunk and action width)",
            a.chunk, a.action_dim
        )));
    }
    let count = |name: &str, v: i64, most: usize| -> Result<usize, TensorFileError> {
        usize::try_from(v)
            .ok()
            .filter(|&n| n <= most)
            .ok_or_else(|| err(format!("tensor `{name}` is {v}; expected 0..={most} steps")))
    };
    let delays: Vec<usize> = match f.tensors.get("rtc_inference_delay").map(|t| t.shape.len()) {
        None => {
            return Err(err(
                "missing tensor `rtc_inference_delay` (with `rtc_prev_chunk`)".into(),
            ))
        }
        Some(0) => {
            let (_, v) = f.i64("rtc_inference_delay", &[])?;
            vec![count("rtc_inference_delay", v[0], a.chunk)?; batch]
        }
        Some(_) => {
            let (_, v) = f.i64("rtc_inference_delay", &[Some(batch)])?;
            v.iter()
                .map(|&d| count("rtc_inference_delay", d, a.chunk))
                .collect::<Result<_, _>>()?
        }
    };
    let horizon = if f.tensors.contains_key("rtc_execution_horizon") {
        let (_, v) = f.i64("rtc_execution_horizon", &[])?;
        count("rtc_execution_horizon", v[0], a.chunk)?
    } else {
        DEFAULT_EXECUTION_HORIZON
    };
    let per = steps * width;
    Ok((0..batch)
        .map(|b| RtcPrefix {
            leftover: leftover[b * per..(b + 1) * per].to_vec(),
            steps,
            width,
            inference_delay: delays[b],
            execution_horizon: horizon,
        })
        .collect())
}

/// `run_batch`, refusing non-finite actions (what `pi0d infer` should run).
pub fn try_run_batch(model: &Pi0Model, batch: &Batch) -> Result<(Vec<f32>, RunTiming), InferError> {
    let (actions, mut timing) = run_batch(model, batch);
    let post = std::time::Instant::now();
    check_actions(&actions, batch.chunk, batch.action_dim)?;
    timing.postprocess_ms = ms_since(post);
    Ok((actions, timing.summed()))
}

/// Runs each element of the batch alone, calling `before()` first (calibration tells its
/// recorder a new observation begins), and refuses non-finite actions.
pub(crate) fn try_run_each(
    model: &Pi0Model,
    batch: &Batch,
    mut before: impl FnMut(),
) -> Result<(), InferError> {
    let mut ws = Workspace::default();
    for b in 0..batch.batch {
        before();
        let (actions, _) = model.sample_actions_batch(&[batch.element(b)], &mut ws);
        check_actions(&actions, batch.chunk, batch.action_dim).map_err(|mut e| {
            e.batch = b;
            e
        })?;
    }
    Ok(())
}

/// Runs the whole batch: actions `[batch, chunk, action_dim]` and the summed timings. The
/// actions are not checked (`try_run_batch` does; `write_actions` refuses non-finite ones).
pub fn run_batch(model: &Pi0Model, batch: &Batch) -> (Vec<f32>, RunTiming) {
    let mut ws = Workspace::default();
    let pre = std::time::Instant::now();
    let elements: Vec<_> = (0..batch.batch).map(|b| batch.element(b)).collect();
    let preprocess_ms = ms_since(pre);
    // All elements at once: each layer's products over every element's rows.
    let (actions, t) = model.sample_actions_batch(&elements, &mut ws);
    (
        actions,
        RunTiming {
            preprocess_ms,
            prefix_ms: t.prefix_ms,
            steps_ms: t.steps_ms,
            ..RunTiming::default()
        }
        .summed(),
    )
}

/// Checks actions from a graph runtime as `try_run_batch` checks the CPU model's: the time it
/// took, or the refusal.
pub fn check_graph_actions(actions: &[f32], batch: &Batch) -> Result<f64, InferError> {
    let post = std::time::Instant::now();
    check_actions(actions, batch.chunk, batch.action_dim)?;
    Ok(ms_since(post))
}

/// Writes `actions` for `batch` to `path`; non-finite actions are refused, nothing is written.
pub fn write_actions(path: &Path, batch: &Batch, actions: &[f32]) -> Result<(), InferError> {
    check_actions(actions, batch.chunk, batch.action_dim)?;
    Ok(write_f32(
        path,
        &[(
            "actions",
            vec![batch.batch, batch.chunk, batch.action_dim],
            actions,
        )],
    )?)
}

impl Batch {
    /// The whole batch as the graph runtimes take it.
    pub fn graph_inputs(&self) -> crate::policy::graph::GraphInputs<'_> {
        crate::policy::graph::GraphInputs {
            images: self.images.iter().map(Vec::as_slice).collect(),
            image_masks: self.image_masks.clone(),
            tokens: &self.tokens,
            token_masks: &self.token_masks,
            state: &self.state,
            noise: &self.noise,
            guidance: &self.guidance,
            clean: &self.clean,
        }
    }
}

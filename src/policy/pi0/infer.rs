//! The model stage alone, driven by files: `pi0d infer`. This is how the golden tests (and
//! anyone checking a new backend) run the model.

use std::path::Path;

use super::model::{Pi0Input, Pi0Model, Timing, Workspace};
use super::tensorfile::{write_f32, TensorFile, TensorFileError};

/// Per-run timings, printed as one JSON line each with `--repeat`.
#[derive(Clone, Copy, Debug, serde::Serialize)]
pub struct RunTiming {
    pub prefix_ms: f64,
    pub steps_ms: f64,
    pub total_ms: f64,
}

/// The inputs file decoded for a model: per batch element, borrowed slices.
pub struct Batch {
    pub batch: usize,
    pub cameras: usize,
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
}

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
    pub fn read(path: &Path, model: &Pi0Model) -> Result<Batch, TensorFileError> {
        Batch::read_for(path, &BatchDims::from(&model.arch))
    }

    pub fn read_for(path: &Path, a: &BatchDims) -> Result<Batch, TensorFileError> {
        let f = TensorFile::read(path)?;
        let cameras = (0..)
            .take_while(|i| f.tensors.contains_key(&format!("image{i}")))
            .count();
        if cameras == 0 {
            return Err(TensorFileError {
                path: path.into(),
                message: "no `image0` tensor".into(),
            });
        }
        let (shape, _) = f.f32(
            "image0",
            &[None, Some(3), Some(a.image_size), Some(a.image_size)],
        )?;
        let batch = shape[0];
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
        Ok(Batch {
            batch,
            cameras,
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
        })
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
        }
    }
}

/// Runs the whole batch: actions `[batch, chunk, action_dim]` and the summed timings.
pub fn run_batch(model: &Pi0Model, batch: &Batch) -> (Vec<f32>, RunTiming) {
    let mut actions = Vec::with_capacity(batch.batch * batch.noise_len);
    let mut t = Timing::default();
    let mut ws = Workspace::default();
    for b in 0..batch.batch {
        let (a, tb) = model.sample_actions_with(&batch.element(b), &mut ws);
        actions.extend(a);
        t.prefix_ms += tb.prefix_ms;
        t.steps_ms += tb.steps_ms;
    }
    (
        actions,
        RunTiming {
            prefix_ms: t.prefix_ms,
            steps_ms: t.steps_ms,
            total_ms: t.prefix_ms + t.steps_ms,
        },
    )
}

pub fn write_actions(path: &Path, batch: &Batch, actions: &[f32]) -> Result<(), TensorFileError> {
    write_f32(
        path,
        &[(
            "actions",
            vec![batch.batch, batch.chunk, batch.action_dim],
            actions,
        )],
    )
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
        }
    }
}

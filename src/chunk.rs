//! Action chunks: what a policy returns (action order), and the joint-space form the executor runs.

use crate::joints::{ActionMap, JointVector};
use crate::time::MonoTime;

/// A policy's output: `steps` actions of `action_dim` values in the policy's action order,
/// step `i` due at `obs_stamp + i * step_period_s`.
#[derive(Clone, Debug)]
pub struct ActionChunk {
    /// Capture time of the observation the chunk was computed from.
    pub(crate) obs_stamp: MonoTime,
    pub(crate) step_period_s: f64,
    pub(crate) action_dim: usize,
    /// Row-major `[steps][action_dim]`, in joint units (rad or m).
    pub actions: Vec<f64>,
    /// What a model that runs here gave before its postprocessor (for recordings).
    pub(crate) model: Option<Box<ModelOutput>>,
}

/// A model's own output for a chunk, before the checkpoint's postprocessor made it actions.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelOutput {
    /// Row-major `[steps][action_dim]`, the model's action order and (normalized) space.
    pub(crate) actions: Vec<f32>,
    /// The observation's state that relative actions are made absolute against (the
    /// checkpoint's relative step keeps it); `None` for absolute actions.
    pub(crate) reference_state: Option<Vec<f32>>,
    /// Training-time real-time chunking: the steps conditioned on the leftover.
    pub(crate) conditioned_delay: Option<usize>,
}

impl ActionChunk {
    pub fn steps(&self) -> usize {
        self.actions.len().checked_div(self.action_dim).unwrap_or(0)
    }

    pub(crate) fn step(&self, i: usize) -> &[f64] {
        &self.actions[i * self.action_dim..(i + 1) * self.action_dim]
    }
}

/// What is still to be executed of the running chunk, aligned to a new observation: row `i`
/// is the old plan at the new chunk's step `i` (policy action order, joint units). Real-time
/// chunking pulls the new chunk's first steps towards it.
#[derive(Clone, Debug, PartialEq)]
pub struct ChunkPrefix {
    /// Row-major `[steps][action_dim]`.
    pub(crate) actions: Vec<f64>,
    pub(crate) action_dim: usize,
    /// Steps of the new chunk that will have run before it takes over.
    pub(crate) inference_delay: usize,
    /// Steps over which the new chunk is guided.
    pub(crate) execution_horizon: usize,
}

impl ChunkPrefix {
    pub(crate) fn steps(&self) -> usize {
        self.actions.len().checked_div(self.action_dim).unwrap_or(0)
    }
}

/// A chunk in robot command order with knot derivatives, ready for the control thread.
/// Buffers are reused (recycled between the worker and the control thread) so the tick never
/// allocates.
#[derive(Clone, Debug)]
pub struct JointChunk {
    pub obs_stamp: MonoTime,
    pub period_s: f64,
    pub positions: Vec<JointVector>,
    pub(crate) velocities: Vec<JointVector>,
    pub(crate) accelerations: Vec<JointVector>,
    /// Sequence number of the inference that produced it.
    pub seq: u64,
}

impl JointChunk {
    pub fn with_capacity(steps: usize) -> JointChunk {
        JointChunk {
            obs_stamp: MonoTime::ZERO,
            period_s: 0.02,
            positions: Vec::with_capacity(steps),
            velocities: Vec::with_capacity(steps),
            accelerations: Vec::with_capacity(steps),
            seq: 0,
        }
    }

    pub(crate) fn steps(&self) -> usize {
        self.positions.len()
    }

    /// Time of the last step.
    pub(crate) fn end(&self) -> MonoTime {
        self.obs_stamp
            .offset_seconds((self.steps().saturating_sub(1)) as f64 * self.period_s)
    }

    /// Fills this buffer from a policy chunk. Joints the policy does not drive keep `hold`.
    pub(crate) fn fill_from(
        &mut self,
        chunk: &ActionChunk,
        map: &ActionMap,
        hold: &JointVector,
        seq: u64,
    ) {
        self.obs_stamp = chunk.obs_stamp;
        self.period_s = chunk.step_period_s;
        self.seq = seq;
        self.positions.clear();
        for i in 0..chunk.steps() {
            let mut p = *hold;
            map.apply(chunk.step(i), &mut p);
            self.positions.push(p);
        }
        self.update_derivatives();
    }

    /// Knot velocities and accelerations by central differences (one-sided at the ends); these
    /// feed the cubic and quintic Hermite segments. Reuses the buffers' capacity.
    pub fn update_derivatives(&mut self) {
        let n = self.steps();
        let h = self.period_s;
        let dim = self.positions.first().map_or(0, |p| p.len());
        self.velocities.clear();
        self.accelerations.clear();
        for i in 0..n {
            let mut v = JointVector::zeros(dim);
            let mut a = JointVector::zeros(dim);
            if n >= 2 {
                let (lo, hi) = (i.saturating_sub(1), (i + 1).min(n - 1));
                let mid = i.clamp(1, n.saturating_sub(2).max(1));
                for j in 0..dim {
                    let p = &self.positions;
                    v[j] = (p[hi][j] - p[lo][j]) / ((hi - lo) as f64 * h);
                    if n >= 3 {
                        a[j] = (p[mid + 1][j] - 2.0 * p[mid][j] + p[mid - 1][j]) / (h * h);
                    }
                }
            }
            self.velocities.push(v);
            self.accelerations.push(a);
        }
    }
}

//! Calibration: what the float model's linear layers see on real inputs (`pi0d quantize
//! --calibration`, `pi0d export --calibration`). When quantizing, each layer also keeps a sample
//! of its input rows, per input channel the largest and the mean magnitude (over every row and
//! over each of two folds of observations, for `smooth`'s held-out search), and the sums
//! `X^T X` that GPTQ rounds its weight with (`gptq`). The scales chosen from them: `smooth`.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use super::gptq::Gram;
use super::{rotates, Group, QuantizeError, Scheme};
use crate::policy::pi0::checkpoint::Checkpoint;
use crate::policy::pi0::config_json::ArchOverrides;
use crate::policy::pi0::hadamard;
use crate::policy::pi0::infer::{try_run_each, Batch};
use crate::policy::pi0::model::Pi0Model;

/// Input rows kept per layer for the search, at most (and at most `MAX_VALUES` values).
const MAX_ROWS: usize = 512;
const MAX_VALUES: usize = 1 << 20;

/// Observations alternate between this many folds: the search chooses on one and measures on
/// another.
const FOLDS: usize = 2;

/// Per input channel: the largest `|x_j|` and the sum of `|x_j|` over some rows.
#[derive(Clone, Debug, Default)]
pub(super) struct Channels {
    pub(super) absmax: Vec<f32>,
    abssum: Vec<f64>,
    pub(super) rows: u64,
}

impl Channels {
    fn add(&mut self, row: &[f32]) {
        if self.absmax.is_empty() {
            self.absmax = vec![0.0; row.len()];
            self.abssum = vec![0.0; row.len()];
        }
        for ((m, s), v) in self.absmax.iter_mut().zip(&mut self.abssum).zip(row) {
            *m = m.max(v.abs());
            *s += f64::from(v.abs());
        }
        self.rows += 1;
    }

    fn absorb(&mut self, other: &Channels) {
        if self.absmax.is_empty() {
            *self = other.clone();
            return;
        }
        for (m, o) in self.absmax.iter_mut().zip(&other.absmax) {
            *m = m.max(*o);
        }
        for (s, o) in self.abssum.iter_mut().zip(&other.abssum) {
            *s += o;
        }
        self.rows += other.rows;
    }

    /// The mean `|x_j|`.
    pub(super) fn mean(&self, j: usize) -> f32 {
        (self.abssum[j] / self.rows.max(1) as f64) as f32
    }
}

/// One linear layer's inputs, as calibration saw them.
#[derive(Clone, Debug, Default)]
pub(crate) struct InputStats {
    pub(super) k: usize,
    /// Over every row, and over each fold's.
    pub(super) channels: Channels,
    pub(super) folds: [Channels; FOLDS],
    /// The fold the rows now recorded belong to (their observation's).
    pub(super) fold: usize,
    /// Largest `|y|` of the layer's output (a linear layer's; 0 for a norm's probe).
    out_absmax: f32,
    /// Rows seen, and a sample of them (reservoir, fixed seed: a rerun chooses the same), with
    /// each sampled row's fold.
    seen: u64,
    pub(super) rows: Vec<f32>,
    row_folds: Vec<u8>,
    rng: u64,
    /// `X^T X` over every row (GPTQ's rounding), when the recorder keeps it.
    pub(super) gram: Option<Gram>,
    /// The rows are recorded rotated (`x R`), as the quantized layer will multiply them.
    pub(super) rotated: bool,
}

/// Input rows of width `k` a layer's sample keeps.
fn sample_cap(k: usize) -> usize {
    MAX_ROWS.min(MAX_VALUES / k.max(1)).max(1)
}

impl InputStats {
    pub(super) fn record(&mut self, x: &[f32], rows: usize, k: usize) {
        if self.rotated {
            let mut turned = x[..rows * k].to_vec();
            hadamard::rotate_rows(&mut turned, k, 1);
            return self.record_as_is(&turned, rows, k);
        }
        self.record_as_is(x, rows, k)
    }

    fn record_as_is(&mut self, x: &[f32], rows: usize, k: usize) {
        if self.channels.absmax.is_empty() {
            self.k = k;
            self.rng = 0x9E37_79B9_7F4A_7C15;
            if let Some(g) = &mut self.gram {
                *g = Gram::new(k);
            }
        }
        if let Some(g) = &mut self.gram {
            g.add(&x[..rows * k]);
        }
        let cap = sample_cap(k);
        let fold = self.fold % FOLDS;
        for row in x.chunks_exact(k).take(rows) {
            self.channels.add(row);
            self.folds[fold].add(row);
            self.seen += 1;
            let kept = self.rows.len() / k;
            if kept < cap {
                self.rows.extend_from_slice(row);
                self.row_folds.push(fold as u8);
            } else {
                // xorshift64: the reservoir's draw, reproducible.
                self.rng ^= self.rng << 13;
                self.rng ^= self.rng >> 7;
                self.rng ^= self.rng << 17;
                let at = (self.rng % self.seen) as usize;
                if at < cap {
                    self.rows[at * k..(at + 1) * k].copy_from_slice(row);
                    self.row_folds[at] = fold as u8;
                }
            }
        }
    }

    /// `other`'s rows and extremes added to these (same layer, same width).
    fn absorb(&mut self, other: InputStats) {
        if other.k != self.k {
            return;
        }
        self.channels.absorb(&other.channels);
        for (mine, theirs) in self.folds.iter_mut().zip(&other.folds) {
            mine.absorb(theirs);
        }
        self.out_absmax = self.out_absmax.max(other.out_absmax);
        if let (Some(mine), Some(theirs)) = (&mut self.gram, &other.gram) {
            mine.absorb(theirs);
        }
        // The sample: what fits of the other's after these (both already spread evenly).
        let room = sample_cap(self.k).saturating_sub(self.sample_rows());
        let taken = room.min(other.sample_rows());
        self.rows.extend_from_slice(&other.rows[..taken * self.k]);
        self.row_folds.extend_from_slice(&other.row_folds[..taken]);
        self.seen += other.seen;
    }

    pub(super) fn sample_rows(&self) -> usize {
        self.rows.len() / self.k.max(1)
    }

    /// The sampled rows of `fold`, and how many.
    pub(super) fn fold_rows(&self, fold: usize) -> (Vec<f32>, usize) {
        let k = self.k.max(1);
        let rows: Vec<f32> = self
            .rows
            .chunks_exact(k)
            .zip(&self.row_folds)
            .filter(|(_, f)| usize::from(**f) == fold)
            .flat_map(|(row, _)| row.iter().copied())
            .collect();
        let m = rows.len() / k;
        (rows, m)
    }
}

/// What calibration is for: the activations' ranges only (`pi0d export --calibration`), or
/// quantizing in a scheme (the ranges, a sample of rows and GPTQ's `X^T X`, which takes
/// `k x 256` values a layer and a product per row; under `w8a8`, the layers it rotates
/// recorded rotated).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum Purpose {
    #[default]
    Ranges,
    Quantizing(Scheme),
}

/// Where the float model's layers report their inputs while calibration runs: set on the
/// checkpoint before the model is loaded (`Checkpoint::calibration`).
#[derive(Debug, Default)]
pub(crate) struct Recorder {
    layers: Mutex<HashMap<String, Arc<Mutex<InputStats>>>>,
    purpose: Purpose,
    /// How many observations have begun (the one running is the last: its fold follows).
    observations: AtomicUsize,
}

impl Recorder {
    pub(crate) fn new(purpose: Purpose) -> Recorder {
        Recorder {
            layers: Mutex::default(),
            purpose,
            observations: AtomicUsize::new(0),
        }
    }

    /// The next observation runs: the rows recorded until the next call belong to its fold.
    pub(crate) fn begin_observation(&self) {
        let fold = self.observations.fetch_add(1, Ordering::Relaxed) % FOLDS;
        let layers = self.layers.lock().unwrap_or_else(PoisonError::into_inner);
        for stats in layers.values() {
            stats.lock().unwrap_or_else(PoisonError::into_inner).fold = fold;
        }
    }

    /// The fold of the observation now running (0 before the first).
    fn fold(&self) -> usize {
        self.observations.load(Ordering::Relaxed).saturating_sub(1) % FOLDS
    }

    /// The statistics norm `name` (its weight's canonical name) records its input into.
    pub(crate) fn norm(&self, name: &str) -> Arc<Mutex<InputStats>> {
        self.layer(name, false)
    }

    /// The statistics linear layer `name` (its weight's canonical name), `k` inputs wide,
    /// records its inputs into: rotated where the scheme will rotate them.
    pub(crate) fn linear(&self, name: &str, k: usize) -> Arc<Mutex<InputStats>> {
        let rotated = match self.purpose {
            Purpose::Quantizing(scheme) => rotates(scheme, name, k),
            Purpose::Ranges => false,
        };
        self.layer(name, rotated)
    }

    fn layer(&self, name: &str, rotated: bool) -> Arc<Mutex<InputStats>> {
        let mut layers = self.layers.lock().unwrap_or_else(PoisonError::into_inner);
        let gram = matches!(self.purpose, Purpose::Quantizing(_)).then(Gram::default);
        layers
            .entry(name.to_string())
            .or_insert_with(|| {
                Arc::new(Mutex::new(InputStats {
                    gram,
                    rotated,
                    fold: self.fold(),
                    ..InputStats::default()
                }))
            })
            .clone()
    }
}

/// Records `rows` rows of `x` (`k` values each) into `stats`.
pub(crate) fn observe(stats: &Mutex<InputStats>, x: &[f32], rows: usize, k: usize) {
    stats
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .record(x, rows, k);
}

/// Records the largest magnitude of a layer's output `y`.
pub(crate) fn observe_output(stats: &Mutex<InputStats>, y: &[f32]) {
    let largest = y.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let mut s = stats.lock().unwrap_or_else(PoisonError::into_inner);
    s.out_absmax = s.out_absmax.max(largest);
}

/// The largest activation magnitudes calibration saw in one layer group.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ActivationRange {
    pub group: Group,
    /// The residual stream (what the group's norms take).
    pub stream: f32,
    /// The linear layers' inputs and outputs.
    pub linear_in: f32,
    pub linear_out: f32,
}

impl ActivationRange {
    pub fn largest(&self) -> f32 {
        self.stream.max(self.linear_in).max(self.linear_out)
    }
}

/// The group of any tensor of the model, by where it lies (norms included).
pub(crate) fn group_of(name: &str) -> Option<Group> {
    use crate::policy::pi0::model::{EXPERT, LM, PROJECTOR, VISION};
    Group::of(name).or_else(|| {
        [
            (VISION, Group::Vision),
            (PROJECTOR, Group::Projector),
            (LM, Group::Language),
            (EXPERT, Group::Expert),
        ]
        .into_iter()
        .find(|(prefix, _)| name.starts_with(prefix))
        .map(|(_, g)| g)
    })
}

/// Every calibrated layer's inputs, by weight name.
#[derive(Clone, Default)]
pub(crate) struct Calibration {
    pub(super) layers: BTreeMap<String, InputStats>,
    /// Observations the float model ran on (0: not counted, as for the ranges alone).
    pub(crate) observations: usize,
}

impl Calibration {
    /// The sums of layer `name`'s input rows' products, if calibration saw it (and was for
    /// quantizing).
    pub(crate) fn gram(&self, name: &str) -> Option<&Gram> {
        self.layers.get(name).and_then(|s| s.gram.as_ref())
    }

    /// The largest magnitudes per layer group, in `Group::ALL`'s order (groups seen only).
    pub(crate) fn ranges(&self) -> Vec<ActivationRange> {
        let mut out: BTreeMap<Group, ActivationRange> = BTreeMap::new();
        for (name, stats) in &self.layers {
            let Some(group) = group_of(name) else {
                continue;
            };
            let input = stats.channels.absmax.iter().fold(0.0f32, |m, v| m.max(*v));
            let r = out.entry(group).or_insert(ActivationRange {
                group,
                stream: 0.0,
                linear_in: 0.0,
                linear_out: 0.0,
            });
            if Group::of(name).is_some() {
                r.linear_in = r.linear_in.max(input);
                r.linear_out = r.linear_out.max(stats.out_absmax);
            } else {
                r.stream = r.stream.max(input);
            }
        }
        out.into_values().collect()
    }

    /// Adds what `other` recorded (another set of inputs on the same checkpoint).
    pub(crate) fn merge(&mut self, other: Calibration) {
        self.observations += other.observations;
        for (name, stats) in other.layers {
            match self.layers.get_mut(&name) {
                Some(mine) => mine.absorb(stats),
                None => {
                    self.layers.insert(name, stats);
                }
            }
        }
    }
}

/// Runs the float checkpoint `ck` (its shapes overridden by the `arch` file, if any) on each
/// `pi0d infer` inputs file and collects what its linear layers see.
pub(crate) fn collect(
    checkpoint: &Path,
    arch: Option<&Path>,
    files: &[PathBuf],
    purpose: Purpose,
    threads: usize,
) -> Result<Calibration, QuantizeError> {
    if files.is_empty() {
        return Ok(Calibration::default());
    }
    let overrides = arch.map(ArchOverrides::load).transpose()?;
    let mut ck = Checkpoint::load(checkpoint)?;
    let recorder = Arc::new(Recorder::new(purpose));
    ck.calibration = Some(recorder.clone());
    let model = Pi0Model::load(&ck, overrides, threads)?;
    for (i, file) in files.iter().enumerate() {
        tracing::info!(
            "calibration: running the float model on {} ({} of {})",
            file.display(),
            i + 1,
            files.len()
        );
        let refused =
            |source: Box<dyn std::error::Error + Send + Sync>| QuantizeError::CalibrationInputs {
                path: file.clone(),
                source,
            };
        let batch = Batch::read(file, &model).map_err(|e| refused(e.into()))?;
        // One element at a time: each is an observation of its own fold.
        try_run_each(&model, &batch, || recorder.begin_observation())
            .map_err(|e| refused(e.into()))?;
    }
    drop(model);
    Ok(recorder.finish())
}

impl Recorder {
    /// What was recorded (every layer that saw something), once the model that recorded it
    /// is gone.
    pub(crate) fn finish(&self) -> Calibration {
        let layers = self.layers.lock().unwrap_or_else(PoisonError::into_inner);
        let layers = layers
            .iter()
            .map(|(name, stats)| {
                let mut stats = stats.lock().unwrap_or_else(PoisonError::into_inner);
                (name.clone(), std::mem::take(&mut *stats))
            })
            .filter(|(_, s)| s.seen > 0)
            .collect();
        Calibration {
            layers,
            observations: self.observations.load(Ordering::Relaxed),
        }
    }
}

/// Runs the float checkpoint on `files`, each a `[record]` recording or a `pi0d infer` inputs
/// file, and collects what its layers see. `arch` overrides the checkpoint's shapes as
/// `--arch` does everywhere else.
pub(crate) fn collect_any(
    checkpoint: &Path,
    arch: Option<&Path>,
    files: &[PathBuf],
    purpose: Purpose,
    threads: usize,
) -> Result<Calibration, QuantizeError> {
    let (recordings, inputs): (Vec<PathBuf>, Vec<PathBuf>) = files
        .iter()
        .cloned()
        .partition(|p| super::recorded::is_recording(p));
    let mut cal = collect(checkpoint, arch, &inputs, purpose, threads)?;
    if !recordings.is_empty() {
        cal.merge(super::recorded::collect(
            checkpoint,
            arch,
            &recordings,
            purpose,
            threads,
        )?);
    }
    Ok(cal)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn when_more_rows_arrive_than_kept_expect_the_sample_capped_and_the_maxima_exact() {
        let k = 4096;
        let mut stats = InputStats::default();
        let x: Vec<f32> = (0..600 * k).map(|i| (i % 7) as f32 - 3.0).collect();
        stats.record(&x, 600, k);
        assert_eq!(stats.sample_rows(), MAX_VALUES / k);
        assert_eq!(stats.seen, 600);
        assert!(stats.channels.absmax.iter().all(|v| *v == 3.0 || *v == 2.0));
    }
}

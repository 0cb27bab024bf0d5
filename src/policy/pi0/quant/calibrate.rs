//! Calibration: what the float model's linear layers see on real inputs, and the per-input-
//! channel scales chosen from it (`pi0d quantize --calibration`). When quantizing, each layer
//! also keeps the sums `X^T X` that GPTQ rounds its weight with (`gptq`).
//!
//! A few input channels of a transformer's activations run far larger than the rest. Per token
//! int8 activations (`w8a8`) then spend their range on those few, and blocked int4 weights
//! (`w4`) round the columns that meet them as coarsely as any other. Both are helped by moving
//! scale between the two sides of the product: `x W^T = (x / s) (W diag(s))^T` exactly, for
//! any positive `s`. SmoothQuant picks `s_j = max|x_j|^a / max|W_j|^(1-a)` (activations'
//! outliers moved into the weights); AWQ picks `s_j = mean|x_j|^a` (the columns that meet large
//! activations quantized finer). Which `a` is best depends on the layer, so each layer's is
//! searched: the one whose quantized product (GPTQ-rounded, as it will be stored) is nearest
//! the float product on the calibration rows, "no scaling" among the candidates so a layer is
//! never made worse on them.
//!
//! Layers that share an input (attention's q, k and v; the MLP's gate and up) share `s`: their
//! errors are summed, and one division of the input serves all of them.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use pi0d_kernels::packed::PackedMatrix;
use pi0d_kernels::quant::{dequantize_i4, dequantize_i8};

use super::gptq::{rounded_i4, rounded_i8, Gram};
use super::{rotates, Group, QuantizeError, Scheme};
use crate::policy::pi0::checkpoint::{decode, Checkpoint, WeightDtype};
use crate::policy::pi0::config_json::ArchOverrides;
use crate::policy::pi0::hadamard;
use crate::policy::pi0::infer::{try_run_batch, Batch};
use crate::policy::pi0::model::Pi0Model;

/// Input rows kept per layer for the search, at most (and at most `MAX_VALUES` values).
const MAX_ROWS: usize = 512;
const MAX_VALUES: usize = 1 << 20;
/// The exponents tried, besides "no scaling".
const ALPHAS: [f32; 8] = [0.125, 0.25, 0.375, 0.5, 0.625, 0.75, 0.875, 1.0];
/// `s` is kept within this factor of 1 either way: an extreme scale would move a channel's
/// whole range into one side.
const MAX_SCALE: f32 = 1e4;
/// A scaling is kept only when it cuts the calibration rows' error by at least this fraction:
/// a smaller gain is within what other inputs would change (on weights without outlier
/// channels, such as random ones, it does not carry over).
const MIN_GAIN: f64 = 0.1;

/// One linear layer's inputs, as calibration saw them.
#[derive(Clone, Debug, Default)]
pub(crate) struct InputStats {
    k: usize,
    /// Largest `|x_j|` per input channel, and the sum of `|x_j|` (for the mean).
    absmax: Vec<f32>,
    /// Largest `|y|` of the layer's output (a linear layer's; 0 for a norm's probe).
    out_absmax: f32,
    abssum: Vec<f64>,
    /// Rows seen, and a sample of them (reservoir, fixed seed: a rerun chooses the same).
    seen: u64,
    rows: Vec<f32>,
    rng: u64,
    /// `X^T X` over every row (GPTQ's rounding), when the recorder keeps it.
    gram: Option<Gram>,
    /// The rows are recorded rotated (`x R`), as the quantized layer will multiply them.
    rotated: bool,
}

/// Input rows of width `k` a layer's sample keeps.
fn sample_cap(k: usize) -> usize {
    MAX_ROWS.min(MAX_VALUES / k.max(1)).max(1)
}

impl InputStats {
    fn record(&mut self, x: &[f32], rows: usize, k: usize) {
        if self.rotated {
            let mut turned = x[..rows * k].to_vec();
            hadamard::rotate_rows(&mut turned, k, 1);
            return self.record_as_is(&turned, rows, k);
        }
        self.record_as_is(x, rows, k)
    }

    fn record_as_is(&mut self, x: &[f32], rows: usize, k: usize) {
        if self.absmax.is_empty() {
            self.k = k;
            self.absmax = vec![0.0; k];
            self.abssum = vec![0.0; k];
            self.rng = 0x9E37_79B9_7F4A_7C15;
            if let Some(g) = &mut self.gram {
                *g = Gram::new(k);
            }
        }
        if let Some(g) = &mut self.gram {
            g.add(&x[..rows * k]);
        }
        let cap = sample_cap(k);
        for row in x.chunks_exact(k).take(rows) {
            for ((m, s), v) in self.absmax.iter_mut().zip(&mut self.abssum).zip(row) {
                *m = m.max(v.abs());
                *s += f64::from(v.abs());
            }
            self.seen += 1;
            let kept = self.rows.len() / k;
            if kept < cap {
                self.rows.extend_from_slice(row);
            } else {
                // xorshift64: the reservoir's draw, reproducible.
                self.rng ^= self.rng << 13;
                self.rng ^= self.rng >> 7;
                self.rng ^= self.rng << 17;
                let at = (self.rng % self.seen) as usize;
                if at < cap {
                    self.rows[at * k..(at + 1) * k].copy_from_slice(row);
                }
            }
        }
    }

    /// `other`'s rows and extremes added to these (same layer, same width).
    fn absorb(&mut self, other: InputStats) {
        if other.k != self.k {
            return;
        }
        for (m, o) in self.absmax.iter_mut().zip(&other.absmax) {
            *m = m.max(*o);
        }
        for (s, o) in self.abssum.iter_mut().zip(&other.abssum) {
            *s += o;
        }
        self.out_absmax = self.out_absmax.max(other.out_absmax);
        if let (Some(mine), Some(theirs)) = (&mut self.gram, &other.gram) {
            mine.absorb(theirs);
        }
        // The sample: what fits of the other's after these (both already spread evenly).
        let room = sample_cap(self.k).saturating_sub(self.sample_rows()) * self.k;
        self.rows
            .extend_from_slice(&other.rows[..room.min(other.rows.len())]);
        self.seen += other.seen;
    }

    fn sample_rows(&self) -> usize {
        self.rows.len() / self.k.max(1)
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
}

impl Recorder {
    pub(crate) fn new(purpose: Purpose) -> Recorder {
        Recorder {
            layers: Mutex::default(),
            purpose,
        }
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
    layers: BTreeMap<String, InputStats>,
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
            let input = stats.absmax.iter().fold(0.0f32, |m, v| m.max(*v));
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
        try_run_batch(&model, &batch).map_err(|e| refused(e.into()))?;
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
        Calibration { layers }
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

/// The layers that read the same input as `name` share its key (attention's q, k and v; the
/// MLP's gate and up).
fn input_key(name: &str) -> String {
    let base = name.strip_suffix(".weight").unwrap_or(name);
    for (parts, shared) in [
        (&["q_proj", "k_proj", "v_proj"][..], "qkv"),
        (&["gate_proj", "up_proj"][..], "gate_up"),
    ] {
        for p in parts {
            if let Some(stem) = base.strip_suffix(p) {
                return format!("{stem}{shared}");
            }
        }
    }
    base.to_string()
}

/// How a weight will be stored, for the search to reproduce its rounding.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Target {
    Int8 { int8_activations: bool },
    Int4 { block: usize },
}

/// The chosen `s` per weight name (the members of an input group get the same vector), and the
/// exponent each group chose (`None`: no scaling won).
pub(crate) struct Smoothing {
    pub(crate) scales: HashMap<String, Vec<f32>>,
    pub(crate) chosen: BTreeMap<String, Option<f32>>,
}

/// Chooses `s` for every weight `targets` names whose input calibration saw.
pub(crate) fn choose(
    ck: &Checkpoint,
    cal: &Calibration,
    targets: &[(String, Target)],
    scheme: Scheme,
    threads: usize,
) -> Result<Smoothing, QuantizeError> {
    let mut groups: BTreeMap<String, Vec<(&str, Target)>> = BTreeMap::new();
    for (name, target) in targets {
        if cal.layers.contains_key(name) {
            groups
                .entry(input_key(name))
                .or_default()
                .push((name, *target));
        }
    }
    let mut out = Smoothing {
        scales: HashMap::new(),
        chosen: BTreeMap::new(),
    };
    // The search runs GPTQ once per candidate: minutes on a full-size model, so say where it is.
    let total = groups.len();
    for (done, (key, members)) in groups.into_iter().enumerate() {
        if done % 32 == 0 {
            tracing::info!(
                "calibration: choosing scales and integers, input {} of {total}",
                done + 1
            );
        }
        let Some(stats) = cal.layers.get(members[0].0) else {
            continue;
        };
        let mut weights = Vec::with_capacity(members.len());
        for (name, target) in &members {
            let e = ck.find(&[name])?;
            let (Some(dtype), &[n, k]) = (WeightDtype::of(e.dtype), e.shape.as_slice()) else {
                continue;
            };
            if k != stats.k {
                return Err(QuantizeError::Invalid(format!(
                    "calibration: `{name}` takes {k} inputs, but its layer was fed {}",
                    stats.k
                )));
            }
            let mut w: Vec<f32> = decode(ck.bytes(e), dtype).collect();
            ck.release(e);
            // The rows were recorded as the stored weight will meet them.
            if stats.rotated {
                hadamard::rotate_rows(&mut w, k, threads);
            }
            weights.push((name.to_string(), w, n, *target));
        }
        let (alpha, s) = search(stats, &weights, scheme, threads)?;
        out.chosen.insert(key, alpha);
        if alpha.is_some() {
            for (name, _) in &members {
                out.scales.insert(name.to_string(), s.clone());
            }
        }
    }
    Ok(out)
}

/// The candidate `s` for exponent `alpha`.
fn candidate(stats: &InputStats, w_absmax: &[f32], scheme: Scheme, alpha: f32) -> Vec<f32> {
    let mean = |j: usize| (stats.abssum[j] / stats.seen.max(1) as f64) as f32;
    let mut s: Vec<f32> = (0..stats.k)
        .map(|j| {
            let v = match scheme {
                // SmoothQuant: the activations' peaks shared with the weights.
                Scheme::W8a8 => stats.absmax[j].powf(alpha) / w_absmax[j].powf(1.0 - alpha),
                // AWQ: the columns that meet large activations rounded finer.
                _ => mean(j).powf(alpha),
            };
            if v.is_finite() && v > 0.0 {
                v
            } else {
                1.0
            }
        })
        .collect();
    if scheme != Scheme::W8a8 {
        // AWQ's normalization: only the ratios between channels matter to the weights.
        let (lo, hi) = s
            .iter()
            .fold((f32::MAX, 0.0f32), |(lo, hi), v| (lo.min(*v), hi.max(*v)));
        let mid = (lo * hi).sqrt();
        if mid.is_finite() && mid > 0.0 {
            s.iter_mut().for_each(|v| *v /= mid);
        }
    }
    for v in &mut s {
        *v = v.clamp(1.0 / MAX_SCALE, MAX_SCALE);
    }
    s
}

/// The best exponent for one input group and its `s` (`None` and ones: no scaling).
fn search(
    stats: &InputStats,
    weights: &[(String, Vec<f32>, usize, Target)],
    scheme: Scheme,
    threads: usize,
) -> Result<(Option<f32>, Vec<f32>), QuantizeError> {
    let (k, m) = (stats.k, stats.sample_rows());
    let x = &stats.rows;
    let mut w_absmax = vec![0.0f32; k];
    for (_, w, _, _) in weights {
        for row in w.chunks_exact(k) {
            for (a, v) in w_absmax.iter_mut().zip(row) {
                *a = a.max(v.abs());
            }
        }
    }
    // The float products the candidates are measured against.
    let reference: Vec<Vec<f32>> = weights
        .iter()
        .map(|(_, w, n, _)| product(x, m, w, *n, k, threads))
        .collect();
    let error = |s: &[f32]| -> Result<f64, QuantizeError> {
        let mut xs: Vec<f32> = x
            .chunks_exact(k)
            .flat_map(|row| row.iter().zip(s).map(|(v, d)| v / d))
            .collect();
        if weights.iter().any(|(.., t)| {
            matches!(
                t,
                Target::Int8 {
                    int8_activations: true
                }
            )
        }) {
            round_rows_to_int8(&mut xs, k);
        }
        let hessian = stats.gram.as_ref().map(|g| g.hessian(Some(s)));
        let mut total = 0.0;
        for ((name, w, n, target), want) in weights.iter().zip(&reference) {
            let scaled: Vec<f32> = w
                .chunks_exact(k)
                .flat_map(|row| row.iter().zip(s).map(|(v, d)| v * d))
                .collect();
            let failed = |source| QuantizeError::Tensor {
                tensor: name.clone(),
                source,
            };
            let h = hessian.as_ref();
            let deq = match target {
                Target::Int8 { .. } => dequantize_i8(
                    &rounded_i8(&scaled, *n, k, h, threads).map_err(failed)?,
                    *n,
                    k,
                ),
                Target::Int4 { block } => dequantize_i4(
                    &rounded_i4(&scaled, *n, k, *block, h, threads).map_err(failed)?,
                    *n,
                    k,
                ),
            };
            let got = product(&xs, m, &deq, *n, k, threads);
            total += got
                .iter()
                .zip(want)
                .map(|(a, b)| f64::from(a - b).powi(2))
                .sum::<f64>();
        }
        Ok(total)
    };
    let ones = vec![1.0f32; k];
    let plain = error(&ones)?;
    let mut best = (None, plain * (1.0 - MIN_GAIN), ones);
    for alpha in ALPHAS {
        let s = candidate(stats, &w_absmax, scheme, alpha);
        let e = error(&s)?;
        if e < best.1 {
            best = (Some(alpha), e, s);
        }
    }
    Ok((best.0, best.2))
}

/// `x[m, k] w[n, k]^T` in f32 on the packed kernels.
fn product(x: &[f32], m: usize, w: &[f32], n: usize, k: usize, threads: usize) -> Vec<f32> {
    let packed = PackedMatrix::pack(w, n, k);
    let mut out = vec![0.0; m * n];
    packed.matmul(x, m, &mut out, threads);
    out
}

/// Each row of `x` rounded as the `w8a8` kernels quantize activations: per row, `absmax / 127`.
fn round_rows_to_int8(x: &mut [f32], k: usize) {
    for row in x.chunks_exact_mut(k) {
        let absmax = row.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        if absmax > 0.0 {
            let scale = absmax / 127.0;
            row.iter_mut()
                .for_each(|v| *v = (*v / scale).round().clamp(-127.0, 127.0) * scale);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn when_layers_share_an_input_expect_one_key() {
        let p = "paligemma_with_expert.gemma_expert.model.layers.3";
        let key = |n: &str| input_key(&format!("{p}.{n}.weight"));
        assert_eq!(key("self_attn.q_proj"), key("self_attn.v_proj"));
        assert_eq!(key("self_attn.k_proj"), key("self_attn.q_proj"));
        assert_eq!(key("mlp.gate_proj"), key("mlp.up_proj"));
        assert_ne!(key("mlp.down_proj"), key("mlp.up_proj"));
        assert_ne!(key("self_attn.o_proj"), key("self_attn.q_proj"));
        // SigLIP's out_proj is alone too.
        assert_ne!(key("self_attn.out_proj"), key("self_attn.q_proj"));
    }

    #[test]
    fn when_a_channel_carries_outliers_expect_the_search_to_cut_the_error() {
        // 64 rows of 64 inputs, channel 5 a hundred times the rest: per-token int8 spends its
        // range on it. The search must find an `s` whose quantized product is nearer the float
        // one than no scaling, and never pick one that is worse.
        let (m, k, n) = (64, 64, 32);
        let mut stats = InputStats::default();
        let mut seed = 1u32;
        let mut next = || {
            seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (seed >> 8) as f32 / (1 << 24) as f32 - 0.5
        };
        let x: Vec<f32> = (0..m * k)
            .map(|i| next() * if i % k == 5 { 100.0 } else { 1.0 })
            .collect();
        stats.record(&x, m, k);
        let w: Vec<f32> = (0..n * k).map(|_| next()).collect();
        let weights = vec![(
            "w".to_string(),
            w,
            n,
            Target::Int8 {
                int8_activations: true,
            },
        )];
        let (alpha, s) = search(&stats, &weights, Scheme::W8a8, 1).unwrap();
        assert!(alpha.is_some(), "no scaling chosen");
        assert!(
            s[5] > 10.0 * s[0],
            "the outlier channel kept its range: {s:?}"
        );
        // And the sampled rows are exactly what was recorded (fewer than the cap).
        assert_eq!(stats.sample_rows(), m);
    }

    #[test]
    fn when_more_rows_arrive_than_kept_expect_the_sample_capped_and_the_maxima_exact() {
        let k = 4096;
        let mut stats = InputStats::default();
        let x: Vec<f32> = (0..600 * k).map(|i| (i % 7) as f32 - 3.0).collect();
        stats.record(&x, 600, k);
        assert_eq!(stats.sample_rows(), MAX_VALUES / k);
        assert_eq!(stats.seen, 600);
        assert!(stats.absmax.iter().all(|v| *v == 3.0 || *v == 2.0));
    }
}

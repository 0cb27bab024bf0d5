//! The per-input-channel scales chosen from calibration (`pi0d quantize --calibration`).
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
//!
//! SmoothQuant's exponent is chosen on observations other than those it is measured on:
//! calibration's observations alternate between two folds, each candidate's `s` comes from the
//! first fold's peaks and its error from the second fold's rows (then the chosen exponent's `s`
//! is taken from all of them). Measured on the rows whose peaks made it, a scale fits those
//! peaks exactly and looks better than it is: on the random-weight pi0-shaped model at real
//! widths the in-sample search chose exponents near 1 that left other inputs' actions further
//! from the float ones than no scaling did (2.2e-2 against 1.6e-2; held out: 1.4e-2). AWQ's
//! `s` comes from the mean magnitude, which a few observations pin down well: held out, its
//! choices on the trained test model were worse (half the observations to choose from), so it
//! measures on every row. With a single observation there is nothing to hold out either.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};

use pi0d_kernels::packed::PackedMatrix;
use pi0d_kernels::quant::{dequantize_i4, dequantize_i8};

use super::calibrate::{Calibration, Channels, InputStats};
use super::gptq::{rounded_i4, rounded_i8};
use super::{QuantizeError, Scheme};
use crate::policy::pi0::checkpoint::{decode, Checkpoint, WeightDtype};
use crate::policy::pi0::hadamard;

/// The exponents tried, besides "no scaling".
const ALPHAS: [f32; 8] = [0.125, 0.25, 0.375, 0.5, 0.625, 0.75, 0.875, 1.0];
/// `s` is kept within this factor of 1 either way: an extreme scale would move a channel's
/// whole range into one side.
const MAX_SCALE: f32 = 1e4;
/// A scaling is kept only when it cuts the measured rows' error by at least this fraction: a
/// smaller gain is within what other inputs would change (on weights without outlier channels,
/// such as random ones, it does not carry over).
const MIN_GAIN: f64 = 0.1;

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
fn candidate(stats: &Channels, w_absmax: &[f32], scheme: Scheme, alpha: f32) -> Vec<f32> {
    let mut s: Vec<f32> = (0..w_absmax.len())
        .map(|j| {
            let v = match scheme {
                // SmoothQuant: the activations' peaks shared with the weights.
                Scheme::W8a8 => stats.absmax[j].powf(alpha) / w_absmax[j].powf(1.0 - alpha),
                // AWQ: the columns that meet large activations rounded finer.
                _ => stats.mean(j).powf(alpha),
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
    let k = stats.k;
    // SmoothQuant's candidates from the first fold's peaks, measured on the second fold's rows
    // (see the module doc). GPTQ's sums cover every row, for every candidate and for "no
    // scaling" alike.
    let (held_out, held) = match scheme {
        Scheme::W8a8 => stats.fold_rows(1),
        _ => (Vec::new(), 0),
    };
    let (fit, x, m) = if stats.folds.iter().all(|f| f.rows > 0) && held > 0 {
        (&stats.folds[0], Cow::Owned(held_out), held)
    } else {
        (
            &stats.channels,
            Cow::Borrowed(stats.rows.as_slice()),
            stats.sample_rows(),
        )
    };
    let x: &[f32] = &x;
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
    let mut best = (None, error(&ones)? * (1.0 - MIN_GAIN));
    for alpha in ALPHAS {
        let e = error(&candidate(fit, &w_absmax, scheme, alpha))?;
        if e < best.1 {
            best = (Some(alpha), e);
        }
    }
    // The chosen exponent's `s` from every row's statistics.
    Ok(match best.0 {
        Some(alpha) => (
            Some(alpha),
            candidate(&stats.channels, &w_absmax, scheme, alpha),
        ),
        None => (None, ones),
    })
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
    use crate::policy::pi0::quant::calibrate::{observe, Purpose, Recorder};

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

    /// `m` rows of `k` values in -0.5..0.5 (a fixed draw from `seed`), channel `outlier` a
    /// hundred times the rest.
    fn rows_with_outlier(m: usize, k: usize, outlier: usize, seed: u32) -> Vec<f32> {
        let mut seed = seed;
        (0..m * k)
            .map(|i| {
                seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                let v = (seed >> 8) as f32 / (1 << 24) as f32 - 0.5;
                v * if i % k == outlier { 100.0 } else { 1.0 }
            })
            .collect()
    }

    fn int8_weight(n: usize, k: usize) -> Vec<(String, Vec<f32>, usize, Target)> {
        let w = rows_with_outlier(n, k, usize::MAX, 7);
        let target = Target::Int8 {
            int8_activations: true,
        };
        vec![("w".to_string(), w, n, target)]
    }

    #[test]
    fn when_a_channel_carries_outliers_expect_the_search_to_cut_the_error() {
        // 64 rows of 64 inputs, channel 5 a hundred times the rest: per-token int8 spends its
        // range on it. The search must find an `s` whose quantized product is nearer the float
        // one than no scaling, and never pick one that is worse: from one observation (measured
        // on the rows it chose from) and from two (chosen on one, measured on the other).
        let (m, k, n) = (64, 64, 32);
        let weights = int8_weight(n, k);
        let mut one = InputStats::default();
        one.record(&rows_with_outlier(m, k, 5, 1), m, k);
        let mut two = InputStats::default();
        two.record(&rows_with_outlier(m / 2, k, 5, 1), m / 2, k);
        two.fold = 1;
        two.record(&rows_with_outlier(m / 2, k, 5, 2), m / 2, k);
        assert_eq!((two.folds[0].rows, two.folds[1].rows), (32, 32));
        for stats in [one, two] {
            let (alpha, s) = search(&stats, &weights, Scheme::W8a8, 1).unwrap();
            assert!(alpha.is_some(), "no scaling chosen");
            // `s` goes as the peaks to the exponent: 100x peaks, ~10x at 0.5.
            assert!(
                s[5] > 5.0 * s[0],
                "the outlier channel kept its range: {s:?}"
            );
            // And the sampled rows are exactly what was recorded (fewer than the cap).
            assert_eq!(stats.sample_rows(), m);
        }
    }

    #[test]
    fn when_the_peaks_move_between_observations_expect_no_smoothquant_scaling() {
        // Observation 0's large channel is 5, observation 1's is 9: a scale made from one's
        // peaks does nothing for the other's. Measured on its own rows the search would scale
        // both channels down; chosen on one observation and measured on the other, it keeps
        // "no scaling".
        let (m, k, n) = (32, 64, 32);
        let weights = int8_weight(n, k);
        let (a, b) = (rows_with_outlier(m, k, 5, 1), rows_with_outlier(m, k, 9, 2));
        let mut pooled = InputStats::default();
        pooled.record(&a, m, k);
        pooled.record(&b, m, k);
        let (alpha, _) = search(&pooled, &weights, Scheme::W8a8, 1).unwrap();
        assert!(
            alpha.is_some(),
            "in sample, the search scales: the case shows nothing"
        );
        let recorder = Recorder::new(Purpose::Quantizing(Scheme::W8a8));
        let layer = recorder.linear("w", k);
        recorder.begin_observation();
        observe(&layer, &a, m, k);
        recorder.begin_observation();
        observe(&layer, &b, m, k);
        let stats = recorder.finish().layers.remove("w").unwrap();
        assert_eq!((stats.folds[0].rows, stats.folds[1].rows), (32, 32));
        let (alpha, s) = search(&stats, &weights, Scheme::W8a8, 1).unwrap();
        assert_eq!(alpha, None, "{s:?}");
        assert!(s.iter().all(|v| *v == 1.0));
    }
}

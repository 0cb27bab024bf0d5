//! State and action normalization formulas as lerobot's normalizer steps (and openpi's
//! transforms) compute them, and the stat files they read: a normalizer step's safetensors
//! state file, or openpi's `norm_stats.json`. Which formula applies where is the processor's
//! business (`processor/normalizer.rs`).

use std::collections::HashMap;
use std::path::Path;

use half::{bf16, f16};
use safetensors::Dtype;

use super::checkpoint::{parse_safetensors, read_text, regular_file, CheckpointError};
use super::config_json::parse_object;

#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Normalization {
    Identity,
    /// `(x - mean) / (std + eps)`, inverse `x * (std + inverse_eps) + mean` (lerobot: no eps in
    /// the inverse; openpi: 1e-6 on both sides).
    MeanStd {
        mean: Vec<f32>,
        std: Vec<f32>,
        eps: f32,
        inverse_eps: f32,
    },
    /// lerobot's range modes (MIN_MAX, QUANTILES, QUANTILE10): `2 (x - lo) / d - 1`, inverse
    /// `(x + 1) d / 2 + lo`, with `d = hi - lo`, or the step's eps where that is 0. `names`
    /// are the two stats' names (`min`/`max`, `q01`/`q99`, `q10`/`q90`).
    Range {
        lo: Vec<f32>,
        hi: Vec<f32>,
        zero_range: f32,
        names: [&'static str; 2],
    },
    /// openpi's quantiles: `(x - q01) / (q99 - q01 + 1e-6) * 2 - 1` (dimensions whose
    /// quantiles are equal normalize to 0), inverse `(x + 1) / 2 (q99 - q01 + 1e-6) + q01`.
    OpenpiQuantiles {
        q01: Vec<f32>,
        q99: Vec<f32>,
    },
}

/// Pairs of (stat, its partner) zipped with `x`: shorter stats leave the rest of `x` as it is,
/// but stats shorter than the widths they are applied to are refused at load
/// (`check_width`), so every value is covered; nothing here can index out of bounds.
fn pairs<'a>(
    x: &'a mut [f32],
    a: &'a [f32],
    b: &'a [f32],
) -> impl Iterator<Item = (&'a mut f32, (f32, f32))> + 'a {
    x.iter_mut().zip(a.iter().copied().zip(b.iter().copied()))
}

impl Normalization {
    pub(crate) fn normalize(&self, x: &mut [f32]) {
        match self {
            Normalization::Identity => {}
            Normalization::MeanStd { mean, std, eps, .. } => {
                for (x, (m, s)) in pairs(x, mean, std) {
                    *x = (*x - m) / (s + eps);
                }
            }
            Normalization::OpenpiQuantiles { q01, q99 } => {
                for (x, (lo, hi)) in pairs(x, q01, q99) {
                    *x = if lo == hi {
                        0.0
                    } else {
                        (*x - lo) / (hi - lo + OPENPI_EPS) * 2.0 - 1.0
                    };
                }
            }
            Normalization::Range {
                lo, hi, zero_range, ..
            } => {
                for (x, (lo, hi)) in pairs(x, lo, hi) {
                    let d = hi - lo;
                    let d = if d == 0.0 { *zero_range } else { d };
                    *x = 2.0 * (*x - lo) / d - 1.0;
                }
            }
        }
    }

    pub(crate) fn unnormalize(&self, x: &mut [f32]) {
        match self {
            Normalization::Identity => {}
            Normalization::MeanStd {
                mean,
                std,
                inverse_eps,
                ..
            } => {
                for (x, (m, s)) in pairs(x, mean, std) {
                    *x = *x * (s + inverse_eps) + m;
                }
            }
            Normalization::OpenpiQuantiles { q01, q99 } => {
                for (x, (lo, hi)) in pairs(x, q01, q99) {
                    *x = (*x + 1.0) / 2.0 * (hi - lo + OPENPI_EPS) + lo;
                }
            }
            // (x + 1) d / 2 and (x + 1) / 2 d (lerobot writes QUANTILES one way and MIN_MAX
            // the other) round alike: halving is exact.
            Normalization::Range {
                lo, hi, zero_range, ..
            } => {
                for (x, (lo, hi)) in pairs(x, lo, hi) {
                    let d = hi - lo;
                    let d = if d == 0.0 { *zero_range } else { d };
                    *x = (*x + 1.0) * d / 2.0 + lo;
                }
            }
        }
    }

    /// The stats this normalization uses, with their names' suffixes (`mean`, `std`, ...).
    fn stats(&self) -> Option<[(&'static str, &[f32]); 2]> {
        match self {
            Normalization::Identity => None,
            Normalization::MeanStd { mean, std, .. } => Some([("mean", mean), ("std", std)]),
            Normalization::Range { lo, hi, names, .. } => Some([(names[0], lo), (names[1], hi)]),
            Normalization::OpenpiQuantiles { q01, q99 } => Some([("q01", q01), ("q99", q99)]),
        }
    }

    /// Refuses stats that do not cover `width` values (`key`'s stats in `path`), or of unequal
    /// lengths; longer ones are used for their first `width` values, with a warning.
    pub(crate) fn check_width(
        &self,
        path: &Path,
        key: &str,
        width: usize,
        source: &str,
    ) -> Result<(), CheckpointError> {
        let Some(stats) = self.stats() else {
            return Ok(());
        };
        for (suffix, v) in &stats {
            if v.len() < width {
                return Err(CheckpointError::StatLength {
                    path: path.into(),
                    stat: format!("{key}.{suffix}"),
                    expected: width,
                    found: v.len(),
                    width: source.into(),
                });
            }
        }
        let [(a, av), (b, bv)] = stats;
        if av.len() != bv.len() {
            return Err(CheckpointError::StatMismatch {
                path: path.into(),
                a: format!("{key}.{a}"),
                a_len: av.len(),
                b: format!("{key}.{b}"),
                b_len: bv.len(),
            });
        }
        if av.len() > width {
            tracing::warn!(
                file = %path.display(),
                stat = format!("{key}.{a}, {key}.{b}"),
                values = av.len(),
                width,
                "normalization stats are longer than the width they apply to: using the first {width}"
            );
        }
        Ok(())
    }
}

/// The robot's state and action widths the stats must cover, and where they come from (for
/// messages: "the state width, from config.json").
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Widths {
    pub(crate) state: usize,
    pub(crate) action: usize,
    pub(crate) source: String,
}

fn err(path: &Path, message: impl std::fmt::Display) -> CheckpointError {
    CheckpointError::File {
        path: path.into(),
        message: message.to_string(),
    }
}

pub(crate) fn read_stats(path: &Path) -> Result<HashMap<String, Vec<f32>>, CheckpointError> {
    regular_file(path, "a safetensors file")?;
    let bytes = crate::files::read_regular_bytes(path).map_err(|source| CheckpointError::Io {
        path: path.into(),
        source,
    })?;
    let st = parse_safetensors(path, &bytes)?;
    let mut out = HashMap::new();
    for (name, view) in st.iter() {
        let d = view.data();
        let v: Vec<f32> = match view.dtype() {
            Dtype::F32 => d
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
            Dtype::F64 => d
                .chunks_exact(8)
                .map(|b| {
                    f64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]) as f32
                })
                .collect(),
            Dtype::BF16 => d
                .chunks_exact(2)
                .map(|b| bf16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect(),
            Dtype::F16 => d
                .chunks_exact(2)
                .map(|b| f16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect(),
            other => {
                return Err(err(
                    path,
                    format!("stat `{name}` has unsupported dtype {other:?}"),
                ))
            }
        };
        if let Some(i) = v.iter().position(|x| !x.is_finite()) {
            return Err(err(
                path,
                format!("stat `{name}` has a non-finite value at index {i}"),
            ));
        }
        out.insert(name.to_string(), v);
    }
    Ok(out)
}

pub(crate) const OPENPI_EPS: f32 = 1e-6;

/// openpi's `norm_stats.json` as stats named like lerobot's (`observation.state.mean`, ...).
pub(crate) fn openpi_stats(path: &Path) -> Result<HashMap<String, Vec<f32>>, CheckpointError> {
    let json = parse_object(path, &read_text(path, "a JSON file")?)?;
    let root = json
        .get("norm_stats")
        .and_then(|r| r.as_object())
        .unwrap_or(&json);
    let mut stats = HashMap::new();
    for (key, name) in [("state", "observation.state"), ("actions", "action")] {
        for s in ["mean", "std", "q01", "q99"] {
            let Some(v) = root.get(key).and_then(|k| k.get(s)) else {
                continue;
            };
            let list = v
                .as_array()
                .ok_or_else(|| err(path, format!("`{key}.{s}` is not a list of numbers")))?;
            // A value dropped here would shift every later dimension onto the wrong joint.
            let values = list
                .iter()
                .enumerate()
                .map(|(i, x)| {
                    x.as_f64()
                        .filter(|x| x.is_finite())
                        .map(|x| x as f32)
                        .ok_or_else(|| {
                            err(
                                path,
                                format!("`{key}.{s}[{i}]` is {x}, not a finite number"),
                            )
                        })
                })
                .collect::<Result<Vec<f32>, _>>()?;
            stats.insert(format!("{name}.{s}"), values);
        }
    }
    Ok(stats)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn openpi_stats_use_its_formulas_on_both_sides() {
        let x0 = [0.5f32, -2.0, 3.0];
        let m = Normalization::MeanStd {
            mean: vec![0.1, 0.2, 0.3],
            std: vec![1e-5, 2.0, 0.5],
            eps: OPENPI_EPS,
            inverse_eps: OPENPI_EPS,
        };
        let mut x = x0;
        m.normalize(&mut x);
        assert!((x[0] - (0.5 - 0.1) / (1e-5 + 1e-6)).abs() < 1.0);
        m.unnormalize(&mut x);
        for (a, b) in x.iter().zip(&x0) {
            assert!((a - b).abs() < 1e-5, "{x:?}");
        }
        let q = Normalization::OpenpiQuantiles {
            q01: vec![0.0, -1.0, 2.0],
            q99: vec![1.0, 1.0, 2.0],
        };
        let mut x = x0;
        q.normalize(&mut x);
        assert!((x[0] - (0.5 / (1.0 + 1e-6) * 2.0 - 1.0)).abs() < 1e-7);
        assert_eq!(x[2], 0.0, "equal quantiles normalize to 0");
        let mut a = [0.25f32, 1.0, 0.0];
        q.unnormalize(&mut a);
        assert!((a[0] - (1.25 / 2.0 * (1.0 + 1e-6))).abs() < 1e-7);
        assert!((a[1] - (2.0 / 2.0 * (2.0 + 1e-6) - 1.0)).abs() < 1e-6);
        assert!((a[2] - (0.5 * 1e-6 + 2.0)).abs() < 1e-6);
    }

    #[test]
    fn when_stats_are_shorter_or_unequal_expect_no_panic() {
        // `check_width` refuses such stats at load; the formulas still cannot index past them.
        let m = Normalization::MeanStd {
            mean: vec![1.0, 1.0, 1.0],
            std: vec![2.0, 2.0],
            eps: 0.0,
            inverse_eps: 0.0,
        };
        let mut x = [3.0f32; 5];
        m.normalize(&mut x);
        assert_eq!(x, [1.0, 1.0, 3.0, 3.0, 3.0]);
        m.unnormalize(&mut x);
        assert_eq!(x, [3.0; 5]);
        let q = Normalization::Range {
            lo: vec![0.0],
            hi: vec![],
            zero_range: 1e-8,
            names: ["min", "max"],
        };
        q.normalize(&mut x);
        q.unnormalize(&mut x);
        assert_eq!(x, [3.0; 5]);
    }

    #[test]
    fn lerobot_mean_std_inverse_has_no_eps() {
        let m = Normalization::MeanStd {
            mean: vec![1.0],
            std: vec![2.0],
            eps: 1e-8,
            inverse_eps: 0.0,
        };
        let mut a = [0.5f32];
        m.unnormalize(&mut a);
        assert_eq!(a[0], 2.0);
    }

    #[test]
    fn when_a_range_is_zero_expect_the_steps_eps_in_its_place() {
        // lerobot substitutes the step's eps for a zero range, both ways.
        let r = Normalization::Range {
            lo: vec![1.0, 0.0],
            hi: vec![1.0, 4.0],
            zero_range: 0.5,
            names: ["q01", "q99"],
        };
        let mut x = [1.25f32, 3.0];
        r.normalize(&mut x);
        assert_eq!(x, [2.0 * 0.25 / 0.5 - 1.0, 2.0 * 3.0 / 4.0 - 1.0]);
        r.unnormalize(&mut x);
        assert_eq!(x, [1.25, 3.0]);
    }
}

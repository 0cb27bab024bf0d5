//! State and action normalization as lerobot's normalizer steps (and openpi's norm stats) do it.
//! Stats come from the checkpoint: `policy_preprocessor.json` / `policy_postprocessor.json`
//! name their normalizer step's safetensors state file; openpi keeps `norm_stats.json`.

use std::collections::HashMap;
use std::path::{Component, Path, PathBuf};

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
    /// `2 (x - q01) / (q99 - q01) - 1`, inverse `(x + 1) (q99 - q01) / 2 + q01`. With `eps`
    /// (openpi's 1e-6) the range is `q99 - q01 + eps` on both sides and dimensions whose
    /// quantiles are equal normalize to 0, as openpi does; without (lerobot) a zero range is
    /// taken as 1e-8.
    Quantiles {
        q01: Vec<f32>,
        q99: Vec<f32>,
        eps: Option<f32>,
    },
    /// `2 (x - min) / (max - min) - 1`.
    MinMax {
        min: Vec<f32>,
        max: Vec<f32>,
    },
}

/// Pairs of (stat, its partner) zipped with `x`: shorter stats leave the rest of `x` as it is,
/// but `Normalizer::load` refuses stats shorter than the widths they are applied to, so every
/// value is covered; nothing here can index out of bounds.
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
            Normalization::Quantiles {
                q01,
                q99,
                eps: Some(eps),
            } => {
                for (x, (lo, hi)) in pairs(x, q01, q99) {
                    *x = if lo == hi {
                        0.0
                    } else {
                        (*x - lo) / (hi - lo + eps) * 2.0 - 1.0
                    };
                }
            }
            Normalization::Quantiles {
                q01: lo,
                q99: hi,
                eps: None,
            }
            | Normalization::MinMax { min: lo, max: hi } => {
                for (x, (lo, hi)) in pairs(x, lo, hi) {
                    let d = hi - lo;
                    let d = if d == 0.0 { 1e-8 } else { d };
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
            Normalization::Quantiles {
                q01,
                q99,
                eps: Some(eps),
            } => {
                for (x, (lo, hi)) in pairs(x, q01, q99) {
                    *x = (*x + 1.0) / 2.0 * (hi - lo + eps) + lo;
                }
            }
            Normalization::Quantiles {
                q01: lo,
                q99: hi,
                eps: None,
            } => {
                for (x, (lo, hi)) in pairs(x, lo, hi) {
                    let d = hi - lo;
                    let d = if d == 0.0 { 1e-8 } else { d };
                    *x = (*x + 1.0) * d / 2.0 + lo;
                }
            }
            Normalization::MinMax { min, max } => {
                for (x, (lo, hi)) in pairs(x, min, max) {
                    let d = hi - lo;
                    let d = if d == 0.0 { 1e-8 } else { d };
                    *x = (*x + 1.0) / 2.0 * d + lo;
                }
            }
        }
    }

    /// The stats this normalization uses, with their names' suffixes (`mean`, `std`, ...).
    fn stats(&self) -> Option<[(&'static str, &[f32]); 2]> {
        match self {
            Normalization::Identity => None,
            Normalization::MeanStd { mean, std, .. } => Some([("mean", mean), ("std", std)]),
            Normalization::Quantiles { q01, q99, .. } => Some([("q01", q01), ("q99", q99)]),
            Normalization::MinMax { min, max } => Some([("min", min), ("max", max)]),
        }
    }

    /// Refuses stats that do not cover `width` values (`key`'s stats in `path`), or of unequal
    /// lengths; longer ones are used for their first `width` values, with a warning.
    fn check_width(
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

/// How the checkpoint normalizes its state input and unnormalizes its action output.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Normalizer {
    pub(crate) state: Normalization,
    pub(crate) action: Normalization,
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

fn read_stats(path: &Path) -> Result<HashMap<String, Vec<f32>>, CheckpointError> {
    regular_file(path, "a safetensors file")?;
    let bytes = std::fs::read(path).map_err(|source| CheckpointError::Io {
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

/// Whose formulas a checkpoint's statistics are meant for.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Convention {
    /// lerobot's normalizer steps, with the step's `eps`.
    Lerobot { eps: f32 },
    /// openpi's `norm_stats.json` (its transforms add 1e-6 on both sides).
    Openpi,
}

const OPENPI_EPS: f32 = 1e-6;

fn mode_for(
    path: &Path,
    mode: &str,
    key: &str,
    stats: &HashMap<String, Vec<f32>>,
    convention: Convention,
) -> Result<Normalization, CheckpointError> {
    let get = |s: &str| {
        stats.get(&format!("{key}.{s}")).cloned().ok_or_else(|| {
            err(
                path,
                format!("{mode} normalization of `{key}` needs stat `{key}.{s}`"),
            )
        })
    };
    Ok(match mode {
        "IDENTITY" => Normalization::Identity,
        "MEAN_STD" => Normalization::MeanStd {
            mean: get("mean")?,
            std: get("std")?,
            eps: match convention {
                Convention::Lerobot { eps } => eps,
                Convention::Openpi => OPENPI_EPS,
            },
            inverse_eps: match convention {
                Convention::Lerobot { .. } => 0.0,
                Convention::Openpi => OPENPI_EPS,
            },
        },
        "QUANTILES" => Normalization::Quantiles {
            q01: get("q01")?,
            q99: get("q99")?,
            eps: (convention == Convention::Openpi).then_some(OPENPI_EPS),
        },
        "MIN_MAX" => Normalization::MinMax {
            min: get("min")?,
            max: get("max")?,
        },
        other => {
            return Err(err(
                path,
                format!("normalization mode `{other}` is not supported"),
            ))
        }
    })
}

/// A normalizer step of a lerobot processor pipeline: feature type -> mode, stats, eps, and
/// the state file the stats came from.
struct NormalizerStep {
    norm_map: HashMap<String, String>,
    stats: HashMap<String, Vec<f32>>,
    eps: f32,
    state_file: PathBuf,
}

/// The normalizer step of one lerobot processor pipeline JSON.
fn pipeline_step(
    dir: &Path,
    file: &str,
    registry: &str,
) -> Result<Option<NormalizerStep>, CheckpointError> {
    let path = dir.join(file);
    if !path.exists() {
        return Ok(None);
    }
    let json = parse_object(&path, &read_text(&path, "a JSON file")?)?;
    let steps = json
        .get("steps")
        .and_then(|s| s.as_array())
        .ok_or_else(|| err(&path, "expected a \"steps\" array"))?;
    let Some(step) = steps.iter().find(|s| s["registry_name"] == registry) else {
        return Ok(None);
    };
    let cfg = &step["config"];
    let norm_map: HashMap<String, String> = serde_json::from_value(cfg["norm_map"].clone())
        .map_err(|source| CheckpointError::Field {
            path: path.clone(),
            field: format!("{registry}.config.norm_map"),
            source,
        })?;
    let eps = match &cfg["eps"] {
        serde_json::Value::Null => 1e-8,
        v => v
            .as_f64()
            .filter(|e| e.is_finite() && *e >= 0.0)
            .ok_or_else(|| {
                err(
                    &path,
                    format!("{registry}.config.eps: expected a finite number >= 0, found {v}"),
                )
            })?,
    } as f32;
    let state_file = step["state_file"]
        .as_str()
        .ok_or_else(|| err(&path, format!("{registry} has no state_file")))?;
    if state_file.is_empty()
        || !Path::new(state_file)
            .components()
            .all(|c| matches!(c, Component::Normal(_)))
    {
        return Err(err(
            &path,
            format!(
                "{registry}.state_file `{state_file}` is not a file name inside {}",
                dir.display()
            ),
        ));
    }
    let state_file = dir.join(state_file);
    Ok(Some(NormalizerStep {
        norm_map,
        stats: read_stats(&state_file)?,
        eps,
        state_file,
    }))
}

/// openpi's `norm_stats.json` as stats named like lerobot's (`observation.state.mean`, ...).
fn openpi_stats(path: &Path) -> Result<HashMap<String, Vec<f32>>, CheckpointError> {
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

impl Normalizer {
    /// Reads the checkpoint directory's lerobot processor files, or openpi's
    /// `norm_stats.json`. `default_mode` is used with openpi stats ("MEAN_STD" for pi0,
    /// "QUANTILES" for pi0.5). Every stat is checked to cover `widths` (state stats the state
    /// width, action stats the action width): a shorter one would leave joints unnormalized.
    pub(crate) fn load(
        dir: &Path,
        default_mode: &str,
        widths: &Widths,
    ) -> Result<Option<Normalizer>, CheckpointError> {
        let state_width = format!("the state width, {}", widths.source);
        let action_width = format!("the action width, {}", widths.source);
        let pre = pipeline_step(dir, "policy_preprocessor.json", "normalizer_processor")?;
        let post = pipeline_step(dir, "policy_postprocessor.json", "unnormalizer_processor")?;
        if let (Some(pre), Some(post)) = (pre, post) {
            let mode = |step: &NormalizerStep, kind: &str| {
                step.norm_map
                    .get(kind)
                    .map(String::as_str)
                    .unwrap_or("IDENTITY")
                    .to_string()
            };
            let state = mode_for(
                &pre.state_file,
                &mode(&pre, "STATE"),
                "observation.state",
                &pre.stats,
                Convention::Lerobot { eps: pre.eps },
            )?;
            state.check_width(
                &pre.state_file,
                "observation.state",
                widths.state,
                &state_width,
            )?;
            let action = mode_for(
                &post.state_file,
                &mode(&post, "ACTION"),
                "action",
                &post.stats,
                Convention::Lerobot { eps: post.eps },
            )?;
            action.check_width(&post.state_file, "action", widths.action, &action_width)?;
            return Ok(Some(Normalizer { state, action }));
        }
        let openpi = dir.join("norm_stats.json");
        if openpi.exists() {
            let stats = openpi_stats(&openpi)?;
            let c = Convention::Openpi;
            let state = mode_for(&openpi, default_mode, "observation.state", &stats, c)?;
            state.check_width(&openpi, "observation.state", widths.state, &state_width)?;
            let action = mode_for(&openpi, default_mode, "action", &stats, c)?;
            action.check_width(&openpi, "action", widths.action, &action_width)?;
            return Ok(Some(Normalizer { state, action }));
        }
        Ok(None)
    }
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
        let q = Normalization::Quantiles {
            q01: vec![0.0, -1.0, 2.0],
            q99: vec![1.0, 1.0, 2.0],
            eps: Some(OPENPI_EPS),
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
        // `Normalizer::load` refuses such stats; the formulas still cannot index past them.
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
        let q = Normalization::MinMax {
            min: vec![0.0],
            max: vec![],
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
}

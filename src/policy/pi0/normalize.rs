//! State and action normalization as lerobot's normalizer steps (and openpi's norm stats) do it.
//! Stats come from the checkpoint: `policy_preprocessor.json` / `policy_postprocessor.json`
//! name their normalizer step's safetensors state file; openpi keeps `norm_stats.json`.

use std::collections::HashMap;
use std::path::Path;

use half::{bf16, f16};
use safetensors::{Dtype, SafeTensors};

use super::checkpoint::CheckpointError;

#[derive(Clone, Debug, PartialEq)]
pub enum Normalization {
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

impl Normalization {
    pub fn normalize(&self, x: &mut [f32]) {
        match self {
            Normalization::Identity => {}
            Normalization::MeanStd { mean, std, eps, .. } => {
                for i in 0..x.len().min(mean.len()) {
                    x[i] = (x[i] - mean[i]) / (std[i] + eps);
                }
            }
            Normalization::Quantiles {
                q01,
                q99,
                eps: Some(eps),
            } => {
                for i in 0..x.len().min(q01.len()) {
                    x[i] = if q01[i] == q99[i] {
                        0.0
                    } else {
                        (x[i] - q01[i]) / (q99[i] - q01[i] + eps) * 2.0 - 1.0
                    };
                }
            }
            Normalization::Quantiles {
                q01: lo,
                q99: hi,
                eps: None,
            }
            | Normalization::MinMax { min: lo, max: hi } => {
                for i in 0..x.len().min(lo.len()) {
                    let d = hi[i] - lo[i];
                    let d = if d == 0.0 { 1e-8 } else { d };
                    x[i] = 2.0 * (x[i] - lo[i]) / d - 1.0;
                }
            }
        }
    }

    pub fn unnormalize(&self, x: &mut [f32]) {
        match self {
            Normalization::Identity => {}
            Normalization::MeanStd {
                mean,
                std,
                inverse_eps,
                ..
            } => {
                for i in 0..x.len().min(mean.len()) {
                    x[i] = x[i] * (std[i] + inverse_eps) + mean[i];
                }
            }
            Normalization::Quantiles {
                q01,
                q99,
                eps: Some(eps),
            } => {
                for i in 0..x.len().min(q01.len()) {
                    x[i] = (x[i] + 1.0) / 2.0 * (q99[i] - q01[i] + eps) + q01[i];
                }
            }
            Normalization::Quantiles {
                q01: lo,
                q99: hi,
                eps: None,
            } => {
                for i in 0..x.len().min(lo.len()) {
                    let d = hi[i] - lo[i];
                    let d = if d == 0.0 { 1e-8 } else { d };
                    x[i] = (x[i] + 1.0) * d / 2.0 + lo[i];
                }
            }
            Normalization::MinMax { min, max } => {
                for i in 0..x.len().min(min.len()) {
                    let d = max[i] - min[i];
                    let d = if d == 0.0 { 1e-8 } else { d };
                    x[i] = (x[i] + 1.0) / 2.0 * d + min[i];
                }
            }
        }
    }
}

/// How the checkpoint normalizes its state input and unnormalizes its action output.
#[derive(Clone, Debug, PartialEq)]
pub struct Normalizer {
    pub state: Normalization,
    pub action: Normalization,
}

fn err(path: &Path, message: impl std::fmt::Display) -> CheckpointError {
    CheckpointError::File {
        path: path.into(),
        message: message.to_string(),
    }
}

fn read_stats(path: &Path) -> Result<HashMap<String, Vec<f32>>, CheckpointError> {
    let bytes = std::fs::read(path).map_err(|e| err(path, e))?;
    let st = SafeTensors::deserialize(&bytes).map_err(|e| err(path, e))?;
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
                .map(|b| f64::from_le_bytes(b.try_into().expect("8 bytes")) as f32)
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

/// A normalizer step of a lerobot processor pipeline: feature type -> mode, stats, eps.
struct NormalizerStep {
    norm_map: HashMap<String, String>,
    stats: HashMap<String, Vec<f32>>,
    eps: f32,
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
    let text = std::fs::read_to_string(&path).map_err(|e| err(&path, e))?;
    let json: serde_json::Value = serde_json::from_str(&text).map_err(|e| err(&path, e))?;
    let steps = json["steps"]
        .as_array()
        .ok_or_else(|| err(&path, "expected a \"steps\" array"))?;
    let Some(step) = steps.iter().find(|s| s["registry_name"] == registry) else {
        return Ok(None);
    };
    let cfg = &step["config"];
    let norm_map: HashMap<String, String> = serde_json::from_value(cfg["norm_map"].clone())
        .map_err(|e| err(&path, format!("{registry}.config.norm_map: {e}")))?;
    let eps = cfg["eps"].as_f64().unwrap_or(1e-8) as f32;
    let state_file = step["state_file"]
        .as_str()
        .ok_or_else(|| err(&path, format!("{registry} has no state_file")))?;
    Ok(Some(NormalizerStep {
        norm_map,
        stats: read_stats(&dir.join(state_file))?,
        eps,
    }))
}

impl Normalizer {
    /// Reads the checkpoint directory's lerobot processor files, or openpi's
    /// `norm_stats.json`. `default_mode` is used with openpi stats ("MEAN_STD" for pi0,
    /// "QUANTILES" for pi0.5).
    pub fn load(dir: &Path, default_mode: &str) -> Result<Option<Normalizer>, CheckpointError> {
        let pre = pipeline_step(dir, "policy_preprocessor.json", "normalizer_processor")?;
        let post = pipeline_step(dir, "policy_postprocessor.json", "unnormalizer_processor")?;
        if let (Some(pre), Some(post)) = (pre, post) {
            let path = dir.join("policy_preprocessor.json");
            let state_mode = pre
                .norm_map
                .get("STATE")
                .map(String::as_str)
                .unwrap_or("IDENTITY");
            let action_mode = post
                .norm_map
                .get("ACTION")
                .map(String::as_str)
                .unwrap_or("IDENTITY");
            return Ok(Some(Normalizer {
                state: mode_for(
                    &path,
                    state_mode,
                    "observation.state",
                    &pre.stats,
                    Convention::Lerobot { eps: pre.eps },
                )?,
                action: mode_for(
                    &dir.join("policy_postprocessor.json"),
                    action_mode,
                    "action",
                    &post.stats,
                    Convention::Lerobot { eps: post.eps },
                )?,
            }));
        }
        let openpi = dir.join("norm_stats.json");
        if openpi.exists() {
            let text = std::fs::read_to_string(&openpi).map_err(|e| err(&openpi, e))?;
            let json: serde_json::Value =
                serde_json::from_str(&text).map_err(|e| err(&openpi, e))?;
            let root = json.get("norm_stats").unwrap_or(&json);
            let mut stats = HashMap::new();
            for (key, name) in [("state", "observation.state"), ("actions", "action")] {
                for s in ["mean", "std", "q01", "q99"] {
                    if let Some(v) = root[key][s].as_array() {
                        let v: Vec<f32> = v
                            .iter()
                            .filter_map(|x| x.as_f64())
                            .map(|x| x as f32)
                            .collect();
                        stats.insert(format!("{name}.{s}"), v);
                    }
                }
            }
            let c = Convention::Openpi;
            return Ok(Some(Normalizer {
                state: mode_for(&openpi, default_mode, "observation.state", &stats, c)?,
                action: mode_for(&openpi, default_mode, "action", &stats, c)?,
            }));
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

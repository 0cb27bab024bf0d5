//! Loading a pi0 / pi0.5 checkpoint as lerobot (>= 0.4) and openpi's PyTorch export write it:
//! `config.json` + `model.safetensors` (or a sharded `model.safetensors.index.json`), or a bare
//! `model.safetensors`. Files are memory-mapped; each tensor is decoded (f32, bf16 or f16) once
//! into f32. Names are looked up with the aliases real exports use.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use half::{bf16, f16};
use safetensors::{Dtype, SafeTensors};
use serde::Deserialize;

#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error("{path}: {message}")]
    File { path: PathBuf, message: String },
    #[error("{path}: tensor `{name}` not found (looked for {candidates})")]
    Missing {
        path: PathBuf,
        name: String,
        candidates: String,
    },
    #[error("{path}: tensor `{name}` has shape {found:?}, expected {expected:?}")]
    Shape {
        path: PathBuf,
        name: String,
        expected: Vec<usize>,
        found: Vec<usize>,
    },
    #[error("{path}: tensor `{name}` has dtype {dtype}, expected F32, BF16 or F16")]
    Dtype {
        path: PathBuf,
        name: String,
        dtype: String,
    },
    #[error("{path}: tensor `{name}` holds a non-finite value at index {index}: refusing the checkpoint")]
    NonFinite {
        path: PathBuf,
        name: String,
        index: usize,
    },
    #[error("{path}: {message}")]
    Arch { path: PathBuf, message: String },
}

/// Storage type of a tensor in the checkpoint (compute is f32 either way).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WeightDtype {
    F32,
    Bf16,
    F16,
}

impl WeightDtype {
    /// Rounds `x` to this storage type and back, as PyTorch does when it computes in it.
    pub fn round(self, x: f32) -> f32 {
        match self {
            WeightDtype::F32 => x,
            WeightDtype::Bf16 => bf16::from_f32(x).to_f32(),
            WeightDtype::F16 => f16::from_f32(x).to_f32(),
        }
    }
}

/// A decoded tensor: row-major f32 data.
#[derive(Clone, Debug)]
pub struct Tensor {
    pub shape: Vec<usize>,
    pub data: Vec<f32>,
    pub dtype: WeightDtype,
}

/// lerobot's `config.json` fields pi0d uses (the rest is ignored).
#[derive(Clone, Debug, Deserialize)]
pub struct PolicyConfigJson {
    #[serde(rename = "type", default = "default_type")]
    pub kind: String,
    #[serde(default = "default_chunk")]
    pub chunk_size: usize,
    #[serde(default = "default_dim")]
    pub max_state_dim: usize,
    #[serde(default = "default_dim")]
    pub max_action_dim: usize,
    #[serde(default = "default_steps")]
    pub num_inference_steps: usize,
    #[serde(default = "default_min_period")]
    pub min_period: f64,
    #[serde(default = "default_max_period")]
    pub max_period: f64,
    pub tokenizer_max_length: Option<usize>,
    #[serde(default = "default_resolution")]
    pub image_resolution: [usize; 2],
    #[serde(default)]
    pub input_features: HashMap<String, FeatureJson>,
    #[serde(default)]
    pub output_features: HashMap<String, FeatureJson>,
}

#[derive(Clone, Debug, Deserialize)]
pub struct FeatureJson {
    #[serde(rename = "type")]
    pub kind: String,
    pub shape: Vec<usize>,
}

fn default_type() -> String {
    "pi0".into()
}
fn default_chunk() -> usize {
    50
}
fn default_dim() -> usize {
    32
}
fn default_steps() -> usize {
    10
}
fn default_min_period() -> f64 {
    4e-3
}
fn default_max_period() -> f64 {
    4.0
}
fn default_resolution() -> [usize; 2] {
    [224, 224]
}

impl Default for PolicyConfigJson {
    fn default() -> Self {
        serde_json::from_str("{}").expect("all fields have defaults")
    }
}

/// Head counts that tensor shapes cannot tell (`--arch FILE`).
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ArchOverrides {
    pub vision_heads: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
}

impl ArchOverrides {
    /// The real pi0 / pi0.5 values.
    pub const PI0: ArchOverrides = ArchOverrides {
        vision_heads: 16,
        heads: 8,
        kv_heads: 1,
        head_dim: 256,
    };

    pub fn load(path: &Path) -> Result<ArchOverrides, CheckpointError> {
        let text = std::fs::read_to_string(path).map_err(|e| CheckpointError::File {
            path: path.into(),
            message: e.to_string(),
        })?;
        serde_json::from_str(&text).map_err(|e| CheckpointError::File {
            path: path.into(),
            message: format!(
                "expected {{\"vision_heads\", \"heads\", \"kv_heads\", \"head_dim\"}}: {e}"
            ),
        })
    }
}

pub struct Checkpoint {
    /// The directory (or file) it was loaded from, for messages.
    pub path: PathBuf,
    pub config: PolicyConfigJson,
    /// `arch.json` beside the weights, if any.
    pub arch_file: Option<ArchOverrides>,
    tensors: HashMap<String, Tensor>,
}

/// Strips the prefixes exports differ in, so lookups are by one canonical name.
fn canonical(name: &str) -> &str {
    name.strip_prefix("model.").unwrap_or(name)
}

fn decode(
    path: &Path,
    name: &str,
    view: &safetensors::tensor::TensorView<'_>,
) -> Result<Tensor, CheckpointError> {
    let bytes = view.data();
    let (data, dtype): (Vec<f32>, WeightDtype) = match view.dtype() {
        Dtype::F32 => (
            bytes
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
            WeightDtype::F32,
        ),
        Dtype::BF16 => (
            bytes
                .chunks_exact(2)
                .map(|b| bf16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect(),
            WeightDtype::Bf16,
        ),
        Dtype::F16 => (
            bytes
                .chunks_exact(2)
                .map(|b| f16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect(),
            WeightDtype::F16,
        ),
        other => {
            return Err(CheckpointError::Dtype {
                path: path.into(),
                name: name.into(),
                dtype: format!("{other:?}"),
            })
        }
    };
    if let Some(index) = data.iter().position(|x| !x.is_finite()) {
        return Err(CheckpointError::NonFinite {
            path: path.into(),
            name: name.into(),
            index,
        });
    }
    Ok(Tensor {
        shape: view.shape().to_vec(),
        data,
        dtype,
    })
}

fn file_err(path: &Path, message: impl std::fmt::Display) -> CheckpointError {
    CheckpointError::File {
        path: path.into(),
        message: message.to_string(),
    }
}

fn load_safetensors(
    path: &Path,
    into: &mut HashMap<String, Tensor>,
) -> Result<(), CheckpointError> {
    let file = std::fs::File::open(path).map_err(|e| file_err(path, e))?;
    // SAFETY: the file is mapped read-only and not modified while mapped (checkpoints are
    // immutable inputs); the map is dropped before this function returns.
    let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| file_err(path, e))?;
    let st = SafeTensors::deserialize(&map)
        .map_err(|e| file_err(path, format!("not a safetensors file: {e}")))?;
    for (name, view) in st.iter() {
        let t = decode(path, name, &view)?;
        into.insert(canonical(name).to_string(), t);
    }
    Ok(())
}

impl Checkpoint {
    /// Loads a checkpoint directory or a bare `.safetensors` file.
    pub fn load(path: &Path) -> Result<Checkpoint, CheckpointError> {
        let mut tensors = HashMap::new();
        let (dir, config) = if path.is_dir() {
            let cfg_path = path.join("config.json");
            let config = if cfg_path.exists() {
                let text =
                    std::fs::read_to_string(&cfg_path).map_err(|e| file_err(&cfg_path, e))?;
                serde_json::from_str(&text).map_err(|e| file_err(&cfg_path, e))?
            } else {
                PolicyConfigJson::default()
            };
            let single = path.join("model.safetensors");
            let index = path.join("model.safetensors.index.json");
            if single.exists() {
                load_safetensors(&single, &mut tensors)?;
            } else if index.exists() {
                let text = std::fs::read_to_string(&index).map_err(|e| file_err(&index, e))?;
                let json: serde_json::Value =
                    serde_json::from_str(&text).map_err(|e| file_err(&index, e))?;
                let map = json["weight_map"]
                    .as_object()
                    .ok_or_else(|| file_err(&index, "expected a \"weight_map\" object"))?;
                let mut shards: Vec<&str> = map.values().filter_map(|v| v.as_str()).collect();
                shards.sort_unstable();
                shards.dedup();
                for shard in shards {
                    load_safetensors(&path.join(shard), &mut tensors)?;
                }
            } else {
                return Err(file_err(
                    path,
                    "no model.safetensors or model.safetensors.index.json",
                ));
            }
            (path.to_path_buf(), config)
        } else {
            load_safetensors(path, &mut tensors)?;
            (
                path.parent().unwrap_or(Path::new(".")).to_path_buf(),
                PolicyConfigJson::default(),
            )
        };
        let arch_path = dir.join("arch.json");
        let arch_file = if arch_path.exists() {
            Some(ArchOverrides::load(&arch_path)?)
        } else {
            None
        };
        Ok(Checkpoint {
            path: path.to_path_buf(),
            config,
            arch_file,
            tensors,
        })
    }

    pub fn contains(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    /// The first of `names` present (canonical names, without a leading `model.`).
    pub fn find(&self, names: &[&str]) -> Result<&Tensor, CheckpointError> {
        names
            .iter()
            .find_map(|n| self.tensors.get(*n))
            .ok_or_else(|| CheckpointError::Missing {
                path: self.path.clone(),
                name: names[0].to_string(),
                candidates: names.join(", "),
            })
    }

    /// A tensor that must have `shape`.
    pub fn take(&self, names: &[&str], shape: &[usize]) -> Result<Tensor, CheckpointError> {
        let t = self.find(names)?;
        if t.shape != shape {
            return Err(CheckpointError::Shape {
                path: self.path.clone(),
                name: names[0].to_string(),
                expected: shape.to_vec(),
                found: t.shape.clone(),
            });
        }
        Ok(t.clone())
    }

    /// Number of `prefix.N.` layers present.
    pub fn count_layers(&self, prefix: &str) -> usize {
        (0..)
            .take_while(|i| {
                let p = format!("{prefix}.{i}.");
                self.tensors.keys().any(|k| k.starts_with(&p))
            })
            .count()
    }
}

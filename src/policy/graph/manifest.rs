//! `manifest.json`: what `pi0d export` wrote and everything a runtime needs to drive the graphs
//! (no checkpoint needed at run time).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::policy::export::pi0::ExportDtype;

pub const FORMAT: &str = "pi0d-graphs/1";
pub const FILE: &str = "manifest.json";

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IoSpec {
    pub name: String,
    /// ONNX's type name: float32, float16, bfloat16, int64.
    pub dtype: String,
    pub shape: Vec<usize>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GraphEntry {
    /// The ONNX file, relative to the manifest.
    pub file: String,
    /// Its external weight file, when the weights do not fit the 2 GB protobuf limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub external_data: Option<String>,
    pub inputs: Vec<IoSpec>,
    pub outputs: Vec<IoSpec>,
    /// Bytes of weights in the graph.
    pub weight_bytes: u64,
    /// Nodes in the graph.
    pub nodes: usize,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Graphs {
    pub prefix: GraphEntry,
    pub denoise: GraphEntry,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CheckpointInfo {
    pub path: String,
    /// SHA-256 over the weight files' bytes, in load order.
    pub sha256: String,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    pub format: String,
    pub producer: String,
    /// "pi0" or "pi05".
    pub variant: String,
    pub dtype: ExportDtype,
    pub opset: i64,
    pub batch: usize,
    pub cameras: usize,
    pub prompt_len: usize,
    pub image_size: usize,
    pub tokens_per_image: usize,
    pub prefix_len: usize,
    pub suffix_len: usize,
    pub chunk: usize,
    pub action_dim: usize,
    pub state_dim: usize,
    pub steps: usize,
    pub dt: f32,
    pub layers: usize,
    pub head_dim: usize,
    pub kv_dim: usize,
    pub expert_width: usize,
    pub vocab: usize,
    /// Additive attention-mask value the bias tables carry.
    pub mask_value: f32,
    pub min_period: f64,
    pub max_period: f64,
    /// The denoise graph runs all steps (`noise` -> `actions`) instead of one.
    pub unrolled: bool,
    pub graphs: Graphs,
    pub checkpoint: CheckpointInfo,
}

#[derive(Debug, thiserror::Error)]
#[error("{path}: {message}")]
pub struct ManifestError {
    pub path: PathBuf,
    pub message: String,
}

impl Manifest {
    pub fn is_pi05(&self) -> bool {
        self.variant == "pi05"
    }

    /// Reads and checks `DIR/manifest.json` (and that the graph files exist).
    pub fn load(dir: &Path) -> Result<Manifest, ManifestError> {
        let path = dir.join(FILE);
        let err = |message: String| ManifestError {
            path: path.clone(),
            message,
        };
        let text = std::fs::read_to_string(&path).map_err(|e| err(e.to_string()))?;
        let m: Manifest = serde_json::from_str(&text).map_err(|e| err(e.to_string()))?;
        if m.format != FORMAT {
            return Err(err(format!(
                "format is {:?}, this pi0d reads {FORMAT:?}",
                m.format
            )));
        }
        if m.variant != "pi0" && m.variant != "pi05" {
            return Err(err(format!("variant {:?} is not pi0 or pi05", m.variant)));
        }
        let suffix = m.chunk + usize::from(!m.is_pi05());
        if m.prefix_len != m.cameras * m.tokens_per_image + m.prompt_len
            || m.suffix_len != suffix
            || m.batch == 0
            || m.cameras == 0
            || m.steps == 0
            || !m.head_dim.is_multiple_of(2)
        {
            return Err(err(format!(
                "inconsistent sizes: prefix_len {} for {} cameras x {} tokens + {} prompt tokens, suffix_len {} for chunk {}",
                m.prefix_len, m.cameras, m.tokens_per_image, m.prompt_len, m.suffix_len, m.chunk
            )));
        }
        for g in [&m.graphs.prefix, &m.graphs.denoise] {
            for f in std::iter::once(&g.file).chain(g.external_data.as_ref()) {
                if !dir.join(f).is_file() {
                    return Err(err(format!("names {f}, which is not in {}", dir.display())));
                }
            }
        }
        Ok(m)
    }
}

//! Quantized pi0 checkpoints: the linear layers' weights stored in int8 (`w8`, `w8a8`), int4
//! (`w4`) or bf16, for the boards whose memory does not hold pi0 in f32 or bf16. `pi0d quantize`
//! writes them (`write`); the loader packs their integer weights as they are (`load`). The
//! weight-only schemes' kernels widen them to f32 as they multiply (compute stays f32, as with
//! bf16 weights); `w8a8`'s multiply int8 activations by them with int32 sums.
//!
//! On disk a quantized linear weight keeps its checkpoint name: `NAME.weight` holds the
//! integers and `NAME.weight_scale` (f32) their scales:
//! - `w8`: `weight` I8 `[out, in]`, symmetric; `weight_scale` `[out]`, one per output row.
//! - `w4`: `weight` U8 `[out, in / 2]`, two values per byte (even column in the low nibble),
//!   each stored plus 8; `weight_scale` `[out, in / block]`, one per block of `block` inputs
//!   (ONNX Runtime's `MatMulNBits` layout with its default zero point).
//!
//! Everything else (norms, embeddings, the patch convolution) is copied as it was.
//! `quantization.json` beside the weights names the scheme and the groups kept float.

pub(crate) mod calibrate;
mod fold;
mod gptq;
pub use calibrate::ActivationRange;
pub(crate) mod load;
pub(crate) mod recorded;
mod smooth;
pub(crate) use recorded::is_recording;
mod write;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

pub use write::{quantize, QuantizeOptions, QuantizeReport};

use super::checkpoint::{canonical, CheckpointError};
use super::model::{EXPERT, LM, PROJECTOR, VISION};
use crate::policy::staging::StagingError;

/// The manifest beside a quantized checkpoint's weights.
pub const MANIFEST: &str = "quantization.json";
const FORMAT: &str = "pi0d-quantized";

/// How the chosen groups' weights are stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Scheme {
    /// int8, one scale per output channel; compute f32.
    W8,
    /// int8 weights as `w8`, and the activations quantized to int8 per token (row) as each
    /// product runs: int8 x int8 products with int32 sums, scaled back to f32.
    W8a8,
    /// int4 in blocks along the input dimension, one scale per block; compute f32. A weight
    /// whose input width is not a multiple of the block is stored as `w8`.
    W4,
    /// bf16 (for an f32 checkpoint); compute f32.
    Bf16,
}

impl Scheme {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Scheme::W8 => "w8",
            Scheme::W8a8 => "w8a8",
            Scheme::W4 => "w4",
            Scheme::Bf16 => "bf16",
        }
    }
}

impl std::fmt::Display for Scheme {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.name())
    }
}

/// The model's parts, as far as quantization is concerned: each linear layer belongs to one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Group {
    /// SigLIP's attention and MLP layers.
    Vision,
    /// The image tokens' projection into the language model's width.
    Projector,
    /// Gemma 2B's attention and MLP layers (the prefix).
    Language,
    /// The action expert's attention and MLP layers (and pi0.5's adaptive norms): every
    /// denoising step.
    Expert,
    /// The small projections around the expert: state, action in/out, the time MLP.
    Heads,
}

impl Group {
    pub const ALL: [Group; 5] = [
        Group::Vision,
        Group::Projector,
        Group::Language,
        Group::Expert,
        Group::Heads,
    ];

    /// Quantized unless asked otherwise: the heads are a few thousand values each and sit on
    /// the actions' path in and out, where their rounding would be felt most.
    pub const DEFAULT: [Group; 4] = [
        Group::Vision,
        Group::Projector,
        Group::Language,
        Group::Expert,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Group::Vision => "vision",
            Group::Projector => "projector",
            Group::Language => "language",
            Group::Expert => "expert",
            Group::Heads => "heads",
        }
    }

    /// The group of a linear layer's weight, by its canonical name (without `model.`); `None`
    /// for anything that is not a linear layer's weight (norms, embeddings, the patch
    /// convolution, the unused language-model heads).
    pub(crate) fn of(name: &str) -> Option<Group> {
        let layer_weight = |base: &str| {
            name.strip_prefix(base)
                .and_then(|rest| rest.strip_prefix(".layers."))
                .is_some_and(|rest| {
                    rest.ends_with(".weight")
                        && (rest.contains(".self_attn.")
                            || rest.contains(".mlp.")
                            || rest.contains("layernorm.dense."))
                })
        };
        const HEADS: [&str; 7] = [
            "state_proj.weight",
            "action_in_proj.weight",
            "action_out_proj.weight",
            "action_time_mlp_in.weight",
            "action_time_mlp_out.weight",
            "time_mlp_in.weight",
            "time_mlp_out.weight",
        ];
        if name.starts_with(VISION) && name.contains(".encoder.layers.") {
            let linear = name.ends_with(".weight")
                && (name.contains(".self_attn.") || name.contains(".mlp."));
            linear.then_some(Group::Vision)
        } else if name == format!("{PROJECTOR}.weight") {
            Some(Group::Projector)
        } else if layer_weight(LM) {
            Some(Group::Language)
        } else if layer_weight(EXPERT) || name == format!("{EXPERT}.norm.dense.weight") {
            Some(Group::Expert)
        } else if HEADS.contains(&name) {
            Some(Group::Heads)
        } else {
            None
        }
    }
}

impl std::fmt::Display for Group {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.name())
    }
}

/// How a scheme's integers were chosen.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Rounding {
    /// Each weight to its nearest code (no calibration; bf16).
    #[default]
    Nearest,
    /// GPTQ: column by column, each one's error moved onto the next on the correlation of the
    /// inputs calibration recorded (layers calibration did not see: to nearest).
    Gptq,
}

/// `quantization.json`: what was quantized, how, and from what.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    pub format: String,
    pub producer: String,
    pub scheme: Scheme,
    /// `w4`'s block along the input dimension.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub block: Option<usize>,
    pub quantized_groups: Vec<Group>,
    pub float_groups: Vec<Group>,
    /// `w4` weights whose input width is not a multiple of the block, stored as `w8`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stored_as_w8: Vec<String>,
    /// The `pi0d infer` inputs files calibration ran the float model on (none: uncalibrated).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub calibration: Vec<PathBuf>,
    /// The observations in them (an inputs file's elements, a recording's frames).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub observations: usize,
    /// Weights stored as `W diag(s)`; their `s` is folded into the norm before them
    /// (`folded_norms`) or kept as `NAME.weight_input_scale`.
    #[serde(default)]
    pub smoothed: usize,
    /// Norm tensors that hold `1 / s` for the weights after them (the model divides nothing at
    /// run time for those).
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub folded_norms: BTreeSet<String>,
    /// How the integers were rounded: to nearest, or by GPTQ on calibration's inputs.
    #[serde(default)]
    pub rounding: Rounding,
    /// Per shared input, the exponent calibration chose (null: no scaling was nearer).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub smoothing: BTreeMap<String, Option<f32>>,
    /// `w8a8` weights stored as `W R`, `R` the orthonormal rotation of
    /// `pi0d_kernels::hadamard`: the model rotates their inputs before quantizing them.
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub rotated: BTreeSet<String>,
    /// Linear weights rewritten.
    pub tensors: usize,
    /// Bytes of the groups' weights before and after.
    pub bytes_before: u64,
    pub bytes_after: u64,
    /// The checkpoint it was made from.
    pub source: PathBuf,
}

impl Manifest {
    /// The layer inputs calibration scaled (an exponent chosen, not "no scaling").
    pub fn scaled_inputs(&self) -> usize {
        self.smoothing.values().filter(|a| a.is_some()).count()
    }

    /// Whether this manifest can describe a checkpoint whose linear weights are stored as
    /// `tensors` (canonical name, dtype): the format is ours, and no weight holds integers its
    /// scheme does not store (int8 in `w8`, `w8a8` and `w4`, whose uneven inputs stay int8;
    /// packed int4 in `w4` alone). The scheme decides how int8 weights multiply, so a manifest
    /// that contradicts the weights would run them as something they are not. Why not, naming
    /// the tensor.
    pub(crate) fn check_against<'a>(
        &self,
        tensors: impl IntoIterator<Item = (&'a str, safetensors::Dtype)>,
    ) -> Result<(), String> {
        use safetensors::Dtype;
        if self.format != FORMAT {
            return Err(format!("format `{}`, expected `{FORMAT}`", self.format));
        }
        let mut int8 = BTreeSet::new();
        for (name, dtype) in tensors {
            if dtype == Dtype::I8 {
                int8.insert(name);
            }
            if Group::of(name).is_none() {
                continue;
            }
            let allowed = match dtype {
                Dtype::I8 => matches!(self.scheme, Scheme::W8 | Scheme::W8a8 | Scheme::W4),
                Dtype::U8 => self.scheme == Scheme::W4,
                _ => true,
            };
            if !allowed {
                let kind = if dtype == Dtype::I8 {
                    "int8"
                } else {
                    "packed int4 (U8)"
                };
                return Err(format!(
                    "tensor `{name}` holds {kind} values, which scheme `{}` does not store",
                    self.scheme
                ));
            }
        }
        // A rotated weight is an int8 linear weight of `w8a8`: its inputs are rotated where
        // they are quantized, and nothing else would undo the rotation.
        for name in &self.rotated {
            let canonical = canonical(name);
            if self.scheme != Scheme::W8a8 {
                return Err(format!(
                    "`rotated` names `{name}`, but scheme `{}` rotates nothing (only `w8a8` does)",
                    self.scheme
                ));
            }
            if Group::of(canonical).is_none() || !int8.contains(canonical) {
                return Err(format!(
                    "`rotated` names `{name}`, which is not an int8 linear weight of the checkpoint"
                ));
            }
        }
        Ok(())
    }
}

/// serde: leave a count of 0 out of the manifest.
fn is_zero(n: &usize) -> bool {
    *n == 0
}

/// Whether `scheme` rotates the inputs of linear weight `name`, `k` inputs wide (and stores the
/// weight rotated): only `w8a8` (int8 activations), and only the Gemma MLPs' down-projections,
/// in the language model and the expert, from `MIN_ROTATED_WIDTH` inputs. Their input, the
/// gated product `gelu(gate) * up`, is heavy tailed: on pi0's real widths (4096 and 16384) a
/// token's largest value is 11 to 13 times its root mean square at random init, rotated about
/// 4, and per-token int8's product error falls 3x. Measured on the pi0-shaped model, the other
/// inputs gain nothing or lose: attention's output (its heads share one key/value head and come
/// out alike) and SigLIP's `fc2` input grow heavier tailed when rotated; the inputs after a
/// norm are near Gaussian already and take calibration's smoothing folded into the norm.
pub(crate) fn rotates(scheme: Scheme, name: &str, k: usize) -> bool {
    scheme == Scheme::W8a8
        && matches!(Group::of(name), Some(Group::Language | Group::Expert))
        && name.ends_with(".mlp.down_proj.weight")
        && k >= MIN_ROTATED_WIDTH
}

/// Narrower gated products have no tail for the rotation to spread: on the test checkpoints
/// (64 and 128 wide, random and trained) it measured no better, slightly worse, than none.
const MIN_ROTATED_WIDTH: usize = 1024;

#[derive(Debug, thiserror::Error)]
pub enum QuantizeError {
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    /// Writing the output failed (the machine's fault).
    #[error("{path}: cannot write it")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: cannot write it")]
    Write {
        path: PathBuf,
        #[source]
        source: safetensors::SafeTensorError,
    },
    #[error("tensor `{tensor}` cannot be quantized")]
    Tensor {
        tensor: String,
        #[source]
        source: pi0d_kernels::quant::QuantError,
    },
    /// A calibration file the model could not run on (why: the source).
    #[error("--calibration {path}: expected a `pi0d infer` inputs file for this checkpoint")]
    CalibrationInputs {
        path: PathBuf,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("{0}")]
    Invalid(String),
}

impl QuantizeError {
    /// The checkpoint or the options were at fault (exit 1), rather than writing (exit 9).
    pub(crate) fn is_input_error(&self) -> bool {
        !matches!(self, QuantizeError::Io { .. } | QuantizeError::Write { .. })
    }
}

impl From<StagingError> for QuantizeError {
    fn from(e: StagingError) -> QuantizeError {
        match e {
            StagingError::Io { path, source } => QuantizeError::Io { path, source },
            StagingError::Refused(message) => QuantizeError::Invalid(message),
        }
    }
}

#[cfg(test)]
mod tests;

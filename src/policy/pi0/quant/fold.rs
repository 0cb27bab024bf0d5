//! Calibration's `s` folded into the norm before the weights that share it, so that the model
//! divides nothing at run time: `x W^T = (x / s) (W diag(s))^T`, and `x / s` is what the norm
//! gives when its scale is divided by `s`.
//!
//! Gemma's RMSNorm scales by `1 + w`: the folded weight is `(1 + w) / s - 1`. SigLIP's
//! LayerNorm scales by `w` and shifts by `b`: both are divided by `s`. A norm is folded only
//! when every weight its output feeds takes the same `s`. pi0.5's adaptive norms compute their
//! scale and shift from the flow time, so they cannot hold it: their weights keep `s` as
//! `NAME.weight_input_scale`, applied where the activations are quantized.

use std::collections::{BTreeSet, HashMap, HashSet};

use super::QuantizeError;
use crate::policy::pi0::checkpoint::{decode, Checkpoint, Entry, WeightDtype};

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    /// `x * rsqrt(mean(x²) + eps) * (1 + w)`.
    Rms,
    /// `(x - mean) * rsqrt(var + eps) * w + b`.
    Layer,
}

const QKV: &[&str] = &["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"];

/// Each foldable norm (by its name within a layer), its kind and the weights its output feeds.
const NORMS: [(&str, Kind, &[&str]); 4] = [
    ("input_layernorm", Kind::Rms, QKV),
    (
        "post_attention_layernorm",
        Kind::Rms,
        &["mlp.gate_proj", "mlp.up_proj"],
    ),
    ("layer_norm1", Kind::Layer, QKV),
    ("layer_norm2", Kind::Layer, &["mlp.fc1"]),
];

/// The norm tensors rewritten with `1 / s` in them (by canonical name) and the weights whose
/// `s` they hold.
#[derive(Default)]
pub(crate) struct Folds {
    pub(crate) tensors: HashMap<String, Vec<f32>>,
    pub(crate) weights: HashSet<String>,
    /// The rewritten tensors as the checkpoint stores them, for the manifest.
    pub(crate) stored: BTreeSet<String>,
}

/// Folds `scales` (per weight name, as calibration chose them) into the norms before them.
pub(crate) fn fold(
    ck: &Checkpoint,
    scales: &HashMap<String, Vec<f32>>,
) -> Result<Folds, QuantizeError> {
    let mut out = Folds::default();
    for e in ck.entries() {
        for (norm, kind, feeds) in NORMS {
            let Some(layer) = e.name.strip_suffix(&format!(".{norm}.weight")) else {
                continue;
            };
            let names: Vec<String> = feeds
                .iter()
                .map(|f| format!("{layer}.{f}.weight"))
                .collect();
            let Some(s) = scales.get(&names[0]) else {
                continue;
            };
            if !names.iter().all(|n| scales.get(n) == Some(s)) {
                continue;
            }
            let bias = match kind {
                Kind::Rms => None,
                Kind::Layer => match ck.entry(&format!("{layer}.{norm}.bias")) {
                    Some(b) => Some(b),
                    // A LayerNorm without a shift is not SigLIP's: leave it to the weights.
                    None => continue,
                },
            };
            let w = floats(ck, e, s.len())?;
            let folded: Vec<f32> = match kind {
                Kind::Rms => w
                    .iter()
                    .zip(s)
                    .map(|(w, s)| ((1.0 + f64::from(*w)) / f64::from(*s) - 1.0) as f32)
                    .collect(),
                Kind::Layer => w.iter().zip(s).map(|(w, s)| w / s).collect(),
            };
            out.stored.insert(e.stored.clone());
            out.tensors.insert(e.name.clone(), folded);
            if let Some(b) = bias {
                let shift = floats(ck, b, s.len())?;
                out.stored.insert(b.stored.clone());
                out.tensors.insert(
                    b.name.clone(),
                    shift.iter().zip(s).map(|(b, s)| b / s).collect(),
                );
            }
            out.weights.extend(names);
        }
    }
    Ok(out)
}

/// A float vector of `len` values.
fn floats(ck: &Checkpoint, e: &Entry, len: usize) -> Result<Vec<f32>, QuantizeError> {
    match (WeightDtype::of(e.dtype), e.shape.as_slice()) {
        (Some(dtype), &[n]) if n == len => {
            let v = decode(ck.bytes(e), dtype).collect();
            ck.release(e);
            Ok(v)
        }
        _ => Err(QuantizeError::Invalid(format!(
            "{}: norm `{}` is {:?} {:?}, expected a float vector of {len} (the width of the weights it feeds)",
            ck.path.display(),
            e.stored,
            e.dtype,
            e.shape
        ))),
    }
}

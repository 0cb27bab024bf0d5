//! Reading a linear layer's weight that may be quantized: int8 or int4 values with their
//! scales come out as the kernels pack them, float weights as before.

use pi0d_kernels::quant::{QuantI4, QuantI8};
use safetensors::Dtype;

use crate::policy::pi0::checkpoint::{
    decode, Checkpoint, CheckpointError, Entry, Tensor, WeightDtype,
};

/// The suffix of a calibrated weight's per-input-channel scales, after the weight's name.
pub(crate) const INPUT_SCALE: &str = "_input_scale";

/// A linear layer's `[out, in]` weight as stored.
pub(crate) enum LinearWeight {
    Float(Tensor),
    Int8(QuantI8),
    Int4(QuantI4),
}

impl Checkpoint {
    /// The first of `names` found, as a `[out, in]` weight: float (checked as `take` checks
    /// it), or int8 / int4 with its `_scale` tensor, every shape and scale checked.
    pub(crate) fn take_linear(
        &self,
        names: &[&str],
        out: usize,
        inp: usize,
    ) -> Result<LinearWeight, CheckpointError> {
        let e = self.find(names)?;
        let invalid = |problem: String| CheckpointError::Quantized {
            path: self.file_of(e).to_path_buf(),
            name: e.name.clone(),
            problem,
        };
        let shape_err = |expected: Vec<usize>| CheckpointError::Shape {
            path: self.file_of(e).to_path_buf(),
            name: e.name.clone(),
            expected,
            found: e.shape.clone(),
        };
        match e.dtype {
            Dtype::I8 => {
                if e.shape != [out, inp] {
                    return Err(shape_err(vec![out, inp]));
                }
                let scales = self.scales(self.scale_entry(e)?, &[out])?;
                let q = self.bytes(e).iter().map(|b| *b as i8).collect();
                self.release(e);
                Ok(LinearWeight::Int8(QuantI8 { q, scales }))
            }
            Dtype::U8 => {
                let scale = self.scale_entry(e)?;
                // The entry's shape is the model's (`logical_int4_shapes`); the file's is
                // `[out, in / 2]`.
                if e.shape != [out, inp] || e.bytes * 2 != out * inp {
                    return Err(shape_err(vec![out, inp]));
                }
                let blocks = match scale.shape[..] {
                    [o, b] if o == out && b > 0 && inp.is_multiple_of(b) => b,
                    _ => {
                        return Err(invalid(format!(
                            "its scales `{}` have shape {:?}, expected [{out}, {inp} / block]",
                            scale.name, scale.shape
                        )))
                    }
                };
                let block = inp / blocks;
                if !(block.is_power_of_two() && (16..=256).contains(&block)) {
                    return Err(invalid(format!(
                        "int4 blocks of {block} inputs: expected a power of two from 16 to 256"
                    )));
                }
                let scales = self.scales(scale, &[out, blocks])?;
                let packed = self.bytes(e).to_vec();
                self.release(e);
                Ok(LinearWeight::Int4(QuantI4 {
                    packed,
                    scales,
                    block,
                }))
            }
            Dtype::F32 | Dtype::BF16 | Dtype::F16 => {
                Ok(LinearWeight::Float(self.take(names, &[out, inp])?))
            }
            other => Err(CheckpointError::Dtype {
                path: self.file_of(e).to_path_buf(),
                name: e.name.clone(),
                dtype: format!("{other:?}"),
                expected: "F32, BF16 or F16, or I8 / U8 with its `_scale` (quantized)",
            }),
        }
    }

    /// A calibrated weight's `s` per input channel (`NAME.weight_input_scale`, `[inp]`, f32,
    /// finite and positive), as its reciprocal: what the input is multiplied by.
    pub(crate) fn input_scale(
        &self,
        names: &[&str],
        inp: usize,
    ) -> Result<Option<Box<[f32]>>, CheckpointError> {
        let e = self.find(names)?;
        let Some(s) = self.entry(&format!("{}{INPUT_SCALE}", e.name)) else {
            return Ok(None);
        };
        let values = self.scales(s, &[inp])?;
        if let Some(i) = values
            .iter()
            .position(|v| !(*v > 0.0 && v.recip().is_finite()))
        {
            return Err(CheckpointError::Quantized {
                path: self.file_of(s).to_path_buf(),
                name: s.name.clone(),
                problem: format!(
                    "input scale {} at channel {i}: expected every input scale above 0 with a finite reciprocal",
                    values[i]
                ),
            });
        }
        Ok(Some(values.iter().map(|v| 1.0 / v).collect()))
    }

    /// The `_scale` tensor beside a quantized weight.
    fn scale_entry(&self, e: &Entry) -> Result<&Entry, CheckpointError> {
        let name = format!("{}_scale", e.name);
        self.entry(&name).ok_or_else(|| CheckpointError::Quantized {
            path: self.file_of(e).to_path_buf(),
            name: e.name.clone(),
            problem: format!(
                "stored as {:?} (quantized) without its scales `{name}`",
                e.dtype
            ),
        })
    }

    /// A quantized weight's scales `s`, checked to be `shape`, f32 and finite.
    fn scales(&self, s: &Entry, shape: &[usize]) -> Result<Vec<f32>, CheckpointError> {
        let path = self.file_of(s).to_path_buf();
        if s.shape != shape {
            return Err(CheckpointError::Shape {
                path,
                name: s.name.clone(),
                expected: shape.to_vec(),
                found: s.shape.clone(),
            });
        }
        if s.dtype != Dtype::F32 {
            return Err(CheckpointError::Dtype {
                path,
                name: s.name.clone(),
                dtype: format!("{:?}", s.dtype),
                expected: "F32 (scales)",
            });
        }
        let scales: Vec<f32> = decode(self.bytes(s), WeightDtype::F32).collect();
        // Copied: the file's pages go (int4's scales are an eighth of a byte a value).
        self.release(s);
        if let Some(index) = scales.iter().position(|x| !x.is_finite()) {
            return Err(CheckpointError::NonFinite {
                path,
                name: s.name.clone(),
                index,
            });
        }
        Ok(scales)
    }
}

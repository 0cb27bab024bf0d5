//! Quantized linear layers in the exported graphs (`pi0d export --quant`, or a checkpoint
//! written by `pi0d quantize`): the weights stay integers in the file, with the scales
//! `pi0d quantize` computes, and ONNX Runtime widens them to f32 as it multiplies, as pi0d's
//! CPU kernels do, so both compute `x @ dequant(W)^T` in f32.
//!
//! - `w4`: com.microsoft `MatMulNBits` (`bits` 4, `accuracy_level` 0: f32 compute). Its `B`
//!   `[N, k/block, block/2]` is our packed `[n, k/2]` read block by block, `scales`
//!   `[N * k/block]` ours in order, no `zero_points` (the default 8 is our offset).
//! - `w8`: standard `DequantizeLinear` (int8 `[k, n]`, one f32 scale per output column) feeding
//!   `MatMul`. ONNX Runtime 1.22's CPU `MatMulNBits` runs `bits` 8 only at `accuracy_level` 4,
//!   which also rounds the activations to int8 (at level 0 it fails: "Only 4b quantization is
//!   supported for unpacked compute"), and that would no longer be the CPU path's product.

use pi0d_kernels::quant::{dequantize_i4, dequantize_i8, quantize_i4_blocks, quantize_i8_rows};
use pi0d_kernels::quant::{QuantI4, QuantI8};
use safetensors::Dtype;

use super::super::builder::{attr_int, GraphBuilder};
use super::super::proto::data_type;
use super::super::ExportError;
use super::Pi0GraphBuilder;
use crate::policy::pi0::checkpoint::Checkpoint;
use crate::policy::pi0::quant::load::LinearWeight;
use crate::policy::pi0::quant::{Group, Scheme};

/// ONNX Runtime's contrib operators' domain.
pub(crate) const MS_DOMAIN: &str = "com.microsoft";
/// `w4`'s block along the input when the export quantizes (`pi0d quantize`'s default).
pub(crate) const BLOCK: usize = 32;

/// How one linear weight goes into the graphs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Form {
    Float,
    Int8,
    Int4 { block: usize },
}

/// The scheme a checkpoint's linear weights are stored in, if `pi0d quantize` wrote it (int4
/// anywhere makes it `w4`: a `w4` checkpoint keeps as int8 the weights its block does not
/// divide).
pub(crate) fn stored_scheme(ck: &Checkpoint) -> Option<Scheme> {
    let mut scheme = None;
    for e in ck.entries().filter(|e| Group::of(&e.name).is_some()) {
        match e.dtype {
            Dtype::U8 => return Some(Scheme::W4),
            Dtype::I8 => scheme = Some(Scheme::W8),
            _ => {}
        }
    }
    scheme
}

/// The `[out, inp]` weight `name` as f32 values, dequantized if stored quantized (the heads a
/// checkpoint quantized with `--groups heads`, where the graphs split them).
pub(crate) fn dense(
    ck: &Checkpoint,
    name: &str,
    out: usize,
    inp: usize,
) -> Result<Vec<f32>, ExportError> {
    Ok(match ck.take_linear(&[name], out, inp)? {
        LinearWeight::Float(t) => t.data.to_vec(),
        LinearWeight::Int8(q) => dequantize_i8(&q, out, inp),
        LinearWeight::Int4(q) => dequantize_i4(&q, out, inp),
    })
}

fn quant_error(name: &str, source: pi0d_kernels::quant::QuantError) -> ExportError {
    ExportError::Quantize {
        tensor: name.into(),
        source,
    }
}

/// Part `name` (`[out, inp]`) in int8: as stored, or quantized now as `pi0d quantize` does.
fn int8_part(ck: &Checkpoint, name: &str, out: usize, inp: usize) -> Result<QuantI8, ExportError> {
    match ck.take_linear(&[name], out, inp)? {
        LinearWeight::Int8(q) => Ok(q),
        LinearWeight::Float(t) => {
            quantize_i8_rows(&t.data, out, inp).map_err(|e| quant_error(name, e))
        }
        LinearWeight::Int4(_) => Err(ExportError::Invalid(format!(
            "tensor `{name}`: stored as int4 where int8 was expected"
        ))),
    }
}

/// Part `name` in int4 blocks of `block`: as stored, or quantized now.
fn int4_part(
    ck: &Checkpoint,
    name: &str,
    (out, inp, block): (usize, usize, usize),
) -> Result<QuantI4, ExportError> {
    let q = match ck.take_linear(&[name], out, inp)? {
        LinearWeight::Int4(q) => q,
        LinearWeight::Float(t) => {
            quantize_i4_blocks(&t.data, out, inp, block).map_err(|e| quant_error(name, e))?
        }
        LinearWeight::Int8(_) => {
            return Err(ExportError::Invalid(format!(
                "tensor `{name}`: stored as int8 where int4 was expected"
            )))
        }
    };
    if q.block != block {
        return Err(ExportError::Invalid(format!(
            "tensor `{name}`: int4 blocks of {}, where its fused partners have {block}",
            q.block
        )));
    }
    Ok(q)
}

impl<'a> Pi0GraphBuilder<'a> {
    /// How the Linear `base` (`[out, inp]`) goes into the graphs: as the checkpoint stores it
    /// when quantized, else quantized when `--quant` asked and it is in one of the groups
    /// `pi0d quantize` quantizes by default (in `w8` when `w4`'s block does not divide `inp`,
    /// as `pi0d quantize` does).
    pub(crate) fn form(&self, base: &str, inp: usize) -> Form {
        let name = format!("{base}.weight");
        let Some(e) = self.ck.entry(&name) else {
            return Form::Float;
        };
        match e.dtype {
            Dtype::I8 => return Form::Int8,
            Dtype::U8 => {
                // The scales `[out, blocks]` tell the block; a malformed pair is refused with
                // the loader's message when the weight is read.
                let blocks = self
                    .ck
                    .entry(&format!("{name}_scale"))
                    .and_then(|s| s.shape.get(1).copied())
                    .filter(|&b| b > 0 && inp.is_multiple_of(b));
                return Form::Int4 {
                    block: blocks.map_or(BLOCK, |b| inp / b),
                };
            }
            _ => {}
        }
        let in_groups = Group::of(&name).is_some_and(|g| Group::DEFAULT.contains(&g));
        match self.quant {
            Some(Scheme::W8) if in_groups => Form::Int8,
            Some(Scheme::W4) if in_groups && inp.is_multiple_of(BLOCK) => {
                Form::Int4 { block: BLOCK }
            }
            Some(Scheme::W4) if in_groups => Form::Int8,
            _ => Form::Float,
        }
    }

    /// `x @ W^T` for the Linears `parts` (`[out, inp]` each, fused along `out`), all in the
    /// quantized `form`. `key` names the fused weight.
    pub(crate) fn quantized_matmul(
        &self,
        g: &mut GraphBuilder<'a>,
        x: &str,
        key: &str,
        parts: &[(String, usize)],
        inp: usize,
        form: Form,
    ) -> String {
        let ck = self.ck;
        let total: usize = parts.iter().map(|p| p.1).sum();
        let names: Vec<(String, usize)> = parts
            .iter()
            .map(|(n, o)| (format!("{n}.weight"), *o))
            .collect();
        let key = key.trim_end_matches(".weight");
        match form {
            Form::Int4 { block } => {
                let blocks = inp / block;
                let (bn, sn) = (names.clone(), names);
                let b = g.raw_weight(
                    &format!("{key}.weight_q4"),
                    &[total, blocks, block / 2],
                    data_type::UINT8,
                    Box::new(move || {
                        let mut out = Vec::with_capacity(total * inp / 2);
                        for (name, o) in &bn {
                            out.extend_from_slice(&int4_part(ck, name, (*o, inp, block))?.packed);
                        }
                        Ok(out)
                    }),
                );
                let s = g.raw_weight(
                    &format!("{key}.weight_q4_scale"),
                    &[total * blocks],
                    data_type::FLOAT,
                    Box::new(move || {
                        let mut out = Vec::with_capacity(total * blocks * 4);
                        for (name, o) in &sn {
                            let q = int4_part(ck, name, (*o, inp, block))?;
                            out.extend(q.scales.iter().flat_map(|v| v.to_le_bytes()));
                        }
                        Ok(out)
                    }),
                );
                g.op_in_domain(
                    MS_DOMAIN,
                    "MatMulNBits",
                    &[x, &b, &s],
                    vec![
                        attr_int("K", inp as i64),
                        attr_int("N", total as i64),
                        attr_int("bits", 4),
                        attr_int("block_size", block as i64),
                        attr_int("accuracy_level", 0),
                    ],
                )
            }
            // Float never comes here; int8 is the safe reading of anything else.
            Form::Int8 | Form::Float => {
                let (qn, sn) = (names.clone(), names);
                let q = g.raw_weight(
                    &format!("{key}.weight_q8"),
                    &[inp, total],
                    data_type::INT8,
                    Box::new(move || {
                        // Transposed to `[inp, total]` for MatMul, as the float weights are.
                        let mut out = vec![0u8; inp * total];
                        let mut col = 0;
                        for (name, o) in &qn {
                            let q = int8_part(ck, name, *o, inp)?;
                            for r in 0..*o {
                                for i in 0..inp {
                                    out[i * total + col + r] = q.q[r * inp + i] as u8;
                                }
                            }
                            col += o;
                        }
                        Ok(out)
                    }),
                );
                let s = g.raw_weight(
                    &format!("{key}.weight_q8_scale"),
                    &[total],
                    data_type::FLOAT,
                    Box::new(move || {
                        let mut out = Vec::with_capacity(total * 4);
                        for (name, o) in &sn {
                            let q = int8_part(ck, name, *o, inp)?;
                            out.extend(q.scales.iter().flat_map(|v| v.to_le_bytes()));
                        }
                        Ok(out)
                    }),
                );
                // Once per graph, however many unrolled steps use it.
                let w = g.shared_op(&q, "DequantizeLinear", &[&q, &s], vec![attr_int("axis", 1)]);
                g.op("MatMul", &[x, &w], vec![])
            }
        }
    }
}

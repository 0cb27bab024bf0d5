//! Writing a built graph as an ONNX file: weights inline, or in an external data file when they
//! would pass protobuf's 2 GB limit. Weights are produced, converted and written one at a time.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;

use prost::Message;

use super::builder::{encode_f32, GraphBuilder, InitData, Initializer, PROBES_KEY};
use super::pi0::qlinear::MS_DOMAIN;
use super::proto::{
    data_type, GraphProto, ModelProto, OperatorSetIdProto, StringStringEntryProto, TensorProto,
};
use super::ExportError;
use crate::policy::graph::manifest::{GraphEntry, IoSpec};

/// The opset every exported graph uses (ATC and ONNX Runtime both take it).
pub(crate) const OPSET: i64 = 13;
/// ONNX IR version written (opset 13 needs >= 7).
pub(crate) const IR_VERSION: i64 = 8;
/// Above this many weight bytes a graph's weights go to an external file (protobuf messages
/// are limited to 2 GiB; the rest of the graph needs some room).
pub(crate) const INLINE_LIMIT: u64 = 1_900_000_000;
/// External tensors start at multiples of this (lets runtimes map them directly).
const ALIGN: u64 = 64;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExternalData {
    /// External only when the weights pass the protobuf limit.
    Auto,
    Always,
}

#[derive(Debug, Clone)]
pub struct ClampReport {
    pub tensor: String,
    pub count: usize,
    pub max_abs: f32,
}

/// Encodes `values` as `elem_type`; f16 values beyond its range are an error unless `clamp`,
/// which saturates them and reports how many.
fn convert(
    name: &str,
    values: &[f32],
    elem_type: i32,
    clamp: bool,
    clamped: &mut Vec<ClampReport>,
) -> Result<Vec<u8>, ExportError> {
    if let Some(i) = values.iter().position(|v| !v.is_finite()) {
        return Err(ExportError::NonFinite {
            tensor: name.into(),
            index: i,
        });
    }
    if elem_type == data_type::FLOAT16 {
        let limit = half::f16::MAX.to_f32();
        let over: Vec<f32> = values
            .iter()
            .filter(|v| v.abs() > limit)
            .map(|v| v.abs())
            .collect();
        if !over.is_empty() {
            let max_abs = over.iter().cloned().fold(0.0f32, f32::max);
            if !clamp {
                return Err(ExportError::F16Overflow {
                    tensor: name.into(),
                    count: over.len(),
                    max_abs,
                });
            }
            clamped.push(ClampReport {
                tensor: name.into(),
                count: over.len(),
                max_abs,
            });
            let v: Vec<f32> = values.iter().map(|v| v.clamp(-limit, limit)).collect();
            return Ok(encode_f32(&v, elem_type));
        }
    }
    Ok(encode_f32(values, elem_type))
}

fn spec(v: &super::proto::ValueInfoProto) -> IoSpec {
    let (t, shape) = v.tensor_shape().unwrap_or((0, Vec::new()));
    IoSpec {
        name: v.name.clone(),
        dtype: data_type::name(t).into(),
        shape: shape.iter().map(|&d| d.max(0) as usize).collect(),
    }
}

/// Writes graphs into one directory with shared settings, collecting f16 clamp reports.
pub(crate) struct GraphWriter<'p> {
    pub(crate) dir: &'p Path,
    pub(crate) external: ExternalData,
    pub(crate) clamp_f16: bool,
    pub(crate) metadata: Vec<(&'static str, String)>,
    /// Advances by the bytes of each weight written.
    pub(crate) progress: &'p indicatif::ProgressBar,
    pub(crate) clamped: Vec<ClampReport>,
}

impl GraphWriter<'_> {
    /// Writes `g` as `dir/file` (and `dir/file.data` when external).
    pub(crate) fn write(
        &mut self,
        g: GraphBuilder<'_>,
        file: &str,
    ) -> Result<GraphEntry, ExportError> {
        let (dir, external, clamp_f16) = (self.dir, self.external, self.clamp_f16);
        let (progress, clamped) = (self.progress, &mut self.clamped);
        let total_bytes: u64 = g.initializers.iter().map(|i| i.byte_len() as u64).sum();
        let weight_bytes: u64 = g
            .initializers
            .iter()
            .filter(|i| !matches!(i.data, InitData::Bytes(_)))
            .map(|i| i.byte_len() as u64)
            .sum();
        let use_external = external == ExternalData::Always || total_bytes > INLINE_LIMIT;
        let data_name = format!("{file}.data");
        let data_path = dir.join(&data_name);
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |e: std::io::Error| ExportError::Io {
                path: path.clone(),
                source: e,
            }
        };
        let mut data = if use_external {
            Some(BufWriter::new(
                File::create(&data_path).map_err(io(&data_path))?,
            ))
        } else {
            None
        };
        let mut offset = 0u64;
        let mut tensors = Vec::with_capacity(g.initializers.len());
        for init in &g.initializers {
            let Initializer {
                name,
                data: source,
                data_type,
                ..
            } = init;
            let bytes = match source {
                InitData::Bytes(b) => b.clone(),
                InitData::F32(f) => convert(name, &f()?, *data_type, clamp_f16, clamped)?,
                InitData::Raw(f) => {
                    let bytes = f()?;
                    if bytes.len() != init.byte_len() {
                        return Err(ExportError::Invalid(format!(
                            "tensor `{name}`: {} bytes produced, {} expected for {:?}",
                            bytes.len(),
                            init.byte_len(),
                            init.dims
                        )));
                    }
                    bytes
                }
            };
            progress.inc(bytes.len() as u64);
            let small = matches!(source, InitData::Bytes(_));
            match data.as_mut() {
                Some(w) if !small => {
                    let pad = (ALIGN - offset % ALIGN) % ALIGN;
                    w.write_all(&vec![0u8; pad as usize])
                        .map_err(io(&data_path))?;
                    offset += pad;
                    w.write_all(&bytes).map_err(io(&data_path))?;
                    let entry = |k: &str, v: String| StringStringEntryProto {
                        key: k.into(),
                        value: v,
                    };
                    tensors.push(TensorProto {
                        dims: init.dims.iter().map(|&d| d as i64).collect(),
                        data_type: *data_type,
                        name: name.clone(),
                        external_data: vec![
                            entry("location", data_name.clone()),
                            entry("offset", offset.to_string()),
                            entry("length", bytes.len().to_string()),
                        ],
                        data_location: 1,
                        ..Default::default()
                    });
                    offset += bytes.len() as u64;
                }
                _ => tensors.push(init.inline_proto(bytes)),
            }
        }
        if let Some(mut w) = data {
            w.flush().map_err(io(&data_path))?;
        }
        let entry = GraphEntry {
            file: file.into(),
            external_data: use_external.then(|| data_name.clone()),
            inputs: g.inputs.iter().map(spec).collect(),
            outputs: g.outputs.iter().map(spec).collect(),
            weight_bytes,
            nodes: g.nodes.len(),
        };
        let probes: Option<(String, String)> = (!g.probes.is_empty()).then(|| {
            let map: serde_json::Map<String, serde_json::Value> = g
                .probes
                .iter()
                .map(|(v, l)| (v.clone(), serde_json::Value::String(l.clone())))
                .collect();
            (
                PROBES_KEY.to_string(),
                serde_json::Value::Object(map).to_string(),
            )
        });
        let mut opset_import = vec![OperatorSetIdProto {
            domain: String::new(),
            version: OPSET,
        }];
        // Quantized graphs' MatMulNBits (ONNX Runtime's contrib operators, version 1).
        if g.nodes.iter().any(|n| n.domain == MS_DOMAIN) {
            opset_import.push(OperatorSetIdProto {
                domain: MS_DOMAIN.into(),
                version: 1,
            });
        }
        let model = ModelProto {
            ir_version: IR_VERSION,
            opset_import,
            producer_name: "pi0d".into(),
            producer_version: env!("CARGO_PKG_VERSION").into(),
            graph: Some(GraphProto {
                node: g.nodes,
                name: g.name,
                initializer: tensors,
                input: g.inputs,
                output: g.outputs,
                ..Default::default()
            }),
            metadata_props: self
                .metadata
                .iter()
                .map(|(k, v)| (k.to_string(), v.clone()))
                .chain(probes)
                .map(|(key, value)| StringStringEntryProto { key, value })
                .collect(),
            ..Default::default()
        };
        let path = dir.join(file);
        std::fs::write(&path, model.encode_to_vec()).map_err(io(&path))?;
        Ok(entry)
    }
}

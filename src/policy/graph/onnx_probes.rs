//! `pi0d infer --backend onnx --activations`: the largest magnitude of every value the exporter
//! marked (each layer group's residual stream as its norms take it, its linear layers' inputs
//! and outputs; `pi0d.probes` in the graph's metadata), measured in the graph's own precision
//! while it runs. An f16 graph that overflows shows it here as an infinity.
//!
//! The graph is loaded with a `Cast -> Abs -> ReduceMax` chain per marked value added as an
//! extra scalar output (from memory: the file on disk is not changed).

use std::collections::BTreeMap;
use std::path::Path;

use ort::io_binding::IoBinding;
use ort::memory::{AllocationDevice, AllocatorType, MemoryInfo, MemoryType};
use ort::session::SessionOutputs;
use prost::Message;

use super::GraphError;
use crate::policy::export::builder::{attr_int, ProbeKind, PROBES_KEY};
use crate::policy::export::proto::{data_type, NodeProto, ValueInfoProto};
use crate::policy::pi0::quant::{ActivationRange, Group};

/// One graph's probe outputs.
pub(crate) struct Probes {
    outputs: Vec<(String, Group, ProbeKind)>,
}

fn parse(label: &str) -> Option<(Group, ProbeKind)> {
    let (group, kind) = label.split_once('/')?;
    let group = Group::ALL.into_iter().find(|g| g.name() == group)?;
    let kind = [ProbeKind::Stream, ProbeKind::LinearIn, ProbeKind::LinearOut]
        .into_iter()
        .find(|k| k.name() == kind)?;
    Some((group, kind))
}

impl Probes {
    /// The graph at `path` with a scalar output per marked value, encoded; refused when the
    /// graph marks none (exported by an older pi0d, or not by pi0d).
    pub(crate) fn instrument(path: &Path) -> Result<(Vec<u8>, Probes), GraphError> {
        let bytes = crate::files::read_regular_bytes(path)
            .map_err(|e| GraphError::Load(format!("{}: cannot read it: {e}", path.display())))?;
        let mut model = crate::policy::export::proto::decode_model(&bytes)
            .map_err(|e| GraphError::Load(format!("{}: not an ONNX model: {e}", path.display())))?;
        // The decoded model holds its own copy of the weights (up to 1.9 GB inline).
        drop(bytes);
        let marked: BTreeMap<String, String> = model
            .metadata_props
            .iter()
            .find(|p| p.key == PROBES_KEY)
            .and_then(|p| serde_json::from_str(&p.value).ok())
            .ok_or_else(|| {
                GraphError::Load(format!(
                    "{}: no `{PROBES_KEY}` metadata: export the graphs again with this pi0d to measure their activations",
                    path.display()
                ))
            })?;
        let graph = model
            .graph
            .as_mut()
            .ok_or_else(|| GraphError::Load(format!("{}: no graph", path.display())))?;
        let mut outputs = Vec::new();
        for (i, (value, label)) in marked.iter().enumerate() {
            let Some((group, kind)) = parse(label) else {
                return Err(GraphError::Load(format!(
                    "{}: probe label `{label}` is not GROUP/KIND",
                    path.display()
                )));
            };
            let name = format!("pi0d_probe_{i}");
            let (f, a) = (format!("{name}_f32"), format!("{name}_abs"));
            let node = |op: &str, input: &str, output: &str, attribute| NodeProto {
                input: vec![input.into()],
                output: vec![output.into()],
                name: format!("{output}_{op}"),
                op_type: op.into(),
                attribute,
                ..Default::default()
            };
            graph.node.extend([
                node(
                    "Cast",
                    value,
                    &f,
                    vec![attr_int("to", data_type::FLOAT.into())],
                ),
                node("Abs", &f, &a, vec![]),
                node("ReduceMax", &a, &name, vec![attr_int("keepdims", 0)]),
            ]);
            graph
                .output
                .push(ValueInfoProto::tensor(&name, data_type::FLOAT, &[]));
            outputs.push((name, group, kind));
        }
        Ok((model.encode_to_vec(), Probes { outputs }))
    }

    /// Binds every probe output to host memory.
    pub(crate) fn bind(&self, binding: &mut IoBinding) -> Result<(), GraphError> {
        let host = MemoryInfo::new(
            AllocationDevice::CPU,
            0,
            AllocatorType::Device,
            MemoryType::Default,
        )
        .map_err(|e| GraphError::Load(format!("host memory info: {e}")))?;
        for (name, ..) in &self.outputs {
            binding
                .bind_output_to_device(name.as_str(), &host)
                .map_err(|e| GraphError::Load(format!("binding `{name}`: {e}")))?;
        }
        Ok(())
    }

    /// Folds a run's probe outputs into `ranges`.
    pub(crate) fn read(
        &self,
        out: &SessionOutputs<'_>,
        ranges: &mut BTreeMap<Group, ActivationRange>,
    ) -> Result<(), GraphError> {
        for (name, group, kind) in &self.outputs {
            let v = out
                .get(name.as_str())
                .ok_or_else(|| GraphError::Runtime(format!("no `{name}` output")))?;
            let (_, data) = v
                .try_extract_tensor::<f32>()
                .map_err(|e| GraphError::Runtime(format!("reading `{name}`: {e}")))?;
            let largest = data.first().copied().unwrap_or(0.0);
            let r = ranges.entry(*group).or_insert(ActivationRange {
                group: *group,
                stream: 0.0,
                linear_in: 0.0,
                linear_out: 0.0,
            });
            let slot = match kind {
                ProbeKind::Stream => &mut r.stream,
                ProbeKind::LinearIn => &mut r.linear_in,
                ProbeKind::LinearOut => &mut r.linear_out,
            };
            // A NaN is kept once seen: it says as much as an infinity.
            if !slot.is_nan() && (largest.is_nan() || largest > *slot) {
                *slot = largest;
            }
        }
        Ok(())
    }
}

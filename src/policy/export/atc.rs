//! Ascend's ATC compiler: the ONNX operators pi0d's graphs may use, and the commands that turn
//! the exported graphs into offline models (`.om`).
//!
//! The list is the intersection of what the exporter needs with CANN's "ONNX operator support
//! list" (CANN 8.0 operator reference, `operatorlist_00176`, every one listed there with opset 13
//! among its versions). A graph using anything else is refused at export time and by a test.

use std::path::Path;

use super::proto::ModelProto;
use crate::policy::graph::manifest::Manifest;

/// Operators the exported graphs may contain (opset 13, default domain).
pub const ATC_OPS: &[&str] = &[
    "Add",
    "Cast",
    "Concat",
    "Conv",
    "Div",
    "Gather",
    "Identity",
    "MatMul",
    "Mul",
    "Neg",
    "ReduceMean",
    "Reshape",
    "Sigmoid",
    "Slice",
    "Softmax",
    "Split",
    "Sqrt",
    "Sub",
    "Tanh",
    "Transpose",
];

/// SoC names ATC takes for the boards pi0d targets (`npu-smi info` shows the chip).
pub const KNOWN_SOCS: &[&str] = &[
    "Ascend310P1",
    "Ascend310P3",
    "Ascend310B1",
    "Ascend310B4",
    "Ascend910B1",
    "Ascend910B2",
    "Ascend910B3",
    "Ascend910B4",
];

/// Operators in `model` outside `ATC_OPS` (or outside the default domain), with a count each.
pub fn unsupported_ops(model: &ModelProto) -> Vec<(String, usize)> {
    let mut bad: std::collections::BTreeMap<String, usize> = Default::default();
    for n in model.graph.iter().flat_map(|g| &g.node) {
        if !n.domain.is_empty() || !ATC_OPS.contains(&n.op_type.as_str()) {
            *bad.entry(format!("{}{}", n.domain, n.op_type)).or_default() += 1;
        }
    }
    bad.into_iter().collect()
}

/// The ATC command lines compiling each exported graph in `dir` for `soc`. The graphs' shapes
/// are static and their precision is already chosen at export, so `origin` keeps it.
pub fn atc_commands(manifest: &Manifest, dir: &Path, soc: &str) -> Vec<Vec<String>> {
    [&manifest.graphs.prefix, &manifest.graphs.denoise]
        .iter()
        .map(|g| {
            let model = dir.join(&g.file);
            let output = dir.join(g.file.trim_end_matches(".onnx"));
            vec![
                "atc".to_string(),
                format!("--model={}", model.display()),
                "--framework=5".into(),
                format!("--output={}", output.display()),
                format!("--soc_version={soc}"),
                "--precision_mode_v2=origin".into(),
                "--log=error".into(),
            ]
        })
        .collect()
}

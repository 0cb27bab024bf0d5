//! Ascend's ATC compiler: the ONNX operators pi0d's graphs may use, and the commands that turn
//! the exported graphs into offline models (`.om`).
//!
//! The list is the intersection of what the exporter needs with CANN's "ONNX operator support
//! list" (CANN 8.0 operator reference, `operatorlist_00176`, every one listed there with opset 13
//! among its versions). A graph using anything else is refused at export time and by a test.

use std::path::Path;

use super::proto::ModelProto;
use crate::policy::graph::manifest::Manifest;
use crate::policy::pi0::quant::{ActivationRange, Group};

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
/// A graph given a `--compression_optimize_conf` file (`calibration`: the prefix's, then the
/// denoise graph's) is quantized to int8 by ATC's own calibration instead, which takes no
/// `origin` precision.
pub fn atc_commands(
    manifest: &Manifest,
    dir: &Path,
    soc: &str,
    calibration: [Option<&Path>; 2],
) -> Vec<Vec<String>> {
    [&manifest.graphs.prefix, &manifest.graphs.denoise]
        .iter()
        .zip(calibration)
        .map(|(g, cfg)| {
            let model = dir.join(&g.file);
            let output = dir.join(g.file.trim_end_matches(".onnx"));
            let precision = match cfg {
                Some(cfg) => format!("--compression_optimize_conf={}", cfg.display()),
                None => "--precision_mode_v2=origin".into(),
            };
            vec![
                "atc".to_string(),
                format!("--model={}", model.display()),
                "--framework=5".into(),
                format!("--output={}", output.display()),
                format!("--soc_version={soc}"),
                precision,
                "--log=error".into(),
            ]
        })
        .collect()
}

/// Beside the graphs once `pi0d export --atc SOC` has run ATC: the SoC the offline models were
/// compiled for, which the `acl` backend compares with the device's at load.
pub const COMPILED_FILE: &str = "compiled.json";

/// Records that ATC compiled the graphs in `dir` for `soc`.
pub fn record_compiled(dir: &Path, soc: &str) -> std::io::Result<()> {
    let text = serde_json::json!({ "soc_version": soc }).to_string();
    std::fs::write(dir.join(COMPILED_FILE), text)
}

/// The SoC the offline models in `dir` were compiled for, when `pi0d export` ran ATC (`None`:
/// ATC was run some other way, or the record does not read).
pub fn compiled_for(dir: &Path) -> Option<String> {
    let text = crate::files::read_regular(&dir.join(COMPILED_FILE), 4096).ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    v.get("soc_version")?.as_str().map(str::to_string)
}

/// float16's largest finite value.
pub const F16_MAX: f32 = 65504.0;
/// Activations within this factor of `F16_MAX` on the calibration inputs may pass it on others.
const F16_NEAR: f32 = 16.0;

/// Whether float16 holds the activations calibration measured (`pi0d export --calibration`),
/// and so which precision ATC may compile the graphs in.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum F16Fit {
    /// Every group's largest activation is at least `F16_NEAR` times below `F16_MAX`: f16
    /// graphs, or ATC's default `force_fp16` on f32 graphs.
    Holds { margin: f32 },
    /// `group` comes within `F16_NEAR` of `F16_MAX`: f32 graphs with `origin` precision.
    Near { group: Group, largest: f32 },
    /// `group` passes `F16_MAX`: f16 would give infinities there.
    Overflows { group: Group, largest: f32 },
}

impl F16Fit {
    /// The verdict on `ranges` (none when nothing was measured).
    pub fn of(ranges: &[ActivationRange]) -> Option<F16Fit> {
        let worst = ranges
            .iter()
            .max_by(|a, b| a.largest().total_cmp(&b.largest()))?;
        let largest = worst.largest();
        Some(if !(largest <= F16_MAX) {
            F16Fit::Overflows {
                group: worst.group,
                largest,
            }
        } else if largest * F16_NEAR > F16_MAX {
            F16Fit::Near {
                group: worst.group,
                largest,
            }
        } else {
            F16Fit::Holds {
                margin: F16_MAX / largest.max(f32::MIN_POSITIVE),
            }
        })
    }

    /// What was measured, for a person: how far below float16's largest value, or which group
    /// comes near it or passes it.
    pub fn describe(self) -> String {
        match self {
            F16Fit::Holds { margin } => {
                format!("float16 holds these activations {margin:.0}x below its largest value")
            }
            F16Fit::Near { group, largest } => format!(
                "the {group} group reaches {largest:.0}, within {F16_NEAR}x of float16's {F16_MAX}"
            ),
            F16Fit::Overflows { group, largest } => {
                format!("the {group} group reaches {largest:.0}, past float16's {F16_MAX}")
            }
        }
    }

    /// The precision the graphs need, for a person.
    pub fn advice(self) -> String {
        match self {
            F16Fit::Holds { .. } => format!(
                "{}: --dtype f16, or ATC's default precision (force_fp16) on f32 graphs",
                self.describe()
            ),
            F16Fit::Near { .. } => format!(
                "{}: export --dtype f32 and keep ATC's --precision_mode_v2=origin (other inputs may overflow float16)",
                self.describe()
            ),
            F16Fit::Overflows { .. } => format!(
                "{}: float16 gives infinities there; export --dtype f32 and keep ATC's --precision_mode_v2=origin",
                self.describe()
            ),
        }
    }
}

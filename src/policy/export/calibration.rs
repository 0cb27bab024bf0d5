//! Inputs for ATC's own int8 post-training quantization (`--compression_optimize_conf` in
//! calibration mode), which runs the graph on the board on `.bin` files of its inputs.
//!
//! `pi0d export --atc SOC --calibration FILE` writes them for the prefix graph (SigLIP and the
//! language model: the chunk's compute-bound part) from a `pi0d infer` inputs file: the images
//! and tokens as given, and the attention bias and RoPE tables the host computes for them, each
//! in the graph's own input order, type and shape. The denoise graph takes the prefix's KV
//! cache, which only the board computes: it is compiled as before.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use half::f16;

use super::ExportError;
use crate::policy::export::pi0::names;
use crate::policy::graph::manifest::Manifest;
use crate::policy::graph::tables::{PrefixTables, SuffixTables};
use crate::policy::graph::{GraphError, GraphModel, GraphRuntime, StepHook};
use crate::policy::pi0::infer::{Batch, BatchDims};

/// One input of the prefix graph, written for ATC.
#[derive(Clone, Debug, PartialEq)]
pub struct CalibrationInput {
    pub name: String,
    pub shape: Vec<usize>,
    /// The file, relative to the export directory.
    pub file: PathBuf,
}

/// The folder in the export directory the inputs go to.
pub const DIR: &str = "calibration";

/// What the prefix graph would have been given: a runtime that keeps its inputs instead of
/// running (the host code before it, checks and tables, is the real one).
#[derive(Default)]
struct Captured {
    images: Vec<Vec<f32>>,
    tokens: Vec<i64>,
    tables: PrefixTables,
}

struct Capture(Arc<Mutex<Option<Captured>>>);

impl GraphRuntime for Capture {
    fn run_prefix(
        &mut self,
        images: &[&[f32]],
        tokens: &[i64],
        tables: &PrefixTables,
    ) -> Result<(), GraphError> {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = Some(Captured {
            images: images.iter().map(|i| i.to_vec()).collect(),
            tokens: tokens.to_vec(),
            tables: tables.clone(),
        });
        Ok(())
    }

    fn run_denoise(
        &mut self,
        _: Option<&[f32]>,
        _: &mut [f32],
        _: &[f32],
        _: &SuffixTables,
        _: Option<&mut StepHook<'_>>,
    ) -> Result<(), GraphError> {
        Ok(())
    }
}

/// Writes the prefix graph's inputs for `inputs_file` (a `pi0d infer` inputs file whose batch,
/// cameras and prompt length are the graphs') into `dir/calibration/`.
pub(crate) fn write_prefix_inputs(
    dir: &Path,
    m: &Manifest,
    inputs_file: &Path,
) -> Result<Vec<CalibrationInput>, ExportError> {
    let refused = |reason: String| {
        ExportError::Invalid(format!(
            "--calibration {}: {reason} (ATC's calibration inputs come from a `pi0d infer` inputs file shaped as the graphs)",
            inputs_file.display()
        ))
    };
    let dims = BatchDims {
        image_size: m.image_size,
        state_dim: m.state_dim,
        chunk: m.chunk,
        action_dim: m.action_dim,
    };
    let batch = Batch::read_for(inputs_file, &dims).map_err(|e| refused(e.to_string()))?;
    let captured = Arc::new(Mutex::new(None));
    let mut model = GraphModel::new(m.clone(), Capture(captured.clone()));
    model
        .sample(&batch.graph_inputs())
        .map_err(|e| refused(e.to_string()))?;
    let c = captured
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .take()
        .ok_or_else(|| refused("the prefix graph was not reached".into()))?;
    let folder = dir.join(DIR).join("prefix");
    std::fs::create_dir_all(&folder).map_err(|source| ExportError::Io {
        path: folder.clone(),
        source,
    })?;
    let mut out = Vec::new();
    for spec in &m.graphs.prefix.inputs {
        let values: Values = match spec.name.as_str() {
            names::LANG_TOKENS => Values::I64(&c.tokens),
            names::PREFIX_BIAS => Values::F32(&c.tables.bias),
            names::PREFIX_COS => Values::F32(&c.tables.cos),
            names::PREFIX_SIN => Values::F32(&c.tables.sin),
            other => match other
                .strip_prefix("image")
                .and_then(|i| i.parse::<usize>().ok())
                .and_then(|i| c.images.get(i))
            {
                Some(image) => Values::F32(image),
                None => {
                    return Err(ExportError::Invalid(format!(
                    "the prefix graph takes `{other}`, which calibration does not know how to fill"
                )))
                }
            },
        };
        let count: usize = spec.shape.iter().product();
        let bytes = values.encode(&spec.dtype, count).ok_or_else(|| {
            ExportError::Invalid(format!(
                "the prefix graph's input `{}` is {} {:?}; calibration has {} values for it",
                spec.name,
                spec.dtype,
                spec.shape,
                values.len()
            ))
        })?;
        let file = PathBuf::from(DIR)
            .join("prefix")
            .join(format!("{}.bin", spec.name));
        let path = dir.join(&file);
        std::fs::write(&path, bytes).map_err(|source| ExportError::Io { path, source })?;
        out.push(CalibrationInput {
            name: spec.name.clone(),
            shape: spec.shape.clone(),
            file,
        });
    }
    Ok(out)
}

enum Values<'a> {
    F32(&'a [f32]),
    I64(&'a [i64]),
}

impl Values<'_> {
    fn len(&self) -> usize {
        match self {
            Values::F32(v) => v.len(),
            Values::I64(v) => v.len(),
        }
    }

    /// Little-endian bytes in the graph input's type, or `None` when type or count do not fit.
    fn encode(&self, dtype: &str, count: usize) -> Option<Vec<u8>> {
        if self.len() != count {
            return None;
        }
        Some(match (self, dtype) {
            (Values::F32(v), "float32") => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            (Values::F32(v), "float16") => v
                .iter()
                .flat_map(|x| f16::from_f32(*x).to_le_bytes())
                .collect(),
            (Values::I64(v), "int64") => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            _ => return None,
        })
    }
}

/// The `--compression_optimize_conf` file for the prefix graph's inputs in `dir`.
pub fn config(dir: &Path, inputs: &[CalibrationInput], soc: &str) -> String {
    let files: Vec<String> = inputs
        .iter()
        .map(|i| dir.join(&i.file).display().to_string())
        .collect();
    let shapes: Vec<String> = inputs
        .iter()
        .map(|i| {
            let dims: Vec<String> = i.shape.iter().map(usize::to_string).collect();
            format!("{}:{}", i.name, dims.join(","))
        })
        .collect();
    format!(
        "calibration:\n{{\n    input_data_dir: {}\n    input_shape: {}\n    infer_soc: {soc}\n    log: info\n}}\n",
        files.join(","),
        shapes.join(";")
    )
}

//! How the `onnx` backend is set up: where ONNX Runtime's library is and which execution
//! provider runs the graphs. Parsed from the config and the command line whether or not the
//! backend is compiled in.

use std::path::PathBuf;

#[derive(Clone, Debug, PartialEq)]
pub enum ExecutionProvider {
    Cpu,
    Cuda {
        device_id: i32,
    },
    TensorRt {
        device_id: i32,
        fp16: bool,
        /// Where built engines are cached (building one takes minutes).
        engine_cache: Option<PathBuf>,
    },
    Cann {
        device_id: i32,
        /// Run each graph as one CANN graph (`enable_cann_graph`).
        graph: bool,
        /// CANN `precision_mode`: force_fp32, force_fp16, allow_fp32_to_fp16,
        /// must_keep_origin_dtype or allow_mix_precision.
        precision_mode: Option<String>,
    },
}

pub const CANN_PRECISION_MODES: &[&str] = &[
    "force_fp32",
    "force_fp16",
    "allow_fp32_to_fp16",
    "must_keep_origin_dtype",
    "allow_mix_precision",
];

impl ExecutionProvider {
    pub fn name(&self) -> &'static str {
        match self {
            ExecutionProvider::Cpu => "cpu",
            ExecutionProvider::Cuda { .. } => "cuda",
            ExecutionProvider::TensorRt { .. } => "tensorrt",
            ExecutionProvider::Cann { .. } => "cann",
        }
    }

    /// From a provider name and its options (`device_id`, the rest defaulted).
    pub fn parse(name: &str, device_id: i32) -> Option<ExecutionProvider> {
        Some(match name {
            "cpu" => ExecutionProvider::Cpu,
            "cuda" => ExecutionProvider::Cuda { device_id },
            "tensorrt" => ExecutionProvider::TensorRt {
                device_id,
                fp16: false,
                engine_cache: None,
            },
            "cann" => ExecutionProvider::Cann {
                device_id,
                graph: true,
                precision_mode: None,
            },
            _ => return None,
        })
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct OnnxOptions {
    /// The ONNX Runtime shared library; default `ORT_DYLIB_PATH`, else `libonnxruntime.so` from
    /// the loader's search path.
    pub library: Option<PathBuf>,
    pub provider: ExecutionProvider,
    /// Intra-op threads for the CPU provider (0: ONNX Runtime's default).
    pub threads: usize,
}

impl Default for OnnxOptions {
    fn default() -> Self {
        OnnxOptions {
            library: None,
            provider: ExecutionProvider::Cpu,
            threads: 0,
        }
    }
}

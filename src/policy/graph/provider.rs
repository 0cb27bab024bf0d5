//! How the `onnx` backend is set up: where ONNX Runtime's library is and which execution
//! provider runs the graphs. The options are plain data owned by the configuration.

#[cfg(feature = "onnx")]
pub(crate) use crate::config::policy::ExecutionProvider;
pub(crate) use crate::config::policy::OnnxOptions;
#[cfg(feature = "onnx")]
pub(crate) use crate::config::policy::CANN_PRECISION_MODES;

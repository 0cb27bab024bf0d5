//! pi0 / pi0.5 on the CPU, numerically matching lerobot (see `tests/it/pi0_golden.rs`).

pub(crate) mod arch;
pub(crate) mod checkpoint;
pub(crate) mod config_json;
pub(crate) mod header;
pub mod infer;
#[cfg(test)]
mod lerobot_tests;
pub(crate) mod model;
pub(crate) mod normalize;
pub(crate) mod ops;
pub mod pipeline;
pub(crate) mod policy;
pub(crate) mod preprocess;
pub(crate) mod processor;
pub mod quant;
pub mod tensorfile;

pub(crate) use pi0d_kernels::hadamard;
pub use pi0d_kernels::packed;
pub(crate) use pi0d_kernels::vecmath;

pub use checkpoint::{ArchOverrides, Checkpoint};
pub use model::{Pi0Model, Variant, Workspace};

//! pi0 / pi0.5 on the CPU, numerically matching lerobot (see `tests/it/pi0_golden.rs`).

pub mod arch;
pub mod checkpoint;
pub mod config_json;
pub mod header;
pub mod infer;
pub mod model;
pub mod normalize;
pub mod ops;
pub mod pipeline;
pub mod preprocess;
pub mod tensorfile;

pub use pi0d_kernels::{packed, vecmath};

pub use checkpoint::{ArchOverrides, Checkpoint, CheckpointError};
pub use model::{Arch, Pi0Input, Pi0Model, Timing, Variant, Workspace};

//! Chunk execution: time alignment, interpolation, chunk switching, and the fixed-rate loop.

pub mod controller;
pub mod executor;
pub mod interpolate;
pub mod rtc;
pub mod stats;
pub mod ticker;

pub use controller::{Controller, TickInputs, TickReport};
pub use executor::Executor;

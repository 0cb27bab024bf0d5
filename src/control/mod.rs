//! Chunk execution: time alignment, interpolation, chunk switching, and the fixed-rate loop.

pub(crate) mod controller;
pub(crate) mod executor;
pub(crate) mod interpolate;
pub(crate) mod rtc;
pub(crate) mod stats;
pub(crate) mod ticker;
mod unsent;

pub use controller::{ChunkOutcome, Controller, ControllerSettings, TickInputs, TickReport};
pub use executor::Executor;

#[cfg(test)]
mod reload_safety_tests;
#[cfg(test)]
mod stall_tests;
#[cfg(test)]
mod watchdog_tests;

//! pi0d: drives a robot arm from pi0 action chunks at a fixed control rate, behind a safety
//! governor.
//!
//! Data flow: `io` (robot inputs) -> `daemon::worker` (inference off the control thread) ->
//! `control` (time-aligned chunk execution, blending) -> `safety` (governor, watchdogs) -> `io`
//! (commands). `daemon` owns the threads and the lifecycle.

// Validation writes `!(a < b)` on purpose: the check then also fails when a value is NaN.
#![allow(clippy::neg_cmp_op_on_partial_ord)]
// Outside tests, a value from outside is never unwrapped: a bad one is a clear error, not a panic.
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub mod chunk;
pub mod config;
pub mod control;
pub mod daemon;
pub mod errors;
pub mod files;
pub mod io;
pub mod joints;
pub mod observation;
pub mod panics;
pub mod policy;
pub mod record;
pub mod remote;
pub mod robot;
pub mod safety;
pub mod telemetry;
#[cfg(test)]
pub(crate) mod testing;
pub mod time;

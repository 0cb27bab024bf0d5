//! pi0d: drives a robot arm from pi0 action chunks at a fixed control rate, behind a safety
//! governor.
//!
//! Data flow: `io` (robot inputs) -> `daemon::worker` (inference off the control thread) ->
//! `control` (time-aligned chunk execution, blending) -> `safety` (governor, watchdogs) -> `io`
//! (commands). `daemon` owns the threads and the lifecycle.
//!
//! # The public API
//!
//! The library serves the `pi0d` binary, its benches and its tests; everything else is
//! crate-private. The public modules:
//!
//! - [`config`]: load and check a configuration ([`config::Config::load`]), the `--ros-args`
//!   overrides ([`config::ros_args`]), the numeric ranges ([`config::ranges`]) and the
//!   `pi0d serve` options ([`config::serve`]).
//! - [`daemon`]: the daemon itself ([`daemon::run`] with [`daemon::RunOptions`]), its exit
//!   reasons ([`daemon::exit::ExitReason`]), logging, signals, reload and real-time set-up, as the
//!   binary's `run` wires them.
//! - [`policy`]: the policies a user embeds: [`policy::from_config`] builds the configured one
//!   (local pi0 on the CPU, an ONNX/ACL graph, or a remote openpi server); [`policy::pi0`],
//!   [`policy::graph`] and [`policy::export`] back `pi0d infer` and `pi0d export`;
//!   [`policy::rtc`] holds real-time chunking.
//! - [`remote`]: `pi0d serve`, an openpi-protocol policy server.
//! - [`record`]: MCAP recordings and the `pi0d plot` reader/plotter.
//! - The vocabulary types those signatures use: [`time`], [`joints`], [`chunk`],
//!   [`observation`], [`robot`], [`safety`], [`control`], [`errors`].
//!
//! [`testing`] re-exports the one internal an integration test reaches directly (the ROS type
//! hashes, for the Zenoh interoperability test) and the test helpers the integration tests share
//! with the unit tests (scratch directories, the peers' Python and ONNX Runtime); it is for this
//! crate's own test suite, not a stable API. Tests that need only the library's internals (the
//! ROS codecs against rosbags, the fuzzers, the control tick's properties and watchdogs, the
//! control loop's step with the inference worker, its allocation count included, the pi0
//! pipeline against lerobot) are unit tests next to the code they test, so those internals stay
//! crate-private: `unreachable_pub` keeps items of private modules from being `pub`.

// Validation writes `!(a < b)` on purpose: the check then also fails when a value is NaN.
#![allow(clippy::neg_cmp_op_on_partial_ord)]
#![warn(unreachable_pub)]
// Outside tests, a value from outside is never unwrapped: a bad one is a clear error, not a panic.
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub mod chunk;
pub mod config;
pub mod control;
#[cfg(test)]
mod counting_alloc;
pub mod daemon;
pub mod errors;
pub(crate) mod files;
#[doc(hidden)]
pub mod fuzz;
mod io;
pub mod joints;
pub mod observation;
pub mod outside;
pub(crate) mod panics;
pub mod policy;
pub mod record;
pub mod remote;
pub mod robot;
pub mod safety;
/// Scripted demonstrations of the simulator's reaching task (`[sim.task]`), written for
/// training a policy on what the simulator shows (`examples/sim_demos.rs`).
pub mod sim {
    pub use crate::io::sim::demos::{write_demonstrations, DemoError, DemoOptions, DemoReport};
}
pub(crate) mod telemetry;
mod test_dirs;
pub mod time;
#[cfg(feature = "zenoh")]
pub mod zenoh_session;

/// Counts allocations only on threads a test watches (a per-thread flag): the control tick's
/// test proves it allocates nothing; other unit tests running meanwhile are not counted.
#[cfg(test)]
#[global_allocator]
static ALLOCATOR: counting_alloc::Counting = counting_alloc::Counting;

/// Internals the integration tests reach directly, gathered here so their modules stay
/// private. Not a stable API: for pi0d's own test suite.
#[doc(hidden)]
pub mod testing {
    pub use crate::test_dirs::{ort_library, peer_python, processor_case, TempDir};

    /// The ROS 2 type hashes, which the Zenoh interoperability test puts in its key
    /// expressions as rmw_zenoh does.
    pub mod ros {
        pub use crate::io::ros::type_hash::{type_hash, TYPE_HASHES};
    }
}

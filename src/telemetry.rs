//! Live counters shared by threads: the control thread, the I/O transports, the inference
//! worker and the recorder write them, the status line, metrics and summary read them, all
//! without locks. Below `io` and `control`, so the transports need not import the control loop.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::safety::{Mode, ModeKind};

/// Log lines held back by a rate limit (pi0d's own per-kind limits on what peers cause, and
/// the limit on dependencies' lines), since start-up: a peer flooding an input costs a count,
/// not the journal.
static LOG_LINES_SUPPRESSED: AtomicU64 = AtomicU64::new(0);

pub(crate) fn note_log_lines_suppressed(n: u64) {
    LOG_LINES_SUPPRESSED.fetch_add(n, Ordering::Relaxed);
}

pub(crate) fn log_lines_suppressed() -> u64 {
    LOG_LINES_SUPPRESSED.load(Ordering::Relaxed)
}

/// Counters published by the control thread for the status line and diagnostics.
#[derive(Default)]
pub(crate) struct LiveStats {
    pub(crate) ticks: AtomicU64,
    pub(crate) overruns: AtomicU64,
    pub(crate) mode: AtomicU64,
    pub(crate) last_jitter_ns: AtomicU64,
    /// The largest jitter since the status line last took it (it resets it to 0).
    pub(crate) interval_max_jitter_ns: AtomicU64,
    pub(crate) max_jitter_ns: AtomicU64,
    pub(crate) last_latency_us: AtomicU64,
    pub(crate) chunks_received: AtomicU64,
    pub(crate) chunks_rejected: AtomicU64,
    pub(crate) safety_events: AtomicU64,
    /// `Waiting::code` of what the arm waits for.
    pub(crate) waiting: AtomicU64,
    /// Input messages the transport refused, and those whose decoder panicked (ROS).
    pub(crate) inputs_rejected: AtomicU64,
    pub(crate) input_decoder_faults: AtomicU64,
    /// Others on pi0d's names (ROS): publishers on its command topics, nodes with its name.
    pub(crate) others_command_publishers: AtomicU64,
    pub(crate) others_namesakes: AtomicU64,
    /// A remote policy's link (all zero without one): 1 when there is one, whether it is
    /// connected, round trip p50 / p99 and the server's inference time (µs), reconnects and
    /// failed requests. Copied from the worker's statistics once a second.
    pub(crate) remote_active: AtomicU64,
    pub(crate) remote_connected: AtomicU64,
    pub(crate) remote_rtt_p50_us: AtomicU64,
    pub(crate) remote_rtt_p99_us: AtomicU64,
    pub(crate) remote_server_infer_us: AtomicU64,
    pub(crate) remote_reconnects: AtomicU64,
    pub(crate) remote_errors: AtomicU64,
    /// 1 while the fault latch holds the arm (the previous run faulted; a reset lifts it).
    pub(crate) fault_latched: AtomicU64,
    /// 1 once the independent monitor refused a command (the daemon then stops).
    pub(crate) limit_violation: AtomicU64,
    /// The latest inference's stages, µs (copied from the worker once a second).
    pub(crate) stage_queue_us: AtomicU64,
    pub(crate) stage_preprocess_us: AtomicU64,
    pub(crate) stage_prefix_us: AtomicU64,
    pub(crate) stage_steps_us: AtomicU64,
    pub(crate) stage_postprocess_us: AtomicU64,
}

impl LiveStats {
    pub(crate) fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    pub(crate) fn set(counter: &AtomicU64, v: u64) {
        counter.store(v, Ordering::Relaxed);
    }

    pub(crate) fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }
}

/// Name of a `LiveStats::mode` code.
pub(crate) fn mode_name(code: u64) -> &'static str {
    ModeKind::from_code(code).map_or("?", ModeKind::name)
}

/// The `LiveStats::mode` code of a mode.
pub(crate) fn mode_code(mode: Mode) -> u64 {
    mode.kind().code()
}

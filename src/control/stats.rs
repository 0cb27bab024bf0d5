//! Allocation-free statistics for the control thread: a fixed-bucket histogram and live counters
//! that other threads read without locks.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::safety::{Mode, ModeKind};

/// Linear histogram with `bucket_ns` resolution up to `buckets * bucket_ns`; larger samples fall
/// into an overflow count but still update `max`. Allocates only in `new`.
#[derive(Clone, Debug)]
pub struct Histogram {
    bucket_ns: u64,
    counts: Vec<u32>,
    overflow: u64,
    count: u64,
    max_ns: u64,
}

impl Histogram {
    pub fn new(bucket_ns: u64, buckets: usize) -> Histogram {
        Histogram {
            bucket_ns,
            counts: vec![0; buckets],
            overflow: 0,
            count: 0,
            max_ns: 0,
        }
    }

    pub fn record(&mut self, ns: u64) {
        let i = (ns / self.bucket_ns) as usize;
        match self.counts.get_mut(i) {
            Some(c) => *c = c.saturating_add(1),
            None => self.overflow += 1,
        }
        self.count += 1;
        self.max_ns = self.max_ns.max(ns);
    }

    pub fn count(&self) -> u64 {
        self.count
    }

    pub fn max_ns(&self) -> u64 {
        self.max_ns
    }

    /// Upper edge of the bucket holding quantile `q` (0..=1); 0 when empty.
    pub fn quantile_ns(&self, q: f64) -> u64 {
        if self.count == 0 {
            return 0;
        }
        let rank = ((q * self.count as f64).ceil() as u64).clamp(1, self.count);
        let mut seen = 0u64;
        for (i, &c) in self.counts.iter().enumerate() {
            seen += c as u64;
            if seen >= rank {
                return ((i as u64 + 1) * self.bucket_ns).min(self.max_ns);
            }
        }
        self.max_ns
    }

    pub fn clear(&mut self) {
        self.counts.iter_mut().for_each(|c| *c = 0);
        self.overflow = 0;
        self.count = 0;
        self.max_ns = 0;
    }
}

/// Counters published by the control thread for the status line and diagnostics.
#[derive(Default)]
pub struct LiveStats {
    pub ticks: AtomicU64,
    pub overruns: AtomicU64,
    pub mode: AtomicU64,
    pub last_jitter_ns: AtomicU64,
    /// The largest jitter since the status line last took it (it resets it to 0).
    pub interval_max_jitter_ns: AtomicU64,
    pub max_jitter_ns: AtomicU64,
    pub last_latency_us: AtomicU64,
    pub chunks_received: AtomicU64,
    pub chunks_rejected: AtomicU64,
    pub safety_events: AtomicU64,
    /// `Waiting::code` of what the arm waits for.
    pub waiting: AtomicU64,
    /// Input messages the transport refused, and those whose decoder panicked (ROS).
    pub inputs_rejected: AtomicU64,
    pub input_decoder_faults: AtomicU64,
    /// A remote policy's link (all zero without one): 1 when there is one, whether it is
    /// connected, round trip p50 / p99 and the server's inference time (µs), reconnects and
    /// failed requests. Copied from the worker's statistics once a second.
    pub remote_active: AtomicU64,
    pub remote_connected: AtomicU64,
    pub remote_rtt_p50_us: AtomicU64,
    pub remote_rtt_p99_us: AtomicU64,
    pub remote_server_infer_us: AtomicU64,
    pub remote_reconnects: AtomicU64,
    pub remote_errors: AtomicU64,
    /// 1 while the fault latch holds the arm (the previous run faulted; a reset lifts it).
    pub fault_latched: AtomicU64,
    /// 1 once the independent monitor refused a command (the daemon then stops).
    pub limit_violation: AtomicU64,
    /// The latest inference's stages, µs (copied from the worker once a second).
    pub stage_queue_us: AtomicU64,
    pub stage_preprocess_us: AtomicU64,
    pub stage_prefix_us: AtomicU64,
    pub stage_steps_us: AtomicU64,
    pub stage_postprocess_us: AtomicU64,
}

impl LiveStats {
    pub fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    pub fn set(counter: &AtomicU64, v: u64) {
        counter.store(v, Ordering::Relaxed);
    }

    pub fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }
}

/// Name of a `LiveStats::mode` code.
pub fn mode_name(code: u64) -> &'static str {
    ModeKind::from_code(code).map_or("?", ModeKind::name)
}

/// The `LiveStats::mode` code of a mode.
pub fn mode_code(mode: Mode) -> u64 {
    mode.kind().code()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_follow_recorded_samples() {
        let mut h = Histogram::new(1_000, 100);
        for us in 1..=100u64 {
            h.record(us * 1_000 - 500);
        }
        assert_eq!(h.count(), 100);
        assert_eq!(h.quantile_ns(0.5), 50_000);
        assert_eq!(h.quantile_ns(0.99), 99_000);
        assert_eq!(h.max_ns(), 99_500);
        h.record(10_000_000);
        assert_eq!(h.max_ns(), 10_000_000);
        assert_eq!(h.quantile_ns(1.0), 10_000_000);
    }
}

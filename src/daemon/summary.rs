//! The JSON summary written on exit (`pi0d run --summary FILE`).

use std::collections::BTreeMap;

use serde::Serialize;

#[derive(Debug, Default, Serialize)]
pub struct Percentiles {
    pub p50: f64,
    pub p99: f64,
    pub max: f64,
}

#[derive(Debug, Serialize)]
pub struct TransitionRecord {
    pub t_s: f64,
    pub from: String,
    pub to: String,
}

#[derive(Debug, Default, Serialize)]
pub struct Summary {
    pub duration_s: f64,
    pub rate_hz: f64,
    pub ticks: u64,
    pub overruns: u64,
    pub jitter_us: Percentiles,
    pub chunks_received: u64,
    pub chunks_accepted: u64,
    pub chunks_rejected: u64,
    pub chunks_rejected_by_reason: BTreeMap<String, u64>,
    pub inference_requests: u64,
    /// Observation-to-arrival latency of executed chunks, warm-up excluded.
    pub latency_ms: Percentiles,
    pub safety_events: BTreeMap<String, u64>,
    pub limit_violations: u64,
    pub max_abs_velocity: BTreeMap<String, f64>,
    pub max_abs_acceleration: BTreeMap<String, f64>,
    pub max_abs_jerk: BTreeMap<String, f64>,
    pub reset_refused: u64,
    pub final_mode: String,
    pub transitions: Vec<TransitionRecord>,
    pub exit: String,
}

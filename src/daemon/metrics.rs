//! The Prometheus endpoint (`[metrics]`): `GET /metrics` in the OpenMetrics text format
//! (prometheus-client's encoder; Prometheus scrapes it as such). Counters and gauges are read at each scrape from what the
//! daemon already keeps (the live statistics, the blackboard's input stamps, the worker's
//! stages); the observation-to-chunk latency is a histogram the supervisor fills as chunks are
//! accepted. A plain thread serves it; a failed scrape costs that scrape only.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use super::worker::WorkerStats;
use crate::io::Blackboard;
use crate::safety::ModeKind;
use crate::telemetry::LiveStats;
use crate::time::MonoTime;

/// What a scrape reads.
struct Live {
    live: Arc<LiveStats>,
    worker: Arc<WorkerStats>,
    board: Arc<Blackboard>,
}

impl std::fmt::Debug for Live {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("pi0d live statistics")
    }
}

fn counter(e: &mut DescriptorEncoder, name: &str, help: &str, v: u64) -> std::fmt::Result {
    let c = ConstCounter::new(v);
    c.encode(e.encode_descriptor(name, help, None, c.metric_type())?)
}

fn gauge(e: &mut DescriptorEncoder, name: &str, help: &str, v: f64) -> std::fmt::Result {
    let g = ConstGauge::new(v);
    g.encode(e.encode_descriptor(name, help, None, g.metric_type())?)
}

impl Collector for Live {
    fn encode(&self, mut e: DescriptorEncoder) -> std::fmt::Result {
        let l = &self.live;
        let get = LiveStats::get;
        counter(
            &mut e,
            "pi0d_control_ticks",
            "Control loop ticks.",
            get(&l.ticks),
        )?;
        counter(
            &mut e,
            "pi0d_control_overruns",
            "Control ticks past their deadline.",
            get(&l.overruns),
        )?;
        gauge(
            &mut e,
            "pi0d_control_jitter_max_seconds",
            "Largest tick jitter of the run.",
            get(&l.max_jitter_ns) as f64 / 1e9,
        )?;
        let mode = ModeKind::from_code(get(&l.mode));
        for m in ModeKind::ALL {
            gauge(
                &mut e,
                &format!("pi0d_mode_{}", m.name()),
                &format!("1 while the arm is {}.", m.name()),
                f64::from(u8::from(mode == Some(m))),
            )?;
        }
        counter(
            &mut e,
            "pi0d_chunks_received",
            "Chunks the control loop got.",
            get(&l.chunks_received),
        )?;
        counter(
            &mut e,
            "pi0d_chunks_rejected",
            "Chunks refused on arrival.",
            get(&l.chunks_rejected),
        )?;
        counter(
            &mut e,
            "pi0d_safety_events",
            "Safety events (holds, e-stops, clamps).",
            get(&l.safety_events),
        )?;
        counter(
            &mut e,
            "pi0d_inputs_rejected",
            "Input messages refused.",
            get(&l.inputs_rejected),
        )?;
        counter(
            &mut e,
            "pi0d_inference_requests",
            "Inference requests.",
            self.worker.requests.load(Ordering::Relaxed),
        )?;
        counter(
            &mut e,
            "pi0d_policy_errors",
            "Policy errors (no chunk).",
            self.worker.policy_errors.load(Ordering::Relaxed),
        )?;
        gauge(
            &mut e,
            "pi0d_fault_latched",
            "1 while the fault latch holds the arm.",
            get(&l.fault_latched) as f64,
        )?;
        let now = MonoTime::now();
        let js = self.board.inputs.joint_state.load().stamp;
        if js != MonoTime::ZERO {
            gauge(
                &mut e,
                "pi0d_joint_state_age_seconds",
                "Age of the newest joint state (capture stamp).",
                now.seconds_since(js).max(0.0),
            )?;
        }
        for (i, s) in self.board.inputs.camera_stamps.iter().enumerate() {
            let ns = s.load(Ordering::Relaxed);
            if ns > 0 {
                gauge(
                    &mut e,
                    &format!("pi0d_camera{i}_age_seconds"),
                    &format!("Age of camera {i}'s newest frame (capture stamp)."),
                    now.seconds_since(MonoTime::from_nanos(ns)).max(0.0),
                )?;
            }
        }
        if let Some((queue, t)) = self.worker.stages.lock().ok().and_then(|s| s.last) {
            for (stage, ms) in [
                ("queue", queue),
                ("preprocess", t.preprocess_ms),
                ("prefix", t.prefix_ms),
                ("steps", t.steps_ms),
                ("postprocess", t.postprocess_ms),
            ] {
                gauge(
                    &mut e,
                    &format!("pi0d_inference_{stage}_seconds"),
                    &format!("The latest inference's {stage} time."),
                    ms / 1e3,
                )?;
            }
        }
        Ok(())
    }
}

pub(crate) struct Metrics {
    registry: Registry,
    /// Observation to chunk arrival, per accepted chunk.
    pub(crate) chunk_latency: Histogram,
}

impl Metrics {
    pub(crate) fn new(
        live: Arc<LiveStats>,
        worker: Arc<WorkerStats>,
        board: Arc<Blackboard>,
    ) -> Metrics {
        let mut registry = Registry::default();
        // 5 ms to about 10 s.
        let chunk_latency = Histogram::new(exponential_buckets(0.005, 2.0, 12));
        registry.register(
            "pi0d_chunk_latency_seconds",
            "Observation capture to chunk arrival at the control loop.",
            chunk_latency.clone(),
        );
        registry.register_collector(Box::new(Live {
            live,
            worker,
            board,
        }));
        Metrics {
            registry,
            chunk_latency,
        }
    }

    pub(crate) fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

/// Serves `metrics` on `listen` until `stop`.
pub(crate) fn serve(
    listen: SocketAddr,
    metrics: Arc<Metrics>,
    stop: Arc<AtomicBool>,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    let listener = TcpListener::bind(listen)?;
    listener.set_nonblocking(true)?;
    tracing::info!(%listen, "metrics on http://{listen}/metrics");
    std::thread::Builder::new()
        .name("pi0d-metrics".into())
        .spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((stream, _)) => {
                        let m = &metrics;
                        // A panicking scrape is that scrape's loss only.
                        if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                            answer(stream, m)
                        }))
                        .is_err()
                        {
                            tracing::warn!("a metrics scrape failed");
                        }
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        std::thread::sleep(Duration::from_millis(20))
                    }
                    Err(e) => {
                        tracing::debug!(error = %e, "metrics accept");
                        std::thread::sleep(Duration::from_millis(20));
                    }
                }
            }
        })
}

fn answer(mut stream: TcpStream, metrics: &Metrics) {
    let _ = stream.set_nonblocking(false);
    let _ = stream.set_read_timeout(Some(Duration::from_secs(1)));
    let _ = stream.set_write_timeout(Some(Duration::from_secs(1)));
    let mut head = [0u8; 2048];
    let n = stream.read(&mut head).unwrap_or(0);
    let line = String::from_utf8_lossy(&head[..n]);
    let ok = line.starts_with("GET /metrics ") || line.starts_with("GET /metrics?");
    let (status, kind, body) = if ok {
        // prometheus-client writes OpenMetrics (`_total` samples, `# EOF`).
        (
            "200 OK",
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
            metrics.encode(),
        )
    } else {
        (
            "404 Not Found",
            "text/plain",
            "only GET /metrics\n".to_string(),
        )
    };
    let _ = write!(
        stream,
        "HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
}

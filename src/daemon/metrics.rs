//! The Prometheus endpoint (`[metrics]`): `GET /metrics` in the OpenMetrics text format
//! (prometheus-client's encoder; Prometheus scrapes it as such). Counters and gauges are read at each scrape from what the
//! daemon already keeps (the live statistics, the blackboard's input stamps, the worker's
//! stages); the observation-to-chunk latency is a histogram the supervisor fills as chunks are
//! accepted. One thread serves it on a single-threaded tokio runtime: every connection is
//! served at once, each within its own deadline, at most [`MAX_CONNECTIONS`] held (a newcomer
//! beyond them closes the longest-held one still waiting for its request), so idle or slow
//! connections never delay a scrape. A failed scrape costs that scrape only.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use super::worker::WorkerStats;
use crate::io::Blackboard;
use crate::remote::admission::{Budget, Room, Slot};
use crate::remote::head::read_head;
use crate::safety::ModeKind;
use crate::telemetry::LiveStats;
use crate::time::MonoTime;

/// Connections held at once; a newcomer beyond them closes the longest-held idle one.
pub(crate) const MAX_CONNECTIONS: usize = 32;
/// Each connection's time to send its request and take the answer (Prometheus's own scrape
/// timeout is 10 s by default).
pub(crate) const DEADLINE: Duration = Duration::from_secs(5);
/// Bytes of a request's head read at most (a scrape's is a few hundred).
const HEAD_BYTES: usize = 4096;
/// How often the server looks at the stop flag.
const STOP_POLL: Duration = Duration::from_millis(50);

/// What the endpoint itself counts.
#[derive(Default)]
struct Served {
    /// Connections closed unanswered: evicted for a newcomer, or past their deadline.
    refused: AtomicU64,
}

/// What a scrape reads.
struct Live {
    live: Arc<LiveStats>,
    worker: Arc<WorkerStats>,
    board: Arc<Blackboard>,
    served: Arc<Served>,
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
            "pi0d_log_lines_suppressed",
            "Log lines held back by a rate limit (floods of peers' messages).",
            crate::telemetry::log_lines_suppressed(),
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
        counter(
            &mut e,
            "pi0d_metrics_connections_refused",
            "Connections to this endpoint closed unanswered: the longest-held idle one when a newcomer found every place held, or one past its deadline.",
            self.served.refused.load(Ordering::Relaxed),
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
    served: Arc<Served>,
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
        let served = Arc::new(Served::default());
        registry.register_collector(Box::new(Live {
            live,
            worker,
            board,
            served: served.clone(),
        }));
        Metrics {
            registry,
            served,
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
    let listener = std::net::TcpListener::bind(listen)?;
    tracing::info!(%listen, "metrics on http://{listen}/metrics");
    serve_on(listener, metrics, stop, DEADLINE)
}

/// As [`serve`], on a bound listener.
fn serve_on(
    listener: std::net::TcpListener,
    metrics: Arc<Metrics>,
    stop: Arc<AtomicBool>,
    deadline: Duration,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    listener.set_nonblocking(true)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .build()?;
    // Registered with this runtime's reactor here, so that a failure is the caller's error.
    let listener = {
        let _entered = rt.enter();
        tokio::net::TcpListener::from_std(listener)?
    };
    std::thread::Builder::new()
        .name("pi0d-metrics".into())
        .spawn(move || {
            rt.block_on(accept_loop(listener, metrics, stop, deadline));
            // Connections still open end with the runtime.
            rt.shutdown_background();
        })
}

async fn accept_loop(
    listener: tokio::net::TcpListener,
    metrics: Arc<Metrics>,
    stop: Arc<AtomicBool>,
    deadline: Duration,
) {
    let budget = Budget::new(MAX_CONNECTIONS);
    let mut poll = tokio::time::interval(STOP_POLL);
    poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    while !stop.load(Ordering::Relaxed) {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => match budget.admit(Instant::now()) {
                    Ok((slot, room)) => {
                        if room == Room::Evicted {
                            metrics.served.refused.fetch_add(1, Ordering::Relaxed);
                        }
                        tokio::spawn(connection(stream, slot, metrics.clone(), deadline));
                    }
                    // Every place is mid-answer (each ends within its deadline): this one waits
                    // for none of them.
                    Err(_) => {
                        metrics.served.refused.fetch_add(1, Ordering::Relaxed);
                    }
                },
                // Out of descriptors and the like: the scrapes already connected go on.
                Err(e) => {
                    tracing::debug!(error = %e, "metrics accept");
                    tokio::time::sleep(STOP_POLL).await;
                }
            },
            _ = poll.tick() => {}
        }
    }
}

/// One connection: its request read, answered and closed within `deadline`, or closed
/// unanswered when a newcomer takes its place first (counted as it is evicted).
async fn connection(mut stream: TcpStream, slot: Slot, metrics: Arc<Metrics>, deadline: Duration) {
    tokio::select! {
        done = tokio::time::timeout(deadline, exchange(&mut stream, &slot, &metrics)) => {
            if done.is_err() {
                metrics.served.refused.fetch_add(1, Ordering::Relaxed);
            }
        }
        () = slot.evicted() => {}
    }
}

async fn exchange(stream: &mut TcpStream, slot: &Slot, metrics: &Metrics) {
    // However the head ended (its blank line, the peer closing, the cap): what came is
    // answered; nothing came, or the connection broke, is not.
    let head = match read_head(stream, HEAD_BYTES).await {
        Ok(head) => head.bytes(),
        Err(_) => return,
    };
    if head.is_empty() {
        return;
    }
    // Answering now: no newcomer takes this place.
    if !slot.begin() {
        return;
    }
    let reply = answer(&head, metrics);
    let _ = stream.write_all(reply.as_bytes()).await;
    let _ = stream.shutdown().await;
}

/// The whole HTTP answer to a request whose head is `head`.
fn answer(head: &[u8], metrics: &Metrics) -> String {
    let ok = head.starts_with(b"GET /metrics ") || head.starts_with(b"GET /metrics?");
    // A panicking encoder is this scrape's loss only.
    let body = ok
        .then(|| std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| metrics.encode())).ok());
    let (status, kind, body) = match body {
        // prometheus-client writes OpenMetrics (`_total` samples, `# EOF`).
        Some(Some(body)) => (
            "200 OK",
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
            body,
        ),
        Some(None) => {
            tracing::warn!("a metrics scrape failed");
            (
                "500 Internal Server Error",
                "text/plain",
                "the metrics could not be encoded\n".to_string(),
            )
        }
        None => (
            "404 Not Found",
            "text/plain",
            "only GET /metrics\n".to_string(),
        ),
    };
    format!(
        "HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
}

#[cfg(test)]
#[path = "metrics_tests.rs"]
mod tests;

//! `pi0d serve`: pi0 behind openpi's websocket policy protocol, so any openpi client (the
//! `openpi-client` package, openpi's robot runtimes) drives a robot from it unchanged: the
//! metadata frame on connect, msgpack-numpy observations in, `actions` with `server_timing`
//! and `policy_timing` out, errors as a text frame then close code 1011, `GET /healthz`.
//! Stricter than openpi's own server: the API key is checked when one is set, frames and
//! arrays are capped, a bad request costs only its own connection, and the inference queue is
//! bounded (a full one answers "busy").

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use rand::SeedableRng;
use rand_distr::{Distribution, StandardNormal};
use tokio::io::AsyncReadExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio_tungstenite::tungstenite::handshake::server::{ErrorResponse, Request, Response};
use tokio_tungstenite::tungstenite::http::StatusCode;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, WebSocketConfig};
use tokio_tungstenite::tungstenite::Message;

use super::request::{Layout, Request as Observation};
use crate::io::msgpack_numpy::{self, NdArray, Out};
use crate::policy::pi0::pipeline::{error_chain, Pi0Pipeline};
use crate::policy::CameraFrame;

/// Connections served at once; more are closed on arrival.
pub const MAX_CONNECTIONS: usize = 64;
/// A client must finish its HTTP request (or websocket handshake) within this.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest HTTP request head read to tell a health check from an upgrade.
const MAX_HEAD: usize = 8192;

#[derive(Clone, Debug)]
pub struct ServeOptions {
    pub listen: SocketAddr,
    /// Clients must send `Authorization: Api-Key <key>` (openpi-client's header).
    pub api_key: Option<String>,
    /// Largest request frame.
    pub max_request_bytes: usize,
    /// Requests waiting for the model at most; one more is answered "busy".
    pub queue: usize,
    /// Seed of the noise for requests that bring none.
    pub seed: u64,
    /// Requests run as one batch at most (1: one at a time).
    pub max_batch: usize,
    /// How long the first request of a batch waits for others.
    pub batch_window: Duration,
    /// Also answer Zenoh queries on this key (feature `zenoh`).
    pub zenoh: Option<crate::config::openpi::ZenohLinkOptions>,
    /// How requests that bring a `prev_actions` leftover are guided (real-time chunking).
    pub rtc: crate::config::RtcSettings,
}

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("async runtime: {0}")]
    Runtime(std::io::Error),
    #[error("Zenoh: {0}")]
    Zenoh(String),
}

/// What the inference thread answers.
struct Inferred {
    actions: Vec<Vec<f32>>,
    infer_ms: f64,
    prefix_ms: f64,
    steps_ms: f64,
    /// Requests run together with this one (itself included).
    batch: usize,
}

struct Job {
    obs: Observation,
    reply: oneshot::Sender<Result<Inferred, String>>,
}

struct Shared {
    jobs: mpsc::SyncSender<Job>,
    layout: Layout,
    metadata: Vec<u8>,
    api_key: Option<String>,
    max_request_bytes: usize,
    queue: usize,
    connections: AtomicUsize,
}

/// The metadata frame: what the model takes and returns, for clients to check.
pub fn metadata(p: &Pi0Pipeline, layout: &Layout) -> Out {
    let text = |s: &str| Out::Text(s.to_string());
    let list = |v: &[String]| Out::List(v.iter().map(|s| Out::Text(s.clone())).collect());
    Out::Map(vec![
        ("server".into(), text("pi0d")),
        ("version".into(), text(env!("CARGO_PKG_VERSION"))),
        (
            "policy".into(),
            text(match p.arch.variant {
                crate::policy::pi0::Variant::Pi05 => "pi05",
                _ => "pi0",
            }),
        ),
        ("action_horizon".into(), Out::Int(p.arch.chunk as i64)),
        ("action_dim".into(), Out::Int(p.action_dim as i64)),
        ("state_dim".into(), Out::Int(p.state_dim as i64)),
        ("image_keys".into(), list(&layout.image_keys)),
        ("state_key".into(), text(&layout.state_key)),
        ("prompt_key".into(), text(&layout.prompt_key)),
        // Requests may bring `prev_actions` (real-time chunking).
        ("real_time_chunking".into(), Out::Bool(true)),
    ])
}

/// Serves until SIGINT or SIGTERM.
pub fn serve(pipeline: Pi0Pipeline, layout: Layout, opts: ServeOptions) -> Result<(), ServeError> {
    let metadata = msgpack_numpy::encode(&metadata(&pipeline, &layout));
    let (jobs, queue) = mpsc::sync_channel(opts.queue.max(1));
    let (seed, max_batch, window) = (opts.seed, opts.max_batch.max(1), opts.batch_window);
    let rtc = opts.rtc;
    let worker = std::thread::Builder::new()
        .name("pi0d-serve-infer".into())
        .spawn(move || infer_loop(pipeline, queue, seed, max_batch, window, rtc))
        .map_err(ServeError::Runtime)?;
    let shared = Arc::new(Shared {
        jobs,
        layout,
        metadata,
        api_key: opts.api_key.clone(),
        max_request_bytes: opts.max_request_bytes,
        queue: opts.queue,
        connections: AtomicUsize::new(0),
    });
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("pi0d-serve-io")
        .enable_all()
        .build()
        .map_err(ServeError::Runtime)?;
    let outcome = rt.block_on(accept_loop(opts.listen, opts.zenoh.clone(), shared));
    rt.shutdown_timeout(Duration::from_secs(1));
    // The queue's sender is gone with the runtime's tasks: the worker ends after its job.
    drop(worker);
    outcome
}

async fn accept_loop(
    addr: SocketAddr,
    zenoh: Option<crate::config::openpi::ZenohLinkOptions>,
    shared: Arc<Shared>,
) -> Result<(), ServeError> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|source| ServeError::Bind { addr, source })?;
    // Kept open while serving; dropped (undeclared) on the way out.
    let _queryable: Option<Box<dyn std::any::Any + Send>> = match zenoh {
        None => None,
        #[cfg(feature = "zenoh")]
        Some(z) => Some(Box::new(zenoh_queryable(&z, shared.clone()).await?)),
        #[cfg(not(feature = "zenoh"))]
        Some(_) => {
            return Err(ServeError::Zenoh(
                "serving over Zenoh needs pi0d built with the `zenoh` feature".into(),
            ))
        }
    };
    let local = listener.local_addr().unwrap_or(addr);
    tracing::info!(%local, "serving openpi's websocket protocol (GET /healthz for health)");
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(ServeError::Runtime)?;
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    let shared = shared.clone();
                    tokio::spawn(async move { connection(stream, peer, shared).await });
                }
                // Out of descriptors and the like: keep serving those connected.
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            _ = tokio::signal::ctrl_c() => break,
            _ = term.recv() => break,
        }
    }
    tracing::info!("stopping");
    Ok(())
}

/// Answers Zenoh queries on the key with the same frames as the websocket: each query's
/// payload a request, its reply the reply (or an error reply with the message). Complete, so
/// a querier's best-matching target picks one server of several on the same key.
#[cfg(feature = "zenoh")]
async fn zenoh_queryable(
    z: &crate::config::openpi::ZenohLinkOptions,
    shared: Arc<Shared>,
) -> Result<(zenoh::Session, tokio::task::JoinHandle<()>), ServeError> {
    let config =
        crate::policy::openpi_zenoh::config(&z.connect, &z.listen).map_err(ServeError::Zenoh)?;
    let session = zenoh::open(config)
        .await
        .map_err(|e| ServeError::Zenoh(e.to_string()))?;
    let queryable = session
        .declare_queryable(z.key.as_str())
        .complete(true)
        .await
        .map_err(|e| ServeError::Zenoh(e.to_string()))?;
    tracing::info!(key = %z.key, zid = %session.zid(), "answering Zenoh queries");
    let task = tokio::spawn(async move {
        while let Ok(query) = queryable.recv_async().await {
            let sh = shared.clone();
            tokio::spawn(async move {
                let bytes = query
                    .payload()
                    .map(|p| p.to_bytes().into_owned())
                    .unwrap_or_default();
                let sent = match infer(&sh, &bytes, None).await {
                    Ok(reply) => {
                        tracing::debug!("Zenoh query answered");
                        query.reply(query.key_expr().clone(), reply).await
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "Zenoh request refused");
                        query.reply_err(e).await
                    }
                };
                if let Err(e) = sent {
                    tracing::debug!(error = %e, "Zenoh reply not sent");
                }
            });
        }
    });
    Ok((session, task))
}

/// Counts a connection while it lives.
struct Slot<'a>(&'a AtomicUsize);

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

async fn connection(mut stream: TcpStream, peer: SocketAddr, sh: Arc<Shared>) {
    let _slot = Slot(&sh.connections);
    if sh.connections.fetch_add(1, Ordering::Relaxed) >= MAX_CONNECTIONS {
        tracing::warn!(%peer, "refused: {MAX_CONNECTIONS} connections already");
        return;
    }
    match tokio::time::timeout(HANDSHAKE_TIMEOUT, health_check(&mut stream)).await {
        Ok(Ok(true)) => return,
        Ok(Ok(false)) => {}
        Ok(Err(e)) => {
            tracing::debug!(%peer, error = %e, "connection lost before its request");
            return;
        }
        Err(_) => {
            tracing::warn!(%peer, "no complete request within {HANDSHAKE_TIMEOUT:?}: closed");
            return;
        }
    }
    let key = sh.api_key.clone();
    // tungstenite's callback signature: its error is the HTTP response sent back.
    #[allow(clippy::result_large_err)]
    let check = move |req: &Request, resp: Response| -> Result<Response, ErrorResponse> {
        let Some(key) = &key else { return Ok(resp) };
        let given = req
            .headers()
            .get("authorization")
            .and_then(|v| v.to_str().ok());
        if given.is_some_and(|g| same(g, &format!("Api-Key {key}"))) {
            return Ok(resp);
        }
        let mut e = ErrorResponse::new(Some("missing or wrong API key\n".into()));
        *e.status_mut() = StatusCode::UNAUTHORIZED;
        Err(e)
    };
    let config = WebSocketConfig {
        max_message_size: Some(sh.max_request_bytes),
        max_frame_size: Some(sh.max_request_bytes),
        ..Default::default()
    };
    let upgraded = tokio::time::timeout(
        HANDSHAKE_TIMEOUT,
        tokio_tungstenite::accept_hdr_async_with_config(stream, check, Some(config)),
    )
    .await;
    let ws = match upgraded {
        Ok(Ok(ws)) => ws,
        Ok(Err(e)) => {
            tracing::warn!(%peer, error = %e, "websocket handshake refused");
            return;
        }
        Err(_) => {
            tracing::warn!(%peer, "websocket handshake took over {HANDSHAKE_TIMEOUT:?}: closed");
            return;
        }
    };
    tracing::info!(%peer, "client connected");
    if let Err(e) = session(ws, &sh).await {
        tracing::info!(%peer, reason = %e, "client gone");
    } else {
        tracing::info!(%peer, "client closed");
    }
}

/// Compares without stopping at the first difference (the key's length aside).
fn same(a: &str, b: &str) -> bool {
    a.len() == b.len() && a.bytes().zip(b.bytes()).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0
}

/// Answers `GET /healthz` (a plain HTTP request, no upgrade) with 200 "OK"; says whether it did.
async fn health_check(stream: &mut TcpStream) -> std::io::Result<bool> {
    let mut buf = vec![0u8; MAX_HEAD];
    let n = loop {
        let n = stream.peek(&mut buf).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        if n == MAX_HEAD || buf[..n].windows(4).any(|w| w == b"\r\n\r\n") {
            break n;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    let head = String::from_utf8_lossy(&buf[..n]).to_ascii_lowercase();
    let health = head.starts_with("get /healthz ") && !head.contains("\nupgrade:");
    if health {
        use tokio::io::AsyncWriteExt;
        let end = head.find("\r\n\r\n").map_or(n, |i| i + 4);
        stream.read_exact(&mut buf[..end]).await?;
        stream
            .write_all(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 3\r\nConnection: close\r\n\r\nOK\n")
            .await?;
        stream.shutdown().await?;
    }
    Ok(health)
}

type Ws = tokio_tungstenite::WebSocketStream<TcpStream>;

/// One client: metadata first, then a reply per request until it closes or a request fails.
async fn session(ws: Ws, sh: &Shared) -> Result<(), String> {
    let (mut tx, mut rx) = ws.split();
    tx.send(Message::Binary(sh.metadata.clone()))
        .await
        .map_err(|e| e.to_string())?;
    let mut prev_total_ms: Option<f64> = None;
    while let Some(msg) = rx.next().await {
        let start = Instant::now();
        let outcome = match msg {
            Ok(Message::Binary(b)) => infer(sh, &b, prev_total_ms).await,
            Ok(Message::Text(_)) => Err("expected a binary msgpack frame, found text".into()),
            Ok(Message::Close(_)) => return Ok(()),
            Ok(_) => continue,
            // Over the size cap, or not websocket: the client is told if it still listens.
            Err(e) => Err(format!("bad frame: {e}")),
        };
        match outcome {
            Ok(reply) => tx
                .send(Message::Binary(reply))
                .await
                .map_err(|e| e.to_string())?,
            Err(e) => {
                tracing::warn!(error = %e, "request refused");
                let _ = tx.send(Message::Text(e.clone())).await;
                let _ = tx
                    .send(Message::Close(Some(CloseFrame {
                        code: CloseCode::Error,
                        reason: "Internal server error. Traceback included in previous frame."
                            .into(),
                    })))
                    .await;
                return Err(e);
            }
        }
        prev_total_ms = Some(start.elapsed().as_secs_f64() * 1e3);
    }
    Ok(())
}

/// Decodes, queues and answers one request.
async fn infer(sh: &Shared, bytes: &[u8], prev_total_ms: Option<f64>) -> Result<Vec<u8>, String> {
    let items = msgpack_numpy::decode_request(bytes).map_err(|e| e.to_string())?;
    let obs = sh.layout.parse(items).map_err(|e| e.to_string())?;
    let (reply, answer) = oneshot::channel();
    match sh.jobs.try_send(Job { obs, reply }) {
        Ok(()) => {}
        Err(mpsc::TrySendError::Full(_)) => {
            return Err(format!(
                "busy: {} requests are already waiting for the model; try again",
                sh.queue
            ))
        }
        Err(mpsc::TrySendError::Disconnected(_)) => return Err("the model stopped".into()),
    }
    let r = answer
        .await
        .map_err(|_| "the model stopped".to_string())??;
    let (h, d) = (r.actions.len(), r.actions.first().map_or(0, Vec::len));
    let flat: Vec<f32> = r.actions.into_iter().flatten().collect();
    let mut server_timing = vec![("infer_ms".to_string(), Out::Number(r.infer_ms))];
    if let Some(p) = prev_total_ms {
        server_timing.push(("prev_total_ms".into(), Out::Number(p)));
    }
    Ok(msgpack_numpy::encode(&Out::Map(vec![
        (
            "actions".into(),
            Out::Array(NdArray::f32(vec![h, d], &flat)),
        ),
        ("server_timing".into(), Out::Map(server_timing)),
        (
            "policy_timing".into(),
            Out::Map(vec![
                ("infer_ms".into(), Out::Number(r.infer_ms)),
                ("prefix_ms".into(), Out::Number(r.prefix_ms)),
                ("steps_ms".into(), Out::Number(r.steps_ms)),
                ("batch".into(), Out::Int(r.batch as i64)),
            ]),
        ),
    ])))
}

/// The model's thread: requests in arrival order; those waiting when the model is free (and,
/// with a `window`, those arriving within it), up to `max_batch`, run as one batch; each gets
/// its own answer.
fn infer_loop(
    mut pipeline: Pi0Pipeline,
    jobs: mpsc::Receiver<Job>,
    seed: u64,
    max_batch: usize,
    window: Duration,
    rtc: crate::config::RtcSettings,
) {
    use crate::policy::pi0::pipeline::BatchItem;
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let n = pipeline.arch.chunk * pipeline.arch.action_dim;
    while let Ok(first) = jobs.recv() {
        // Those already waiting join at once (requests queue up while the model runs); with
        // a window, the first waits that long for more.
        let mut batch = vec![first];
        let until = Instant::now() + window;
        while batch.len() < max_batch {
            let next = if window.is_zero() {
                jobs.try_recv().ok()
            } else {
                jobs.recv_timeout(until.saturating_duration_since(Instant::now()))
                    .ok()
            };
            match next {
                Some(j) => batch.push(j),
                None => break,
            }
        }
        // A leftover the model cannot be guided with fails that request alone.
        let mut kept = Vec::with_capacity(batch.len());
        let mut guidance = Vec::with_capacity(batch.len());
        for j in batch {
            match j
                .obs
                .rtc
                .as_ref()
                .map(|p| pipeline.guidance(rtc, p))
                .transpose()
            {
                Ok(g) => {
                    kept.push(j);
                    guidance.push(g);
                }
                Err(e) => {
                    let _ = j
                        .reply
                        .send(Err(format!("`prev_actions`: {}", error_chain(&e))));
                }
            }
        }
        let mut batch = kept;
        if batch.is_empty() {
            continue;
        }
        let noises: Vec<Vec<f32>> = batch
            .iter_mut()
            .map(|j| {
                j.obs
                    .noise
                    .take()
                    .unwrap_or_else(|| (0..n).map(|_| StandardNormal.sample(&mut rng)).collect())
            })
            .collect();
        let refs: Vec<Vec<Option<&CameraFrame>>> = batch
            .iter()
            .map(|j| j.obs.frames.iter().map(Option::as_ref).collect())
            .collect();
        let items: Vec<BatchItem> = batch
            .iter()
            .zip(&refs)
            .zip(&noises)
            .zip(&guidance)
            .map(|(((j, frames), noise), guidance)| BatchItem {
                frames,
                state: &j.obs.state,
                task: &j.obs.prompt,
                noise,
                guidance: guidance.as_ref(),
            })
            .collect();
        let start = Instant::now();
        // A panic in the model answers these requests and leaves the server up.
        let results =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| pipeline.run_batch(&items)));
        let infer_ms = start.elapsed().as_secs_f64() * 1e3;
        drop(items);
        let size = batch.len();
        match results {
            Ok(results) => {
                for (job, r) in batch.into_iter().zip(results) {
                    let answer = r
                        .map(|(actions, t)| Inferred {
                            actions,
                            infer_ms,
                            prefix_ms: t.prefix_ms,
                            steps_ms: t.steps_ms,
                            batch: size,
                        })
                        .map_err(|e| error_chain(&e));
                    let _ = job.reply.send(answer);
                }
            }
            Err(_) => {
                for job in batch {
                    let _ = job.reply.send(Err(
                        "the model failed on this request (see the server's log)".into(),
                    ));
                }
            }
        }
    }
}

//! `pi0d serve`: pi0 behind openpi's websocket policy protocol, so any openpi client (the
//! `openpi-client` package, openpi's robot runtimes) drives a robot from it unchanged: the
//! metadata frame on connect, msgpack-numpy observations in, `actions` with `server_timing`
//! and `policy_timing` out, errors as a text frame then close code 1011, `GET /healthz`.
//! Stricter than openpi's own server: the API key is checked when one is set, frames and
//! arrays are capped, a bad request costs only its own connection, and the inference queue is
//! bounded (a full one answers "busy"). No client can silence it: unauthenticated connections
//! and sessions have separate budgets (`admission`), a handshake deadline and an idle timeout;
//! requests are decoded off the I/O thread, a few at a time. SIGINT, SIGTERM, SIGQUIT, SIGXCPU
//! and SIGPWR stop it; the signals that would otherwise kill it are logged and ignored, as in
//! `pi0d run` (`daemon::signals`).

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::stream::SplitSink;
use futures_util::{SinkExt, StreamExt};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{oneshot, Semaphore};
use tokio_tungstenite::tungstenite::error::ProtocolError;
use tokio_tungstenite::tungstenite::handshake::server::{ErrorResponse, Request, Response};
use tokio_tungstenite::tungstenite::http::StatusCode;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, WebSocketConfig};
use tokio_tungstenite::tungstenite::{Error as WsError, Message};

use super::admission::{Budget, Full, Room, Slot, MAX_PENDING, MAX_SESSIONS};
use super::head::{read_head, Head};
use super::refusal::Refusal;
use super::request::{Layout, Request as Observation};
use super::worker::{infer_loop, Job};
use crate::daemon::signals::Signals;
use crate::policy::openpi::msgpack_numpy::{self, NdArray, Out};
use crate::policy::pi0::pipeline::Pi0Pipeline;

/// Requests decoded at once, each on the blocking pool: a request that is slow to decode holds
/// one of them, never the I/O thread.
pub(crate) const DECODERS: usize = 4;
/// Largest HTTP request head read to tell a health check from an upgrade.
const MAX_HEAD: usize = 8192;
/// How often the accept loop looks at the signals.
const SIGNAL_POLL: Duration = Duration::from_millis(50);
/// A close frame (or an error's text) to a client that does not read is given up after this.
const CLOSE_WRITE: Duration = Duration::from_secs(1);

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
    /// A connection must finish its HTTP request or websocket handshake within this of its
    /// arrival.
    pub handshake_timeout: Duration,
    /// A session that sends no request for this long is closed (writes to a client that does
    /// not read are given up after it too).
    pub idle_timeout: Duration,
    /// Also answer Zenoh queries on this key (feature `zenoh`).
    pub zenoh: Option<crate::config::openpi::ZenohLinkOptions>,
    /// How requests that bring a `prev_actions` leftover are guided (real-time chunking).
    pub rtc: crate::config::RtcSettings,
}

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("cannot listen on {addr}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("async runtime")]
    Runtime(#[source] std::io::Error),
    #[error("serving over Zenoh needs pi0d built with the `zenoh` feature")]
    NoZenoh,
    #[cfg(feature = "zenoh")]
    #[error(transparent)]
    ZenohConfig(#[from] crate::zenoh_session::SessionError),
    #[cfg(feature = "zenoh")]
    #[error("Zenoh {what}")]
    Zenoh {
        what: &'static str,
        #[source]
        source: zenoh::Error,
    },
}

struct Shared {
    jobs: mpsc::SyncSender<Job>,
    layout: Layout,
    metadata: Vec<u8>,
    api_key: Option<String>,
    max_request_bytes: usize,
    queue: usize,
    handshake_timeout: Duration,
    idle_timeout: Duration,
    /// Connections that have not finished their handshake.
    pending: Arc<Budget>,
    /// Authenticated websocket sessions.
    sessions: Arc<Budget>,
    decoders: Arc<Semaphore>,
}

/// The metadata frame: what the model takes and returns, for clients to check.
pub(crate) fn metadata(p: &Pi0Pipeline, layout: &Layout) -> Out {
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

/// How long a stop waits for the model's thread to finish its request and release the model.
const WORKER_GRACE: Duration = Duration::from_secs(10);

/// Serves until a stop signal (SIGINT, SIGTERM, SIGQUIT, SIGXCPU, SIGPWR); a second one exits
/// at once with 130 (`daemon::signals`).
pub fn serve(
    pipeline: Pi0Pipeline,
    layout: Layout,
    opts: ServeOptions,
    signals: Signals,
) -> Result<(), ServeError> {
    let metadata = msgpack_numpy::encode(&metadata(&pipeline, &layout));
    let (jobs, queue) = mpsc::sync_channel(opts.queue.max(1));
    let (seed, max_batch, window) = (opts.seed, opts.max_batch.max(1), opts.batch_window);
    let rtc = opts.rtc;
    // The pipeline is dropped at the loop's end: an accelerator is released there.
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
        handshake_timeout: opts.handshake_timeout,
        idle_timeout: opts.idle_timeout,
        pending: Budget::new(MAX_PENDING),
        sessions: Budget::new(MAX_SESSIONS),
        decoders: Arc::new(Semaphore::new(DECODERS)),
    });
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("pi0d-serve-io")
        .enable_all()
        .build()
        .map_err(ServeError::Runtime)?;
    let outcome = rt.block_on(accept_loop(
        opts.listen,
        opts.zenoh.clone(),
        shared,
        signals,
    ));
    // Connections end with the runtime; a decode still running is left behind.
    rt.shutdown_timeout(Duration::from_secs(1));
    // The queue's sender is gone with the runtime's tasks: the worker ends after its job and
    // releases the model (an NPU's device, AscendCL finalized) before the process exits. A
    // decode left behind may hold the queue open: then the exit does not wait past the grace.
    let deadline = Instant::now() + WORKER_GRACE;
    while !worker.is_finished() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    if worker.is_finished() {
        let _ = worker.join();
    } else {
        tracing::warn!(
            grace_s = WORKER_GRACE.as_secs_f64(),
            "the model's thread has not ended: exiting without releasing the model"
        );
    }
    outcome
}

async fn accept_loop(
    addr: SocketAddr,
    zenoh: Option<crate::config::openpi::ZenohLinkOptions>,
    shared: Arc<Shared>,
    mut signals: Signals,
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
        Some(_) => return Err(ServeError::NoZenoh),
    };
    let local = listener.local_addr().unwrap_or(addr);
    tracing::info!(
        handshake_timeout_s = shared.handshake_timeout.as_secs_f64(),
        idle_timeout_s = shared.idle_timeout.as_secs_f64(),
        // Last: tools and tests read the port at the end of the line.
        %local,
        "serving openpi's websocket protocol (GET /healthz for health)"
    );
    let mut poll = tokio::time::interval(SIGNAL_POLL);
    poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => admit(stream, peer, &shared),
                // Out of descriptors and the like: keep serving those connected.
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            _ = poll.tick() => {
                signals.log_ignored();
                if signals.take_reload() {
                    tracing::warn!(
                        signal = "SIGHUP",
                        "ignored: pi0d serve has nothing to reload (restart it to change options)"
                    );
                }
                if signals.stop.load(Ordering::Relaxed) {
                    break;
                }
            }
        }
    }
    tracing::info!(
        sessions = shared.sessions.held(),
        // Per-connection and per-request lines beyond their budget (20 per 10 s each).
        log_lines_held_back = crate::telemetry::log_lines_suppressed(),
        "stopping: a stop signal arrived; connected clients are closed"
    );
    Ok(())
}

/// Gives an arriving connection a place among the unauthenticated ones (evicting the oldest
/// when they are all taken) and serves it.
fn admit(stream: TcpStream, peer: SocketAddr, sh: &Arc<Shared>) {
    let arrived = Instant::now();
    match sh.pending.admit(arrived) {
        Ok((slot, room)) => {
            if room == Room::Evicted {
                tracing::debug!(
                    %peer,
                    "{MAX_PENDING} connections were mid-handshake: the oldest closed for this one"
                );
            }
            tokio::spawn(connection(stream, peer, sh.clone(), slot, arrived));
        }
        // Unreachable: a connection mid-handshake is never busy, so one is always evicted.
        Err(Full) => tracing::warn!(%peer, "refused: no place for an unauthenticated connection"),
    }
}

/// Answers Zenoh queries on the key with the same frames as the websocket: each query's
/// payload a request, its reply the reply (or an error reply with the message). Complete, so
/// a querier's best-matching target picks one server of several on the same key.
#[cfg(feature = "zenoh")]
async fn zenoh_queryable(
    z: &crate::config::openpi::ZenohLinkOptions,
    shared: Arc<Shared>,
) -> Result<(zenoh::Session, tokio::task::JoinHandle<()>), ServeError> {
    let (config, exposure) = crate::zenoh_session::config(&crate::zenoh_session::Settings {
        names: crate::zenoh_session::Names {
            file: "--zenoh-config",
            multicast: "--zenoh-multicast-scouting",
        },
        file: z.session_config.as_deref(),
        overrides: &[],
        connect: &z.connect,
        listen: &z.listen,
        multicast_scouting: z.multicast_scouting,
        max_message_bytes: shared.max_request_bytes,
    })?;
    if exposure.open() {
        tracing::warn!(session = %exposure, "Zenoh session");
    } else {
        tracing::info!(session = %exposure, "Zenoh session");
    }
    let session = zenoh::open(config)
        .await
        .map_err(|source| ServeError::Zenoh {
            what: "session",
            source,
        })?;
    let queryable = session
        .declare_queryable(z.key.as_str())
        .complete(true)
        .await
        .map_err(|source| ServeError::Zenoh {
            what: "queryable",
            source,
        })?;
    tracing::info!(key = %z.key, zid = %session.zid(), "answering Zenoh queries");
    let task = tokio::spawn(async move {
        while let Ok(query) = queryable.recv_async().await {
            let sh = shared.clone();
            tokio::spawn(async move {
                let bytes = query
                    .payload()
                    .map(|p| p.to_bytes().into_owned())
                    .unwrap_or_default();
                let sent = match infer(&sh, bytes, None).await {
                    Ok(reply) => {
                        tracing::debug!("Zenoh query answered");
                        query.reply(query.key_expr().clone(), reply).await
                    }
                    Err(e) => {
                        let text = e.shown();
                        tracing::warn!(error = %text, "Zenoh request refused");
                        query.reply_err(text).await
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

/// How a connection's HTTP request ended.
enum Opened {
    /// An authenticated websocket session, holding its place among the sessions.
    Session(Box<Ws>, Slot),
    Health,
    /// Closed by the client before its request was complete (a port scan, a health probe
    /// that gave up).
    Closed,
    Lost(std::io::Error),
    HeadTooLarge,
    /// Not a websocket upgrade, a wrong API key, or every session mid-request (the client got
    /// the HTTP error).
    Refused(WsError),
    TimedOut,
    /// Its place went to a newer connection.
    Evicted,
}

/// How a session ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum End {
    /// The client sent a close frame.
    Closed,
    /// The connection dropped without one.
    Gone,
    Idle,
    Evicted,
    /// A request was refused (told the client, logged, connection closed).
    Refused,
    /// The client did not take its reply within the idle timeout.
    Stalled,
}

async fn connection(
    stream: TcpStream,
    peer: SocketAddr,
    sh: Arc<Shared>,
    pending: Slot,
    arrived: Instant,
) {
    let _ = stream.set_nodelay(true);
    let deadline = tokio::time::Instant::from_std(arrived + sh.handshake_timeout);
    let opened = tokio::select! {
        _ = pending.evicted() => Opened::Evicted,
        o = tokio::time::timeout_at(deadline, open(stream, &sh)) => o.unwrap_or(Opened::TimedOut),
    };
    drop(pending);
    let limit = sh.handshake_timeout;
    let (ws, slot) = match opened {
        Opened::Session(ws, slot) => (ws, slot),
        Opened::Health => return tracing::debug!(%peer, "health check answered"),
        Opened::Closed => return tracing::debug!(%peer, "closed before its request was complete"),
        Opened::Lost(e) => {
            return tracing::debug!(%peer, error = %e, "lost before its request was complete")
        }
        Opened::HeadTooLarge => {
            return tracing::warn!(%peer, "request head over {MAX_HEAD} bytes: closed")
        }
        Opened::Refused(e) => {
            return tracing::warn!(%peer, error = %e, "websocket handshake refused")
        }
        Opened::TimedOut => {
            return tracing::info!(%peer, "no complete handshake within {limit:?}: closed")
        }
        Opened::Evicted => {
            return tracing::debug!(%peer, "unauthenticated, the oldest of {MAX_PENDING}: closed")
        }
    };
    tracing::info!(%peer, "client connected");
    let idle = sh.idle_timeout;
    match session(*ws, &sh, &slot).await {
        End::Closed => tracing::info!(%peer, "client closed"),
        End::Gone => tracing::info!(%peer, "client gone (connection dropped without a close)"),
        End::Idle => tracing::info!(%peer, "client closed: no request for {idle:?}"),
        End::Evicted => tracing::info!(
            %peer,
            "client closed: idle the longest of {MAX_SESSIONS} sessions when another client came"
        ),
        End::Refused => tracing::info!(%peer, "client closed after its refused request"),
        End::Stalled => tracing::info!(%peer, "client closed: it did not take its reply"),
    }
}

/// Reads the HTTP request and answers it: a health check, or the websocket handshake (API key
/// checked, a session place taken).
async fn open(mut stream: TcpStream, sh: &Shared) -> Opened {
    let head = match read_head(&mut stream, MAX_HEAD).await {
        Ok(Head::Complete(head)) => head,
        Ok(Head::Eof(_)) => return Opened::Closed,
        Ok(Head::TooLarge(_)) => return Opened::HeadTooLarge,
        Err(e) => return Opened::Lost(e),
    };
    if is_health_check(&head) {
        return match answer_health(&mut stream).await {
            Ok(()) => Opened::Health,
            Err(e) => Opened::Lost(e),
        };
    }
    // tungstenite reads the request again: what was read comes first.
    let (rd, wr) = stream.into_split();
    let io = tokio::io::join(std::io::Cursor::new(head).chain(rd), wr);
    let key = sh.api_key.as_deref();
    let sessions = &sh.sessions;
    let mut admitted: Option<Slot> = None;
    let refuse = |status: StatusCode, body: String| {
        let mut e = ErrorResponse::new(Some(body));
        *e.status_mut() = status;
        e
    };
    // tungstenite's callback signature: its error is the HTTP response sent back.
    #[allow(clippy::result_large_err)]
    let check = |req: &Request, resp: Response| -> Result<Response, ErrorResponse> {
        if !authorized(req, key) {
            return Err(refuse(
                StatusCode::UNAUTHORIZED,
                "missing or wrong API key\n".into(),
            ));
        }
        match sessions.admit(Instant::now()) {
            Ok((slot, room)) => {
                if room == Room::Evicted {
                    tracing::info!(
                        "{MAX_SESSIONS} sessions: the longest idle closed for a new one"
                    );
                }
                admitted = Some(slot);
                Ok(resp)
            }
            Err(Full) => Err(refuse(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("all {MAX_SESSIONS} sessions are mid-request; try again\n"),
            )),
        }
    };
    let config = WebSocketConfig {
        max_message_size: Some(sh.max_request_bytes),
        max_frame_size: Some(sh.max_request_bytes),
        ..Default::default()
    };
    match tokio_tungstenite::accept_hdr_async_with_config(io, check, Some(config)).await {
        Ok(ws) => match admitted {
            Some(slot) => Opened::Session(Box::new(ws), slot),
            // The callback admits every handshake it lets through.
            None => Opened::Closed,
        },
        Err(e) => Opened::Refused(e),
    }
}

/// Whether `req` carries the API key `key` (any request, without one).
fn authorized(req: &Request, key: Option<&str>) -> bool {
    let Some(key) = key else {
        return true;
    };
    req.headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|g| same(g, &format!("Api-Key {key}")))
}

/// A client's first bytes as `open` reads them (its request head, the health check, the
/// websocket handshake with an API key), on arbitrary bytes: for `crate::fuzz`.
pub(crate) fn fuzz_handshake(bytes: &[u8]) -> Result<(), String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .map_err(|e| e.to_string())?;
    rt.block_on(async {
        // Room for all of it: the client's bytes are written, then its side closes.
        let (mut client, mut server) = tokio::io::duplex(bytes.len().max(1));
        client.write_all(bytes).await.map_err(|e| e.to_string())?;
        drop(client);
        let head = match read_head(&mut server, MAX_HEAD)
            .await
            .map_err(|e| e.to_string())?
        {
            Head::Complete(head) => head,
            Head::Eof(_) => return Err("closed before its head ended".into()),
            Head::TooLarge(_) => return Err("head too large".into()),
        };
        if is_health_check(&head) {
            return Ok(());
        }
        let (rd, wr) = tokio::io::split(server);
        let io = tokio::io::join(std::io::Cursor::new(head).chain(rd), wr);
        #[allow(clippy::result_large_err)]
        let check = |req: &Request, resp: Response| -> Result<Response, ErrorResponse> {
            if authorized(req, Some("key")) {
                Ok(resp)
            } else {
                Err(ErrorResponse::new(None))
            }
        };
        let config = WebSocketConfig {
            max_message_size: Some(1 << 20),
            max_frame_size: Some(1 << 20),
            ..Default::default()
        };
        let mut ws = tokio_tungstenite::accept_hdr_async_with_config(io, check, Some(config))
            .await
            .map_err(|e| e.to_string())?;
        // What follows the handshake is frames: read them until the bytes end.
        while let Some(Ok(_)) = ws.next().await {}
        Ok(())
    })
}

/// Compares without stopping at the first difference (the key's length aside).
fn same(a: &str, b: &str) -> bool {
    a.len() == b.len() && a.bytes().zip(b.bytes()).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0
}

/// `GET /healthz` without an upgrade.
fn is_health_check(head: &[u8]) -> bool {
    let head = String::from_utf8_lossy(head).to_ascii_lowercase();
    head.starts_with("get /healthz ") && !head.contains("\nupgrade:")
}

async fn answer_health(stream: &mut TcpStream) -> std::io::Result<()> {
    stream
        .write_all(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 3\r\nConnection: close\r\n\r\nOK\n")
        .await?;
    stream.shutdown().await
}

/// What tungstenite reads: the request head already read, then the socket.
type Io =
    tokio::io::Join<tokio::io::Chain<std::io::Cursor<Vec<u8>>, OwnedReadHalf>, OwnedWriteHalf>;
type Ws = tokio_tungstenite::WebSocketStream<Io>;
type Tx = SplitSink<Ws, Message>;

/// The connection ended under the client (no close frame): not a bad frame.
fn disconnected(e: &WsError) -> bool {
    use std::io::ErrorKind::*;
    match e {
        WsError::ConnectionClosed | WsError::AlreadyClosed => true,
        WsError::Protocol(ProtocolError::ResetWithoutClosingHandshake) => true,
        WsError::Io(e) => matches!(
            e.kind(),
            ConnectionReset | ConnectionAborted | BrokenPipe | UnexpectedEof
        ),
        _ => false,
    }
}

/// Sends `msg` unless the client does not take it within `limit`; says whether it was sent.
async fn send(tx: &mut Tx, msg: Message, limit: Duration) -> bool {
    matches!(tokio::time::timeout(limit, tx.send(msg)).await, Ok(Ok(())))
}

async fn close(tx: &mut Tx, code: CloseCode, reason: &str) {
    let frame = CloseFrame {
        code,
        reason: reason.to_string().into(),
    };
    send(tx, Message::Close(Some(frame)), CLOSE_WRITE).await;
}

/// One client: metadata first, then a reply per request until it closes, a request fails, it
/// stays idle past the idle timeout or its place goes to another client.
async fn session(ws: Ws, sh: &Arc<Shared>, slot: &Slot) -> End {
    let (mut tx, mut rx) = ws.split();
    if !send(
        &mut tx,
        Message::Binary(sh.metadata.clone()),
        sh.idle_timeout,
    )
    .await
    {
        return End::Stalled;
    }
    let mut prev_total_ms: Option<f64> = None;
    let mut idle_since = tokio::time::Instant::now();
    loop {
        let msg = tokio::select! {
            msg = rx.next() => msg,
            _ = tokio::time::sleep_until(idle_since + sh.idle_timeout) => {
                close(&mut tx, CloseCode::Normal, "idle: no request within the idle timeout").await;
                return End::Idle;
            }
            _ = slot.evicted() => {
                close(&mut tx, CloseCode::Again, "the server is full and this client was idle")
                    .await;
                return End::Evicted;
            }
        };
        let start = Instant::now();
        let outcome = match msg {
            None => return End::Gone,
            Some(Ok(Message::Binary(b))) => {
                // Mid-request from here: never evicted.
                if !slot.begin() {
                    close(
                        &mut tx,
                        CloseCode::Again,
                        "the server is full and this client was idle",
                    )
                    .await;
                    return End::Evicted;
                }
                infer(sh, b, prev_total_ms).await
            }
            Some(Ok(Message::Text(_))) => Err(Refusal::TextFrame),
            Some(Ok(Message::Close(_))) => return End::Closed,
            // Pings and pongs (answered by tungstenite) are not requests.
            Some(Ok(_)) => continue,
            Some(Err(e)) if disconnected(&e) => return End::Gone,
            // Over the size cap, or not websocket: the client is told if it still listens.
            Some(Err(e)) => Err(Refusal::BadFrame(Box::new(e))),
        };
        match outcome {
            Ok(reply) => {
                if !send(&mut tx, Message::Binary(reply), sh.idle_timeout).await {
                    return End::Stalled;
                }
            }
            Err(e) => {
                let text = e.shown();
                tracing::warn!(error = %text, "request refused");
                send(&mut tx, Message::Text(text), CLOSE_WRITE).await;
                close(
                    &mut tx,
                    CloseCode::Error,
                    "Internal server error. Traceback included in previous frame.",
                )
                .await;
                return End::Refused;
            }
        }
        let now = Instant::now();
        slot.end(now);
        idle_since = tokio::time::Instant::from_std(now);
        prev_total_ms = Some(start.elapsed().as_secs_f64() * 1e3);
    }
}

/// Decodes and checks a request on the blocking pool, at most `DECODERS` at once: however
/// long a hostile request takes, the I/O thread (accepts, health checks, other clients) is
/// never held up by it.
async fn decode(sh: &Arc<Shared>, bytes: Vec<u8>) -> Result<Observation, Refusal> {
    let permit = sh
        .decoders
        .clone()
        .acquire_owned()
        .await
        .map_err(|_| Refusal::Stopping)?;
    let shared = sh.clone();
    tokio::task::spawn_blocking(move || {
        let _permit = permit;
        let items = msgpack_numpy::decode_request(&bytes)?;
        Ok(shared.layout.parse(items)?)
    })
    .await
    .unwrap_or(Err(Refusal::DecoderFailed))
}

/// Decodes, queues and answers one request.
async fn infer(
    sh: &Arc<Shared>,
    bytes: Vec<u8>,
    prev_total_ms: Option<f64>,
) -> Result<Vec<u8>, Refusal> {
    let obs = decode(sh, bytes).await?;
    let (reply, answer) = oneshot::channel();
    match sh.jobs.try_send(Job { obs, reply }) {
        Ok(()) => {}
        Err(mpsc::TrySendError::Full(_)) => return Err(Refusal::Busy { queue: sh.queue }),
        Err(mpsc::TrySendError::Disconnected(_)) => return Err(Refusal::ModelStopped),
    }
    let r = answer.await.map_err(|_| Refusal::ModelStopped)??;
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

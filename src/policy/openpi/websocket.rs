//! openpi's websocket link: one request in flight, its reply the next data frame. openpi's
//! replies carry no id, so a frame that no request asked for (a second reply, anything
//! waiting before a request is sent) is a protocol fault that drops the connection; and every
//! read and write of a request, or of a connection with its metadata, ends at one deadline.

use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tungstenite::client::IntoClientRequest;
use tungstenite::protocol::WebSocketConfig;
use tungstenite::{Message, WebSocket};

use super::msgpack_numpy::{self, Item};
use super::wire::{DeadlineTcp, Framed, Transport};
use super::{fault, Link};
use crate::config::OpenpiOptions;
use crate::outside;
use crate::policy::{PolicyError, RemoteFault};

/// The longest a close frame may take to go out when a connection is dropped.
const CLOSE_GRACE: Duration = Duration::from_millis(100);
/// Most bytes read from `policy.openpi.ca_file` (Mozilla's whole root bundle is ~220 KB).
#[cfg(feature = "tls")]
pub(crate) const MAX_CA_FILE_BYTES: u64 = 1024 * 1024;

type Wire = Framed<Transport>;
/// A server's metadata frame, decoded.
type Metadata = Vec<(String, Item)>;

/// Why the link cannot be set up (before any connection).
#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    /// Not a regular file of at most `MAX_CA_FILE_BYTES`, or unreadable.
    #[error("policy.openpi.ca_file {}: cannot read", path.display())]
    CaFile {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("policy.openpi.ca_file {}: no PEM certificate in it", path.display())]
    CaEmpty { path: PathBuf },
    #[cfg(feature = "tls")]
    #[error("policy.openpi.ca_file {}: malformed PEM", path.display())]
    CaPem {
        path: PathBuf,
        #[source]
        source: rustls::pki_types::pem::Error,
    },
    #[cfg(feature = "tls")]
    #[error("policy.openpi.ca_file {}: certificate refused", path.display())]
    CaCertificate {
        path: PathBuf,
        #[source]
        source: rustls::Error,
    },
    #[cfg(feature = "tls")]
    #[error("TLS")]
    Tls(#[source] rustls::Error),
}

/// What a server's metadata frame says (openpi's servers send what they like: pi0d's own
/// sends the action dimension and horizon).
#[derive(Clone, Debug, PartialEq)]
pub struct ServerInfo {
    pub action_dim: Option<usize>,
    pub action_horizon: Option<usize>,
    /// Its scalar entries, `key=value, ...`.
    pub summary: String,
}

/// openpi's websocket link, over TLS for wss:// (feature `tls`).
pub struct Websocket {
    url: String,
    api_key: Option<crate::config::openpi::Secret>,
    connect_timeout: Duration,
    request_timeout_s: f64,
    max_reply_bytes: usize,
    #[cfg(feature = "tls")]
    tls: Option<std::sync::Arc<rustls::ClientConfig>>,
    ws: Option<WebSocket<Wire>>,
}

impl Websocket {
    /// Fails on a CA file that cannot be read or holds no certificate.
    pub fn new(opts: &OpenpiOptions) -> Result<Websocket, LinkError> {
        Ok(Websocket {
            url: opts.url.clone(),
            api_key: opts.api_key.clone(),
            connect_timeout: Duration::from_secs_f64(opts.connect_timeout_s),
            request_timeout_s: opts.request_timeout_s,
            max_reply_bytes: opts.max_reply_bytes,
            #[cfg(feature = "tls")]
            tls: if opts.url.starts_with("wss://") {
                Some(tls_config(opts.ca_file.as_deref())?)
            } else {
                None
            },
            ws: None,
        })
    }

    /// The TCP stream, as is or inside TLS for wss://.
    fn wrap(&self, tcp: DeadlineTcp, host: &str) -> Result<Transport, PolicyError> {
        #[cfg(feature = "tls")]
        if let Some(config) = &self.tls {
            let down = |m: String| fault(RemoteFault::Down, m);
            let name = rustls::pki_types::ServerName::try_from(host.to_string())
                .map_err(|e| down(format!("{}: {host}: {e}", self.url)))?;
            let conn = rustls::ClientConnection::new(config.clone(), name)
                .map_err(|e| down(format!("{}: TLS: {e}", self.url)))?;
            return Ok(Transport::Tls(Box::new(rustls::StreamOwned::new(
                conn, tcp,
            ))));
        }
        let _ = host;
        Ok(Transport::Plain(tcp))
    }

    /// Connects, reads the metadata frame and closes, within the connect timeout: what
    /// `pi0d check` asks of a server, with the code `run` connects with.
    pub fn probe(&self) -> Result<ServerInfo, PolicyError> {
        let (mut ws, meta) = self.connect(Instant::now() + self.connect_timeout)?;
        let _ = ws.close(None);
        let _ = ws.flush();
        let int = |key: &str| {
            meta.iter().find_map(|(k, v)| match v {
                Item::Number(x) if k == key && x.fract() == 0.0 && *x >= 0.0 => Some(*x as usize),
                _ => None,
            })
        };
        Ok(ServerInfo {
            action_dim: int("action_dim"),
            action_horizon: int("action_horizon"),
            summary: summarize(&meta),
        })
    }

    /// Connects and reads the metadata frame, all by `deadline`.
    fn connect(&self, deadline: Instant) -> Result<(WebSocket<Wire>, Metadata), PolicyError> {
        let down = |m: String| fault(RemoteFault::Down, m);
        let url = &self.url;
        let connect_s = self.connect_timeout.as_secs_f64();
        let late = |what: &str| {
            fault(
                RemoteFault::Timeout,
                format!("{url}: {what} within policy.openpi.connect_timeout_s = {connect_s} s"),
            )
        };
        let mut request = url
            .as_str()
            .into_client_request()
            .map_err(|e| down(format!("{url}: {e}")))?;
        if let Some(key) = &self.api_key {
            let value = format!("Api-Key {}", key.0)
                .parse()
                .map_err(|_| down("the API key is not a valid header value".into()))?;
            request.headers_mut().insert("authorization", value);
        }
        let uri = request.uri();
        let host = uri.host().unwrap_or_default().to_string();
        let port = uri.port_u16().unwrap_or(80);
        let addr = match resolve(&host, port, deadline) {
            Ok(a) => a,
            Err(Lookup::Late) => return Err(late(&format!("no address for {host}"))),
            Err(Lookup::NoAddress) => return Err(down(format!("{url}: {host} has no address"))),
            Err(Lookup::Failed(e)) => {
                return Err(down(format!("{url}: cannot resolve {host}: {e}")))
            }
            Err(Lookup::Busy) => {
                return Err(down(format!(
                    "{url}: cannot resolve {host}: {MAX_LOOKUPS} earlier lookups have not ended"
                )))
            }
        };
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(late("no connection"));
        }
        let stream =
            TcpStream::connect_timeout(&addr, left).map_err(|e| down(format!("{url}: {e}")))?;
        let _ = stream.set_nodelay(true);
        let config = WebSocketConfig {
            max_message_size: Some(self.max_reply_bytes),
            max_frame_size: Some(self.max_reply_bytes),
            ..Default::default()
        };
        let stream = Framed::new(self.wrap(DeadlineTcp::new(stream, deadline), &host)?);
        let (mut ws, _) = tungstenite::client::client_with_config(request, stream, Some(config))
            .map_err(|e| match e {
                tungstenite::HandshakeError::Failure(tungstenite::Error::Http(r)) => down(format!(
                    "{url} refused the connection: HTTP {}{}",
                    r.status(),
                    if r.status() == 401 || r.status() == 403 {
                        " (check policy.openpi's API key)"
                    } else {
                        ""
                    }
                )),
                tungstenite::HandshakeError::Failure(e) if timed_out(&e) => {
                    late("no websocket handshake")
                }
                e => down(format!("{url}: handshake: {e}")),
            })?;
        // openpi's server sends its metadata first.
        let metadata = loop {
            match ws.read() {
                Ok(Message::Binary(b)) => break b,
                Ok(Message::Ping(_) | Message::Pong(_) | Message::Frame(_)) => continue,
                Ok(other) => {
                    return Err(fault(
                        RemoteFault::Malformed,
                        format!(
                            "{url}: expected the metadata frame first, got {}",
                            describe(&other)
                        ),
                    ))
                }
                Err(e) if timed_out(&e) => return Err(late("no metadata frame")),
                Err(e) => return Err(down(format!("{url}: no metadata frame: {e}"))),
            }
        };
        let meta = msgpack_numpy::decode_request(&metadata)
            .map_err(|e| fault(RemoteFault::Malformed, format!("{url}: metadata: {e}")))?;
        if Instant::now() >= deadline {
            return Err(late("no metadata decoded"));
        }
        tracing::info!(
            url = %url,
            metadata = %summarize(&meta),
            "connected to the policy server"
        );
        Ok((ws, meta))
    }

    /// `Ok` when nothing waits on the connection before a request goes: a frame (or part of
    /// one) there answers no request.
    fn check_quiet(ws: &mut WebSocket<Wire>) -> Result<(), PolicyError> {
        let unasked = |what: String| {
            fault(
                RemoteFault::Unsolicited,
                format!("{what} came while no request was in flight (openpi's replies carry no id: dropping the connection)"),
            )
        };
        // Whole frames read ahead (a ping after the reply) go through tungstenite below.
        ws.get_mut()
            .get_mut()
            .tcp()
            .set_nonblocking(true)
            .map_err(|e| fault(RemoteFault::Closed, format!("connection lost: {e}")))?;
        let verdict = loop {
            match ws.read() {
                Ok(Message::Ping(_) | Message::Pong(_) | Message::Frame(_)) => continue,
                Ok(Message::Close(c)) => {
                    break Err(fault(
                        RemoteFault::Closed,
                        format!(
                            "the server closed the connection between requests{}",
                            close_reason(c)
                        ),
                    ))
                }
                Ok(Message::Text(t)) => {
                    break Err(unasked(format!("an error text ({})", first_lines(&t))))
                }
                Ok(Message::Binary(b)) => {
                    break Err(unasked(format!(
                        "a binary frame of {} bytes (a second reply?)",
                        b.len()
                    )))
                }
                Err(tungstenite::Error::Io(e)) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    break Ok(())
                }
                Err(e) => break Err(closed_or_malformed(e, false, "between requests")),
            }
        };
        let restored = ws.get_mut().get_mut().tcp().set_nonblocking(false);
        verdict?;
        restored.map_err(|e| fault(RemoteFault::Closed, format!("connection lost: {e}")))?;
        if ws.get_ref().holds_partial() {
            return Err(unasked("part of a frame".into()));
        }
        Ok(())
    }

    fn timeout(&self, partial: bool) -> PolicyError {
        fault(
            RemoteFault::Timeout,
            format!(
                "{} within policy.openpi.request_timeout_s = {} s",
                if partial {
                    "the reply did not complete"
                } else {
                    "no reply"
                },
                self.request_timeout_s
            ),
        )
    }
}

/// Whether tungstenite failed on the deadline (`DeadlineTcp`'s error).
fn timed_out(e: &tungstenite::Error) -> bool {
    matches!(e, tungstenite::Error::Io(io)
        if matches!(io.kind(), std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock))
}

fn close_reason(c: Option<tungstenite::protocol::CloseFrame>) -> String {
    c.map(|c| format!(" ({}: {})", c.code, outside::text(&c.reason)))
        .unwrap_or_default()
}

/// A read or write failure that is not the deadline: the connection closed or broke
/// (`partial`: mid-reply), or the server broke the websocket protocol.
fn closed_or_malformed(e: tungstenite::Error, partial: bool, when: &str) -> PolicyError {
    use std::io::ErrorKind as K;
    use tungstenite::error::ProtocolError as P;
    use tungstenite::Error as E;
    let closed = |m: String| fault(RemoteFault::Closed, m);
    match e {
        E::ConnectionClosed | E::AlreadyClosed | E::Protocol(P::ResetWithoutClosingHandshake) => {
            closed(if partial {
                "the server closed the connection mid-reply".into()
            } else {
                format!("the server closed the connection {when}")
            })
        }
        E::Io(io)
            if matches!(
                io.kind(),
                K::UnexpectedEof | K::ConnectionReset | K::ConnectionAborted | K::BrokenPipe
            ) =>
        {
            closed(if partial {
                format!("the server closed the connection mid-reply ({io})")
            } else {
                format!("the server closed the connection {when} ({io})")
            })
        }
        E::Io(io) => closed(format!("connection lost {when}: {io}")),
        E::Capacity(c) => fault(
            RemoteFault::Malformed,
            format!("reply too large: {c} (policy.openpi.max_reply_mib)"),
        ),
        e => fault(
            RemoteFault::Malformed,
            outside::text(&e.to_string()).to_string(),
        ),
    }
}

impl Link for Websocket {
    fn open(&mut self) -> Result<(), PolicyError> {
        if self.ws.is_none() {
            self.ws = Some(self.connect(Instant::now() + self.connect_timeout)?.0);
        }
        Ok(())
    }

    fn round_trip(&mut self, bytes: Vec<u8>, deadline: Instant) -> Result<Vec<u8>, PolicyError> {
        let Some(ws) = self.ws.as_mut() else {
            return Err(fault(RemoteFault::Down, "not connected"));
        };
        ws.get_mut().get_mut().tcp().set_deadline(deadline);
        Self::check_quiet(ws)?;
        if let Err(e) = ws.send(Message::Binary(bytes)) {
            return Err(if timed_out(&e) {
                fault(
                    RemoteFault::Timeout,
                    format!(
                        "the request did not go out within policy.openpi.request_timeout_s = {} s",
                        self.request_timeout_s
                    ),
                )
            } else {
                closed_or_malformed(e, false, "while the request went out")
            });
        }
        loop {
            let partial = |ws: &WebSocket<Wire>| ws.get_ref().holds_partial();
            match ws.read() {
                Ok(Message::Binary(b)) => return Ok(b),
                Ok(Message::Text(t)) => {
                    return Err(fault(RemoteFault::ServerError, first_lines(&t)));
                }
                Ok(Message::Close(c)) => {
                    return Err(fault(
                        RemoteFault::Closed,
                        format!(
                            "the server closed the connection during the request{}",
                            close_reason(c)
                        ),
                    ))
                }
                Ok(Message::Ping(_) | Message::Pong(_) | Message::Frame(_)) => continue,
                Err(e) if timed_out(&e) => {
                    let p = partial(ws);
                    return Err(self.timeout(p));
                }
                Err(e) => {
                    let p = partial(ws);
                    return Err(closed_or_malformed(e, p, "during the request"));
                }
            }
        }
    }

    fn is_open(&self) -> bool {
        self.ws.is_some()
    }

    fn close(&mut self) {
        if let Some(mut ws) = self.ws.take() {
            // Best effort: the socket closes when dropped anyway.
            let tcp = ws.get_mut().get_mut().tcp();
            let _ = tcp.set_nonblocking(false);
            tcp.set_deadline(Instant::now() + CLOSE_GRACE);
            let _ = ws.close(None);
            let _ = ws.flush();
        }
    }
}

/// The public roots (Mozilla's, from webpki-roots) plus the certificates in `ca_file`.
#[cfg(feature = "tls")]
fn tls_config(
    ca_file: Option<&std::path::Path>,
) -> Result<std::sync::Arc<rustls::ClientConfig>, LinkError> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::CertificateDer;
    let mut roots = rustls::RootCertStore::empty();
    roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    if let Some(path) = ca_file {
        let pem = crate::files::read_regular(path, MAX_CA_FILE_BYTES).map_err(|source| {
            LinkError::CaFile {
                path: path.to_path_buf(),
                source,
            }
        })?;
        let mut added = 0;
        for cert in CertificateDer::pem_slice_iter(pem.as_bytes()) {
            let cert = cert.map_err(|source| LinkError::CaPem {
                path: path.to_path_buf(),
                source,
            })?;
            roots.add(cert).map_err(|source| LinkError::CaCertificate {
                path: path.to_path_buf(),
                source,
            })?;
            added += 1;
        }
        if added == 0 {
            return Err(LinkError::CaEmpty {
                path: path.to_path_buf(),
            });
        }
    }
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(LinkError::Tls)?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(std::sync::Arc::new(config))
}

/// Lookups still running (their callers gave up on some): at most `MAX_LOOKUPS`.
static LOOKUPS: AtomicUsize = AtomicUsize::new(0);
/// More hung lookups than this and no new one starts (each holds a thread until the system's
/// resolver gives up).
const MAX_LOOKUPS: usize = 4;

/// Why `resolve` gave no address.
#[derive(Debug)]
enum Lookup {
    /// Not answered by the deadline.
    Late,
    NoAddress,
    Failed(std::io::Error),
    /// `MAX_LOOKUPS` lookups are still running.
    Busy,
}

/// `host:port`'s first address, by `deadline`. The system's resolver (getaddrinfo) takes no
/// timeout and cannot be cancelled, so it runs on a helper thread and the caller waits for
/// its answer only until the deadline; a lookup still running then ends on its own and its
/// answer is dropped. `LOOKUPS` bounds how many such threads there are at once.
fn resolve(host: &str, port: u16, deadline: Instant) -> Result<SocketAddr, Lookup> {
    if LOOKUPS.fetch_add(1, Ordering::SeqCst) >= MAX_LOOKUPS {
        LOOKUPS.fetch_sub(1, Ordering::SeqCst);
        return Err(Lookup::Busy);
    }
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    let name = host.to_string();
    let spawned = std::thread::Builder::new()
        .name("pi0d-resolve".into())
        .spawn(move || {
            let r = (name.as_str(), port)
                .to_socket_addrs()
                .map(|mut a| a.next());
            LOOKUPS.fetch_sub(1, Ordering::SeqCst);
            let _ = tx.send(r);
        });
    if let Err(e) = spawned {
        LOOKUPS.fetch_sub(1, Ordering::SeqCst);
        return Err(Lookup::Failed(e));
    }
    let left = deadline.saturating_duration_since(Instant::now());
    match rx.recv_timeout(left) {
        Ok(Ok(Some(a))) => Ok(a),
        Ok(Ok(None)) => Err(Lookup::NoAddress),
        Ok(Err(e)) => Err(Lookup::Failed(e)),
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => Err(Lookup::Late),
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => Err(Lookup::Failed(
            std::io::Error::other("the resolver thread ended without an answer"),
        )),
    }
}

fn describe(m: &Message) -> &'static str {
    match m {
        Message::Text(_) => "a text frame",
        Message::Binary(_) => "a binary frame",
        Message::Close(_) => "a close",
        _ => "a control frame",
    }
}

/// The last lines of a server's error text (openpi's server sends a whole traceback), shown
/// as outside text.
fn first_lines(t: &str) -> String {
    let lines: Vec<&str> = t.trim_end().lines().collect();
    let tail = &lines[lines.len().saturating_sub(3)..];
    format!(
        "the server answered with an error: {}",
        outside::text(&tail.join(" | "))
    )
}

/// The server's metadata in a line: its keys and short values, shown as outside text.
fn summarize(meta: &[(String, Item)]) -> String {
    let line = meta
        .iter()
        .map(|(k, v)| match v {
            Item::Text(t) => format!("{k}={t}"),
            Item::Number(x) => format!("{k}={x}"),
            _ => k.clone(),
        })
        .collect::<Vec<_>>()
        .join(", ");
    outside::text(&line).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(url: &str, connect_timeout_s: f64) -> OpenpiOptions {
        OpenpiOptions {
            url: url.into(),
            api_key: None,
            ca_file: None,
            connect_timeout_s,
            request_timeout_s: 1.0,
            reconnect_initial_s: 0.1,
            reconnect_max_s: 1.0,
            images: None,
            state_key: "observation.state".into(),
            prompt_key: "prompt".into(),
            extra: Vec::new(),
            image_size: 0,
            action_dim: None,
            max_reply_bytes: 1 << 20,
            zenoh: None,
        }
    }

    /// A host no resolver knows (`.invalid` is reserved, RFC 6761): the connection fails
    /// within `connect_timeout_s`, naming the host, whether the resolver answers "unknown"
    /// at once or hangs (then the deadline ends the wait: the lookup runs on its own thread).
    #[test]
    fn when_the_host_cannot_be_resolved_expect_a_failure_naming_it_within_the_connect_timeout() {
        let connect_timeout_s = 2.0;
        let mut link = Websocket::new(&options(
            "ws://pi0d-no-such-host.invalid:8000",
            connect_timeout_s,
        ))
        .unwrap();
        let started = Instant::now();
        let Err(e) = link.open() else {
            panic!("connected to a host that does not exist")
        };
        // The connect deadline, plus a margin for the thread hand-off.
        let waited = started.elapsed().as_secs_f64();
        assert!(waited < connect_timeout_s + 1.0, "{waited} s: {e}");
        let PolicyError::Remote { fault, message } = &e else {
            panic!("not a remote fault: {e}")
        };
        assert!(
            matches!(fault, RemoteFault::Down | RemoteFault::Timeout),
            "{e}"
        );
        assert!(message.contains("pi0d-no-such-host.invalid"), "{e}");
        assert!(!link.is_open());
    }

    /// With its deadline already past, a lookup is not waited for, however long the system's
    /// resolver takes (a resolver with no DNS server reachable takes seconds per attempt).
    #[test]
    fn when_the_deadline_has_passed_expect_no_wait_for_the_lookup() {
        let started = Instant::now();
        let r = resolve("pi0d-no-such-host.invalid", 80, started);
        let waited = started.elapsed();
        assert!(waited < Duration::from_secs(1), "{waited:?}: {r:?}");
    }

    /// wss:// with `ca_file = /dev/zero`: start-up is refused at once, naming the field.
    #[cfg(feature = "tls")]
    #[test]
    fn when_the_ca_file_is_dev_zero_expect_the_link_refused_naming_the_field() {
        let opts = OpenpiOptions {
            ca_file: Some("/dev/zero".into()),
            ..options("wss://127.0.0.1:9", 1.0)
        };
        let Err(e) = Websocket::new(&opts) else {
            panic!("/dev/zero taken as a CA file")
        };
        assert_eq!(
            crate::errors::Chain(&e).to_string(),
            "policy.openpi.ca_file /dev/zero: cannot read: is a character device, expected a regular file"
        );
    }
}

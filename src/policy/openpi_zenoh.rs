//! The Zenoh link of the remote policy (`policy.backend = "zenoh"`): each request is a query
//! on the servers' key (`pi0d serve --zenoh KEY`), its payload and reply the same
//! msgpack-numpy frames as openpi's websocket. The servers' queryables are complete, so
//! Zenoh's routing sends a query to one of them; when one goes away, the next query goes to
//! another. Each query has its own reply channel: a late reply is never taken for another,
//! and only a query's first reply is read.

use std::time::{Duration, Instant};

use zenoh::Wait;

use super::openpi::Link;
use super::{PolicyError, RemoteFault};
use crate::config::openpi::ZenohLinkOptions;

fn fault(fault: RemoteFault, message: impl Into<String>) -> PolicyError {
    PolicyError::Remote {
        fault,
        message: message.into(),
    }
}

pub(crate) struct ZenohLink {
    opts: ZenohLinkOptions,
    /// Largest reply taken (`policy.openpi.max_reply_mib`, as for the websocket).
    max_reply_bytes: usize,
    session: Option<zenoh::Session>,
}

impl ZenohLink {
    pub(crate) fn new(opts: &ZenohLinkOptions, max_reply_bytes: usize) -> ZenohLink {
        ZenohLink {
            opts: opts.clone(),
            max_reply_bytes,
            session: None,
        }
    }
}

/// A Zenoh configuration that connects to and listens on `connect` / `listen` (peers found
/// by multicast scouting otherwise, as Zenoh does by default).
pub(crate) fn config(connect: &[String], listen: &[String]) -> Result<zenoh::Config, ConfigError> {
    let mut c = zenoh::Config::default();
    let json = |v: &[String]| serde_json::to_string(v).unwrap_or_default();
    if !connect.is_empty() {
        c.insert_json5("connect/endpoints", &json(connect))
            .map_err(|source| ConfigError {
                what: "connect",
                source,
            })?;
    }
    if !listen.is_empty() {
        c.insert_json5("listen/endpoints", &json(listen))
            .map_err(|source| ConfigError {
                what: "listen",
                source,
            })?;
    }
    Ok(c)
}

/// Endpoints Zenoh does not take.
#[derive(Debug, thiserror::Error)]
#[error("Zenoh {what} endpoints")]
pub struct ConfigError {
    /// `connect` or `listen`.
    pub(crate) what: &'static str,
    #[source]
    pub(crate) source: zenoh::Error,
}

impl Link for ZenohLink {
    fn open(&mut self) -> Result<(), PolicyError> {
        if self.session.is_some() {
            return Ok(());
        }
        let c = config(&self.opts.connect, &self.opts.listen)
            .map_err(|e| fault(RemoteFault::Down, crate::errors::Chain(&e).to_string()))?;
        let session = zenoh::open(c)
            .wait()
            .map_err(|e| fault(RemoteFault::Down, format!("Zenoh session: {e}")))?;
        tracing::info!(key = %self.opts.key, "Zenoh session open for the policy servers");
        self.session = Some(session);
        Ok(())
    }

    fn is_open(&self) -> bool {
        self.session.is_some()
    }

    fn round_trip(&mut self, bytes: Vec<u8>, deadline: Instant) -> Result<Vec<u8>, PolicyError> {
        let timeout = deadline.saturating_duration_since(Instant::now());
        let Some(session) = &self.session else {
            return Err(fault(RemoteFault::Down, "no Zenoh session"));
        };
        let key = &self.opts.key;
        let replies = session
            .get(key.as_str())
            .payload(bytes)
            .target(zenoh::query::QueryTarget::BestMatching)
            .timeout(timeout)
            .wait()
            .map_err(|e| fault(RemoteFault::Down, format!("query on {key}: {e}")))?;
        match replies.recv_timeout(timeout + Duration::from_millis(100)) {
            Ok(Some(reply)) => match reply.result() {
                Ok(sample) => {
                    let bytes = sample.payload().to_bytes();
                    if bytes.len() > self.max_reply_bytes {
                        return Err(fault(
                            RemoteFault::Malformed,
                            format!(
                                "reply too large: {} bytes, at most {} (policy.openpi.max_reply_mib)",
                                bytes.len(),
                                self.max_reply_bytes
                            ),
                        ));
                    }
                    Ok(bytes.into_owned())
                }
                Err(e) => Err(fault(
                    RemoteFault::ServerError,
                    format!(
                        "the server answered with an error: {}",
                        String::from_utf8_lossy(&e.payload().to_bytes())
                    ),
                )),
            },
            // No server answered in time, or none matched the key.
            Ok(None) | Err(_) => Err(fault(
                RemoteFault::Timeout,
                format!(
                    "no server answered on {key} within {} s",
                    timeout.as_secs_f64()
                ),
            )),
        }
    }

    /// Queries are independent: the session stays for the next one.
    fn close(&mut self) {}
}

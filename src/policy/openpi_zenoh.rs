//! The Zenoh link of the remote policy (`policy.backend = "zenoh"`): each request is a query
//! on the servers' key (`pi0d serve --zenoh KEY`), its payload and reply the same
//! msgpack-numpy frames as openpi's websocket. The servers' queryables are complete, so
//! Zenoh's routing sends a query to one of them; when one goes away, the next query goes to
//! another. Each query has its own reply channel: a late reply is never taken for another.
//! A query is answered by its first reply alone: replies are delivered as they arrive (no
//! consolidation, which would hold them and hand over the last), and every later one, from the
//! same server or another on the key, is dropped and counted. Zenoh's own timeout marker (an
//! error "Timeout", from this session or a node on the way) is a timeout, not a server's error. The session is closed by default
//! and takes no reply larger than `policy.openpi.max_reply_mib` (`crate::zenoh_session`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use zenoh::Wait;

use super::openpi::Link;
use super::{PolicyError, RemoteFault};
use crate::config::openpi::ZenohLinkOptions;
use crate::zenoh_session;

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
    /// Replies after a query's first, dropped.
    dropped: Arc<AtomicU64>,
}

impl ZenohLink {
    pub(crate) fn new(opts: &ZenohLinkOptions, max_reply_bytes: usize) -> ZenohLink {
        ZenohLink {
            opts: opts.clone(),
            max_reply_bytes,
            session: None,
            dropped: Arc::new(AtomicU64::new(0)),
        }
    }
}

impl Link for ZenohLink {
    fn open(&mut self) -> Result<(), PolicyError> {
        if self.session.is_some() {
            return Ok(());
        }
        let (c, exposure) = zenoh_session::policy(&self.opts, self.max_reply_bytes)
            .map_err(|e| fault(RemoteFault::Down, crate::errors::Chain(&e).to_string()))?;
        let session = zenoh::open(c)
            .wait()
            .map_err(|e| fault(RemoteFault::Down, format!("Zenoh session: {e}")))?;
        if exposure.open() {
            tracing::warn!(key = %self.opts.key, session = %exposure, "Zenoh session open for the policy servers");
        } else {
            tracing::info!(key = %self.opts.key, session = %exposure, "Zenoh session open for the policy servers");
        }
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
        let (first, answer) = mpsc::sync_channel::<zenoh::query::Reply>(1);
        let first = Mutex::new(Some(first));
        let dropped = self.dropped.clone();
        session
            .get(key.as_str())
            .payload(bytes)
            .target(zenoh::query::QueryTarget::BestMatching)
            // Each reply as it comes: the first answers, the rest are counted here.
            .consolidation(zenoh::query::ConsolidationMode::None)
            .timeout(timeout)
            .callback(move |reply| {
                let taken = first.lock().ok().and_then(|mut f| f.take());
                match taken {
                    Some(tx) => {
                        let _ = tx.send(reply);
                    }
                    // Zenoh's own timeout marker after the answer is not a reply.
                    None if timeout_marker(&reply) => {}
                    None => {
                        dropped.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
            .wait()
            .map_err(|e| fault(RemoteFault::Down, format!("query on {key}: {e}")))?;
        let no_answer = || {
            fault(
                RemoteFault::Timeout,
                format!(
                    "no server answered on {key} within {} s",
                    timeout.as_secs_f64()
                ),
            )
        };
        // No server answered in time, or none matched the key (the query ended unanswered).
        let Ok(reply) = answer.recv_timeout(timeout + Duration::from_millis(100)) else {
            return Err(no_answer());
        };
        match reply.result() {
            Ok(sample) => {
                let bytes = sample.payload().to_bytes();
                // Zenoh's receive limit drops larger messages as they arrive; a reply
                // between the limit and its framing allowance ends here.
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
            // Zenoh's own timeout, from this session (no replier) or a node on the way.
            Err(_) if timeout_marker(&reply) => Err(no_answer()),
            Err(e) => Err(fault(
                RemoteFault::ServerError,
                format!(
                    "the server answered with an error: {}",
                    crate::outside::bytes(&e.payload().to_bytes())
                ),
            )),
        }
    }

    fn replies_dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// Queries are independent: the session stays for the next one.
    fn close(&mut self) {}
}

/// Zenoh's own timeout error reply: from this session (an error no replier sent), or
/// "Timeout" from a routing node whose forwarded query ran out.
fn timeout_marker(reply: &zenoh::query::Reply) -> bool {
    reply
        .result()
        .err()
        .is_some_and(|e| reply.replier_id().is_none() || *e.payload().to_bytes() == *b"Timeout")
}

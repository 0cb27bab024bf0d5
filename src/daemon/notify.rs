//! systemd's notify protocol (sd_notify(3)): datagrams to $NOTIFY_SOCKET. Sends never block:
//! a message that does not fit into the socket queue is dropped rather than stalling the
//! supervisor (which must stay free to stop the arm).

use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};

pub(crate) struct Notifier {
    socket: Option<(UnixDatagram, SocketAddr)>,
}

impl Notifier {
    /// Connects to $NOTIFY_SOCKET if systemd gave one (a path, or `@name` for the abstract
    /// namespace); otherwise every send is a no-op.
    pub(crate) fn from_env() -> Notifier {
        let socket = std::env::var_os("NOTIFY_SOCKET").and_then(|path| {
            let path = path.to_string_lossy().to_string();
            let addr = match path.strip_prefix('@') {
                Some(name) => SocketAddr::from_abstract_name(name.as_bytes()).ok()?,
                None => SocketAddr::from_pathname(&path).ok()?,
            };
            let sock = UnixDatagram::unbound().ok()?;
            sock.set_nonblocking(true).ok()?;
            Some((sock, addr))
        });
        Notifier { socket }
    }

    fn send(&self, message: &str) {
        if let Some((sock, addr)) = &self.socket {
            if let Err(e) = sock.send_to_addr(message.as_bytes(), addr) {
                tracing::debug!(error = %e, "systemd notification dropped");
            }
        }
    }

    pub(crate) fn ready(&self) {
        self.send("READY=1\n");
    }

    pub(crate) fn stopping(&self) {
        self.send("STOPPING=1\n");
    }

    pub(crate) fn watchdog(&self) {
        self.send("WATCHDOG=1\n");
    }

    pub(crate) fn status(&self, text: &str) {
        self.send(&format!("STATUS={text}\n"));
    }
}

/// The watchdog interval, following sd_watchdog_enabled(3): WATCHDOG_USEC is set, and
/// WATCHDOG_PID, if set, names this process.
pub(crate) fn watchdog_usec() -> Option<u64> {
    let usec: u64 = std::env::var("WATCHDOG_USEC").ok()?.parse().ok()?;
    match std::env::var("WATCHDOG_PID") {
        Ok(pid) if pid.parse::<u32>().ok() != Some(std::process::id()) => None,
        _ => (usec > 0).then_some(usec),
    }
}

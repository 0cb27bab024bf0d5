//! Signals while the daemon runs. SIGINT, SIGTERM, SIGQUIT, SIGXCPU and SIGPWR ask for the
//! controlled stop (decelerate to rest, summary, exit); a second one during the stop exits at
//! once with 130. Every other signal whose default action would kill the process (SIGHUP from a
//! dropped SSH session, SIGUSR1/2, timers, SIGXFSZ, real-time signals) is logged and ignored:
//! none of them may end a run without a controlled stop; nor may Ctrl-Z suspend it mid-motion
//! (SIGTSTP, SIGTTIN, SIGTTOU are ignored too). SIGPIPE is already ignored by Rust's
//! runtime (writes then fail, and `log` handles that).
//!
//! Until the handlers are in place every one of these signals would kill the process with its
//! default action (a SIGHUP 2 ms after exec: rc 129, and the fault latch then reads "killed"),
//! so `main` blocks them all first thing (`block`): one that arrives meanwhile stays pending
//! and is handled once `Signals::install` has registered the handlers and unblocked them.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use signal_hook::consts::signal::*;

const STOP: [i32; 5] = [SIGINT, SIGTERM, SIGQUIT, SIGXCPU, libc::SIGPWR];
/// Also the terminal's stop signals: a daemon suspended by Ctrl-Z mid-motion would stop
/// commanding the arm without a controlled stop.
const IGNORED: [i32; 11] = [
    SIGUSR1,
    SIGUSR2,
    SIGALRM,
    SIGVTALRM,
    SIGPROF,
    SIGIO,
    SIGXFSZ,
    libc::SIGSTKFLT,
    SIGTSTP,
    SIGTTIN,
    SIGTTOU,
];

pub struct Signals {
    /// Set by the first stop signal.
    pub(crate) stop: Arc<AtomicBool>,
    /// SIGHUPs not yet taken (a configuration reload each).
    reload: Arc<AtomicU64>,
    /// Per ignored signal (and the real-time range, counted together): deliveries not yet
    /// logged.
    pending: Vec<(i32, Arc<AtomicU64>)>,
    ignored_total: u64,
}

/// The name of a signal number, for the log.
pub(crate) fn name(sig: i32) -> String {
    match sig {
        SIGHUP => "SIGHUP".into(),
        SIGUSR1 => "SIGUSR1".into(),
        SIGUSR2 => "SIGUSR2".into(),
        SIGALRM => "SIGALRM".into(),
        SIGVTALRM => "SIGVTALRM".into(),
        SIGPROF => "SIGPROF".into(),
        SIGIO => "SIGIO".into(),
        SIGXFSZ => "SIGXFSZ".into(),
        libc::SIGSTKFLT => "SIGSTKFLT".into(),
        SIGTSTP => "SIGTSTP".into(),
        SIGTTIN => "SIGTTIN".into(),
        SIGTTOU => "SIGTTOU".into(),
        n => format!("signal {n}"),
    }
}

/// Every signal `Signals::install` handles.
fn handled() -> Vec<i32> {
    let realtime = libc::SIGRTMIN()..=libc::SIGRTMAX();
    STOP.into_iter()
        .chain([SIGHUP])
        .chain(IGNORED)
        .chain(realtime)
        .collect()
}

/// Blocks (how = `SIG_BLOCK`) or unblocks (`SIG_UNBLOCK`) the handled signals for this thread
/// (and the threads it starts from now on).
fn mask(how: libc::c_int) {
    // SAFETY: sigset_t is plain data initialized by sigemptyset before use; pthread_sigmask
    // only reads it. Errors are impossible with valid signal numbers and `how`.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for sig in handled() {
            libc::sigaddset(&mut set, sig);
        }
        libc::pthread_sigmask(how, &set, std::ptr::null_mut());
    }
}

/// Holds back every signal `Signals::install` handles, so none can kill the process before its
/// handler exists: the first thing `main` does. `install` (or `unblock`, for a command that
/// installs none) lets them through, pending ones included.
pub fn block() {
    mask(libc::SIG_BLOCK);
}

/// Lets the signals `block` held back through again, with whatever action they have.
pub fn unblock() {
    mask(libc::SIG_UNBLOCK);
}

impl Signals {
    /// Installs the handlers, then unblocks the signals (`block`): one that arrived meanwhile
    /// is handled now. A handler that cannot be installed is warned about (the signal keeps
    /// its default action).
    pub fn install() -> Signals {
        let stop = Arc::new(AtomicBool::new(false));
        for sig in STOP {
            // The second delivery while stopping exits at once; the first only sets the flag.
            let r = signal_hook::flag::register_conditional_shutdown(sig, 130, stop.clone())
                .and_then(|_| signal_hook::flag::register(sig, stop.clone()));
            if let Err(e) = r {
                tracing::warn!(signal = sig, error = %e, "cannot handle signal");
            }
        }
        let reload = Arc::new(AtomicU64::new(0));
        let r = reload.clone();
        // SAFETY: the handler only increments an atomic, which is async-signal-safe.
        if let Err(e) = unsafe {
            signal_hook::low_level::register(SIGHUP, move || {
                r.fetch_add(1, Ordering::Relaxed);
            })
        } {
            tracing::warn!(signal = SIGHUP, error = %e, "cannot handle signal");
        }
        let mut pending = Vec::new();
        let realtime = libc::SIGRTMIN()..=libc::SIGRTMAX();
        for sig in IGNORED.into_iter().chain(realtime) {
            let count = Arc::new(AtomicU64::new(0));
            let c = count.clone();
            // SAFETY: the handler only increments an atomic, which is async-signal-safe.
            let r = unsafe {
                signal_hook::low_level::register(sig, move || {
                    c.fetch_add(1, Ordering::Relaxed);
                })
            };
            match r {
                Ok(_) => pending.push((sig, count)),
                Err(e) => tracing::warn!(signal = sig, error = %e, "cannot handle signal"),
            }
        }
        unblock();
        Signals {
            stop,
            reload,
            pending,
            ignored_total: 0,
        }
    }

    /// Logs the ignored signals that arrived since the last call.
    pub(crate) fn log_ignored(&mut self) {
        for (sig, count) in &self.pending {
            let n = count.swap(0, Ordering::Relaxed);
            if n > 0 {
                self.ignored_total += n;
                tracing::warn!(signal = %name(*sig), count = n, "ignored");
            }
        }
    }

    /// Whether a SIGHUP arrived since the last call (several count as one reload).
    /// Whether a stop signal (SIGINT, SIGTERM, SIGQUIT) has arrived.
    pub fn stop_requested(&self) -> bool {
        self.stop.load(std::sync::atomic::Ordering::Relaxed)
    }

    pub(crate) fn take_reload(&self) -> bool {
        self.reload.swap(0, Ordering::Relaxed) > 0
    }

    pub(crate) fn ignored_total(&self) -> u64 {
        self.ignored_total
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A SIGHUP that arrives before the handlers exist (start-up still reading its files) is
    /// held back by `block` and handled once `install` is done; without `block` its default
    /// action would end the process (rc 129), this test binary with it.
    #[test]
    fn when_sighup_arrives_before_the_handlers_expect_it_held_then_handled() {
        // On a thread of its own: the mask is per thread, and the harness's stay as they are.
        let handled = std::thread::spawn(|| {
            block();
            // SAFETY: raise sends to the calling thread, where SIGHUP is blocked: it waits.
            unsafe { libc::raise(SIGHUP) };
            let signals = Signals::install();
            signals.take_reload()
        })
        .join()
        .expect("the thread survived its SIGHUP");
        assert!(handled, "the pending SIGHUP reached the reload handler");
    }
}

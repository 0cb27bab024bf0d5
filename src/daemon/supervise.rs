//! Supervised threads: every thread the daemon cannot do without (control, inference, ROS,
//! simulator) runs under `spawn`, which records whether it returned or panicked (with the
//! message) and carries a heartbeat the supervisor reads for liveness (see `crate::panics` for
//! the panic hook).

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

pub use crate::panics::install_panic_hook;
pub(crate) use crate::panics::{caught, panic_message};
use crate::time::MonoTime;

/// The daemon's threads, by what they do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Role {
    Control,
    Inference,
    Ros,
    Sim,
}

impl Role {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Role::Control => "control",
            Role::Inference => "inference",
            Role::Ros => "ROS",
            Role::Sim => "simulator",
        }
    }

    fn thread_name(self) -> &'static str {
        match self {
            Role::Control => "pi0d-control",
            Role::Inference => "pi0d-infer",
            Role::Ros => "pi0d-ros",
            Role::Sim => "pi0d-sim",
        }
    }
}

const RUNNING: u8 = 0;
const RETURNED: u8 = 1;
const PANICKED: u8 = 2;

/// What a supervised thread shares with the supervisor.
pub(crate) struct Heartbeat {
    last_ns: AtomicU64,
    state: AtomicU8,
    panic: Mutex<Option<String>>,
}

impl Heartbeat {
    fn new() -> Heartbeat {
        Heartbeat {
            last_ns: AtomicU64::new(MonoTime::now().as_nanos()),
            state: AtomicU8::new(RUNNING),
            panic: Mutex::new(None),
        }
    }

    /// Called by the thread on each pass of its loop.
    pub(crate) fn beat(&self) {
        self.last_ns
            .store(MonoTime::now().as_nanos(), Ordering::Relaxed);
    }

    /// Seconds since the last beat.
    fn age_s(&self, now: MonoTime) -> f64 {
        now.seconds_since(MonoTime::from_nanos(self.last_ns.load(Ordering::Relaxed)))
    }
}

/// How a supervised thread is doing.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Health {
    Alive,
    /// Its function returned (only expected at shutdown).
    Returned,
    Panicked(String),
    /// No heartbeat for this many seconds.
    Stalled(f64),
}

impl std::fmt::Display for Health {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Health::Alive => f.write_str("alive"),
            Health::Returned => f.write_str("returned unexpectedly"),
            Health::Panicked(m) => write!(f, "panicked: {m}"),
            Health::Stalled(s) => write!(f, "stopped responding ({s:.1} s without a heartbeat)"),
        }
    }
}

pub(crate) struct Supervised<T> {
    pub(crate) role: Role,
    heart: Arc<Heartbeat>,
    handle: JoinHandle<Option<T>>,
}

/// Starts `f` on a named thread under supervision.
pub(crate) fn spawn<T: Send + 'static>(
    role: Role,
    f: impl FnOnce(&Heartbeat) -> T + Send + 'static,
) -> std::io::Result<Supervised<T>> {
    let heart = Arc::new(Heartbeat::new());
    let h = heart.clone();
    let handle = std::thread::Builder::new()
        .name(role.thread_name().into())
        .spawn(move || {
            let r = catch_unwind(AssertUnwindSafe(|| f(&h)));
            match r {
                Ok(v) => {
                    h.state.store(RETURNED, Ordering::Release);
                    Some(v)
                }
                Err(p) => {
                    if let Ok(mut slot) = h.panic.lock() {
                        *slot = Some(panic_message(p.as_ref()));
                    }
                    h.state.store(PANICKED, Ordering::Release);
                    None
                }
            }
        })?;
    Ok(Supervised {
        role,
        heart,
        handle,
    })
}

impl<T> Supervised<T> {
    /// Death first; then, if `stall_after_s` is given, liveness.
    pub(crate) fn health(&self, now: MonoTime, stall_after_s: Option<f64>) -> Health {
        match self.heart.state.load(Ordering::Acquire) {
            RETURNED => Health::Returned,
            PANICKED => Health::Panicked(
                self.heart
                    .panic
                    .lock()
                    .ok()
                    .and_then(|m| m.clone())
                    .unwrap_or_default(),
            ),
            _ => {
                let age = self.heart.age_s(now);
                match stall_after_s {
                    Some(limit) if age > limit => Health::Stalled(age),
                    _ => Health::Alive,
                }
            }
        }
    }

    /// The thread as it stands: its last heartbeat while it runs (for `lifecycle`).
    pub(crate) fn beat(&self) -> super::lifecycle::Beat {
        use super::lifecycle::Beat;
        match self.health(MonoTime::now(), None) {
            Health::Returned => Beat::Returned,
            Health::Panicked(m) => Beat::Panicked(m),
            Health::Alive | Health::Stalled(_) => Beat::Alive(MonoTime::from_nanos(
                self.heart.last_ns.load(Ordering::Relaxed),
            )),
        }
    }

    pub(crate) fn is_finished(&self) -> bool {
        self.handle.is_finished()
    }

    /// The thread's result (`None` if it panicked).
    pub(crate) fn join(self) -> Option<T> {
        self.handle.join().ok().flatten()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn when_supervised_thread_panics_expect_message_recorded() {
        let t = spawn(Role::Sim, |_| -> u32 { panic!("boom {}", 7) }).unwrap();
        while !t.is_finished() {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert_eq!(
            t.health(MonoTime::now(), None),
            Health::Panicked("boom 7".into())
        );
        assert_eq!(t.join(), None);
    }

    #[test]
    fn when_thread_stops_beating_expect_stalled_then_returned() {
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let t = spawn(Role::Ros, move |h| {
            h.beat();
            let _ = rx.recv();
            5
        })
        .unwrap();
        std::thread::sleep(std::time::Duration::from_millis(30));
        assert!(matches!(
            t.health(MonoTime::now(), Some(0.01)),
            Health::Stalled(_)
        ));
        assert_eq!(t.health(MonoTime::now(), Some(10.0)), Health::Alive);
        tx.send(()).unwrap();
        while !t.is_finished() {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert_eq!(t.health(MonoTime::now(), None), Health::Returned);
        assert_eq!(t.join(), Some(5));
    }
}

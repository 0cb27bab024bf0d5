//! The policy's load and its first inference (the warm-up) on a thread of their own, watched
//! by the supervisor: a stop signal, the run's `--duration` or a dead I/O thread ends the
//! start within a supervision period whatever the load costs (a full-size checkpoint read and
//! checked, graphs built, a long first inference). Nothing has moved then: the control loop
//! starts after the load. A loader left behind ends with the process; nothing waits on it.

use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::mpsc;
use std::sync::Arc;

use super::supervise::{self, Health, Supervised};
use super::worker::WorkerStats;
use super::{DaemonError, IO_STALL_S, SUPERVISE_PERIOD};
use crate::config::Config;
use crate::io::Blackboard;
use crate::policy::Policy;
use crate::time::MonoTime;

/// What the load came to.
pub(super) enum Loaded {
    /// Loaded and warmed up (or its warm-up failed: the worker retries).
    Ready(Box<dyn Policy>),
    /// A stop signal arrived first.
    Stopped(Phase),
    /// The run's `--duration` ended first.
    DurationOver(Phase),
}

/// Where the load was.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Phase {
    Loading,
    WarmingUp,
}

impl Phase {
    pub(super) fn doing(self) -> &'static str {
        match self {
            Phase::Loading => "loading the policy",
            Phase::WarmingUp => "running the policy's first inference (warm-up)",
        }
    }

    fn from_code(c: u8) -> Phase {
        if c == 0 {
            Phase::Loading
        } else {
            Phase::WarmingUp
        }
    }
}

/// Loads the policy as `cfg` says and warms it up on the newest inputs, until done or until
/// `stop`, `ends_at` (the run's `--duration`, from the daemon's start) or the I/O thread's
/// death ends the wait.
pub(super) fn load(
    cfg: &Config,
    board: &Arc<Blackboard>,
    stats: &Arc<WorkerStats>,
    stop: &AtomicBool,
    ends_at: Option<MonoTime>,
    io: &Supervised<()>,
) -> Result<Loaded, DaemonError> {
    let (tx, rx) = mpsc::channel();
    let phase = Arc::new(AtomicU8::new(0));
    {
        let (cfg, board, stats, phase) = (cfg.clone(), board.clone(), stats.clone(), phase.clone());
        std::thread::Builder::new()
            .name("pi0d-load".into())
            .spawn(move || {
                let loaded = match supervise::caught(|| crate::policy::from_config(&cfg)) {
                    Ok(Ok(mut policy)) => {
                        phase.store(1, Ordering::SeqCst);
                        tracing::info!(policy = policy.name(), "policy loaded; warming up");
                        super::warm_up(policy.as_mut(), &cfg, &board, &stats);
                        Ok(policy)
                    }
                    Ok(Err(e)) => Err(DaemonError::Policy(e)),
                    Err(panic) => Err(DaemonError::StartupThread(
                        "policy loading",
                        format!("panicked: {panic}"),
                    )),
                };
                // The supervisor may have gone on without it.
                let _ = tx.send(loaded);
            })
            .map_err(|source| DaemonError::Spawn {
                thread: "policy loading",
                source,
            })?;
    }
    loop {
        match rx.recv_timeout(SUPERVISE_PERIOD) {
            Ok(loaded) => return loaded.map(Loaded::Ready),
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                return Err(DaemonError::StartupThread(
                    "policy loading",
                    "ended without a policy".into(),
                ))
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
        }
        let now = MonoTime::now();
        let phase = Phase::from_code(phase.load(Ordering::SeqCst));
        if stop.load(Ordering::Relaxed) {
            return Ok(Loaded::Stopped(phase));
        }
        if ends_at.is_some_and(|end| now >= end) {
            return Ok(Loaded::DurationOver(phase));
        }
        match io.health(now, Some(IO_STALL_S)) {
            Health::Alive => {}
            h => return Err(DaemonError::StartupThread(io.role.name(), h.to_string())),
        }
    }
}

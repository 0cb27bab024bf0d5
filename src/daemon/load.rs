//! The policy's load and its first inference (the warm-up) on a thread of their own, watched
//! by the supervisor: a stop signal, the run's `--duration` or a dead I/O thread ends the
//! start within a supervision period whatever the load costs (a full-size checkpoint read and
//! checked, graphs built, a long first inference). Nothing has moved then: the control loop
//! starts after the load. A loader left behind ends with the process; nothing waits on it.
//! `pi0d serve` loads its checkpoint through [`watched`] too.

use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::mpsc;
use std::sync::Arc;

use super::exit::ExitReason;
use super::summary::Summary;
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

impl Loaded {
    /// The policy, or the summary of a run that ended before it was ready (the line saying
    /// why logged): nothing moved.
    pub(super) fn into_policy(self) -> Result<Box<dyn Policy>, Box<Summary>> {
        match self {
            Loaded::Ready(p) => Ok(p),
            Loaded::Stopped(phase) => {
                tracing::info!(
                    "stop requested while {}: nothing moved; exiting without waiting for it",
                    phase.doing()
                );
                Err(Box::default())
            }
            Loaded::DurationOver(phase) => {
                tracing::error!(
                    "the run's --duration ended while {}: nothing moved; stopping",
                    phase.doing()
                );
                let exit = ExitReason::StartTimeout;
                Err(Box::new(Summary {
                    exit,
                    exit_code: exit.code(),
                    ..Summary::default()
                }))
            }
        }
    }
}

/// Where the load was.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Phase {
    Loading,
    WarmingUp,
}

impl Phase {
    fn doing(self) -> &'static str {
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

/// What waiting on work on its own thread came to.
#[derive(Debug)]
pub enum Waited<T, W> {
    /// The work's result.
    Done(T),
    /// The caller's reason to stop waiting came first.
    GaveUp(W),
}

/// The work's thread could not start, or ended without a result (it panicked).
#[derive(Debug, thiserror::Error)]
pub enum WatchError {
    #[error("cannot start the {0} thread")]
    Spawn(&'static str, #[source] std::io::Error),
    #[error("the {0} thread ended without a result")]
    Ended(&'static str),
}

/// Runs `work` on a thread named `name` and waits for its result, asking `give_up` every
/// supervision period whether to stop waiting; a thread given up on is left to end with the
/// process. What a long load or first inference runs in, so that a stop signal or a deadline
/// never waits on it.
pub fn watched<T: Send + 'static, W>(
    name: &'static str,
    work: impl FnOnce() -> T + Send + 'static,
    mut give_up: impl FnMut() -> Option<W>,
) -> Result<Waited<T, W>, WatchError> {
    let (tx, rx) = mpsc::channel();
    std::thread::Builder::new()
        .name(format!("pi0d-{name}"))
        .spawn(move || {
            // The caller may have gone on without it.
            let _ = tx.send(work());
        })
        .map_err(|e| WatchError::Spawn(name, e))?;
    loop {
        match rx.recv_timeout(SUPERVISE_PERIOD) {
            Ok(done) => return Ok(Waited::Done(done)),
            Err(mpsc::RecvTimeoutError::Disconnected) => return Err(WatchError::Ended(name)),
            Err(mpsc::RecvTimeoutError::Timeout) => {}
        }
        if let Some(why) = give_up() {
            return Ok(Waited::GaveUp(why));
        }
    }
}

/// Why the daemon stopped waiting for its policy.
enum GiveUp {
    Stop(Phase),
    Duration(Phase),
    Io(DaemonError),
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
    let phase = Arc::new(AtomicU8::new(0));
    let work = {
        let (cfg, board, stats, phase) = (cfg.clone(), board.clone(), stats.clone(), phase.clone());
        move || match supervise::caught(|| crate::policy::from_config(&cfg)) {
            Ok(Ok(mut policy)) => {
                phase.store(1, Ordering::SeqCst);
                tracing::info!(policy = policy.name(), "policy loaded; warming up");
                warm_up(policy.as_mut(), &cfg, &board, &stats);
                Ok(policy)
            }
            Ok(Err(e)) => Err(DaemonError::Policy(e)),
            Err(panic) => Err(DaemonError::StartupThread(
                "policy loading",
                format!("panicked: {panic}"),
            )),
        }
    };
    let give_up = || {
        let now = MonoTime::now();
        let phase = Phase::from_code(phase.load(Ordering::SeqCst));
        if stop.load(Ordering::Relaxed) {
            return Some(GiveUp::Stop(phase));
        }
        if ends_at.is_some_and(|end| now >= end) {
            return Some(GiveUp::Duration(phase));
        }
        match io.health(now, Some(IO_STALL_S)) {
            Health::Alive => None,
            h => Some(GiveUp::Io(DaemonError::StartupThread(
                io.role.name(),
                h.to_string(),
            ))),
        }
    };
    match watched("load", work, give_up) {
        Ok(Waited::Done(loaded)) => loaded.map(Loaded::Ready),
        Ok(Waited::GaveUp(GiveUp::Stop(phase))) => Ok(Loaded::Stopped(phase)),
        Ok(Waited::GaveUp(GiveUp::Duration(phase))) => Ok(Loaded::DurationOver(phase)),
        Ok(Waited::GaveUp(GiveUp::Io(e))) => Err(e),
        Err(WatchError::Spawn(_, source)) => Err(DaemonError::Spawn {
            thread: "policy loading",
            source,
        }),
        Err(WatchError::Ended(_)) => Err(DaemonError::StartupThread(
            "policy loading",
            "ended without a policy".into(),
        )),
    }
}

/// One inference (or a remote policy's connection) before READY: the first real chunk then
/// costs what the others do. A failure is logged, not fatal: the worker retries and the arm
/// waits as it would for any missing chunk. A failure is counted under its kind (the summary's
/// `policy_errors_by_kind`), not as a chunk: no chunk was asked for.
fn warm_up(
    policy: &mut dyn crate::policy::Policy,
    cfg: &Config,
    board: &Blackboard,
    stats: &WorkerStats,
) {
    let mut obs = crate::observation::Observation::default();
    if !board.inputs.observe(&cfg.policy.state, &mut obs) {
        return;
    }
    let started = MonoTime::now();
    match supervise::caught(|| policy.warm_up(&obs)) {
        Ok(Ok(())) => tracing::info!(
            ms = format!("{:.1}", MonoTime::now().seconds_since(started) * 1e3),
            "policy warmed up"
        ),
        Ok(Err(e)) => {
            stats.count_kind(&e);
            tracing::warn!(error = %crate::errors::Chain(&e), "policy warm-up failed; the worker retries");
        }
        Err(panic) => tracing::warn!(%panic, "policy warm-up panicked; the worker retries"),
    }
}

/// This program's resident-memory high-water mark (bytes) since it started, loads included:
/// `VmHWM` of its own address space. Not `getrusage`'s `ru_maxrss`, which also holds the
/// high-water mark of the address space the program was started from (the parent's, shared
/// until `exec`). 0 where the OS does not say.
pub fn peak_resident_bytes() -> u64 {
    let Ok(status) = std::fs::read_to_string("/proc/self/status") else {
        return 0;
    };
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb.saturating_mul(1024))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    #[test]
    fn when_asked_to_give_up_expect_the_wait_over_at_once_whatever_the_work_costs() {
        let started = Instant::now();
        let mut polls = 0;
        let waited = watched(
            "test-slow",
            || std::thread::sleep(Duration::from_secs(600)),
            || {
                polls += 1;
                (polls == 3).then_some("stop")
            },
        )
        .unwrap();
        assert!(matches!(waited, Waited::GaveUp("stop")));
        // Three supervision periods, not the work's ten minutes.
        assert!(started.elapsed() < Duration::from_secs(60));
    }

    #[test]
    fn when_the_work_ends_expect_its_result_and_a_panic_named() {
        let waited = watched("test-quick", || 7, || None::<()>).unwrap();
        assert!(matches!(waited, Waited::Done(7)));
        let panicked = watched("test-panic", || -> u8 { panic!("boom") }, || None::<()>);
        assert!(matches!(panicked, Err(WatchError::Ended("test-panic"))));
    }
}

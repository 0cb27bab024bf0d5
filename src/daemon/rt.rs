//! Real-time settings for the control and ROS threads: SCHED_FIFO, CPU affinity, mlockall. Each is tried
//! and merely warned about when the system does not permit it (no root, no CAP_SYS_NICE,
//! RLIMIT_RTPRIO/RLIMIT_MEMLOCK too low), like ros2_control does.

use std::sync::atomic::{AtomicBool, Ordering};

use crate::config::RealtimeConfig;

/// The nice value of inference, compute, decoding and recording threads: below the control and
/// ROS threads (SCHED_FIFO) and the middleware's own threads (nice 0), so a long inference
/// never delays any of them.
pub const INFERENCE_NICE: i32 = 5;

/// Puts the calling thread on the normal scheduler at `nice` (always permitted: lowering needs
/// no privilege). A thread started by a real-time one inherits its SCHED_FIFO: this undoes it.
pub fn lower_current_thread(nice: i32) {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: valid sched_param for the calling thread; gettid has no preconditions;
    // setpriority on one's own thread id.
    let rc = unsafe {
        libc::pthread_setschedparam(libc::pthread_self(), libc::SCHED_OTHER, &param);
        let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
        libc::setpriority(libc::PRIO_PROCESS, tid, nice)
    };
    if rc != 0 {
        tracing::debug!(error = %std::io::Error::last_os_error(), "nice {nice} not applied");
    }
}

/// Whether a refused real-time priority was warned about (once per process: the ROS thread's
/// refusal has the same cause as the control thread's).
static REFUSAL_WARNED: AtomicBool = AtomicBool::new(false);

/// SCHED_FIFO at `priority` for the calling thread (`thread` names it in the log); a refusal is
/// warned about once.
fn set_fifo(priority: i32, thread: &str) {
    let param = libc::sched_param {
        sched_priority: priority,
    };
    // SAFETY: valid sched_param for the calling thread.
    let rc = unsafe { libc::pthread_setschedparam(libc::pthread_self(), libc::SCHED_FIFO, &param) };
    if rc == 0 {
        tracing::info!(priority, "{thread} thread on SCHED_FIFO");
    } else if !REFUSAL_WARNED.swap(true, Ordering::Relaxed) {
        tracing::warn!(
            priority,
            error = %std::io::Error::from_raw_os_error(rc),
            "SCHED_FIFO not permitted (for the {thread} thread first): the control and ROS threads run with normal priority, with more jitter (raise LimitRTPRIO or grant CAP_SYS_NICE; realtime.priority = 0 asks for none)"
        );
    } else {
        tracing::debug!(
            priority,
            "SCHED_FIFO not permitted for the {thread} thread either"
        );
    }
}

/// The I/O thread's scheduling (the ROS node, or the simulated arm standing for the robot's
/// hardware): SCHED_FIFO below the control thread (`realtime.io_priority`), so that inference,
/// decoding and every other process never delay a command on its way out, a joint state or an
/// e-stop coming in. `thread` names it in the log.
pub(crate) fn apply_to_io_thread(cfg: &RealtimeConfig, thread: &str) {
    if cfg.io_priority > 0 {
        set_fifo(cfg.io_priority, thread);
    }
}

/// Runs `f` on a short-lived thread at the I/O priority, so that the threads `f` starts inherit
/// SCHED_FIFO (Linux threads inherit their creator's policy) and `what` names them in the log.
/// For a middleware whose own threads (RustDDS's event loop and discovery) share the writers'
/// locks with the ROS thread: at the normal priority, a loaded host held one of them off the CPU
/// while it held such a lock, and the ROS thread's writes waited behind it for 90 ms. Without an
/// I/O priority `f` runs here.
pub(crate) fn start_at_io_priority<T: Send>(
    cfg: &RealtimeConfig,
    what: &str,
    f: impl FnOnce() -> T + Send,
) -> std::io::Result<T> {
    if cfg.io_priority <= 0 {
        return Ok(f());
    }
    std::thread::scope(|s| {
        let started = std::thread::Builder::new()
            .name("pi0d-io-start".into())
            .spawn_scoped(s, || {
                apply_to_io_thread(cfg, what);
                f()
            })?;
        // `f` catches its own panics; one that escapes goes on here.
        Ok(started
            .join()
            .unwrap_or_else(|p| std::panic::resume_unwind(p)))
    })
}

/// Locks current and future memory so page faults cannot stall the control loop.
pub(crate) fn lock_memory() {
    // SAFETY: plain syscall with constant flags.
    let rc = unsafe { libc::mlockall(libc::MCL_CURRENT | libc::MCL_FUTURE) };
    if rc != 0 {
        tracing::warn!(
            error = %std::io::Error::last_os_error(),
            "mlockall failed; page faults may add latency (raise LimitMEMLOCK or run with CAP_IPC_LOCK)"
        );
    } else {
        tracing::info!("memory locked (mlockall)");
    }
}

/// Applies timer slack, priority and affinity to the calling (control) thread.
pub(crate) fn apply_to_current_thread(cfg: &RealtimeConfig) {
    // Normal threads get 50 us of timer slack: the deadline sleep would wake that late.
    // SAFETY: prctl with PR_SET_TIMERSLACK takes one integer argument.
    unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong) };
    if cfg.priority > 0 {
        set_fifo(cfg.priority, "control");
    }
    if !cfg.cpu_affinity.is_empty() {
        // SAFETY: cpu_set_t is plain data; CPU_SET bounds are checked below.
        let rc = unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            for &cpu in &cfg.cpu_affinity {
                if cpu < libc::CPU_SETSIZE as usize {
                    libc::CPU_SET(cpu, &mut set);
                }
            }
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set)
        };
        if rc != 0 {
            tracing::warn!(cpus = ?cfg.cpu_affinity, error = %std::io::Error::last_os_error(), "CPU affinity not applied");
        } else {
            tracing::info!(cpus = ?cfg.cpu_affinity, "control thread pinned");
        }
    }
}

/// The Linux PM QoS request for the CPUs' wake-up latency, held while the file stays open
/// (`/dev/cpu_dma_latency`, as cyclictest and ros2_control's real-time guide use it): an
/// idle CPU then stays out of deep C-states, whose exit latency (a millisecond and more on a
/// VM or a laptop-class board) otherwise lands on the control thread's wake-up at every tick.
/// Dropped (the request ends) when this value is dropped.
pub(crate) struct CpuLatency {
    _file: std::fs::File,
}

/// Where the kernel takes the request.
const CPU_DMA_LATENCY: &str = "/dev/cpu_dma_latency";

impl CpuLatency {
    /// Asks for at most `us` microseconds of wake-up latency; warned about (and `None`) when
    /// the system does not permit it (no such device, not root and no udev rule).
    pub(crate) fn request(us: u32) -> Option<CpuLatency> {
        Self::request_at(std::path::Path::new(CPU_DMA_LATENCY), us)
    }

    fn request_at(path: &std::path::Path, us: u32) -> Option<CpuLatency> {
        use std::io::Write;
        // The kernel reads a binary s32; it keeps the request while the descriptor is open.
        let opened = std::fs::OpenOptions::new()
            .write(true)
            .open(path)
            .and_then(|mut f| f.write_all(&(us as i32).to_ne_bytes()).map(|()| f));
        match opened {
            Ok(f) => {
                tracing::info!(
                    us,
                    "CPU wake-up latency held at {us} us while running (PM QoS, {})",
                    path.display()
                );
                Some(CpuLatency { _file: f })
            }
            Err(e) => {
                tracing::warn!(
                    error = %e,
                    "PM QoS not permitted ({}): idle CPUs may wake late, adding up to milliseconds of tick jitter on an idle host (run as root, grant write access to it, or set realtime.cpu_latency_us = -1 to not ask)",
                    path.display()
                );
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn when_latency_requested_expect_the_binary_value_written_and_held_open() {
        let dir = crate::test_dirs::TempDir::new("pmqos");
        let path = dir.join("cpu_dma_latency");
        std::fs::write(&path, b"").unwrap();
        let held = CpuLatency::request_at(&path, 7).expect("writable");
        assert_eq!(std::fs::read(&path).unwrap(), 7i32.to_ne_bytes());
        drop(held);
        assert!(CpuLatency::request_at(&dir.join("missing/none"), 0).is_none());
    }
}

//! `[realtime]`: scheduling of the control and ROS threads. Settings the system refuses are warned about
//! at start-up, not errors (see `daemon::rt`).

use super::check::Check;
use super::raw::RawRealtime;
use super::ConfigError;

#[derive(Clone, Debug, Default)]
pub struct RealtimeConfig {
    /// SCHED_FIFO priority for the control thread; 0 keeps the normal scheduler.
    pub priority: i32,
    /// SCHED_FIFO priority for the ROS thread (commands out, joint states and e-stop in),
    /// below `priority`; 0 keeps the normal scheduler.
    pub io_priority: i32,
    pub cpu_affinity: Vec<usize>,
    pub lock_memory: bool,
    /// Busy-wait this long before each deadline instead of sleeping (0: sleep only).
    pub spin_us: f64,
}

/// The ROS thread's default priority: this much below the control thread's.
const IO_BELOW_CONTROL: i32 = 10;

pub fn validate(c: &Check, r: &RawRealtime, rate_hz: f64) -> Result<RealtimeConfig, ConfigError> {
    // Priorities, CPUs and spin_us are within their ranges (`ranges::RANGES`).
    let io_priority = r
        .io_priority
        .unwrap_or((r.priority - IO_BELOW_CONTROL).max(0));
    // The control loop must never wait for the ROS thread.
    if io_priority > 0 && io_priority >= r.priority {
        return c.fail(
            "realtime.io_priority",
            format!(
                "{io_priority} is not below realtime.priority = {}: the ROS thread must never preempt the control thread (set it lower, or 0)",
                r.priority
            ),
        );
    }
    Ok(RealtimeConfig {
        priority: r.priority,
        io_priority,
        cpu_affinity: r.cpu_affinity.clone(),
        lock_memory: r.lock_memory,
        // A quarter of the control period at most: spinning longer would starve other threads.
        spin_us: c.in_range(
            "realtime.spin_us",
            r.spin_us,
            0.0,
            0.25e6 / rate_hz,
            "µs (a quarter of the control period)",
        )?,
    })
}

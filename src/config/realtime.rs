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
    pub(crate) cpu_affinity: Vec<usize>,
    pub lock_memory: bool,
    /// Busy-wait this long before each deadline instead of sleeping (0: sleep only).
    pub spin_us: f64,
    /// The CPUs' wake-up latency asked for while running (PM QoS), us; `None`: not asked.
    pub cpu_latency_us: Option<u32>,
}

/// The ROS thread's default priority: this much below the control thread's.
const IO_BELOW_CONTROL: i32 = 10;

pub(crate) fn validate(
    c: &Check,
    r: &RawRealtime,
    rate_hz: f64,
) -> Result<RealtimeConfig, ConfigError> {
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
    // Above a control period the request would not help the loop; -1 leaves it to the system.
    let max_latency_us = (1e6 / rate_hz) as i64;
    if !(-1..=max_latency_us).contains(&r.cpu_latency_us) {
        return c.fail(
            "realtime.cpu_latency_us",
            format!(
                "expected -1 (not asked) or 0 to {max_latency_us} us (one control period), found {}",
                r.cpu_latency_us
            ),
        );
    }
    Ok(RealtimeConfig {
        cpu_latency_us: u32::try_from(r.cpu_latency_us).ok(),
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

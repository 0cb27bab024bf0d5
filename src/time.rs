//! Monotonic time in nanoseconds (CLOCK_MONOTONIC), the single time base inside the daemon.
//!
//! Capture stamps, chunk step times and control deadlines are all `MonoTime`, so comparing them
//! never mixes wall-clock and monotonic time. Transports convert foreign stamps at the edge.

use std::fmt;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A point on the monotonic clock, in nanoseconds since an arbitrary origin (boot).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct MonoTime(u64);

impl MonoTime {
    pub const ZERO: MonoTime = MonoTime(0);

    pub fn now() -> MonoTime {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC always exists on Linux.
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
        MonoTime(ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64)
    }

    pub const fn from_nanos(ns: u64) -> MonoTime {
        MonoTime(ns)
    }

    pub(crate) const fn as_nanos(self) -> u64 {
        self.0
    }

    /// Signed difference `self - earlier` in seconds.
    pub(crate) fn seconds_since(self, earlier: MonoTime) -> f64 {
        (self.0 as i128 - earlier.0 as i128) as f64 * 1e-9
    }

    pub(crate) fn saturating_sub(self, d: Duration) -> MonoTime {
        MonoTime(self.0.saturating_sub(d.as_nanos() as u64))
    }

    /// `self + secs`, saturating at the origin and at the end of time (a huge or infinite
    /// offset is a deadline never reached, not one already past; NaN is no offset).
    pub fn offset_seconds(self, secs: f64) -> MonoTime {
        // The float-to-int cast saturates; the sum must too.
        let ns = (self.0 as i128).saturating_add((secs * 1e9).round() as i128);
        MonoTime(ns.clamp(0, u64::MAX as i128) as u64)
    }
}

/// Unix (wall-clock) time minus monotonic time, in nanoseconds: one offset for the process.
///
/// Every conversion between the two clocks (ROS stamps in, recorded and published stamps out)
/// uses this one offset, so a stamp taken in and written back out is the stamp that came in. A
/// map measured per thread would differ by however long a thread was preempted between its two
/// readings: milliseconds on a busy machine, enough to misplace every recorded frame. It moves
/// only when the wall clock is stepped (`remeasure_wall_offset`).
pub(crate) fn wall_minus_mono_ns() -> i128 {
    offset_cell().load(Ordering::Relaxed) as i128
}

/// Measures the offset again and takes it when the wall clock was stepped since (an NTP step
/// once a board without a real-time clock finds the network, a person setting the date, a
/// leap second): the step in seconds. Slewing moves both clocks alike and is no step. Without
/// this, after a step every sender's stamp would look that far off for the rest of the run.
pub(crate) fn remeasure_wall_offset() -> Option<f64> {
    let cell = offset_cell();
    let old = cell.load(Ordering::Relaxed);
    let new = stepped(old, measure_wall_offset())?;
    cell.store(new, Ordering::Relaxed);
    Some((new - old) as f64 * 1e-9)
}

fn offset_cell() -> &'static AtomicI64 {
    static OFFSET: OnceLock<AtomicI64> = OnceLock::new();
    OFFSET.get_or_init(|| AtomicI64::new(measure_wall_offset().1))
}

/// The new offset if `measured` (the gap between its pair's monotonic readings, the offset)
/// shows a step from `old`: more than `STEP_NS` apart, from a pair tight enough to tell (one
/// preempted between its readings is no step).
fn stepped(old: i64, (gap_ns, offset): (u64, i64)) -> Option<i64> {
    (gap_ns <= MAX_PAIR_GAP_NS && offset.abs_diff(old) > STEP_NS).then_some(offset)
}

/// A change of the offset taken as a step of the wall clock.
const STEP_NS: u64 = 1_000_000;
/// The widest pair of readings a step is judged from.
const MAX_PAIR_GAP_NS: u64 = 100_000;
/// Paired readings taken for one measurement; the tightest pair is kept.
const CLOCK_READINGS: usize = 16;

/// A wall reading between two monotonic ones, the pair with the smallest gap, at its midpoint:
/// (that gap, wall - monotonic), nanoseconds.
fn measure_wall_offset() -> (u64, i64) {
    let mut best = (u64::MAX, 0i64);
    for _ in 0..CLOCK_READINGS {
        let before = MonoTime::now().0;
        let wall = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as i64);
        let after = MonoTime::now().0;
        if after - before < best.0 {
            let mid = before / 2 + after / 2;
            best = (after - before, wall - mid as i64);
        }
    }
    best
}

impl std::ops::Add<Duration> for MonoTime {
    type Output = MonoTime;
    fn add(self, d: Duration) -> MonoTime {
        MonoTime(self.0 + d.as_nanos() as u64)
    }
}

impl fmt::Debug for MonoTime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:.6}s", self.0 as f64 * 1e-9)
    }
}

/// Sleeps until the absolute monotonic `deadline` (no drift from relative sleeps).
pub(crate) fn sleep_until(deadline: MonoTime) {
    let ts = libc::timespec {
        tv_sec: (deadline.0 / 1_000_000_000) as libc::time_t,
        tv_nsec: (deadline.0 % 1_000_000_000) as libc::c_long,
    };
    loop {
        // SAFETY: valid timespec; a null remainder is allowed with TIMER_ABSTIME.
        let rc = unsafe {
            libc::clock_nanosleep(
                libc::CLOCK_MONOTONIC,
                libc::TIMER_ABSTIME,
                &ts,
                std::ptr::null_mut(),
            )
        };
        if rc != libc::EINTR {
            break;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn when_the_wall_clock_is_stepped_expect_the_new_offset_and_nothing_else_moves_it() {
        let old = 1_796_400_000_000_000_000i64;
        // The same offset, or within a millisecond of it (two measurements differ by
        // microseconds): no step.
        assert_eq!(stepped(old, (80, old)), None);
        assert_eq!(stepped(old, (80, old + 999_999)), None);
        assert_eq!(stepped(old, (80, old - 1_000_000)), None);
        // Stepped, forward or back (an NTP step after boot is years; a leap second one).
        assert_eq!(stepped(old, (80, old + 1_000_001)), Some(old + 1_000_001));
        assert_eq!(
            stepped(old, (100_000, old - 86_400_000_000_000)),
            Some(old - 86_400_000_000_000)
        );
        // A measurement preempted between its readings tells nothing.
        assert_eq!(stepped(old, (100_001, old + 5_000_000_000)), None);
        assert_eq!(stepped(old, (u64::MAX, 0)), None);
    }

    #[test]
    fn when_the_offset_is_measured_expect_the_wall_clock_on_the_monotonic_one() {
        let (gap, offset) = measure_wall_offset();
        assert!(
            gap < 10_000_000,
            "the tightest of 16 pairs was {gap} ns wide"
        );
        let wall = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_nanos() as i128;
        let mapped = MonoTime::now().0 as i128 + wall_minus_mono_ns();
        assert!((mapped - wall).abs() < 50_000_000, "{mapped} vs {wall}");
        assert!((offset as i128 - wall_minus_mono_ns()).abs() < 50_000_000);
    }

    #[test]
    fn when_sleeping_until_deadline_expect_wake_at_or_after_it() {
        let deadline = MonoTime::now() + Duration::from_millis(3);
        sleep_until(deadline);
        assert!(MonoTime::now() >= deadline);
    }

    #[test]
    fn seconds_since_is_signed() {
        let a = MonoTime::from_nanos(2_000_000_000);
        let b = MonoTime::from_nanos(500_000_000);
        assert!((a.seconds_since(b) - 1.5).abs() < 1e-12);
        assert!((b.seconds_since(a) + 1.5).abs() < 1e-12);
        assert_eq!(b.offset_seconds(-1.0), MonoTime::ZERO);
    }

    #[test]
    fn when_offset_is_huge_expect_saturation_not_overflow() {
        let t = MonoTime::from_nanos(5_000_000_000);
        for big in [1e308, f64::INFINITY, 1e19] {
            assert_eq!(
                t.offset_seconds(big),
                MonoTime::from_nanos(u64::MAX),
                "{big}"
            );
        }
        assert_eq!(t.offset_seconds(-1e308), MonoTime::ZERO);
        assert_eq!(t.offset_seconds(f64::NAN), t);
    }
}

//! Time at the ROS edge: stamps between the ROS (wall) clock and pi0d's monotonic one, and what
//! the ROS thread measures about its inputs' timing (latency, the senders' clock offsets).

use super::decode::InputError;
use super::msgs;
use crate::time::MonoTime;

/// Stamps from ROS (wall clock) to the monotonic clock and back, in integer nanoseconds on the
/// process's one wall-clock offset (`time::wall_minus_mono_ns`, read at each conversion so that
/// a step of the wall clock is followed): a stamp converted in and out again is the stamp that
/// came in.
#[derive(Debug)]
pub(crate) struct ClockMap {
    _one_offset: (),
}

impl ClockMap {
    pub(crate) fn now() -> ClockMap {
        ClockMap { _one_offset: () }
    }

    /// A ROS stamp on the monotonic clock. Refused: nanoseconds out of range, and stamps before
    /// the monotonic origin (they would all collapse onto `MonoTime::ZERO`, which means "never").
    pub(crate) fn to_mono(&self, t: &msgs::Time) -> Result<MonoTime, InputError> {
        if t.nanosec >= 1_000_000_000 {
            return Err(InputError::BadNanosec {
                sec: t.sec,
                nanosec: t.nanosec,
            });
        }
        let mono_ns =
            t.sec as i128 * 1_000_000_000 + t.nanosec as i128 - crate::time::wall_minus_mono_ns();
        if mono_ns < 1 {
            return Err(InputError::StampBeforeOrigin {
                sec: t.sec,
                nanosec: t.nanosec,
            });
        }
        Ok(MonoTime::from_nanos(mono_ns.min(u64::MAX as i128) as u64))
    }

    pub(crate) fn to_ros(&self, t: MonoTime) -> msgs::Time {
        msgs::Time::from_nanos(t.as_nanos() as i128 + crate::time::wall_minus_mono_ns())
    }
}

/// The last latencies of one input (seconds), summarized once a second for the diagnostics.
/// Its buffer is sized once; recording allocates nothing.
pub(crate) struct LatencyWindow {
    samples: std::collections::VecDeque<f64>,
    sorted: Vec<f64>,
}

/// Samples a latency window keeps (a few seconds of a 30 Hz camera).
const LATENCY_WINDOW: usize = 256;

impl Default for LatencyWindow {
    fn default() -> Self {
        LatencyWindow {
            samples: std::collections::VecDeque::with_capacity(LATENCY_WINDOW),
            sorted: Vec::with_capacity(LATENCY_WINDOW),
        }
    }
}

impl LatencyWindow {
    pub(crate) fn record(&mut self, seconds: f64) {
        if !seconds.is_finite() {
            return;
        }
        if self.samples.len() == LATENCY_WINDOW {
            self.samples.pop_front();
        }
        self.samples.push_back(seconds);
    }

    /// `(p50, p99, max)` in milliseconds, once there is a sample.
    pub(crate) fn summary_ms(&mut self) -> Option<(f64, f64, f64)> {
        if self.samples.is_empty() {
            return None;
        }
        self.sorted.clear();
        self.sorted.extend(self.samples.iter().copied());
        self.sorted.sort_by(f64::total_cmp);
        let at = |q: f64| self.sorted[((self.sorted.len() - 1) as f64 * q).round() as usize] * 1e3;
        Some((at(0.5), at(0.99), at(1.0)))
    }
}

/// Estimates a sender's clock offset from pi0d's: the smallest (arrival - stamp) over a window
/// of samples is the offset plus the shortest transport delay. Far from zero, the sender's clock
/// (or its stamping) is off, and the watchdogs, which trust capture stamps, will see its data as
/// stale or from the future.
pub(crate) struct SkewEstimator {
    window: usize,
    seen: usize,
    current_min: f64,
    /// The last completed window's minimum, seconds.
    pub(crate) offset_s: Option<f64>,
}

/// Offsets beyond these are reported as clock skew (seconds; negative: sender ahead).
pub(crate) const SKEW_WARN_BEHIND_S: f64 = 0.1;
pub(crate) const SKEW_WARN_AHEAD_S: f64 = -0.02;

impl SkewEstimator {
    pub(crate) fn new(window: usize) -> SkewEstimator {
        SkewEstimator {
            window: window.max(1),
            seen: 0,
            current_min: f64::INFINITY,
            offset_s: None,
        }
    }

    /// Records one sample; returns the new estimate when a window completes.
    pub(crate) fn observe(&mut self, arrival: MonoTime, stamp: MonoTime) -> Option<f64> {
        self.current_min = self.current_min.min(arrival.seconds_since(stamp));
        self.seen += 1;
        if self.seen < self.window {
            return None;
        }
        self.offset_s = Some(self.current_min);
        self.seen = 0;
        self.current_min = f64::INFINITY;
        self.offset_s
    }

    pub(crate) fn skewed(offset_s: f64) -> bool {
        !(SKEW_WARN_AHEAD_S..=SKEW_WARN_BEHIND_S).contains(&offset_s)
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn when_a_stamp_goes_in_and_out_on_any_thread_expect_the_stamp_that_came_in() {
        // The ROS thread, the camera thread and the recorder each make a map: they must be the
        // same one, or a recorded frame's stamp is not the frame's.
        let here = ClockMap::now();
        let there = std::thread::spawn(ClockMap::now).join().unwrap();
        let now = here.to_ros(MonoTime::now());
        for (dsec, nanosec) in [(0, 0), (-3, 1), (-1, 999_999_999), (0, 123_456_789), (2, 7)] {
            let t = msgs::Time {
                sec: now.sec + dsec,
                nanosec,
            };
            assert_eq!(there.to_ros(here.to_mono(&t).unwrap()), t);
        }
        // And with the wall clock: a stamp of now maps to about now.
        let t = MonoTime::now();
        let wall = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        assert!((here.to_ros(t).as_seconds() - wall).abs() < 5e-3);
    }

    #[test]
    fn when_a_stamp_is_malformed_or_before_the_origin_expect_it_refused() {
        let map = ClockMap::now();
        let bad = msgs::Time {
            sec: 5,
            nanosec: 1_000_000_000,
        };
        assert!(matches!(
            map.to_mono(&bad),
            Err(InputError::BadNanosec { .. })
        ));
        let early = msgs::Time { sec: 0, nanosec: 0 };
        assert!(matches!(
            map.to_mono(&early),
            Err(InputError::StampBeforeOrigin { .. })
        ));
    }

    use super::*;

    #[test]
    fn latency_window_summarizes_the_last_samples() {
        let mut w = LatencyWindow::default();
        assert_eq!(w.summary_ms(), None);
        for i in 0..1000 {
            w.record(i as f64 * 1e-3);
        }
        w.record(f64::NAN);
        // Only the last 256 (744..=999 ms) count.
        let (p50, p99, max) = w.summary_ms().unwrap();
        assert!(
            (p50 - 872.0).abs() < 0.5 && (p99 - 996.0).abs() < 0.5,
            "{p50} {p99}"
        );
        assert!((max - 999.0).abs() < 1e-9);
    }

    #[test]
    fn when_sender_clock_lags_expect_offset_estimated_and_flagged() {
        let mut e = SkewEstimator::new(4);
        let t0 = MonoTime::from_nanos(10_000_000_000);
        let mut est = None;
        // Stamps 1.5 s behind arrival, with 1-3 ms of transport delay on top.
        for (i, delay) in [0.003, 0.001, 0.002, 0.0015].iter().enumerate() {
            let arrival = t0.offset_seconds(i as f64 * 0.01);
            est = e.observe(arrival, arrival.offset_seconds(-1.5 - delay));
        }
        let o = est.unwrap();
        assert!((o - 1.501).abs() < 1e-6, "{o}");
        assert!(SkewEstimator::skewed(o));
        assert!(!SkewEstimator::skewed(0.004));
    }
}

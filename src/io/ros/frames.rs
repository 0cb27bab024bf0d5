//! The camera thread: takes each camera's newest message and decodes it into the blackboard,
//! so that neither taking a large sample (a 921 KB raw frame) nor decoding a JPEG ever delays
//! the next command on the ROS thread. Only the newest frame of each camera matters: older
//! ones waiting are dropped undecoded.
//!
//! Taking and decoding run under `log::guarded`, as on the ROS thread: a decoder that panics
//! costs that frame, is reported and counted. A camera thread that stops making progress
//! leaves the frames stale, and the camera watchdog holds the arm.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::decode::{self, ClockMap, LatencyWindow, SkewEstimator};
use super::intake::{newest, Report};
use super::log::{guarded, RateLimitedLog, TopicId, WarnKind};
use super::CameraSub;
use crate::io::Blackboard;
use crate::time::MonoTime;

/// How often the camera thread looks for new frames (a 30 Hz camera waits at most this much
/// longer for its frame to be decoded).
const POLL: Duration = Duration::from_millis(1);

/// What the camera thread measured, for the diagnostics.
#[derive(Clone, Debug, Default)]
pub(super) struct FrameStats {
    /// Per camera: capture-to-decoded latency `(p50, p99, max)` in ms, once frames arrived.
    pub(crate) latency_ms: Vec<Option<(f64, f64, f64)>>,
    /// Per camera: its sender's clock offset estimate.
    pub(crate) clock_offsets_s: Vec<Option<f64>>,
    /// Frames refused, and of those the ones whose decoder (or deserializer) panicked.
    pub(crate) rejected: u64,
    pub(crate) faults: u64,
}

impl FrameStats {
    /// Nothing measured yet for `cameras` cameras.
    pub(crate) fn new(cameras: usize) -> FrameStats {
        FrameStats {
            latency_ms: vec![None; cameras],
            clock_offsets_s: vec![None; cameras],
            ..FrameStats::default()
        }
    }
}

/// What one camera's frames measure.
struct CameraTiming {
    latency: LatencyWindow,
    /// Its sender's clock against ours (a few seconds of frames per estimate).
    skew: SkewEstimator,
}

/// The camera thread's state: the subscriptions it owns and what it measures.
pub(super) struct Cameras<'a> {
    subs: Vec<CameraSub>,
    board: &'a Blackboard,
    clock: ClockMap,
    max_bytes: usize,
    report: Report,
    topics: Vec<TopicId>,
    timing: Vec<CameraTiming>,
    stats: Arc<Mutex<FrameStats>>,
}

impl<'a> Cameras<'a> {
    /// `subs` in the order of `names` (their topics).
    pub(crate) fn new(
        subs: Vec<CameraSub>,
        names: &[String],
        board: &'a Blackboard,
        max_bytes: usize,
        stats: Arc<Mutex<FrameStats>>,
    ) -> Cameras<'a> {
        let mut log = RateLimitedLog::new(Duration::from_secs(5));
        Cameras {
            topics: names.iter().map(|c| log.topic(c)).collect(),
            timing: names
                .iter()
                .map(|_| CameraTiming {
                    latency: LatencyWindow::default(),
                    skew: SkewEstimator::new(30),
                })
                .collect(),
            subs,
            board,
            clock: ClockMap::now(),
            max_bytes,
            report: Report::new(log),
            stats,
        }
    }

    /// Takes and decodes frames until `stop`.
    pub(crate) fn run(mut self, stop: &AtomicBool) {
        let mut next_summary = Instant::now();
        while !stop.load(Ordering::Relaxed) {
            self.poll();
            if Instant::now() >= next_summary {
                next_summary = Instant::now() + Duration::from_secs(1);
                self.report.log.flush();
            }
            std::thread::sleep(POLL);
        }
        self.publish_stats();
        self.report.log.flush();
    }

    /// Each camera's newest frame, decoded into the blackboard.
    pub(crate) fn poll(&mut self) {
        let now = MonoTime::now();
        let mut any = false;
        for k in 0..self.subs.len() {
            let (topic, cap, clock, report) = (
                self.topics[k],
                self.max_bytes,
                &self.clock,
                &mut self.report,
            );
            let decoded = match &self.subs[k] {
                CameraSub::Raw(sub) => newest(sub.as_ref(), topic, report)
                    .map(|m| guarded(|| decode::image(&m, clock, now, cap))),
                CameraSub::Compressed(sub) => newest(sub.as_ref(), topic, report)
                    .map(|m| guarded(|| decode::compressed_image(&m, clock, now, cap))),
            };
            let Some(decoded) = decoded else { continue };
            any = true;
            match decoded {
                Ok(Ok(frame)) => {
                    let timing = &mut self.timing[k];
                    timing
                        .latency
                        .record(MonoTime::now().seconds_since(frame.stamp));
                    if let Some(o) = timing.skew.observe(now, frame.stamp) {
                        if SkewEstimator::skewed(o) {
                            report.warn(topic, WarnKind::ClockSkew, &format_args!("stamps are {o:.3} s behind arrival at best: clock skew between the camera's sender and pi0d (check NTP/PTP)"));
                        }
                    }
                    self.board.inputs.publish_frame(k, frame);
                }
                Ok(Err(e)) => report.refuse(topic, &e),
                Err(f) => report.fault(topic, &f),
            }
        }
        if any {
            self.publish_stats();
        }
    }

    fn publish_stats(&mut self) {
        let latency_ms = self
            .timing
            .iter_mut()
            .map(|t| t.latency.summary_ms())
            .collect();
        let clock_offsets_s = self.timing.iter().map(|t| t.skew.offset_s).collect();
        if let Ok(mut s) = self.stats.lock() {
            *s = FrameStats {
                latency_ms,
                clock_offsets_s,
                rejected: self.report.rejected,
                faults: self.report.faults,
            };
        }
    }
}

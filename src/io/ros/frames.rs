//! Camera frames decoded on a thread of their own. The ROS thread only takes each camera's
//! newest message and hands it over, so decoding a JPEG (milliseconds at 640x480) never delays
//! the next command. Only the newest frame of each camera matters: one not yet decoded when a
//! newer one arrives is dropped.
//!
//! Decoding runs under `log::guarded`, as on the ROS thread: a decoder that panics costs that
//! frame, is reported and counted. A decoding thread that stops making progress leaves the
//! frames stale, and the camera watchdog holds the arm.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use super::decode::{self, ClockMap, LatencyWindow, SkewEstimator};
use super::log::{guarded, RateLimitedLog, TopicId, WarnKind};
use super::msgs;
use crate::io::Blackboard;
use crate::time::MonoTime;

/// A camera message as taken from its topic, not decoded yet.
pub(super) enum RawFrame {
    Raw(msgs::Image),
    Compressed(msgs::CompressedImage),
}

/// What the decoding thread measured, for the diagnostics.
#[derive(Clone, Debug, Default)]
pub(super) struct FrameStats {
    /// Per camera: capture-to-decoded latency `(p50, p99, max)` in ms, once frames arrived.
    pub latency_ms: Vec<Option<(f64, f64, f64)>>,
    /// Per camera: its sender's clock offset estimate.
    pub clock_offsets_s: Vec<Option<f64>>,
    /// Frames refused, and of those the ones whose decoder panicked.
    pub rejected: u64,
    pub faults: u64,
}

/// Between the ROS thread and the decoding thread: one slot per camera.
pub(super) struct Handoff {
    slots: Mutex<Vec<Option<(RawFrame, MonoTime)>>>,
    ready: Condvar,
    closed: AtomicBool,
    stats: Mutex<FrameStats>,
}

impl Handoff {
    pub fn new(cameras: usize) -> Handoff {
        Handoff {
            slots: Mutex::new((0..cameras).map(|_| None).collect()),
            ready: Condvar::new(),
            closed: AtomicBool::new(false),
            stats: Mutex::new(FrameStats {
                latency_ms: vec![None; cameras],
                clock_offsets_s: vec![None; cameras],
                ..FrameStats::default()
            }),
        }
    }

    /// Camera `k`'s newest message, taken at `now` (replacing one not decoded yet).
    pub fn put(&self, k: usize, frame: RawFrame, now: MonoTime) {
        if let Ok(mut slots) = self.slots.lock() {
            if let Some(slot) = slots.get_mut(k) {
                *slot = Some((frame, now));
            }
        }
        self.ready.notify_one();
    }

    /// No more frames: the decoding thread ends.
    pub fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        self.ready.notify_all();
    }

    pub fn stats(&self) -> FrameStats {
        self.stats.lock().map(|s| s.clone()).unwrap_or_default()
    }

    /// The waiting frames (waiting up to `wait` for one); `None` once closed.
    fn take(&self, wait: Duration) -> Option<Vec<(usize, RawFrame, MonoTime)>> {
        let mut slots = self.slots.lock().ok()?;
        if slots.iter().all(Option::is_none) && !self.closed.load(Ordering::SeqCst) {
            slots = self.ready.wait_timeout(slots, wait).ok()?.0;
        }
        let taken: Vec<_> = slots
            .iter_mut()
            .enumerate()
            .filter_map(|(k, s)| s.take().map(|(f, t)| (k, f, t)))
            .collect();
        if taken.is_empty() && self.closed.load(Ordering::SeqCst) {
            return None;
        }
        Some(taken)
    }
}

/// What the decoder measures about one camera's frames.
struct CameraTiming {
    latency: LatencyWindow,
    /// Its sender's clock against ours (a few seconds of frames per estimate).
    skew: SkewEstimator,
}

/// The decoding side: decodes each handed-over frame into the blackboard.
pub(super) struct Decoder<'a> {
    handoff: Arc<Handoff>,
    board: &'a Blackboard,
    clock: ClockMap,
    max_bytes: usize,
    log: RateLimitedLog,
    topics: Vec<TopicId>,
    timing: Vec<CameraTiming>,
    rejected: u64,
    faults: u64,
}

impl<'a> Decoder<'a> {
    pub fn new(
        handoff: Arc<Handoff>,
        board: &'a Blackboard,
        cameras: &[String],
        max_bytes: usize,
    ) -> Decoder<'a> {
        let mut log = RateLimitedLog::new(Duration::from_secs(5));
        Decoder {
            topics: cameras.iter().map(|c| log.topic(c)).collect(),
            timing: cameras
                .iter()
                .map(|_| CameraTiming {
                    latency: LatencyWindow::default(),
                    skew: SkewEstimator::new(30),
                })
                .collect(),
            handoff,
            board,
            clock: ClockMap::now(),
            max_bytes,
            log,
            rejected: 0,
            faults: 0,
        }
    }

    /// Decodes frames until the handoff is closed.
    pub fn run(mut self) {
        let mut next_summary = Instant::now();
        while let Some(frames) = self.handoff.take(Duration::from_millis(50)) {
            let any = !frames.is_empty();
            for (k, frame, taken) in frames {
                self.decode(k, frame, taken);
            }
            if any || Instant::now() >= next_summary {
                self.publish_stats();
            }
            if Instant::now() >= next_summary {
                next_summary = Instant::now() + Duration::from_secs(1);
                self.log.flush();
            }
        }
        self.publish_stats();
        self.log.flush();
    }

    /// Decodes what is waiting now, without waiting (when no thread could be started for it).
    pub fn decode_waiting(&mut self) {
        if let Some(frames) = self.handoff.take(Duration::ZERO) {
            for (k, frame, taken) in frames {
                self.decode(k, frame, taken);
            }
            self.publish_stats();
        }
    }

    fn decode(&mut self, k: usize, frame: RawFrame, taken: MonoTime) {
        let (topic, clock, cap) = (self.topics[k], &self.clock, self.max_bytes);
        let decoded = match &frame {
            RawFrame::Raw(m) => guarded(|| decode::image(m, clock, taken, cap)),
            RawFrame::Compressed(m) => guarded(|| decode::compressed_image(m, clock, taken, cap)),
        };
        match decoded {
            Ok(Ok(frame)) => {
                let timing = &mut self.timing[k];
                timing
                    .latency
                    .record(MonoTime::now().seconds_since(frame.stamp));
                if let Some(o) = timing.skew.observe(taken, frame.stamp) {
                    if SkewEstimator::skewed(o) {
                        self.log.warn(topic, WarnKind::ClockSkew, &format_args!("stamps are {o:.3} s behind arrival at best: clock skew between the camera's sender and pi0d (check NTP/PTP)"));
                    }
                }
                self.board.publish_frame(k, frame);
            }
            Ok(Err(e)) => {
                self.rejected += 1;
                self.log.warn(topic, WarnKind::Input(e.kind()), &e);
            }
            Err(f) => {
                self.rejected += 1;
                self.faults += 1;
                self.log.warn(topic, WarnKind::DecoderFault, &f);
            }
        }
    }

    fn publish_stats(&mut self) {
        let latency_ms = self
            .timing
            .iter_mut()
            .map(|t| t.latency.summary_ms())
            .collect();
        let clock_offsets_s = self.timing.iter().map(|t| t.skew.offset_s).collect();
        if let Ok(mut s) = self.handoff.stats.lock() {
            *s = FrameStats {
                latency_ms,
                clock_offsets_s,
                rejected: self.rejected,
                faults: self.faults,
            };
        }
    }
}

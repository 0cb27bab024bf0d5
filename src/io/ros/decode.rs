//! Turning ROS messages into pi0d's inputs (and commands into messages). Every malformed input
//! is refused with a reason naming what was wrong; the caller logs it (rate-limited) and the
//! watchdogs see the source as stale. Kept apart from the node so it is tested without DDS.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use super::msgs;
use crate::joints::JointMeasurement;
use crate::joints::{JointVector, MotionState};
use crate::policy::{CameraFrame, PixelFormat};
use crate::time::MonoTime;

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum InputError {
    #[error("{names} names but {positions} positions")]
    LengthMismatch { names: usize, positions: usize },
    #[error("joint `{joint}` position is {value}")]
    NonFinite { joint: String, value: f64 },
    #[error("stamp {ahead_s:.3} s in the future (clock skew between sender and pi0d?)")]
    FutureStamp { ahead_s: f64 },
    #[error("unsupported image encoding `{0}` (rgb8, bgr8, mono8, rgba8, bgra8)")]
    Encoding(String),
    #[error("image {width}x{height} {encoding}: step {step} x height {height} = {need} bytes, data has {have}")]
    ImageSize {
        width: u32,
        height: u32,
        encoding: String,
        step: u32,
        need: usize,
        have: usize,
    },
    #[error("image of {bytes} bytes exceeds the cap of {cap}")]
    TooLarge { bytes: usize, cap: usize },
    #[error("compressed image: {0}")]
    Compressed(String),
}

/// Stamps from ROS (wall clock) to the monotonic clock and back, from one reading of both.
pub struct ClockMap {
    /// wall - monotonic, seconds.
    offset_s: f64,
}

impl ClockMap {
    pub fn now() -> ClockMap {
        let wall = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        ClockMap {
            offset_s: wall - MonoTime::now().as_nanos() as f64 * 1e-9,
        }
    }

    pub fn to_mono(&self, t: &msgs::Time) -> MonoTime {
        MonoTime::ZERO.offset_seconds(t.as_seconds() - self.offset_s)
    }

    pub fn to_ros(&self, t: MonoTime) -> msgs::Time {
        msgs::Time::from_seconds(t.as_nanos() as f64 * 1e-9 + self.offset_s)
    }
}

/// The last latencies of one input (seconds), summarized once a second for the diagnostics.
/// Its buffer is sized once; recording allocates nothing.
pub struct LatencyWindow {
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
    pub fn record(&mut self, seconds: f64) {
        if !seconds.is_finite() {
            return;
        }
        if self.samples.len() == LATENCY_WINDOW {
            self.samples.pop_front();
        }
        self.samples.push_back(seconds);
    }

    /// `(p50, p99, max)` in milliseconds, once there is a sample.
    pub fn summary_ms(&mut self) -> Option<(f64, f64, f64)> {
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
pub struct SkewEstimator {
    window: usize,
    seen: usize,
    current_min: f64,
    /// The last completed window's minimum, seconds.
    pub offset_s: Option<f64>,
}

/// Offsets beyond these are reported as clock skew (seconds; negative: sender ahead).
pub const SKEW_WARN_BEHIND_S: f64 = 0.1;
pub const SKEW_WARN_AHEAD_S: f64 = -0.02;

impl SkewEstimator {
    pub fn new(window: usize) -> SkewEstimator {
        SkewEstimator {
            window: window.max(1),
            seen: 0,
            current_min: f64::INFINITY,
            offset_s: None,
        }
    }

    /// Records one sample; returns the new estimate when a window completes.
    pub fn observe(&mut self, arrival: MonoTime, stamp: MonoTime) -> Option<f64> {
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

    pub fn skewed(offset_s: f64) -> bool {
        !(SKEW_WARN_AHEAD_S..=SKEW_WARN_BEHIND_S).contains(&offset_s)
    }
}

/// Stamps further ahead than this are refused.
const MAX_FUTURE_S: f64 = 0.5;

fn check_stamp(stamp: MonoTime, now: MonoTime) -> Result<(), InputError> {
    let ahead = stamp.seconds_since(now);
    if ahead > MAX_FUTURE_S {
        Err(InputError::FutureStamp { ahead_s: ahead })
    } else {
        Ok(())
    }
}

/// Matches JointState messages to the robot's joints by name; partial and reordered lists are
/// merged into the last known positions. A measurement is produced once every joint has been
/// heard of; unknown joint names are reported once each.
pub struct JointStateDecoder {
    index: HashMap<String, usize>,
    position: JointVector,
    heard: Vec<bool>,
    unknown_reported: HashSet<String>,
}

impl JointStateDecoder {
    pub fn new(names: &[String]) -> JointStateDecoder {
        JointStateDecoder {
            index: names
                .iter()
                .enumerate()
                .map(|(i, n)| (n.clone(), i))
                .collect(),
            position: JointVector::zeros(names.len()),
            heard: vec![false; names.len()],
            unknown_reported: HashSet::new(),
        }
    }

    pub fn decode(
        &mut self,
        msg: &msgs::JointState,
        clock: &ClockMap,
        now: MonoTime,
    ) -> Result<Option<JointMeasurement>, InputError> {
        if msg.name.len() != msg.position.len() {
            return Err(InputError::LengthMismatch {
                names: msg.name.len(),
                positions: msg.position.len(),
            });
        }
        if let Some((n, v)) = msg
            .name
            .iter()
            .zip(&msg.position)
            .find(|(_, v)| !v.is_finite())
        {
            return Err(InputError::NonFinite {
                joint: n.clone(),
                value: *v,
            });
        }
        let stamp = clock.to_mono(&msg.header.stamp);
        check_stamp(stamp, now)?;
        for (n, v) in msg.name.iter().zip(&msg.position) {
            match self.index.get(n) {
                Some(&i) => {
                    self.position[i] = *v;
                    self.heard[i] = true;
                }
                None => {
                    if self.unknown_reported.insert(n.clone()) {
                        tracing::info!(joint = %n, "joint state names a joint pi0d does not command; ignored");
                    }
                }
            }
        }
        Ok(self.heard.iter().all(|h| *h).then_some(JointMeasurement {
            stamp,
            position: self.position,
        }))
    }
}

/// A sensor_msgs/Image to a camera frame (capture stamp from the header).
pub fn image(
    msg: &msgs::Image,
    clock: &ClockMap,
    now: MonoTime,
    cap: usize,
) -> Result<CameraFrame, InputError> {
    let (format, bpp, drop_alpha) = match msg.encoding.as_str() {
        "rgb8" => (PixelFormat::Rgb8, 3, false),
        "bgr8" => (PixelFormat::Bgr8, 3, false),
        "mono8" => (PixelFormat::Mono8, 1, false),
        "rgba8" => (PixelFormat::Rgb8, 4, true),
        "bgra8" => (PixelFormat::Bgr8, 4, true),
        other => return Err(InputError::Encoding(other.to_string())),
    };
    let need = msg.step as usize * msg.height as usize;
    if msg.data.len() != need || (msg.step as usize) < msg.width as usize * bpp {
        return Err(InputError::ImageSize {
            width: msg.width,
            height: msg.height,
            encoding: msg.encoding.clone(),
            step: msg.step,
            need,
            have: msg.data.len(),
        });
    }
    if need > cap {
        return Err(InputError::TooLarge { bytes: need, cap });
    }
    let stamp = clock.to_mono(&msg.header.stamp);
    check_stamp(stamp, now)?;
    let out_bpp = if drop_alpha { 3 } else { bpp };
    let (w, h) = (msg.width as usize, msg.height as usize);
    let mut data = Vec::with_capacity(w * h * out_bpp);
    for row in msg.data.chunks_exact(msg.step as usize) {
        let row = &row[..w * bpp];
        if drop_alpha {
            for px in row.chunks_exact(4) {
                data.extend_from_slice(&px[..3]);
            }
        } else {
            data.extend_from_slice(row);
        }
    }
    Ok(CameraFrame {
        stamp,
        width: msg.width,
        height: msg.height,
        format,
        data,
    })
}

/// A sensor_msgs/CompressedImage (JPEG or PNG, as the data says) to an RGB8 frame. The decoded
/// size is checked against `cap` before decoding.
pub fn compressed_image(
    msg: &msgs::CompressedImage,
    clock: &ClockMap,
    now: MonoTime,
    cap: usize,
) -> Result<CameraFrame, InputError> {
    let stamp = clock.to_mono(&msg.header.stamp);
    check_stamp(stamp, now)?;
    let reader = image::ImageReader::new(std::io::Cursor::new(&msg.data))
        .with_guessed_format()
        .map_err(|e| InputError::Compressed(e.to_string()))?;
    match reader.format() {
        Some(image::ImageFormat::Jpeg | image::ImageFormat::Png) => {}
        other => {
            return Err(InputError::Compressed(format!(
                "format `{}` is not JPEG or PNG ({other:?})",
                msg.format
            )))
        }
    }
    let (w, h) = reader
        .into_dimensions()
        .map_err(|e| InputError::Compressed(e.to_string()))?;
    let bytes = w as usize * h as usize * 3;
    if bytes > cap {
        return Err(InputError::TooLarge { bytes, cap });
    }
    let img =
        image::load_from_memory(&msg.data).map_err(|e| InputError::Compressed(e.to_string()))?;
    let rgb = img.into_rgb8();
    Ok(CameraFrame {
        stamp,
        width: rgb.width(),
        height: rgb.height(),
        format: PixelFormat::Rgb8,
        data: rgb.into_raw(),
    })
}

pub fn trajectory(
    header: msgs::Header,
    names: &[String],
    cmd: &MotionState,
    period_s: f64,
) -> msgs::JointTrajectory {
    msgs::JointTrajectory {
        header,
        joint_names: names.to_vec(),
        points: vec![msgs::JointTrajectoryPoint {
            positions: cmd.position.as_slice().to_vec(),
            velocities: cmd.velocity.as_slice().to_vec(),
            accelerations: cmd.acceleration.as_slice().to_vec(),
            effort: Vec::new(),
            time_from_start: msgs::Duration {
                sec: 0,
                nanosec: (period_s * 1e9) as u32,
            },
        }],
    }
}

pub fn multi_array(cmd: &MotionState) -> msgs::Float64MultiArray {
    msgs::Float64MultiArray {
        layout: msgs::MultiArrayLayout::default(),
        data: cmd.position.as_slice().to_vec(),
    }
}

pub fn joint_command(
    header: msgs::Header,
    names: &[String],
    cmd: &MotionState,
) -> msgs::JointState {
    msgs::JointState {
        header,
        name: names.to_vec(),
        position: cmd.position.as_slice().to_vec(),
        velocity: cmd.velocity.as_slice().to_vec(),
        effort: Vec::new(),
    }
}

/// How the inputs look from the ROS thread, for the diagnostics.
pub struct InputHealth<'a> {
    pub joint_state_age_s: f64,
    pub camera_ages_s: &'a [f64],
    /// Per camera: capture-to-decoded latency `(p50, p99, max)` in ms, once frames arrived.
    pub camera_latency_ms: &'a [Option<(f64, f64, f64)>],
    pub joint_state_clock_offset_s: Option<f64>,
    /// Per camera: its sender's clock offset estimate, as for the joint states.
    pub camera_clock_offsets_s: &'a [Option<f64>],
}

/// The daemon's health as one DiagnosticStatus: OK while running, WARN while holding or
/// starting, ERROR while e-stopped; values carry rates, timing and input ages.
pub fn diagnostics(
    stamp: msgs::Time,
    node: &str,
    live: &crate::control::stats::LiveStats,
    rate_hz: f64,
    inputs: &InputHealth,
) -> msgs::DiagnosticArray {
    let InputHealth {
        joint_state_age_s,
        camera_ages_s,
        camera_latency_ms,
        joint_state_clock_offset_s,
        camera_clock_offsets_s,
    } = *inputs;
    use crate::control::stats::{mode_name, LiveStats};
    let mode = mode_name(LiveStats::get(&live.mode));
    let mut level = match mode {
        "running" | "stopping" => 0,
        "estopped" => 2,
        _ => 1,
    };
    let kv = |k: &str, v: String| msgs::KeyValue {
        key: k.into(),
        value: v,
    };
    let mut values = vec![
        kv("state", mode.into()),
        kv("control rate (Hz)", format!("{rate_hz:.1}")),
        kv("ticks", LiveStats::get(&live.ticks).to_string()),
        kv("overruns", LiveStats::get(&live.overruns).to_string()),
        kv(
            "jitter last (us)",
            (LiveStats::get(&live.last_jitter_ns) / 1000).to_string(),
        ),
        kv(
            "jitter max (us)",
            (LiveStats::get(&live.max_jitter_ns) / 1000).to_string(),
        ),
        kv(
            "chunk latency (ms)",
            format!("{:.1}", LiveStats::get(&live.last_latency_us) as f64 / 1e3),
        ),
        kv(
            "chunks received",
            LiveStats::get(&live.chunks_received).to_string(),
        ),
        kv(
            "chunks rejected",
            LiveStats::get(&live.chunks_rejected).to_string(),
        ),
        kv(
            "safety events",
            LiveStats::get(&live.safety_events).to_string(),
        ),
        kv("joint state age (s)", format!("{joint_state_age_s:.3}")),
    ];
    for (i, a) in camera_ages_s.iter().enumerate() {
        values.push(kv(&format!("camera {i} age (s)"), format!("{a:.3}")));
    }
    // Capture stamp to decoded frame ready: transport, deserialization and decoding.
    for (i, l) in camera_latency_ms.iter().enumerate() {
        if let Some((p50, p99, max)) = l {
            values.push(kv(
                &format!("camera {i} latency p50 (ms)"),
                format!("{p50:.2}"),
            ));
            values.push(kv(
                &format!("camera {i} latency p99 (ms)"),
                format!("{p99:.2}"),
            ));
            values.push(kv(
                &format!("camera {i} latency max (ms)"),
                format!("{max:.2}"),
            ));
        }
    }
    if let Some(o) = joint_state_clock_offset_s {
        values.push(kv("joint state clock offset (s)", format!("{o:.3}")));
        if SkewEstimator::skewed(o) && level == 0 {
            level = 1;
        }
    }
    for (i, o) in camera_clock_offsets_s.iter().enumerate() {
        if let Some(o) = o {
            values.push(kv(
                &format!("camera {i} clock offset (s)"),
                format!("{o:.3}"),
            ));
            if SkewEstimator::skewed(*o) && level == 0 {
                level = 1;
            }
        }
    }
    msgs::DiagnosticArray {
        header: msgs::Header {
            stamp,
            frame_id: String::new(),
        },
        status: vec![msgs::DiagnosticStatus {
            level,
            name: format!("{node}: control"),
            message: mode.into(),
            hardware_id: node.into(),
            values,
        }],
    }
}

/// One warning per topic and reason per interval, with the count of those suppressed.
pub struct RateLimitedLog {
    every: Duration,
    last: HashMap<String, (Instant, u64)>,
}

impl RateLimitedLog {
    pub fn new(every: Duration) -> RateLimitedLog {
        RateLimitedLog {
            every,
            last: HashMap::new(),
        }
    }

    pub fn warn(&mut self, topic: &str, reason: &str) {
        let key = format!("{topic}: {reason}");
        let now = Instant::now();
        let entry = self
            .last
            .entry(key)
            .or_insert((now - self.every - Duration::from_millis(1), 0));
        if now.duration_since(entry.0) >= self.every {
            tracing::warn!(topic, reason, suppressed = entry.1, "input rejected");
            *entry = (now, 0);
        } else {
            entry.1 += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn latency_window_summarizes_the_last_samples() {
        let mut w = super::LatencyWindow::default();
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

    use super::*;

    fn names() -> Vec<String> {
        vec!["a".into(), "b".into(), "c".into()]
    }

    fn js(names: &[&str], pos: &[f64], clock: &ClockMap, at: MonoTime) -> msgs::JointState {
        msgs::JointState {
            header: msgs::Header {
                stamp: clock.to_ros(at),
                frame_id: String::new(),
            },
            name: names.iter().map(|s| s.to_string()).collect(),
            position: pos.to_vec(),
            ..Default::default()
        }
    }

    #[test]
    fn when_joint_states_partial_and_reordered_expect_merged_by_name() {
        let clock = ClockMap::now();
        let now = MonoTime::now();
        let mut d = JointStateDecoder::new(&names());
        assert!(d
            .decode(&js(&["c", "a"], &[3.0, 1.0], &clock, now), &clock, now)
            .unwrap()
            .is_none());
        let m = d
            .decode(&js(&["b", "x"], &[2.0, 9.0], &clock, now), &clock, now)
            .unwrap()
            .unwrap();
        assert_eq!(m.position.as_slice(), &[1.0, 2.0, 3.0]);
        assert!(m.stamp.seconds_since(now).abs() < 1e-6);
    }

    #[test]
    fn when_joint_state_malformed_expect_reason() {
        let clock = ClockMap::now();
        let now = MonoTime::now();
        let mut d = JointStateDecoder::new(&names());
        let e = d
            .decode(&js(&["a", "b"], &[1.0], &clock, now), &clock, now)
            .unwrap_err();
        assert_eq!(
            e,
            InputError::LengthMismatch {
                names: 2,
                positions: 1
            }
        );
        let e = d
            .decode(&js(&["a"], &[f64::NAN], &clock, now), &clock, now)
            .unwrap_err();
        assert!(e.to_string().contains("`a`"));
        let e = d
            .decode(
                &js(&["a"], &[0.0], &clock, now.offset_seconds(2.0)),
                &clock,
                now,
            )
            .unwrap_err();
        assert!(matches!(e, InputError::FutureStamp { .. }), "{e}");
    }

    #[test]
    fn when_compressed_png_or_garbage_expect_frame_or_reason() {
        let clock = ClockMap::now();
        let now = MonoTime::now();
        let mut png = Vec::new();
        let img =
            image::RgbImage::from_fn(5, 3, |x, y| image::Rgb([x as u8 * 10, y as u8 * 20, 7]));
        img.write_to(&mut std::io::Cursor::new(&mut png), image::ImageFormat::Png)
            .unwrap();
        let msg = |data: Vec<u8>| msgs::CompressedImage {
            header: msgs::Header {
                stamp: clock.to_ros(now),
                frame_id: String::new(),
            },
            format: "png".into(),
            data,
        };
        let f = compressed_image(&msg(png.clone()), &clock, now, 1 << 20).unwrap();
        assert_eq!((f.width, f.height), (5, 3));
        assert_eq!(&f.data[..3], &[0, 0, 7]);
        assert_eq!(&f.data[3 * (5 + 4)..3 * (5 + 4) + 3], &[40, 20, 7]);
        assert!(matches!(
            compressed_image(&msg(png), &clock, now, 10),
            Err(InputError::TooLarge { .. })
        ));
        assert!(matches!(
            compressed_image(&msg(vec![1, 2, 3, 4]), &clock, now, 1 << 20),
            Err(InputError::Compressed(_))
        ));
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

    #[test]
    fn when_image_size_does_not_add_up_expect_refused() {
        let clock = ClockMap::now();
        let now = MonoTime::now();
        let img = |enc: &str, w, h, step, len| msgs::Image {
            header: msgs::Header {
                stamp: clock.to_ros(now),
                frame_id: String::new(),
            },
            height: h,
            width: w,
            encoding: enc.into(),
            is_bigendian: 0,
            step,
            data: vec![7; len],
        };
        assert!(image(&img("rgb8", 4, 2, 12, 24), &clock, now, 1 << 20).is_ok());
        let f = image(&img("rgba8", 4, 2, 16, 32), &clock, now, 1 << 20).unwrap();
        assert_eq!((f.format, f.data.len()), (PixelFormat::Rgb8, 24));
        let e = image(&img("rgb8", 4, 2, 12, 20), &clock, now, 1 << 20).unwrap_err();
        assert!(
            e.to_string()
                .contains("step 12 x height 2 = 24 bytes, data has 20"),
            "{e}"
        );
        assert!(matches!(
            image(&img("yuv422", 4, 2, 8, 16), &clock, now, 1 << 20),
            Err(InputError::Encoding(_))
        ));
        assert!(matches!(
            image(&img("rgb8", 4, 2, 12, 24), &clock, now, 10),
            Err(InputError::TooLarge { .. })
        ));
    }
}

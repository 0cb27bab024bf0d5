//! Turning ROS messages into pi0d's inputs. Every malformed input is refused with a reason
//! naming what was wrong; the caller adds the topic, logs it (rate-limited) and the watchdogs
//! see the source as stale. Kept apart from the node so it is tested without DDS.

use std::collections::{HashMap, HashSet};

use super::msgs;
use crate::joints::{JointMeasurement, JointVector};
use crate::observation::{CameraFrame, PixelFormat};
use crate::time::MonoTime;

pub(crate) use super::timing::{ClockMap, LatencyWindow, SkewEstimator};

/// Why an input was refused. Strings from the sender are kept short and escaped (see `shown`),
/// so a reason is safe to log.
#[derive(Debug, thiserror::Error, PartialEq)]
pub(crate) enum InputError {
    #[error("{names} names but {positions} positions")]
    LengthMismatch { names: usize, positions: usize },
    #[error("joint {joint} position is {value}")]
    NonFinite { joint: String, value: f64 },
    #[error("joint {joint} measured at {}, beyond its limits [{lower:.4}, {upper:.4}] by more than safety.measured_position_tolerance: a sensor fault", short(*value))]
    Implausible {
        joint: String,
        value: f64,
        lower: f64,
        upper: f64,
    },
    #[error("joint {joint} named twice")]
    DuplicateJoint { joint: String },
    #[error("stamp {ahead_s:.3} s in the future (clock skew between sender and pi0d?)")]
    FutureStamp { ahead_s: f64 },
    #[error("stamp {sec} s {nanosec} ns: nanoseconds must be below 1e9")]
    BadNanosec { sec: i32, nanosec: u32 },
    #[error(
        "stamp {sec} s {nanosec} ns is before pi0d's clock began (unstamped header, or sim time?)"
    )]
    StampBeforeOrigin { sec: i32, nanosec: u32 },
    #[error("unsupported image encoding {0} (rgb8, bgr8, mono8, rgba8, bgra8)")]
    Encoding(String),
    #[error("empty image {width}x{height} (camera not streaming yet?)")]
    EmptyImage { width: u32, height: u32 },
    #[error("image {width}x{height} is beyond {max} pixels a side")]
    Dimensions { width: u32, height: u32, max: u32 },
    #[error("image {width}x{height} {encoding}: step {step} is shorter than a row of {row} bytes")]
    Step {
        width: u32,
        height: u32,
        encoding: &'static str,
        step: u32,
        row: u64,
    },
    #[error("image {width}x{height} {encoding}: step {step} x height {height} = {need} bytes, data has {have}")]
    ImageSize {
        width: u32,
        height: u32,
        encoding: &'static str,
        step: u32,
        need: u64,
        have: usize,
    },
    #[error("image of {bytes} bytes exceeds the cap of {cap}")]
    TooLarge { bytes: u64, cap: usize },
    #[error("compressed image: {0}")]
    Compressed(String),
    #[error("prompt of {bytes} bytes is longer than {max}")]
    PromptTooLong { bytes: usize, max: usize },
    #[error("prompt has control character {ch:?} at byte {at}")]
    PromptControl { ch: char, at: usize },
}

/// The kind of an `InputError`, without its values: what warnings are rate-limited by.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum InputErrorKind {
    LengthMismatch,
    NonFinite,
    Implausible,
    DuplicateJoint,
    FutureStamp,
    BadNanosec,
    StampBeforeOrigin,
    Encoding,
    EmptyImage,
    Dimensions,
    Step,
    ImageSize,
    TooLarge,
    Compressed,
    PromptTooLong,
    PromptControl,
}

impl InputError {
    pub(crate) fn kind(&self) -> InputErrorKind {
        use InputErrorKind as K;
        match self {
            InputError::LengthMismatch { .. } => K::LengthMismatch,
            InputError::NonFinite { .. } => K::NonFinite,
            InputError::Implausible { .. } => K::Implausible,
            InputError::DuplicateJoint { .. } => K::DuplicateJoint,
            InputError::FutureStamp { .. } => K::FutureStamp,
            InputError::BadNanosec { .. } => K::BadNanosec,
            InputError::StampBeforeOrigin { .. } => K::StampBeforeOrigin,
            InputError::Encoding(_) => K::Encoding,
            InputError::EmptyImage { .. } => K::EmptyImage,
            InputError::Dimensions { .. } => K::Dimensions,
            InputError::Step { .. } => K::Step,
            InputError::ImageSize { .. } => K::ImageSize,
            InputError::TooLarge { .. } => K::TooLarge,
            InputError::Compressed(_) => K::Compressed,
            InputError::PromptTooLong { .. } => K::PromptTooLong,
            InputError::PromptControl { .. } => K::PromptControl,
        }
    }
}

/// A number as a reason shows it: four decimals, or an exponent where that would run long.
fn short(v: f64) -> String {
    if v.abs() < 1e6 {
        format!("{v:.4}")
    } else {
        format!("{v:.3e}")
    }
}

/// Bytes of a sender's string kept in a reason.
const SHOWN_BYTES: usize = 64;

/// A sender's string for a log line: quoted, shown as outside text (no control character
/// reaches the log) and cut short.
pub(crate) fn shown(s: &str) -> String {
    format!("`{}`", crate::outside::text(s).cap(SHOWN_BYTES))
}

/// Stamps further ahead than this are refused.
const MAX_FUTURE_S: f64 = 0.5;

/// A header stamp on the monotonic clock, refused when malformed or too far ahead of `now`.
fn stamp(clock: &ClockMap, t: &msgs::Time, now: MonoTime) -> Result<MonoTime, InputError> {
    let stamp = clock.to_mono(t)?;
    let ahead = stamp.seconds_since(now);
    if ahead > MAX_FUTURE_S {
        Err(InputError::FutureStamp { ahead_s: ahead })
    } else {
        Ok(stamp)
    }
}

/// Unknown joint names reported (once each) at most; a sender inventing names must not grow
/// the set without bound.
const MAX_UNKNOWN_REPORTED: usize = 32;

/// Matches JointState messages to the robot's joints by name; partial and reordered lists are
/// merged into the last known positions. A measurement is produced once every joint has been
/// heard of; unknown joint names are reported once each. A message is checked whole before any
/// of it is merged.
pub(crate) struct JointStateDecoder {
    index: HashMap<String, usize>,
    /// Per commanded joint: the measured positions taken (its limits widened by the
    /// tolerance); beyond them a sample is a sensor fault.
    plausible: Vec<(f64, f64)>,
    position: JointVector,
    heard: Vec<bool>,
    /// Scratch: which joints the message being decoded names (duplicates are refused).
    named: Vec<bool>,
    unknown_reported: HashSet<String>,
    /// When the first message arrived that did not yet complete a measurement.
    partial_since: Option<MonoTime>,
    missing_reported: bool,
}

/// Joint states that keep leaving some commanded joints out for this long are reported once.
const MISSING_REPORT_S: f64 = 1.0;

impl JointStateDecoder {
    /// A decoder taking any finite position (for tests and tools without limits).
    #[cfg(test)]
    pub(crate) fn new(names: &[String]) -> JointStateDecoder {
        Self::with_bounds(
            names,
            &vec![(f64::NEG_INFINITY, f64::INFINITY); names.len()],
        )
    }

    /// `plausible`: per joint in `names`' order, the measured positions taken.
    pub(crate) fn with_bounds(names: &[String], plausible: &[(f64, f64)]) -> JointStateDecoder {
        JointStateDecoder {
            plausible: plausible.to_vec(),
            index: names
                .iter()
                .enumerate()
                .map(|(i, n)| (n.clone(), i))
                .collect(),
            position: JointVector::zeros(names.len()),
            heard: vec![false; names.len()],
            named: vec![false; names.len()],
            unknown_reported: HashSet::new(),
            partial_since: None,
            missing_reported: false,
        }
    }

    /// Once, after joint states have arrived for a while without naming every commanded joint:
    /// the joints never heard of (a robot whose joint names differ from `robot.joints` would
    /// otherwise only look like "no joint state").
    pub(crate) fn missing_report(&mut self, now: MonoTime) -> Option<String> {
        let since = self.partial_since?;
        if self.missing_reported || now.seconds_since(since) < MISSING_REPORT_S {
            return None;
        }
        self.missing_reported = true;
        let mut missing: Vec<(&usize, &String)> = self
            .index
            .iter()
            .filter(|(_, &i)| !self.heard[i])
            .map(|(n, i)| (i, n))
            .collect();
        missing.sort();
        let names: Vec<String> = missing.iter().map(|(_, n)| shown(n)).collect();
        Some(format!(
            "joint states arrive but never name {} (commanded in robot.joints): no measurement yet",
            names.join(", ")
        ))
    }

    pub(crate) fn decode(
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
                joint: shown(n),
                value: *v,
            });
        }
        for (n, v) in msg.name.iter().zip(&msg.position) {
            if let Some(&(lower, upper)) = self.index.get(n).and_then(|&i| self.plausible.get(i)) {
                if !(lower <= *v && *v <= upper) {
                    return Err(InputError::Implausible {
                        joint: shown(n),
                        value: *v,
                        lower,
                        upper,
                    });
                }
            }
        }
        let stamp = stamp(clock, &msg.header.stamp, now)?;
        self.named.fill(false);
        for n in &msg.name {
            if let Some(&i) = self.index.get(n) {
                if std::mem::replace(&mut self.named[i], true) {
                    return Err(InputError::DuplicateJoint { joint: shown(n) });
                }
            }
        }
        for (n, v) in msg.name.iter().zip(&msg.position) {
            match self.index.get(n) {
                Some(&i) => {
                    self.position[i] = *v;
                    self.heard[i] = true;
                }
                None => {
                    if self.unknown_reported.len() < MAX_UNKNOWN_REPORTED
                        && self.unknown_reported.insert(n.clone())
                    {
                        tracing::info!(joint = %shown(n), "joint state names a joint pi0d does not command; ignored");
                    }
                }
            }
        }
        let complete = self.heard.iter().all(|h| *h);
        if !complete && self.partial_since.is_none() {
            self.partial_since = Some(now);
        }
        Ok(complete.then_some(JointMeasurement {
            stamp,
            position: self.position,
        }))
    }
}

/// Pixels a side pi0d takes from a camera (far beyond any policy input; a sanity bound that
/// also keeps every size product small).
pub(crate) const MAX_IMAGE_SIDE: u32 = 16384;

fn check_dimensions(width: u32, height: u32) -> Result<(), InputError> {
    if width == 0 || height == 0 {
        return Err(InputError::EmptyImage { width, height });
    }
    if width > MAX_IMAGE_SIDE || height > MAX_IMAGE_SIDE {
        return Err(InputError::Dimensions {
            width,
            height,
            max: MAX_IMAGE_SIDE,
        });
    }
    Ok(())
}

/// A sensor_msgs/Image to a camera frame (capture stamp from the header). `is_bigendian` is
/// ignored: it does not matter for the 8-bit encodings taken.
pub(crate) fn image(
    msg: &msgs::Image,
    clock: &ClockMap,
    now: MonoTime,
    cap: usize,
) -> Result<CameraFrame, InputError> {
    let (encoding, format, bpp, drop_alpha) = match msg.encoding.as_str() {
        "rgb8" => ("rgb8", PixelFormat::Rgb8, 3u32, false),
        "bgr8" => ("bgr8", PixelFormat::Bgr8, 3, false),
        "mono8" => ("mono8", PixelFormat::Mono8, 1, false),
        "rgba8" => ("rgba8", PixelFormat::Rgb8, 4, true),
        "bgra8" => ("bgra8", PixelFormat::Bgr8, 4, true),
        other => return Err(InputError::Encoding(shown(other))),
    };
    let (width, height, step) = (msg.width, msg.height, msg.step);
    check_dimensions(width, height)?;
    // In u64, u32 x u32 cannot wrap (on any target).
    let row = u64::from(width) * u64::from(bpp);
    if u64::from(step) < row {
        return Err(InputError::Step {
            width,
            height,
            encoding,
            step,
            row,
        });
    }
    let need = u64::from(step) * u64::from(height);
    if u64::try_from(msg.data.len()).ok() != Some(need) {
        return Err(InputError::ImageSize {
            width,
            height,
            encoding,
            step,
            need,
            have: msg.data.len(),
        });
    }
    if need > cap as u64 {
        return Err(InputError::TooLarge { bytes: need, cap });
    }
    let stamp = stamp(clock, &msg.header.stamp, now)?;
    // The data is `need` bytes, held in memory: every size below fits in usize.
    let too_large = || InputError::TooLarge { bytes: need, cap };
    let (row, step) = (
        usize::try_from(row).map_err(|_| too_large())?,
        usize::try_from(step).map_err(|_| too_large())?,
    );
    let out_row = if drop_alpha { row / 4 * 3 } else { row };
    let mut data = Vec::with_capacity(out_row * height as usize);
    for padded in msg.data.chunks_exact(step) {
        let row = padded.get(..row).ok_or_else(too_large)?;
        if drop_alpha {
            for px in row.chunks_exact(4) {
                if let [a, b, c, _] = px {
                    data.extend_from_slice(&[*a, *b, *c]);
                }
            }
        } else {
            data.extend_from_slice(row);
        }
    }
    Ok(CameraFrame {
        stamp,
        width,
        height,
        format,
        data,
    })
}

/// A sensor_msgs/CompressedImage (JPEG or PNG, as the data says) to an RGB8 frame. The size the
/// header claims is checked against `cap` before decoding, and the decoder itself is limited, so
/// hostile data cannot make it allocate more than a few times `cap`.
pub(crate) fn compressed_image(
    msg: &msgs::CompressedImage,
    clock: &ClockMap,
    now: MonoTime,
    cap: usize,
) -> Result<CameraFrame, InputError> {
    use image::ImageDecoder;
    let stamp = stamp(clock, &msg.header.stamp, now)?;
    let bad = |e: image::ImageError| InputError::Compressed(e.to_string());
    let mut reader = image::ImageReader::new(std::io::Cursor::new(&msg.data))
        .with_guessed_format()
        .map_err(|e| InputError::Compressed(e.to_string()))?;
    match reader.format() {
        Some(image::ImageFormat::Jpeg | image::ImageFormat::Png) => {}
        other => {
            return Err(InputError::Compressed(format!(
                "format {} is not JPEG or PNG ({other:?})",
                shown(&msg.format)
            )))
        }
    }
    let mut limits = image::Limits::default();
    limits.max_image_width = Some(MAX_IMAGE_SIDE);
    limits.max_image_height = Some(MAX_IMAGE_SIDE);
    // The decoded image may be 16-bit or carry alpha (up to 8 bytes a pixel against the 3 kept)
    // before it is converted: room for that, and no more.
    limits.max_alloc = Some((cap as u64).saturating_mul(3));
    reader.limits(limits);
    let decoder = reader.into_decoder().map_err(bad)?;
    let (w, h) = decoder.dimensions();
    check_dimensions(w, h)?;
    let bytes = u64::from(w) * u64::from(h) * 3;
    if bytes > cap as u64 {
        return Err(InputError::TooLarge { bytes, cap });
    }
    let rgb = image::DynamicImage::from_decoder(decoder)
        .map_err(bad)?
        .into_rgb8();
    check_dimensions(rgb.width(), rgb.height())?;
    Ok(CameraFrame {
        stamp,
        width: rgb.width(),
        height: rgb.height(),
        format: PixelFormat::Rgb8,
        data: rgb.into_raw(),
    })
}

/// Bytes a task prompt may have: the configuration's (and the pipeline's) bound, so a longer one
/// is refused here, with its topic, rather than further in.
pub(crate) use crate::config::policy::MAX_PROMPT_BYTES;

/// A task prompt from std_msgs/String: refused when longer than `MAX_PROMPT_BYTES` or holding
/// control characters other than newline and tab (terminal escapes, NULs: never a task).
pub(crate) fn prompt(text: &str) -> Result<&str, InputError> {
    if text.len() > MAX_PROMPT_BYTES {
        return Err(InputError::PromptTooLong {
            bytes: text.len(),
            max: MAX_PROMPT_BYTES,
        });
    }
    match text
        .char_indices()
        .find(|(_, c)| c.is_control() && *c != '\n' && *c != '\t')
    {
        Some((at, ch)) => Err(InputError::PromptControl { ch, at }),
        None => Ok(text),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names() -> Vec<String> {
        vec!["a".into(), "b".into(), "c".into()]
    }

    fn header(clock: &ClockMap, at: MonoTime) -> msgs::Header {
        msgs::Header {
            stamp: clock.to_ros(at),
            frame_id: String::new(),
        }
    }

    fn js(names: &[&str], pos: &[f64], clock: &ClockMap, at: MonoTime) -> msgs::JointState {
        msgs::JointState {
            header: header(clock, at),
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
    fn when_a_joint_is_measured_far_beyond_its_limits_expect_a_sensor_fault_never_a_position() {
        let clock = ClockMap::now();
        let now = MonoTime::now();
        // Limits [-1, 1] on each joint, widened by a tolerance of 0.5.
        let mut d = JointStateDecoder::with_bounds(&names(), &[(-1.5, 1.5); 3]);
        for bad in [1e308, -1e308, 1.5000001, -2.0] {
            let e = d
                .decode(
                    &js(&["a", "b", "c"], &[0.0, bad, 0.0], &clock, now),
                    &clock,
                    now,
                )
                .unwrap_err();
            assert_eq!(e.kind(), InputErrorKind::Implausible, "{bad}");
            assert!(e.to_string().contains("joint `b` measured at"), "{e}");
            assert!(e.to_string().len() < 200, "{e}");
            assert!(e.to_string().contains("sensor fault"), "{e}");
        }
        // Nothing of a refused sample was merged: the next good one is the measurement.
        let m = d
            .decode(
                &js(&["a", "b", "c"], &[0.1, 1.4, -1.5], &clock, now),
                &clock,
                now,
            )
            .unwrap()
            .unwrap();
        assert_eq!(m.position.as_slice(), &[0.1, 1.4, -1.5]);
        // A joint pi0d does not command is not judged.
        assert!(d
            .decode(&js(&["x", "a"], &[1e308, 0.0], &clock, now), &clock, now)
            .is_ok());
    }

    #[test]
    fn when_joint_states_never_name_a_joint_expect_it_reported_once() {
        let clock = ClockMap::now();
        let now = MonoTime::now();
        let mut d = JointStateDecoder::new(&names());
        assert!(d
            .decode(&js(&["a", "x"], &[1.0, 2.0], &clock, now), &clock, now)
            .unwrap()
            .is_none());
        assert_eq!(
            d.missing_report(now),
            None,
            "not yet: 1 s of messages first"
        );
        let later = now.offset_seconds(1.5);
        let r = d.missing_report(later).unwrap();
        assert!(r.contains("never name `b`, `c`"), "{r}");
        assert_eq!(d.missing_report(later), None, "once");
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
    fn when_joint_named_twice_expect_refused_and_nothing_merged() {
        let clock = ClockMap::now();
        let now = MonoTime::now();
        let mut d = JointStateDecoder::new(&names());
        let e = d
            .decode(
                &js(&["a", "b", "c", "a"], &[1.0, 2.0, 3.0, 4.0], &clock, now),
                &clock,
                now,
            )
            .unwrap_err();
        assert_eq!(e.kind(), InputErrorKind::DuplicateJoint);
        assert!(e.to_string().contains("`a` named twice"), "{e}");
        // The refused message left no joint heard: no measurement from half of it.
        assert!(d
            .decode(&js(&["a", "b"], &[1.0, 2.0], &clock, now), &clock, now)
            .unwrap()
            .is_none());
    }

    #[test]
    fn when_stamp_nanosec_out_of_range_or_before_the_clock_expect_refused() {
        let clock = ClockMap::now();
        let now = MonoTime::now();
        let mut d = JointStateDecoder::new(&names());
        let mut m = js(&["a"], &[0.0], &clock, now);
        m.header.stamp.nanosec = 1_000_000_000;
        let e = d.decode(&m, &clock, now).unwrap_err();
        assert_eq!(e.kind(), InputErrorKind::BadNanosec, "{e}");
        for (sec, nanosec) in [(0, 0), (-5, 0), (i32::MIN, 999_999_999), (1, 2)] {
            m.header.stamp = msgs::Time { sec, nanosec };
            let e = d.decode(&m, &clock, now).unwrap_err();
            assert_eq!(e.kind(), InputErrorKind::StampBeforeOrigin, "{e}");
        }
        // Far in the future (year 2038) is refused as such, without overflow.
        m.header.stamp = msgs::Time {
            sec: i32::MAX,
            nanosec: 999_999_999,
        };
        let e = d.decode(&m, &clock, now).unwrap_err();
        assert_eq!(e.kind(), InputErrorKind::FutureStamp, "{e}");
    }

    #[test]
    fn when_unknown_joint_names_keep_coming_expect_bounded_memory() {
        let clock = ClockMap::now();
        let now = MonoTime::now();
        let mut d = JointStateDecoder::new(&names());
        for i in 0..1000 {
            let n = format!("ghost{i}");
            d.decode(&js(&[&n], &[0.0], &clock, now), &clock, now)
                .unwrap();
        }
        assert_eq!(d.unknown_reported.len(), MAX_UNKNOWN_REPORTED);
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
            header: header(&clock, now),
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

    /// A PNG (signature, IHDR claiming `w`x`h` RGB8, a short garbage IDAT, correct CRCs) whose
    /// header a decoder reads in full before it finds the data bad.
    pub(crate) fn png_header(w: u32, h: u32) -> Vec<u8> {
        fn chunk(png: &mut Vec<u8>, kind: &[u8], body: &[u8]) {
            png.extend((body.len() as u32).to_be_bytes());
            let start = png.len();
            png.extend(kind);
            png.extend(body);
            let crc = crc32fast::hash(&png[start..]);
            png.extend(crc.to_be_bytes());
        }
        let mut png = vec![0x89, b'P', b'N', b'G', 0x0D, 0x0A, 0x1A, 0x0A];
        let mut ihdr = w.to_be_bytes().to_vec();
        ihdr.extend(h.to_be_bytes());
        ihdr.extend([8, 2, 0, 0, 0]);
        chunk(&mut png, b"IHDR", &ihdr);
        chunk(&mut png, b"IDAT", &[0x78, 0x9c, 1, 2, 3, 4]);
        png
    }

    #[test]
    fn when_compressed_header_claims_absurd_size_expect_refused_before_decoding() {
        let clock = ClockMap::now();
        let now = MonoTime::now();
        let msg = |data: Vec<u8>| msgs::CompressedImage {
            header: header(&clock, now),
            format: "png".into(),
            data,
        };
        let e =
            compressed_image(&msg(png_header(100_000, 100_000)), &clock, now, 8 << 20).unwrap_err();
        assert!(
            matches!(
                e.kind(),
                InputErrorKind::Dimensions | InputErrorKind::Compressed
            ),
            "{e}"
        );
        let e = compressed_image(&msg(png_header(4000, 4000)), &clock, now, 8 << 20).unwrap_err();
        assert_eq!(e.kind(), InputErrorKind::TooLarge, "{e}");
        // Within the cap but no pixel data: a decoding error, not a panic or a huge buffer.
        let e = compressed_image(&msg(png_header(64, 48)), &clock, now, 8 << 20).unwrap_err();
        assert_eq!(e.kind(), InputErrorKind::Compressed, "{e}");
        let mut m = msg(vec![0, 1]);
        m.format = "gif\u{1b}[2J".repeat(40);
        let e = compressed_image(&m, &clock, now, 8 << 20).unwrap_err();
        let text = e.to_string();
        assert!(!text.contains('\u{1b}') && text.len() < 400, "{text}");
    }

    fn raw(clock: &ClockMap, enc: &str, w: u32, h: u32, step: u32, len: usize) -> msgs::Image {
        msgs::Image {
            header: header(clock, MonoTime::now()),
            height: h,
            width: w,
            encoding: enc.into(),
            is_bigendian: 0,
            step,
            data: vec![7; len],
        }
    }

    #[test]
    fn when_image_size_does_not_add_up_expect_refused() {
        let clock = ClockMap::now();
        let now = MonoTime::now();
        let img = |enc, w, h, step, len| raw(&clock, enc, w, h, step, len);
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

    #[test]
    fn when_image_empty_or_step_zero_expect_refused_with_reason() {
        let clock = ClockMap::now();
        let now = MonoTime::now();
        let img = |enc, w, h, step, len| raw(&clock, enc, w, h, step, len);
        let cases = [
            // A camera driver not streaming yet: the frame that used to kill the ROS thread.
            (
                img("rgb8", 0, 0, 0, 0),
                InputErrorKind::EmptyImage,
                "empty image 0x0",
            ),
            (
                img("rgb8", 0, 48, 0, 0),
                InputErrorKind::EmptyImage,
                "empty",
            ),
            (
                img("mono8", 64, 0, 64, 0),
                InputErrorKind::EmptyImage,
                "empty",
            ),
            (img("rgb8", 64, 48, 0, 0), InputErrorKind::Step, "step 0"),
            (
                img("rgba8", 64, 48, 255, 255 * 48),
                InputErrorKind::Step,
                "row of 256",
            ),
            (
                img("rgb8", u32::MAX, 1, u32::MAX, 16),
                InputErrorKind::Dimensions,
                "beyond",
            ),
            (
                img("mono8", 2, u32::MAX, 2, 16),
                InputErrorKind::Dimensions,
                "beyond",
            ),
        ];
        for (msg, kind, text) in cases {
            let e = image(&msg, &clock, now, 1 << 20).unwrap_err();
            assert_eq!(e.kind(), kind, "{e}");
            assert!(e.to_string().contains(text), "{e}");
        }
        let e = image(&img("16UC1\n\u{7}", 4, 2, 8, 16), &clock, now, 1 << 20).unwrap_err();
        assert_eq!(e.to_string().lines().count(), 1, "{e}");
    }

    #[test]
    fn when_image_has_row_padding_or_big_endian_flag_expect_pixels_without_padding() {
        let clock = ClockMap::now();
        let now = MonoTime::now();
        let mut m = raw(&clock, "bgra8", 2, 2, 10, 20);
        m.data = (0..20).collect();
        m.is_bigendian = 1;
        let f = image(&m, &clock, now, 1 << 20).unwrap();
        assert_eq!(f.format, PixelFormat::Bgr8);
        assert_eq!(f.data, [0, 1, 2, 4, 5, 6, 10, 11, 12, 14, 15, 16]);
    }

    #[test]
    fn when_prompt_too_long_or_with_control_characters_expect_refused() {
        assert_eq!(
            prompt("stack the blocks\n\tthen stop"),
            Ok("stack the blocks\n\tthen stop")
        );
        assert!(prompt(&"é".repeat(MAX_PROMPT_BYTES / 2)).is_ok());
        let e = prompt(&"x".repeat(MAX_PROMPT_BYTES + 1)).unwrap_err();
        assert_eq!(e.kind(), InputErrorKind::PromptTooLong);
        for bad in ["stack\u{1b}[2J", "a\0b", "\r", "x\u{85}"] {
            let e = prompt(bad).unwrap_err();
            assert_eq!(e.kind(), InputErrorKind::PromptControl, "{bad:?}");
            assert!(e.to_string().contains("control character"), "{e}");
        }
    }

    #[test]
    fn when_string_shown_expect_escaped_and_bounded() {
        assert_eq!(shown("rgb8"), "`rgb8`");
        assert_eq!(shown("a\nb"), "`a\\nb`");
        let long = shown(&"é".repeat(1000));
        assert_eq!(
            long,
            format!("`{}... 2000 bytes, first 64 shown`", "é".repeat(32))
        );
    }
}

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
#[path = "decode_tests.rs"]
mod tests;

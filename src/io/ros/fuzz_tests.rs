//! Fuzz-style tests of the ROS input path, one target per decoder: random, truncated and
//! bit-flipped CDR never panics (it decodes or fails), and whatever decodes is either accepted
//! as a valid input or refused with a reason. Generators build consistent messages as well as
//! random ones, so the properties reach the edges (zero sizes, exact and off-by-one lengths,
//! absurd dimensions) that independent random fields almost never hit.

use std::sync::OnceLock;

use byteorder::LittleEndian;
use proptest::prelude::*;
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::decode::{
    compressed_image, image, prompt, InputErrorKind, JointStateDecoder, MAX_IMAGE_SIDE,
};
use super::msgs::*;
use super::timing::ClockMap;
use crate::config::policy::MAX_PROMPT_BYTES;
use crate::time::MonoTime;

const CAP: usize = 1 << 20;

fn cases(n: u32) -> ProptestConfig {
    ProptestConfig {
        cases: n,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

fn cdr<T: Serialize>(msg: &T) -> Vec<u8> {
    cdr_encoding::to_vec::<_, LittleEndian>(msg).unwrap()
}

fn from_cdr<T: DeserializeOwned>(bytes: &[u8]) -> Option<T> {
    cdr_encoding::from_bytes::<T, LittleEndian>(bytes)
        .ok()
        .map(|(m, _)| m)
}

fn header(stamp: Time) -> Header {
    Header {
        stamp,
        frame_id: "f".into(),
    }
}

/// One valid sample of every message type in `msgs`, CDR-encoded.
fn samples() -> Vec<(&'static str, Vec<u8>)> {
    let h = header(Time { sec: 5, nanosec: 6 });
    vec![
        (
            "JointState",
            cdr(&JointState {
                header: h.clone(),
                name: vec!["a".into(), "b".into()],
                position: vec![0.1, 0.2],
                velocity: vec![0.0],
                effort: vec![],
            }),
        ),
        (
            "Image",
            cdr(&Image {
                header: h.clone(),
                height: 2,
                width: 2,
                encoding: "rgb8".into(),
                is_bigendian: 0,
                step: 6,
                data: vec![9; 12],
            }),
        ),
        (
            "CompressedImage",
            cdr(&CompressedImage {
                header: h.clone(),
                format: "png".into(),
                data: real_png().to_vec(),
            }),
        ),
        (
            "JointTrajectory",
            cdr(&JointTrajectory {
                header: h.clone(),
                joint_names: vec!["a".into()],
                points: vec![JointTrajectoryPoint {
                    positions: vec![1.0],
                    velocities: vec![0.5],
                    accelerations: vec![0.0],
                    effort: vec![],
                    time_from_start: Duration { sec: 0, nanosec: 5 },
                }],
            }),
        ),
        (
            "Float64MultiArray",
            cdr(&Float64MultiArray {
                layout: MultiArrayLayout {
                    dim: vec![MultiArrayDimension {
                        label: "j".into(),
                        size: 1,
                        stride: 1,
                    }],
                    data_offset: 0,
                },
                data: vec![0.5],
            }),
        ),
        ("String", cdr(&StringMsg { data: "go".into() })),
        ("Bool", cdr(&BoolMsg { data: true })),
        (
            "DiagnosticArray",
            cdr(&DiagnosticArray {
                header: h,
                status: vec![DiagnosticStatus {
                    level: 1,
                    name: "n".into(),
                    message: "m".into(),
                    hardware_id: "h".into(),
                    values: vec![KeyValue {
                        key: "k".into(),
                        value: "v".into(),
                    }],
                }],
            }),
        ),
        (
            "TriggerRequest",
            cdr(&TriggerRequest {
                structure_needs_at_least_one_member: 0,
            }),
        ),
        (
            "TriggerResponse",
            cdr(&TriggerResponse {
                success: true,
                message: "ok".into(),
            }),
        ),
    ]
}

/// Deserializes `bytes` as every message type, and runs what decodes through its decoder.
fn decode_as_everything(bytes: &[u8]) {
    let clock = ClockMap::now();
    let now = MonoTime::now();
    if let Some(m) = from_cdr::<JointState>(bytes) {
        let _ = JointStateDecoder::new(&["a".to_string(), "b".to_string()]).decode(&m, &clock, now);
    }
    if let Some(m) = from_cdr::<Image>(bytes) {
        let _ = image(&m, &clock, now, CAP);
    }
    if let Some(m) = from_cdr::<CompressedImage>(bytes) {
        let _ = compressed_image(&m, &clock, now, CAP);
    }
    if let Some(m) = from_cdr::<StringMsg>(bytes) {
        let _ = prompt(&m.data);
    }
    let _ = from_cdr::<BoolMsg>(bytes);
    let _ = from_cdr::<JointTrajectory>(bytes);
    let _ = from_cdr::<Float64MultiArray>(bytes);
    let _ = from_cdr::<DiagnosticArray>(bytes);
    let _ = from_cdr::<TriggerRequest>(bytes);
    let _ = from_cdr::<TriggerResponse>(bytes);
    let _ = from_cdr::<Header>(bytes);
}

fn real_png() -> &'static [u8] {
    static PNG: OnceLock<Vec<u8>> = OnceLock::new();
    PNG.get_or_init(|| encoded(image::ImageFormat::Png))
}

fn real_jpeg() -> &'static [u8] {
    static JPEG: OnceLock<Vec<u8>> = OnceLock::new();
    JPEG.get_or_init(|| encoded(image::ImageFormat::Jpeg))
}

fn encoded(format: image::ImageFormat) -> Vec<u8> {
    let img = image::RgbImage::from_fn(24, 16, |x, y| image::Rgb([x as u8 * 9, y as u8 * 13, 77]));
    let mut out = Vec::new();
    img.write_to(&mut std::io::Cursor::new(&mut out), format)
        .unwrap();
    out
}

/// A PNG whose (valid, CRC-checked) header claims `w`x`h` of `color` type, with garbage data.
fn png_claiming(w: u32, h: u32, color: u8, idat: &[u8]) -> Vec<u8> {
    let mut png = vec![0x89, b'P', b'N', b'G', 0x0D, 0x0A, 0x1A, 0x0A];
    let mut chunk = |kind: &[u8], body: &[u8]| {
        png.extend((body.len() as u32).to_be_bytes());
        let mut c = kind.to_vec();
        c.extend(body);
        png.extend(&c);
        png.extend(crc32fast::hash(&c).to_be_bytes());
    };
    let mut ihdr = w.to_be_bytes().to_vec();
    ihdr.extend(h.to_be_bytes());
    ihdr.extend([8, color, 0, 0, 0]);
    chunk(b"IHDR", &ihdr);
    chunk(b"IDAT", idat);
    chunk(b"IEND", &[]);
    png
}

fn bpp(encoding: &str) -> Option<(u64, u64)> {
    match encoding {
        "rgb8" | "bgr8" => Some((3, 3)),
        "mono8" => Some((1, 1)),
        "rgba8" | "bgra8" => Some((4, 3)),
        _ => None,
    }
}

fn encoding() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => prop::sample::select(vec!["rgb8", "bgr8", "mono8", "rgba8", "bgra8"]).prop_map(String::from),
        1 => prop::sample::select(vec!["16UC1", "yuv422", "", "RGB8", "rgb8 ", "bayer_rggb8", "32FC1"]).prop_map(String::from),
        1 => "\\PC{0,12}",
    ]
}

fn side() -> impl Strategy<Value = u32> {
    prop_oneof![
        1 => Just(0u32),
        6 => 1u32..40,
        1 => (MAX_IMAGE_SIDE - 1)..(MAX_IMAGE_SIDE + 2),
        1 => Just(u32::MAX),
        1 => any::<u32>(),
    ]
}

#[derive(Clone, Copy, Debug)]
enum Step {
    Zero,
    Exact,
    Padded(u32),
    Short,
    Any(u32),
}

#[derive(Clone, Copy, Debug)]
enum Len {
    Exact,
    OneShort,
    OneLong,
    Any(usize),
}

/// An image whose fields are consistent or off in one of the ways drivers get them wrong.
fn raw_image() -> impl Strategy<Value = Image> {
    let step = prop_oneof![
        1 => Just(Step::Zero),
        3 => Just(Step::Exact),
        2 => (1u32..9).prop_map(Step::Padded),
        1 => Just(Step::Short),
        1 => any::<u32>().prop_map(Step::Any),
    ];
    let len = prop_oneof![
        4 => Just(Len::Exact),
        1 => Just(Len::OneShort),
        1 => Just(Len::OneLong),
        1 => (0usize..4000).prop_map(Len::Any),
    ];
    (encoding(), side(), side(), step, len, any::<u8>()).prop_map(
        |(encoding, width, height, step, len, is_bigendian)| {
            let row = u64::from(width) * bpp(&encoding).map_or(3, |b| b.0);
            let step = match step {
                Step::Zero => 0,
                Step::Exact => row,
                Step::Padded(p) => row + u64::from(p),
                Step::Short => row.saturating_sub(1),
                Step::Any(s) => u64::from(s),
            };
            let step = u32::try_from(step).unwrap_or(u32::MAX);
            let need = u64::from(step) * u64::from(height);
            // Sizes a test can hold; beyond, the data is short (the sizes disagree).
            let exact = usize::try_from(need).ok().filter(|n| *n <= 200_000);
            let len = match (len, exact) {
                (Len::Exact, Some(n)) => n,
                (Len::OneShort, Some(n)) => n.saturating_sub(1),
                (Len::OneLong, Some(n)) => n + 1,
                (Len::Any(n), _) => n,
                (_, None) => 16,
            };
            Image {
                header: header(Time::default()),
                height,
                width,
                encoding,
                is_bigendian,
                step,
                data: (0..len).map(|i| i as u8).collect(),
            }
        },
    )
}

/// Stamps near now, ahead of it, or arbitrary (negative, unnormalized nanoseconds).
fn stamp(clock: &ClockMap, now: MonoTime, s: (u8, f64, i32, u32)) -> Time {
    match s.0 % 4 {
        0 | 1 => clock.to_ros(now.offset_seconds(s.1.clamp(-2.0, 0.4))),
        2 => clock.to_ros(now.offset_seconds(0.6 + s.1.abs() * 100.0)),
        _ => Time {
            sec: s.2,
            nanosec: s.3,
        },
    }
}

fn stamp_parts() -> impl Strategy<Value = (u8, f64, i32, u32)> {
    (any::<u8>(), -2.0f64..0.4, any::<i32>(), any::<u32>())
}

fn position() -> impl Strategy<Value = f64> {
    prop_oneof![
        8 => -3.0f64..3.0,
        1 => Just(f64::NAN),
        1 => Just(f64::INFINITY),
        1 => Just(f64::NEG_INFINITY),
    ]
}

proptest! {
    #![proptest_config(cases(10_000))]

    #[test]
    fn when_image_fields_consistent_or_off_expect_accept_exactly_the_consistent_ones(
        mut msg in raw_image(), s in stamp_parts(),
    ) {
        let clock = ClockMap::now();
        let now = MonoTime::now();
        msg.header.stamp = clock.to_ros(now.offset_seconds(s.1.clamp(-1.0, 0.4)));
        let (w, h, step) = (u64::from(msg.width), u64::from(msg.height), u64::from(msg.step));
        let consistent = bpp(&msg.encoding).is_some_and(|(bpp, _)| {
            w > 0 && h > 0
                && w <= u64::from(MAX_IMAGE_SIDE) && h <= u64::from(MAX_IMAGE_SIDE)
                && step >= w * bpp
                && msg.data.len() as u64 == step * h
                && step * h <= CAP as u64
        });
        match image(&msg, &clock, now, CAP) {
            Ok(frame) => {
                let (_, channels) = bpp(&msg.encoding).unwrap();
                prop_assert!(consistent, "accepted an inconsistent image {msg:?}");
                prop_assert!(frame.width > 0 && frame.height > 0);
                prop_assert_eq!((frame.width, frame.height), (msg.width, msg.height));
                prop_assert_eq!(frame.data.len() as u64, w * h * channels);
            }
            Err(e) => {
                prop_assert!(!consistent, "refused a consistent image: {e}");
                prop_assert_eq!(e.to_string().lines().count(), 1);
            }
        }
    }

    #[test]
    fn when_joint_state_arbitrary_expect_accept_exactly_the_well_formed(
        picks in prop::collection::vec(0usize..5, 0..8),
        values in prop::collection::vec(position(), 0..9),
        extra in 0usize..3,
        s in stamp_parts(),
    ) {
        const POOL: [&str; 5] = ["a", "b", "c", "x", "a "];
        let known = ["a".to_string(), "b".to_string(), "c".to_string()];
        let clock = ClockMap::now();
        let now = MonoTime::now();
        let name: Vec<String> = picks.iter().map(|i| POOL[*i].to_string()).collect();
        // Mostly as many positions as names; sometimes one off either way.
        let n = match extra { 0 => name.len(), 1 => name.len() + 1, _ => name.len().saturating_sub(1) };
        let position: Vec<f64> = values.iter().copied().cycle().take(if values.is_empty() { 0 } else { n }).collect();
        let msg = JointState {
            header: header(stamp(&clock, now, s)),
            name, position, velocity: vec![], effort: vec![],
        };
        let mut d = JointStateDecoder::new(&known);
        let result = d.decode(&msg, &clock, now);
        let known_named: Vec<&String> = msg.name.iter().filter(|n| known.contains(n)).collect();
        let duplicate = known_named.iter().enumerate().any(|(i, n)| known_named[..i].contains(n));
        let stamp_ok = clock.to_mono(&msg.header.stamp).is_ok_and(|t| t.seconds_since(now) <= 0.5);
        let well_formed = msg.name.len() == msg.position.len()
            && msg.position.iter().all(|v| v.is_finite())
            && !duplicate && stamp_ok;
        match result {
            Ok(m) => {
                prop_assert!(well_formed, "accepted {msg:?}");
                let all = known.iter().all(|k| msg.name.contains(k));
                prop_assert_eq!(m.is_some(), all);
                if let Some(m) = m {
                    for (n, v) in msg.name.iter().zip(&msg.position) {
                        if let Some(i) = known.iter().position(|k| k == n) {
                            prop_assert_eq!(m.position[i], *v);
                        }
                    }
                }
            }
            Err(e) => prop_assert!(!well_formed, "refused a well-formed state: {e}"),
        }
    }

    #[test]
    fn when_prompt_arbitrary_expect_refused_exactly_when_too_long_or_with_control_characters(
        text in prop_oneof![
            "\\PC{0,40}",
            any::<String>(),
            "[ -~\n\t\r\u{1b}\u{0}\u{85}é]{0,1100}",
            (1000usize..1100).prop_map(|n| "ab\n".repeat(n / 3)),
        ],
    ) {
        let ok = text.len() <= MAX_PROMPT_BYTES
            && text.chars().all(|c| !c.is_control() || c == '\n' || c == '\t');
        match prompt(&text) {
            Ok(p) => { prop_assert!(ok); prop_assert_eq!(p, text.as_str()); }
            Err(e) => {
                prop_assert!(!ok, "refused {text:?}: {e}");
                prop_assert!(matches!(e.kind(), InputErrorKind::PromptTooLong | InputErrorKind::PromptControl));
            }
        }
    }

    #[test]
    fn when_cdr_bytes_random_expect_no_panic(bytes in prop::collection::vec(any::<u8>(), 0..600)) {
        decode_as_everything(&bytes);
    }

    #[test]
    fn when_valid_cdr_truncated_or_flipped_expect_no_panic(
        which in 0usize..10, cut in 0usize..600, flips in prop::collection::vec((any::<prop::sample::Index>(), 0u8..8), 0..4),
    ) {
        let all = samples();
        let (_, mut bytes) = all[which % all.len()].clone();
        for (at, bit) in &flips {
            let i = at.index(bytes.len());
            bytes[i] ^= 1 << bit;
        }
        bytes.truncate(bytes.len().saturating_sub(cut % (bytes.len() + 1)));
        decode_as_everything(&bytes);
    }
}

proptest! {
    #![proptest_config(cases(2000))]

    #[test]
    fn when_compressed_data_random_truncated_or_flipped_expect_frame_or_reason(
        source in 0u8..3,
        random in prop::collection::vec(any::<u8>(), 0..300),
        cut in 0usize..2000,
        flips in prop::collection::vec((any::<prop::sample::Index>(), 0u8..8), 0..3),
    ) {
        let clock = ClockMap::now();
        let now = MonoTime::now();
        let mut data = match source {
            0 => random,
            1 => real_png().to_vec(),
            _ => real_jpeg().to_vec(),
        };
        for (at, bit) in &flips {
            if !data.is_empty() {
                let i = at.index(data.len());
                data[i] ^= 1 << bit;
            }
        }
        data.truncate(data.len().saturating_sub(cut % (data.len() + 1)));
        let msg = CompressedImage { header: header(clock.to_ros(now)), format: "jpeg".into(), data };
        if let Ok(f) = compressed_image(&msg, &clock, now, CAP) {
            prop_assert!(f.width > 0 && f.height > 0);
            prop_assert_eq!(f.data.len(), f.width as usize * f.height as usize * 3);
        }
    }

    #[test]
    fn when_png_header_claims_any_size_expect_refused_unless_within_the_cap(
        w in side(), h in side(), color in prop::sample::select(vec![0u8, 2, 4, 6]),
        idat in prop::collection::vec(any::<u8>(), 0..64),
    ) {
        let clock = ClockMap::now();
        let now = MonoTime::now();
        let msg = CompressedImage {
            header: header(clock.to_ros(now)),
            format: "png".into(),
            data: png_claiming(w, h, color, &idat),
        };
        match compressed_image(&msg, &clock, now, CAP) {
            Ok(f) => {
                prop_assert!(u64::from(w) * u64::from(h) * 3 <= CAP as u64);
                prop_assert_eq!((f.width, f.height), (w, h));
                prop_assert_eq!(f.data.len() as u64, u64::from(w) * u64::from(h) * 3);
            }
            Err(e) => prop_assert_eq!(e.to_string().lines().count(), 1),
        }
    }
}

#[test]
fn when_images_a_driver_sends_before_streaming_expect_refused_not_panic() {
    let clock = ClockMap::now();
    let now = MonoTime::now();
    for (w, h, step) in [(0, 0, 0), (0, 480, 0), (640, 0, 1920), (640, 480, 0)] {
        let msg = Image {
            header: header(clock.to_ros(now)),
            height: h,
            width: w,
            encoding: "rgb8".into(),
            is_bigendian: 0,
            step,
            data: vec![],
        };
        assert!(
            image(&msg, &clock, now, CAP).is_err(),
            "{w}x{h} step {step}"
        );
    }
}

#[test]
fn when_png_claims_100000_square_expect_refused_before_any_pixel_is_allocated() {
    let clock = ClockMap::now();
    let now = MonoTime::now();
    let msg = CompressedImage {
        header: header(clock.to_ros(now)),
        format: "png".into(),
        data: png_claiming(100_000, 100_000, 6, &[0x78, 0x9c, 3, 0]),
    };
    let t = std::time::Instant::now();
    let e = compressed_image(&msg, &clock, now, 8 << 20).unwrap_err();
    assert!(
        matches!(
            e.kind(),
            InputErrorKind::Dimensions | InputErrorKind::Compressed
        ),
        "{e}"
    );
    assert!(t.elapsed().as_secs_f64() < 0.5);
}

#[test]
fn when_every_message_type_round_trips_expect_equal() {
    for (name, bytes) in samples() {
        let again = match name {
            "JointState" => cdr(&from_cdr::<JointState>(&bytes).unwrap()),
            "Image" => cdr(&from_cdr::<Image>(&bytes).unwrap()),
            "CompressedImage" => cdr(&from_cdr::<CompressedImage>(&bytes).unwrap()),
            "JointTrajectory" => cdr(&from_cdr::<JointTrajectory>(&bytes).unwrap()),
            "Float64MultiArray" => cdr(&from_cdr::<Float64MultiArray>(&bytes).unwrap()),
            "String" => cdr(&from_cdr::<StringMsg>(&bytes).unwrap()),
            "Bool" => cdr(&from_cdr::<BoolMsg>(&bytes).unwrap()),
            "DiagnosticArray" => cdr(&from_cdr::<DiagnosticArray>(&bytes).unwrap()),
            "TriggerRequest" => cdr(&from_cdr::<TriggerRequest>(&bytes).unwrap()),
            "TriggerResponse" => cdr(&from_cdr::<TriggerResponse>(&bytes).unwrap()),
            other => panic!("no round trip for {other}"),
        };
        assert_eq!(again, bytes, "{name}");
    }
}

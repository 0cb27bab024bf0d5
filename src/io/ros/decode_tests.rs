//! Unit tests of `decode`: joint states, images, prompts and stamps.

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
    let img = image::RgbImage::from_fn(5, 3, |x, y| image::Rgb([x as u8 * 10, y as u8 * 20, 7]));
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
    let e = compressed_image(&msg(png_header(100_000, 100_000)), &clock, now, 8 << 20).unwrap_err();
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

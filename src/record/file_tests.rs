//! The size cap: a closed file is never larger than `record.max_megabytes`, and whole.

use super::*;

fn scratch(name: &str) -> crate::test_dirs::TempDir {
    crate::test_dirs::TempDir::new(&format!("record-file-{name}"))
}

fn topics() -> Topics {
    Topics {
        joint_names: vec!["a".into(), "b".into()],
        joint_states: "/joint_states".into(),
        cameras: vec!["front".into(), "wrist".into()],
        node: "pi0d".into(),
    }
}

fn metadata() -> BTreeMap<String, String> {
    [("prompt", "pick up the cube"), ("version", "test")]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// `n` bytes: noise (as a JPEG compresses: not at all) or a repeated pattern.
fn payload(n: usize, noise: bool, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|i| {
            if noise {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            } else {
                (i % 7) as u8
            }
        })
        .collect()
}

#[test]
fn when_messages_reach_the_cap_expect_the_closed_file_within_it_and_whole() {
    let dir = scratch("cap");
    // (cap, message size, noise, messages between flushes)
    let cases = [
        (100_000, 3_000, true, 7),
        (100_000, 20_000, true, 1_000),
        (100_000, 200, false, 50),
        (100_000, 1, false, 1_000_000),
        (250_000, 90_000, true, 3),
        (3_000_000, 150_000, true, 1_000),
        (3_000_000, 700, false, 1_000_000),
    ];
    for (k, (cap, size, noise, flush_every)) in cases.into_iter().enumerate() {
        let path = dir.join(format!("capped-{k}.mcap"));
        let mut f = McapFile::create(&path, &topics(), &metadata(), cap).unwrap();
        let mut written = 0u64;
        let at = MonoTime::now();
        loop {
            let data = payload(size, noise, written);
            match f.put(f.ch.cameras[0], at, at, &data) {
                Ok(()) => written += 1,
                Err(RecordError::Full { path: p, max_bytes }) => {
                    assert_eq!((p, max_bytes), (path.clone(), cap));
                    break;
                }
                Err(e) => panic!("case {k}: {e}"),
            }
            if written.is_multiple_of(flush_every) {
                f.flush().unwrap();
            }
        }
        let bound = f.size.bound();
        let (messages, bytes) = f.finish().unwrap();
        let on_disk = std::fs::metadata(&path).unwrap().len();
        let case =
            format!("case {k}: {written} messages of {size} bytes, cap {cap}, {on_disk} bytes");
        assert_eq!((messages, bytes), (written, on_disk), "{case}");
        assert!(on_disk <= bound && bound <= cap, "{case}, bound {bound}");
        // It stopped only when the next message could not fit, not long before.
        let slack = size as u64 + size as u64 / 64 + 4096;
        assert!(on_disk + slack >= cap, "{case}");
        // Whole: every message reads back, and the index is there.
        let bytes = std::fs::read(&path).unwrap();
        let read = mcap::MessageStream::new(&bytes)
            .unwrap()
            .collect::<Result<Vec<_>, _>>()
            .unwrap();
        assert_eq!(read.len() as u64, written, "{case}");
        let summary = mcap::Summary::read(&bytes).unwrap().expect("a summary");
        assert_eq!(summary.stats.unwrap().message_count, written, "{case}");
    }
}

#[test]
fn when_the_cap_cannot_hold_the_index_expect_too_small_and_no_file() {
    let dir = scratch("small");
    let path = dir.join("tiny.mcap");
    let e = McapFile::create(&path, &topics(), &metadata(), 5_000)
        .err()
        .expect("refused");
    assert!(
        matches!(e, RecordError::TooSmall { max_bytes: 5_000, needed, .. } if needed > 5_000),
        "{e:?}"
    );
    assert!(e.to_string().contains(&path.display().to_string()), "{e}");
    assert!(!path.exists());
}

#[test]
fn when_a_chunk_is_open_at_close_expect_the_file_within_the_bound() {
    let dir = scratch("open");
    for (k, (size, count, noise)) in [
        (1, 1, true),
        (1_000, 3, true),
        (100_000, 3, true),
        (200_000, 5, true),
        (300, 3000, false),
    ]
    .into_iter()
    .enumerate()
    {
        let path = dir.join(format!("open-{k}.mcap"));
        let mut f = McapFile::create(&path, &topics(), &metadata(), 100_000_000).unwrap();
        let at = MonoTime::now();
        for i in 0..count {
            let channel = [f.ch.cameras[1], f.ch.command, f.ch.events][i % 3];
            f.put(channel, at, at, &payload(size, noise, i as u64))
                .unwrap();
        }
        let bound = f.size.bound();
        let (_, bytes) = f.finish().unwrap();
        assert!(bytes <= bound, "case {k}: {bytes} bytes, bound {bound}");
    }
}

#[test]
fn when_a_frame_came_in_with_a_ros_stamp_expect_the_recording_to_hold_that_stamp() {
    // The camera thread converts the frame's stamp to the monotonic clock with its own map, the
    // recorder back with the file's offset: a frame recorded must carry the stamp it was sent
    // with, to the nanosecond, or a recording cannot be matched to the robot's frames.
    let dir = scratch("stamp");
    let path = dir.join("stamp.mcap");
    let mut f = McapFile::create(&path, &topics(), &metadata(), 1_000_000).unwrap();
    let camera_clock = std::thread::spawn(crate::io::ros::timing::ClockMap::now)
        .join()
        .unwrap();
    let now = camera_clock.to_ros(MonoTime::now());
    let sent = [
        msgs::Time {
            sec: now.sec - 1,
            nanosec: 26_366_123,
        },
        msgs::Time {
            sec: now.sec,
            nanosec: 999_999_999,
        },
    ];
    for t in sent {
        let frame = CameraFrame {
            stamp: camera_clock.to_mono(&t).unwrap(),
            width: 4,
            height: 2,
            format: PixelFormat::Rgb8,
            data: vec![128; 4 * 2 * 3],
        };
        f.frame(0, &frame).unwrap();
    }
    f.finish().unwrap();
    let bytes = std::fs::read(&path).unwrap();
    let recorded: Vec<msgs::Time> = mcap::MessageStream::new(&bytes)
        .unwrap()
        .map(|m| m.unwrap())
        .filter(|m| m.channel.topic == camera_topic("front"))
        .map(|m| {
            cdr_encoding::from_bytes::<msgs::CompressedImage, LittleEndian>(&m.data[4..])
                .unwrap()
                .0
                .header
                .stamp
        })
        .collect();
    assert_eq!(recorded, sent);
}

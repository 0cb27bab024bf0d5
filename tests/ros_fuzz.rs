//! Fuzz-style tests of the ROS input path: random and truncated CDR never panics (it decodes or
//! fails), and whatever decodes is either accepted as a valid input or refused with a reason.

use byteorder::LittleEndian;
use pi0d::io::ros::decode::{image, ClockMap, JointStateDecoder};
use pi0d::io::ros::msgs::*;
use pi0d::time::MonoTime;
use proptest::prelude::*;

fn valid_joint_state() -> Vec<u8> {
    cdr_encoding::to_vec::<_, LittleEndian>(&JointState {
        header: Header {
            stamp: Time { sec: 5, nanosec: 6 },
            frame_id: "base".into(),
        },
        name: vec!["a".into(), "b".into()],
        position: vec![0.1, 0.2],
        velocity: vec![],
        effort: vec![],
    })
    .unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn when_bytes_are_random_expect_no_panic(bytes in prop::collection::vec(any::<u8>(), 0..600)) {
        let clock = ClockMap::now();
        let now = MonoTime::now();
        if let Ok((m, _)) = cdr_encoding::from_bytes::<JointState, LittleEndian>(&bytes) {
            let mut d = JointStateDecoder::new(&["a".to_string(), "b".to_string()]);
            let _ = d.decode(&m, &clock, now);
        }
        if let Ok((m, _)) = cdr_encoding::from_bytes::<Image, LittleEndian>(&bytes) {
            let _ = image(&m, &clock, now, 1 << 20);
        }
        let _ = cdr_encoding::from_bytes::<JointTrajectory, LittleEndian>(&bytes);
        let _ = cdr_encoding::from_bytes::<StringMsg, LittleEndian>(&bytes);
        let _ = cdr_encoding::from_bytes::<BoolMsg, LittleEndian>(&bytes);
    }

    #[test]
    fn when_valid_message_truncated_or_flipped_expect_no_panic(cut in 0usize..64, flip in 0usize..64, bit in 0u8..8) {
        let mut bytes = valid_joint_state();
        let n = bytes.len();
        if flip < n {
            bytes[flip] ^= 1 << bit;
        }
        bytes.truncate(n.saturating_sub(cut));
        let clock = ClockMap::now();
        if let Ok((m, _)) = cdr_encoding::from_bytes::<JointState, LittleEndian>(&bytes) {
            let mut d = JointStateDecoder::new(&["a".to_string(), "b".to_string()]);
            let _ = d.decode(&m, &clock, MonoTime::now());
        }
    }

    #[test]
    fn when_image_fields_are_arbitrary_expect_accept_only_consistent_ones(
        w in 0u32..64, h in 0u32..64, step in 0u32..300, len in 0usize..10_000,
        enc in prop::sample::select(vec!["rgb8", "bgr8", "mono8", "rgba8", "bgra8", "16UC1", ""]),
    ) {
        let clock = ClockMap::now();
        let now = MonoTime::now();
        let msg = Image {
            header: Header { stamp: clock.to_ros(now), frame_id: String::new() },
            height: h, width: w, encoding: enc.into(), is_bigendian: 0, step, data: vec![1; len],
        };
        if let Ok(frame) = image(&msg, &clock, now, 1 << 20) {
            let bpp = match enc { "mono8" => 1, _ => 3 };
            prop_assert_eq!(frame.data.len(), (w * h) as usize * bpp);
            prop_assert_eq!(len, (step * h) as usize);
        }
    }
}

#[test]
fn when_whole_valid_message_expect_it_decodes() {
    let (m, _) =
        cdr_encoding::from_bytes::<JointState, LittleEndian>(&valid_joint_state()).unwrap();
    assert_eq!(m.name, ["a", "b"]);
}

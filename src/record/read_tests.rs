//! The reader on recordings pi0d could have written and on files crafted to hurt it.

use super::*;
use crate::record::plot;
use std::fs::File;

fn scratch(name: &str) -> crate::test_dirs::TempDir {
    crate::test_dirs::TempDir::new(&format!("read-{name}"))
}

/// A JointState as pi0d records it (CDR with its encapsulation header).
fn joint_state(names: &[String], position: &[f64], stamp_ns: u64) -> Vec<u8> {
    let msg = msgs::JointState {
        header: msgs::Header {
            stamp: msgs::Time {
                sec: (stamp_ns / 1_000_000_000) as i32,
                nanosec: (stamp_ns % 1_000_000_000) as u32,
            },
            frame_id: String::new(),
        },
        name: names.to_vec(),
        position: position.to_vec(),
        velocity: vec![0.0; position.len()],
        effort: Vec::new(),
    };
    let mut out = vec![0, 1, 0, 0];
    cdr_encoding::to_writer::<_, LittleEndian, _>(&mut out, &msg).unwrap();
    out
}

/// Writes an MCAP file with a `/pi0d/command` channel (JointState), a `/pi0d/events` channel
/// and a raw `/other` one; `fill` writes messages with `(channel, log_ns, data)`.
fn crafted(
    dir: &Path,
    name: &str,
    fill: impl FnOnce(&mut dyn FnMut(Channel, u64, &[u8])),
) -> PathBuf {
    let path = dir.join(name);
    let file = std::io::BufWriter::new(File::create(&path).unwrap());
    let mut w = mcap::WriteOptions::new()
        .compression(Some(mcap::Compression::Zstd))
        .create(file)
        .unwrap();
    let none = BTreeMap::new();
    let js = w
        .add_schema("sensor_msgs/msg/JointState", "ros2msg", b"")
        .unwrap();
    let command = w.add_channel(js, COMMAND_TOPIC, "cdr", &none).unwrap();
    let events = w.add_channel(0, EVENTS_TOPIC, "json", &none).unwrap();
    let other = w.add_channel(0, "/other", "raw", &none).unwrap();
    let mut seq = 0;
    fill(&mut |c, log_ns, data| {
        seq += 1;
        let header = mcap::records::MessageHeader {
            channel_id: match c {
                Channel::Command => command,
                Channel::Events => events,
                Channel::Other => other,
            },
            sequence: seq,
            log_time: log_ns,
            publish_time: log_ns,
        };
        w.write_to_known_channel(&header, data).unwrap();
    });
    w.finish().unwrap();
    path
}

#[derive(Clone, Copy)]
enum Channel {
    Command,
    Events,
    Other,
}

fn names(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("j{i}")).collect()
}

const T0: u64 = 1_700_000_000_000_000_000;

#[test]
fn when_a_hold_interrupts_running_expect_one_span_until_running_again() {
    let events: Vec<(u64, String)> = [
        (1_000_000_000, "running"),
        (2_000_000_000, "estopped"),
        (3_000_000_000, "holding(after_reset)"),
        (3_500_000_000, "running"),
        (4_000_000_000, "stopping"),
    ]
    .into_iter()
    .map(|(t, s)| (t, s.to_string()))
    .collect();
    let s = spans(&events, |ns| ns as f64 * 1e-9, 5.0);
    let got: Vec<(f64, f64, &str)> = s
        .iter()
        .map(|s| (s.from_s, s.to_s, s.state.as_str()))
        .collect();
    assert_eq!(
        got,
        [
            (2.0, 3.0, "estopped"),
            (3.0, 3.5, "holding(after_reset)"),
            (4.0, 5.0, "stopping")
        ]
    );
}

#[test]
fn when_transitions_come_out_of_order_expect_spans_that_never_overlap() {
    let events: Vec<(u64, String)> = [(5, "estopped"), (1, "holding(x)"), (7, "running")]
        .into_iter()
        .map(|(t, s)| (t * 1_000_000_000, s.to_string()))
        .collect();
    let s = spans(&events, |ns| ns as f64 * 1e-9, 9.0);
    assert_eq!(
        s,
        [Span {
            from_s: 5.0,
            to_s: 7.0,
            state: "estopped".into()
        }]
    );
}

#[test]
fn when_positions_ramp_expect_their_slope_as_velocity() {
    let mut out = Thinned::new(1, 100);
    let mut d = Differentiated::new();
    for i in 0..4u64 {
        d.push(i * 100_000_000, &[i as f64 * 0.2], &mut out);
    }
    d.finish(&mut out);
    assert_eq!(out.ns.len(), 4);
    for v in &out.velocity[0] {
        assert!((v - 2.0).abs() < 1e-9, "{v}");
    }
}

#[test]
fn when_a_long_run_is_read_expect_it_thinned_evenly_within_the_bound() {
    let mut out = Thinned::new(2, 100);
    for i in 0..100_000u64 {
        out.push(i, &[i as f64, -(i as f64)], |_| 1.0);
    }
    assert!(
        (50..=100).contains(&out.ns.len()),
        "{} samples kept",
        out.ns.len()
    );
    assert_eq!(out.ns[0], 0);
    let stride = out.ns[1] - out.ns[0];
    assert!(out.ns.windows(2).all(|w| w[1] - w[0] == stride));
    // The last kept sample is within one stride of the end.
    assert!(99_999 - out.ns.last().unwrap() < stride);
    for (k, &ns) in out.ns.iter().enumerate() {
        assert_eq!(out.position[0][k], ns as f64);
        assert_eq!(out.position[1][k], -(ns as f64));
    }
}

#[test]
fn when_a_recording_names_5000_joints_expect_an_error_naming_the_file_and_the_count() {
    let dir = scratch("joints");
    let many = names(5000);
    let file = crafted(&dir, "many.mcap", |put| {
        for i in 0..3 {
            put(
                Channel::Command,
                T0 + i,
                &joint_state(&many, &vec![0.0; 5000], T0),
            );
        }
    });
    let e = read(&file).map(|t| t.joints.len()).unwrap_err();
    assert!(matches!(e, ReadError::Joints { count: 5000, .. }), "{e:?}");
    let text = e.to_string();
    assert!(
        text.contains(&file.display().to_string()) && text.contains("5000 joints"),
        "{text}"
    );
}

#[test]
fn when_positions_alternate_at_1e308_expect_a_plot_with_finite_axes() {
    let dir = scratch("huge");
    let two = names(2);
    let file = crafted(&dir, "huge.mcap", |put| {
        for i in 0..200u64 {
            let v = if i % 2 == 0 { 1e308 } else { -1e308 };
            put(
                Channel::Command,
                T0 + i * 5_000_000,
                &joint_state(&two, &[v, 0.5], T0),
            );
        }
    });
    let trace = read(&file).unwrap();
    assert_eq!(trace.command.t.len(), 200);
    let png = dir.join("huge.png");
    plot::plot(&trace, &png).unwrap();
    assert!(png.exists());
}

#[test]
fn when_a_small_file_inflates_past_its_bound_expect_it_read_in_part() {
    let dir = scratch("inflate");
    let two = names(2);
    let zeros = vec![0u8; 256 << 10];
    let file = crafted(&dir, "bomb.mcap", |put| {
        for i in 0..40u64 {
            put(
                Channel::Command,
                T0 + i * 5_000_000,
                &joint_state(&two, &[0.1, 0.2], T0),
            );
            put(Channel::Other, T0 + i * 5_000_000, &zeros);
        }
    });
    let size = std::fs::metadata(&file).unwrap().len();
    // 10 MB of zeros in a file of a few kB.
    assert!(size < 100_000, "{size}");
    let limits = ReadLimits {
        stream: Bounds {
            decoded_floor: 1 << 20,
            ..Bounds::default()
        },
        ..ReadLimits::default()
    };
    let bound = (1 << 20u64).max(size * limits.stream.decoded_per_file_byte);
    let trace = read_within(&file, limits).unwrap();
    assert_eq!(trace.partial, Some(Partial::Decoded { bytes: bound }));
    let commands = trace.command.t.len() as u64;
    assert!(commands > 0 && commands < 40, "{commands} commands read");
    // Within the default bound, the whole file.
    let whole = read(&file).unwrap();
    assert_eq!((whole.command.t.len(), whole.partial), (40, None));
}

#[test]
fn when_a_file_holds_more_transitions_than_are_read_expect_it_read_in_part() {
    let dir = scratch("transitions");
    let two = names(2);
    let file = crafted(&dir, "flapping.mcap", |put| {
        put(Channel::Command, T0, &joint_state(&two, &[0.0, 0.0], T0));
        for i in 0..50u64 {
            let to = if i % 2 == 0 { "estopped" } else { "running" };
            let e = format!(r#"{{"kind":"transition","to":"{to}"}}"#);
            put(Channel::Events, T0 + i, e.as_bytes());
        }
    });
    let limits = ReadLimits {
        transitions: 10,
        ..ReadLimits::default()
    };
    let trace = read_within(&file, limits).unwrap();
    assert_eq!(trace.partial, Some(Partial::Transitions { max: 10 }));
    assert_eq!(trace.spans.len(), 5);
}

#[test]
fn when_a_metadata_record_is_huge_expect_an_error_naming_the_file() {
    let dir = scratch("metadata");
    let path = dir.join("meta.mcap");
    let mut w = mcap::Writer::new(std::io::BufWriter::new(File::create(&path).unwrap())).unwrap();
    w.write_metadata(&mcap::records::Metadata {
        name: "pi0d".into(),
        metadata: [("prompt".to_string(), "x".repeat(METADATA_BYTES + 1))].into(),
    })
    .unwrap();
    w.finish().unwrap();
    drop(w);
    let e = read(&path).unwrap_err();
    assert!(matches!(e, ReadError::Metadata { .. }), "{e:?}");
    assert!(e.to_string().contains(&path.display().to_string()), "{e}");
}

#[test]
fn when_a_file_is_empty_or_junk_expect_not_mcap_naming_it() {
    let dir = scratch("junk");
    for (name, bytes) in [
        ("empty.mcap", &b""[..]),
        ("junk.mcap", b"not a recording at all"),
    ] {
        let path = dir.join(name);
        std::fs::write(&path, bytes).unwrap();
        let e = read(&path).unwrap_err();
        assert!(matches!(e, ReadError::NotMcap { .. }), "{name}: {e:?}");
        assert!(e.to_string().contains(&path.display().to_string()), "{e}");
    }
}

#[test]
fn when_a_file_has_no_commands_expect_not_pi0d_naming_it() {
    let dir = scratch("foreign");
    let file = crafted(&dir, "foreign.mcap", |put| {
        put(Channel::Other, T0, b"hello");
    });
    let e = read(&file).unwrap_err();
    assert!(matches!(e, ReadError::NotPi0d { .. }), "{e:?}");
    assert!(e.to_string().contains(&file.display().to_string()), "{e}");
}

mod mutated {
    use super::*;
    use proptest::prelude::*;

    /// A recording with commands, a hold and chunks, its bytes.
    fn recording(dir: &Path) -> Vec<u8> {
        let two = names(2);
        let file = crafted(dir, "whole.mcap", |put| {
            for i in 0..300u64 {
                let at = T0 + i * 5_000_000;
                let p = [(i as f64 * 0.01).sin(), 0.3];
                put(Channel::Command, at, &joint_state(&two, &p, at));
                if i % 100 == 50 {
                    let to = if i == 150 { "estopped" } else { "running" };
                    let e = format!(r#"{{"kind":"transition","to":"{to}"}}"#);
                    put(Channel::Events, at, e.as_bytes());
                }
            }
        });
        std::fs::read(file).unwrap()
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

        /// Whatever bytes are changed or cut, reading gives a trace or an error naming the
        /// file, and a trace plots: nothing panics.
        #[test]
        fn when_a_recording_is_damaged_anywhere_expect_a_trace_or_an_error_naming_it(
            edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
            cut in proptest::option::of(any::<prop::sample::Index>()),
        ) {
            let dir = scratch("mutated");
            let mut bytes = recording(&dir);
            for (at, v) in edits {
                let k = at.index(bytes.len());
                bytes[k] = v;
            }
            if let Some(c) = cut {
                bytes.truncate(c.index(bytes.len()));
            }
            let path = dir.join("damaged.mcap");
            std::fs::write(&path, &bytes).unwrap();
            match read(&path) {
                Ok(trace) => {
                    plot::plot(&trace, &dir.join("damaged.png")).unwrap();
                }
                Err(e) => {
                    prop_assert!(e.to_string().contains(&path.display().to_string()), "{}", e);
                }
            }
        }
    }
}

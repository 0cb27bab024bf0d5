//! MCAP recordings (`[record]`) of real daemon runs, read back with the Python `mcap` and
//! `mcap-ros2-support` packages (tests/peers/mcap_check.py): every channel decodes, the ROS 2
//! schemas equal rosbags' Jazzy definitions, and what the file says matches the run's summary.
//! And `pi0d plot` on recordings crafted to hurt it.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;
use toml::Value;

fn recorded(mut cfg: toml::Table, settings: &[(&str, Value)]) -> toml::Table {
    cfg.insert("record".into(), table(settings));
    cfg
}

fn recording_file(run: &Run) -> PathBuf {
    let r = &run.summary()["recording"];
    PathBuf::from(
        r["path"]
            .as_str()
            .unwrap_or_else(|| panic!("no recording in {r}")),
    )
}

#[test]
fn when_a_run_is_recorded_expect_every_channel_read_back_and_agreeing_with_the_summary() {
    let dir = scratch_dir("record-dir");
    let cfg = sim_config();
    let cfg = recorded(
        cfg,
        &[
            ("path", Value::String(format!("{}/", dir.display()))),
            ("camera_hz", Value::Float(5.0)),
        ],
    );
    let mut cfg = cfg;
    cfg["sim"].as_table_mut().unwrap().insert(
        "events".into(),
        Value::Array(vec![
            table(&[
                ("at_s", Value::Float(1.5)),
                ("event", Value::String("estop".into())),
            ]),
            table(&[
                ("at_s", Value::Float(2.0)),
                ("event", Value::String("reset".into())),
            ]),
        ]),
    );
    let run = run_daemon("record", &cfg, 4.0);
    assert_eq!(run.code(), 0, "{}", run.stderr);
    let s = run.summary();
    let rec = &s["recording"];
    assert_eq!(rec["ended_by"], "run_end", "{rec}");
    assert_eq!(rec["dropped"], 0, "{rec}");
    let file = recording_file(&run);
    // One file per run in the directory, named by the UTC time.
    assert_eq!(file.parent(), Some(dir.path()));
    let name = file.file_name().unwrap().to_string_lossy().to_string();
    assert!(
        name.starts_with("pi0d-") && name.ends_with("Z.mcap") && name.len() == 26,
        "{name}"
    );
    let back = mcap_read_back(&file);
    let topics = &back["topics"];
    let count = |t: &str| topics[t]["count"].as_u64().unwrap_or(0);
    assert_eq!(
        back["statistics_message_count"], rec["messages"],
        "the file's statistics and the summary agree"
    );

    // Every ROS 2 schema is the definition rosbags has for ROS 2 Jazzy.
    for (name, schema) in back["schemas"].as_object().unwrap() {
        if schema["encoding"] == "ros2msg" {
            assert_eq!(schema["matches_rosbags"], true, "{name}: {schema}");
        }
    }
    for (topic, schema, enc) in [
        ("/joint_states", "sensor_msgs/msg/JointState", "cdr"),
        ("/pi0d/command", "sensor_msgs/msg/JointState", "cdr"),
        (
            "/pi0d/camera/front/compressed",
            "sensor_msgs/msg/CompressedImage",
            "cdr",
        ),
        ("/diagnostics", "diagnostic_msgs/msg/DiagnosticArray", "cdr"),
        ("/pi0d/chunks", "pi0d.Chunk", "json"),
        ("/pi0d/events", "pi0d.Event", "json"),
    ] {
        assert_eq!(topics[topic]["schema"], schema, "{topic}: {topics}");
        assert_eq!(topics[topic]["message_encoding"], enc, "{topic}");
    }

    // One command per control tick, none lost, in order; its velocities are the summary's.
    assert_eq!(count("/pi0d/command"), s["ticks"].as_u64().unwrap());
    assert_eq!(back["command_log_times_increasing"], true);
    for (joint, v) in s["max_abs_velocity"].as_object().unwrap() {
        let recorded = back["command_max_abs_velocity"][joint].as_f64().unwrap();
        assert!(
            (recorded - v.as_f64().unwrap()).abs() < 1e-9,
            "{joint}: recorded {recorded}, summary {v}"
        );
    }
    let joints: Vec<&str> = cfg["robot"]["joints"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| j.as_str().unwrap())
        .collect();
    assert_eq!(strings(&back["joint_names"]), joints);
    // Measured states: each new one once, in order (the simulator measures at 500 Hz, the
    // control loop looks at 200 Hz).
    assert_eq!(back["measured_stamps_increasing"], true);
    let measured = count("/joint_states");
    assert!(
        measured > 600 && measured <= count("/pi0d/command"),
        "{measured}"
    );

    // Every chunk with every step and its due time.
    let chunks = back["chunks"].as_array().unwrap();
    assert!(
        chunks.len() as u64 >= s["chunks_accepted"].as_u64().unwrap() && chunks.len() >= 5,
        "{} chunks recorded, {} accepted",
        chunks.len(),
        s["chunks_accepted"]
    );
    for c in chunks {
        assert_eq!(c["steps"], 50, "{c}");
        assert_eq!(c["width"], joints.len(), "{c}");
        assert_eq!(c["first_due_is_observation"], true, "{c}");
        for k in ["min_spacing_s", "max_spacing_s"] {
            assert!((c[k].as_f64().unwrap() - 0.02).abs() < 1e-6, "{c}");
        }
    }

    // The transitions as the summary lists them, the e-stop as a safety event, and the
    // accepted chunks.
    let events = back["events"].as_array().unwrap();
    let transitions: Vec<&str> = events
        .iter()
        .filter(|e| e["kind"] == "transition")
        .map(|e| e["to"].as_str().unwrap())
        .collect();
    let summary_transitions: Vec<&str> = s["transitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["to"].as_str().unwrap())
        .collect();
    assert_eq!(transitions, summary_transitions);
    assert!(transitions.contains(&"estopped"), "{transitions:?}");
    let estop = events
        .iter()
        .find(|e| e["kind"] == "transition" && e["to"] == "estopped")
        .unwrap();
    assert_eq!(estop["safety_event"], "estop");
    assert!(events
        .iter()
        .any(|e| e["kind"] == "safety_event" && e["event"] == "estop"));
    let accepted = events
        .iter()
        .filter(|e| e["kind"] == "chunk_accepted")
        .count() as u64;
    assert_eq!(accepted, s["chunks_accepted"].as_u64().unwrap());

    // Camera frames as JPEG at the configured rate, at the camera's size.
    let frames = back["frames"].as_array().unwrap();
    assert!(
        (12..=26).contains(&frames.len()),
        "{} frames in 4 s at 5 Hz",
        frames.len()
    );
    let cam = &cfg["sim"]["cameras"][0];
    let size = serde_json::json!([
        cam["width"].as_integer().unwrap(),
        cam["height"].as_integer().unwrap()
    ]);
    for f in frames {
        assert_eq!(f["format"], "jpeg");
        assert_eq!(f["size"], size, "{f}");
    }
    // Diagnostics once a second, as the ROS node publishes them.
    let diags = back["diagnostics"].as_array().unwrap();
    assert!(diags.len() >= 3, "{diags:?}");
    assert!(
        diags
            .iter()
            .all(|d| strings(d).iter().any(|n| n.contains("pi0d"))),
        "{diags:?}"
    );

    let meta = &back["metadata"]["pi0d"];
    assert_eq!(meta["io"], "sim");
    assert_eq!(meta["joints"], joints.join(","));
    assert_eq!(meta["control_rate_hz"], "200");

    plots_the_run(&file, &dir, joints.len());
}

fn pi0d_plot(args: &[&std::ffi::OsStr]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_pi0d"))
        .arg("plot")
        .args(args)
        .output()
        .expect("pi0d runs")
}

/// Pixels of exactly this colour.
fn pixels(img: &image::RgbImage, rgb: [u8; 3]) -> usize {
    img.pixels().filter(|p| p.0 == rgb).count()
}

/// `pi0d plot` on the recording: a PNG with a row per joint, both lines, the e-stop shaded;
/// a file cut short still plots (with a warning), a file that is not MCAP is refused by name.
fn plots_the_run(file: &Path, dir: &Path, joints: usize) {
    let png = dir.join("run.png");
    let out = pi0d_plot(&[file.as_os_str(), "--out".as_ref(), png.as_os_str()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains(&format!("plotted {joints} joints")),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let img = image::open(&png).expect("a PNG").to_rgb8();
    assert_eq!(img.width(), 1600);
    assert!(img.height() as usize >= 200 * joints, "{}", img.height());
    // Commanded (blue) and measured (orange) lines, the e-stop's shading (light red).
    for (what, rgb, at_least) in [
        ("commanded", [31, 119, 180], 2_000),
        ("measured", [255, 127, 14], 2_000),
        ("e-stop shading", [255, 195, 195], 20_000),
    ] {
        let n = pixels(&img, rgb);
        assert!(n >= at_least, "{what}: {n} pixels");
    }

    // A run killed mid-write: the first half of the file still plots.
    let bytes = std::fs::read(file).unwrap();
    let cut = dir.join("cut.mcap");
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    let out = pi0d_plot(&[cut.as_os_str()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("ends early"), "{stderr}");
    assert!(dir.join("cut.png").exists());

    let junk = dir.join("junk.mcap");
    std::fs::write(&junk, b"not a recording at all").unwrap();
    let out = pi0d_plot(&[junk.as_os_str()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&junk.display().to_string()) && stderr.contains("not an MCAP file"),
        "{stderr}"
    );
}

#[test]
fn when_the_recording_file_exists_expect_the_start_refused_naming_it_and_the_file_kept() {
    let dir = scratch_dir("record-exists");
    let file = dir.join("run.mcap");
    std::fs::write(&file, b"an earlier recording").unwrap();
    let cfg = recorded(
        sim_config(),
        &[("path", Value::String(file.display().to_string()))],
    );
    let run = run_daemon("record-exists-run", &cfg, 2.0);
    assert_eq!(run.code(), 1, "{}", run.stderr);
    assert!(
        run.stderr.contains("record.path") && run.stderr.contains(&file.display().to_string()),
        "{}",
        run.stderr
    );
    assert_eq!(std::fs::read(&file).unwrap(), b"an earlier recording");
}

#[test]
fn when_max_megabytes_is_reached_expect_the_file_within_it_closed_readable_and_the_run_going_on() {
    let dir = scratch_dir("record-cap");
    let file = dir.join("capped.mcap");
    // The smallest cap the configuration allows, camera frames at the highest rate.
    let cfg = recorded(
        sim_config(),
        &[
            ("path", Value::String(file.display().to_string())),
            ("max_megabytes", Value::Float(0.1)),
            ("camera_hz", Value::Float(30.0)),
        ],
    );
    let run = run_daemon("record-cap-run", &cfg, 3.0);
    assert_eq!(run.code(), 0, "{}", run.stderr);
    let rec = &run.summary()["recording"];
    assert_eq!(rec["ended_by"], "max_megabytes", "{rec}");
    let bytes = std::fs::metadata(&file).unwrap().len();
    // The file on disk, index and all, is within the cap; it stopped when the next message
    // did not fit (a camera frame is a few kB), not long before.
    assert!((50_000..=100_000).contains(&bytes), "{bytes} bytes");
    assert_eq!(rec["bytes"], bytes, "{rec}");
    assert!(
        run.stderr.contains("record.max_megabytes"),
        "{}",
        run.stderr
    );
    // The file was closed properly: its summary section is there and agrees.
    let back = mcap_read_back(&file);
    assert_eq!(back["statistics_message_count"], rec["messages"]);
    // The recording stopped; the arm did not.
    let commands = back["topics"]["/pi0d/command"]["count"].as_u64().unwrap();
    assert!(commands < run.summary()["ticks"].as_u64().unwrap());
    assert_eq!(run.summary()["final_mode"], "stopping");
}

/// `pi0d plot` on `file`, killed (and the test failed) if it has not finished in a minute.
fn pi0d_plot_bounded(file: &Path) -> (Option<i32>, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_pi0d"))
        .arg("plot")
        .arg(file)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("pi0d runs");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            child.kill().unwrap();
            panic!("pi0d plot {} did not finish in 60 s", file.display());
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(!stderr.contains("panicked"), "{stderr}");
    (out.status.code(), stderr)
}

/// sensor_msgs/JointState laid out as its IDL (header's stamp and frame id, then the arrays),
/// so its CDR is what pi0d records on `/pi0d/command`: the recording is crafted independently
/// of the library's own message types.
#[derive(Default, serde::Serialize)]
struct JointState {
    stamp_sec: i32,
    stamp_nanosec: u32,
    frame_id: String,
    name: Vec<String>,
    position: Vec<f64>,
    velocity: Vec<f64>,
    effort: Vec<f64>,
}

/// An MCAP file with `/pi0d/command` messages of `joints` joints, positions from `position`.
fn crafted_commands(
    file: &Path,
    joints: usize,
    messages: u64,
    position: impl Fn(u64, usize) -> f64,
) -> u64 {
    use byteorder::LittleEndian;
    let out = std::io::BufWriter::new(std::fs::File::create(file).unwrap());
    let mut w = mcap::WriteOptions::new()
        .compression(Some(mcap::Compression::Zstd))
        .create(out)
        .unwrap();
    let schema = w
        .add_schema("sensor_msgs/msg/JointState", "ros2msg", b"")
        .unwrap();
    let channel = w
        .add_channel(schema, "/pi0d/command", "cdr", &Default::default())
        .unwrap();
    let names: Vec<String> = (0..joints).map(|j| format!("j{j}")).collect();
    for i in 0..messages {
        let msg = JointState {
            name: names.clone(),
            position: (0..joints).map(|j| position(i, j)).collect(),
            ..Default::default()
        };
        let mut data = vec![0, 1, 0, 0];
        cdr_encoding::to_writer::<_, LittleEndian, _>(&mut data, &msg).unwrap();
        let at = 1_700_000_000_000_000_000 + i * 5_000_000;
        let header = mcap::records::MessageHeader {
            channel_id: channel,
            sequence: i as u32,
            log_time: at,
            publish_time: at,
        };
        w.write_to_known_channel(&header, &data).unwrap();
    }
    w.finish().unwrap();
    drop(w);
    std::fs::metadata(file).unwrap().len()
}

#[test]
fn when_pi0d_plot_is_given_crafted_recordings_expect_an_error_naming_the_file_or_a_bounded_plot() {
    let dir = scratch_dir("plot-crafted");
    // Thousands of joints in a few kB: refused by name, never drawn (it panicked; 200k
    // joints took 4 GB).
    for joints in [5_000, 200_000] {
        let file = dir.join(format!("joints-{joints}.mcap"));
        let size = crafted_commands(&file, joints, 3, |_, _| 0.0);
        let (code, stderr) = pi0d_plot_bounded(&file);
        assert_eq!(code, Some(1), "{stderr}");
        assert!(
            stderr.contains(&file.display().to_string())
                && stderr.contains(&format!("{joints} joints")),
            "{size} bytes: {stderr}"
        );
        assert!(!dir.join(format!("joints-{joints}.png")).exists());
    }
    // Positions alternating +-1e308: plotted (it hung), the values named as left out.
    let file = dir.join("huge.mcap");
    crafted_commands(&file, 2, 400, |i, j| match (i % 2, j) {
        (0, 0) => 1e308,
        (_, 0) => -1e308,
        _ => (i as f64 * 0.01).sin(),
    });
    let (code, stderr) = pi0d_plot_bounded(&file);
    assert_eq!(code, Some(0), "{stderr}");
    let img = image::open(dir.join("huge.png")).expect("a PNG").to_rgb8();
    // A header of up to three title lines and the legend, then a row per joint.
    assert_eq!(img.height(), 126 + 2 * 210);
    // The second joint's line is there.
    assert!(pixels(&img, [31, 119, 180]) > 500);
    // A recording with no commands: refused by name.
    let file = dir.join("empty.mcap");
    crafted_commands(&file, 2, 0, |_, _| 0.0);
    let (code, stderr) = pi0d_plot_bounded(&file);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains(&file.display().to_string()) && stderr.contains("not a pi0d recording"),
        "{stderr}"
    );
}

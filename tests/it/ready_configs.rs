//! The ready configurations in config/ run as their comments say: `config/remote.toml` against
//! `pi0d serve` of the bundled model, `config/record.toml` into a recording that `pi0d plot`
//! draws. Each file is run as written, with only what a test must move rewritten (the port,
//! the recording directory, relative paths made absolute because the copy lives elsewhere).

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

use crate::common;

use common::procs::{send_signal, wait_for_exit};
use common::*;

/// `config/<name>` as written, with every `(from, to)` replaced (each must be there: a file
/// that no longer has what the test rewrites fails the test instead of running something
/// else), then its relative paths (`"../...`) made absolute.
fn shipped(name: &str, rewrites: &[(&str, String)]) -> toml::Table {
    let path = root().join("config").join(name);
    let mut text = std::fs::read_to_string(&path).unwrap();
    for (from, to) in rewrites {
        assert!(text.contains(from), "{name}: no `{from}` to rewrite");
        text = text.replace(from, to);
    }
    let parent = format!("\"{}/", root().display());
    text = text.replace("\"../", &parent);
    text.parse()
        .unwrap_or_else(|e| panic!("{name} rewritten: {e}"))
}

/// A `pi0d serve` the test started: ended (SIGTERM) when dropped, also when the test panics.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        if self.0.try_wait().ok().flatten().is_none() {
            send_signal(&self.0, libc::SIGTERM);
            let _ = wait_for_exit(&mut self.0, 10.0);
        }
    }
}

/// `pi0d serve --checkpoint models/sim-reach` as config/remote.toml's comment starts it (one
/// thread, on a port the kernel picks): the server and its port, read from its log.
fn serve_as_documented() -> (Server, u16) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_pi0d"))
        .arg("serve")
        .arg("--checkpoint")
        .arg(root().join("models/sim-reach"))
        .args(["--threads", "1", "--listen", "127.0.0.1:0"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("pi0d serve starts");
    let mut log = BufReader::new(child.stderr.take().unwrap());
    let server = Server(child);
    let (port, _) = listening_port(&mut log);
    // Keep reading its log, so a full pipe never blocks it.
    std::thread::spawn(move || for _ in log.lines().map_while(Result::ok) {});
    (server, port)
}

#[test]
fn when_remote_config_runs_against_pi0d_serve_expect_chunks_accepted_and_a_clean_exit() {
    let (_server, port) = serve_as_documented();
    let cfg = shipped(
        "remote.toml",
        &[("ws://127.0.0.1:8000", format!("ws://127.0.0.1:{port}"))],
    );
    assert_eq!(cfg["policy"]["backend"].as_str(), Some("openpi"));
    assert!(
        cfg["policy"].get("checkpoint").is_none(),
        "the model is the server's"
    );
    let run = run_daemon_with("ready-remote", &cfg, 4.0, &["--quiet"]);
    assert_eq!(run.code(), 0, "{}", run.stderr);
    let s = run.summary();
    assert!(s["chunks_accepted"].as_u64().unwrap() >= 3, "{s}");
    assert_eq!(s["limit_violations"], 0, "{s}");
    assert_safe(&run, &cfg);
}

#[test]
fn when_record_config_runs_expect_a_recording_that_pi0d_plot_draws() {
    let out = scratch_dir("ready-record-out");
    let recordings = format!("\"{}/recordings/\"", out.display());
    let cfg = shipped("record.toml", &[("\"../recordings/\"", recordings)]);
    let run = run_daemon_with("ready-record", &cfg, 3.0, &["--quiet"]);
    assert_eq!(run.code(), 0, "{}", run.stderr);
    let rec = &run.summary()["recording"];
    assert_eq!(rec["ended_by"], "run_end", "{rec}");
    assert!(rec["messages"].as_u64().unwrap() > 0, "{rec}");
    // One new file, pi0d-<UTC time>.mcap, in the configured directory.
    let file = std::path::PathBuf::from(rec["path"].as_str().unwrap());
    assert_eq!(
        file.parent(),
        Some(out.join("recordings").as_path()),
        "{rec}"
    );
    let name = file.file_name().unwrap().to_string_lossy().to_string();
    assert!(
        name.starts_with("pi0d-") && name.ends_with(".mcap"),
        "{name}"
    );

    // `pi0d plot FILE`: the PNG beside it.
    let plot = Command::new(env!("CARGO_BIN_EXE_pi0d"))
        .arg("plot")
        .arg(&file)
        .output()
        .unwrap();
    let said =
        String::from_utf8_lossy(&plot.stdout).to_string() + &String::from_utf8_lossy(&plot.stderr);
    assert_eq!(plot.status.code(), Some(0), "{said}");
    let png = std::fs::read(file.with_extension("png"))
        .unwrap_or_else(|e| panic!("no PNG beside {}: {e}\n{said}", file.display()));
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "not a PNG");
    assert!(said.contains("plotted 7 joints"), "{said}");
}

#[test]
fn when_remote_config_runs_with_no_server_expect_exit_8_naming_the_server() {
    // A port nothing listens on: bound, then released.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("ws://127.0.0.1:{port}");
    let cfg = shipped("remote.toml", &[("ws://127.0.0.1:8000", url.clone())]);
    let run = run_daemon_with("ready-remote-down", &cfg, 3.0, &["--quiet"]);
    assert_eq!(run.code(), 8, "{}", run.stderr);
    assert!(
        run.stderr
            .contains("--duration ended before the arm started")
            && run.stderr.contains(&url),
        "{}",
        run.stderr
    );
    let s = run.summary();
    assert_eq!(s["exit"], "start_timeout", "{s}");
    assert_eq!(s["chunks_accepted"], 0, "{s}");
}

#[test]
fn when_the_default_demo_runs_expect_the_task_progress_in_the_status_line_and_the_summary() {
    // The README's first command: config/sim.toml as written.
    let cfg = shipped("sim.toml", &[]);
    let run = run_daemon_with("ready-demo", &cfg, 5.0, &[]);
    assert_eq!(run.code(), 0, "{}", run.stderr);
    let task = &run.summary()["sim_task"];
    assert!(task["target"].as_u64().unwrap() >= 1, "{task}");
    let off = task["distance_m"].as_f64().unwrap();
    // The tool is on the table the camera sees (1 m across).
    assert!((0.0..1.5).contains(&off), "{task}");
    let shown = task["reached"].as_u64().unwrap() + task["missed"].as_u64().unwrap();
    assert_eq!(shown + 1, task["target"].as_u64().unwrap(), "{task}");
    let lines: Vec<&str> = run
        .stderr
        .lines()
        .filter(|l| l.contains(" Hz | "))
        .collect();
    assert!(
        lines
            .iter()
            .any(|l| l.contains("target ") && l.contains(" mm off, reached ")),
        "{lines:?}"
    );
}

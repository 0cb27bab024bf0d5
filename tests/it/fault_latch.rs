//! The fault latch (`--state-dir`) through the real binary: one daemon per state directory, a
//! kill latches the next start, and a latch that cannot be written at the end makes the exit
//! code and the summary agree. Names follow `when_<situation>_expect_<behaviour>`.

use crate::common;

use std::path::{Path, PathBuf};

use common::edge::*;
use common::procs::*;
use common::*;

/// `pi0d run` for `duration_s` on `cfg` in `dir`, its fault latch kept in `state`.
fn latched_run(dir: &Path, cfg: &toml::Table, duration_s: f64, state: &Path) -> Watched {
    let mut cmd = run_command(dir, cfg, duration_s);
    cmd.arg("--state-dir").arg(state);
    Watched::start(cmd)
}

fn marker(state: &Path) -> Option<serde_json::Value> {
    let text = std::fs::read_to_string(state.join("fault-latch.json")).ok()?;
    Some(serde_json::from_str(&text).expect("the marker is JSON"))
}

/// Two daemons on one state directory: the second refuses to start (naming the first) and
/// touches nothing, so the first's clean end removes its own marker and nothing else. A
/// SIGKILLed run's lock goes with it: the next start takes the directory, latched.
#[test]
fn when_a_second_daemon_starts_on_a_state_dir_in_use_expect_it_refused_and_the_first_unaffected() {
    let _serial = serial();
    let dir = scratch_dir("latch-two-daemons");
    let state = dir.join("state");
    let (a_dir, b_dir) = (dir.join("a"), dir.join("b"));
    for d in [&a_dir, &b_dir] {
        std::fs::create_dir_all(d).unwrap();
    }
    let mut a = latched_run(&a_dir, &sim_config(), 4.0, &state);
    a.wait_for_log("start gate passed", 20.0);
    let a_pid = a.child.id();
    assert_eq!(marker(&state).unwrap()["pid"], a_pid, "A's marker");

    let (status, stderr) = latched_run(&b_dir, &sim_config(), 30.0, &state).finish(20.0);
    assert_exit(
        status,
        summary_in(&b_dir).as_ref(),
        1,
        "invalid_input",
        &stderr,
    );
    assert!(
        stderr.contains(&format!("another pi0d (pid {a_pid}) keeps its fault latch")),
        "{stderr}"
    );
    assert!(summary_in(&b_dir).is_none(), "B never ran");
    assert_eq!(
        marker(&state).unwrap()["pid"],
        a_pid,
        "B touched A's marker"
    );

    let (status, stderr) = a.finish(30.0);
    let s = summary_in(&a_dir).expect("A's summary");
    assert_exit(status, Some(&s), 0, "clean", &stderr);
    assert!(s["fault_latch_next"].is_null(), "{s}");
    assert!(marker(&state).is_none(), "a clean end removes its marker");

    // Killed: the kernel drops its lock, its marker stays and latches the next start.
    let mut killed = latched_run(&a_dir, &sim_config(), 30.0, &state);
    killed.wait_for_log("start gate passed", 20.0);
    killed.child.kill().unwrap();
    let _ = killed.finish(10.0);
    let c_dir = dir.join("c");
    std::fs::create_dir_all(&c_dir).unwrap();
    let (status, stderr) = latched_run(&c_dir, &sim_config(), 1.0, &state).finish(30.0);
    let s = summary_in(&c_dir).expect("the next run's summary");
    assert_exit(status, Some(&s), 0, "clean", &stderr);
    assert!(
        s["fault_latch"].as_str().unwrap().starts_with("killed"),
        "{s}"
    );
    assert_eq!(s["chunks_accepted"], 0, "latched: no chunk runs: {s}");
    assert!(s["fault_latch_next"]
        .as_str()
        .unwrap()
        .starts_with("killed"));
}

/// A tmpfs of a few pages mounted on `path` (root and a mount namespace that allows it, as
/// in CI's containers); unmounted when dropped.
struct TinyFs(PathBuf);

impl TinyFs {
    fn mount(path: &Path) -> Result<TinyFs, String> {
        std::fs::create_dir_all(path).unwrap();
        let out = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=64k", "tmpfs"])
            .arg(path)
            .output()
            .map_err(|e| e.to_string())?;
        if !out.status.success() {
            return Err(String::from_utf8_lossy(&out.stderr).into_owned());
        }
        Ok(TinyFs(path.to_path_buf()))
    }

    /// Writes until the file system is full.
    fn fill(&self) {
        use std::io::Write;
        let mut f = std::fs::File::create(self.0.join("filler")).unwrap();
        let block = [0u8; 4096];
        while f.write_all(&block).and_then(|()| f.sync_all()).is_ok() {}
    }
}

impl Drop for TinyFs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.0).status();
    }
}

/// After a reset lifts a latch, the state directory is full: the marker cannot be updated. The
/// marker on disk still latches, the errors say so with the OS error once, and the process
/// exits what its summary says (runtime_failure), not "clean" in the summary and 1 outside.
#[test]
fn when_the_state_dir_is_full_after_a_reset_expect_the_exit_and_the_summary_to_agree() {
    let _serial = serial();
    let dir = scratch_dir("latch-enospc");
    let state = dir.join("state");
    let fs = match TinyFs::mount(&state) {
        Ok(fs) => fs,
        Err(why) => {
            // The seam test (`daemon::latch`, `daemon::summary`) covers the logic without one.
            eprintln!("skipped: cannot mount a tmpfs here: {why}");
            return;
        }
    };
    let left = r#"{"state":"control_fault","latched":"control_fault","pid":1}"#;
    std::fs::write(state.join("fault-latch.json"), left).unwrap();
    let cfg = sim_events(sim_config(), vec![event(0.5, "reset", &[])]);
    let mut run = latched_run(&dir, &cfg, 2.0, &state);
    run.wait_for_log("start gate passed", 20.0);
    fs.fill();
    let (status, stderr) = run.finish(30.0);
    let s = summary_in(&dir).expect("summary");
    assert_exit(status, Some(&s), 9, "runtime_failure", &stderr);
    assert_eq!(s["fault_latch"], "control_fault", "{s}");
    let why = s["fault_latch_error"]
        .as_str()
        .expect("the error in the summary");
    let os = "No space left on device (os error 28)";
    assert_eq!(why.matches(os).count(), 1, "{why}");
    for line in stderr
        .lines()
        .filter(|l| l.contains("fault latch could not"))
    {
        assert_eq!(line.matches(os).count(), 1, "{line}");
    }
    // Still latched on disk: the reset was never recorded.
    assert_eq!(marker(&state).unwrap()["latched"], "control_fault");
    drop(fs);
}

/// A marker that is not UTF-8 is an unreadable marker: the start is latched, not refused.
#[test]
fn when_the_marker_is_not_utf8_expect_the_start_latched_not_exit_1() {
    let dir = scratch_dir("latch-not-utf8");
    let state = dir.join("state");
    std::fs::create_dir_all(&state).unwrap();
    std::fs::write(state.join("fault-latch.json"), b"{\"state\":\"\xff\xfe\"}").unwrap();
    let run = run_daemon_with(
        "latch-not-utf8-run",
        &sim_config(),
        1.0,
        &["--quiet", "--state-dir", state.to_str().unwrap()],
    );
    assert_eq!(run.code(), 0, "{}", run.stderr);
    let s = run.summary();
    assert!(
        s["fault_latch"]
            .as_str()
            .unwrap()
            .starts_with("unreadable marker"),
        "{s}"
    );
    assert_eq!(s["chunks_accepted"], 0, "{s}");
}

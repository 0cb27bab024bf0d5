//! The files options name are read only when they are regular files: a FIFO given as the
//! configuration, a `--params-file` or left as the fault latch is refused at once, naming the
//! option and the path (it used to block start-up silently). And `-p config:=X` beside a
//! different `--config` is refused instead of silently ignored.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{scratch_dir, sim_config};

fn mkfifo(path: &Path) {
    let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo");
}

/// Runs `pi0d args`; a run still going after 30 s (blocked on a FIFO) is killed and fails
/// the test instead of hanging the suite.
fn pi0d(args: &[&str]) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_pi0d"))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("pi0d starts");
    let started = Instant::now();
    while child.try_wait().expect("wait").is_none() {
        if started.elapsed() > Duration::from_secs(30) {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "pi0d {args:?} still blocked after 30 s; stderr:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).to_string()
}

fn write_config(dir: &Path) -> PathBuf {
    let path = dir.join("config.toml");
    std::fs::write(&path, toml::to_string(&sim_config()).unwrap()).unwrap();
    path
}

#[test]
fn when_config_is_a_fifo_expect_refusal_naming_option_and_path() {
    let dir = scratch_dir("fifo-config");
    let fifo = dir.join("config.toml");
    mkfifo(&fifo);
    let out = pi0d(&["check", "--config", fifo.to_str().unwrap()]);
    let e = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{e}");
    assert!(
        e.contains(&format!(
            "--config {}: cannot read: is a FIFO, expected a regular file",
            fifo.display()
        )),
        "{e}"
    );
    // The reason is said once (it used to be repeated by the error chain).
    assert_eq!(e.matches("a FIFO").count(), 1, "{e}");
}

#[test]
fn when_params_file_is_a_fifo_expect_refusal_naming_option_and_path() {
    let dir = scratch_dir("fifo-params");
    let cfg = write_config(&dir);
    let fifo = dir.join("params.yaml");
    mkfifo(&fifo);
    let out = pi0d(&[
        "check",
        "--config",
        cfg.to_str().unwrap(),
        "--ros-args",
        "--params-file",
        fifo.to_str().unwrap(),
    ]);
    let e = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{e}");
    assert!(
        e.contains(&format!(
            "--params-file {}: cannot read: is a FIFO, expected a regular file",
            fifo.display()
        )),
        "{e}"
    );
}

/// A FIFO where the fault latch lies: start-up does not block on it, and a marker it cannot
/// read is a doubt, so the run starts latched (e-stopped until a reset), saying why.
#[test]
fn when_fault_latch_is_a_fifo_expect_no_block_and_the_start_latched() {
    let dir = scratch_dir("fifo-latch");
    let cfg = write_config(&dir);
    let state = dir.join("state");
    std::fs::create_dir_all(&state).unwrap();
    let latch = state.join("fault-latch.json");
    mkfifo(&latch);
    let out = pi0d(&[
        "run",
        "--quiet",
        "--duration",
        "0.5",
        "--config",
        cfg.to_str().unwrap(),
        "--state-dir",
        state.to_str().unwrap(),
    ]);
    let e = stderr(&out);
    assert_eq!(out.status.code(), Some(0), "{e}");
    assert!(
        e.contains("unreadable marker") && e.contains("is a FIFO, expected a regular file"),
        "{e}"
    );
    assert!(e.contains("the arm stays e-stopped until a reset"), "{e}");
}

#[test]
fn when_config_parameter_names_another_file_than_config_option_expect_usage_error() {
    let dir = scratch_dir("config-twice");
    let cfg = write_config(&dir);
    let other = dir.join("other.toml");
    let param = format!("config:={}", other.display());
    let out = pi0d(&[
        "check",
        "--config",
        cfg.to_str().unwrap(),
        "--ros-args",
        "-p",
        &param,
    ]);
    let e = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{e}");
    assert!(
        e.contains(&format!(
            "--config {} and the ROS parameter `config` ({}) name different files",
            cfg.display(),
            other.display()
        )),
        "{e}"
    );
    // The parameter alone names the file (and the option in a read error).
    let out = pi0d(&["check", "--ros-args", "-p", &param]);
    let e = stderr(&out);
    assert!(
        e.contains(&format!(
            "--ros-args parameter `config` {}: cannot read",
            other.display()
        )),
        "{e}"
    );
}

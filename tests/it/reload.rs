//! SIGHUP reloads through the real binary: only regular files are read (the configuration and
//! the URDF it names), off the supervisor thread, and every change or refusal is said by
//! field; a SIGHUP before the handlers would exist does not kill the process. Also how a
//! configuration's URDF error reads at the binary's edge. Names follow
//! `when_<situation>_expect_<behaviour>`.

use crate::common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::edge::*;
use common::procs::*;
use common::*;
use toml::Value;

fn mkfifo(path: &Path) {
    let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: mkfifo on a NUL-terminated path the test owns.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "{path:?}");
}

/// The configuration with a stop that takes at most `stop_timeout_s`.
fn config_stopping_within(stop_timeout_s: f64) -> toml::Table {
    let mut cfg = sim_config();
    set(
        &mut cfg,
        "control",
        "stop_timeout_s",
        Value::Float(stop_timeout_s),
    );
    cfg
}

/// The configuration file, then the URDF it names, replaced by FIFOs nobody writes: each
/// SIGHUP is refused naming the file (and for the URDF, the configuration field), and the
/// supervisor never waits on them: SIGTERM still stops the arm within the stop timeout.
#[test]
fn when_the_config_or_its_urdf_becomes_a_fifo_expect_the_reload_refused_and_sigterm_still_stops() {
    let _serial = serial();
    let dir = scratch_dir("reload-fifo");
    let urdf = dir.join("arm.urdf");
    std::fs::copy(root().join("urdf/sim_arm.urdf"), &urdf).unwrap();
    let stop_timeout_s = 2.0;
    let mut cfg = config_stopping_within(stop_timeout_s);
    cfg["robot"]["urdf"] = Value::String(urdf.display().to_string());
    let mut run = Watched::start(run_command(&dir, &cfg, 120.0));
    run.wait_for_log("to=running", 20.0);
    let file = dir.join("config.toml");
    let text = std::fs::read_to_string(&file).unwrap();

    std::fs::remove_file(&file).unwrap();
    mkfifo(&file);
    send_signal(&run.child, libc::SIGHUP);
    run.wait_for_log(
        &format!(
            "{}: cannot read it: is a FIFO, expected a regular file",
            file.display()
        ),
        10.0,
    );

    std::fs::remove_file(&file).unwrap();
    std::fs::write(&file, &text).unwrap();
    std::fs::remove_file(&urdf).unwrap();
    mkfifo(&urdf);
    send_signal(&run.child, libc::SIGHUP);
    run.wait_for_log(
        &format!(
            "{}: `robot.urdf`: {}: cannot read it: is a FIFO",
            file.display(),
            urdf.display()
        ),
        10.0,
    );

    let stopping = Instant::now();
    send_signal(&run.child, libc::SIGTERM);
    // The stop itself, plus the process's own shutdown, with a wide margin.
    let (status, stderr) = run.finish(stop_timeout_s + 10.0);
    let s = summary_in(&dir).expect("summary");
    assert_exit(status, Some(&s), 0, "clean", &stderr);
    assert!(
        s["duration_s"].as_f64().unwrap() < 60.0,
        "stopped by SIGTERM, not by --duration: {s}"
    );
    assert!(stopping.elapsed() < Duration::from_secs_f64(stop_timeout_s + 10.0));
    assert_eq!(s["limit_violations"], 0, "{s}");
}

/// A SIGHUP with nothing changed says so; sections added to the file ([record], [metrics],
/// [[drill]], [serve]) are each refused by name, "restart to apply", and nothing is applied.
#[test]
fn when_sighup_finds_no_change_or_new_sections_expect_it_said_field_by_field() {
    let _serial = serial();
    let cfg = config_stopping_within(2.0);
    let (mut run, dir) = start_run("reload-sections", &cfg, 120.0);
    run.wait_for_log("to=running", 20.0);
    send_signal(&run.child, libc::SIGHUP);
    run.wait_for_log("SIGHUP: nothing changed", 10.0);

    let mut more = cfg.clone();
    set(
        &mut more,
        "record",
        "path",
        Value::String(dir.join("rec.mcap").display().to_string()),
    );
    set(
        &mut more,
        "metrics",
        "listen",
        Value::String("127.0.0.1:1".into()),
    );
    set(
        &mut more,
        "serve",
        "listen",
        Value::String("127.0.0.1:2".into()),
    );
    add_drill(&mut more, "crash_control", 1000.0, None);
    write_config(&dir, &more);
    send_signal(&run.child, libc::SIGHUP);
    run.wait_for_log("SIGHUP: nothing reloaded: 4 change(s) refused", 10.0);
    send_signal(&run.child, libc::SIGTERM);
    let (status, stderr) = run.finish(30.0);
    let s = summary_in(&dir).expect("summary");
    assert_exit(status, Some(&s), 0, "clean", &stderr);
    for line in [
        "`record` not reloaded: added; restart pi0d to apply it",
        "`metrics` not reloaded: added; restart pi0d to apply it",
        "`drill[0]` not reloaded: added; restart pi0d to apply it",
        "`serve.listen` not reloaded: added; restart `pi0d serve` to apply it",
    ] {
        assert!(stderr.contains(line), "{line:?} not logged:\n{stderr}");
    }
    assert!(!stderr.contains("configuration reloaded"), "{stderr}");
    assert!(s["recording"].is_null(), "{s}");
}

/// A configuration whose URDF is missing: the error names the configuration file and the
/// field, then the URDF, and the OS error once.
#[test]
fn when_the_urdf_is_missing_expect_the_config_file_and_field_named_and_the_os_error_once() {
    let mut cfg = sim_config();
    let missing = std::env::temp_dir().join("pi0d-no-such-dir/arm.urdf");
    cfg["robot"]["urdf"] = Value::String(missing.display().to_string());
    let (status, stderr) = check("reload-missing-urdf", &cfg);
    assert_eq!(status.code(), Some(1), "{stderr}");
    let line = stderr
        .lines()
        .find(|l| l.starts_with("error: "))
        .unwrap_or_else(|| panic!("no error line:\n{stderr}"));
    assert!(
        line.contains(&format!(
            "config.toml: `robot.urdf`: {}: cannot read it: No such file or directory (os error 2)",
            missing.display()
        )),
        "{line}"
    );
    assert_eq!(line.matches("(os error 2)").count(), 1, "{line}");
}

//! pi0d's openpi client (`policy.backend = "openpi"`) against openpi's own server (PyPI
//! openpi-server, WebsocketPolicyServer unchanged, tests/peers/faulty_openpi_server.py): the daemon
//! drives the simulated arm from the server's chunks with openpi's key layout; a server that
//! answers with an error, NaN, a wrongly shaped reply, closes mid-request or stalls past the
//! timeout makes the arm hold with the reason in the summary, never moves it from bad data,
//! and the run resumes once the server answers again. Then: a server that is not there.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use common::*;
use toml::Value;

/// Waits for a Python server's "ready" line on its stdout.
fn await_ready(server: &mut std::process::Child) {
    let mut ready = String::new();
    BufReader::new(server.stdout.take().unwrap())
        .read_line(&mut ready)
        .unwrap();
    assert_eq!(ready.trim(), "ready");
}

/// `pi0d serve` of the bundled tiny model on one thread, requiring `key`.
fn serve_tiny_model(key: &str) -> (std::process::Child, u16, std::thread::JoinHandle<String>) {
    let model = root().join("models/tiny-pi0");
    pi0d_serve(
        &[
            "--checkpoint".as_ref(),
            model.as_os_str(),
            "--threads".as_ref(),
            "1".as_ref(),
        ],
        ("SERVE_KEY", key),
    )
}

/// `openpi_config` with pi0d serve's own keys (the checkpoint's names, no extras).
fn pi0d_serve_config(port: u16) -> toml::Table {
    let mut cfg = openpi_config(port);
    let o = cfg["policy"]["openpi"].as_table_mut().unwrap();
    for k in ["images", "state_key", "extra"] {
        o.remove(k);
    }
    cfg
}

fn openpi_config(port: u16) -> toml::Table {
    remote_policy_config(
        "openpi",
        &[
            ("url", Value::String(format!("ws://127.0.0.1:{port}"))),
            (
                "images",
                table(&[("front", Value::String("observation/image".into()))]),
            ),
            ("state_key", Value::String("observation/state".into())),
            ("request_timeout_s", Value::Float(1.0)),
            ("reconnect_initial_s", Value::Float(0.1)),
            ("reconnect_max_s", Value::Float(0.5)),
            ("extra", table(&[("observation/flag", Value::Integer(1))])),
        ],
    )
}

#[test]
fn when_openpis_server_drives_the_arm_and_then_fails_every_way_expect_holds_named_and_a_resume() {
    let port = free_port();
    let dir = scratch_dir("openpi-client");
    let report = dir.join("server.json");
    let mut server = Command::new(peer_python())
        .arg(root().join("tests/peers/faulty_openpi_server.py"))
        .args(["--port", &port.to_string(), "--report"])
        .arg(&report)
        .args([
            "--faults",
            "6:error,7:nan,8:shape,9:close,10:stall,11:error",
        ])
        .stdout(Stdio::piped())
        // Its tracebacks (the faults) stay out of the test's output.
        .stderr(std::fs::File::create(dir.join("server.log")).unwrap())
        .spawn()
        .unwrap();
    await_ready(&mut server);
    let cfg = openpi_config(port);
    let run = run_daemon("openpi-client-run", &cfg, 14.0);
    // SAFETY: kill(2) on our own child.
    unsafe {
        libc::kill(server.id() as i32, libc::SIGTERM);
    }
    server.wait().unwrap();
    let seen: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    let s = run.summary();
    assert_eq!(run.code(), 0, "{}", run.stderr);
    assert_safe(&run, &cfg);

    // What the client sent: openpi's layout, 224x224 uint8 images, float32 state, the
    // prompt and the extra key.
    assert_eq!(seen["bad_requests"], serde_json::json!([]), "{seen}");
    assert_eq!(
        strings(&seen["prompts"]),
        [cfg["policy"]["prompt"].as_str().unwrap()]
    );
    assert_eq!(seen["extra"], 1.0);
    // Every fault was served, each ended as a hold with its reason, none moved the arm.
    for f in ["error", "nan", "shape", "close", "stall"] {
        assert!(seen["faults"][f].as_u64().unwrap() >= 1, "{f}: {seen}");
    }
    let kinds = &s["policy_errors_by_kind"];
    for k in ["server_error", "wrong_shape", "closed", "timeout"] {
        assert!(kinds[k].as_u64().unwrap_or(0) >= 1, "{k}: {s}");
    }
    assert!(run.rejected("non_finite") >= 1, "the NaN chunk: {s}");
    assert!(
        s["last_policy_error"].is_string(),
        "the latest error is in the summary: {s}"
    );
    assert!(
        run.stderr.contains("the model is not loaded"),
        "the server's error is logged:\n{}",
        run.stderr
    );
    // ... and the run went on from the server's good replies afterwards.
    assert!(seen["normal_after_faults"].as_u64().unwrap() >= 4, "{seen}");
    assert!(s["chunks_accepted"].as_u64().unwrap() >= 10, "{s}");
    let remote = &s["remote_policy"];
    assert!(remote["reconnects"].as_u64().unwrap() >= 3, "{remote}");
    assert!(remote["rtt_ms_p50"].as_f64().unwrap() > 0.0, "{remote}");
    assert!(remote["server_infer_ms_p50"].as_f64().unwrap() >= 0.0);
    assert_eq!(remote["connected"], true, "{remote}");
    let moved: f64 = s["max_abs_velocity"]
        .as_object()
        .unwrap()
        .values()
        .map(|v| v.as_f64().unwrap())
        .fold(0.0, f64::max);
    assert!(moved > 0.01, "the server's chunks moved the arm: {s}");
}

#[test]
fn when_no_server_is_there_expect_a_hold_naming_it_and_exit_8() {
    let cfg = openpi_config(free_port());
    let run = run_daemon("openpi-client-down", &cfg, 2.0);
    let s = run.summary();
    assert_eq!(s["chunks_accepted"], 0, "{s}");
    assert!(
        s["policy_errors_by_kind"]["server_down"].as_u64().unwrap() >= 2,
        "{s}"
    );
    let last = s["last_policy_error"].as_str().unwrap();
    assert!(last.contains("ws://127.0.0.1:"), "{last}");
    assert_eq!(s["remote_policy"]["connected"], false);
    assert_eq!(s["limit_violations"], 0);
    // The arm held, then stopped at the run's end: the policy never gave a chunk (exit 8).
    assert_eq!(run.code(), 8, "{}", run.stderr);
}

/// pi0d on both sides: the robot-side daemon's openpi client (default keys: the camera's
/// name as `observation.images.<name>`, `observation.state`, `prompt`) against `pi0d serve`
/// of the bundled tiny model, with the API key from an environment variable on both; a wrong
/// key is refused (HTTP 401) and named; `check` never prints the key.
#[test]
fn when_pi0d_drives_the_arm_from_pi0d_serve_with_a_key_expect_chunks_and_a_wrong_key_named() {
    let (mut server, port, _log) = serve_tiny_model("sekrit-123");
    let mut cfg = pi0d_serve_config(port);
    let o = cfg["policy"]["openpi"].as_table_mut().unwrap();
    o.insert("api_key_env".into(), Value::String("ROBOT_KEY".into()));
    std::env::set_var("ROBOT_KEY", "sekrit-123");
    let good = run_daemon("openpi-pi0d-serve", &cfg, 5.0);
    std::env::set_var("ROBOT_KEY", "not-the-key");
    let bad = run_daemon("openpi-pi0d-serve-bad-key", &cfg, 1.5);
    cfg["policy"]["openpi"]
        .as_table_mut()
        .unwrap()
        .insert("api_key".into(), Value::String("sekrit-123".into()));
    cfg["policy"]["openpi"]
        .as_table_mut()
        .unwrap()
        .remove("api_key_env");
    let (code, check) = check_config("openpi-check-key", &cfg);
    // SAFETY: kill(2) on our own child.
    unsafe {
        libc::kill(server.id() as i32, libc::SIGTERM);
    }
    server.wait().unwrap();

    let s = good.summary();
    // (The tiny model's random actions press the gripper on its position limits, where the
    // governor may brake harder than the jerk limit: limits are what is checked here.)
    assert_eq!(s["limit_violations"], 0, "{s}");
    assert!(
        s["chunks_accepted"].as_u64().unwrap() >= 3,
        "{s}\n{}",
        good.stderr
    );
    assert_eq!(s["remote_policy"]["reconnects"], 0, "{s}");
    let b = bad.summary();
    assert_eq!(b["chunks_accepted"], 0, "{b}");
    let last = b["last_policy_error"].as_str().unwrap();
    assert!(
        last.contains("HTTP 401") && last.contains("API key"),
        "{last}"
    );
    assert_eq!(code, Some(0), "{check}");
    assert!(check.contains("API key ***"), "{check}");
    assert!(!check.contains("sekrit-123"), "{check}");
    assert!(!good.stderr.contains("sekrit-123") && !bad.stderr.contains("sekrit-123"));
}

/// wss:// (feature `tls`): a TLS policy server with a self-signed certificate for 127.0.0.1;
/// with it as `ca_file` the arm is driven, without it the connection is refused naming the
/// certificate, and no chunk runs.
#[cfg(feature = "tls")]
#[test]
fn when_the_server_speaks_tls_expect_chunks_with_its_ca_and_a_named_refusal_without() {
    let dir = scratch_dir("openpi-tls");
    // A private CA and a server certificate for 127.0.0.1 signed by it.
    let authority = common::tls::TestCa::new(&dir, "ca");
    let ca = authority.cert.clone();
    let (cert, key) = authority.issue("127.0.0.1");
    let port = free_port();
    let mut server = Command::new(peer_python())
        .arg(root().join("tests/peers/tls_openpi_server.py"))
        .args(["--port", &port.to_string(), "--cert"])
        .arg(&cert)
        .arg("--key")
        .arg(&key)
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(dir.join("server.log")).unwrap())
        .spawn()
        .unwrap();
    await_ready(&mut server);
    let mut cfg = openpi_config(port);
    let o = cfg["policy"]["openpi"].as_table_mut().unwrap();
    for k in ["images", "state_key", "extra"] {
        o.remove(k);
    }
    o.insert(
        "url".into(),
        Value::String(format!("wss://127.0.0.1:{port}")),
    );
    let untrusted = run_daemon("openpi-tls-untrusted", &cfg, 1.5);
    cfg["policy"]["openpi"]
        .as_table_mut()
        .unwrap()
        .insert("ca_file".into(), Value::String(ca.display().to_string()));
    let trusted = run_daemon("openpi-tls-trusted", &cfg, 3.0);
    let _ = server.kill();
    let _ = server.wait();
    let s = trusted.summary();
    assert!(
        s["chunks_accepted"].as_u64().unwrap() >= 3,
        "{s}\n{}",
        trusted.stderr
    );
    assert_eq!(s["limit_violations"], 0);
    let u = untrusted.summary();
    assert_eq!(u["chunks_accepted"], 0, "{u}");
    let last = u["last_policy_error"].as_str().unwrap();
    assert!(last.contains("certificate"), "{last}");
}

/// Real-time chunking over the wire: with `[control.rtc]` on, the robot sends the running
/// chunk's leftover (`prev_actions`, `inference_delay`, `execution_horizon`) and pi0d serve
/// guides each chunk towards it; the new chunks then agree with the plan they replace, which
/// they do not with RTC off.
#[test]
fn when_rtc_is_on_against_pi0d_serve_expect_the_leftover_sent_and_honoured() {
    let (mut server, port, _log) = serve_tiny_model("rtc-key");
    let run = |rtc: bool| {
        let mut cfg = pi0d_serve_config(port);
        let o = cfg["policy"]["openpi"].as_table_mut().unwrap();
        o.insert("api_key".into(), Value::String("rtc-key".into()));
        cfg["control"].as_table_mut().unwrap().insert(
            "rtc".into(),
            table(&[
                ("enabled", Value::Boolean(rtc)),
                ("execution_horizon", Value::Integer(20)),
                // The link's own latency here is a step or two; a fixed delay makes the
                // guided span certain.
                ("inference_delay_steps", Value::Integer(5)),
            ]),
        );
        let r = run_daemon(&format!("openpi-rtc-{rtc}"), &cfg, 4.0);
        let s = r.summary().clone();
        assert_eq!(s["limit_violations"], 0, "{s}");
        assert_eq!(s["chunks_rejected"], 0, "{s}\n{}", r.stderr);
        s
    };
    let (off, on) = (run(false), run(true));
    // SAFETY: kill(2) on our own child.
    unsafe {
        libc::kill(server.id() as i32, libc::SIGTERM);
    }
    server.wait().unwrap();
    let sw = |s: &serde_json::Value, k: &str| s["chunk_switches"][k].clone();
    assert_eq!(sw(&off, "guided"), 0, "{off}");
    assert!(sw(&on, "guided").as_u64().unwrap() >= 4, "{on}");
    let p50 = |s: &serde_json::Value| sw(s, "prefix_distance")["p50"].as_f64().unwrap();
    eprintln!(
        "over openpi: chunk switch distance p50 {:.4} without RTC, {:.4} with",
        p50(&off),
        p50(&on)
    );
    assert!(p50(&off) > 0.0, "{off}");
    assert!(p50(&on) < 0.25 * p50(&off), "without {off}\nwith {on}");
}

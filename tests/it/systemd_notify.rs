//! The systemd notify protocol against a real datagram socket, as systemd provides it:
//! READY=1 after start-up, WATCHDOG=1 while the loop ticks, STATUS= lines, STOPPING=1. The
//! unit file checked by `systemd-analyze verify` (Debian's systemd, installed by
//! tools/test.sh) and for what it must say; its example configuration loads.

use crate::common;

use std::process::Command;
use std::time::Duration;

#[test]
fn when_run_under_systemd_expect_ready_watchdog_status_stopping() {
    let dir = common::scratch_dir("notify");
    let cfg = dir.join("config.toml");
    std::fs::write(&cfg, toml::to_string(&common::sim_config()).unwrap()).unwrap();
    // Read as systemd does, while the daemon runs: a datagram queue holds only ~10 messages.
    let socket = common::NotifySocket::open(&dir);
    let _serial = common::SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let status = Command::new(env!("CARGO_BIN_EXE_pi0d"))
        .args(["run", "--quiet", "--duration", "2.5", "--config"])
        .arg(&cfg)
        .env("NOTIFY_SOCKET", &socket.path)
        .env("WATCHDOG_USEC", "400000")
        .status()
        .unwrap();
    assert!(status.success());

    let messages: Vec<String> = socket.messages().into_iter().map(|(_, m)| m).collect();
    let first = |m: &str| messages.iter().position(|x| x.contains(m));
    let ready = first("READY=1").unwrap_or_else(|| panic!("no READY=1 in {messages:?}"));
    let stopping = first("STOPPING=1").unwrap_or_else(|| panic!("no STOPPING=1 in {messages:?}"));
    assert!(ready < stopping);
    let pings = messages.iter().filter(|m| m.contains("WATCHDOG=1")).count();
    assert!(
        pings >= 5,
        "watchdog every 200 ms over 2.5 s, got {pings}: {messages:?}"
    );
    assert!(
        messages.iter().any(|m| m.contains("STATUS=running")),
        "{messages:?}"
    );
}

fn unit() -> String {
    std::fs::read_to_string(common::root().join("systemd/pi0d.service")).unwrap()
}

#[test]
fn when_the_unit_is_verified_expect_no_complaint_and_the_hardening_it_promises() {
    let dir = common::scratch_dir("unit");
    // As installed, with the binary where this build put it (verify checks ExecStart).
    let text = unit().replace("/usr/local/bin/pi0d", env!("CARGO_BIN_EXE_pi0d"));
    let path = dir.join("pi0d.service");
    std::fs::write(&path, &text).unwrap();
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&path)
        .output()
        .expect("systemd-analyze (Debian's systemd package; tools/test.sh installs it)");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && stderr.trim().is_empty(), "{stderr}");
    // A misspelt key is a warning there: the check above would see it.
    let bad = dir.join("bad.service");
    std::fs::write(&bad, text.replace("ProtectSystem=", "ProtectSystm=")).unwrap();
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&bad)
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("Unknown key"));

    let value = |key: &str| -> String {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{key}=")))
            .unwrap_or_else(|| panic!("the unit has no {key}="))
            .trim()
            .to_string()
    };
    for (key, want) in [
        ("Type", "notify"),
        ("User", "pi0d"),
        ("NoNewPrivileges", "yes"),
        ("ProtectSystem", "strict"),
        ("ProtectHome", "yes"),
        ("PrivateTmp", "yes"),
        ("CapabilityBoundingSet", ""),
        ("StateDirectory", "pi0d"),
        ("Restart", "on-failure"),
        ("LimitRTPRIO", "95"),
        ("LimitMEMLOCK", "infinity"),
        ("EnvironmentFile", "-/etc/pi0d/pi0d.env"),
    ] {
        assert_eq!(value(key), want, "{key}");
    }
    assert!(value("WatchdogSec").ends_with('s'));
    assert!(value("StartLimitBurst").parse::<u32>().unwrap() >= 1);
    // Never restarted: what needs a person (an invalid configuration, usage, a refused start).
    let prevent: Vec<u8> = value("RestartPreventExitStatus")
        .split_whitespace()
        .map(|c| c.parse().unwrap())
        .collect();
    use pi0d::daemon::exit::ExitReason;
    for r in [
        ExitReason::InvalidInput,
        ExitReason::Usage,
        ExitReason::StartRefused,
    ] {
        assert!(prevent.contains(&r.code()), "{r} restarted");
    }
    for r in [ExitReason::ControlFault, ExitReason::ThreadFault] {
        assert!(
            !prevent.contains(&r.code()),
            "{r} not restarted (behind the latch)"
        );
    }
}

#[test]
fn when_the_service_config_example_is_loaded_expect_a_ros_robot_with_absolute_paths() {
    let text = std::fs::read_to_string(common::root().join("systemd/pi0d.toml.example")).unwrap();
    let table: toml::Table = text.parse().unwrap();
    let urdf = table["robot"]["urdf"].as_str().unwrap();
    let ck = table["policy"]["checkpoint"].as_str().unwrap();
    assert!(urdf.starts_with("/opt/pi0d/") && ck.starts_with("/opt/pi0d/models/"));
    assert_eq!(table["robot"]["io"].as_str(), Some("ros"));
    // Loads, with the URDF where this checkout has it.
    let dir = common::scratch_dir("unit-config");
    let file = dir.join("pi0d.toml");
    let local = common::root().join("urdf/ur5e.urdf");
    std::fs::write(&file, text.replace(urdf, &local.display().to_string())).unwrap();
    let cfg = pi0d::config::Config::load(&file).unwrap();
    assert!(cfg.realtime.priority > 0 && cfg.realtime.lock_memory);
}

/// `[metrics]`: the endpoint scraped while the arm runs and parsed by Prometheus' own client
/// library (tests/peers/scrape_metrics.py): ticks, the mode, input ages, the chunk latency
/// histogram; another path is a 404.
#[test]
fn when_metrics_are_on_expect_prometheus_to_parse_live_figures() {
    let dir = common::scratch_dir("metrics");
    let port = common::free_port();
    let mut cfg = common::sim_config();
    cfg.insert(
        "metrics".into(),
        common::table(&[("listen", toml::Value::String(format!("127.0.0.1:{port}")))]),
    );
    let file = dir.join("config.toml");
    std::fs::write(&file, toml::to_string(&cfg).unwrap()).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_pi0d"))
        .args(["run", "--quiet", "--duration", "4", "--config"])
        .arg(&file)
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(2500));
    let url = format!("http://127.0.0.1:{port}/metrics");
    let out = Command::new(common::root().join(".venv/bin/python"))
        .arg(common::root().join("tests/peers/scrape_metrics.py"))
        .arg(&url)
        .output()
        .unwrap();
    let missing = Command::new(common::root().join(".venv/bin/python"))
        .args(["-c", "import sys, urllib.request\ntry:\n urllib.request.urlopen(sys.argv[1], timeout=5)\nexcept urllib.error.HTTPError as e:\n print(e.code)"])
        .arg(format!("http://127.0.0.1:{port}/other"))
        .output()
        .unwrap();
    let status = child.wait().unwrap();
    assert!(status.success());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let m: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let value = |family: &str, sample: &str| -> f64 {
        m[family]["samples"]
            .as_array()
            .unwrap_or_else(|| panic!("no {family}: {m}"))
            .iter()
            .find(|s| s[0] == sample)
            .unwrap_or_else(|| panic!("no {sample}: {m}"))[2]
            .as_f64()
            .unwrap()
    };
    assert_eq!(m["pi0d_control_ticks"]["type"], "counter");
    assert!(
        value("pi0d_control_ticks", "pi0d_control_ticks_total") > 200.0,
        "{m}"
    );
    assert_eq!(value("pi0d_mode_running", "pi0d_mode_running"), 1.0, "{m}");
    assert!(
        value(
            "pi0d_joint_state_age_seconds",
            "pi0d_joint_state_age_seconds"
        ) < 0.1
    );
    assert!(value("pi0d_camera0_age_seconds", "pi0d_camera0_age_seconds") < 0.5);
    assert_eq!(m["pi0d_chunk_latency_seconds"]["type"], "histogram");
    let n = value(
        "pi0d_chunk_latency_seconds",
        "pi0d_chunk_latency_seconds_count",
    );
    assert!(n >= 3.0, "{m}");
    let sum = value(
        "pi0d_chunk_latency_seconds",
        "pi0d_chunk_latency_seconds_sum",
    );
    // The scripted policy takes 80 ms per chunk.
    assert!(sum / n > 0.05 && sum / n < 1.0, "{m}");
    assert_eq!(String::from_utf8_lossy(&missing.stdout).trim(), "404");
}

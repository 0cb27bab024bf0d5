//! `pi0d serve` against openpi's own client (PyPI openpi-client 0.1.2, used unchanged by
//! tests/peers/openpi_client_check.py): the metadata frame, lerobot's end-to-end observation
//! answered with lerobot's actions, timing fields, an error reply the client raises on,
//! /healthz, a wrong API key refused; hostile frames (oversized, deeply nested, absurd shapes,
//! wrong dtypes, garbage, text) and a slow-loris client cost only their own connection; then
//! SIGTERM ends the server with 0.

mod common;

use std::process::{Child, Command};
use std::time::Duration;

use common::*;
use pi0d::policy::pi0::tensorfile::TensorFile;

/// `pi0d serve ARGS` with the API key `k3y`.
fn start_server(args: &[&std::ffi::OsStr]) -> (Child, u16, std::thread::JoinHandle<String>) {
    pi0d_serve(args, ("PI0D_TEST_KEY", "k3y"))
}

/// `pi0d serve` of the fixture checkpoint on one thread, its third camera optional, with
/// `extra` options.
fn serve_fixture(extra: &[&str]) -> (Child, u16, std::thread::JoinHandle<String>) {
    let ck = root().join("tests/fixtures/pi0_float32");
    let mut args: Vec<&std::ffi::OsStr> = vec![
        "--checkpoint".as_ref(),
        ck.as_os_str(),
        "--optional-camera".as_ref(),
        "cam2".as_ref(),
        "--threads".as_ref(),
        "1".as_ref(),
    ];
    args.extend(extra.iter().map(std::ffi::OsStr::new));
    start_server(&args)
}

/// `config/sim.toml` with the fixture checkpoint as its policy, its third camera optional
/// (what `pi0d serve --config` reads).
fn fixture_config() -> toml::Table {
    let mut cfg = sim_model_config();
    let p = cfg["policy"].as_table_mut().unwrap();
    p.insert(
        "checkpoint".into(),
        toml::Value::String(
            root()
                .join("tests/fixtures/pi0_float32")
                .display()
                .to_string(),
        ),
    );
    p.insert(
        "optional_cameras".into(),
        toml::Value::Array(vec![toml::Value::String("cam2".into())]),
    );
    cfg
}

/// Runs tests/peers/openpi_client_check.py with `args` against the server on `port` (key
/// `k3y`), then stops the server (SIGTERM): the script's report, the server's exit code and
/// its log.
fn check(
    (server, port, log): (&mut Child, u16, std::thread::JoinHandle<String>),
    dir: &std::path::Path,
    case: &std::path::Path,
    args: &[&str],
) -> (serde_json::Value, Option<i32>, String) {
    let out = Command::new(peer_python())
        .arg(root().join("tests/peers/openpi_client_check.py"))
        .args(["--port", &port.to_string(), "--key", "k3y"])
        .args(args)
        .arg("--case")
        .arg(case)
        .arg("--report")
        .arg(dir.join("report.json"))
        .output()
        .unwrap();
    unsafe_terminate(server);
    let status = wait_for(server, Duration::from_secs(10));
    let log = log.join().unwrap();
    assert!(
        out.status.success(),
        "{}\nserver:\n{log}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r =
        serde_json::from_str(&std::fs::read_to_string(dir.join("report.json")).unwrap()).unwrap();
    (r, status, log)
}

fn actions(r: &serde_json::Value) -> Vec<f32> {
    r["actions"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|row| row.as_array().unwrap().iter())
        .map(|x| x.as_f64().unwrap() as f32)
        .collect()
}

/// The largest difference from lerobot's actions for the end-to-end case.
fn error_against_lerobot(case: &std::path::Path, got: &[f32]) -> f32 {
    let want = TensorFile::read(&case.join("expected.safetensors")).unwrap();
    let (_, want) = want.f32("actions", &[Some(1), Some(50), Some(7)]).unwrap();
    assert_eq!(got.len(), want.len());
    got.iter()
        .zip(want)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max)
}

#[test]
fn when_openpis_client_talks_to_pi0d_serve_expect_lerobots_actions_and_every_bad_request_refused() {
    let dir = scratch_dir("serve-openpi");
    let case = root().join("tests/fixtures/cases/pi0_end_to_end");
    let (mut server, port, rest) = serve_fixture(&["--max-request-mib", "1"]);
    let (r, status, log) = check((&mut server, port, rest), &dir, &case, &[]);

    assert_eq!(r["healthz"], serde_json::json!([200, "OK\n"]));
    assert!(
        r["wrong_key"].as_str().unwrap().contains("HTTP 401"),
        "{}",
        r["wrong_key"]
    );
    let m = &r["metadata"];
    assert_eq!(m["server"], "pi0d");
    assert_eq!(m["action_horizon"], 50);
    assert_eq!(m["action_dim"], 7);
    assert_eq!(m["real_time_chunking"], true);
    assert_eq!(
        strings(&m["image_keys"]),
        [
            "observation.images.cam0",
            "observation.images.cam1",
            "observation.images.cam2"
        ]
    );

    // lerobot's actions for this observation and noise (its pre- and post-processors).
    assert_eq!(r["actions_dtype"], "float32");
    let err = error_against_lerobot(&case, &actions(&r));
    assert!(err <= 1e-4, "max abs error {err} against lerobot");
    assert_eq!(
        r["same_again"], true,
        "the request's noise decides the reply"
    );
    // openpi's timing fields: infer_ms, and prev_total_ms from the second request on.
    assert!(r["first_timing"]["infer_ms"].as_f64().unwrap() > 0.0);
    assert!(r["first_timing"].get("prev_total_ms").is_none());
    assert!(r["second_timing"]["prev_total_ms"].as_f64().unwrap() > 0.0);
    assert!(r["policy_timing"]["prefix_ms"].as_f64().unwrap() > 0.0);

    // Concurrent clients: batched together, each answered with its own actions.
    let batches: Vec<u64> = r["concurrent_batches"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b.as_u64().unwrap())
        .collect();
    assert!(batches.iter().any(|b| *b > 1), "never batched: {batches:?}");
    assert_eq!(r["distinct_replies"], 4);
    assert!(
        r["concurrent_max_diff"].as_f64().unwrap() < 1e-5,
        "a batched reply differs from the same request alone: {}",
        r["concurrent_max_diff"]
    );

    // The client raised on the server's error frame, which names the missing key.
    let e = r["error"].as_str().unwrap();
    assert!(
        e.contains("`observation.state`: missing: expected 7 numbers"),
        "{e}"
    );

    let h = &r["hostile"];
    let reply = |k: &str| h[k]["reply"].as_str().unwrap_or_default().to_string();
    assert!(reply("deep").contains("not msgpack"), "{h}");
    assert!(reply("absurd_shape").contains("`observation.state`"), "{h}");
    assert!(
        reply("wrong_dtype").contains("`observation.images.cam0`: expected a uint8"),
        "{h}"
    );
    assert!(reply("garbage").contains("not msgpack"), "{h}");
    assert!(
        reply("text").contains("expected a binary msgpack frame"),
        "{h}"
    );
    // Over the 1 MiB cap: told so, or cut off mid-send.
    let over = &h["oversized"];
    assert!(
        over["reply"]
            .as_str()
            .is_some_and(|s| s.contains("bad frame"))
            || over["closed"].is_string(),
        "{over}"
    );
    assert_eq!(
        r["after_hostile"], true,
        "a well-behaved client is still served"
    );
    assert!(
        r["after_hostile_s"].as_f64().unwrap() < 30.0,
        "not held up by the slow-loris client"
    );
    assert_eq!(status, Some(0), "SIGTERM ends the server cleanly:\n{log}");
}

fn unsafe_terminate(child: &std::process::Child) {
    // SAFETY: kill(2) on our own child's pid.
    unsafe {
        libc::kill(child.id() as i32, libc::SIGTERM);
    }
}

fn wait_for(child: &mut std::process::Child, limit: Duration) -> Option<i32> {
    let start = std::time::Instant::now();
    while start.elapsed() < limit {
        if let Some(s) = child.try_wait().unwrap() {
            return s.code();
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    None
}

/// `pi0d serve --config` with a `[serve]` key mapping (openpi's LIBERO-style keys, and one
/// the model does not take, ignored): openpi's client sends that layout unchanged and gets
/// lerobot's actions.
#[test]
fn when_serve_maps_openpis_keys_expect_the_same_actions_from_that_layout() {
    let dir = scratch_dir("serve-openpi-keys");
    let case = root().join("tests/fixtures/cases/pi0_end_to_end");
    let mut cfg = fixture_config();
    let serve: toml::Table = toml::from_str(
        r#"
        images = { cam0 = "observation/image", cam1 = "observation/wrist_image" }
        state_key = "observation/state"
        ignore = ["observation/joint_position"]
        "#,
    )
    .unwrap();
    cfg.insert("serve".into(), toml::Value::Table(serve));
    let path = dir.join("serve.toml");
    std::fs::write(&path, toml::to_string(&cfg).unwrap()).unwrap();
    let (mut server, port, rest) = start_server(&["--config".as_ref(), path.as_os_str()]);
    let keys = r#"{"observation.images.cam0": "observation/image", "observation.images.cam1": "observation/wrist_image", "observation.state": "observation/state"}"#;
    let (r, _, _) = check((&mut server, port, rest), &dir, &case, &["--keys", keys]);
    assert_eq!(
        strings(&r["metadata"]["image_keys"]),
        [
            "observation/image",
            "observation/wrist_image",
            "observation.images.cam2"
        ]
    );
    assert_eq!(r["metadata"]["state_key"], "observation/state");
    let err = error_against_lerobot(&case, &actions(&r));
    assert!(err <= 1e-4, "max abs error {err} against lerobot");
}

/// More requests at once than the queue holds (one running, one waiting, one-at-a-time): the
/// rest are answered "busy" at once, naming the queue, and the server keeps serving.
#[test]
fn when_more_requests_come_than_the_queue_holds_expect_busy_answers_and_service_after() {
    let dir = scratch_dir("serve-openpi-busy");
    let case = root().join("tests/fixtures/cases/pi0_end_to_end");
    let (mut server, port, rest) = serve_fixture(&["--queue", "1", "--max-batch", "1"]);
    let (r, _, _) = check((&mut server, port, rest), &dir, &case, &["--busy", "8"]);
    let outcomes = strings(&r["outcomes"]);
    let answered = outcomes.iter().filter(|o| **o == "answered").count();
    let busy = outcomes
        .iter()
        .filter(|o| o.contains("busy: 1 requests are already waiting"))
        .count();
    assert!(answered >= 1 && busy >= 1, "{outcomes:?}");
    assert_eq!(answered + busy, outcomes.len(), "{outcomes:?}");
    assert_eq!(r["after"], 50);
}

/// `pi0d serve --config` with the policy on ONNX Runtime (graphs `pi0d export` wrote for the
/// checkpoint's three cameras, the third optional): openpi's client gets lerobot's actions.
#[cfg(feature = "onnx")]
#[test]
fn when_serve_runs_the_exported_graphs_expect_lerobots_actions() {
    let dir = scratch_dir("serve-openpi-onnx");
    let case = root().join("tests/fixtures/cases/pi0_end_to_end");
    let ck = root().join("tests/fixtures/pi0_float32");
    let graphs = dir.join("graphs");
    let export = Command::new(env!("CARGO_BIN_EXE_pi0d"))
        .args(["export", "--checkpoint"])
        .arg(&ck)
        .args(["--cameras", "3", "--out"])
        .arg(&graphs)
        .output()
        .unwrap();
    assert!(
        export.status.success(),
        "{}",
        String::from_utf8_lossy(&export.stderr)
    );
    let mut cfg = fixture_config();
    with_backend(
        &mut cfg,
        "onnx",
        &[
            (
                "model_dir",
                toml::Value::String(graphs.display().to_string()),
            ),
            (
                "library",
                toml::Value::String(ort_library().display().to_string()),
            ),
        ],
    );
    let path = dir.join("serve.toml");
    std::fs::write(&path, toml::to_string(&cfg).unwrap()).unwrap();
    let (mut server, port, rest) = start_server(&["--config".as_ref(), path.as_os_str()]);
    let (r, _, _) = check((&mut server, port, rest), &dir, &case, &["--keys", "{}"]);
    let err = error_against_lerobot(&case, &actions(&r));
    assert!(err <= 1e-4, "max abs error {err} against lerobot (onnx)");
}

/// `pi0d serve` of a checkpoint saved by lerobot with relative actions and a rename map
/// (tests/fixtures/processors): openpi's client sends the robot's own camera keys, the state
/// and, for real-time chunking, the running chunk's absolute leftover; the reply is what
/// lerobot's postprocessor returns (absolute positions).
#[test]
fn when_serve_runs_a_relative_action_checkpoint_expect_lerobots_absolute_actions() {
    for name in ["pi0_relative_rtc", "pi0_rename_map"] {
        let dir = scratch_dir(&format!("serve-openpi-{name}"));
        let (case, ck) = pi0d::testing::processor_case(name);
        let (mut server, port, rest) = start_server(&[
            "--checkpoint".as_ref(),
            ck.as_os_str(),
            "--optional-camera".as_ref(),
            "cam2".as_ref(),
            "--threads".as_ref(),
            "1".as_ref(),
            "--rtc-schedule".as_ref(),
            "linear".as_ref(),
            "--rtc-max-guidance".as_ref(),
            "10".as_ref(),
        ]);
        let (r, _, log) = check(
            (&mut server, port, rest),
            &dir,
            &case,
            &["--processor-case"],
        );
        let err = error_against_lerobot(&case, &actions(&r));
        assert!(
            err <= 2e-6,
            "{name}: max abs error {err} against lerobot\n{log}"
        );
        if name == "pi0_rename_map" {
            // The robot's keys, as the checkpoint's rename_map takes them.
            assert_eq!(
                strings(&r["metadata"]["image_keys"]),
                [
                    "observation.images.wrist",
                    "observation.images.top",
                    "observation.images.cam2"
                ]
            );
        }
    }
}

/// `pi0d serve --config` with the `acl` backend, on the model of AscendCL (tools/ascendcl-model):
/// graphs exported for batches of 2 and compiled by its ATC; openpi's client gets lerobot's
/// actions, concurrent requests are batched in pairs on the NPU, each answered with its own.
#[test]
fn when_serve_runs_batched_on_the_ascendcl_model_expect_lerobots_actions_each_client_its_own() {
    let dir = scratch_dir("serve-openpi-acl");
    let case = root().join("tests/fixtures/cases/pi0_end_to_end");
    let graphs = dir.join("graphs");
    let report = dir.join("acl-report.json");
    let ck = root().join("tests/fixtures/pi0_float32");
    let args = ["--cameras", "3", "--batch", "2", "--atc", "Ascend310P1"];
    acl::export(&ck, &args, &graphs);
    let mut cfg = fixture_config();
    acl::with_backend_on(&mut cfg, &graphs);
    let path = dir.join("serve.toml");
    std::fs::write(&path, toml::to_string(&cfg).unwrap()).unwrap();
    let args: [&std::ffi::OsStr; 4] = [
        "--config".as_ref(),
        path.as_os_str(),
        "--max-batch".as_ref(),
        "2".as_ref(),
    ];
    let env = acl::env(&report, &[]);
    let (mut server, port, rest) = pi0d_serve_in(&args, ("PI0D_TEST_KEY", "k3y"), &env);
    let (r, status, log) = check((&mut server, port, rest), &dir, &case, &[]);
    assert_eq!(status, Some(0), "{log}");
    assert!(log.contains("AscendCL models loaded"), "{log}");
    let err = error_against_lerobot(&case, &actions(&r));
    assert!(err <= 1e-4, "max abs error {err} against lerobot (acl)");
    let batches: Vec<u64> = r["concurrent_batches"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b.as_u64().unwrap())
        .collect();
    assert!(batches.contains(&2), "never batched: {batches:?}");
    assert_eq!(r["distinct_replies"], 4);
    assert!(
        r["concurrent_max_diff"].as_f64().unwrap() < 1e-5,
        "a batched reply differs from the same request alone: {}",
        r["concurrent_max_diff"]
    );
    let model = acl::report(&report);
    assert_eq!(model["errors"], serde_json::json!([]), "{model}");
    acl::assert_released(&model, &log);
}

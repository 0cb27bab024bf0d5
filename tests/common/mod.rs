//! Helpers for tests that run the real `pi0d` binary.

#![allow(dead_code)]

pub mod acl;
#[path = "../../src/counting_alloc.rs"]
pub mod counting_alloc;
pub mod edge;
pub mod hil;
pub mod procs;
pub mod pty;
pub mod tls;

use std::path::Path;
use std::process::{Command, Output};
use std::sync::Mutex;

pub fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Scenario runs are timing-sensitive (watchdogs at 100 ms): run them one at a time so they
/// do not starve each other on a 2-core machine.
pub static SERIAL: Mutex<()> = Mutex::new(());

/// `config/sim.toml` as a TOML table with paths made absolute and the bundled random-weight
/// model (`models/tiny-pi0`), to be edited by a test.
pub fn sim_model_config() -> toml::Table {
    let text = std::fs::read_to_string(root().join("config/sim.toml")).unwrap();
    let mut t: toml::Table = text.parse().unwrap();
    let urdf = root().join("urdf/sim_arm.urdf");
    t["robot"]["urdf"] = toml::Value::String(urdf.display().to_string());
    let model = root().join("models/tiny-pi0");
    t["policy"]["checkpoint"] = toml::Value::String(model.display().to_string());
    // The random-weight model's camera is `front`; the demo's, above the table, `top`.
    t["sim"]["cameras"][0]["name"] = toml::Value::String("front".into());
    t
}

/// `config/sim.toml` with the scripted policy: a smooth, known motion (swing of 0.4 rad at
/// 0.2 Hz, 80 ms simulated inference), so scenario timings and motions are predictable.
pub fn sim_config() -> toml::Table {
    let mut t = sim_model_config();
    let p = t["policy"].as_table_mut().unwrap();
    p.insert("kind".into(), toml::Value::String("scripted".into()));
    p.insert("amplitude".into(), toml::Value::Float(0.4));
    p.insert("frequency_hz".into(), toml::Value::Float(0.2));
    p.insert("latency_s".into(), toml::Value::Float(0.08));
    t
}

/// `sim_model_config` recording into `path` (`[record]`, camera frames at 5 Hz): a run's
/// observations for calibration.
pub fn recording_config(path: &Path) -> toml::Table {
    let mut cfg = sim_model_config();
    cfg.insert(
        "record".into(),
        table(&[
            ("path", toml::Value::String(path.display().to_string())),
            ("camera_hz", toml::Value::Float(5.0)),
        ]),
    );
    cfg
}

pub fn table(pairs: &[(&str, toml::Value)]) -> toml::Value {
    let mut t = toml::Table::new();
    for (k, v) in pairs {
        t.insert(k.to_string(), v.clone());
    }
    toml::Value::Table(t)
}

/// `[[drill]]` with one drill: `event` at `at_s` (and `duration_s` where it lasts).
pub fn add_drill(cfg: &mut toml::Table, event: &str, at_s: f64, duration_s: Option<f64>) {
    let mut d = vec![
        ("at_s", toml::Value::Float(at_s)),
        ("event", toml::Value::String(event.to_string())),
    ];
    if let Some(s) = duration_s {
        d.push(("duration_s", toml::Value::Float(s)));
    }
    cfg.insert("drill".into(), toml::Value::Array(vec![table(&d)]));
}

/// The library's scratch-directory guard: removed when dropped, also when a test panics.
pub use pi0d::testing::TempDir;

/// A fresh scratch directory for test `name`, removed when the guard drops.
pub fn scratch_dir(name: &str) -> TempDir {
    TempDir::new(&format!("test-{name}"))
}

pub struct Run {
    /// The run's directory (config, summary, recordings), removed when the run is dropped.
    pub dir: TempDir,
    pub output: Output,
    pub summary: Option<serde_json::Value>,
    pub stderr: String,
    /// How long the daemon ran (from its start, not from waiting for `SERIAL`).
    pub elapsed_s: f64,
}

impl Run {
    pub fn code(&self) -> i32 {
        self.output.status.code().unwrap_or(-1)
    }

    pub fn summary(&self) -> &serde_json::Value {
        self.summary
            .as_ref()
            .unwrap_or_else(|| panic!("no summary written; stderr:\n{}", self.stderr))
    }

    /// The state names the daemon went through, in order ("starting", "running", ...).
    pub fn states(&self) -> Vec<String> {
        let s = self.summary();
        let mut out = vec!["starting".to_string()];
        for t in s["transitions"].as_array().unwrap() {
            out.push(t["to"].as_str().unwrap().to_string());
        }
        out
    }

    /// Time (s since start) of the first transition into `to` at or after `after_s`.
    pub fn time_of(&self, to: &str, after_s: f64) -> Option<f64> {
        self.summary()["transitions"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|t| t["to"].as_str() == Some(to))
            .map(|t| t["t_s"].as_f64().unwrap())
            .find(|t| *t >= after_s)
    }

    pub fn event(&self, name: &str) -> u64 {
        self.summary()["safety_events"][name].as_u64().unwrap()
    }

    pub fn rejected(&self, reason: &str) -> u64 {
        self.summary()["chunks_rejected_by_reason"][reason]
            .as_u64()
            .unwrap_or(0)
    }
}

/// Writes `config` and runs `pi0d run --quiet` for `duration_s` seconds.
pub fn run_daemon(name: &str, config: &toml::Table, duration_s: f64) -> Run {
    run_daemon_with(name, config, duration_s, &["--quiet"])
}

/// As `run_daemon`, with `args` (`--quiet`, `--dry-run`) added to `pi0d run`. A daemon still
/// running a minute past its `--duration` is killed, so a hung stop fails the test instead of
/// hanging the suite.
pub fn run_daemon_with(name: &str, config: &toml::Table, duration_s: f64, args: &[&str]) -> Run {
    run_daemon_killed_after(
        name,
        config,
        duration_s,
        args,
        std::time::Duration::from_secs(60),
    )
}

/// As `run_daemon_with`, but a daemon still running `kill_after` past its `--duration` (a stop
/// that never comes to rest) is killed: its `Run::output.status.code()` is then `None`. Output
/// is read beside the wait, so a chatty run never blocks on a full pipe.
pub fn run_daemon_killed_after(
    name: &str,
    config: &toml::Table,
    duration_s: f64,
    args: &[&str],
    kill_after: std::time::Duration,
) -> Run {
    run_daemon_in(name, config, duration_s, args, kill_after, &[])
}

/// As `run_daemon_killed_after`, with `env` added to the daemon's environment.
pub fn run_daemon_in(
    name: &str,
    config: &toml::Table,
    duration_s: f64,
    args: &[&str],
    kill_after: std::time::Duration,
    env: &[(&str, std::ffi::OsString)],
) -> Run {
    use std::io::Read;
    use std::process::Stdio;
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = scratch_dir(name);
    let cfg = dir.join("config.toml");
    std::fs::write(&cfg, toml::to_string(config).unwrap()).unwrap();
    let summary = dir.join("summary.json");
    let started = std::time::Instant::now();
    let mut child = Command::new(env!("CARGO_BIN_EXE_pi0d"))
        .arg("run")
        .args(args)
        .arg("--config")
        .arg(&cfg)
        .args(["--duration", &duration_s.to_string(), "--summary"])
        .arg(&summary)
        .env("RUST_LOG", "info")
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("pi0d starts");
    let drain = |mut pipe: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            let _ = pipe.read_to_end(&mut bytes);
            bytes
        })
    };
    let stdout = drain(Box::new(child.stdout.take().unwrap()));
    let stderr = drain(Box::new(child.stderr.take().unwrap()));
    let deadline = started + std::time::Duration::from_secs_f64(duration_s) + kill_after;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            break child.wait().unwrap();
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let elapsed_s = started.elapsed().as_secs_f64();
    let output = Output {
        status,
        stdout: stdout.join().unwrap_or_default(),
        stderr: stderr.join().unwrap_or_default(),
    };
    let stderr = String::from_utf8_lossy(&output.stderr).to_string();
    let summary = std::fs::read_to_string(&summary)
        .ok()
        .and_then(|s| serde_json::from_str(&s).ok());
    Run {
        dir,
        output,
        summary,
        stderr,
        elapsed_s,
    }
}

/// Asserts what every run must show: no limit violation and jerk within the configured limits.
pub fn assert_safe(run: &Run, config: &toml::Table) {
    let s = run.summary();
    assert_eq!(
        s["limit_violations"], 0,
        "limit violations; stderr:\n{}",
        run.stderr
    );
    let default_jerk = config["limits"]["jerk"].as_float().unwrap();
    for (joint, jerk) in s["max_abs_jerk"].as_object().unwrap() {
        let limit = config["limits"]
            .get("joints")
            .and_then(|j| j.get(joint))
            .and_then(|j| j.get("jerk"))
            .and_then(|j| j.as_float())
            .unwrap_or(default_jerk);
        let jerk = jerk.as_f64().unwrap();
        assert!(
            jerk <= limit * 1.001 + 1e-3,
            "joint {joint}: jerk {jerk} above {limit}"
        );
    }
}

/// Copies the tiny f32 checkpoint with `edit` applied to its tensors, returns the new dir
/// (removed when dropped).
pub fn edited_checkpoint(
    name: &str,
    edit: impl Fn(&mut Vec<(String, safetensors::Dtype, Vec<usize>, Vec<u8>)>),
) -> TempDir {
    let src = root().join("tests/fixtures/pi0_float32");
    let dir = TempDir::new(&format!("bad-ck-{name}"));
    std::fs::copy(src.join("config.json"), dir.join("config.json")).unwrap();
    std::fs::copy(src.join("arch.json"), dir.join("arch.json")).unwrap();
    let bytes = std::fs::read(src.join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut tensors: Vec<(String, safetensors::Dtype, Vec<usize>, Vec<u8>)> = st
        .iter()
        .map(|(n, v)| {
            (
                n.to_string(),
                v.dtype(),
                v.shape().to_vec(),
                v.data().to_vec(),
            )
        })
        .collect();
    edit(&mut tensors);
    let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = tensors
        .iter()
        .map(|(n, d, s, b)| {
            (
                n.clone(),
                safetensors::tensor::TensorView::new(*d, s.clone(), b).unwrap(),
            )
        })
        .collect();
    safetensors::serialize_to_file(views, None, &dir.join("model.safetensors")).unwrap();
    dir
}

/// The golden pi0 fixture with every Gemma MLP (the language model's and the expert's) made
/// `width` wide: its gate, up and down projections replaced by seeded random f32 values of the
/// originals' spread (the down-projection's scaled to its wider input). pi0's real MLPs are 4096 and 16384 wide; the fixture's 64 and 128 are
/// below where `w8a8` rotates the down-projections' inputs.
pub fn wide_mlp_checkpoint(name: &str, width: usize) -> TempDir {
    edited_checkpoint(&format!("wide-{name}"), |tensors| {
        for (n, dtype, shape, bytes) in tensors.iter_mut() {
            // Seeded by the name (FNV-1a): the same values whatever order the file lists.
            let mut seed = n.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
                (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
            });
            let gemma = n.contains(".language_model.") || n.contains(".gemma_expert.");
            let part = [
                ".mlp.gate_proj.weight",
                ".mlp.up_proj.weight",
                ".mlp.down_proj.weight",
            ]
            .iter()
            .position(|p| n.ends_with(p));
            let (true, Some(part)) = (gemma, part) else {
                continue;
            };
            assert_eq!(*dtype, safetensors::Dtype::F32, "{n}");
            let values: Vec<f32> = bytes
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
                .collect();
            let mut spread =
                (values.iter().map(|v| v * v).sum::<f32>() / values.len() as f32).sqrt();
            if part == 2 {
                // The down-projection's output keeps its size over the wider input.
                spread *= (shape[1] as f32 / width as f32).sqrt();
            }
            *shape = if part == 2 {
                vec![shape[0], width]
            } else {
                vec![width, shape[1]]
            };
            let count = shape[0] * shape[1];
            *bytes = (0..count)
                .flat_map(|_| {
                    // xorshift64*, a sum of four uniforms: near Gaussian, unit variance.
                    let mut sum = 0.0f32;
                    for _ in 0..4 {
                        seed ^= seed >> 12;
                        seed ^= seed << 25;
                        seed ^= seed >> 27;
                        let u = (seed.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 40) as f32;
                        sum += u / (1u64 << 24) as f32 - 0.5;
                    }
                    (sum * 3.0f32.sqrt() * spread).to_le_bytes()
                })
                .collect();
        }
    })
}

/// A copy of the checkpoint (or any flat directory) `src` in a scratch directory, to be edited
/// by a test; linked files are copied as regular files.
pub fn copied_checkpoint(src: &Path, name: &str) -> TempDir {
    let dir = scratch_dir(name);
    for e in std::fs::read_dir(src).unwrap().flatten() {
        std::fs::copy(e.path(), dir.join(e.file_name())).unwrap();
    }
    dir
}

/// The JSON file at `path` edited by `f`, in place.
pub fn edit_json(path: &Path, f: impl FnOnce(&mut serde_json::Value)) {
    let text = std::fs::read_to_string(path).unwrap();
    let mut v: serde_json::Value = serde_json::from_str(&text).unwrap();
    f(&mut v);
    std::fs::write(path, serde_json::to_string_pretty(&v).unwrap()).unwrap();
}

/// The f32 tensors of a safetensors file (a normalizer's stats) for which `values` gives new
/// values (same count) replaced, in place; the others kept.
pub fn set_f32_tensors(path: &Path, values: impl Fn(&str) -> Option<Vec<f32>>) {
    let bytes = std::fs::read(path).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let tensors: Vec<(String, Vec<usize>, Vec<u8>)> = st
        .iter()
        .map(|(n, v)| {
            let data = match values(n) {
                Some(new) => new.iter().flat_map(|x| x.to_le_bytes()).collect(),
                None => v.data().to_vec(),
            };
            (n.to_string(), v.shape().to_vec(), data)
        })
        .collect();
    write_f32_tensors(path, &tensors);
}

fn write_f32_tensors(path: &Path, tensors: &[(String, Vec<usize>, Vec<u8>)]) {
    let views: Vec<_> = tensors
        .iter()
        .map(|(n, s, b)| {
            let v = safetensors::tensor::TensorView::new(safetensors::Dtype::F32, s.clone(), b);
            (n.clone(), v.unwrap())
        })
        .collect();
    safetensors::serialize_to_file(views, None, path).unwrap();
}

/// Cuts the f32 vector `name` of a safetensors file of f32 vectors (a lerobot normalizer's
/// stats) to its first `keep` values, in place.
pub fn truncate_f32_tensor(path: &Path, name: &str, keep: usize) {
    let bytes = std::fs::read(path).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut tensors: Vec<(String, Vec<usize>, Vec<u8>)> = st
        .iter()
        .map(|(n, v)| (n.to_string(), v.shape().to_vec(), v.data().to_vec()))
        .collect();
    let t = tensors.iter_mut().find(|t| t.0 == name).expect("tensor");
    t.1 = vec![keep];
    t.2.truncate(keep * 4);
    write_f32_tensors(path, &tensors);
}

/// The ONNX Runtime library of the venv `tools/test.sh` makes (or ORT_DYLIB_PATH): the
/// library's, which its unit tests use too.
#[allow(unused_imports)] // as the helpers above: not every test binary uses it
pub use pi0d::testing::ort_library;

/// The peers' Python (the venv `tools/test.sh` makes), or `PI0D_PEER_PYTHON`: the library's,
/// which its unit tests use too.
pub use pi0d::testing::peer_python;

/// What one run of pi0d beside an interop peer left behind.
pub struct Exchange {
    pub stderr: String,
    pub summary: serde_json::Value,
    pub report: serde_json::Value,
}

/// Runs pi0d on `cfg` for `pi0d_s` seconds beside the running `peer`, which writes its JSON
/// report to `dir/peer.json`; both must succeed.
pub fn run_beside_peer(
    dir: &Path,
    cfg: &toml::Table,
    peer: std::process::Child,
    pi0d_s: f64,
) -> Exchange {
    run_beside_peer_with(dir, cfg, peer, pi0d_s, &[])
}

/// As `run_beside_peer`, with `args` added to `pi0d run`.
pub fn run_beside_peer_with(
    dir: &Path,
    cfg: &toml::Table,
    peer: std::process::Child,
    pi0d_s: f64,
    args: &[&str],
) -> Exchange {
    let run = pi0d_beside_peer(dir, cfg, pi0d_s, args).output().unwrap();
    let stderr = String::from_utf8_lossy(&run.stderr).to_string();
    finish_beside_peer(dir, peer, run.status, stderr)
}

/// As `run_beside_peer_with`, with pi0d's stdout and stderr on a pseudo-terminal, as an operator
/// sees them: the exchange's `stderr` is what the terminal received, returned with its screen.
pub fn run_beside_peer_on_terminal(
    dir: &Path,
    cfg: &toml::Table,
    peer: std::process::Child,
    pi0d_s: f64,
    args: &[&str],
) -> (Exchange, pty::Screen) {
    let cmd = pi0d_beside_peer(dir, cfg, pi0d_s, args);
    let screen = pty::run(cmd, pi0d_s + 60.0);
    let x = finish_beside_peer(dir, peer, screen.status, screen.text());
    (x, screen)
}

fn pi0d_beside_peer(dir: &Path, cfg: &toml::Table, pi0d_s: f64, args: &[&str]) -> Command {
    let cfg_path = dir.join("config.toml");
    std::fs::write(&cfg_path, toml::to_string(cfg).unwrap()).unwrap();
    let mut run = Command::new(env!("CARGO_BIN_EXE_pi0d"));
    run.args([
        "run",
        "--quiet",
        "--duration",
        &pi0d_s.to_string(),
        "--config",
    ])
    .arg(&cfg_path)
    .arg("--summary")
    .arg(dir.join("summary.json"))
    .args(args);
    run
}

fn finish_beside_peer(
    dir: &Path,
    mut peer: std::process::Child,
    status: std::process::ExitStatus,
    stderr: String,
) -> Exchange {
    let peer_ok = end_peer(&mut peer).success();
    assert!(status.success(), "pi0d failed:\n{stderr}");
    assert!(peer_ok, "peer failed");
    let read = |p: &Path| serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap();
    Exchange {
        summary: read(&dir.join("summary.json")),
        report: read(&dir.join("peer.json")),
        stderr,
    }
}

/// Ends a peer once pi0d has exited: SIGTERM (the peers take what arrived, write their report
/// and exit 0; their `--duration` only bounds a run whose test died), then its exit status.
pub fn end_peer(peer: &mut std::process::Child) -> std::process::ExitStatus {
    if let Ok(None) = peer.try_wait() {
        // SAFETY: a signal to a child this test started and has not reaped.
        unsafe { libc::kill(peer.id() as libc::pid_t, libc::SIGTERM) };
    }
    peer.wait().expect("the peer can be waited for")
}

/// The observation latency pi0d reports in a diagnostic's values and the command latency the
/// peer measured are present and plausible on loopback.
pub fn assert_latencies(running: &serde_json::Value, report: &serde_json::Value) {
    for cam in ["camera 0 latency p50 (ms)", "camera 1 latency p99 (ms)"] {
        let ms: f64 = running["values"][cam]
            .as_str()
            .unwrap_or_else(|| panic!("{cam} missing: {running}"))
            .parse()
            .unwrap();
        assert!((0.0..300.0).contains(&ms), "{cam} {ms}");
    }
    let cmd = &report["command_latency_ms"];
    assert!(cmd["n"].as_u64().unwrap() >= 100, "{cmd}");
    assert!(
        (0.0..300.0).contains(&cmd["p50"].as_f64().unwrap()),
        "{cmd}"
    );
}

/// The peer pressed the e-stop, released it and called the reset service: pi0d latched, then
/// held after the reset and resumed running, the reset reply said so, no limit was crossed.
pub fn assert_estop_latched_then_reset(x: &Exchange) {
    let (s, r, stderr) = (&x.summary, &x.report, &x.stderr);
    let states: Vec<&str> = s["transitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["to"].as_str().unwrap())
        .collect();
    let i = states
        .iter()
        .position(|s| *s == "estopped")
        .unwrap_or_else(|| panic!("no e-stop: {states:?}\n{stderr}"));
    assert_eq!(
        &states[i + 1..i + 3],
        ["holding(after_reset)", "running"],
        "{states:?}"
    );
    assert_eq!(s["limit_violations"], 0);
    assert_eq!(r["reset_reply"]["success"], true, "{r}");
}

/// `cfg` with `policy.backend = backend` and its `[policy.<backend>]` table.
pub fn with_backend(cfg: &mut toml::Table, backend: &str, settings: &[(&str, toml::Value)]) {
    let policy = cfg["policy"].as_table_mut().unwrap();
    policy.insert("backend".into(), toml::Value::String(backend.into()));
    let table = settings
        .iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect();
    policy.insert(backend.into(), toml::Value::Table(table));
}

/// The peer's model of joint_trajectory_controller (tests/peers/jtc_model.py) refused none of
/// pi0d's trajectories with the default parameters of any distribution, whatever their timing;
/// and the motion the recommended set-ups (rolling's blending, jazzy's
/// `interpolate_from_desired_state`) make of pi0d's points on pi0d's own timeline (`jtc_ticks`:
/// each message installed at its tick, from the times and values pi0d wrote, so a host that
/// held the writes back changes nothing), every message and every 7th lost, stays within twice
/// `accel_limit` (rad/s², the configured one: the controller's splines overshoot where the
/// command's acceleration steps, as when the governor brakes for an e-stop) and a jerk a small
/// multiple of `jerk_limit` (third differences at the controller's 2 ms). What the same
/// controller made of the writes as they arrived (`jtc_written`) and the write timing are the
/// host's: printed as figures.
pub fn assert_controller_accepts(report: &serde_json::Value, accel_limit: f64, jerk_limit: f64) {
    let commands = report["commands"].as_u64().unwrap();
    eprintln!(
        "write intervals (ms): {}; first points off the ticks' timeline (ms): {}",
        report["write_interval_ms"], report["timeline_error_ms"]
    );
    assert!(
        report["jtc_ticks"].is_object() && report["jtc_ticks_lossy"].is_object(),
        "no controller model on pi0d's timeline: {report}"
    );
    for key in ["jtc", "jtc_lossy", "jtc_written", "jtc_written_lossy"] {
        let Some(setups) = report[key].as_object() else {
            continue; // a peer that only replays pi0d's write timeline
        };
        for (setup, d) in setups {
            assert_eq!(d["refused"], 0, "{key} {setup}: {d}");
            eprintln!("{key} {setup} (as the writes arrived): {}", d["motion"]);
        }
        assert!(
            report[key]["jazzy"]["accepted"].as_u64().unwrap() * 8 >= commands * 6,
            "{key}: {report}"
        );
    }
    for key in ["jtc_ticks", "jtc_ticks_lossy"] {
        for (setup, d) in report[key].as_object().unwrap() {
            assert_eq!(d["refused"], 0, "{key} {setup}: {d}");
            let m = &d["motion"];
            eprintln!("{key} {setup}: {m}");
            if setup == "rolling" || setup.contains('+') {
                let acc = m["max_acceleration"].as_f64().unwrap();
                let jerk = m["max_jerk"].as_f64().unwrap();
                assert!(acc < 2.0 * accel_limit, "{key} {setup}: {m}");
                assert!(jerk < 20.0 * jerk_limit, "{key} {setup}: {m}");
            }
        }
        assert!(
            report[key]["jazzy"]["accepted"].as_u64().unwrap() * 8 >= commands * 6,
            "{key}: {report}"
        );
    }
}

/// Writes `cfg` and runs `pi0d check` on it: the exit code and stdout + stderr.
pub fn check_config(name: &str, cfg: &toml::Table) -> (Option<i32>, String) {
    let dir = scratch_dir(name);
    let path = dir.join("config.toml");
    std::fs::write(&path, toml::to_string(cfg).unwrap()).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_pi0d"))
        .args(["check", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    (out.status.code(), text)
}

/// The peers' Python running `script` (relative to the repository) on DDS `domain`, with
/// Cyclone DDS kept on loopback.
pub fn cyclone_python(script: &str, domain: u16) -> Command {
    let cyclone = format!(
        "file://{}",
        root().join("tests/peers/cyclone_loopback.xml").display()
    );
    let mut cmd = Command::new(peer_python());
    cmd.arg(root().join(script))
        .args(["--domain", &domain.to_string()])
        .env("CYCLONEDDS_URI", cyclone);
    cmd
}

/// Starts the Cyclone DDS robot peer (tests/peers/robot_peer.py) on `domain`, reporting to
/// `report`, with `args` added.
pub fn cyclone_peer(domain: u16, report: &Path, args: &[&str]) -> std::process::Child {
    cyclone_python("tests/peers/robot_peer.py", domain)
        .arg("--report")
        .arg(report)
        .args(args)
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("peer starts")
}

/// A JSON array of strings.
pub fn strings(v: &serde_json::Value) -> Vec<&str> {
    v.as_array()
        .unwrap_or_else(|| panic!("not an array: {v}"))
        .iter()
        .map(|s| s.as_str().unwrap())
        .collect()
}

/// How far the peer's arm moved between the first and the last command it received (sum
/// over joints).
pub fn moved(report: &serde_json::Value) -> f64 {
    let (first, last) = (
        report["first"].as_array().unwrap(),
        report["last"].as_array().unwrap(),
    );
    first
        .iter()
        .zip(last)
        .map(|(a, b)| (a.as_f64().unwrap() - b.as_f64().unwrap()).abs())
        .sum()
}

/// Runs `pi0d run` on `cfg` (for at most 20 s) beside `peer`, for runs that end on their own
/// (a start-up error): its exit code and stderr.
pub fn run_until_it_stops(
    dir: &Path,
    cfg: &toml::Table,
    mut peer: std::process::Child,
) -> (Option<i32>, String) {
    let cfg_path = dir.join("config.toml");
    std::fs::write(&cfg_path, toml::to_string(cfg).unwrap()).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_pi0d"))
        .args(["run", "--quiet", "--duration", "20", "--config"])
        .arg(&cfg_path)
        .output()
        .unwrap();
    end_peer(&mut peer);
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

/// A TCP port on loopback nobody listens on (just now).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The loopback port `pi0d serve` says it listens on, read from its log (`local=127.0.0.1:P`),
/// and the log up to that line; the test fails if the log ends first.
pub fn listening_port(log: &mut impl std::io::BufRead) -> (u16, String) {
    let mut seen = String::new();
    loop {
        let mut line = String::new();
        if log.read_line(&mut line).unwrap() == 0 {
            panic!("pi0d serve ended before listening:\n{seen}");
        }
        seen.push_str(&line);
        if let Some(p) = line
            .split("local=127.0.0.1:")
            .nth(1)
            .and_then(|p| p.trim().parse::<u16>().ok())
        {
            return (p, seen);
        }
    }
}

/// `pi0d serve ARGS --listen 127.0.0.1:0`, the API key `key` in the environment variable
/// `key_env` (`--api-key-env`); the port the kernel gave it (from its log line) and a thread
/// collecting its log until it ends.
pub fn pi0d_serve(
    args: &[&std::ffi::OsStr],
    key: (&str, &str),
) -> (std::process::Child, u16, std::thread::JoinHandle<String>) {
    pi0d_serve_in(args, key, &[])
}

/// As `pi0d_serve`, with `env` added to the server's environment.
pub fn pi0d_serve_in(
    args: &[&std::ffi::OsStr],
    (key_env, key): (&str, &str),
    env: &[(&str, std::ffi::OsString)],
) -> (std::process::Child, u16, std::thread::JoinHandle<String>) {
    use std::io::{BufRead, BufReader};
    let mut server = Command::new(env!("CARGO_BIN_EXE_pi0d"))
        .arg("serve")
        .args(args)
        .args(["--listen", "127.0.0.1:0", "--api-key-env", key_env])
        .env(key_env, key)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut log = BufReader::new(server.stderr.take().unwrap());
    let (port, seen) = listening_port(&mut log);
    let rest = std::thread::spawn(move || {
        let mut all = seen;
        for line in log.lines().map_while(Result::ok) {
            all.push_str(&line);
            all.push('\n');
        }
        all
    });
    (server, port, rest)
}

/// `sim_config` with its policy on a server: `policy.kind = "pi0"`, no local model, and
/// `policy.backend = backend` with `[policy.<backend>]` = `settings`.
pub fn remote_policy_config(backend: &str, settings: &[(&str, toml::Value)]) -> toml::Table {
    let mut cfg = sim_config();
    let p = cfg["policy"].as_table_mut().unwrap();
    p.insert("kind".into(), toml::Value::String("pi0".into()));
    for k in [
        "amplitude",
        "frequency_hz",
        "latency_s",
        "checkpoint",
        "threads",
        "seed",
    ] {
        p.remove(k);
    }
    with_backend(&mut cfg, backend, settings);
    cfg
}

/// An MCAP recording read back by Python's `mcap` and `mcap-ros2-support`
/// (tests/peers/mcap_check.py): what it found, as JSON.
pub fn mcap_read_back(file: &Path) -> serde_json::Value {
    mcap_read_back_with(file, &[])
}

/// As `mcap_read_back`, with the script's options (`--values`: chunk positions, model output
/// and measured joint states too).
pub fn mcap_read_back_with(file: &Path, args: &[&str]) -> serde_json::Value {
    let out = Command::new(peer_python())
        .arg(root().join("tests/peers/mcap_check.py"))
        .arg(file)
        .args(args)
        .output()
        .expect("python runs");
    assert!(
        out.status.success(),
        "mcap_check.py failed on {}:\n{}",
        file.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("mcap_check.py prints JSON")
}

/// A NOTIFY_SOCKET as systemd opens one for a service: every datagram with its arrival (wall
/// seconds), read while the daemon runs (a datagram queue holds only a few messages).
pub struct NotifySocket {
    pub path: std::path::PathBuf,
    done: std::sync::Arc<std::sync::atomic::AtomicBool>,
    reader: std::thread::JoinHandle<Vec<(f64, String)>>,
}

impl NotifySocket {
    pub fn open(dir: &Path) -> NotifySocket {
        let path = dir.join("notify.sock");
        let socket = std::os::unix::net::UnixDatagram::bind(&path).unwrap();
        socket
            .set_read_timeout(Some(std::time::Duration::from_millis(50)))
            .unwrap();
        let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stop = done.clone();
        let reader = std::thread::spawn(move || {
            let mut messages = Vec::new();
            let mut buf = [0u8; 4096];
            // Until a read times out once the daemon has ended: what it sent last is kept.
            loop {
                match socket.recv(&mut buf) {
                    Ok(n) => {
                        messages.push((wall_now(), String::from_utf8_lossy(&buf[..n]).to_string()))
                    }
                    Err(_) if stop.load(std::sync::atomic::Ordering::Relaxed) => break,
                    Err(_) => {}
                }
            }
            messages
        });
        NotifySocket { path, done, reader }
    }

    /// Everything received, once the daemon has ended.
    pub fn messages(self) -> Vec<(f64, String)> {
        self.done.store(true, std::sync::atomic::Ordering::Relaxed);
        self.reader.join().unwrap()
    }
}

/// The first time `what` was notified.
pub fn notified(messages: &[(f64, String)], what: &str) -> Option<f64> {
    messages
        .iter()
        .find(|(_, m)| m.contains(what))
        .map(|(t, _)| *t)
}

/// Every time `what` was notified, in order.
pub fn notified_at(messages: &[(f64, String)], what: &str) -> Vec<f64> {
    messages
        .iter()
        .filter(|(_, m)| m.contains(what))
        .map(|(t, _)| *t)
        .collect()
}

/// Seconds since the Unix epoch (the robots' and notify readers' clock).
pub fn wall_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// A gripper_action_controller peer's report of pi0d's goals (`gripper_goals`: `at`,
/// `position`, `max_effort`, `accepted`; `duplicate_goal_ids`): at least `min_accepted`
/// accepted, no goal id twice, every goal with `max_effort` and a position within `range`, at
/// most 22 in any second (the controller starts a goal handle for each; pi0d's default is 20 a
/// second), and refused ones among them, which pi0d reported naming `action`. The accepted
/// goals' positions, in order.
pub fn assert_gripper_goals(
    r: &serde_json::Value,
    stderr: &str,
    action: &str,
    max_effort: f64,
    range: std::ops::RangeInclusive<f64>,
    min_accepted: usize,
) -> Vec<f64> {
    let goals = r["gripper_goals"].as_array().unwrap();
    let at = |g: &serde_json::Value| g["at"].as_f64().unwrap();
    let accepted: Vec<f64> = goals
        .iter()
        .filter(|g| g["accepted"] == true)
        .map(|g| g["position"].as_f64().unwrap())
        .collect();
    assert!(
        accepted.len() >= min_accepted,
        "{} goals accepted: {r}",
        accepted.len()
    );
    assert_eq!(r["duplicate_goal_ids"], 0, "{r}");
    for g in goals {
        assert_eq!(g["max_effort"], max_effort, "{g}");
        let p = g["position"].as_f64().unwrap();
        assert!(range.contains(&p), "goal position {p}");
    }
    for (i, g) in goals.iter().enumerate() {
        let in_window = goals[i..]
            .iter()
            .take_while(|h| at(h) < at(g) + 1.0)
            .count();
        assert!(
            in_window <= 22,
            "{in_window} goals within 1 s from {}",
            at(g)
        );
    }
    assert!(
        goals.iter().any(|g| g["accepted"] == false),
        "no goal came once the peer refused them: {r}"
    );
    assert!(
        stderr.contains(action) && stderr.contains("the action server refused"),
        "{stderr}"
    );
    accepted
}

/// A copy of the bundled model whose text embedding has 4 Mi rows (1 GiB of f32, zeros: the file
/// is sparse and takes no disk): a load that takes a while, and a table as large as a full-size
/// pi0's that the load must not hold in memory.
pub fn big_embedding(name: &str) -> TempDir {
    use std::io::Write;
    let dir = copied_checkpoint(&root().join("models/tiny-pi0"), name);
    let path = dir.join("model.safetensors");
    let bytes = std::fs::read(&path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let mut header: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let data = &bytes[8 + n..];
    let big = "model.paligemma_with_expert.paligemma.model.language_model.embed_tokens.weight";
    let width = header[big]["shape"][1].as_u64().unwrap();
    let mut kept = Vec::new();
    for (name, t) in header.iter_mut() {
        if name == "__metadata__" || name == big {
            continue;
        }
        let at = |i: usize| t["data_offsets"][i].as_u64().unwrap() as usize;
        let (from, to) = (at(0), at(1));
        t["data_offsets"] = serde_json::json!([kept.len(), kept.len() + to - from]);
        kept.extend_from_slice(&data[from..to]);
    }
    let size = (4u64 << 20) * width * 4;
    header[big]["shape"] = serde_json::json!([4u64 << 20, width]);
    header[big]["data_offsets"] = serde_json::json!([kept.len() as u64, kept.len() as u64 + size]);
    let mut head = serde_json::to_vec(&header).unwrap();
    head.resize(head.len().div_ceil(8) * 8, b' ');
    let mut file = std::fs::File::create(&path).unwrap();
    file.write_all(&(head.len() as u64).to_le_bytes()).unwrap();
    file.write_all(&head).unwrap();
    file.write_all(&kept).unwrap();
    file.set_len(8 + head.len() as u64 + kept.len() as u64 + size)
        .unwrap();
    dir
}

/// The largest absolute difference between two equally long slices; a NaN anywhere counts as
/// infinitely far.
pub fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(
            0.0f32,
            |m, d| if d.is_nan() { f32::INFINITY } else { m.max(d) },
        )
}

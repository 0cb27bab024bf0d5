//! Real-time chunking benchmark (`cargo bench --features onnx --bench rtc [-- --runs N]
//! [--seconds S]`).
//!
//! 1. The cost of RTC per chunk next to plain denoising, on the same inputs (lerobot's RTC
//!    golden case on the tiny pi0, 10 steps): the CPU model, looped ONNX graphs (the host
//!    guides each step) and an unrolled graph exported with `--rtc` (ONNX Runtime's CPU
//!    provider; needs the `onnx` feature and `ORT_DYLIB_PATH` or the test venv's wheel).
//!    Medians of interleaved runs.
//! 2. Chunk-switch agreement on the simulated arm driven by the bundled model, RTC off and on,
//!    same configuration: per switch, the largest distance between the new chunk and the old
//!    plan over the steps that run before it takes over, and the largest correction the
//!    blend had to make, printed side by side.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use pi0d::config::{RtcSettings, Schedule};
use pi0d::policy::pi0::infer::{run_batch, Batch, BatchDims};
use pi0d::policy::pi0::{Checkpoint, Pi0Model};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).to_path_buf()
}

const CASE: &str = "tests/fixtures/cases/pi0_f32_rtc_linear";

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Median ms of `plain` and `guided`, run alternately `runs` times each after a warm-up.
fn compare(runs: usize, mut plain: impl FnMut(), mut guided: impl FnMut()) -> (f64, f64) {
    plain();
    guided();
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for _ in 0..runs {
        let t = Instant::now();
        plain();
        a.push(t.elapsed().as_secs_f64() * 1e3);
        let t = Instant::now();
        guided();
        b.push(t.elapsed().as_secs_f64() * 1e3);
    }
    (median(a), median(b))
}

fn print_cost(name: &str, (plain, guided): (f64, f64)) {
    println!(
        "  {name:30} {plain:9.2} ms {guided:9.2} ms   {:+.1} %",
        (guided / plain - 1.0) * 100.0
    );
}

fn inputs(dims: &BatchDims) -> (Batch, Batch) {
    let file = root().join(CASE).join("inputs.safetensors");
    let guided = Batch::read_for(&file, dims).expect("the golden case reads");
    let mut plain = Batch::read_for(&file, dims).expect("the golden case reads");
    plain.clear_rtc();
    (plain, guided)
}

fn cpu_cost(runs: usize) {
    let ck = Checkpoint::load(&root().join("tests/fixtures/pi0_float32")).expect("fixture");
    let model = Pi0Model::load(&ck, None, 1).expect("model");
    let (plain, mut guided) = inputs(&BatchDims::from(&model.arch));
    guided
        .set_rtc(RtcSettings {
            schedule: Schedule::Linear,
            max_guidance_weight: 10.0,
        })
        .expect("settings");
    print_cost(
        "CPU model (1 thread)",
        compare(
            runs,
            || drop(run_batch(&model, &plain)),
            || drop(run_batch(&model, &guided)),
        ),
    );
}

#[cfg(feature = "onnx")]
fn onnx_cost(runs: usize) {
    use pi0d::config::OnnxOptions;
    use pi0d::policy::export::{export, ExportOptions};
    use pi0d::policy::graph::manifest::Manifest;
    let Some(lib) = ort_library() else {
        println!("  (ONNX Runtime not found: set ORT_DYLIB_PATH)");
        return;
    };
    for (name, unroll) in [
        ("ONNX looped (host guidance)", false),
        ("ONNX unrolled --rtc", true),
    ] {
        let dir = std::env::temp_dir().join(format!("pi0d-bench-rtc-{unroll}"));
        let mut o = ExportOptions::new(root().join("tests/fixtures/pi0_float32"), dir.clone(), 1);
        o.unroll = unroll;
        o.rtc = unroll;
        export(&o).expect("export");
        let m = Manifest::load(&dir).expect("manifest");
        let dims = BatchDims {
            image_size: m.image_size,
            state_dim: m.state_dim,
            chunk: m.chunk,
            action_dim: m.action_dim,
        };
        let opts = OnnxOptions {
            library: Some(lib.clone()),
            threads: 1,
            ..Default::default()
        };
        let mut model = pi0d::policy::graph::load_onnx(&dir, m, &opts).expect("ONNX Runtime");
        let (plain, guided) = inputs(&dims);
        let model = std::cell::RefCell::new(&mut model);
        print_cost(
            name,
            compare(
                runs,
                || {
                    drop(
                        model
                            .borrow_mut()
                            .sample(&plain.graph_inputs())
                            .expect("runs"),
                    )
                },
                || {
                    drop(
                        model
                            .borrow_mut()
                            .sample(&guided.graph_inputs())
                            .expect("runs"),
                    )
                },
            ),
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}

#[cfg(feature = "onnx")]
fn ort_library() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("ORT_DYLIB_PATH") {
        return Some(p.into());
    }
    let lib = root().join(".venv/lib");
    std::fs::read_dir(lib).ok()?.flatten().find_map(|py| {
        let capi = py.path().join("site-packages/onnxruntime/capi");
        std::fs::read_dir(capi).ok()?.flatten().find_map(|f| {
            let name = f.file_name().to_string_lossy().into_owned();
            name.starts_with("libonnxruntime.so.").then(|| f.path())
        })
    })
}

/// `pi0d run` on the embedded sim config with `[control.rtc] enabled = rtc`; its summary.
fn daemon_run(rtc: bool, seconds: f64) -> serde_json::Value {
    let dir = std::env::temp_dir().join(format!("pi0d-bench-rtc-run-{rtc}"));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    let text = std::fs::read_to_string(root().join("config/sim.toml")).expect("config/sim.toml");
    let mut cfg: toml::Table = text.parse().expect("TOML");
    let abs = |p: &str| toml::Value::String(root().join(p).display().to_string());
    cfg["robot"]["urdf"] = abs("urdf/sim_arm.urdf");
    cfg["policy"]["checkpoint"] = abs("models/tiny-pi0");
    let mut t = toml::Table::new();
    t.insert("enabled".into(), toml::Value::Boolean(rtc));
    if rtc {
        t.insert("execution_horizon".into(), toml::Value::Integer(20));
    }
    cfg["control"]
        .as_table_mut()
        .expect("[control]")
        .insert("rtc".into(), toml::Value::Table(t));
    let file = dir.join("config.toml");
    std::fs::write(&file, toml::to_string(&cfg).expect("TOML")).expect("write");
    let summary = dir.join("summary.json");
    let status = Command::new(env!("CARGO_BIN_EXE_pi0d"))
        .args(["run", "--quiet", "--config"])
        .arg(&file)
        .args(["--duration", &seconds.to_string(), "--summary"])
        .arg(&summary)
        .status()
        .expect("pi0d runs");
    assert!(status.success(), "pi0d run failed");
    serde_json::from_str(&std::fs::read_to_string(&summary).expect("summary")).expect("JSON")
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let arg = |name: &str, default: f64| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let runs = arg("--runs", 100.0) as usize;
    let seconds = arg("--seconds", 10.0);
    println!(
        "RTC cost per chunk (tiny pi0, 10 steps, lerobot's RTC case; medians of {runs} runs):"
    );
    println!("  {:30} {:>12} {:>12}   RTC / plain", "", "plain", "RTC");
    cpu_cost(runs);
    #[cfg(feature = "onnx")]
    onnx_cost(runs);
    #[cfg(not(feature = "onnx"))]
    println!("  (ONNX: build with --features onnx)");

    println!(
        "\nChunk switches on the simulated arm, bundled model, {seconds} s each, horizon 20 steps:"
    );
    let (off, on) = (daemon_run(false, seconds), daemon_run(true, seconds));
    let sw = |s: &serde_json::Value, a: &str, b: &str| {
        s["chunk_switches"][a][b].as_f64().unwrap_or(f64::NAN)
    };
    println!("  {:44} {:>12} {:>12}", "", "RTC off", "RTC on");
    for (label, key) in [
        (
            "new chunk vs old plan over the delay, p50 (rad)",
            "prefix_distance",
        ),
        (
            "blend correction at the switch, p50 (rad)",
            "blend_correction",
        ),
    ] {
        println!(
            "  {label:44} {:12.5} {:12.5}",
            sw(&off, key, "p50"),
            sw(&on, key, "p50")
        );
        let max_label = label.replace("p50", "max");
        println!(
            "  {max_label:44} {:12.5} {:12.5}",
            sw(&off, key, "max"),
            sw(&on, key, "max")
        );
    }
    let n = |s: &serde_json::Value, k: &str| s["chunk_switches"][k].as_u64().unwrap_or(0);
    println!(
        "  {:44} {:>12} {:>12}",
        "switches / guided / largest delay (steps)",
        format!(
            "{} / {} / {}",
            n(&off, "switches"),
            n(&off, "guided"),
            n(&off, "delay_steps_max")
        ),
        format!(
            "{} / {} / {}",
            n(&on, "switches"),
            n(&on, "guided"),
            n(&on, "delay_steps_max")
        )
    );
    for (s, label) in [(&off, "off"), (&on, "on")] {
        assert_eq!(
            s["limit_violations"], 0,
            "limit violations with RTC {label}"
        );
    }
}

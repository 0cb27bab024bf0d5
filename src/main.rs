use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use pi0d::config::Config;
use pi0d::daemon::{self, exit, RunOptions};

/// pi0d drives a robot arm with the pi0 policy behind a safety governor.
///
/// pi0d is not a safety function: the hardware emergency stop stays in charge.
#[derive(Parser)]
#[command(
    version,
    about,
    after_help = "ROS 2 launch arguments are accepted after --ros-args: -r __node:=NAME, -r __ns:=/NS, \
-r FROM:=TO (topics), -p NAME:=VALUE and --params-file FILE, where parameter names are dotted \
configuration paths (control.rate_hz) and `config` names the configuration file."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the daemon.
    Run {
        /// Configuration file (or the ROS parameter `config` after --ros-args).
        #[arg(long)]
        config: Option<PathBuf>,
        /// Stop cleanly after this many seconds (decelerate to rest, then exit 0).
        #[arg(long)]
        duration: Option<f64>,
        /// Write a JSON summary here on exit.
        #[arg(long)]
        summary: Option<PathBuf>,
        /// No live status line.
        #[arg(long)]
        quiet: bool,
    },
    /// Validate the configuration and URDF, and print what would run.
    Check {
        #[arg(long)]
        config: Option<PathBuf>,
    },
    /// Run the policy model alone on an inputs file (safetensors) and write `actions`.
    Infer {
        /// Checkpoint directory (config.json + model.safetensors) or a bare .safetensors file
        /// (the `cpu` backend).
        #[arg(long, required_if_eq("backend", "cpu"))]
        checkpoint: Option<PathBuf>,
        /// JSON with head counts shapes cannot tell: {"vision_heads", "heads", "kv_heads", "head_dim"}.
        #[arg(long)]
        arch: Option<PathBuf>,
        #[arg(long)]
        inputs: PathBuf,
        #[arg(long)]
        output: PathBuf,
        /// Run the inference N times after loading; print one JSON timing line per run.
        #[arg(long, default_value_t = 1)]
        repeat: usize,
        /// Matmul threads (default: all cores).
        #[arg(long)]
        threads: Option<usize>,
        /// cpu (native Rust), onnx (exported graphs on ONNX Runtime) or acl (the graphs
        /// compiled by ATC, on an Ascend NPU).
        #[arg(long, default_value = "cpu", value_parser = ["cpu", "onnx", "acl"])]
        backend: String,
        /// Directory written by `pi0d export` (the `onnx` and `acl` backends).
        #[arg(long, required_if_eq_any([("backend", "onnx"), ("backend", "acl")]))]
        model_dir: Option<PathBuf>,
        /// ONNX Runtime execution provider: cpu, cuda, tensorrt or cann.
        #[arg(long, default_value = "cpu")]
        provider: String,
        /// Device for the cuda, tensorrt and cann providers and the acl backend.
        #[arg(long, default_value_t = 0)]
        device_id: i32,
        /// The ONNX Runtime library (default: ORT_DYLIB_PATH, else libonnxruntime.so).
        #[arg(long)]
        onnx_library: Option<PathBuf>,
        /// AscendCL's libascendcl.so (default: $ASCEND_HOME_PATH/lib64, CANN's install paths).
        #[arg(long)]
        acl_library: Option<PathBuf>,
    },
    /// Export the model as static ONNX graphs (prefix -> KV cache, denoise step) plus
    /// manifest.json, for ONNX Runtime, TensorRT or Ascend's ATC.
    Export {
        /// Checkpoint directory (config.json + model.safetensors) or a bare .safetensors file.
        #[arg(long)]
        checkpoint: PathBuf,
        /// JSON with head counts shapes cannot tell: {"vision_heads", "heads", "kv_heads", "head_dim"}.
        #[arg(long)]
        arch: Option<PathBuf>,
        /// Number of cameras the graphs take (shapes are static).
        #[arg(long)]
        cameras: usize,
        /// Output directory.
        #[arg(long)]
        out: PathBuf,
        /// Weight storage and compute type: f32, f16 (norms and softmax stay f32) or bf16
        /// (bf16 weights, f32 compute).
        #[arg(long, default_value = "f32")]
        dtype: String,
        /// Unroll all denoising steps into one graph (noise -> actions).
        #[arg(long)]
        unroll: bool,
        /// Batch size the graphs take.
        #[arg(long, default_value_t = 1)]
        batch: usize,
        /// Prompt tokens (default: the checkpoint's tokenizer length).
        #[arg(long)]
        prompt_len: Option<usize>,
        /// Always write weights as ONNX external data (automatic above 1.9 GB per graph).
        #[arg(long)]
        external_data: bool,
        /// Saturate f16 weights beyond +-65504 (reported) instead of refusing the export.
        #[arg(long)]
        clamp_f16: bool,
        /// Print the ATC commands compiling the graphs for this SoC (e.g. Ascend310P1), and run
        /// them when `atc` is on the PATH.
        #[arg(long, value_name = "SOC")]
        atc: Option<String>,
    },
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    // `launch_ros` appends `--ros-args ...`: split them off before clap sees the line.
    let (args, ros_args) = pi0d::config::ros_args::split(std::env::args().collect());
    let cli = Cli::parse_from(args);
    let ros = match pi0d::config::ros_args::parse(&ros_args) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(exit::CONFIG as u8);
        }
    };
    let code = match cli.command {
        Command::Check { config } => match load_config(config, &ros) {
            Ok(cfg) => {
                print_check(&cfg);
                // The policy too: a pi0 checkpoint is loaded and checked tensor by tensor.
                match pi0d::policy::from_config(&cfg) {
                    Ok(p) => {
                        println!("policy: {} loaded", p.name());
                        exit::OK
                    }
                    Err(e) => {
                        eprintln!("error: {e}");
                        exit::CONFIG
                    }
                }
            }
            Err(e) => {
                eprintln!("error: {e}");
                exit::CONFIG
            }
        },
        Command::Infer {
            checkpoint,
            arch,
            inputs,
            output,
            repeat,
            threads,
            backend,
            model_dir,
            provider,
            device_id,
            onnx_library,
            acl_library,
        } => {
            let runtime = match backend.as_str() {
                "acl" => GraphBackend::Acl(pi0d::policy::graph::acl::AclOptions {
                    library: acl_library,
                    device_id,
                }),
                _ => GraphBackend::Onnx {
                    provider,
                    device_id,
                    library: onnx_library,
                    threads,
                },
            };
            let result = match (backend.as_str(), checkpoint, model_dir) {
                ("onnx" | "acl", _, Some(dir)) => {
                    infer_graphs(&dir, &inputs, &output, repeat, &runtime)
                }
                (_, Some(ck), _) => infer(&ck, arch.as_deref(), &inputs, &output, repeat, threads),
                _ => Err(anyhow::anyhow!(
                    "--checkpoint (cpu) or --model-dir (onnx) is required"
                )),
            };
            match result {
                Ok(()) => exit::OK,
                Err(e) => {
                    eprintln!("error: {e:#}");
                    exit::CONFIG
                }
            }
        }
        Command::Export {
            checkpoint,
            arch,
            cameras,
            out,
            dtype,
            unroll,
            batch,
            prompt_len,
            external_data,
            clamp_f16,
            atc,
        } => {
            let opts = pi0d::policy::export::ExportOptions {
                checkpoint,
                arch,
                out,
                cameras,
                batch,
                prompt_len,
                dtype: match pi0d::policy::export::pi0::ExportDtype::parse(&dtype) {
                    Some(d) => d,
                    None => {
                        eprintln!("error: --dtype {dtype:?}: expected f32, f16 or bf16");
                        return ExitCode::from(exit::CONFIG as u8);
                    }
                },
                unroll,
                external: if external_data {
                    pi0d::policy::export::ExternalData::Always
                } else {
                    pi0d::policy::export::ExternalData::Auto
                },
                clamp_f16,
                progress: std::io::IsTerminal::is_terminal(&std::io::stderr()),
            };
            match export(&opts, atc.as_deref()) {
                Ok(()) => exit::OK,
                Err(e) => {
                    eprintln!("error: {e:#}");
                    exit::CONFIG
                }
            }
        }
        Command::Run {
            config,
            duration,
            summary,
            quiet,
        } => match run(config, &ros, duration, summary, quiet) {
            Ok(code) => code,
            Err((code, e)) => {
                eprintln!("error: {e:#}");
                code
            }
        },
    };
    ExitCode::from(code as u8)
}

/// The configuration file (from `--config`, or the `config` ROS parameter) with the ROS
/// parameters and remaps applied.
fn load_config(
    config: Option<PathBuf>,
    ros: &pi0d::config::ros_args::RosArgs,
) -> Result<Config, pi0d::config::ConfigError> {
    let path = config
        .or_else(|| pi0d::config::ros_args::config_path(ros))
        .ok_or_else(|| pi0d::config::ConfigError::Parse {
            file: PathBuf::from("command line"),
            message: "give --config FILE, or the ROS parameter `config`".into(),
        })?;
    Config::load_with(&path, ros)
}

fn run(
    config: Option<PathBuf>,
    ros: &pi0d::config::ros_args::RosArgs,
    duration: Option<f64>,
    summary: Option<PathBuf>,
    quiet: bool,
) -> Result<i32, (i32, anyhow::Error)> {
    if let Some(d) = duration {
        if !(d > 0.0 && d.is_finite()) {
            return Err((
                exit::CONFIG,
                anyhow::anyhow!("--duration: expected seconds > 0, found {d}"),
            ));
        }
    }
    let cfg = load_config(config, ros).map_err(|e| (exit::CONFIG, e.into()))?;
    let config = cfg.file.clone();
    let opts = RunOptions {
        duration_s: duration,
        summary,
        status: !quiet,
    };
    let s = daemon::run(cfg, opts).map_err(|e| {
        let code = e.exit_code();
        (
            code,
            anyhow::Error::new(e).context(format!("running {}", config.display())),
        )
    })?;
    eprintln!(
        "pi0d: {} ticks at {} Hz, {} overruns, jitter p99 {:.0} us; chunks {} executed / {} rejected; latency p50 {:.1} ms; limit violations {}; {}",
        s.ticks,
        s.rate_hz,
        s.overruns,
        s.jitter_us.p99,
        s.chunks_accepted,
        s.chunks_rejected,
        s.latency_ms.p50,
        s.limit_violations,
        s.exit
    );
    Ok(if s.exit == "clean" {
        exit::OK
    } else {
        exit::FAULT
    })
}

fn infer(
    checkpoint: &std::path::Path,
    arch: Option<&std::path::Path>,
    inputs: &std::path::Path,
    output: &std::path::Path,
    repeat: usize,
    threads: Option<usize>,
) -> anyhow::Result<()> {
    use pi0d::policy::pi0::{infer, ArchOverrides, Checkpoint, Pi0Model};
    let overrides = arch.map(ArchOverrides::load).transpose()?;
    let ck = Checkpoint::load(checkpoint)?;
    let threads =
        threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let model = Pi0Model::load(&ck, overrides, threads)?;
    drop(ck);
    let batch = infer::Batch::read(inputs, &model)?;
    let mut last = None;
    for _ in 0..repeat.max(1) {
        let (actions, timing) = infer::run_batch(&model, &batch);
        if repeat > 1 {
            println!("{}", serde_json::to_string(&timing)?);
        }
        last = Some(actions);
    }
    let actions = last.expect("ran at least once");
    infer::write_actions(output, &batch, &actions)?;
    Ok(())
}

/// The runtime `pi0d infer` runs exported graphs on.
enum GraphBackend {
    Onnx {
        provider: String,
        device_id: i32,
        library: Option<PathBuf>,
        threads: Option<usize>,
    },
    Acl(pi0d::policy::graph::acl::AclOptions),
}

fn infer_graphs(
    dir: &std::path::Path,
    inputs: &std::path::Path,
    output: &std::path::Path,
    repeat: usize,
    backend: &GraphBackend,
) -> anyhow::Result<()> {
    use pi0d::policy::graph::manifest::Manifest;
    use pi0d::policy::graph::provider::{ExecutionProvider, OnnxOptions};
    use pi0d::policy::pi0::infer::{self, BatchDims};
    let m = Manifest::load(dir)?;
    let batch = infer::Batch::read_for(
        inputs,
        &BatchDims {
            image_size: m.image_size,
            state_dim: m.state_dim,
            chunk: m.chunk,
            action_dim: m.action_dim,
        },
    )?;
    let mut model = match backend {
        GraphBackend::Onnx {
            provider,
            device_id,
            library,
            threads,
        } => {
            let provider = ExecutionProvider::parse(provider, *device_id).ok_or_else(|| {
                anyhow::anyhow!("--provider {provider:?}: expected cpu, cuda, tensorrt or cann")
            })?;
            let opts = OnnxOptions {
                library: library.clone(),
                provider,
                threads: threads.unwrap_or(0),
            };
            pi0d::policy::graph::load_onnx(dir, m, &opts)?
        }
        GraphBackend::Acl(opts) => pi0d::policy::graph::load_acl(dir, m, opts)?,
    };
    let mut last = None;
    for _ in 0..repeat.max(1) {
        let (actions, t) = model.sample(&batch.graph_inputs())?;
        if repeat > 1 {
            let timing = infer::RunTiming {
                prefix_ms: t.prefix_ms,
                steps_ms: t.steps_ms,
                total_ms: t.prefix_ms + t.steps_ms,
            };
            println!("{}", serde_json::to_string(&timing)?);
        }
        last = Some(actions);
    }
    let actions = last.expect("ran at least once");
    infer::write_actions(output, &batch, &actions)?;
    Ok(())
}

fn export(opts: &pi0d::policy::export::ExportOptions, soc: Option<&str>) -> anyhow::Result<()> {
    use pi0d::policy::export::{atc, export};
    let report = export(opts)?;
    let m = &report.manifest;
    for c in &report.clamped {
        eprintln!(
            "warning: {}: {} weights beyond float16's range (largest {}) saturated to +-65504",
            c.tensor, c.count, c.max_abs
        );
    }
    println!(
        "exported {} ({:?}, {} camera(s), batch {}, {} prompt tokens) to {}",
        m.variant,
        m.dtype,
        m.cameras,
        m.batch,
        m.prompt_len,
        opts.out.display()
    );
    for g in [&m.graphs.prefix, &m.graphs.denoise] {
        println!(
            "  {}: {} nodes, {:.1} MB of weights{}",
            g.file,
            g.nodes,
            g.weight_bytes as f64 / 1e6,
            g.external_data
                .as_ref()
                .map(|d| format!(" in {d}"))
                .unwrap_or_default()
        );
    }
    if let Some(soc) = soc {
        if !atc::KNOWN_SOCS.contains(&soc) {
            eprintln!(
                "warning: {soc} is not one of {:?}; passing it to ATC as given",
                atc::KNOWN_SOCS
            );
        }
        let have_atc = std::env::var_os("PATH")
            .map(|p| std::env::split_paths(&p).any(|d| d.join("atc").is_file()))
            .unwrap_or(false);
        for cmd in atc::atc_commands(m, &opts.out, soc) {
            println!("{}", cmd.join(" "));
            if have_atc {
                let status = std::process::Command::new(&cmd[0])
                    .args(&cmd[1..])
                    .status()?;
                anyhow::ensure!(status.success(), "atc failed ({status}) for {}", cmd[1]);
            }
        }
        if !have_atc {
            println!(
                "(atc is not on the PATH: run the commands above on a machine with CANN's toolkit)"
            );
        }
    }
    Ok(())
}

fn print_check(cfg: &Config) {
    println!("config: {}", cfg.file.display());
    println!("urdf:   {}", cfg.urdf.display());
    println!(
        "control: {} Hz, {:?} interpolation, {:?} merge, blend {} s, request at {} s left",
        cfg.control.rate_hz,
        cfg.control.interpolation,
        cfg.control.merge,
        cfg.control.blend_window_s,
        cfg.control.request_threshold_s
    );
    println!(
        "watchdogs: joint state {} s, camera {} s, overrun streak {}",
        cfg.safety.joint_state_timeout_s, cfg.safety.camera_timeout_s, cfg.safety.overrun_streak
    );
    println!(
        "{:<20} {:<10} {:>9} {:>9} {:>8} {:>8} {:>8} {:>8}",
        "joint", "kind", "lower", "upper", "vel", "acc", "jerk", "max_step"
    );
    for j in &cfg.limits.joints {
        println!(
            "{:<20} {:<10} {:>9.4} {:>9.4} {:>8.3} {:>8.2} {:>8.1} {:>8.3}",
            j.name,
            format!("{:?}", j.kind).to_lowercase(),
            j.lower,
            j.upper,
            j.velocity,
            j.acceleration,
            j.jerk,
            j.max_step
        );
    }
    println!(
        "policy: {:?}, {} steps x {} s, actions -> joints: {}",
        cfg.policy.source,
        cfg.policy.chunk_steps,
        cfg.policy.step_period_s,
        cfg.policy.action_map.action_names.join(", ")
    );
    if let Some(w) = &cfg.workspace {
        println!(
            "workspace: {} in {} within {:?} .. {:?}",
            w.chain.tool_link, w.chain.base_link, w.min, w.max
        );
    }
    println!("sim cameras: {}", cfg.sim.cameras.len());
}

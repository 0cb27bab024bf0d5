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
        /// Checkpoint directory (config.json + model.safetensors) or a bare .safetensors file.
        #[arg(long)]
        checkpoint: PathBuf,
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
        } => match infer(
            &checkpoint,
            arch.as_deref(),
            &inputs,
            &output,
            repeat,
            threads,
        ) {
            Ok(()) => exit::OK,
            Err(e) => {
                eprintln!("error: {e:#}");
                exit::CONFIG
            }
        },
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
    infer::write_actions(output, &model, &batch, &actions)?;
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

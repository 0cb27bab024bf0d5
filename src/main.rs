// Outside tests, a value from outside is never unwrapped: a bad one is a clear error, not a panic.
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

use pi0d::config::ros_args::{self, RosArgs};
use pi0d::config::{Config, ConfigError};
use pi0d::daemon::exit::{error_chain, ExitReason};
use pi0d::daemon::log::tell;
use pi0d::daemon::reload::LoadError;
use pi0d::daemon::signals::{self, Signals};
use pi0d::daemon::{self, RunOptions};

mod commands;
use commands::export::ExportArgs;
use commands::infer::InferArgs;
use commands::serve::ServeArgs;

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
    Run(RunArgs),
    /// Validate the configuration, URDF and policy exactly as `run` does, and print what would run.
    Check(commands::check::CheckArgs),
    /// Run the policy model alone on an inputs file (safetensors) and write `actions`.
    ///
    /// The inputs file holds, for a batch of B: `image0..N` f32 [B, 3, 224, 224] in [-1, 1],
    /// `img_mask0..N` u8 [B], `lang_tokens` i64 [B, L], `lang_masks` u8 [B, L], `state` f32
    /// [B, 32] (normalized, padded), `noise` f32 [B, 50, 32]; optionally real-time chunking's
    /// `rtc_prev_chunk` f32 [B, T, A] (normalized), `rtc_inference_delay` i64 [] or [B],
    /// `rtc_execution_horizon` i64 []. The output holds `actions` f32 [B, 50, 32] in the
    /// model's normalized action space.
    Infer(InferArgs),
    /// Export the model as static ONNX graphs (prefix -> KV cache, denoise step) plus
    /// manifest.json, for ONNX Runtime, TensorRT or Ascend's ATC.
    Export(ExportArgs),
    /// Write a checkpoint with its linear layers' weights in int8 (w8, w8a8), int4 (w4) or bf16,
    /// for boards with little memory; it loads like any other checkpoint (w8a8 also multiplies
    /// in int8, the others widen the weights to f32).
    Quantize(commands::quantize::QuantizeArgs),
    /// Serve the policy over openpi's websocket protocol (any openpi client drives a robot
    /// from it): metadata on connect, msgpack-numpy observations, `actions` replies, GET /healthz.
    Serve(Box<ServeArgs>),
    /// Draw a recording (`[record]`, MCAP) as a PNG: per joint, commanded and measured
    /// position and velocity, limits, chunk arrivals, holds shaded.
    Plot(commands::plot::PlotArgs),
}

#[derive(Args)]
struct RunArgs {
    /// Configuration file (or the ROS parameter `config` after --ros-args).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Stop cleanly after this many seconds (decelerate to rest, then exit 0).
    #[arg(long, value_parser = positive_seconds)]
    duration: Option<f64>,
    /// Write a JSON summary here on exit (checked for writability at start).
    #[arg(long)]
    summary: Option<PathBuf>,
    /// No live status line.
    #[arg(long)]
    quiet: bool,
    /// Run everything but send the commands on shadow topics (ros.dry_run_prefix + each
    /// output's topic), never to the robot; the simulated arm does not move.
    #[arg(long)]
    dry_run: bool,
    /// Keep the fault latch here: after a fault (or a kill) the next run starts e-stopped
    /// until a reset [default: $STATE_DIRECTORY, set by systemd's StateDirectory=; none
    /// without it].
    #[arg(long)]
    state_dir: Option<PathBuf>,
}

fn positive_seconds(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(d) if d > 0.0 && d.is_finite() => Ok(d),
        _ => Err(format!("expected seconds > 0, found {s:?}")),
    }
}

/// A failure at the binary edge: why (the exit code) and what to tell the user.
struct Failure {
    reason: ExitReason,
    error: anyhow::Error,
}

impl Failure {
    fn new(reason: ExitReason, error: impl Into<anyhow::Error>) -> Failure {
        Failure {
            reason,
            error: error.into(),
        }
    }
}

impl From<ConfigError> for Failure {
    fn from(e: ConfigError) -> Failure {
        let reason = match e {
            ConfigError::Usage(_) => ExitReason::Usage,
            _ => ExitReason::InvalidInput,
        };
        Failure::new(reason, e)
    }
}

type Outcome = Result<ExitReason, Failure>;

fn main() -> ExitCode {
    // First of all: until `run` installs its handlers, a SIGHUP (or SIGTERM, SIGUSR1, ...)
    // stays pending instead of killing the process with its default action.
    signals::block();
    pi0d::daemon::log::init();
    pi0d::daemon::supervise::install_panic_hook();
    // `launch_ros` appends `--ros-args ...`: split them off before clap sees the line.
    let (args, ros_args) = ros_args::split(std::env::args().collect());
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(e) => {
            signals::unblock();
            // Help and version go to stdout with 0; errors to stderr with 2. `print` does not
            // panic on a closed stream.
            let _ = e.print();
            return if e.use_stderr() {
                ExitReason::Usage.into()
            } else {
                ExitReason::Clean.into()
            };
        }
    };
    // `run` handles the signals from here on (pending ones included); the other commands keep
    // their default actions.
    let run_signals = match cli.command {
        Command::Run(_) => Some(Signals::install()),
        _ => {
            signals::unblock();
            None
        }
    };
    let outcome = ros_args::parse(&ros_args)
        .map_err(Failure::from)
        .and_then(|ros| match cli.command {
            Command::Run(a) => run(a, &ros, run_signals),
            Command::Check(a) => commands::check::check(a, &ros),
            Command::Infer(a) => commands::infer::infer(a),
            Command::Export(a) => commands::export::export(a),
            Command::Quantize(a) => commands::quantize::quantize(a),
            Command::Serve(a) => commands::serve::serve(*a, &ros),
            Command::Plot(a) => commands::plot::plot(a),
        });
    match outcome {
        Ok(reason) => reason.into(),
        Err(f) => {
            tell(&format!("error: {}", error_chain(f.error.as_ref())));
            f.reason.into()
        }
    }
}

/// The configuration file (from `--config`, or the `config` ROS parameter) with the ROS
/// parameters and remaps applied.
fn load_config(config: Option<PathBuf>, ros: &RosArgs) -> Result<Config, Failure> {
    let (path, option) = ros_args::config_file(config, ros)?.ok_or_else(|| {
        Failure::new(
            ExitReason::Usage,
            anyhow::anyhow!("give --config FILE, or the ROS parameter `config` after --ros-args"),
        )
    })?;
    Config::load_named(&path, option, ros).map_err(|e| {
        // A URDF's error names the configuration file and `robot.urdf` too.
        let e = LoadError::of_config(&path, e);
        let reason = if e.is_usage() {
            ExitReason::Usage
        } else {
            ExitReason::InvalidInput
        };
        Failure::new(reason, e)
    })
}

/// Starts the compute threads (before any model is loaded: loading packs weights on them).
fn compute_threads(threads: usize) -> Result<(), Failure> {
    pi0d_kernels::init_threads_with(threads, |_| {
        pi0d::daemon::rt::lower_current_thread(pi0d::daemon::rt::INFERENCE_NICE)
    })
    .map_err(|e| {
        Failure::new(
            ExitReason::RuntimeFailure,
            anyhow::anyhow!(
                "cannot start {threads} compute thread(s): {e} (the process or thread limit is too low: ulimit -u, systemd TasksMax=, cgroup pids.max)"
            ),
        )
    })
}

fn all_cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// The file `path` can be created or replaced: its directory exists and is writable.
fn check_writable(path: &Path, what: &str) -> Result<(), Failure> {
    if path.is_dir() {
        return Err(Failure::new(
            ExitReason::InvalidInput,
            anyhow::anyhow!("{what} {}: is a directory", path.display()),
        ));
    }
    check_parent_writable(path, what)
}

/// Something can be created beside `path` (in its directory).
fn check_parent_writable(path: &Path, what: &str) -> Result<(), Failure> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let probe = dir.join(format!(".pi0d-write-check-{}", std::process::id()));
    std::fs::write(&probe, b"").map_err(|e| {
        Failure::new(
            ExitReason::InvalidInput,
            anyhow::anyhow!(
                "{what} {}: cannot write in {}: {e}",
                path.display(),
                dir.display()
            ),
        )
    })?;
    let _ = std::fs::remove_file(&probe);
    Ok(())
}

fn run(a: RunArgs, ros: &RosArgs, signals: Option<Signals>) -> Outcome {
    if let Some(p) = &a.summary {
        check_writable(p, "--summary")?;
    }
    let cfg = load_config(a.config, ros)?;
    for w in &cfg.warnings {
        tracing::warn!("{w}");
    }
    compute_threads(cfg.policy.threads())?;
    let file = cfg.file.clone();
    let reload_from = Some((cfg.file.clone(), ros.clone()));
    let opts = RunOptions {
        signals,
        reload_from,
        duration_s: a.duration,
        summary: a.summary,
        status: !a.quiet,
        dry_run: a.dry_run,
        state_dir: a
            .state_dir
            .or_else(|| std::env::var_os("STATE_DIRECTORY").map(PathBuf::from)),
    };
    let s = daemon::run(cfg, opts).map_err(|e| {
        let reason = e.exit_reason();
        Failure::new(
            reason,
            anyhow::Error::new(e).context(format!("running {}", file.display())),
        )
    })?;
    tell(&format!(
        "pi0d: {} ticks at {} Hz, {} overruns, jitter p99 {:.0} us; chunks {} executed / {} rejected; latency p50 {:.1} ms; limit violations {}; {} (exit {})",
        s.ticks,
        s.rate_hz,
        s.overruns,
        s.jitter_us.p99,
        s.chunks_accepted,
        s.chunks_rejected,
        s.latency_ms.p50,
        s.limit_violations,
        s.exit,
        s.exit_code,
    ));
    Ok(s.exit)
}

/// A failure while computing or writing results.
fn runtime<T, E: Into<anyhow::Error>>(r: Result<T, E>) -> Result<T, Failure> {
    r.map_err(|e| Failure::new(ExitReason::RuntimeFailure, e))
}

/// The user's input (a bad checkpoint, inputs file or manifest: exit 1) or a failure of the
/// computation or the system (exit 9), as the library's errors tell.
fn classified<T, E>(r: Result<T, E>) -> Result<T, Failure>
where
    E: std::error::Error + Send + Sync + 'static,
{
    r.map_err(|e| {
        let reason = if pi0d::policy::pi0::infer::is_input_error(&e) {
            ExitReason::InvalidInput
        } else {
            ExitReason::RuntimeFailure
        };
        Failure::new(reason, e)
    })
}

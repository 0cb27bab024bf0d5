use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand, ValueEnum};

use pi0d::config::ros_args::{self, RosArgs};
use pi0d::config::{Config, ConfigError};
use pi0d::daemon::exit::ExitReason;
use pi0d::daemon::log::{say, tell};
use pi0d::daemon::{self, RunOptions};

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
    Check(CheckArgs),
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
    /// Serve the policy over openpi's websocket protocol (any openpi client drives a robot
    /// from it): metadata on connect, msgpack-numpy observations, `actions` replies, GET /healthz.
    Serve(ServeArgs),
}

#[derive(Args)]
struct ServeArgs {
    /// Configuration file whose [policy] section (pi0 on any backend) is served, with its
    /// [serve] section; the options below override it.
    #[arg(long, conflicts_with_all = ["checkpoint", "arch"])]
    config: Option<PathBuf>,
    /// Or a checkpoint directory, served on the CPU.
    #[arg(long, required_unless_present = "config")]
    checkpoint: Option<PathBuf>,
    #[arg(long)]
    arch: Option<PathBuf>,
    /// Address to listen on (default 127.0.0.1:8000).
    #[arg(long)]
    listen: Option<std::net::SocketAddr>,
    /// Clients must send `Authorization: Api-Key <key>` with the key in this environment
    /// variable (never on the command line, where `ps` shows it).
    #[arg(long)]
    api_key_env: Option<String>,
    /// A model camera requests may leave out (fed masked, as lerobot does); repeatable.
    #[arg(long = "optional-camera")]
    optional_cameras: Vec<String>,
    /// CAMERA=KEY: the request key of a model camera (default observation.images.CAMERA),
    /// e.g. cam0=observation/image; repeatable.
    #[arg(long = "image-key", value_parser = camera_key)]
    image_keys: Vec<(String, String)>,
    /// The state's request key (default observation.state).
    #[arg(long)]
    state_key: Option<String>,
    /// The prompt's request key (default prompt).
    #[arg(long)]
    prompt_key: Option<String>,
    /// A request key accepted and dropped; repeatable.
    #[arg(long = "ignore-key")]
    ignore_keys: Vec<String>,
    /// Compute threads (default: all cores).
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..=1024))]
    threads: Option<u16>,
    /// Seed of the noise for requests that bring none (`noise` in the request sets it).
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Largest request frame, MiB (default 16).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1024))]
    max_request_mib: Option<u32>,
    /// Requests that may wait for the model; one more is answered "busy" (default 8).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1024))]
    queue: Option<u32>,
    /// Requests from several clients run as one batch, at most this many (1: one at a time).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=64))]
    max_batch: u32,
    /// How long a request waits for others to batch with, ms (0: only those already waiting
    /// join it).
    #[arg(long, default_value_t = 0.0)]
    batch_window_ms: f64,
    /// Also answer Zenoh queries on this key, e.g. pi0d/policy/arm (feature `zenoh`).
    #[arg(long)]
    zenoh: Option<String>,
    /// Real-time chunking's schedule for requests with `prev_actions` [default: the config's
    /// control.rtc.schedule, else linear].
    #[arg(long, value_parser = ["zeros", "ones", "linear", "exp"])]
    rtc_schedule: Option<String>,
    /// Real-time chunking's guidance cap [default: the config's, else 10].
    #[arg(long)]
    rtc_max_guidance: Option<f32>,
    /// Zenoh endpoints to connect to (a zenohd router, other peers); repeatable.
    #[arg(long = "zenoh-connect", requires = "zenoh")]
    zenoh_connect: Vec<String>,
    /// Zenoh endpoints to listen on, e.g. tcp/0.0.0.0:7447; repeatable.
    #[arg(long = "zenoh-listen", requires = "zenoh")]
    zenoh_listen: Vec<String>,
}

fn camera_key(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((c, k)) if !c.is_empty() && !k.is_empty() => Ok((c.to_string(), k.to_string())),
        _ => Err(format!("expected CAMERA=KEY, found \"{s}\"")),
    }
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

#[derive(Args)]
struct CheckArgs {
    /// Configuration file (or the ROS parameter `config` after --ros-args).
    #[arg(long)]
    config: Option<PathBuf>,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Backend {
    /// pi0d's own CPU kernels, from the checkpoint.
    Cpu,
    /// Exported graphs on ONNX Runtime.
    Onnx,
    /// The graphs compiled by ATC, on an Ascend NPU.
    Acl,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Provider {
    Cpu,
    Cuda,
    Tensorrt,
    Cann,
}

#[derive(Args)]
struct InferArgs {
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
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    repeat: u32,
    /// Compute threads (default: all cores).
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..=1024))]
    threads: Option<u16>,
    #[arg(long, value_enum, default_value = "cpu")]
    backend: Backend,
    /// Directory written by `pi0d export` (the `onnx` and `acl` backends).
    #[arg(long, required_if_eq_any([("backend", "onnx"), ("backend", "acl")]))]
    model_dir: Option<PathBuf>,
    /// ONNX Runtime execution provider.
    #[arg(long, value_enum, default_value = "cpu")]
    provider: Provider,
    /// Device for the cuda, tensorrt and cann providers and the acl backend.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(i32).range(0..))]
    device_id: i32,
    /// The ONNX Runtime library (default: ORT_DYLIB_PATH, else libonnxruntime.so).
    #[arg(long)]
    onnx_library: Option<PathBuf>,
    /// AscendCL's libascendcl.so (default: $ASCEND_HOME_PATH/lib64, CANN's install paths).
    #[arg(long)]
    acl_library: Option<PathBuf>,
    /// Real-time chunking's prefix schedule, for inputs with `rtc_prev_chunk` [default: linear].
    #[arg(long, value_parser = ["zeros", "ones", "linear", "exp"])]
    rtc_schedule: Option<String>,
    /// Real-time chunking's guidance weight cap, for inputs with `rtc_prev_chunk` [default: 10].
    #[arg(long)]
    rtc_max_guidance: Option<f32>,
}

impl InferArgs {
    /// The RTC settings the flags ask for; `None` when neither is given.
    fn rtc(&self) -> Option<pi0d::policy::rtc::RtcSettings> {
        use pi0d::policy::rtc::{RtcSettings, Schedule};
        if self.rtc_schedule.is_none() && self.rtc_max_guidance.is_none() {
            return None;
        }
        let d = RtcSettings::default();
        Some(RtcSettings {
            schedule: self
                .rtc_schedule
                .as_deref()
                .and_then(Schedule::parse)
                .unwrap_or(d.schedule),
            max_guidance_weight: self.rtc_max_guidance.unwrap_or(d.max_guidance_weight),
        })
    }
}

/// Applies `--rtc-*` to a batch: refused when the file has no leftover to guide with, or the
/// settings do not hold.
fn with_rtc(
    batch: &mut pi0d::policy::pi0::infer::Batch,
    rtc: Option<pi0d::policy::rtc::RtcSettings>,
    inputs: &Path,
) -> Result<(), Failure> {
    let Some(settings) = rtc else { return Ok(()) };
    let invalid = |m: String| Failure::new(ExitReason::InvalidInput, anyhow::anyhow!(m));
    if !batch.has_rtc() {
        return Err(invalid(format!(
            "{}: --rtc-schedule / --rtc-max-guidance need a `rtc_prev_chunk` tensor in the inputs",
            inputs.display()
        )));
    }
    batch
        .set_rtc(settings)
        .map_err(|m| invalid(format!("{}: {m}", inputs.display())))
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Dtype {
    /// f32 weights and compute.
    F32,
    /// f16 weights and compute (norms and softmax stay f32).
    F16,
    /// bf16 weights, f32 compute.
    Bf16,
}

#[derive(Args)]
struct ExportArgs {
    /// Checkpoint directory (config.json + model.safetensors) or a bare .safetensors file.
    #[arg(long)]
    checkpoint: PathBuf,
    /// JSON with head counts shapes cannot tell: {"vision_heads", "heads", "kv_heads", "head_dim"}.
    #[arg(long)]
    arch: Option<PathBuf>,
    /// Number of cameras the graphs take (shapes are static).
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..=16))]
    cameras: u16,
    /// Output directory (written whole or not at all).
    #[arg(long)]
    out: PathBuf,
    #[arg(long, value_enum, default_value = "f32")]
    dtype: Dtype,
    /// Unroll all denoising steps into one graph (noise -> actions).
    #[arg(long)]
    unroll: bool,
    /// With --unroll: real-time chunking's guidance as graph inputs (the leftover, its
    /// weights, each step's guidance weight); looped graphs take it on the host.
    #[arg(long)]
    rtc: bool,
    /// Batch size the graphs take.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=256))]
    batch: u16,
    /// Prompt tokens (default: the checkpoint's tokenizer length).
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..=4096))]
    prompt_len: Option<u16>,
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
    pi0d::daemon::log::init();
    pi0d::daemon::supervise::install_panic_hook();
    // `launch_ros` appends `--ros-args ...`: split them off before clap sees the line.
    let (args, ros_args) = ros_args::split(std::env::args().collect());
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(e) => {
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
    let outcome = ros_args::parse(&ros_args)
        .map_err(Failure::from)
        .and_then(|ros| match cli.command {
            Command::Run(a) => run(a, &ros),
            Command::Check(a) => check(a, &ros),
            Command::Infer(a) => infer(a),
            Command::Export(a) => export(a),
            Command::Serve(a) => serve(a, &ros),
        });
    match outcome {
        Ok(reason) => reason.into(),
        Err(f) => {
            tell(&format!("error: {:#}", f.error));
            f.reason.into()
        }
    }
}

/// The configuration file (from `--config`, or the `config` ROS parameter) with the ROS
/// parameters and remaps applied.
fn load_config(config: Option<PathBuf>, ros: &RosArgs) -> Result<Config, Failure> {
    let path = config
        .or_else(|| ros_args::config_path(ros))
        .ok_or_else(|| {
            Failure::new(
                ExitReason::Usage,
                anyhow::anyhow!(
                    "give --config FILE, or the ROS parameter `config` after --ros-args"
                ),
            )
        })?;
    Ok(Config::load_with(&path, ros)?)
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

fn serve(a: ServeArgs, ros: &RosArgs) -> Outcome {
    use pi0d::config::serve::ServeConfig;
    use pi0d::policy::pi0::pipeline::{BackendOptions, Pi0Pipeline, PipelineOptions};
    let (options, optional, seed, mut sc, rtc) = match &a.config {
        Some(path) => {
            let cfg = load_config(Some(path.clone()), ros)?;
            let rtc = cfg.control.rtc.settings;
            let pi0d::config::PolicySource::Pi0 {
                checkpoint,
                arch,
                tokenizer,
                threads,
                seed,
                backend,
            } = cfg.policy.source
            else {
                return Err(Failure::new(
                    ExitReason::InvalidInput,
                    anyhow::anyhow!(
                        "{}: policy.kind must be \"pi0\" with a local backend to serve it",
                        path.display()
                    ),
                ));
            };
            (
                PipelineOptions {
                    checkpoint,
                    arch,
                    tokenizer,
                    threads,
                    backend,
                },
                cfg.policy.optional_cameras.clone(),
                seed,
                cfg.serve.clone(),
                rtc,
            )
        }
        None => (
            PipelineOptions {
                checkpoint: a.checkpoint.clone().unwrap_or_default(),
                arch: a.arch.clone(),
                tokenizer: None,
                threads: a.threads.map_or_else(all_cores, usize::from),
                backend: BackendOptions::Cpu,
            },
            Vec::new(),
            a.seed,
            ServeConfig::default(),
            pi0d::config::RtcSettings::default(),
        ),
    };
    // The command line over [serve].
    let optional: Vec<String> = optional
        .into_iter()
        .chain(a.optional_cameras.clone())
        .collect();
    sc.keys.images.extend(a.image_keys.iter().cloned());
    sc.keys.state_key = a.state_key.clone().or(sc.keys.state_key);
    sc.keys.prompt_key = a.prompt_key.clone().or(sc.keys.prompt_key);
    sc.keys.ignore.extend(a.ignore_keys.iter().cloned());
    let listen = a
        .listen
        .or(sc.listen)
        .unwrap_or_else(|| std::net::SocketAddr::from(([127, 0, 0, 1], 8000)));
    let api_key = match a.api_key_env.as_ref().or(sc.api_key_env.as_ref()) {
        Some(name) => match std::env::var(name) {
            Ok(k) if !k.is_empty() => Some(k),
            _ => {
                return Err(Failure::new(
                    ExitReason::Usage,
                    anyhow::anyhow!("api key from {name}: the variable is not set or empty"),
                ))
            }
        },
        None => None,
    };
    compute_threads(options.threads)?;
    let pipeline = classified(Pi0Pipeline::load(&options))?;
    let layout = pi0d::remote::checkpoint_layout(&pipeline, &optional, &sc.keys)
        .map_err(|e| Failure::new(ExitReason::InvalidInput, anyhow::anyhow!(e)))?;
    say(&format!(
        "serving {} on ws://{listen} (takes {}{})",
        options.checkpoint.display(),
        layout.keys().join(", "),
        if api_key.is_some() {
            "; API key required"
        } else {
            ""
        }
    ));
    let opts = pi0d::remote::serve::ServeOptions {
        listen,
        api_key,
        max_request_bytes: a.max_request_mib.or(sc.max_request_mib).unwrap_or(16) as usize
            * 1024
            * 1024,
        queue: a.queue.or(sc.queue).unwrap_or(8) as usize,
        seed,
        max_batch: a.max_batch as usize,
        batch_window: std::time::Duration::from_secs_f64(
            a.batch_window_ms.clamp(0.0, 1000.0) / 1e3,
        ),
        rtc: pi0d::config::RtcSettings {
            schedule: a
                .rtc_schedule
                .as_deref()
                .and_then(pi0d::config::Schedule::parse)
                .unwrap_or(rtc.schedule),
            max_guidance_weight: a.rtc_max_guidance.unwrap_or(rtc.max_guidance_weight),
        },
        zenoh: a
            .zenoh
            .clone()
            .map(|key| pi0d::config::openpi::ZenohLinkOptions {
                key,
                connect: a.zenoh_connect.clone(),
                listen: a.zenoh_listen.clone(),
            }),
    };
    pi0d::remote::serve::serve(pipeline, layout, opts)
        .map_err(|e| Failure::new(ExitReason::RuntimeFailure, e))?;
    Ok(ExitReason::Clean)
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

fn run(a: RunArgs, ros: &RosArgs) -> Outcome {
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

fn check(a: CheckArgs, ros: &RosArgs) -> Outcome {
    let cfg = load_config(a.config, ros)?;
    print_check(&cfg);
    compute_threads(cfg.policy.threads())?;
    // The policy too, as `run` builds it: a pi0 checkpoint is loaded and checked tensor by
    // tensor, its processor files against the model's widths.
    let p =
        pi0d::policy::from_config(&cfg).map_err(|e| Failure::new(ExitReason::InvalidInput, e))?;
    say(&format!("policy: {} loaded", p.name()));
    Ok(ExitReason::Clean)
}

fn infer(a: InferArgs) -> Outcome {
    check_writable(&a.output, "--output")?;
    let threads = a.threads.map_or_else(all_cores, usize::from);
    compute_threads(threads)?;
    let repeat = a.repeat as usize;
    let rtc = a.rtc();
    match (a.backend, a.checkpoint, a.model_dir) {
        (Backend::Onnx | Backend::Acl, _, Some(dir)) => {
            let runtime = match a.backend {
                Backend::Acl => GraphBackend::Acl(pi0d::config::AclOptions {
                    library: a.acl_library,
                    device_id: a.device_id,
                }),
                _ => GraphBackend::Onnx(pi0d::config::OnnxOptions {
                    library: a.onnx_library,
                    provider: provider(a.provider, a.device_id),
                    threads: a.threads.map_or(0, usize::from),
                }),
            };
            infer_graphs(&dir, &a.inputs, &a.output, repeat, &runtime, rtc)
        }
        (_, Some(ck), _) => infer_cpu(
            &ck,
            a.arch.as_deref(),
            &a.inputs,
            &a.output,
            repeat,
            threads,
            rtc,
        ),
        _ => Err(Failure::new(
            ExitReason::Usage,
            anyhow::anyhow!("--checkpoint (cpu) or --model-dir (onnx, acl) is required"),
        )),
    }?;
    Ok(ExitReason::Clean)
}

fn provider(p: Provider, device_id: i32) -> pi0d::config::ExecutionProvider {
    use pi0d::config::raw::ProviderKind;
    let kind = match p {
        Provider::Cpu => ProviderKind::Cpu,
        Provider::Cuda => ProviderKind::Cuda,
        Provider::Tensorrt => ProviderKind::Tensorrt,
        Provider::Cann => ProviderKind::Cann,
    };
    pi0d::config::ExecutionProvider::with_defaults(kind, device_id)
}

/// A failure while computing or writing results.
fn runtime<T, E: Into<anyhow::Error>>(r: Result<T, E>) -> Result<T, Failure> {
    r.map_err(|e| Failure::new(ExitReason::RuntimeFailure, e))
}

fn infer_cpu(
    checkpoint: &Path,
    arch: Option<&Path>,
    inputs: &Path,
    output: &Path,
    repeat: usize,
    threads: usize,
    rtc: Option<pi0d::policy::rtc::RtcSettings>,
) -> Result<(), Failure> {
    use pi0d::policy::pi0::{infer, ArchOverrides, Checkpoint, Pi0Model};
    let overrides = classified(arch.map(ArchOverrides::load).transpose())?;
    let ck = classified(Checkpoint::load(checkpoint))?;
    let model = classified(Pi0Model::load(&ck, overrides, threads))?;
    drop(ck);
    let mut batch = classified(infer::Batch::read(inputs, &model))?;
    with_rtc(&mut batch, rtc, inputs)?;
    let mut last = None;
    for _ in 0..repeat {
        // Non-finite actions are a failed inference, not a result.
        let (actions, timing) = classified(infer::try_run_batch(&model, &batch))?;
        if repeat > 1 {
            say(&runtime(serde_json::to_string(&timing))?);
        }
        last = Some(actions);
    }
    if let Some(actions) = last {
        classified(infer::write_actions(output, &batch, &actions))?;
    }
    Ok(())
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

/// The runtime `pi0d infer` runs exported graphs on.
enum GraphBackend {
    Onnx(pi0d::config::OnnxOptions),
    Acl(pi0d::config::AclOptions),
}

fn infer_graphs(
    dir: &Path,
    inputs: &Path,
    output: &Path,
    repeat: usize,
    backend: &GraphBackend,
    rtc: Option<pi0d::policy::rtc::RtcSettings>,
) -> Result<(), Failure> {
    use pi0d::policy::graph::manifest::Manifest;
    use pi0d::policy::pi0::infer::{self, BatchDims};
    let m = classified(Manifest::load(dir))?;
    let mut batch = classified(infer::Batch::read_for(
        inputs,
        &BatchDims {
            image_size: m.image_size,
            state_dim: m.state_dim,
            chunk: m.chunk,
            action_dim: m.action_dim,
        },
    ))?;
    with_rtc(&mut batch, rtc, inputs)?;
    let mut model = match backend {
        GraphBackend::Onnx(opts) => classified(pi0d::policy::graph::load_onnx(dir, m, opts))?,
        GraphBackend::Acl(opts) => classified(pi0d::policy::graph::load_acl(dir, m, opts))?,
    };
    let mut last = None;
    for _ in 0..repeat {
        let (actions, t) = classified(model.sample(&batch.graph_inputs()))?;
        if repeat > 1 {
            let timing = infer::RunTiming {
                prefix_ms: t.prefix_ms,
                steps_ms: t.steps_ms,
                total_ms: t.prefix_ms + t.steps_ms,
            };
            say(&runtime(serde_json::to_string(&timing))?);
        }
        last = Some(actions);
    }
    if let Some(actions) = last {
        classified(infer::write_actions(output, &batch, &actions))?;
    }
    Ok(())
}

fn export(a: ExportArgs) -> Outcome {
    use pi0d::policy::export::pi0::ExportDtype;
    use pi0d::policy::export::{atc, export, ExportOptions, ExternalData};
    // Written beside `--out` and renamed into place.
    check_parent_writable(&a.out, "--out")?;
    compute_threads(all_cores())?;
    let opts = ExportOptions {
        checkpoint: a.checkpoint,
        arch: a.arch,
        out: a.out,
        cameras: a.cameras.into(),
        batch: a.batch.into(),
        prompt_len: a.prompt_len.map(usize::from),
        dtype: match a.dtype {
            Dtype::F32 => ExportDtype::F32,
            Dtype::F16 => ExportDtype::F16,
            Dtype::Bf16 => ExportDtype::Bf16,
        },
        unroll: a.unroll,
        rtc: a.rtc,
        external: if a.external_data {
            ExternalData::Always
        } else {
            ExternalData::Auto
        },
        clamp_f16: a.clamp_f16,
        progress: std::io::IsTerminal::is_terminal(&std::io::stderr()),
    };
    let report = classified(export(&opts))?;
    let m = &report.manifest;
    for c in &report.clamped {
        tracing::warn!(
            "{}: {} weights beyond float16's range (largest {}) saturated to +-65504",
            c.tensor,
            c.count,
            c.max_abs
        );
    }
    say(&format!(
        "exported {} ({:?}, {} camera(s), batch {}, {} prompt tokens) to {}",
        m.variant,
        m.dtype,
        m.cameras,
        m.batch,
        m.prompt_len,
        opts.out.display()
    ));
    for g in [&m.graphs.prefix, &m.graphs.denoise] {
        say(&format!(
            "  {}: {} nodes, {:.1} MB of weights{}",
            g.file,
            g.nodes,
            g.weight_bytes as f64 / 1e6,
            g.external_data
                .as_ref()
                .map(|d| format!(" in {d}"))
                .unwrap_or_default()
        ));
    }
    if let Some(soc) = &a.atc {
        if !atc::KNOWN_SOCS.contains(&soc.as_str()) {
            tracing::warn!(
                "{soc} is not one of {:?}; passing it to ATC as given",
                atc::KNOWN_SOCS
            );
        }
        let have_atc = std::env::var_os("PATH")
            .map(|p| std::env::split_paths(&p).any(|d| d.join("atc").is_file()))
            .unwrap_or(false);
        for cmd in atc::atc_commands(m, &opts.out, soc) {
            say(&cmd.join(" "));
            if have_atc {
                let status = runtime(std::process::Command::new(&cmd[0]).args(&cmd[1..]).status())?;
                if !status.success() {
                    return Err(Failure::new(
                        ExitReason::RuntimeFailure,
                        anyhow::anyhow!("atc failed ({status}) for {}", cmd[1]),
                    ));
                }
            }
        }
        if !have_atc {
            say(
                "(atc is not on the PATH: run the commands above on a machine with CANN's toolkit)",
            );
        }
    }
    Ok(ExitReason::Clean)
}

fn print_check(cfg: &Config) {
    say(&format!("config: {}", cfg.file.display()));
    say(&format!("urdf:   {}", cfg.urdf.display()));
    say(&format!(
        "control: {} Hz, {:?} interpolation, {:?} merge, blend {} s, request at {} s left, start within {} s",
        cfg.control.rate_hz,
        cfg.control.interpolation,
        cfg.control.merge,
        cfg.control.blend_window_s,
        cfg.control.request_threshold_s,
        cfg.control.start_timeout_s,
    ));
    say(&format!(
        "watchdogs: joint state {} s, camera {} s, overrun streak {}",
        cfg.safety.joint_state_timeout_s, cfg.safety.camera_timeout_s, cfg.safety.overrun_streak
    ));
    if cfg.limits.scale < 1.0 {
        say(&format!(
            "limits: scaled to {} of every velocity, acceleration and jerk limit (limits.scale; the table shows the scaled values)",
            cfg.limits.scale
        ));
    }
    say(&format!(
        "{:<20} {:<10} {:>9} {:>9} {:>8} {:>8} {:>8} {:>8}",
        "joint", "kind", "lower", "upper", "vel", "acc", "jerk", "max_step"
    ));
    for j in &cfg.limits.joints {
        say(&format!(
            "{:<20} {:<10} {:>9.4} {:>9.4} {:>8.3} {:>8.2} {:>8.1} {:>8.3}",
            j.name,
            format!("{:?}", j.kind).to_lowercase(),
            j.lower,
            j.upper,
            j.velocity,
            j.acceleration,
            j.jerk,
            j.max_step
        ));
    }
    say(&format!(
        "policy: {}; {} steps x {} s; actions -> joints: {}",
        cfg.policy.source.describe(),
        cfg.policy.chunk_steps,
        cfg.policy.step_period_s,
        cfg.policy.action_map.action_names.join(", ")
    ));
    let rtc = &cfg.control.rtc;
    if rtc.enabled {
        say(&format!(
            "real-time chunking: {} schedule, guidance up to {}, horizon {} steps, delay {}",
            rtc.settings.schedule,
            rtc.settings.max_guidance_weight,
            rtc.execution_horizon,
            rtc.inference_delay_steps
                .map_or("measured".to_string(), |d| format!("{d} steps"))
        ));
    }
    if let Some(w) = &cfg.workspace {
        say(&format!(
            "workspace: {} in {} within {:?} .. {:?}",
            w.chain.tool_link, w.chain.base_link, w.min, w.max
        ));
    }
    match &cfg.io {
        pi0d::config::Io::Sim => say(&format!("io: sim, {} camera(s)", cfg.sim.cameras.len())),
        pi0d::config::Io::Ros(r) => {
            say(&format!(
                "io: ros ({:?}), node {}{}{}, {} camera(s)",
                r.middleware,
                r.namespace.trim_end_matches('/'),
                "/",
                r.node,
                r.cameras.len(),
            ));
            for g in &r.commands {
                let kind = match g.kind {
                    pi0d::config::CommandType::GripperCommand => format!(
                        "control_msgs/action/GripperCommand goals (max_effort {}, sent when the target moves)",
                        g.max_effort
                    ),
                    k => format!("{k:?}"),
                };
                say(&format!(
                    "commands: {} as {kind} on {} at {} Hz (dry run: {})",
                    g.joints.join(", "),
                    g.topic,
                    g.rate_hz,
                    r.shadow_topic(g),
                ));
            }
            if r.sends_trajectories() {
                say(&format!(
                    "trajectories: stamp 0 (start on receipt), points on the command's course (due +{:.4} s) for {} s, then braking to rest within the limits",
                    cfg.control.period.as_secs_f64(),
                    r.trajectory_coast_s
                ));
            }
        }
    }
    for w in &cfg.warnings {
        say(&format!("warning: {w}"));
    }
}

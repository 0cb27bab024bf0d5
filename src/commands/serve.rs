//! `pi0d serve`: the policy behind openpi's websocket protocol (and over Zenoh).

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use pi0d::config::ranges::{
    Range, RTC_MAX_GUIDANCE, SERVE_BATCH_WINDOW_MS, SERVE_HANDSHAKE_TIMEOUT_S,
    SERVE_IDLE_TIMEOUT_S, SERVE_MAX_REQUEST_MIB, SERVE_QUEUE,
};
use pi0d::config::ros_args::RosArgs;
use pi0d::config::serve::{DEFAULT_HANDSHAKE_TIMEOUT_S, DEFAULT_IDLE_TIMEOUT_S};
use pi0d::daemon::exit::ExitReason;
use pi0d::daemon::load::{watched, Waited};
use pi0d::daemon::log::say;
use pi0d::daemon::signals::Signals;

use crate::{all_cores, classified, compute_threads, load_config, Failure, Outcome};

#[derive(Args)]
pub(crate) struct ServeArgs {
    /// Configuration file whose [policy] section (pi0 on any backend) is served, with its
    /// [serve] section; the options below override it.
    #[arg(long, conflicts_with_all = ["checkpoint", "arch"])]
    config: Option<PathBuf>,
    /// Or a checkpoint directory, served on the CPU.
    #[arg(long, required_unless_present = "config")]
    checkpoint: Option<PathBuf>,
    /// With --checkpoint: JSON with head counts shapes cannot tell: {"vision_heads", "heads",
    /// "kv_heads", "head_dim"}.
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
    #[arg(long, value_parser = |s: &str| count(&SERVE_MAX_REQUEST_MIB, s))]
    max_request_mib: Option<u32>,
    /// Requests that may wait for the model; one more is answered "busy" (default 8).
    #[arg(long, value_parser = |s: &str| count(&SERVE_QUEUE, s))]
    queue: Option<u32>,
    /// Requests from several clients run as one batch, at most this many (1: one at a time).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=64))]
    max_batch: u32,
    /// How long a request waits for others to batch with, ms, 0 to 1000 (0: only those
    /// already waiting join it).
    #[arg(long, default_value_t = 0.0, value_parser = |s: &str| SERVE_BATCH_WINDOW_MS.parse(s))]
    batch_window_ms: f64,
    /// A connection must finish its HTTP request or websocket handshake within this, s, 0.1 to
    /// 60 [default: the config's serve.handshake_timeout_s, else 5].
    #[arg(long, value_parser = |s: &str| SERVE_HANDSHAKE_TIMEOUT_S.parse(s))]
    handshake_timeout_s: Option<f64>,
    /// A client that sends no request for this long is disconnected, s, 0.1 to 86400
    /// [default: the config's serve.idle_timeout_s, else 60].
    #[arg(long, value_parser = |s: &str| SERVE_IDLE_TIMEOUT_S.parse(s))]
    idle_timeout_s: Option<f64>,
    /// Also answer Zenoh queries on this key, e.g. pi0d/policy/arm.
    #[cfg(feature = "zenoh")]
    #[arg(long)]
    zenoh: Option<String>,
    /// Real-time chunking's schedule for requests with `prev_actions` [default: the config's
    /// control.rtc.schedule, else linear].
    #[arg(long, value_parser = ["zeros", "ones", "linear", "exp"])]
    rtc_schedule: Option<String>,
    /// Real-time chunking's guidance cap, 0.01 to 1000 (control.rtc.max_guidance_weight's
    /// range) [default: the config's, else 10].
    #[arg(long, value_parser = |s: &str| RTC_MAX_GUIDANCE.parse(s))]
    rtc_max_guidance: Option<f64>,
    /// Zenoh endpoints to connect to (a zenohd router, other peers); repeatable.
    #[cfg(feature = "zenoh")]
    #[arg(long = "zenoh-connect", requires = "zenoh")]
    zenoh_connect: Vec<String>,
    /// Zenoh endpoints to listen on, e.g. tcp/0.0.0.0:7447; repeatable.
    #[cfg(feature = "zenoh")]
    #[arg(long = "zenoh-listen", requires = "zenoh")]
    zenoh_listen: Vec<String>,
    /// A Zenoh session file (JSON5, as rmw_zenoh's ZENOH_SESSION_CONFIG_URI): the whole
    /// configuration, TLS, mTLS and access control included.
    #[cfg(feature = "zenoh")]
    #[arg(long = "zenoh-config", requires = "zenoh")]
    zenoh_config: Option<std::path::PathBuf>,
    /// Let the Zenoh session scout by multicast: any Zenoh peer on the network finds it
    /// [default: off, as rmw_zenoh].
    #[cfg(feature = "zenoh")]
    #[arg(long = "zenoh-multicast-scouting", requires = "zenoh")]
    zenoh_multicast_scouting: bool,
}

impl ServeArgs {
    /// `--zenoh` and its endpoints (only in a build with the `zenoh` feature: without it the
    /// options do not exist).
    #[cfg(feature = "zenoh")]
    fn zenoh(&self) -> Option<pi0d::config::openpi::ZenohLinkOptions> {
        self.zenoh
            .clone()
            .map(|key| pi0d::config::openpi::ZenohLinkOptions {
                key,
                connect: self.zenoh_connect.clone(),
                listen: self.zenoh_listen.clone(),
                session_config: self.zenoh_config.clone(),
                multicast_scouting: self.zenoh_multicast_scouting,
            })
    }

    #[cfg(not(feature = "zenoh"))]
    fn zenoh(&self) -> Option<pi0d::config::openpi::ZenohLinkOptions> {
        None
    }
}

/// An integer option within `range` (its `[serve]` setting's, so both take the same values).
fn count(range: &Range, s: &str) -> Result<u32, pi0d::config::ranges::OutOfRange> {
    // Within the range, which is within u32's: the cast is exact.
    range.parse(s).map(|x| x as u32)
}

pub(crate) fn camera_key(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((c, k)) if !c.is_empty() && !k.is_empty() => Ok((c.to_string(), k.to_string())),
        _ => Err(format!("expected CAMERA=KEY, found \"{s}\"")),
    }
}

pub(crate) fn serve(a: ServeArgs, ros: &RosArgs) -> Outcome {
    use pi0d::config::serve::ServeConfig;
    use pi0d::config::BackendOptions;
    use pi0d::policy::pi0::pipeline::{Pi0Pipeline, PipelineOptions};
    // First: no signal may end it without a controlled stop while the model loads either.
    let signals = Signals::install();
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
                openpi_delta_actions,
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
                    openpi_delta_actions,
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
                openpi_delta_actions: None,
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
    // On a thread of its own: a stop signal ends a long load (a full-size checkpoint) at once.
    // A full-size checkpoint takes a while on a board: the operator sees what it waits for.
    pi0d::daemon::log::tell(&format!(
        "loading {}",
        pi0d::outside::path(&options.checkpoint)
    ));
    let opts = options.clone();
    let stop = || signals.stop_requested().then_some(());
    let pipeline = match watched("load", move || Pi0Pipeline::load(&opts), stop) {
        Ok(Waited::Done(loaded)) => classified(loaded)?,
        Ok(Waited::GaveUp(())) => {
            pi0d::daemon::log::tell(&format!(
                "stop requested while loading {}: exiting without serving",
                pi0d::outside::path(&options.checkpoint)
            ));
            return Ok(ExitReason::Clean);
        }
        Err(e) => return Err(Failure::new(ExitReason::RuntimeFailure, e)),
    };
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
    // What the checkpoint does around its model: the first line says whether the replies are
    // relative actions made absolute.
    if let Some(line) = pipeline.describe_processing().first() {
        say(line);
    }
    let opts = pi0d::remote::serve::ServeOptions {
        listen,
        api_key,
        max_request_bytes: a.max_request_mib.or(sc.max_request_mib).unwrap_or(16) as usize
            * 1024
            * 1024,
        queue: a.queue.or(sc.queue).unwrap_or(8) as usize,
        seed,
        max_batch: a.max_batch as usize,
        // In range: checked by the option's parser and [serve]'s validation.
        batch_window: Duration::from_secs_f64(a.batch_window_ms / 1e3),
        handshake_timeout: Duration::from_secs_f64(
            a.handshake_timeout_s
                .or(sc.handshake_timeout_s)
                .unwrap_or(DEFAULT_HANDSHAKE_TIMEOUT_S),
        ),
        idle_timeout: Duration::from_secs_f64(
            a.idle_timeout_s
                .or(sc.idle_timeout_s)
                .unwrap_or(DEFAULT_IDLE_TIMEOUT_S),
        ),
        rtc: pi0d::config::RtcSettings {
            schedule: a
                .rtc_schedule
                .as_deref()
                .and_then(pi0d::config::Schedule::parse)
                .unwrap_or(rtc.schedule),
            max_guidance_weight: a
                .rtc_max_guidance
                .map_or(rtc.max_guidance_weight, |g| g as f32),
        },
        zenoh: a.zenoh(),
    };
    pi0d::remote::serve::serve(pipeline, layout, opts, signals)
        .map_err(|e| Failure::new(ExitReason::RuntimeFailure, e))?;
    Ok(ExitReason::Clean)
}

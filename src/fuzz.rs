//! Entry points for fuzzing every parser of outside bytes: each takes arbitrary bytes, runs
//! the parser pi0d runs on them, and returns whatever it decided (a value or a refusal). A
//! panic, an abort or a hang is a defect; a refusal is the expected answer to nonsense.
//! `tests/it/fuzz.rs` drives them with mutated corpus files (docs/fuzzing.md); a cargo-fuzz
//! harness can call the same functions. CDR (the ROS inputs) has its own generators in
//! `io/ros/fuzz_tests.rs`.

use std::path::{Path, PathBuf};

use crate::policy::pi0::processor::{Context, Processor};

/// The parsers fuzzed, by the input they read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// A configuration file (TOML), as `run` and `check` read it.
    ConfigToml,
    /// A ROS parameter file (YAML, `--ros-args --params-file`).
    RosParamsYaml,
    /// A checkpoint's `config.json`.
    ConfigJson,
    /// A checkpoint's `policy_preprocessor.json`.
    ProcessorJson,
    /// A safetensors file's header and layout (checkpoints, statistics, `infer` inputs).
    Safetensors,
    /// An openpi msgpack frame: a request as `serve` reads it, a reply as the client reads it.
    OpenpiFrame,
    /// An MCAP file, as `plot` and calibration read it.
    Mcap,
    /// A websocket handshake answer, as pi0d's openpi client reads it.
    WebsocketHandshake,
    /// A client's first bytes to `pi0d serve`: its request head, the health check, the
    /// websocket handshake with an API key.
    ServeHandshake,
}

impl Target {
    pub const ALL: [Target; 9] = [
        Target::ConfigToml,
        Target::RosParamsYaml,
        Target::ConfigJson,
        Target::ProcessorJson,
        Target::Safetensors,
        Target::OpenpiFrame,
        Target::Mcap,
        Target::WebsocketHandshake,
        Target::ServeHandshake,
    ];

    /// The corpus directory's name (`tests/fuzz/<name>/`).
    pub fn name(self) -> &'static str {
        match self {
            Target::ConfigToml => "config_toml",
            Target::RosParamsYaml => "ros_params_yaml",
            Target::ConfigJson => "config_json",
            Target::ProcessorJson => "processor_json",
            Target::Safetensors => "safetensors",
            Target::OpenpiFrame => "openpi_frame",
            Target::Mcap => "mcap",
            Target::WebsocketHandshake => "websocket_handshake",
            Target::ServeHandshake => "serve_handshake",
        }
    }
}

/// Where the targets that read files put them: a directory of the caller's, holding a copy of
/// a checkpoint for the processor's statistics.
pub struct Scratch {
    pub dir: PathBuf,
    /// A checkpoint directory whose `policy_preprocessor.json` is rewritten per input.
    pub checkpoint: PathBuf,
}

/// Runs `target`'s parser on `bytes`; `Ok` when it took them, `Err` with its refusal.
pub fn run(target: Target, bytes: &[u8], scratch: &Scratch) -> Result<(), String> {
    let text = || std::str::from_utf8(bytes).map_err(|e| e.to_string());
    let file = |name: &str| -> Result<PathBuf, String> {
        let p = scratch.dir.join(name);
        std::fs::write(&p, bytes).map_err(|e| e.to_string())?;
        Ok(p)
    };
    match target {
        Target::ConfigToml => crate::config::Config::parse(Path::new("fuzz.toml"), text()?)
            .map(drop)
            .map_err(|e| crate::errors::Chain(&e).to_string()),
        Target::RosParamsYaml => {
            crate::config::ros_args::params_file(&file("params.yaml")?, "pi0d", "/")
                .map(drop)
                .map_err(|e| e.to_string())
        }
        Target::ConfigJson => crate::policy::pi0::config_json::PolicyConfigJson::parse(
            Path::new("config.json"),
            text()?,
        )
        .map(drop)
        .map_err(|e| e.to_string()),
        Target::ProcessorJson => {
            let path = scratch.checkpoint.join("policy_preprocessor.json");
            std::fs::write(&path, bytes).map_err(|e| e.to_string())?;
            let widths = crate::policy::pi0::normalize::Widths {
                state: 7,
                action: 7,
                source: "fuzz".into(),
            };
            let cameras = ["observation.images.front".to_string()];
            Processor::load(&Context {
                dir: &scratch.checkpoint,
                variant: crate::policy::pi0::arch::Variant::Pi0,
                widths: &widths,
                cameras: &cameras,
                use_relative_actions: None,
                default_prompt_len: 48,
                openpi_delta_actions: None,
            })
            .map(drop)
            .map_err(|e| e.to_string())
        }
        Target::Safetensors => {
            crate::policy::pi0::checkpoint::parse_safetensors(Path::new("fuzz.safetensors"), bytes)
                .map(drop)
                .map_err(|e| e.to_string())
        }
        Target::OpenpiFrame => openpi_frame(bytes),
        Target::Mcap => {
            let path = file("fuzz.mcap")?;
            let plot = crate::record::read::read(&path)
                .map(drop)
                .map_err(|e| e.to_string());
            let calibration = crate::policy::pi0::quant::recorded::read(&path)
                .map(drop)
                .map_err(|e| e.to_string());
            plot.and(calibration)
        }
        Target::WebsocketHandshake => handshake(bytes),
        Target::ServeHandshake => crate::remote::serve::fuzz_handshake(bytes),
    }
}

/// The bytes as a request `serve` reads (for a one-camera, 7-joint model) and as a reply
/// pi0d's openpi client reads.
fn openpi_frame(bytes: &[u8]) -> Result<(), String> {
    use crate::policy::openpi::msgpack_numpy::decode_request;
    let items = decode_request(bytes).map_err(|e| e.to_string())?;
    let layout = crate::remote::request::Layout {
        image_keys: vec!["observation/image".into()],
        optional: vec![false],
        state_key: "observation/state".into(),
        state_dim: 7,
        prompt_key: "prompt".into(),
        ignored: Vec::new(),
        noise_shape: [50, 32],
        actions_shape: [50, 7],
    };
    let request = layout.parse(items).map(drop).map_err(|e| e.to_string());
    let reply = crate::policy::openpi::fuzz_reply(bytes);
    request.and(reply)
}

/// The bytes as a server's answer to pi0d's websocket upgrade, with the frame limits pi0d
/// sets.
fn handshake(bytes: &[u8]) -> Result<(), String> {
    use tungstenite::client::IntoClientRequest;
    let request = "ws://127.0.0.1:8000/"
        .into_client_request()
        .map_err(|e| e.to_string())?;
    let config = tungstenite::protocol::WebSocketConfig {
        max_message_size: Some(1 << 20),
        max_frame_size: Some(1 << 20),
        ..Default::default()
    };
    let stream = Replay { bytes, at: 0 };
    match tungstenite::client::client_with_config(request, stream, Some(config)) {
        Ok((mut ws, _)) => {
            // What follows the answer is frames: read them until the bytes end.
            while ws.read().is_ok() {}
            Ok(())
        }
        Err(e) => Err(crate::outside::text(&e.to_string()).to_string()),
    }
}

/// A peer that sends `bytes` and takes whatever is written.
struct Replay<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl std::io::Read for Replay<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = buf.len().min(self.bytes.len() - self.at);
        buf[..n].copy_from_slice(&self.bytes[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}

impl std::io::Write for Replay<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

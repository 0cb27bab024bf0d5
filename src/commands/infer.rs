//! `pi0d infer`: the policy model alone, on an inputs file, on the CPU or exported graphs.

use std::path::{Path, PathBuf};

use clap::{Args, ValueEnum};

use pi0d::daemon::exit::ExitReason;
use pi0d::daemon::log::say;

use crate::{all_cores, check_writable, classified, compute_threads, runtime, Failure, Outcome};

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Backend {
    /// pi0d's own CPU kernels, from the checkpoint.
    Cpu,
    /// Exported graphs on ONNX Runtime.
    Onnx,
    /// The graphs compiled by ATC, on an Ascend NPU.
    Acl,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Provider {
    /// ONNX Runtime's own CPU kernels.
    Cpu,
    /// NVIDIA GPUs through CUDA.
    Cuda,
    /// NVIDIA GPUs through TensorRT (engines built on first run).
    Tensorrt,
    /// Ascend NPUs through CANN.
    Cann,
}

#[derive(Args)]
pub(crate) struct InferArgs {
    /// Checkpoint directory (config.json + model.safetensors) or a bare .safetensors file
    /// (the `cpu` backend).
    #[arg(long, required_if_eq("backend", "cpu"))]
    checkpoint: Option<PathBuf>,
    /// JSON with head counts shapes cannot tell: {"vision_heads", "heads", "kv_heads", "head_dim"}.
    #[arg(long)]
    arch: Option<PathBuf>,
    /// The inputs (safetensors; the tensors `pi0d infer --help` lists above).
    #[arg(long)]
    inputs: PathBuf,
    /// Where to write the `actions` tensor (safetensors; replaced if it exists).
    #[arg(long)]
    output: PathBuf,
    /// Run the inference N times after loading; print one JSON timing line per run.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    repeat: u32,
    /// Compute threads (default: all cores).
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..=1024))]
    threads: Option<u16>,
    /// What runs the model: the checkpoint on pi0d's CPU kernels, or graphs from `pi0d export`.
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
    /// With the onnx backend: measure the largest activation per layer group inside the graphs
    /// and print it against float16's range with the precision the graphs need, even when the
    /// run then fails on non-finite actions.
    #[arg(long)]
    activations: bool,
    /// Real-time chunking's prefix schedule, for inputs with `rtc_prev_chunk` [default: linear].
    #[arg(long, value_parser = ["zeros", "ones", "linear", "exp"])]
    rtc_schedule: Option<String>,
    /// Real-time chunking's guidance weight cap, for inputs with `rtc_prev_chunk` [default: 10].
    #[arg(long)]
    rtc_max_guidance: Option<f32>,
}

impl InferArgs {
    /// The RTC settings the flags ask for; `None` when neither is given.
    fn rtc(&self) -> Option<pi0d::config::RtcSettings> {
        use pi0d::config::{RtcSettings, Schedule};
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
pub(crate) fn with_rtc(
    batch: &mut pi0d::policy::pi0::infer::Batch,
    rtc: Option<pi0d::config::RtcSettings>,
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
        .map_err(|e| invalid(format!("{}: {}", inputs.display(), pi0d::errors::Chain(&e))))
}

pub(crate) fn infer(a: InferArgs) -> Outcome {
    check_writable(&a.output, "--output")?;
    let threads = a.threads.map_or_else(all_cores, usize::from);
    compute_threads(threads)?;
    let repeat = a.repeat as usize;
    let rtc = a.rtc();
    if a.activations && a.backend != Backend::Onnx {
        return Err(Failure::new(
            ExitReason::Usage,
            anyhow::anyhow!("--activations measures exported graphs on ONNX Runtime: it goes with --backend onnx (the CPU model's are printed by `pi0d export --calibration`)"),
        ));
    }
    match (a.backend, a.checkpoint, a.model_dir) {
        (Backend::Onnx | Backend::Acl, _, Some(dir)) => {
            let runtime = match a.backend {
                Backend::Acl => GraphBackend::Acl(pi0d::config::AclOptions {
                    library: a.acl_library,
                    device_id: a.device_id,
                }),
                _ => GraphBackend::Onnx {
                    options: pi0d::config::OnnxOptions {
                        library: a.onnx_library,
                        provider: provider(a.provider, a.device_id),
                        threads: a.threads.map_or(0, usize::from),
                    },
                    activations: a.activations,
                },
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

pub(crate) fn provider(p: Provider, device_id: i32) -> pi0d::config::ExecutionProvider {
    use pi0d::config::raw::ProviderKind;
    let kind = match p {
        Provider::Cpu => ProviderKind::Cpu,
        Provider::Cuda => ProviderKind::Cuda,
        Provider::Tensorrt => ProviderKind::Tensorrt,
        Provider::Cann => ProviderKind::Cann,
    };
    pi0d::config::ExecutionProvider::with_defaults(kind, device_id)
}

pub(crate) fn infer_cpu(
    checkpoint: &Path,
    arch: Option<&Path>,
    inputs: &Path,
    output: &Path,
    repeat: usize,
    threads: usize,
    rtc: Option<pi0d::config::RtcSettings>,
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

/// The runtime `pi0d infer` runs exported graphs on.
pub(crate) enum GraphBackend {
    /// With `activations`: measured per layer group (`--activations`).
    Onnx {
        options: pi0d::config::OnnxOptions,
        activations: bool,
    },
    Acl(pi0d::config::AclOptions),
}

pub(crate) fn infer_graphs(
    dir: &Path,
    inputs: &Path,
    output: &Path,
    repeat: usize,
    backend: &GraphBackend,
    rtc: Option<pi0d::config::RtcSettings>,
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
    if let Some(max) = m.trained_rtc {
        batch.condition_as_trained(max).map_err(|e| {
            Failure::new(
                ExitReason::InvalidInput,
                anyhow::anyhow!("{}: {}", inputs.display(), pi0d::errors::Chain(&e)),
            )
        })?;
    }
    with_rtc(&mut batch, rtc, inputs)?;
    let dtype = format!("{:?}", m.dtype).to_lowercase();
    let mut model = match backend {
        GraphBackend::Onnx {
            options,
            activations,
        } => {
            use pi0d::policy::graph::{load_onnx, load_onnx_probed};
            let load = if *activations {
                load_onnx_probed
            } else {
                load_onnx
            };
            classified(load(dir, m, options))?
        }
        GraphBackend::Acl(opts) => classified(pi0d::policy::graph::load_acl(dir, m, opts))?,
    };
    let mut last = None;
    for run in 0..repeat {
        let pre = std::time::Instant::now();
        let inputs = batch.graph_inputs();
        let preprocess_ms = pre.elapsed().as_secs_f64() * 1e3;
        let sampled = model.sample(&inputs);
        let probed = model.activations();
        // Over every run; said once, or before a failed run's error.
        if !probed.is_empty() && (sampled.is_err() || run + 1 == repeat) {
            crate::commands::export::print_activations(
                &probed,
                &format!("largest activations, {dtype} graphs on ONNX Runtime"),
            );
        }
        let (actions, t) = classified(sampled)?;
        let postprocess_ms = classified(infer::check_graph_actions(&actions, &batch))?;
        if repeat > 1 {
            let timing = infer::RunTiming {
                preprocess_ms,
                prefix_ms: t.prefix_ms,
                steps_ms: t.steps_ms,
                postprocess_ms,
                ..infer::RunTiming::default()
            }
            .summed();
            say(&runtime(serde_json::to_string(&timing))?);
        }
        last = Some(actions);
    }
    if let Some(actions) = last {
        classified(infer::write_actions(output, &batch, &actions))?;
    }
    Ok(())
}

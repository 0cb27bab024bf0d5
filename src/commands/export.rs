//! `pi0d export`: the model as static ONNX graphs (and, with ATC, Ascend .om files).

use std::path::PathBuf;

use anyhow::Context;

use clap::{Args, ValueEnum};

use pi0d::daemon::exit::ExitReason;
use pi0d::daemon::log::say;

use crate::{
    all_cores, check_parent_writable, classified, compute_threads, runtime, Failure, Outcome,
};

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Dtype {
    /// f32 weights and compute.
    F32,
    /// f16 weights and compute (norms and softmax stay f32).
    F16,
    /// bf16 weights, f32 compute.
    Bf16,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum QuantArg {
    /// int8 weights, one scale per output channel (DequantizeLinear + MatMul).
    W8,
    /// int4 weights in blocks of 32 inputs (com.microsoft MatMulNBits).
    W4,
}

#[derive(Args)]
pub(crate) struct ExportArgs {
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
    /// Weight and compute precision of the graphs.
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
    /// Store the linear layers' weights quantized as `pi0d quantize` does (vision, projector,
    /// language, expert; heads stay float), for ONNX Runtime. A checkpoint from
    /// `pi0d quantize` keeps its scheme without it.
    #[arg(long, value_enum, conflicts_with = "atc")]
    quant: Option<QuantArg>,
    /// With --quant w4: round a float checkpoint's int4 blocks to nearest, accepting what it
    /// loses (a checkpoint `pi0d quantize --calibration` wrote keeps its scheme without --quant).
    #[arg(long, requires = "quant")]
    round_to_nearest: bool,
    /// Print the ATC commands compiling the graphs for this SoC (e.g. Ascend310P1), and run
    /// them when `atc` is on the PATH.
    #[arg(long, value_name = "SOC")]
    atc: Option<String>,
    /// A recording (`[record]`) or `pi0d infer` inputs file (repeat the flag for several) to run
    /// the float model on: prints the largest activations per layer group against float16's
    /// range and the precision the graphs need; with --atc, also writes both graphs' inputs
    /// for ATC's int8 calibration.
    #[arg(long, value_name = "FILE")]
    calibration: Vec<PathBuf>,
}

pub(crate) fn export(a: ExportArgs) -> Outcome {
    if a.quant == Some(QuantArg::W4) && !a.round_to_nearest {
        return Err(Failure::new(
            ExitReason::Usage,
            anyhow::anyhow!("--quant w4 rounds the checkpoint's weights without calibration: {}. Quantize it with `pi0d quantize --scheme w4 --calibration FILE` and export that without --quant (it keeps its scheme), or add --round-to-nearest to accept that loss", crate::commands::quantize::W4_NEEDS_CALIBRATION),
        ));
    }
    use pi0d::policy::export::pi0::ExportDtype;
    use pi0d::policy::export::{atc, export, ExportOptions, ExternalData};
    use pi0d::policy::pi0::quant::Scheme;
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
        quant: a.quant.map(|q| match q {
            QuantArg::W8 => Scheme::W8,
            QuantArg::W4 => Scheme::W4,
        }),
        for_atc: a.atc.is_some(),
        progress: std::io::IsTerminal::is_terminal(&std::io::stderr()),
        calibration: a.calibration,
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
        "exported {} ({:?}{}, {} camera(s), batch {}, {} prompt tokens) to {}",
        m.variant,
        m.dtype,
        m.quant
            .map(|q| format!(", {q} weights"))
            .unwrap_or_default(),
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
    if !report.activations.is_empty() {
        print_activations(
            &report.activations,
            &format!(
                "largest activations on {} calibration file(s), f32 on the CPU",
                opts.calibration.len()
            ),
        );
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
        // ATC's calibration takes no `origin` precision: what it leaves in float runs in f16.
        if let (false, Some(fit @ (atc::F16Fit::Near { .. } | atc::F16Fit::Overflows { .. }))) = (
            report.atc_calibration.is_empty(),
            atc::F16Fit::of(&report.activations),
        ) {
            tracing::warn!(
                "ATC's int8 calibration compiles what it does not quantize in float16 (it takes no origin precision), and {}: the calibrated graphs may give infinities; compile these graphs without --calibration",
                fit.describe()
            );
        }
        // Each calibrated graph: its ATC configuration and AMCT's sample count beside it.
        let mut calibration: [Option<PathBuf>; 2] = [None, None];
        for (c, slot) in report.atc_calibration.iter().zip(&mut calibration) {
            use pi0d::policy::export::calibration;
            let folder = opts.out.join(calibration::DIR);
            let cfg = folder.join(format!("{}.cfg", c.graph.name()));
            let simple = folder.join(format!("{}_amct.cfg", c.graph.name()));
            for (path, text) in [
                (&simple, calibration::simple_config(c)),
                (&cfg, calibration::config(&opts.out, c, soc, &simple)),
            ] {
                runtime(
                    std::fs::write(path, text)
                        .with_context(|| format!("{}: cannot write it", path.display())),
                )?;
            }
            say(&format!(
                "  ATC int8 calibration of the {} graph: {} sample(s) of its {} input(s), {}",
                c.graph.name(),
                c.samples,
                c.inputs.len(),
                cfg.display()
            ));
            *slot = Some(cfg);
        }
        let [p, d] = &calibration;
        for cmd in atc::atc_commands(m, &opts.out, soc, [p.as_deref(), d.as_deref()]) {
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
        if have_atc {
            runtime(atc::record_compiled(&opts.out, soc).with_context(|| {
                format!(
                    "{}: cannot write it",
                    opts.out.join(atc::COMPILED_FILE).display()
                )
            }))?;
        } else {
            say(
                "(atc is not on the PATH: run the commands above on a machine with CANN's toolkit)",
            );
        }
    }
    Ok(ExitReason::Clean)
}

/// The largest activations per layer group against float16's range, and the precision the
/// graphs need.
pub(crate) fn print_activations(ranges: &[pi0d::policy::pi0::quant::ActivationRange], what: &str) {
    use pi0d::policy::export::atc;
    say(&format!("  {what} (float16 holds {}):", atc::F16_MAX));
    for r in ranges {
        // The projector and the heads have no norms: no residual stream of their own.
        let stream = match r.stream {
            s if s > 0.0 || s.is_nan() => format!("{s:>10.1}"),
            _ => format!("{:>10}", "-"),
        };
        say(&format!(
            "    {:<10} residual stream {stream}   linear inputs {:>10.1}   linear outputs {:>10.1}",
            r.group.name(),
            r.linear_in,
            r.linear_out
        ));
    }
    if let Some(fit) = atc::F16Fit::of(ranges) {
        say(&format!("  {}", fit.advice()));
    }
}

//! `pi0d quantize`: a checkpoint with its linear layers' weights in int8, int4 or bf16.

use std::path::PathBuf;

use clap::{Args, ValueEnum};

use pi0d::daemon::exit::ExitReason;
use pi0d::daemon::log::say;
use pi0d::policy::pi0::quant::{self, Group, QuantizeOptions, Scheme};

use crate::{check_parent_writable, classified, Failure, Outcome};

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum SchemeArg {
    /// int8 weights, one scale per output channel (about a quarter of f32).
    W8,
    /// int8 weights as w8, and int8 activations per token at run time (int8 products).
    W8a8,
    /// int4 weights in blocks along the input, one scale per block (about an eighth of f32).
    W4,
    /// bf16 weights (half of f32).
    Bf16,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum GroupArg {
    /// SigLIP's attention and MLP layers.
    Vision,
    /// The image tokens' projection.
    Projector,
    /// Gemma 2B's attention and MLP layers.
    Language,
    /// The action expert's layers (every denoising step).
    Expert,
    /// The state, action and time projections around the expert.
    Heads,
}

#[derive(Args)]
pub(crate) struct QuantizeArgs {
    /// Checkpoint directory (config.json + model.safetensors), f32, bf16 or f16.
    #[arg(long)]
    checkpoint: PathBuf,
    /// Output directory: the quantized checkpoint (written whole or not at all).
    #[arg(long)]
    out: PathBuf,
    /// How the weights are stored.
    #[arg(long, value_enum)]
    scheme: SchemeArg,
    /// w4: inputs per scale block (a power of two, 16 to 256). Weights whose input width is not
    /// a multiple of it are stored as w8.
    #[arg(long, default_value_t = 32)]
    block: usize,
    /// Layer groups to quantize, comma-separated (default: all but the heads).
    #[arg(long, value_enum, value_delimiter = ',')]
    groups: Vec<GroupArg>,
    /// Recordings made with [record] or `pi0d infer` inputs files (repeat the flag for
    /// several) to run the float model on: the integers are then rounded by GPTQ on what each
    /// layer saw, and its input channels scaled (SmoothQuant for w8a8, AWQ for w4 and w8)
    /// where that brings its quantized product nearer the float one on these inputs. w4 needs
    /// it (or --round-to-nearest); w8 and w8a8 gain from it. Not for bf16.
    #[arg(long, value_name = "FILE")]
    calibration: Vec<PathBuf>,
    /// w4 without calibration: every block rounded to nearest, accepting what it loses.
    #[arg(long, conflicts_with = "calibration")]
    round_to_nearest: bool,
}

/// Why w4 is not written without calibration unless asked: what it lost on the trained model.
pub(crate) const W4_NEEDS_CALIBRATION: &str = "int4 blocks rounded to nearest lose more than noise on a trained pi0 (the HIL suite's model: cosine 0.988 and 0.21 rad against f32, the closed-loop task lost; calibrated: 0.9996, docs/models.md)";

pub(crate) fn quantize(a: QuantizeArgs) -> Outcome {
    if a.scheme == SchemeArg::W4 && a.calibration.is_empty() && !a.round_to_nearest {
        return Err(Failure::new(
            ExitReason::Usage,
            anyhow::anyhow!("--scheme w4 without --calibration: {W4_NEEDS_CALIBRATION}. Give --calibration FILE (a recording made with [record] on the robot, or a `pi0d infer` inputs file), or --round-to-nearest to accept that loss"),
        ));
    }
    check_parent_writable(&a.out, "--out")?;
    let groups = if a.groups.is_empty() {
        Group::DEFAULT.to_vec()
    } else {
        a.groups
            .iter()
            .map(|g| match g {
                GroupArg::Vision => Group::Vision,
                GroupArg::Projector => Group::Projector,
                GroupArg::Language => Group::Language,
                GroupArg::Expert => Group::Expert,
                GroupArg::Heads => Group::Heads,
            })
            .collect()
    };
    let opts = QuantizeOptions {
        checkpoint: a.checkpoint,
        out: a.out,
        scheme: match a.scheme {
            SchemeArg::W8 => Scheme::W8,
            SchemeArg::W8a8 => Scheme::W8a8,
            SchemeArg::W4 => Scheme::W4,
            SchemeArg::Bf16 => Scheme::Bf16,
        },
        block: a.block,
        groups,
        calibration: a.calibration,
    };
    let m = classified(quant::quantize(&opts))?.manifest;
    let names = |g: &[Group]| {
        let v: Vec<&str> = g.iter().map(|g| g.name()).collect();
        if v.is_empty() {
            "none".to_string()
        } else {
            v.join(", ")
        }
    };
    say(&format!(
        "quantized {} linear weights to {}{} ({:.1} MB -> {:.1} MB) into {}",
        m.tensors,
        m.scheme,
        m.block
            .map(|b| format!(" in blocks of {b}"))
            .unwrap_or_default(),
        m.bytes_before as f64 / 1e6,
        m.bytes_after as f64 / 1e6,
        opts.out.display()
    ));
    say(&format!(
        "  quantized: {}; kept as they were: {}",
        names(&m.quantized_groups),
        names(&m.float_groups)
    ));
    if !m.calibration.is_empty() {
        say(&format!(
            "  calibrated on {} input file(s), {} observation(s): rounded by GPTQ; {} of {} layer inputs scaled ({} weights)",
            m.calibration.len(),
            m.observations,
            m.scaled_inputs(),
            m.smoothing.len(),
            m.smoothed
        ));
        if m.scheme == Scheme::W8a8 && m.observations < 2 {
            // The exponent search holds one fold of observations out; with one there is none.
            say("  one observation: SmoothQuant's scales were measured on the rows they were made from; calibrate on two or more observations to choose them on held-out ones");
        }
    }
    if !m.rotated.is_empty() {
        say(&format!(
            "  {} MLP down-projection(s) stored rotated (their inputs rotated before int8)",
            m.rotated.len()
        ));
    }
    if !m.stored_as_w8.is_empty() {
        say(&format!(
            "  {} weight(s) whose input width is not a multiple of {} stored as w8: {}",
            m.stored_as_w8.len(),
            m.block.unwrap_or_default(),
            m.stored_as_w8.join(", ")
        ));
    }
    Ok(ExitReason::Clean)
}

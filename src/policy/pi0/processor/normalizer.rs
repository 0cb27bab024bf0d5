//! The normalizer and unnormalizer steps resolved against their state file and the checkpoint:
//! which formula the state and the actions go through, as lerobot 0.6.1's `_NormalizationMixin`
//! picks it (the feature's type in `features` and `normalize_observation_keys` for observation
//! keys; `norm_map["ACTION"]` for actions; no stats for a key: passed through), and openpi's
//! `norm_stats.json` under openpi's formulas.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::{Context, ProcessorError, StepAt};
use crate::policy::pi0::checkpoint::CheckpointError;
use crate::policy::pi0::model::Variant;
use crate::policy::pi0::normalize::{openpi_stats, read_stats, Normalization, OPENPI_EPS};

/// lerobot's normalization modes (`NormalizationMode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum NormMode {
    Identity,
    MeanStd,
    MinMax,
    Quantiles,
    Quantile10,
}

impl NormMode {
    pub(crate) const NAMES: [&'static str; 5] =
        ["IDENTITY", "MEAN_STD", "MIN_MAX", "QUANTILES", "QUANTILE10"];

    pub(crate) fn parse(s: &str) -> Option<NormMode> {
        Some(match s {
            "IDENTITY" => NormMode::Identity,
            "MEAN_STD" => NormMode::MeanStd,
            "MIN_MAX" => NormMode::MinMax,
            "QUANTILES" => NormMode::Quantiles,
            "QUANTILE10" => NormMode::Quantile10,
            _ => return None,
        })
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            NormMode::Identity => "IDENTITY",
            NormMode::MeanStd => "MEAN_STD",
            NormMode::MinMax => "MIN_MAX",
            NormMode::Quantiles => "QUANTILES",
            NormMode::Quantile10 => "QUANTILE10",
        }
    }

    /// The two stats the mode reads.
    fn stats(self) -> Option<[&'static str; 2]> {
        match self {
            NormMode::Identity => None,
            NormMode::MeanStd => Some(["mean", "std"]),
            NormMode::MinMax => Some(["min", "max"]),
            NormMode::Quantiles => Some(["q01", "q99"]),
            NormMode::Quantile10 => Some(["q10", "q90"]),
        }
    }
}

/// A normalizer step's settings, as saved (`parse`).
pub(crate) struct Settings {
    pub(crate) eps: f32,
    /// Feature key -> its type (`STATE`, `VISUAL`, ...).
    pub(crate) features: BTreeMap<String, String>,
    /// Feature type -> mode.
    pub(crate) norm_map: BTreeMap<String, NormMode>,
    pub(crate) observation_keys: Option<Vec<String>>,
    pub(crate) state_file: Option<PathBuf>,
}

/// What a normalizer step does to the state and to the actions.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Normalize {
    pub(crate) at: StepAt,
    pub(crate) state: Normalization,
    pub(crate) action: Normalization,
    pub(crate) state_mode: NormMode,
    pub(crate) action_mode: NormMode,
    /// Where the stats came from.
    pub(crate) stats_file: Option<PathBuf>,
    pub(crate) eps: f32,
}

pub(crate) const STATE_KEY: &str = "observation.state";
pub(crate) const ACTION_KEY: &str = "action";
/// The tokenizer's outputs: in the observation from the tokenizer step on.
const LANGUAGE_KEYS: [&str; 2] = [
    "observation.language.tokens",
    "observation.language.attention_mask",
];

fn stat_error(at: &StepAt, message: String) -> ProcessorError {
    ProcessorError::Step {
        step: at.clone(),
        problem: message,
    }
}

/// The formula for `key` in `mode`, from `stats`: pass-through without any stat of the key (as
/// lerobot), refused when the mode's two stats are not both there (lerobot fails at the first
/// observation), checked to cover `width` values.
fn formula(
    at: &StepAt,
    file: &Path,
    key: &str,
    mode: NormMode,
    eps: f32,
    stats: &BTreeMap<String, Vec<f32>>,
    width: (usize, &str),
) -> Result<(Normalization, NormMode), ProcessorError> {
    let Some([a, b]) = mode.stats() else {
        return Ok((Normalization::Identity, mode));
    };
    let prefix = format!("{key}.");
    if !stats
        .keys()
        .any(|k| k.strip_prefix(&prefix).is_some_and(|s| !s.contains('.')))
    {
        return Ok((Normalization::Identity, NormMode::Identity));
    }
    let get = |s: &str| {
        stats.get(&format!("{key}.{s}")).cloned().ok_or_else(|| {
            stat_error(
                at,
                format!(
                    "{} normalization of `{key}` needs stat `{key}.{s}`, which {} does not hold",
                    mode.name(),
                    file.display()
                ),
            )
        })
    };
    let (lo, hi) = (get(a)?, get(b)?);
    let n = match mode {
        NormMode::MeanStd => Normalization::MeanStd {
            mean: lo,
            std: hi,
            eps,
            inverse_eps: 0.0,
        },
        _ => Normalization::Range {
            lo,
            hi,
            zero_range: eps,
            names: [a, b],
        },
    };
    n.check_width(file, key, width.0, width.1)?;
    Ok((n, mode))
}

/// A normalizer (`pre`) or unnormalizer step resolved against its state file.
pub(crate) fn resolve(
    at: &StepAt,
    s: Settings,
    ctx: &Context,
    pre: bool,
) -> Result<Normalize, ProcessorError> {
    let stats = match &s.state_file {
        Some(f) => read_stats(f)?.into_iter().collect(),
        None => BTreeMap::new(),
    };
    let file = s.state_file.clone().unwrap_or_else(|| at.file.clone());
    let w = ctx.widths;
    let state_width = format!("the state width, {}", w.source);
    let action_width = format!("the action width, {}", w.source);
    // An observation key's mode: its feature's type in the map, if the step normalizes it.
    let observed = |key: &str| -> NormMode {
        let selected = s
            .observation_keys
            .as_ref()
            .is_none_or(|keys| keys.iter().any(|k| k == key));
        match s.features.get(key) {
            Some(kind) if selected && kind != "ACTION" => {
                s.norm_map.get(kind).copied().unwrap_or(NormMode::Identity)
            }
            _ => NormMode::Identity,
        }
    };
    // The postprocessor's transition holds only the action.
    let (state, state_mode) = if pre {
        formula(
            at,
            &file,
            STATE_KEY,
            observed(STATE_KEY),
            s.eps,
            &stats,
            (w.state, &state_width),
        )?
    } else {
        (Normalization::Identity, NormMode::Identity)
    };
    let action_mode = s
        .norm_map
        .get("ACTION")
        .copied()
        .unwrap_or(NormMode::Identity);
    let (action, action_mode) = formula(
        at,
        &file,
        ACTION_KEY,
        action_mode,
        s.eps,
        &stats,
        (w.action, &action_width),
    )?;
    if pre {
        let inputs = ctx.cameras.iter().map(String::as_str).chain(LANGUAGE_KEYS);
        for key in inputs {
            let mode = observed(key);
            let has = stats.keys().any(|k| k.starts_with(&format!("{key}.")));
            if mode != NormMode::Identity && has {
                return Err(stat_error(
                    at,
                    format!(
                        "normalizes `{key}` ({}): pi0d feeds the model's images and tokens as lerobot's pi0 takes them, not normalized by a processor step",
                        mode.name()
                    ),
                ));
            }
        }
    }
    Ok(Normalize {
        at: at.clone(),
        state,
        action,
        state_mode,
        action_mode,
        stats_file: s.state_file,
        eps: s.eps,
    })
}

/// openpi's `norm_stats.json` as a normalizer (state) and an unnormalizer (actions), with
/// openpi's formulas: pi0 MEAN_STD, pi0.5 QUANTILES.
pub(crate) fn openpi(path: &Path, ctx: &Context) -> Result<(Normalize, Normalize), ProcessorError> {
    let stats = openpi_stats(path)?;
    let mode = match ctx.variant {
        Variant::Pi0 => NormMode::MeanStd,
        Variant::Pi05 => NormMode::Quantiles,
    };
    let w = ctx.widths;
    let one = |key: &str, width: usize, what: &str| -> Result<Normalization, CheckpointError> {
        let get = |s: &str| {
            stats
                .get(&format!("{key}.{s}"))
                .cloned()
                .ok_or_else(|| CheckpointError::File {
                    path: path.into(),
                    message: format!(
                        "{} normalization of `{key}` needs stat `{key}.{s}`",
                        mode.name()
                    ),
                })
        };
        let n = match mode {
            NormMode::MeanStd => Normalization::MeanStd {
                mean: get("mean")?,
                std: get("std")?,
                eps: OPENPI_EPS,
                inverse_eps: OPENPI_EPS,
            },
            _ => Normalization::OpenpiQuantiles {
                q01: get("q01")?,
                q99: get("q99")?,
            },
        };
        n.check_width(path, key, width, &format!("the {what} width, {}", w.source))?;
        Ok(n)
    };
    let at = StepAt {
        file: path.to_path_buf(),
        index: 0,
        name: "openpi Normalize".into(),
    };
    let state = one(STATE_KEY, w.state, "state")?;
    let action = one(ACTION_KEY, w.action, "action")?;
    let make = |at: StepAt, state, action| Normalize {
        at,
        state,
        action,
        state_mode: mode,
        action_mode: mode,
        stats_file: Some(path.to_path_buf()),
        eps: OPENPI_EPS,
    };
    Ok((
        make(at.clone(), state, action.clone()),
        make(
            StepAt {
                name: "openpi Unnormalize".into(),
                ..at
            },
            Normalization::Identity,
            action,
        ),
    ))
}

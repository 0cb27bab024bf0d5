//! The processor in words, step by step as it will run (`pi0d check`).

use super::normalizer::{NormMode, Normalize};
use super::{Origin, Padding, PostStep, PreStep, Processor, TokenizerStep};
use crate::policy::pi0::normalize::Normalization;

fn mode(m: NormMode, n: &Normalize) -> String {
    match m {
        NormMode::Identity => "passed through (IDENTITY, or no stats for it)".into(),
        _ => format!(
            "{}{}",
            m.name(),
            match &n.stats_file {
                Some(f) => format!(
                    " (stats from {}, eps {:e})",
                    f.file_name().map_or(f.display().to_string(), |s| s
                        .to_string_lossy()
                        .into_owned()),
                    n.eps
                ),
                None => String::new(),
            }
        ),
    }
}

fn tokenizer(t: &TokenizerStep) -> String {
    let padding = match (t.padding, t.left) {
        (Padding::MaxLength, false) => format!("padded after it to {}", t.max_length),
        (Padding::MaxLength, true) => format!("padded before it to {}", t.max_length),
        (Padding::Longest | Padding::None, _) => "not padded".into(),
    };
    let cut = if t.truncation {
        format!("cut to {} tokens", t.max_length)
    } else {
        "never cut (a longer prompt is refused)".into()
    };
    let hub = t
        .hub_name
        .as_ref()
        .map(|h| {
            format!("; lerobot loads `{h}` from the hub, pi0d the checkpoint's tokenizer.json")
        })
        .unwrap_or_default();
    format!("the prompt tokenized, {cut}, {padding}{hub}")
}

/// "6 joints (a, b, ...), gripper absolute" for a relative mask.
pub(crate) fn relative_words(mask: &[bool], names: &[String]) -> String {
    let name = |i: usize| {
        names
            .get(i)
            .cloned()
            .unwrap_or_else(|| format!("action {i}"))
    };
    let rel: Vec<String> = (0..mask.len()).filter(|i| mask[*i]).map(name).collect();
    let abs: Vec<String> = (0..mask.len()).filter(|i| !mask[*i]).map(name).collect();
    let mut s = format!(
        "actions relative to the observed joint state for {} of {} ({})",
        rel.len(),
        mask.len(),
        rel.join(", ")
    );
    if !abs.is_empty() {
        s += &format!(", {} absolute", abs.join(", "));
    }
    s
}

pub(crate) fn lines(p: &Processor, config_names: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    let mask = p.relative_mask();
    let names: &[String] = match p.relative_actions().and_then(|r| r.action_names.as_ref()) {
        Some(n) if !n.is_empty() => n,
        _ => config_names,
    };
    out.push(match p.relative_actions() {
        Some(r) => {
            let mut s = format!("processing: {}", relative_words(&mask, names));
            if r.action_names.is_none() && !r.exclude_joints.is_empty() {
                s += &format!(
                    " (the step names no actions, so its exclude_joints {:?} match none, as in lerobot)",
                    r.exclude_joints
                );
            }
            s
        }
        None => match &p.origin {
            Origin::Openpi(_) => "processing: actions absolute (the model's unnormalized output). This is an openpi checkpoint, and openpi keeps delta actions in its training config, not in the checkpoint: if the model was trained with them (openpi's DROID, ALOHA and LIBERO configs are), declare them as that config's make_bool_mask does, e.g. policy.openpi_delta_actions = [6, -1]".into(),
            Origin::Lerobot { .. } => "processing: actions absolute (the model's unnormalized output)".into(),
        },
    });
    let (pre, post) = match &p.origin {
        Origin::Lerobot { pre, post } => (pre.display().to_string(), post.display().to_string()),
        Origin::Openpi(f) => {
            let f = format!("openpi's transforms with {}", f.display());
            (f.clone(), f)
        }
    };
    out.push(format!("  preprocessor ({pre}):"));
    for (i, s) in p.pre.iter().enumerate() {
        let what = match s {
            PreStep::Rename(m) if m.is_empty() => "rename_observations_processor: no renames".into(),
            PreStep::Rename(m) => format!(
                "rename_observations_processor: {}",
                m.iter()
                    .map(|(a, b)| format!("{a} -> {b}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            PreStep::Batch => "to_batch_processor: one observation at a time".into(),
            PreStep::NewLine => "newline: \"\\n\" after the task unless it ends with one".into(),
            PreStep::Tokenizer(t) => format!("tokenizer_processor: {}", tokenizer(t)),
            PreStep::Device => "device_processor: values unchanged".into(),
            PreStep::Relative(r) if r.enabled => "relative_actions_processor (enabled): keeps the observation's state for the absolute step".into(),
            PreStep::Relative(_) => "relative_actions_processor: disabled (the model acts in absolute positions)".into(),
            PreStep::Normalizer(n) => format!(
                "{}: state {}",
                n.at.name,
                mode(n.state_mode, n)
            ),
            PreStep::StateInPrompt => {
                "pi0.5 state in the prompt: \"Task: ..., State: <256 bins>;\\nAction: \"".into()
            }
        };
        out.push(format!("    {i} {what}"));
    }
    out.push(format!("  postprocessor ({post}):"));
    for (i, s) in p.post.iter().enumerate() {
        let what = match s {
            PostStep::Unnormalizer(n) => {
                format!("{}: actions {}", n.at.name, mode(n.action_mode, n))
            }
            PostStep::Absolute { enabled: true, .. } => format!(
                "absolute_actions_processor: adds the observation's state to {} of {} actions",
                mask.iter().filter(|m| **m).count(),
                mask.len()
            ),
            PostStep::Absolute { .. } => "absolute_actions_processor: disabled".into(),
            PostStep::Device => "device_processor: values unchanged".into(),
        };
        out.push(format!("    {i} {what}"));
    }
    if let Some(n) = p.pre.iter().find_map(|s| match s {
        PreStep::Normalizer(n) => Some(n),
        _ => None,
    }) {
        if matches!(n.state, Normalization::Identity) && n.state_mode == NormMode::Identity {
            out.push("  note: the state reaches the model unnormalized (no stats or IDENTITY for it), as lerobot runs it".into());
        }
    }
    out
}

//! The pipeline's observations on exported graphs: the manifest checked against the
//! checkpoint, observations run in groups of the graphs' batch, real-time chunking as guidance.

use std::path::Path;

use super::{PipelineError, Prepared};
use crate::policy::graph::manifest::Manifest;
use crate::policy::graph::{GraphInputs, GraphModel, GraphRuntime};
use crate::policy::pi0::infer::BatchParts;
use crate::policy::pi0::model::{Arch, Timing, Variant};
use crate::policy::rtc::{CleanPrefix, Conditioning, Guidance};

/// Graphs exported from a different model than the checkpoint would compute garbage.
pub(super) fn check_manifest(m: &Manifest, a: &Arch, dir: &Path) -> Result<(), PipelineError> {
    let variant = if a.variant == Variant::Pi05 {
        "pi05"
    } else {
        "pi0"
    };
    let mismatch = [
        ("variant", m.variant != variant),
        ("chunk", m.chunk != a.chunk),
        ("action_dim", m.action_dim != a.action_dim),
        ("state_dim", m.state_dim != a.state_dim),
        ("layers", m.layers != a.layers),
        ("expert_width", m.expert_width != a.expert_width),
        ("image_size", m.image_size != a.image_size),
        ("vocab", m.vocab != a.vocab),
    ];
    match mismatch.iter().find(|(_, bad)| *bad) {
        Some((field, _)) => Err(PipelineError::Input(format!(
            "{}: `{field}` does not match the checkpoint (exported from another model? re-run pi0d export)",
            dir.join(crate::policy::graph::manifest::FILE).display()
        ))),
        None => Ok(()),
    }
}

/// Runs observations on graphs exported for batch N: groups of up to N, the rest of the batch
/// filled with copies of the group's last observation (their actions are dropped). Actions
/// `[N, chunk, action_dim]`.
pub(super) fn sample_graphs(
    g: &mut GraphModel<Box<dyn GraphRuntime>>,
    group: &[(&Prepared, Option<&Conditioning>)],
) -> Result<(Vec<f32>, Timing), PipelineError> {
    let b = g.manifest.batch.max(1);
    let Some(last) = group.last() else {
        return Err(PipelineError::Input("nothing to run".into()));
    };
    let padded: Vec<&(&Prepared, Option<&Conditioning>)> = group
        .iter()
        .chain(std::iter::repeat(last))
        .take(b)
        .collect();
    let prepared: Vec<&Prepared> = padded.iter().map(|(p, _)| *p).collect();
    let parts = concat(&prepared);
    // Guidance for all or none: an unguided one among guided ones gets zero weights; likewise
    // a clamped prefix, an element without one none (delay 0).
    let guided = padded
        .iter()
        .any(|(_, c)| matches!(c, Some(Conditioning::Guided(_))));
    let guidance: Vec<Guidance> = if guided {
        padded
            .iter()
            .map(|(_, c)| {
                c.and_then(Conditioning::guidance)
                    .cloned()
                    .unwrap_or_else(|| Guidance::none(g.manifest.chunk, g.manifest.action_dim))
            })
            .collect()
    } else {
        Vec::new()
    };
    let trained = padded
        .iter()
        .any(|(_, c)| matches!(c, Some(Conditioning::Trained(_))));
    let clean: Vec<CleanPrefix> = if trained {
        padded
            .iter()
            .map(|(_, c)| c.and_then(Conditioning::clean).cloned().unwrap_or_default())
            .collect()
    } else {
        Vec::new()
    };
    let (x, t) = g.sample(&GraphInputs {
        images: parts.images.iter().map(Vec::as_slice).collect(),
        image_masks: parts.image_masks,
        tokens: &parts.tokens,
        token_masks: &parts.token_masks,
        state: &parts.state,
        noise: &parts.noise,
        guidance: &guidance,
        clean: &clean,
    })?;
    Ok((
        x,
        Timing {
            prefix_ms: t.prefix_ms,
            steps_ms: t.steps_ms,
        },
    ))
}

/// Observations' inputs side by side, as a batch holds them.
pub(super) fn concat(all: &[&Prepared]) -> BatchParts {
    let cameras = all.first().map_or(0, |p| p.images.len());
    let cat = |f: &dyn Fn(&Prepared) -> &[f32]| -> Vec<f32> {
        all.iter().flat_map(|p| f(p).iter().copied()).collect()
    };
    BatchParts {
        batch: all.len(),
        images: (0..cameras)
            .map(|c| {
                all.iter()
                    .flat_map(|p| p.images[c].iter().copied())
                    .collect()
            })
            .collect(),
        image_masks: (0..cameras)
            .map(|c| all.iter().map(|p| p.masks[c]).collect())
            .collect(),
        tokens: all.iter().flat_map(|p| p.tokens.iter().copied()).collect(),
        token_masks: all
            .iter()
            .flat_map(|p| p.token_masks.iter().copied())
            .collect(),
        state: cat(&|p| &p.state),
        noise: cat(&|p| &p.noise),
    }
}

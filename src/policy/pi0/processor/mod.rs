//! What a checkpoint does between the observation and the model, and between the model and the
//! command: lerobot's processor pipelines (`policy_preprocessor.json`,
//! `policy_postprocessor.json`) as ordered, typed steps, or openpi's transforms for a
//! checkpoint with `norm_stats.json`. Every step is run in its file's order, with its
//! settings; a step or setting pi0d does not compute exactly refuses the checkpoint at load
//! (`parse`), so nothing of a checkpoint is ever silently left out.
//!
//! The steps that matter to the numbers: camera and state keys renamed before the cameras are
//! bound; the task given a trailing newline; tokenized with the step's length, padding and
//! truncation; the state normalized (and, for pi0.5, written into the prompt); the model's
//! actions unnormalized; and relative actions made absolute by adding the state of the
//! observation the chunk came from.

mod describe;
#[cfg(test)]
mod golden_tests;
mod normalizer;
mod parse;
pub(crate) mod prompt;
pub(crate) mod relative;
#[cfg(test)]
mod tests;
pub(crate) mod tokenize;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::checkpoint::CheckpointError;
use super::model::Variant;
use super::normalize::Widths;
pub(crate) use normalizer::Normalize;
use relative::{Offsets, RelativeStep};
pub(crate) use tokenize::{Padding, TokenizerStep};

/// A step of a pipeline file, for messages: "FILE, step 5 (`normalizer_processor`)".
#[derive(Clone, Debug, PartialEq)]
pub struct StepAt {
    pub(crate) file: PathBuf,
    pub(crate) index: usize,
    pub(crate) name: String,
}

impl std::fmt::Display for StepAt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}, step {} (`{}`)",
            crate::outside::path(&self.file),
            self.index,
            crate::outside::text(&self.name).cap(128)
        )
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ProcessorError {
    #[error("{step}: {problem}")]
    Step { step: StepAt, problem: String },
    #[error("{step}: setting `{setting}`: {problem}")]
    Setting {
        step: StepAt,
        setting: String,
        problem: String,
    },
    #[error("{file}: {problem}")]
    Pipeline { file: PathBuf, problem: String },
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
}

/// A preprocessor step, in the order its file gives.
#[derive(Clone, Debug)]
pub(crate) enum PreStep {
    /// `rename_observations_processor`: observation keys renamed before anything reads them.
    Rename(BTreeMap<String, String>),
    /// `to_batch_processor`: adds the batch dimension (pi0d's observations are one each).
    Batch,
    /// `pi0_new_line_processor` / `smolvla_new_line_processor`: "\n" appended to the task
    /// unless it ends with one.
    NewLine,
    Tokenizer(TokenizerStep),
    /// `device_processor` without a cast: moves tensors, changes no value.
    Device,
    /// `relative_actions_processor`: keeps the state as it is here, for the absolute step.
    Relative(RelativeStep),
    Normalizer(Box<Normalize>),
    /// `pi05_prepare_state_tokenizer_processor_step`: the task becomes pi0.5's prompt with the
    /// state (as it is at this step) discretized into it.
    StateInPrompt,
}

/// A postprocessor step, in order.
#[derive(Clone, Debug)]
pub(crate) enum PostStep {
    Unnormalizer(Box<Normalize>),
    /// `absolute_actions_processor`: adds the kept state to the relative dimensions.
    Absolute {
        enabled: bool,
        at: StepAt,
    },
    Device,
}

/// Where the steps came from.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Origin {
    Lerobot {
        pre: PathBuf,
        post: PathBuf,
    },
    /// openpi's `norm_stats.json`, with openpi's transforms for the variant.
    Openpi(PathBuf),
}

/// What the processor needs to know of the checkpoint to check its steps against it.
pub(crate) struct Context<'a> {
    pub(crate) dir: &'a Path,
    pub(crate) variant: Variant,
    pub(crate) widths: &'a Widths,
    /// The model's camera keys (`observation.images.<name>`).
    pub(crate) cameras: &'a [String],
    /// config.json's `use_relative_actions` (lerobot writes it beside the steps).
    pub(crate) use_relative_actions: Option<bool>,
    /// The prompt length when no tokenizer step gives one (openpi).
    pub(crate) default_prompt_len: usize,
    /// The configuration's declaration of an openpi checkpoint's delta actions.
    pub(crate) openpi_delta_actions: Option<&'a [bool]>,
}

/// The checkpoint's processing, loaded and checked.
#[derive(Clone, Debug)]
pub(crate) struct Processor {
    pub(crate) pre: Vec<PreStep>,
    pub(crate) post: Vec<PostStep>,
    pub(crate) origin: Origin,
    /// Actions per step, which the relative mask is built for.
    action_dim: usize,
}

/// A prompt's text into token ids and mask, with a tokenizer step's settings.
pub(crate) type Tokenize<'a, E> =
    dyn FnMut(&str, &TokenizerStep) -> Result<(Vec<i64>, Vec<bool>), E> + 'a;

/// One observation through the preprocessor: what the model takes, and the state the
/// postprocessor makes relative actions absolute against.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Preprocessed {
    /// The state as the steps leave it (normalized), not yet padded.
    pub(crate) state: Vec<f32>,
    pub(crate) tokens: Vec<i64>,
    pub(crate) token_masks: Vec<bool>,
    /// The state kept by the relative step (the observation's, in robot units).
    pub(crate) reference: Option<Vec<f32>>,
}

pub(crate) const IMAGE_PREFIX: &str = "observation.images.";
pub(crate) const PRE_FILE: &str = "policy_preprocessor.json";
pub(crate) const POST_FILE: &str = "policy_postprocessor.json";
pub(crate) const OPENPI_FILE: &str = "norm_stats.json";

impl Processor {
    /// The checkpoint directory's pipelines, else openpi's `norm_stats.json` with openpi's
    /// transforms, else `None` (nothing says how to normalize).
    pub(crate) fn load(ctx: &Context) -> Result<Option<Processor>, ProcessorError> {
        let (pre, post) = (ctx.dir.join(PRE_FILE), ctx.dir.join(POST_FILE));
        let p = match (pre.exists(), post.exists()) {
            (true, true) if ctx.openpi_delta_actions.is_some() => {
                return Err(ProcessorError::Pipeline {
                    file: pre,
                    problem: "policy.openpi_delta_actions is for openpi checkpoints (norm_stats.json); this checkpoint's own relative_actions_processor says whether its actions are relative".into(),
                })
            }
            (true, true) => Processor {
                pre: parse::preprocessor(&pre, ctx)?,
                post: parse::postprocessor(&post, ctx)?,
                origin: Origin::Lerobot { pre, post },
                action_dim: ctx.widths.action,
            },
            (true, false) | (false, true) => {
                let (have, missing) = if pre.exists() {
                    (pre, POST_FILE)
                } else {
                    (post, PRE_FILE)
                };
                return Err(ProcessorError::Pipeline {
                    file: have,
                    problem: format!("{missing} is missing beside it: lerobot saves both, and pi0d runs both or neither"),
                });
            }
            (false, false) => {
                let openpi = ctx.dir.join(OPENPI_FILE);
                if !openpi.exists() {
                    return Ok(None);
                }
                Processor::openpi(&openpi, ctx)?
            }
        };
        p.check(ctx)?;
        Ok(Some(p))
    }

    /// openpi's transforms for a checkpoint it trained: normalize (its formulas), the prompt
    /// (pi0: task and "\n"; pi0.5: the state in the prompt), unnormalize.
    fn openpi(path: &Path, ctx: &Context) -> Result<Processor, ProcessorError> {
        let (state, action) = normalizer::openpi(path, ctx)?;
        let tokenizer = PreStep::Tokenizer(TokenizerStep::fixed(ctx.default_prompt_len));
        let at = |name: &str| StepAt {
            file: path.to_path_buf(),
            index: 0,
            name: name.into(),
        };
        let mut pre = Vec::new();
        let mut post = vec![PostStep::Unnormalizer(Box::new(action))];
        // openpi's DeltaActions before Normalize, AbsoluteActions after Unnormalize: the state
        // added back is the normalized state unnormalized again (its outputs carry it so).
        let delta = match ctx.openpi_delta_actions {
            Some(mask) => {
                let w = ctx.widths;
                if mask.len() > w.action.min(w.state) {
                    return Err(ProcessorError::Pipeline {
                        file: path.to_path_buf(),
                        problem: format!(
                            "policy.openpi_delta_actions covers {} dimensions, but the actions have {} and the state {} ({})",
                            mask.len(),
                            w.action,
                            w.state,
                            w.source
                        ),
                    });
                }
                Some(RelativeStep {
                    enabled: true,
                    exclude_joints: Vec::new(),
                    action_names: None,
                    openpi: Some(relative::OpenpiDelta {
                        mask: mask.to_vec(),
                        state: state.state.clone(),
                    }),
                })
            }
            None => None,
        };
        pre.push(PreStep::Normalizer(Box::new(state)));
        if let Some(d) = delta {
            pre.insert(0, PreStep::Relative(d));
            post.push(PostStep::Absolute {
                enabled: true,
                at: at("openpi AbsoluteActions"),
            });
        }
        match ctx.variant {
            Variant::Pi0 => pre.extend([PreStep::NewLine, tokenizer]),
            Variant::Pi05 => pre.extend([PreStep::StateInPrompt, tokenizer]),
        }
        Ok(Processor {
            pre,
            post,
            origin: Origin::Openpi(path.to_path_buf()),
            action_dim: ctx.widths.action,
        })
    }

    /// The steps against each other and against the checkpoint: what lerobot could not run,
    /// or would run in a way its training cannot have meant, is refused.
    fn check(&self, ctx: &Context) -> Result<(), ProcessorError> {
        let file = match &self.origin {
            Origin::Lerobot { pre, .. } => pre.clone(),
            Origin::Openpi(p) => p.clone(),
        };
        if self.tokenizer().is_none() {
            return Err(ProcessorError::Pipeline {
                file,
                problem: "no tokenizer_processor step: the model takes the prompt as tokens".into(),
            });
        }
        let relative = self.relative();
        let absolute = self.post.iter().find_map(|s| match s {
            PostStep::Absolute { enabled: true, at } => Some(at),
            _ => None,
        });
        let post_file = match &self.origin {
            Origin::Lerobot { post, .. } => post.clone(),
            Origin::Openpi(p) => p.clone(),
        };
        match (relative, absolute) {
            (None, Some(at)) => {
                return Err(ProcessorError::Step {
                    step: at.clone(),
                    problem: format!("adds the observed state to the actions, but {} has no relative_actions_processor to keep it (lerobot refuses this at its first chunk)", file.display()),
                })
            }
            (Some(r), Some(at)) if !r.enabled => {
                return Err(ProcessorError::Step {
                    step: at.clone(),
                    problem: format!("adds the observed state to the actions, but the preprocessor's relative_actions_processor is disabled: the model was trained on absolute actions ({})", file.display()),
                })
            }
            (Some(r), None) if r.enabled => {
                return Err(ProcessorError::Pipeline {
                    file: post_file,
                    problem: "the preprocessor's relative_actions_processor is enabled (the model predicts actions relative to the state) but no enabled absolute_actions_processor adds the state back: every action would be an offset commanded as a position".into(),
                })
            }
            _ => {}
        }
        let state = self.renamed(normalizer::STATE_KEY);
        if state != normalizer::STATE_KEY {
            return Err(ProcessorError::Pipeline {
                file,
                problem: format!(
                    "its rename_map renames {} to `{state}`: the model would get no state",
                    normalizer::STATE_KEY
                ),
            });
        }
        let enabled = self.relative_actions().is_some();
        let lerobot = matches!(self.origin, Origin::Lerobot { .. });
        if let Some(cfg) = ctx
            .use_relative_actions
            .filter(|c| lerobot && *c != enabled)
        {
            return Err(ProcessorError::Pipeline {
                file,
                problem: format!(
                    "{}/config.json says use_relative_actions = {cfg}, but the steps {}: which one the model was trained with cannot be told",
                    ctx.dir.display(),
                    if enabled { "make actions relative" } else { "keep actions absolute" }
                ),
            });
        }
        if enabled && ctx.widths.state < ctx.widths.action {
            return Err(ProcessorError::Pipeline {
                file,
                problem: format!(
                    "relative actions add the state to the actions dimension by dimension, but the state has {} values and the actions {} ({})",
                    ctx.widths.state, ctx.widths.action, ctx.widths.source
                ),
            });
        }
        Ok(())
    }

    /// The first relative step (the one lerobot pairs the absolute step with).
    fn relative(&self) -> Option<&RelativeStep> {
        self.pre.iter().find_map(|s| match s {
            PreStep::Relative(r) => Some(r),
            _ => None,
        })
    }

    /// The relative step, when the postprocessor makes actions absolute with it.
    pub(crate) fn relative_actions(&self) -> Option<&RelativeStep> {
        let absolute = self
            .post
            .iter()
            .any(|s| matches!(s, PostStep::Absolute { enabled: true, .. }));
        self.relative().filter(|_| absolute)
    }

    /// Which action dimensions are relative (all false for absolute actions).
    pub(crate) fn relative_mask(&self) -> Vec<bool> {
        match self.relative_actions() {
            Some(r) => r.mask(self.action_dim),
            None => vec![false; self.action_dim],
        }
    }

    /// The last tokenizer step (the tokens the model sees are its).
    pub(crate) fn tokenizer(&self) -> Option<&TokenizerStep> {
        self.pre.iter().rev().find_map(|s| match s {
            PreStep::Tokenizer(t) => Some(t),
            _ => None,
        })
    }

    /// Prompt tokens the model must take (the tokenizer step's length).
    pub(crate) fn prompt_len(&self) -> usize {
        self.tokenizer().map_or(0, |t| t.max_length)
    }

    /// An observation key as the steps rename it.
    pub(crate) fn renamed(&self, key: &str) -> String {
        let mut k = key.to_string();
        for s in &self.pre {
            if let PreStep::Rename(map) = s {
                if let Some(to) = map.get(&k) {
                    k = to.clone();
                }
            }
        }
        k
    }

    /// The state as the first relative step keeps it (the state the absolute step adds), for
    /// an observation whose raw state is `state`; `None` without a relative step.
    pub(crate) fn reference(&self, state: &[f32]) -> Option<Vec<f32>> {
        let mut s = state.to_vec();
        for step in &self.pre {
            match step {
                PreStep::Relative(r) => return Some(r.kept(&s)),
                PreStep::Normalizer(n) => n.state.normalize(&mut s),
                _ => {}
            }
        }
        None
    }

    /// The robot's camera names that the steps rename to another name (`top` -> `cam_high`),
    /// as `observation.images.<name>` keys are renamed.
    pub(crate) fn camera_renames(&self) -> BTreeMap<String, String> {
        let mut out = BTreeMap::new();
        for step in &self.pre {
            let PreStep::Rename(map) = step else {
                continue;
            };
            for key in map.keys() {
                let Some(name) = key.strip_prefix(IMAGE_PREFIX) else {
                    continue;
                };
                let to = self.renamed(key);
                if to != *key {
                    let to = to.strip_prefix(IMAGE_PREFIX).unwrap_or(&to).to_string();
                    out.insert(name.to_string(), to);
                }
            }
        }
        out
    }

    /// The key a robot sends for the model's input `key`: the one key the steps rename to it,
    /// else `key` itself.
    pub(crate) fn source_key(&self, key: &str) -> String {
        let mut sources = self.pre.iter().flat_map(|s| match s {
            PreStep::Rename(m) => m
                .keys()
                .filter(|k| self.renamed(k) == key && *k != key)
                .collect(),
            _ => Vec::new(),
        });
        match (sources.next(), sources.next()) {
            (Some(k), None) => k.clone(),
            _ => key.to_string(),
        }
    }

    /// Runs the preprocessor on one observation: `state` in robot units, `task` the prompt.
    /// `tokenize` turns the text at a tokenizer step into ids and mask.
    pub(crate) fn preprocess<E>(
        &self,
        state: &[f32],
        task: &str,
        tokenize: &mut Tokenize<'_, E>,
    ) -> Result<Preprocessed, E> {
        let mut s = state.to_vec();
        let mut text = task.to_string();
        let mut tokens = (Vec::new(), Vec::new());
        let mut reference = None;
        for step in &self.pre {
            match step {
                PreStep::Rename(_) | PreStep::Batch | PreStep::Device => {}
                PreStep::NewLine => {
                    if !text.ends_with('\n') {
                        text.push('\n');
                    }
                }
                PreStep::Tokenizer(t) => tokens = tokenize(&text, t)?,
                PreStep::Relative(r) => {
                    // lerobot keeps the latest state at every relative step; the absolute step
                    // reads the first relative step's.
                    if reference.is_none() {
                        reference = Some(r.kept(&s));
                    }
                }
                PreStep::Normalizer(n) => n.state.normalize(&mut s),
                PreStep::StateInPrompt => text = prompt::pi05_prompt(&text, &s),
            }
        }
        Ok(Preprocessed {
            state: s,
            tokens: tokens.0,
            token_masks: tokens.1,
            reference,
        })
    }

    /// Runs the postprocessor on the model's actions (`rows` of `action_dim`, already cut to
    /// the robot's width), with the state the preprocessor kept.
    pub(crate) fn postprocess(&self, rows: &mut [f32], reference: Option<&[f32]>) {
        let mask = self.relative_mask();
        for step in &self.post {
            match step {
                PostStep::Unnormalizer(n) => {
                    for row in rows.chunks_exact_mut(self.action_dim) {
                        n.action.unnormalize(row);
                    }
                }
                PostStep::Absolute { enabled: true, .. } => {
                    // `check` refuses an enabled absolute step without a relative one, whose
                    // state is always kept.
                    if let Some(state) = reference {
                        let o = Offsets { mask: &mask, state };
                        rows.chunks_exact_mut(self.action_dim)
                            .for_each(|r| o.to_absolute(r));
                    }
                }
                PostStep::Absolute { .. } | PostStep::Device => {}
            }
        }
    }

    /// The running chunk's leftover (robot units, absolute) in the model's action space, for
    /// real-time chunking. With relative actions exactly as lerobot re-anchors it
    /// (`policies/rtc/relative.py`): made relative to the new observation's kept state, then
    /// normalized by the preprocessor's normalizer. Otherwise the postprocessor undone.
    pub(crate) fn leftover_to_model(&self, rows: &mut [f32], reference: Option<&[f32]>) {
        let width = self.action_dim;
        if self.relative_actions().is_some() {
            let mask = self.relative_mask();
            if let Some(state) = reference {
                let o = Offsets { mask: &mask, state };
                rows.chunks_exact_mut(width).for_each(|r| o.to_relative(r));
            }
            let first = self.pre.iter().find_map(|s| match s {
                PreStep::Normalizer(n) => Some(n),
                _ => None,
            });
            if let Some(n) = first {
                rows.chunks_exact_mut(width)
                    .for_each(|r| n.action.normalize(r));
            }
            return;
        }
        for step in self.post.iter().rev() {
            if let PostStep::Unnormalizer(n) = step {
                rows.chunks_exact_mut(width)
                    .for_each(|r| n.action.normalize(r));
            }
        }
    }

    /// The pipeline as it will run, in words (`pi0d check`).
    pub(crate) fn describe(&self, action_names: &[String]) -> Vec<String> {
        describe::lines(self, action_names)
    }
}

/// The prompt length a checkpoint directory's tokenizer step gives, when it has lerobot's
/// pipeline (for `pi0d export`, which sizes the graphs before any observation).
pub(crate) fn saved_prompt_len(dir: &Path) -> Result<Option<usize>, ProcessorError> {
    let pre = dir.join(PRE_FILE);
    if !pre.exists() {
        return Ok(None);
    }
    parse::tokenizer_length(&pre)
}

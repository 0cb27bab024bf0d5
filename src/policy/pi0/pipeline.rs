//! The whole policy path around the model, as the checkpoint's processor steps do it
//! (`processor`): camera frames to model input, the state and prompt through the preprocessor
//! (normalization, pi0.5's state in the prompt, tokenization with a local `tokenizer.json`),
//! the model, action slicing and the postprocessor (unnormalization, relative actions made
//! absolute).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokenizers::Tokenizer;

use super::checkpoint::{ArchOverrides, Checkpoint, CheckpointError, PolicyConfigJson};
use super::infer::{check_actions, Batch, BatchDims};
use super::model::{prompt_len, Arch, Pi0Input, Pi0Model, Timing, Variant, Workspace};
use super::normalize::Widths;
use super::preprocess::frame_to_model_input;
use super::processor::{Context, Preprocessed, Processor, TokenizerStep};
use crate::chunk::{ChunkPrefix, ModelOutput};
use crate::observation::CameraFrame;
use crate::policy::graph::manifest::Manifest;
use crate::policy::graph::{GraphError, GraphModel, GraphRuntime};
use crate::policy::rtc::{CleanPrefix, Conditioning, Guidance, RtcPrefix, RtcSettings};
use crate::policy::StageTiming;

/// The longest task text (bytes) the pipeline takes (the configuration's bound). Longer prompts
/// are refused before tokenizing (which would take seconds for a huge one, and truncation would
/// drop most anyway).
pub use crate::config::policy::MAX_PROMPT_BYTES;

mod error;
mod graphs;
pub use error::PipelineError;
use graphs::{check_manifest, concat, sample_graphs};

#[derive(Clone, Debug)]
pub struct PipelineOptions {
    pub checkpoint: PathBuf,
    pub arch: Option<PathBuf>,
    /// Defaults to `tokenizer.json` in the checkpoint directory.
    pub tokenizer: Option<PathBuf>,
    pub threads: usize,
    pub backend: BackendOptions,
    /// An openpi checkpoint's delta actions (openpi keeps them in its training config, not in
    /// the checkpoint): which action dimensions are relative to the state.
    pub openpi_delta_actions: Option<Vec<bool>>,
}

pub(crate) use crate::config::policy::BackendOptions;

/// The model stage of the pipeline.
pub(crate) enum Backend {
    Cpu {
        model: Box<Pi0Model>,
        workspace: Box<Workspace>,
    },
    /// Exported graphs on a graph runtime (its name, the model).
    Graph(&'static str, Box<GraphModel<Box<dyn GraphRuntime>>>),
}

impl Backend {
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Backend::Cpu { .. } => "cpu",
            Backend::Graph(name, _) => name,
        }
    }
}

pub struct Pi0Pipeline {
    /// The model's sizes (read from the checkpoint whatever the backend).
    pub(crate) arch: Arch,
    pub(crate) backend: Backend,
    /// The checkpoint's processor steps, in order.
    pub(crate) processor: Processor,
    tokenizer: Tokenizer,
    /// The id of the tokenizer's padding token (masked wherever it is used).
    pad_id: i64,
    /// Prompt tokens the model takes (the tokenizer step's length, or the graphs').
    max_tokens: usize,
    /// Robot state and action widths (before padding to the model's 32).
    pub state_dim: usize,
    pub action_dim: usize,
    /// Camera slots the model was trained with; missing ones are fed as masked -1 images.
    pub cameras: usize,
    /// Their names (`observation.images.<name>` in config.json, in its order); empty when the
    /// checkpoint does not name them (a bare safetensors file).
    pub camera_names: Vec<String>,
    /// Per model camera: the observation image it is fed from (`None`: always missing).
    camera_slots: Vec<Option<usize>>,
    /// Where `state_dim` and `action_dim` come from ("from DIR/config.json", or the model's
    /// padded width for a bare safetensors file), for messages about them.
    pub(crate) width_source: String,
    /// The latest `run`'s stages.
    pub(crate) last_stages: StageTiming,
    /// The latest `run`'s model output, before the postprocessor.
    pub(crate) last_output: Option<ModelOutput>,
    /// A pi0.5 trained for real-time chunking: the largest delay it was trained on.
    trained_rtc: Option<usize>,
}

/// The robot's state and action widths: `config.json`'s features, else the model's padded
/// width, said so in every message that uses them.
fn robot_widths(ck: &Checkpoint, arch: &Arch) -> Result<Widths, PipelineError> {
    let cfg = &ck.config;
    let config = ck.path.join("config.json");
    let feature = |map, key: &str, field: &str| -> Result<Option<usize>, PipelineError> {
        match PolicyConfigJson::feature_width(map, key) {
            Some(0) => Err(CheckpointError::Value {
                path: config.clone(),
                field: field.into(),
                expected: "a width of at least 1".into(),
                found: "0".into(),
            }
            .into()),
            w => Ok(w),
        }
    };
    let action = feature(
        &cfg.output_features,
        "action",
        "output_features.action.shape",
    )?;
    let state = feature(
        &cfg.input_features,
        "observation.state",
        "input_features.observation.state.shape",
    )?;
    let source = match (cfg.from_file, action, state) {
        (false, ..) => format!(
            "the model's padded width: {} is a bare safetensors file, with no config.json naming the robot's",
            ck.path.display()
        ),
        (true, Some(_), Some(_)) => format!("from {}", config.display()),
        (true, ..) => format!(
            "from {} where it names them, else the model's padded width",
            config.display()
        ),
    };
    let action = action.unwrap_or(arch.action_dim);
    Ok(Widths {
        state: state.unwrap_or(action),
        action,
        source,
    })
}

impl Pi0Pipeline {
    pub fn load(opts: &PipelineOptions) -> Result<Pi0Pipeline, PipelineError> {
        Pi0Pipeline::load_observed(opts, None)
    }

    /// As `load`, its CPU model's linear layers reporting their inputs to `calibration`.
    pub(crate) fn load_observed(
        opts: &PipelineOptions,
        calibration: Option<Arc<crate::policy::pi0::quant::calibrate::Recorder>>,
    ) -> Result<Pi0Pipeline, PipelineError> {
        let overrides = opts.arch.as_deref().map(ArchOverrides::load).transpose()?;
        let mut ck = Checkpoint::load(&opts.checkpoint)?;
        ck.calibration = calibration;
        let arch = Arch::from_checkpoint(&ck, overrides)?;
        let trained_rtc = ck
            .config
            .trained_rtc(&ck.path, arch.variant == Variant::Pi05)?;
        let dir = if opts.checkpoint.is_dir() {
            opts.checkpoint.clone()
        } else {
            opts.checkpoint
                .parent()
                .unwrap_or(Path::new("."))
                .to_path_buf()
        };
        let widths = robot_widths(&ck, &arch)?;
        let (state_dim, action_dim) = (widths.state, widths.action);
        if action_dim > arch.action_dim || state_dim > arch.state_dim {
            return Err(PipelineError::Input(format!(
                "{}: robot action/state width {action_dim}/{state_dim} exceeds the model's {}/{}",
                ck.path.display(),
                arch.action_dim,
                arch.state_dim
            )));
        }
        let camera_keys: Vec<String> = ck
            .config
            .camera_names
            .iter()
            .map(|n| format!("observation.images.{n}"))
            .collect();
        let processor = Processor::load(&Context {
            dir: &dir,
            variant: arch.variant,
            widths: &widths,
            cameras: &camera_keys,
            use_relative_actions: ck.config.use_relative_actions,
            openpi_delta_actions: opts.openpi_delta_actions.as_deref(),
            default_prompt_len: prompt_len(&ck.config, arch.variant),
        })?
        .ok_or_else(|| {
            PipelineError::Input(format!(
                "{}: no processor steps or normalization stats (policy_preprocessor.json + policy_postprocessor.json, or norm_stats.json)",
                dir.display()
            ))
        })?;
        let tok_path = opts
            .tokenizer
            .clone()
            .unwrap_or_else(|| dir.join("tokenizer.json"));
        super::checkpoint::regular_file(&tok_path, "a tokenizer.json file")?;
        let mut tokenizer =
            Tokenizer::from_file(&tok_path).map_err(|source| PipelineError::Tokenizer {
                path: tok_path.clone(),
                source,
            })?;
        // The tokenizer step's settings rule, as Hugging Face's call overrides the file's own.
        tokenizer
            .with_truncation(None)
            .map_err(|source| PipelineError::Tokenizer {
                path: tok_path.clone(),
                source,
            })?;
        tokenizer.with_padding(None);
        let pad_id = tokenizer.token_to_id("<pad>").map_or(0, i64::from);
        // An id past the embedding table would be clamped onto another token's row.
        if let Some(largest) = tokenizer.get_vocab(true).values().copied().max() {
            if largest as usize >= arch.vocab {
                return Err(PipelineError::TokenizerVocab {
                    path: tok_path,
                    checkpoint: ck.path.clone(),
                    largest,
                    vocab: arch.vocab,
                });
            }
        }
        // The model last: everything above is quick to check, packing the weights is not.
        let backend = match &opts.backend {
            BackendOptions::Cpu => {
                let mut model = Pi0Model::load(&ck, overrides, opts.threads)?;
                model.max_tokens = processor.prompt_len();
                Backend::Cpu {
                    model: Box::new(model),
                    workspace: Box::default(),
                }
            }
            BackendOptions::Onnx { model_dir, options } => {
                let manifest = Manifest::load(model_dir).map_err(GraphError::from)?;
                check_manifest(&manifest, &arch, model_dir)?;
                Backend::Graph(
                    "onnx",
                    Box::new(crate::policy::graph::load_onnx(
                        model_dir, manifest, options,
                    )?),
                )
            }
            BackendOptions::Acl { model_dir, options } => {
                let manifest = Manifest::load(model_dir).map_err(GraphError::from)?;
                check_manifest(&manifest, &arch, model_dir)?;
                Backend::Graph(
                    "acl",
                    Box::new(crate::policy::graph::load_acl(
                        model_dir, manifest, options,
                    )?),
                )
            }
        };
        if let Backend::Graph(_, g) = &backend {
            // Graphs exported from a plain checkpoint take no clamped steps (and the reverse).
            if g.manifest.trained_rtc != trained_rtc {
                let show = |d: Option<usize>| d.map_or("none".to_string(), |d| d.to_string());
                return Err(PipelineError::Input(format!(
                    "the graphs were exported for rtc_training_max_delay {}, the checkpoint ({}/config.json) has {}: re-run pi0d export",
                    show(g.manifest.trained_rtc),
                    ck.path.display(),
                    show(trained_rtc)
                )));
            }
        }
        let cfg = &ck.config;
        let cameras = match &backend {
            // Exported graphs have a fixed camera count.
            Backend::Graph(_, g) => g.manifest.cameras,
            Backend::Cpu { .. } => cfg
                .input_features
                .values()
                .filter(|f| f.kind == "VISUAL")
                .count()
                .max(1),
        };
        let max_tokens = match &backend {
            Backend::Graph(_, g) => {
                let steps = processor.prompt_len();
                if g.manifest.prompt_len < steps {
                    let dir = match &opts.backend {
                        BackendOptions::Onnx { model_dir, .. }
                        | BackendOptions::Acl { model_dir, .. } => model_dir.display().to_string(),
                        BackendOptions::Cpu => String::new(),
                    };
                    return Err(PipelineError::Input(format!(
                        "{dir}: the graphs take {} prompt tokens, but the checkpoint's tokenizer step makes {steps} (re-run pi0d export)",
                        g.manifest.prompt_len
                    )));
                }
                g.manifest.prompt_len
            }
            Backend::Cpu { .. } => processor.prompt_len(),
        };
        tracing::info!(
            backend = backend.name(),
            checkpoint = %ck.path.display(),
            variant = ?arch.variant,
            vision = format!("{}x{} d{}", arch.vision_width, arch.vision_mlp, arch.vision_layers),
            language = format!("{}x{} d{}", arch.width, arch.mlp, arch.layers),
            expert = format!("{}x{}", arch.expert_width, arch.expert_mlp),
            heads = format!("{}/{}x{}", arch.heads, arch.kv_heads, arch.head_dim),
            cameras,
            action_dim,
            "pi0 model loaded"
        );
        Ok(Pi0Pipeline {
            arch,
            backend,
            processor,
            tokenizer,
            pad_id,
            max_tokens,
            state_dim,
            action_dim,
            cameras,
            camera_names: if cfg.camera_names.len() == cameras {
                cfg.camera_names.clone()
            } else {
                Vec::new()
            },
            camera_slots: (0..cameras).map(Some).collect(),
            width_source: widths.source,
            last_stages: StageTiming::default(),
            last_output: None,
            trained_rtc,
        })
    }

    /// The checkpoint's processor steps as they run, in words (the action names as its relative
    /// step names them, else by index).
    pub fn describe_processing(&self) -> Vec<String> {
        self.processor.describe(&[])
    }

    /// The robot's camera names the checkpoint renames to its own (`rename_map`).
    pub(crate) fn camera_renames(&self) -> std::collections::BTreeMap<String, String> {
        self.processor.camera_renames()
    }

    /// Which observation image feeds each model camera (`None`: missing, fed masked). Missing
    /// cameras are masked in place: lerobot appends them after the present ones instead, which
    /// gives the same actions, since masked image tokens neither attend nor advance the
    /// positions of the tokens after them (`cumsum` of the mask).
    pub(crate) fn set_camera_slots(&mut self, slots: Vec<Option<usize>>) {
        debug_assert_eq!(slots.len(), self.cameras);
        self.camera_slots = slots;
    }

    /// Bytes `prompt` adds around the task text (pi0.5's state digits and framing).
    fn prompt_overhead(&self) -> usize {
        match self.arch.variant {
            Variant::Pi0 => 1,
            Variant::Pi05 => 32 + 5 * self.arch.state_dim,
        }
    }

    /// Token ids and mask for `text` as the checkpoint's (last) tokenizer step makes them:
    /// the tokenizer's encoding (BOS + pieces), cut, padded and masked as its settings say,
    /// then filled with masked padding to the model's length. Text longer than a prompt of
    /// `MAX_PROMPT_BYTES` of task can be is refused untokenized.
    pub fn tokenize(&self, text: &str) -> Result<(Vec<i64>, Vec<bool>), PipelineError> {
        let fixed = TokenizerStep::fixed(self.max_tokens);
        self.tokenize_with(text, self.processor.tokenizer().unwrap_or(&fixed))
    }

    fn tokenize_with(
        &self,
        text: &str,
        step: &TokenizerStep,
    ) -> Result<(Vec<i64>, Vec<bool>), PipelineError> {
        if text.len() > MAX_PROMPT_BYTES + self.prompt_overhead() {
            return Err(PipelineError::PromptTooLong { bytes: text.len() });
        }
        let enc = self
            .tokenizer
            .encode(text, true)
            .map_err(PipelineError::Tokenize)?;
        let ids: Vec<i64> = enc.get_ids().iter().map(|&i| i64::from(i)).collect();
        Ok(step.apply(ids, self.pad_id, self.max_tokens)?)
    }

    /// One observation's state and task through the preprocessor.
    pub(crate) fn preprocess(
        &self,
        state: &[f32],
        task: &str,
    ) -> Result<Preprocessed, PipelineError> {
        self.processor.preprocess(state, task, &mut |text, step| {
            self.tokenize_with(text, step)
        })
    }

    /// The text the (last) tokenizer step receives for `task` and the raw `state`.
    pub fn prompt(&self, task: &str, state: &[f32]) -> String {
        let mut prompt = String::new();
        let _ = self
            .processor
            .preprocess::<()>(state, task, &mut |text, _| {
                prompt = text.to_string();
                Ok((Vec::new(), Vec::new()))
            });
        prompt
    }

    /// The largest inference delay the checkpoint was trained to be conditioned on (pi0.5
    /// with `rtc_training_max_delay`): real-time chunking then runs as it was trained.
    pub(crate) fn trained_rtc(&self) -> Option<usize> {
        self.trained_rtc
    }

    /// Real-time chunking's conditioning for `prefix` (robot units, the checkpoint's action
    /// order), for the observation whose raw state is `state`: the leftover in the model's
    /// action space (with relative actions, re-expressed against that state first), as
    /// guidance, or for a checkpoint trained for it as the clamped prefix (its delay checked
    /// against the trained maximum, as lerobot checks it).
    pub(crate) fn conditioning(
        &self,
        settings: RtcSettings,
        prefix: &ChunkPrefix,
        state: &[f32],
    ) -> Result<Conditioning, PipelineError> {
        if prefix.action_dim != self.action_dim {
            return Err(PipelineError::Input(format!(
                "the leftover has {} values per step, the checkpoint acts on {}",
                prefix.action_dim, self.action_dim
            )));
        }
        let mut leftover: Vec<f32> = prefix.actions.iter().map(|x| *x as f32).collect();
        let reference = self.processor.reference(state);
        self.processor
            .leftover_to_model(&mut leftover, reference.as_deref());
        let steps = prefix.steps().min(self.arch.chunk);
        leftover.truncate(steps * self.action_dim);
        let (chunk, width) = (self.arch.chunk, self.arch.action_dim);
        let said = |e| PipelineError::Input(format!("real-time chunking: {e}"));
        if let Some(max) = self.trained_rtc {
            let p = RtcPrefix {
                leftover,
                steps,
                width: self.action_dim,
                inference_delay: prefix.inference_delay,
                execution_horizon: prefix.execution_horizon,
            };
            return CleanPrefix::new(&p, chunk, width, max)
                .map(Conditioning::Trained)
                .map_err(said);
        }
        let p = RtcPrefix {
            leftover,
            steps,
            width: self.action_dim,
            inference_delay: prefix.inference_delay.min(steps),
            execution_horizon: prefix.execution_horizon,
        };
        Guidance::new(settings, &p, chunk, width)
            .map(Conditioning::Guided)
            .map_err(said)
    }

    /// Raw observation to unnormalized actions `[chunk][action_dim]`, with the given noise.
    /// The CPU backend reuses its workspace across calls (the denoising loop then allocates
    /// nothing).
    pub fn run(
        &mut self,
        frames: &[Option<&CameraFrame>],
        state: &[f32],
        task: &str,
        noise: &[f32],
    ) -> Outcome {
        self.run_guided(frames, state, task, noise, None)
    }

    /// `run`, with real-time chunking's conditioning when given (`conditioning`).
    pub(crate) fn run_guided(
        &mut self,
        frames: &[Option<&CameraFrame>],
        state: &[f32],
        task: &str,
        noise: &[f32],
        rtc: Option<&Conditioning>,
    ) -> Outcome {
        let started = std::time::Instant::now();
        let p = self.prepare(frames, state, task, noise)?;
        let preprocess_ms = started.elapsed().as_secs_f64() * 1e3;
        let (x, timing) = match &mut self.backend {
            Backend::Cpu { model, workspace } => {
                let mut input = p.input();
                input.guidance = rtc.and_then(Conditioning::guidance);
                input.clean = rtc.and_then(Conditioning::clean);
                model.sample_actions_with(&input, workspace)
            }
            Backend::Graph(_, g) => sample_graphs(g, &[(&p, rtc)])?,
        };
        let per = self.arch.chunk * self.arch.action_dim;
        let finishing = std::time::Instant::now();
        let actions = self.finish(&x[..per], p.reference.as_deref())?;
        self.last_output = Some(ModelOutput {
            actions: x[..per]
                .chunks_exact(self.arch.action_dim)
                .flat_map(|row| row[..self.action_dim].iter().copied())
                .collect(),
            reference_state: p.reference,
            conditioned_delay: rtc.and_then(Conditioning::clean).map(CleanPrefix::delay),
        });
        self.last_stages = StageTiming {
            preprocess_ms,
            prefix_ms: timing.prefix_ms,
            steps_ms: timing.steps_ms,
            postprocess_ms: finishing.elapsed().as_secs_f64() * 1e3,
        };
        Ok((actions, timing))
    }

    /// Several observations at once: on the CPU backend one batched pass of the model
    /// (`Pi0Model::sample_actions_batch`); on graphs exported for batch N, runs of N (the last
    /// padded with a copy of its last observation). Each gets its own result (a bad
    /// observation fails alone); the timing is the batch's.
    pub fn run_batch(&mut self, items: &[BatchItem]) -> Vec<Outcome> {
        if items.len() < 2 {
            return items
                .iter()
                .map(|i| self.run_guided(i.frames, i.state, i.task, i.noise, i.rtc))
                .collect();
        }
        let prepared: Vec<Result<Prepared, PipelineError>> = items
            .iter()
            .map(|i| self.prepare(i.frames, i.state, i.task, i.noise))
            .collect();
        if let Backend::Graph(_, g) = &mut self.backend {
            let per = self.arch.chunk * self.arch.action_dim;
            let ok: Vec<(&Prepared, Option<&Conditioning>)> = prepared
                .iter()
                .zip(items)
                .filter_map(|(p, i)| p.as_ref().ok().map(|p| (p, i.rtc)))
                .collect();
            // One row per element; a group's error is shared by its elements.
            type Row = Result<(Vec<f32>, Timing), Arc<PipelineError>>;
            let mut rows: Vec<Row> = Vec::new();
            for group in ok.chunks(g.manifest.batch.max(1)) {
                match sample_graphs(g, group) {
                    Ok((x, t)) => rows.extend(
                        x.chunks_exact(per)
                            .take(group.len())
                            .map(|r| Ok((r.to_vec(), t))),
                    ),
                    Err(e) => {
                        let e = Arc::new(e);
                        rows.extend(group.iter().map(|_| Err(e.clone())))
                    }
                }
            }
            let mut rows = rows.into_iter();
            return prepared
                .into_iter()
                .map(|p| {
                    let p = p?;
                    match rows.next() {
                        Some(Ok((x, t))) => Ok((self.finish(&x, p.reference.as_deref())?, t)),
                        Some(Err(e)) => Err(PipelineError::GraphBatch(e)),
                        None => Err(PipelineError::Input("no result".into())),
                    }
                })
                .collect();
        }
        let inputs: Vec<Pi0Input> = prepared
            .iter()
            .zip(items)
            .filter_map(|(p, i)| p.as_ref().ok().map(|p| (p, i)))
            .map(|(p, i)| Pi0Input {
                guidance: i.rtc.and_then(Conditioning::guidance),
                clean: i.rtc.and_then(Conditioning::clean),
                ..p.input()
            })
            .collect();
        let (x, timing) = match &mut self.backend {
            Backend::Cpu { model, workspace } => model.sample_actions_batch(&inputs, workspace),
            Backend::Graph(..) => unreachable!("graph backends run one at a time above"),
        };
        let per = self.arch.chunk * self.arch.action_dim;
        let mut rows = x.chunks_exact(per);
        prepared
            .into_iter()
            .map(|p| {
                let p = p?;
                let x = rows.next().unwrap_or_default();
                Ok((self.finish(x, p.reference.as_deref())?, timing))
            })
            .collect()
    }

    /// Checks and preprocesses one observation into the model's inputs.
    fn prepare(
        &self,
        frames: &[Option<&CameraFrame>],
        state: &[f32],
        task: &str,
        noise: &[f32],
    ) -> Result<Prepared, PipelineError> {
        let a = &self.arch;
        if task.len() > MAX_PROMPT_BYTES {
            return Err(PipelineError::PromptTooLong { bytes: task.len() });
        }
        if let Some(i) = state.iter().position(|x| !x.is_finite()) {
            return Err(PipelineError::Input(format!(
                "state value {i} is {}, not a finite number",
                state[i]
            )));
        }
        if noise.len() != a.chunk * a.action_dim {
            return Err(PipelineError::Input(format!(
                "noise has {} values, the model takes {} ({} steps x {})",
                noise.len(),
                a.chunk * a.action_dim,
                a.chunk,
                a.action_dim
            )));
        }
        if let Some(i) = noise.iter().position(|x| !x.is_finite()) {
            return Err(PipelineError::Input(format!(
                "noise value {i} is {}, not a finite number",
                noise[i]
            )));
        }
        if state.len() != self.state_dim {
            return Err(PipelineError::Input(format!(
                "state has {} values, the checkpoint expects {}",
                state.len(),
                self.state_dim
            )));
        }
        let mut images = Vec::with_capacity(self.cameras);
        let mut masks = Vec::with_capacity(self.cameras);
        for k in 0..self.cameras {
            let slot = self.camera_slots.get(k).copied().flatten();
            match slot.and_then(|i| frames.get(i).copied().flatten()) {
                Some(f) => {
                    images.push(
                        frame_to_model_input(f, a.image_size)
                            .map_err(|source| PipelineError::Frame { camera: k, source })?,
                    );
                    masks.push(true);
                }
                None => {
                    images.push(vec![-1.0f32; 3 * a.image_size * a.image_size]);
                    masks.push(false);
                }
            }
        }
        let pre = self.preprocess(state, task)?;
        let mut padded = pre.state;
        padded.resize(a.state_dim, 0.0);
        Ok(Prepared {
            images,
            masks,
            tokens: pre.tokens,
            token_masks: pre.token_masks,
            state: padded,
            noise: noise.to_vec(),
            reference: pre.reference,
        })
    }

    /// Observations checked and preprocessed into one batch of `size` (the last repeated to
    /// fill it), as a `pi0d infer` inputs file would hold them.
    pub(crate) fn prepare_batch(
        &self,
        items: &[BatchItem],
        size: usize,
    ) -> Result<Batch, PipelineError> {
        let prepared = items
            .iter()
            .map(|i| self.prepare(i.frames, i.state, i.task, i.noise))
            .collect::<Result<Vec<_>, _>>()?;
        let Some(last) = prepared.last() else {
            return Err(PipelineError::Input("nothing to prepare".into()));
        };
        let all: Vec<&Prepared> = prepared
            .iter()
            .chain(std::iter::repeat(last))
            .take(size.max(1))
            .collect();
        let parts = concat(&all);
        Ok(Batch::from_parts(parts, &BatchDims::from(&self.arch)))
    }

    /// The model's output `[chunk, model action width]` checked, cut to the robot's width and
    /// through the postprocessor (`reference`: the state the preprocessor kept for it).
    fn finish(&self, x: &[f32], reference: Option<&[f32]>) -> Result<Vec<Vec<f32>>, PipelineError> {
        let a = &self.arch;
        // Said at the source: raw NaNs (or ones the postprocessor made) never leave here.
        check_actions(x, a.chunk, a.action_dim)?;
        let mut flat: Vec<f32> = x
            .chunks_exact(a.action_dim)
            .flat_map(|row| row[..self.action_dim].iter().copied())
            .collect();
        self.processor.postprocess(&mut flat, reference);
        check_actions(&flat, a.chunk, self.action_dim)?;
        Ok(flat
            .chunks_exact(self.action_dim)
            .map(<[f32]>::to_vec)
            .collect())
    }
}

/// One observation's actions `[chunk][action_dim]` and the model's timing, or why not.
pub(crate) type Outcome = Result<(Vec<Vec<f32>>, Timing), PipelineError>;

/// One observation of a batch (`Pi0Pipeline::run_batch`).
pub struct BatchItem<'a> {
    pub frames: &'a [Option<&'a CameraFrame>],
    pub state: &'a [f32],
    pub task: &'a str,
    pub noise: &'a [f32],
    /// Real-time chunking, when the request carries a leftover.
    pub rtc: Option<&'a Conditioning>,
}

/// One observation's model inputs, owned, with the state its actions are made absolute
/// against.
struct Prepared {
    images: Vec<Vec<f32>>,
    masks: Vec<bool>,
    tokens: Vec<i64>,
    token_masks: Vec<bool>,
    state: Vec<f32>,
    noise: Vec<f32>,
    reference: Option<Vec<f32>>,
}

impl Prepared {
    fn input(&self) -> Pi0Input<'_> {
        Pi0Input {
            images: self.images.iter().map(Vec::as_slice).collect(),
            image_masks: self.masks.clone(),
            tokens: &self.tokens,
            token_masks: &self.token_masks,
            state: &self.state,
            noise: &self.noise,
            guidance: None,
            clean: None,
        }
    }
}

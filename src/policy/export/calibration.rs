//! Inputs for ATC's own int8 post-training quantization (`--compression_optimize_conf` in
//! calibration mode), which runs each graph on the board over `.bin` files of its inputs.
//!
//! `pi0d export --atc SOC --calibration FILE...` writes them for both graphs from real
//! observations: `pi0d infer` inputs files, or `[record]` recordings run through the real
//! preprocessing (frames, prompt, normalized state). The host code before the graphs is the
//! real one (checks, attention and RoPE tables, time embeddings); what a graph would have
//! computed on the board, the prefix's KV cache and each denoising step's `x_t`, comes from
//! the CPU model (which the graphs match to rounding). Each input's file holds the samples back
//! to back, each in the graph input's own type and shape; ATC reads `batch_num` of them.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use rand::SeedableRng;
use rand_distr::{Distribution, StandardNormal};

use super::builder::encode_f32;
use super::proto::data_type;
use super::ExportError;
use crate::config::BackendOptions;
use crate::observation::CameraFrame;
use crate::policy::export::pi0::names;
use crate::policy::graph::manifest::{GraphEntry, Manifest};
use crate::policy::graph::tables::{PrefixTables, SuffixTables};
use crate::policy::graph::{GraphError, GraphModel, GraphRuntime, StepHook};
use crate::policy::pi0::checkpoint::{ArchOverrides, Checkpoint};
use crate::policy::pi0::infer::Batch;
use crate::policy::pi0::model::{Euler, KvCache, Pi0Model, Workspace};
use crate::policy::pi0::pipeline::{Backend, BatchItem, Pi0Pipeline, PipelineOptions};
use crate::policy::pi0::quant::{is_recording, recorded};

/// The folder in the export directory the inputs go to.
pub const DIR: &str = "calibration";
/// Samples per graph, at most: ATC runs the graph once per sample on the board, and a sample
/// of the full-size pi0's denoise graph is tens of MB (its KV cache).
const MAX_SAMPLES: usize = 32;

/// Which graph a calibration is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GraphKind {
    Prefix,
    Denoise,
}

impl GraphKind {
    pub fn name(self) -> &'static str {
        match self {
            GraphKind::Prefix => "prefix",
            GraphKind::Denoise => "denoise",
        }
    }
}

/// One input of a graph, written for ATC.
#[derive(Clone, Debug, PartialEq)]
pub struct CalibrationInput {
    pub name: String,
    /// One sample's shape (the graph input's).
    pub shape: Vec<usize>,
    /// The file, relative to the export directory: `samples` of them back to back.
    pub file: PathBuf,
}

/// A graph's calibration inputs.
#[derive(Clone, Debug, PartialEq)]
pub struct GraphCalibration {
    pub graph: GraphKind,
    /// Every input of the graph, in its order.
    pub inputs: Vec<CalibrationInput>,
    pub samples: usize,
}

/// What a graph was given for one sample, by input name.
enum Values<'a> {
    F32(&'a [f32]),
    I64(&'a [i64]),
}

impl Values<'_> {
    fn len(&self) -> usize {
        match self {
            Values::F32(v) => v.len(),
            Values::I64(v) => v.len(),
        }
    }

    /// Little-endian bytes in the graph input's type, or `None` when type or count do not fit.
    fn encode(&self, dtype: &str, count: usize) -> Option<Vec<u8>> {
        if self.len() != count {
            return None;
        }
        Some(match (self, dtype) {
            (Values::F32(v), "float32") => encode_f32(v, data_type::FLOAT),
            (Values::F32(v), "float16") => encode_f32(v, data_type::FLOAT16),
            (Values::I64(v), "int64") => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            _ => return None,
        })
    }
}

/// One graph's files, open for appending samples.
struct Sink<'m> {
    graph: GraphKind,
    entry: &'m GraphEntry,
    files: Vec<(PathBuf, BufWriter<File>)>,
    samples: usize,
}

impl<'m> Sink<'m> {
    fn create(dir: &Path, graph: GraphKind, entry: &'m GraphEntry) -> Result<Self, ExportError> {
        let folder = dir.join(DIR).join(graph.name());
        std::fs::create_dir_all(&folder).map_err(|source| ExportError::Io {
            path: folder.clone(),
            source,
        })?;
        let files = entry
            .inputs
            .iter()
            .map(|spec| {
                let file = PathBuf::from(DIR)
                    .join(graph.name())
                    .join(format!("{}.bin", spec.name));
                let path = dir.join(&file);
                let f = File::create(&path).map_err(|source| ExportError::Io { path, source })?;
                Ok((file, BufWriter::new(f)))
            })
            .collect::<Result<_, ExportError>>()?;
        Ok(Sink {
            graph,
            entry,
            files,
            samples: 0,
        })
    }

    /// Appends one sample: every input of the graph, as `value` gives it by name.
    fn write<'v>(
        &mut self,
        dir: &Path,
        value: &dyn Fn(&str) -> Option<Values<'v>>,
    ) -> Result<(), ExportError> {
        for (spec, (file, out)) in self.entry.inputs.iter().zip(&mut self.files) {
            let v = value(&spec.name).ok_or_else(|| {
                ExportError::Invalid(format!(
                    "the {} graph takes `{}`, which calibration does not know how to fill",
                    self.graph.name(),
                    spec.name
                ))
            })?;
            let count: usize = spec.shape.iter().product();
            let bytes = v.encode(&spec.dtype, count).ok_or_else(|| {
                ExportError::Invalid(format!(
                    "the {} graph's input `{}` is {} {:?}; calibration has {} values for it",
                    self.graph.name(),
                    spec.name,
                    spec.dtype,
                    spec.shape,
                    v.len()
                ))
            })?;
            out.write_all(&bytes).map_err(|source| ExportError::Io {
                path: dir.join(&*file),
                source,
            })?;
        }
        self.samples += 1;
        Ok(())
    }

    fn finish(self, dir: &Path) -> Result<GraphCalibration, ExportError> {
        let mut inputs = Vec::new();
        for (spec, (file, out)) in self.entry.inputs.iter().zip(self.files) {
            out.into_inner()
                .map_err(|e| e.into_error())
                .and_then(|f| f.sync_all())
                .map_err(|source| ExportError::Io {
                    path: dir.join(&file),
                    source,
                })?;
            inputs.push(CalibrationInput {
                name: spec.name.clone(),
                shape: spec.shape.clone(),
                file,
            });
        }
        Ok(GraphCalibration {
            graph: self.graph,
            inputs,
            samples: self.samples,
        })
    }
}

/// One batch's prefix inputs and denoising runs, as the host code gave them to the graphs.
#[derive(Default)]
struct Captured {
    images: Vec<Vec<f32>>,
    tokens: Vec<i64>,
    prefix: PrefixTables,
    /// The prefix's keys and values as the prefix graph returns them: `[layers, 2, B, P, kvd]`.
    kv: Vec<f32>,
    suffix: SuffixTables,
    state: Option<Vec<f32>>,
    /// Per kept run: `x` before it and its time embedding.
    runs: Vec<(Vec<f32>, Vec<f32>)>,
}

/// A graph runtime whose prefix keeps its inputs and computes the batch's KV caches on the CPU
/// model, and whose denoising runs are the CPU model's steps (the host's real-time chunking
/// hook applied between them, as on any graph backend), keeping the runs asked for.
struct Capture<'a> {
    model: &'a Pi0Model,
    batch: &'a Batch,
    /// Per batch element: its prefix, and a workspace prepared for it.
    caches: Vec<(KvCache, Workspace)>,
    runs: usize,
    keep: &'a [usize],
    out: &'a mut Captured,
}

impl GraphRuntime for Capture<'_> {
    fn run_prefix(
        &mut self,
        images: &[&[f32]],
        tokens: &[i64],
        tables: &PrefixTables,
    ) -> Result<(), GraphError> {
        // The host's checks have passed: the batch fits the graphs.
        self.caches = (0..self.batch.batch)
            .map(|e| {
                let cache = self.model.prefix(&self.batch.element(e));
                let mut ws = Workspace::default();
                self.model.prepare_steps(&cache, &mut ws);
                (cache, ws)
            })
            .collect();
        let layers = self.caches.first().map_or(0, |c| c.0.k.len());
        self.out.kv = (0..layers)
            .flat_map(|l| {
                let caches = &self.caches;
                [false, true].into_iter().flat_map(move |v| {
                    caches
                        .iter()
                        .flat_map(move |(c, _)| if v { &c.v[l] } else { &c.k[l] })
                        .copied()
                })
            })
            .collect();
        self.out.images = images.iter().map(|i| i.to_vec()).collect();
        self.out.tokens = tokens.to_vec();
        self.out.prefix = tables.clone();
        Ok(())
    }

    fn run_denoise(
        &mut self,
        state: Option<&[f32]>,
        x: &mut [f32],
        time: &[f32],
        tables: &SuffixTables,
        mut guide: Option<&mut StepHook<'_>>,
    ) -> Result<(), GraphError> {
        self.out.suffix = tables.clone();
        self.out.state = state.map(<[f32]>::to_vec);
        let per_run = time.len() / self.runs.max(1);
        let last = self.keep.iter().max().copied().unwrap_or(0);
        let euler = Euler::new(self.model.arch.steps);
        let per = x.len() / self.caches.len().max(1);
        let sd = self.model.arch.state_dim;
        let mut v = vec![0.0f32; per];
        let mut before = vec![0.0f32; x.len()];
        for run in 0..self.runs {
            if self.keep.contains(&run) {
                let t = time[run * per_run..(run + 1) * per_run].to_vec();
                self.out.runs.push((x.to_vec(), t));
            }
            // Past the last run kept, or an unrolled graph's one run: no step needed.
            if run >= last {
                break;
            }
            before.copy_from_slice(x);
            let t = euler.time(run) as f32;
            for (e, (cache, ws)) in self.caches.iter_mut().enumerate() {
                let s = state.map_or(&[][..], |s| &s[e * sd..(e + 1) * sd]);
                let xe = &mut x[e * per..(e + 1) * per];
                self.model.denoise_step(cache, s, xe, t, ws, &mut v);
                euler.advance(xe, &v);
            }
            if let Some(g) = guide.as_mut() {
                g(run, &before, x);
            }
        }
        Ok(())
    }
}

fn refused(file: &Path, reason: impl std::fmt::Display) -> ExportError {
    ExportError::Invalid(format!(
        "--calibration {}: {reason} (ATC's calibration inputs come from a `pi0d infer` inputs file shaped as the graphs, or a recording pi0d made with [record])",
        file.display()
    ))
}

/// The float model the graphs' own computations are reproduced on, and for recordings the
/// pipeline that preprocesses their observations.
enum Runner {
    Model(Box<Pi0Model>),
    Pipeline(Box<Pi0Pipeline>),
}

impl Runner {
    fn load(
        checkpoint: &Path,
        arch: Option<&Path>,
        recordings: bool,
        threads: usize,
    ) -> Result<Runner, ExportError> {
        if !recordings {
            let overrides = arch.map(ArchOverrides::load).transpose()?;
            let ck = Checkpoint::load(checkpoint)?;
            return Ok(Runner::Model(Box::new(Pi0Model::load(
                &ck, overrides, threads,
            )?)));
        }
        let opts = PipelineOptions {
            checkpoint: checkpoint.into(),
            arch: arch.map(Path::to_path_buf),
            tokenizer: None,
            threads,
            backend: BackendOptions::Cpu,
            openpi_delta_actions: None,
        };
        let p = Pi0Pipeline::load(&opts).map_err(|e| {
            ExportError::Invalid(format!(
                "{}: cannot preprocess recordings with it: {e}",
                checkpoint.display()
            ))
        })?;
        Ok(Runner::Pipeline(Box::new(p)))
    }

    fn model(&self) -> Option<&Pi0Model> {
        match self {
            Runner::Model(m) => Some(m),
            Runner::Pipeline(p) => match &p.backend {
                Backend::Cpu { model, .. } => Some(model),
                Backend::Graph(..) => None,
            },
        }
    }
}

/// The observations of `files` as batches of the graphs' size: an inputs file is one batch;
/// a recording's observations (seeded noise, so a rerun writes the same) are grouped, the
/// last group filled with copies of its last observation.
fn batches(
    m: &Manifest,
    runner: &Runner,
    model: &Pi0Model,
    files: &[PathBuf],
) -> Result<Vec<(PathBuf, Batch)>, ExportError> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(0);
    let mut out = Vec::new();
    for file in files {
        match runner {
            Runner::Pipeline(p) if is_recording(file) => {
                let (observations, prompt) = recorded::read(file)?;
                for group in observations.chunks(m.batch.max(1)) {
                    let noise: Vec<Vec<f32>> = group
                        .iter()
                        .map(|_| {
                            (0..m.chunk * m.action_dim)
                                .map(|_| StandardNormal.sample(&mut rng))
                                .collect()
                        })
                        .collect();
                    let frames: Vec<Vec<Option<&CameraFrame>>> = group
                        .iter()
                        .map(|o| o.frames.iter().map(|f| f.as_deref()).collect())
                        .collect();
                    let items: Vec<BatchItem> = group
                        .iter()
                        .zip(&frames)
                        .zip(&noise)
                        .map(|((o, frames), noise)| BatchItem {
                            frames,
                            state: &o.state,
                            task: &prompt,
                            noise,
                            rtc: None,
                        })
                        .collect();
                    let batch = p
                        .prepare_batch(&items, m.batch)
                        .map_err(|e| refused(file, e))?;
                    out.push((file.clone(), batch));
                }
            }
            _ => {
                let batch = Batch::read(file, model).map_err(|e| refused(file, e))?;
                if batch.batch != m.batch {
                    return Err(refused(
                        file,
                        format!(
                            "it holds a batch of {}, the graphs take {}",
                            batch.batch, m.batch
                        ),
                    ));
                }
                out.push((file.clone(), batch));
            }
        }
    }
    Ok(out)
}

/// Writes both graphs' calibration inputs for `files` (`pi0d infer` inputs files or
/// recordings) into `dir/calibration/`: at most `MAX_SAMPLES` batches for the prefix, and for
/// the denoise graph at most `MAX_SAMPLES` runs spread over those batches and the steps.
pub(crate) fn write_inputs(
    dir: &Path,
    m: &Manifest,
    checkpoint: &Path,
    arch: Option<&Path>,
    files: &[PathBuf],
    threads: usize,
) -> Result<[GraphCalibration; 2], ExportError> {
    let runner = Runner::load(
        checkpoint,
        arch,
        files.iter().any(|f| is_recording(f)),
        threads,
    )?;
    let model = runner
        .model()
        .ok_or_else(|| ExportError::Invalid("calibration needs the CPU model".into()))?;
    let all = batches(m, &runner, model, files)?;
    let step = all.len().div_ceil(MAX_SAMPLES).max(1);
    let chosen: Vec<(PathBuf, Batch)> = all.into_iter().step_by(step).collect();
    let runs = if m.unrolled { 1 } else { m.steps };
    let per = (MAX_SAMPLES / chosen.len().max(1)).clamp(1, runs.max(1));
    let mut prefix = Sink::create(dir, GraphKind::Prefix, &m.graphs.prefix)?;
    let mut denoise = Sink::create(dir, GraphKind::Denoise, &m.graphs.denoise)?;
    for (i, (file, batch)) in chosen.iter().enumerate() {
        // Spread over the steps, each batch starting one later.
        let keep: Vec<usize> = (0..per).map(|j| (i + j * runs / per) % runs).collect();
        let mut c = Captured::default();
        GraphModel::new(
            m.clone(),
            Capture {
                model,
                batch,
                caches: Vec::new(),
                runs,
                keep: &keep,
                out: &mut c,
            },
        )
        .sample(&batch.graph_inputs())
        .map_err(|e| refused(file, e))?;
        prefix.write(dir, &|name| match name {
            names::LANG_TOKENS => Some(Values::I64(&c.tokens)),
            names::PREFIX_BIAS => Some(Values::F32(&c.prefix.bias)),
            names::PREFIX_COS => Some(Values::F32(&c.prefix.cos)),
            names::PREFIX_SIN => Some(Values::F32(&c.prefix.sin)),
            other => other
                .strip_prefix("image")
                .and_then(|i| i.parse::<usize>().ok())
                .and_then(|i| c.images.get(i))
                .map(|v| Values::F32(v)),
        })?;
        for (x, time) in &c.runs {
            denoise.write(dir, &|name| {
                let rtc = c.suffix.rtc.as_ref();
                Some(Values::F32(match name {
                    names::KV_CACHE => &c.kv,
                    names::STATE => c.state.as_deref()?,
                    names::X_T | names::NOISE => x,
                    names::TIME_EMB => time,
                    names::SUFFIX_BIAS => &c.suffix.bias,
                    names::SUFFIX_COS => &c.suffix.cos,
                    names::SUFFIX_SIN => &c.suffix.sin,
                    names::RTC_TARGET => &rtc?.target,
                    names::RTC_WEIGHTS => &rtc?.weights,
                    names::RTC_GUIDANCE => &rtc?.guidance,
                    _ => return None,
                }))
            })?;
        }
    }
    Ok([prefix.finish(dir)?, denoise.finish(dir)?])
}

/// The `--compression_optimize_conf` file for a graph's inputs in `dir`, reading
/// `simple_config` (written beside it: `simple_config(samples)`) for the number of samples.
pub fn config(dir: &Path, c: &GraphCalibration, soc: &str, simple_config: &Path) -> String {
    let files: Vec<String> = c
        .inputs
        .iter()
        .map(|i| dir.join(&i.file).display().to_string())
        .collect();
    let shapes: Vec<String> = c
        .inputs
        .iter()
        .map(|i| {
            let dims: Vec<String> = i.shape.iter().map(usize::to_string).collect();
            format!("{}:{}", i.name, dims.join(","))
        })
        .collect();
    format!(
        "calibration:\n{{\n    input_data_dir: {}\n    input_shape: {}\n    config_file: {}\n    infer_soc: {soc}\n    log: info\n}}\n",
        files.join(","),
        shapes.join(";"),
        simple_config.display()
    )
}

/// AMCT's simple configuration (its `AMCTConfig` text format): how many samples each input
/// file holds.
pub fn simple_config(c: &GraphCalibration) -> String {
    format!("batch_num: {}\n", c.samples)
}

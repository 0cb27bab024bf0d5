//! `pi0d quantize`: a checkpoint directory rewritten with the chosen groups' linear weights
//! quantized, into a new directory written whole or not at all.

use std::borrow::Cow;
use std::cell::RefCell;
use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};

use half::bf16;
use safetensors::tensor::View;
use safetensors::Dtype;

use super::calibrate;
use super::fold::{fold, Folds};
use super::gptq::{rounded_i4, rounded_i8, Gram};
use super::load::INPUT_SCALE;
use super::smooth::{self, Smoothing, Target};
use super::{rotates, Group, Manifest, QuantizeError, Rounding, Scheme, FORMAT, MANIFEST};
use crate::policy::pi0::checkpoint::{decode, Checkpoint, Entry, WeightDtype};
use crate::policy::pi0::hadamard;
use crate::policy::staging::Staging;

#[derive(Clone, Debug)]
pub struct QuantizeOptions {
    /// A checkpoint directory (config.json beside the weights).
    pub checkpoint: PathBuf,
    pub out: PathBuf,
    pub scheme: Scheme,
    /// `w4`'s block along the input dimension (a power of two, 16 to 256).
    pub block: usize,
    /// The groups quantized; the others stay as they are.
    pub groups: Vec<Group>,
    /// `pi0d infer` inputs files the float model is run on to choose per-input-channel scales
    /// (`calibrate`); none: every weight rounded as it is.
    pub calibration: Vec<PathBuf>,
}

#[derive(Clone, Debug)]
pub struct QuantizeReport {
    pub manifest: Manifest,
}

/// What one output tensor is made from.
enum Source<'a> {
    /// Copied byte for byte.
    Copy(&'a Entry),
    /// A float weight `[out, in]` rewritten as `Part` of `Form`, its columns multiplied by
    /// `smooth` first when calibrated.
    Quantized {
        entry: &'a Entry,
        dtype: WeightDtype,
        form: Form,
        part: Part,
        smooth: Option<&'a [f32]>,
        /// Stored as `W R` (`w8a8`'s rotated layers), before `smooth`.
        rotated: bool,
        /// Its inputs' sums from calibration (GPTQ's rounding); none: to nearest.
        gram: Option<&'a Gram>,
    },
    /// Values computed beforehand (a calibrated weight's input scales).
    Floats(&'a [f32]),
}

#[derive(Clone, Copy, PartialEq)]
enum Form {
    Int8,
    Int4 { block: usize },
    Bf16,
}

#[derive(Clone, Copy, PartialEq)]
enum Part {
    Values,
    Scales,
}

/// One tensor of the output file, computed when the writer asks for its bytes: only one
/// quantized tensor is in memory at a time (the scales are computed again for their own
/// tensor rather than kept: the writer asks for every scale before any integers, and holding
/// a model's worth of integers costs more than rounding an int4 weight twice; int8's scales
/// need no GPTQ).
struct OutTensor<'a> {
    ck: &'a Checkpoint,
    source: Source<'a>,
    dtype: Dtype,
    shape: Vec<usize>,
    len: usize,
    /// The first failure while computing bytes (the writer cannot return one).
    failed: &'a RefCell<Option<QuantizeError>>,
}

impl View for &OutTensor<'_> {
    fn dtype(&self) -> Dtype {
        self.dtype
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        let (entry, dtype, form, part, smooth, rotated, gram) = match &self.source {
            Source::Copy(e) => return Cow::Borrowed(self.ck.bytes(e)),
            Source::Floats(v) => return Cow::Owned(f32_bytes(v)),
            Source::Quantized {
                entry,
                dtype,
                form,
                part,
                smooth,
                rotated,
                gram,
            } => (*entry, *dtype, *form, *part, *smooth, *rotated, *gram),
        };
        let mut w: Vec<f32> = decode(self.ck.bytes(entry), dtype).collect();
        self.ck.release(entry);
        let (n, k) = (entry.shape[0], entry.shape[1]);
        // `x W^T = (x R D^-1)(W R D)^T`, `D = diag(s)`: the model rotates, then divides by `s`.
        if rotated {
            hadamard::rotate_rows(&mut w, k, threads());
        }
        if let Some(s) = smooth {
            for row in w.chunks_exact_mut(k) {
                row.iter_mut().zip(s).for_each(|(v, d)| *v *= d);
            }
        }
        // GPTQ keeps int8's per-row scales (from the float row): only its integers need it.
        let gptq = part == Part::Values || matches!(form, Form::Int4 { .. });
        let hessian = gram.filter(|_| gptq).map(|g| g.hessian(smooth));
        let h = hessian.as_ref();
        let bytes = match (form, part) {
            (Form::Bf16, _) => w
                .iter()
                .flat_map(|v| bf16::from_f32(*v).to_le_bytes())
                .collect(),
            (Form::Int8, _) => match rounded_i8(&w, n, k, h, threads()) {
                Ok(q) if part == Part::Values => q.q.iter().map(|v| *v as u8).collect(),
                Ok(q) => f32_bytes(&q.scales),
                Err(source) => return self.fail(entry, source),
            },
            (Form::Int4 { block }, _) => match rounded_i4(&w, n, k, block, h, threads()) {
                Ok(q) if part == Part::Values => q.packed,
                Ok(q) => f32_bytes(&q.scales),
                Err(source) => return self.fail(entry, source),
            },
        };
        debug_assert_eq!(bytes.len(), self.len);
        Cow::Owned(bytes)
    }
    fn data_len(&self) -> usize {
        self.len
    }
}

impl OutTensor<'_> {
    /// Records the failure and returns bytes of the right length (the file is thrown away).
    fn fail(&self, entry: &Entry, source: pi0d_kernels::quant::QuantError) -> Cow<'static, [u8]> {
        let mut failed = self.failed.borrow_mut();
        if failed.is_none() {
            *failed = Some(QuantizeError::Tensor {
                tensor: entry.stored.clone(),
                source,
            });
        }
        Cow::Owned(vec![0; self.len])
    }
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// The files of a checkpoint directory that are not its weights (config, processors,
/// tokenizer), copied as they are.
fn side_files(dir: &Path, weight_files: &BTreeSet<PathBuf>) -> Result<Vec<PathBuf>, QuantizeError> {
    let io = |source| QuantizeError::Io {
        path: dir.into(),
        source,
    };
    let mut files = Vec::new();
    for e in std::fs::read_dir(dir).map_err(io)? {
        let path = e.map_err(io)?.path();
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
        let skip = matches!(
            name.as_deref(),
            Some("model.safetensors" | "model.safetensors.index.json" | MANIFEST)
        );
        if !skip && path.is_file() && !weight_files.contains(&path) {
            files.push(path);
        }
    }
    files.sort();
    Ok(files)
}

/// A float `[n, k]` linear weight of one of `groups`: its type, `n` and `k`.
fn to_quantize(e: &Entry, groups: &BTreeSet<Group>) -> Option<(WeightDtype, usize, usize)> {
    let chosen = Group::of(&e.name).is_some_and(|g| groups.contains(&g));
    match (chosen, WeightDtype::of(e.dtype), e.shape.as_slice()) {
        (true, Some(dtype), &[n, k]) => Some((dtype, n, k)),
        _ => None,
    }
}

/// How a float weight of `k` inputs is stored under `opts`.
fn form_for(opts: &QuantizeOptions, k: usize) -> Form {
    match opts.scheme {
        Scheme::Bf16 => Form::Bf16,
        Scheme::W8 | Scheme::W8a8 => Form::Int8,
        Scheme::W4 if k.is_multiple_of(opts.block) => Form::Int4 { block: opts.block },
        Scheme::W4 => Form::Int8,
    }
}

/// The per-input-channel scales calibration chooses for the weights to be quantized (`None`
/// without `--calibration`).
fn smoothing(
    opts: &QuantizeOptions,
    ck: &Checkpoint,
    groups: &BTreeSet<Group>,
    collected: Option<calibrate::Calibration>,
) -> Result<Option<(Smoothing, calibrate::Calibration)>, QuantizeError> {
    if opts.calibration.is_empty() && collected.is_none() {
        return Ok(None);
    }
    let targets: Vec<(String, Target)> = ck
        .entries()
        .filter_map(|e| {
            let (_, _, k) = to_quantize(e, groups)?;
            let target = match form_for(opts, k) {
                Form::Int4 { block } => Target::Int4 { block },
                _ => Target::Int8 {
                    int8_activations: opts.scheme == Scheme::W8a8,
                },
            };
            Some((e.name.clone(), target))
        })
        .collect();
    let threads = threads();
    let cal = match collected {
        Some(c) => c,
        None => calibrate::collect_any(
            &opts.checkpoint,
            None,
            &opts.calibration,
            calibrate::Purpose::Quantizing(opts.scheme),
            threads,
        )?,
    };
    let chosen = smooth::choose(ck, &cal, &targets, opts.scheme, threads)?;
    Ok(Some((chosen, cal)))
}

/// Calibration's model and GPTQ run on every core.
fn threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Writes the quantized checkpoint; returns its manifest.
pub fn quantize(opts: &QuantizeOptions) -> Result<QuantizeReport, QuantizeError> {
    quantize_with(opts, None)
}

/// As `quantize`, with calibration already collected (`opts.calibration` then only names it).
pub(crate) fn quantize_with(
    opts: &QuantizeOptions,
    collected: Option<calibrate::Calibration>,
) -> Result<QuantizeReport, QuantizeError> {
    if !opts.checkpoint.is_dir() {
        return Err(QuantizeError::Invalid(format!(
            "--checkpoint {}: expected a checkpoint directory (config.json beside model.safetensors)",
            opts.checkpoint.display()
        )));
    }
    if opts.scheme == Scheme::W4
        && !(opts.block.is_power_of_two() && (16..=256).contains(&opts.block))
    {
        return Err(QuantizeError::Invalid(format!(
            "--block {}: expected a power of two from 16 to 256",
            opts.block
        )));
    }
    if opts.checkpoint.join(MANIFEST).exists() {
        return Err(QuantizeError::Invalid(format!(
            "{} is already quantized ({MANIFEST}): quantize the float checkpoint it was made from",
            opts.checkpoint.display()
        )));
    }
    if opts.scheme == Scheme::Bf16 && !opts.calibration.is_empty() {
        return Err(QuantizeError::Invalid(
            "--calibration with --scheme bf16: calibration chooses how integers are rounded; bf16 rounds each weight to its nearest 16-bit float and has nothing to choose"
                .into(),
        ));
    }
    let ck = Checkpoint::load(&opts.checkpoint)?;
    let groups: BTreeSet<Group> = opts.groups.iter().copied().collect();
    let (smoothing, cal) = smoothing(opts, &ck, &groups, collected)?.unzip();
    let folds = match &smoothing {
        Some(s) => fold(&ck, &s.scales)?,
        None => Folds::default(),
    };
    let failed = RefCell::new(None);
    let mut tensors = Vec::new();
    let (mut count, mut before, mut after) = (0, 0u64, 0u64);
    let mut stored_as_w8 = Vec::new();
    let mut smoothed = 0;
    let mut rotated_names = BTreeSet::new();
    let mut entries: Vec<&Entry> = ck.entries().collect();
    entries.sort_by(|a, b| a.stored.cmp(&b.stored));
    for e in entries {
        let out = |source, dtype, shape: Vec<usize>, len| OutTensor {
            ck: &ck,
            source,
            dtype,
            shape,
            len,
            failed: &failed,
        };
        if e.name.ends_with(".weight_scale") || e.name.ends_with(".weight_input_scale") {
            return Err(QuantizeError::Invalid(format!(
                "{}: tensor `{}` is a quantized weight's scales: this checkpoint is already quantized; quantize the float checkpoint it was made from",
                ck.path.display(),
                e.stored
            )));
        }
        if let Some(v) = folds.tensors.get(&e.name) {
            tensors.push((
                e.stored.clone(),
                out(Source::Floats(v), Dtype::F32, e.shape.clone(), 4 * v.len()),
            ));
            continue;
        }
        let Some((dtype, n, k)) = to_quantize(e, &groups) else {
            if Group::of(&e.name).is_some() && WeightDtype::of(e.dtype).is_none() {
                return Err(QuantizeError::Invalid(format!(
                    "{}: tensor `{}` is stored as {:?}: this checkpoint is already quantized; quantize the float checkpoint it was made from",
                    ck.path.display(),
                    e.stored,
                    e.dtype
                )));
            }
            tensors.push((
                e.stored.clone(),
                out(Source::Copy(e), e.dtype, e.shape.clone(), e.bytes),
            ));
            continue;
        };
        let form = form_for(opts, k);
        if opts.scheme == Scheme::W4 && form == Form::Int8 {
            stored_as_w8.push(e.stored.clone());
        }
        let smooth = smoothing
            .as_ref()
            .and_then(|s| s.scales.get(&e.name))
            .map(Vec::as_slice);
        let gram = cal.as_ref().and_then(|c| c.gram(&e.name));
        let rotated = rotates(opts.scheme, &e.name, k);
        if rotated {
            rotated_names.insert(e.stored.clone());
        }
        let quantized = |part| Source::Quantized {
            entry: e,
            dtype,
            form,
            part,
            smooth,
            rotated,
            gram,
        };
        let (values, scales) = match form {
            Form::Bf16 => (
                out(quantized(Part::Values), Dtype::BF16, vec![n, k], n * k * 2),
                None,
            ),
            Form::Int8 => (
                out(quantized(Part::Values), Dtype::I8, vec![n, k], n * k),
                Some(out(quantized(Part::Scales), Dtype::F32, vec![n], n * 4)),
            ),
            Form::Int4 { block } => (
                out(
                    quantized(Part::Values),
                    Dtype::U8,
                    vec![n, k / 2],
                    n * k / 2,
                ),
                Some(out(
                    quantized(Part::Scales),
                    Dtype::F32,
                    vec![n, k / block],
                    n * (k / block) * 4,
                )),
            ),
        };
        count += 1;
        before += e.bytes as u64;
        after += (values.len + scales.as_ref().map_or(0, |s| s.len)) as u64;
        tensors.push((e.stored.clone(), values));
        if let Some(s) = scales {
            tensors.push((format!("{}_scale", e.stored), s));
        }
        if smooth.is_some() {
            smoothed += 1;
        }
        if let Some(s) = smooth.filter(|_| !folds.weights.contains(&e.name)) {
            after += 4 * k as u64;
            tensors.push((
                format!("{}{INPUT_SCALE}", e.stored),
                out(Source::Floats(s), Dtype::F32, vec![k], 4 * k),
            ));
        }
    }
    if count == 0 {
        return Err(QuantizeError::Invalid(format!(
            "{}: no linear weights of the groups {} found: nothing to quantize",
            ck.path.display(),
            opts.groups
                .iter()
                .map(|g| g.name())
                .collect::<Vec<_>>()
                .join(", ")
        )));
    }
    let staging = Staging::new(&opts.out, MANIFEST, "quantized checkpoint")?;
    let weights = staging.tmp.join("model.safetensors");
    let meta = HashMap::from([
        ("format".to_string(), "pt".to_string()),
        (
            "pi0d.quantization".to_string(),
            opts.scheme.name().to_string(),
        ),
    ]);
    safetensors::serialize_to_file(
        tensors.iter().map(|(n, t)| (n.as_str(), t)),
        Some(meta),
        &weights,
    )
    .map_err(|source| QuantizeError::Write {
        path: weights.clone(),
        source,
    })?;
    if let Some(e) = failed.into_inner() {
        return Err(e);
    }
    let weight_files: BTreeSet<PathBuf> = ck.files().map(|(p, _)| p.to_path_buf()).collect();
    for file in side_files(&opts.checkpoint, &weight_files)? {
        let Some(name) = file.file_name() else {
            continue;
        };
        let to = staging.tmp.join(name);
        std::fs::copy(&file, &to).map_err(|source| QuantizeError::Io { path: to, source })?;
    }
    let manifest = Manifest {
        format: FORMAT.into(),
        producer: format!("pi0d {}", env!("CARGO_PKG_VERSION")),
        scheme: opts.scheme,
        block: (opts.scheme == Scheme::W4).then_some(opts.block),
        quantized_groups: groups.iter().copied().collect(),
        float_groups: Group::ALL
            .into_iter()
            .filter(|g| !groups.contains(g))
            .collect(),
        stored_as_w8,
        calibration: opts.calibration.clone(),
        observations: cal.as_ref().map_or(0, |c| c.observations),
        rounding: if cal.is_some() {
            Rounding::Gptq
        } else {
            Rounding::Nearest
        },
        smoothed,
        folded_norms: folds.stored,
        smoothing: smoothing.map(|s| s.chosen).unwrap_or_default(),
        rotated: rotated_names,
        tensors: count,
        bytes_before: before,
        bytes_after: after,
        source: opts.checkpoint.clone(),
    };
    let path = staging.tmp.join(MANIFEST);
    let text = serde_json::to_string_pretty(&manifest)
        .map_err(|e| QuantizeError::Invalid(format!("the manifest does not serialize: {e}")))?;
    std::fs::write(&path, text + "\n").map_err(|source| QuantizeError::Io { path, source })?;
    staging.commit()?;
    Ok(QuantizeReport { manifest })
}

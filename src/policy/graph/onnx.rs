//! The `onnx` graph runtime: the exported graphs on ONNX Runtime (`ort`, library loaded at run
//! time). Host input tensors are allocated once and rewritten in place; the KV cache is bound as
//! a device output of the prefix and as an input of the denoise graph, so it stays wherever the
//! execution provider keeps it (GPU / NPU memory) for all steps.

use std::collections::BTreeMap;
use std::ffi::CStr;
use std::path::{Path, PathBuf};

use ort::execution_providers::cann::CANNPrecisionMode;
use ort::execution_providers::{
    CANNExecutionProvider, CPUExecutionProvider, CUDAExecutionProvider, ExecutionProviderDispatch,
    TensorRTExecutionProvider,
};
use ort::io_binding::IoBinding;
use ort::memory::{AllocationDevice, Allocator, AllocatorType, MemoryInfo, MemoryType};
use ort::session::builder::GraphOptimizationLevel;
use ort::session::Session;
use ort::value::{DynValue, Tensor};

use super::manifest::Manifest;
use super::onnx_probes::Probes;
use super::provider::{ExecutionProvider, OnnxOptions};
use super::tables::{PrefixTables, SuffixTables};
use super::{GraphError, GraphRuntime};
use crate::policy::export::pi0::names;
use crate::policy::pi0::quant::{ActivationRange, Group};

/// The ONNX Runtime API version `ort` was built against (1.22): older libraries lack entries.
const MIN_MINOR: u32 = 22;

/// A failure while running. ONNX Runtime's message goes into the text: `GraphError` is the same
/// type with or without the optional `onnx` feature, so it cannot hold an `ort::Error`.
fn rt(context: &str) -> impl Fn(ort::Error) -> GraphError + '_ {
    move |e| GraphError::Runtime(format!("{context}: {e}"))
}

/// A failure while setting the runtime up (library, sessions, providers, host tensors).
fn ld(context: &str) -> impl Fn(ort::Error) -> GraphError + '_ {
    move |e| GraphError::Load(format!("{context}: {e}"))
}

/// Finds and checks the library before `ort` touches it (`ort` panics on a missing or too old
/// library; pi0d reports it instead).
fn load_library(opts: &OnnxOptions) -> Result<PathBuf, GraphError> {
    let path = opts
        .library
        .clone()
        .or_else(|| std::env::var_os("ORT_DYLIB_PATH").map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from("libonnxruntime.so"));
    let hint = "install ONNX Runtime >= 1.22 (the onnxruntime / onnxruntime-gpu / onnxruntime-cann wheel ships it under onnxruntime/capi/) and name it with policy.onnx.library in the config, --onnx-library on pi0d infer, or the ORT_DYLIB_PATH environment variable";
    // SAFETY: loading ONNX Runtime runs its initializers, which have no preconditions; the
    // symbol is ONNX Runtime's documented C entry point with this signature.
    let version = unsafe {
        let lib = libloading::Library::new(&path).map_err(|e| {
            GraphError::Load(format!(
                "cannot load the ONNX Runtime library {}: {e}; {hint}",
                path.display()
            ))
        })?;
        let base: libloading::Symbol<unsafe extern "C" fn() -> *const ort::sys::OrtApiBase> =
            lib.get(b"OrtGetApiBase").map_err(|e| {
                GraphError::Load(format!(
                    "{} is not ONNX Runtime (no OrtGetApiBase: {e})",
                    path.display()
                ))
            })?;
        let base = base();
        if base.is_null() {
            return Err(GraphError::Load(format!(
                "{}: OrtGetApiBase returned null",
                path.display()
            )));
        }
        CStr::from_ptr(((*base).GetVersionString)())
            .to_string_lossy()
            .into_owned()
    };
    let minor = version
        .split('.')
        .nth(1)
        .and_then(|m| m.parse::<u32>().ok())
        .unwrap_or(0);
    if minor < MIN_MINOR {
        return Err(GraphError::Load(format!(
            "{} is ONNX Runtime {version}; pi0d needs 1.{MIN_MINOR} or newer: {hint}",
            path.display()
        )));
    }
    Ok(path)
}

fn provider(p: &ExecutionProvider) -> Result<ExecutionProviderDispatch, GraphError> {
    Ok(match p {
        ExecutionProvider::Cpu => CPUExecutionProvider::default().build(),
        ExecutionProvider::Cuda { device_id } => CUDAExecutionProvider::default()
            .with_device_id(*device_id)
            .build()
            .error_on_failure(),
        ExecutionProvider::TensorRt {
            device_id,
            fp16,
            engine_cache,
        } => {
            let mut ep = TensorRTExecutionProvider::default()
                .with_device_id(*device_id)
                .with_fp16(*fp16)
                .with_layer_norm_fp32_fallback(true);
            if let Some(dir) = engine_cache {
                ep = ep
                    .with_engine_cache(true)
                    .with_engine_cache_path(dir.display())
                    .with_timing_cache(true)
                    .with_timing_cache_path(dir.display());
            }
            ep.build().error_on_failure()
        }
        ExecutionProvider::Cann {
            device_id,
            graph,
            precision_mode,
        } => {
            let mut ep = CANNExecutionProvider::default()
                .with_device_id(*device_id)
                .with_cann_graph(*graph);
            if let Some(mode) = precision_mode {
                ep = ep.with_precision_mode(match mode.as_str() {
                    "force_fp32" => CANNPrecisionMode::ForceFP32,
                    "force_fp16" => CANNPrecisionMode::ForceFP16,
                    "allow_fp32_to_fp16" => CANNPrecisionMode::AllowFP32ToFP16,
                    "must_keep_origin_dtype" => CANNPrecisionMode::MustKeepOrigin,
                    "allow_mix_precision" => CANNPrecisionMode::AllowMixedPrecision,
                    other => {
                        return Err(GraphError::Load(format!(
                            "CANN precision mode {other:?} is not one of {:?}",
                            super::provider::CANN_PRECISION_MODES
                        )))
                    }
                });
            }
            ep.build().error_on_failure()
        }
    })
}

/// Where the provider keeps its tensors (the KV cache is bound there).
fn device_memory(p: &ExecutionProvider) -> Result<MemoryInfo, GraphError> {
    let (device, id) = match p {
        ExecutionProvider::Cpu => (AllocationDevice::CPU, 0),
        ExecutionProvider::Cuda { device_id } | ExecutionProvider::TensorRt { device_id, .. } => {
            (AllocationDevice::CUDA, *device_id)
        }
        ExecutionProvider::Cann { device_id, .. } => (AllocationDevice::CANN, *device_id),
    };
    MemoryInfo::new(device, id, AllocatorType::Device, MemoryType::Default)
        .map_err(rt("device memory info"))
}

/// A host tensor allocated once and rewritten before each run.
struct HostInput<T: ort::tensor::PrimitiveTensorElementType + Copy + std::fmt::Debug> {
    name: String,
    tensor: Tensor<T>,
}

impl<T: ort::tensor::PrimitiveTensorElementType + Copy + std::fmt::Debug + 'static> HostInput<T> {
    fn new(name: &str, shape: &[usize]) -> Result<Self, GraphError> {
        let dims: Vec<i64> = shape.iter().map(|&d| d as i64).collect();
        Ok(HostInput {
            name: name.into(),
            tensor: Tensor::<T>::new(&Allocator::default(), dims)
                .map_err(ld(&format!("allocating `{name}`")))?,
        })
    }

    /// Copies `data` in and (re)binds it (binding copies to the device when there is one).
    fn bind(&mut self, binding: &mut IoBinding, data: &[T]) -> Result<(), GraphError> {
        let (_, dst) = self.tensor.extract_tensor_mut();
        if dst.len() != data.len() {
            return Err(GraphError::Input {
                name: self.name.clone(),
                message: format!("{} values, the graph takes {}", data.len(), dst.len()),
            });
        }
        dst.copy_from_slice(data);
        binding
            .bind_input(self.name.as_str(), &self.tensor)
            .map_err(rt(&format!("binding `{}`", self.name)))
    }
}

pub(crate) struct OnnxRuntime {
    prefix: Session,
    denoise: Session,
    prefix_binding: IoBinding,
    denoise_binding: IoBinding,
    images: Vec<HostInput<f32>>,
    tokens: HostInput<i64>,
    prefix_bias: HostInput<f32>,
    prefix_cos: HostInput<f32>,
    prefix_sin: HostInput<f32>,
    state: Option<HostInput<f32>>,
    x: HostInput<f32>,
    time: HostInput<f32>,
    suffix_bias: HostInput<f32>,
    suffix_cos: HostInput<f32>,
    suffix_sin: HostInput<f32>,
    /// `--rtc` graphs: `rtc_target`, `rtc_weights`, `rtc_guidance`.
    rtc: Option<[HostInput<f32>; 3]>,
    /// Graphs of a checkpoint trained for real-time chunking: `rtc_clean`, and unrolled
    /// `rtc_clean_values`.
    clean: Option<(HostInput<f32>, Option<HostInput<f32>>)>,
    /// The prefix's output, kept on the provider's device between runs.
    kv: Option<DynValue>,
    /// With `--activations`: the prefix's and the denoise graph's probe outputs, and the
    /// largest magnitudes they measured so far.
    probes: Option<[Probes; 2]>,
    ranges: BTreeMap<Group, ActivationRange>,
    /// Graph runs per denoising: one when unrolled, else one per step.
    runs: usize,
    /// The provider (its memory info is made per run: `MemoryInfo` is not `Send`).
    provider: ExecutionProvider,
    out_name: &'static str,
}

impl OnnxRuntime {
    /// The graphs in `dir`; with `probed`, each marked value's largest magnitude is measured
    /// on every run (`activations`).
    pub(crate) fn load(
        dir: &Path,
        m: &Manifest,
        opts: &OnnxOptions,
        probed: bool,
    ) -> Result<OnnxRuntime, GraphError> {
        let lib = load_library(opts)?;
        ort::init_from(lib.display().to_string())
            .with_name("pi0d")
            .commit()
            .map_err(ld("ONNX Runtime environment"))?;
        let session = |file: &str| -> Result<(Session, Option<Probes>), GraphError> {
            let path = dir.join(file);
            // ONNX Runtime would block on a FIFO, or read a device without end.
            crate::files::open_regular(&path)
                .map_err(|e| GraphError::Load(format!("{}: {e}", crate::outside::path(&path))))?;
            let mut b = Session::builder()
                .map_err(ld("session builder"))?
                .with_optimization_level(GraphOptimizationLevel::Level3)
                .map_err(ld("optimization level"))?
                .with_execution_providers([provider(&opts.provider)?])
                .map_err(ld(&format!("execution provider {}", opts.provider.name())))?;
            if opts.threads > 0 {
                b = b.with_intra_threads(opts.threads).map_err(ld("threads"))?;
            }
            if !probed {
                let s = b
                    .commit_from_file(&path)
                    .map_err(ld(&format!("loading {}", path.display())))?;
                return Ok((s, None));
            }
            let (bytes, probes) = Probes::instrument(&path)?;
            // Loaded from memory: external weights are looked for beside the file.
            let s = b
                .with_config_entry(
                    "session.model_external_initializers_file_folder_path",
                    dir.display().to_string(),
                )
                .map_err(ld("external data folder"))?
                .commit_from_memory(&bytes)
                .map_err(ld(&format!("loading {}", path.display())))?;
            Ok((s, Some(probes)))
        };
        let (prefix, prefix_probes) = session(&m.graphs.prefix.file)?;
        let (denoise, denoise_probes) = session(&m.graphs.denoise.file)?;
        let mut prefix_binding = prefix.create_binding().map_err(ld("prefix binding"))?;
        let mut denoise_binding = denoise.create_binding().map_err(ld("denoise binding"))?;
        let probes = match (prefix_probes, denoise_probes) {
            (Some(p), Some(d)) => {
                p.bind(&mut prefix_binding)?;
                d.bind(&mut denoise_binding)?;
                Some([p, d])
            }
            _ => None,
        };
        let (b, s, p, n, hd) = (
            m.batch,
            m.image_size,
            m.prefix_len,
            m.suffix_len,
            m.head_dim,
        );
        let images = (0..m.cameras)
            .map(|i| HostInput::new(&names::image(i), &[b, 3, s, s]))
            .collect::<Result<_, _>>()?;
        let (x_name, out_name) = if m.unrolled {
            (names::NOISE, names::ACTIONS)
        } else {
            (names::X_T, names::X_NEXT)
        };
        let time_shape = if m.unrolled {
            vec![m.steps, b, m.expert_width]
        } else {
            vec![b, m.expert_width]
        };
        // The actions come back to the host every step: bound to a host tensor once.
        let out = Tensor::<f32>::new(
            &Allocator::default(),
            [b as i64, m.chunk as i64, m.action_dim as i64],
        )
        .map_err(ld("allocating the output"))?;
        denoise_binding
            .bind_output(out_name, out)
            .map_err(ld("binding the output"))?;
        Ok(OnnxRuntime {
            provider: opts.provider.clone(),
            images,
            tokens: HostInput::new(names::LANG_TOKENS, &[b, m.prompt_len])?,
            prefix_bias: HostInput::new(names::PREFIX_BIAS, &[b, 1, 1, p, p])?,
            prefix_cos: HostInput::new(names::PREFIX_COS, &[b, p, hd])?,
            prefix_sin: HostInput::new(names::PREFIX_SIN, &[b, p, hd])?,
            state: (!m.is_pi05())
                .then(|| HostInput::new(names::STATE, &[b, m.state_dim]))
                .transpose()?,
            x: HostInput::new(x_name, &[b, m.chunk, m.action_dim])?,
            time: HostInput::new(names::TIME_EMB, &time_shape)?,
            suffix_bias: HostInput::new(names::SUFFIX_BIAS, &[b, 1, 1, n, p + n])?,
            suffix_cos: HostInput::new(names::SUFFIX_COS, &[b, n, hd])?,
            suffix_sin: HostInput::new(names::SUFFIX_SIN, &[b, n, hd])?,
            rtc: m
                .rtc
                .then(|| -> Result<_, GraphError> {
                    Ok([
                        HostInput::new(names::RTC_TARGET, &[b, m.chunk, m.action_dim])?,
                        HostInput::new(names::RTC_WEIGHTS, &[b, m.chunk, 1])?,
                        HostInput::new(names::RTC_GUIDANCE, &[m.steps])?,
                    ])
                })
                .transpose()?,
            clean: m
                .trained_rtc
                .map(|_| -> Result<_, GraphError> {
                    let values = m
                        .unrolled
                        .then(|| {
                            HostInput::new(names::RTC_CLEAN_VALUES, &[b, m.chunk, m.action_dim])
                        })
                        .transpose()?;
                    Ok((HostInput::new(names::RTC_CLEAN, &[b, m.chunk, 1])?, values))
                })
                .transpose()?,
            prefix,
            denoise,
            prefix_binding,
            denoise_binding,
            kv: None,
            probes,
            ranges: BTreeMap::new(),
            runs: if m.unrolled { 1 } else { m.steps },
            out_name,
        })
    }
}

impl GraphRuntime for OnnxRuntime {
    fn activations(&self) -> Vec<ActivationRange> {
        self.ranges.values().cloned().collect()
    }

    fn run_prefix(
        &mut self,
        images: &[&[f32]],
        tokens: &[i64],
        t: &PrefixTables,
    ) -> Result<(), GraphError> {
        let bind = &mut self.prefix_binding;
        for (input, data) in self.images.iter_mut().zip(images) {
            input.bind(bind, data)?;
        }
        self.tokens.bind(bind, tokens)?;
        self.prefix_bias.bind(bind, &t.bias)?;
        self.prefix_cos.bind(bind, &t.cos)?;
        self.prefix_sin.bind(bind, &t.sin)?;
        let device = device_memory(&self.provider)?;
        bind.bind_output_to_device(names::KV_CACHE, &device)
            .map_err(rt("binding the KV cache"))?;
        let mut out = self
            .prefix
            .run_binding(bind)
            .map_err(rt("running the prefix graph"))?;
        if let Some([p, _]) = &self.probes {
            p.read(&out, &mut self.ranges)?;
        }
        let kv = out
            .remove(names::KV_CACHE)
            .ok_or_else(|| GraphError::Runtime("the prefix graph returned no kv_cache".into()))?;
        drop(out);
        self.denoise_binding
            .bind_input(names::KV_CACHE, &kv)
            .map_err(rt("binding the KV cache to the denoise graph"))?;
        self.kv = Some(kv);
        // The suffix tables depend on the prefix's pad mask only: bound once per observation.
        Ok(())
    }

    fn run_denoise(
        &mut self,
        state: Option<&[f32]>,
        x: &mut [f32],
        time: &[f32],
        t: &SuffixTables,
        mut guide: Option<&mut super::StepHook<'_>>,
    ) -> Result<(), GraphError> {
        if self.kv.is_none() {
            return Err(GraphError::Runtime(
                "denoise graph run before the prefix".into(),
            ));
        }
        let bind = &mut self.denoise_binding;
        if let (Some(input), Some(s)) = (self.state.as_mut(), state) {
            input.bind(bind, s)?;
        }
        self.suffix_bias.bind(bind, &t.bias)?;
        self.suffix_cos.bind(bind, &t.cos)?;
        self.suffix_sin.bind(bind, &t.sin)?;
        if let Some([target, weights, guidance]) = self.rtc.as_mut() {
            let r = t.rtc.as_ref().ok_or_else(|| {
                GraphError::Runtime("an --rtc graph run without its guidance tables".into())
            })?;
            target.bind(bind, &r.target)?;
            weights.bind(bind, &r.weights)?;
            guidance.bind(bind, &r.guidance)?;
        }
        if let Some((clean, values)) = self.clean.as_mut() {
            let c = t.clean.as_ref().ok_or_else(|| {
                GraphError::Runtime(
                    "graphs trained for real-time chunking run without their clamp tables".into(),
                )
            })?;
            clean.bind(bind, &c.clean)?;
            if let Some(v) = values.as_mut() {
                v.bind(bind, &c.values)?;
            }
        }
        let per_run = time.len() / self.runs;
        let mut before = guide.as_ref().map(|_| vec![0.0f32; x.len()]);
        for run in 0..self.runs {
            if let Some(b) = before.as_mut() {
                b.copy_from_slice(x);
            }
            self.x.bind(&mut self.denoise_binding, x)?;
            self.time.bind(
                &mut self.denoise_binding,
                &time[run * per_run..(run + 1) * per_run],
            )?;
            let out = self
                .denoise
                .run_binding(&self.denoise_binding)
                .map_err(rt("running the denoise graph"))?;
            if let Some([_, d]) = &self.probes {
                d.read(&out, &mut self.ranges)?;
            }
            let v = out
                .get(self.out_name)
                .ok_or_else(|| GraphError::Runtime(format!("no `{}` output", self.out_name)))?;
            let (_, data) = v
                .try_extract_tensor::<f32>()
                .map_err(rt("reading the output"))?;
            if data.len() != x.len() {
                return Err(GraphError::Runtime(format!(
                    "`{}` has {} values, expected {}",
                    self.out_name,
                    data.len(),
                    x.len()
                )));
            }
            x.copy_from_slice(data);
            if let (Some(g), Some(b)) = (guide.as_mut(), before.as_ref()) {
                g(run, b, x);
            }
        }
        Ok(())
    }
}

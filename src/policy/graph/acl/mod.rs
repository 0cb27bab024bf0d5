//! The `acl` graph runtime: the exported graphs compiled by ATC into offline models (`.om`),
//! run through AscendCL on an Ascend NPU (Atlas 300I / 200I / 800 boards).
//!
//! Everything AscendCL touches lives on one dedicated thread that owns the context and stream
//! (AscendCL contexts are per thread). Device buffers and the models' datasets are made once at
//! load (`plan`); per observation the host uploads the inputs, the prefix and all denoising steps
//! are queued on the stream back to back (the KV cache and `x` never leave the device), and one
//! synchronization later the actions are read back.

pub(crate) mod error;
pub(crate) mod ffi;
pub(crate) mod plan;

use std::ffi::{c_void, CStr, CString};
use std::path::Path;
use std::sync::mpsc;
use std::thread::JoinHandle;

use super::manifest::Manifest;
use super::tables::{PrefixTables, SuffixTables};
use super::{GraphError, GraphRuntime};
use ffi::{AclApi, Handle};
use plan::{BufferPlan, Execution, HostSource, ModelIo};

pub(crate) use crate::config::AclOptions;

/// The offline model ATC writes for an exported graph (`prefix.onnx` -> `prefix.om`).
pub(crate) fn om_file(onnx_file: &str) -> String {
    format!("{}.om", onnx_file.trim_end_matches(".onnx"))
}

/// A plain-data slice as bytes.
/// One of an `--rtc` graph's guidance tables, refused when the driver made none.
fn rtc(
    tables: &super::tables::SuffixTables,
    pick: impl Fn(&super::tables::RtcTables) -> &Vec<f32>,
) -> Result<&[u8], GraphError> {
    tables
        .rtc
        .as_ref()
        .map(|r| as_bytes(pick(r)))
        .ok_or_else(|| GraphError::Runtime("an --rtc graph run without its guidance tables".into()))
}

/// A table of training-time real-time chunking's clamp, for graphs of a checkpoint trained
/// for it.
fn clean(
    tables: &super::tables::SuffixTables,
    pick: impl Fn(&super::tables::CleanTables) -> &Vec<f32>,
) -> Result<&[u8], GraphError> {
    tables
        .clean
        .as_ref()
        .map(|c| as_bytes(pick(c)))
        .ok_or_else(|| {
            GraphError::Runtime(
                "graphs trained for real-time chunking run without their clamp tables".into(),
            )
        })
}

/// The NPU's `x` into `x`, refused when it has another size.
fn take_actions(out: &[f32], x: &mut [f32]) -> Result<(), GraphError> {
    if out.len() != x.len() {
        return Err(GraphError::Runtime(format!(
            "the NPU returned {} action values, expected {}",
            out.len(),
            x.len()
        )));
    }
    x.copy_from_slice(out);
    Ok(())
}

fn as_bytes<T: Copy>(v: &[T]) -> &[u8] {
    // SAFETY: T is f32 or i64 here (no padding, every byte initialized); the length covers
    // exactly the slice's memory.
    unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u8, std::mem::size_of_val(v)) }
}

enum Request {
    Prefix {
        images: Vec<Vec<f32>>,
        tokens: Vec<i64>,
        tables: PrefixTables,
    },
    Denoise {
        state: Option<Vec<f32>>,
        x: Vec<f32>,
        time: Vec<f32>,
        tables: SuffixTables,
    },
    /// One looped run, its `x` back to the host (real-time chunking guides it there): run 0
    /// uploads everything as `Denoise` does; a later run only its (guided) `x`.
    DenoiseStep {
        run: usize,
        state: Option<Vec<f32>>,
        x: Vec<f32>,
        time: Vec<f32>,
        tables: SuffixTables,
    },
}

type Reply = Result<Vec<f32>, GraphError>;

pub(crate) struct AclRuntime {
    requests: Option<mpsc::Sender<(Request, mpsc::Sender<Reply>)>>,
    thread: Option<JoinHandle<()>>,
    /// Denoise-graph runs per chunk (the steps when looped).
    runs: usize,
}

impl AclRuntime {
    /// Starts the AscendCL thread and loads `prefix.om` and the denoise `.om` from `dir`.
    pub(crate) fn load(
        dir: &Path,
        m: &Manifest,
        opts: &AclOptions,
    ) -> Result<AclRuntime, GraphError> {
        let plan = plan::plan(m)?;
        let runs = plan.denoise.len();
        let (tx, rx) = mpsc::channel::<(Request, mpsc::Sender<Reply>)>();
        let (ready_tx, ready_rx) = mpsc::channel::<Result<(), GraphError>>();
        let (dir, m, opts) = (dir.to_path_buf(), m.clone(), opts.clone());
        let thread = std::thread::Builder::new()
            .name("pi0d-acl".into())
            .spawn(move || {
                let mut device = match Device::open(&dir, &m, &opts, plan) {
                    Ok(d) => {
                        let _ = ready_tx.send(Ok(()));
                        d
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                for (request, reply) in rx {
                    let _ = reply.send(device.serve(request));
                }
            })
            .map_err(|e| GraphError::Runtime(format!("cannot start the AscendCL thread: {e}")))?;
        match ready_rx.recv() {
            Ok(Ok(())) => Ok(AclRuntime {
                requests: Some(tx),
                thread: Some(thread),
                runs,
            }),
            Ok(Err(e)) => {
                let _ = thread.join();
                Err(e)
            }
            Err(_) => {
                let _ = thread.join();
                Err(GraphError::Load(
                    "the AscendCL thread died while loading".into(),
                ))
            }
        }
    }

    fn call(&self, request: Request) -> Reply {
        let (tx, rx) = mpsc::channel();
        self.requests
            .as_ref()
            .and_then(|r| r.send((request, tx)).ok())
            .ok_or_else(|| GraphError::Runtime("the AscendCL thread is gone".into()))?;
        rx.recv()
            .map_err(|_| GraphError::Runtime("the AscendCL thread died during a run".into()))?
    }
}

impl Drop for AclRuntime {
    fn drop(&mut self) {
        // Closing the channel ends the thread's loop; it then releases the device.
        self.requests.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl GraphRuntime for AclRuntime {
    fn run_prefix(
        &mut self,
        images: &[&[f32]],
        tokens: &[i64],
        tables: &PrefixTables,
    ) -> Result<(), GraphError> {
        self.call(Request::Prefix {
            images: images.iter().map(|i| i.to_vec()).collect(),
            tokens: tokens.to_vec(),
            tables: tables.clone(),
        })
        .map(|_| ())
    }

    fn run_denoise(
        &mut self,
        state: Option<&[f32]>,
        x: &mut [f32],
        time: &[f32],
        tables: &SuffixTables,
        guide: Option<&mut super::StepHook<'_>>,
    ) -> Result<(), GraphError> {
        if let Some(g) = guide {
            // A host round trip per step (an unrolled `--rtc` graph avoids it).
            let runs = self.runs;
            let mut before = vec![0.0f32; x.len()];
            for run in 0..runs {
                before.copy_from_slice(x);
                let out = self.call(Request::DenoiseStep {
                    run,
                    state: (run == 0).then(|| state.map(<[f32]>::to_vec)).flatten(),
                    x: x.to_vec(),
                    time: if run == 0 { time.to_vec() } else { Vec::new() },
                    tables: if run == 0 {
                        tables.clone()
                    } else {
                        SuffixTables::default()
                    },
                })?;
                take_actions(&out, x)?;
                g(run, &before, x);
            }
            return Ok(());
        }
        let out = self.call(Request::Denoise {
            state: state.map(<[f32]>::to_vec),
            x: x.to_vec(),
            time: time.to_vec(),
            tables: tables.clone(),
        })?;
        take_actions(&out, x)
    }
}

struct Model {
    id: u32,
    desc: *mut c_void,
}

/// A model execution's datasets and the data buffers inside them.
struct Datasets {
    input: *mut c_void,
    output: *mut c_void,
    buffers: Vec<*mut c_void>,
}

/// AscendCL runtimes alive in this process: AscendCL is initialized once per process and
/// finalized when the last runtime ends (CANN: `aclFinalize` before the process exits).
static RUNTIMES: std::sync::Mutex<usize> = std::sync::Mutex::new(0);

/// AscendCL state, owned by the AscendCL thread only.
struct Device {
    api: AclApi,
    /// Counted in `RUNTIMES` (AscendCL initialized for it).
    counted: bool,
    /// `aclrtSetDevice` succeeded: the device is reset at the end.
    device_set: bool,
    device_id: i32,
    context: Handle,
    stream: Handle,
    models: Vec<Model>,
    memory: Vec<*mut c_void>,
    prefix: Option<Datasets>,
    denoise: Vec<Datasets>,
    plan: BufferPlan,
}

/// What AscendCL says of this machine, and what the offline models were compiled for.
struct Found {
    version: String,
    soc: String,
    devices: u32,
    compiled_for: Option<String>,
}

impl Device {
    /// The library's version, the SoC, the device count; refuses a device id beyond the count
    /// and offline models `pi0d export` compiled for another SoC (they would fail at their
    /// first execution).
    fn what_is_here(&self, dir: &Path) -> Result<Found, GraphError> {
        let (mut major, mut minor, mut patch, mut devices) = (0, 0, 0, 0u32);
        // SAFETY: as in `open`; the SoC name is a NUL-terminated string owned by AscendCL,
        // copied at once.
        let soc = unsafe {
            self.check(
                "aclrtGetVersion",
                (self.api.aclrtGetVersion)(&mut major, &mut minor, &mut patch),
            )?;
            self.check(
                "aclrtGetDeviceCount",
                (self.api.aclrtGetDeviceCount)(&mut devices),
            )?;
            let p = (self.api.aclrtGetSocName)();
            (!p.is_null()).then(|| CStr::from_ptr(p).to_string_lossy().into_owned())
        }
        .unwrap_or_else(|| "unknown".into());
        if u32::try_from(self.device_id).map_or(true, |id| id >= devices) {
            return Err(GraphError::Load(format!(
                "policy.acl.device_id {}: this machine has {devices} NPU(s) (0..{devices}; npu-smi info lists them)",
                self.device_id
            )));
        }
        let compiled_for = crate::policy::export::atc::compiled_for(dir);
        if let Some(c) = compiled_for.as_ref().filter(|c| **c != soc) {
            return Err(GraphError::Load(format!(
                "{}: the offline models were compiled for {c}, this NPU is {soc}: compile them again with `pi0d export --atc {soc}`",
                dir.display()
            )));
        }
        Ok(Found {
            version: format!("{major}.{minor}.{patch}"),
            soc,
            devices,
            compiled_for,
        })
    }

    fn check(&self, call: &str, code: ffi::AclError) -> Result<(), GraphError> {
        if code == 0 {
            return Ok(());
        }
        // SAFETY: aclGetRecentErrMsg returns null or a NUL-terminated string owned by
        // AscendCL, valid until the next AscendCL call on this thread; it is copied at once.
        let recent = unsafe {
            let p = (self.api.aclGetRecentErrMsg)();
            (!p.is_null()).then(|| CStr::from_ptr(p).to_string_lossy().into_owned())
        };
        let message = error::message(call, code, recent.as_deref());
        Err(if error::device_lost(code) {
            GraphError::DeviceLost(message)
        } else {
            GraphError::Runtime(message)
        })
    }

    fn open(
        dir: &Path,
        m: &Manifest,
        opts: &AclOptions,
        plan: BufferPlan,
    ) -> Result<Device, GraphError> {
        let api = ffi::load(opts.library.as_deref())?;
        let mut d = Device {
            api,
            counted: false,
            device_set: false,
            device_id: opts.device_id,
            context: std::ptr::null_mut(),
            stream: std::ptr::null_mut(),
            models: Vec::new(),
            memory: Vec::new(),
            prefix: None,
            denoise: Vec::new(),
            plan,
        };
        // SAFETY (this block and the calls below): AscendCL functions called with the argument
        // types they are documented with (`ffi`), out-pointers to live locals, and handles this
        // thread created and has not released.
        let found = unsafe {
            let mut runtimes = RUNTIMES.lock().unwrap_or_else(|e| e.into_inner());
            if *runtimes == 0 {
                let code = (d.api.aclInit)(std::ptr::null());
                // 100002: initialized already by whatever else in this process uses AscendCL.
                if code != 100002 {
                    d.check("aclInit", code)?;
                }
            }
            *runtimes += 1;
            d.counted = true;
            drop(runtimes);
            let found = d.what_is_here(dir)?;
            d.check("aclrtSetDevice", (d.api.aclrtSetDevice)(d.device_id))?;
            d.device_set = true;
            let mut ctx = std::ptr::null_mut();
            d.check(
                "aclrtCreateContext",
                (d.api.aclrtCreateContext)(&mut ctx, d.device_id),
            )?;
            d.context = ctx;
            let mut stream = std::ptr::null_mut();
            d.check("aclrtCreateStream", (d.api.aclrtCreateStream)(&mut stream))?;
            d.stream = stream;
            found
        };
        for (graph, entry) in [("prefix", &m.graphs.prefix), ("denoise", &m.graphs.denoise)] {
            let path = dir.join(om_file(&entry.file));
            let model = d.load_model(&path)?;
            let io = d.model_io(&model);
            d.models.push(model);
            let exec = if graph == "prefix" {
                &d.plan.prefix
            } else {
                &d.plan.denoise[0]
            };
            plan::check_model(&path.display().to_string(), &io, exec, &entry.inputs)?;
        }
        for b in d.plan.buffers.clone() {
            let mut ptr = std::ptr::null_mut();
            // SAFETY: as above.
            let code = unsafe {
                (d.api.aclrtMalloc)(&mut ptr, b.bytes.max(1), ffi::ACL_MEM_MALLOC_HUGE_FIRST)
            };
            d.check(
                &format!("aclrtMalloc({} bytes for {})", b.bytes, b.name),
                code,
            )?;
            d.memory.push(ptr);
        }
        let prefix = d.plan.prefix.clone();
        d.prefix = Some(d.datasets(&prefix)?);
        for e in d.plan.denoise.clone() {
            let ds = d.datasets(&e)?;
            d.denoise.push(ds);
        }
        tracing::info!(
            device = d.device_id,
            library = %d.api.path.display(),
            version = %found.version,
            soc = %found.soc,
            devices = found.devices,
            compiled_for = %found.compiled_for.as_deref().unwrap_or("not recorded (ATC run outside pi0d export)"),
            buffers = d.plan.buffers.len(),
            device_mb = d.plan.buffers.iter().map(|b| b.bytes).sum::<usize>() as f64 / 1e6,
            "AscendCL models loaded"
        );
        Ok(d)
    }

    fn load_model(&self, path: &Path) -> Result<Model, GraphError> {
        if !path.is_file() {
            return Err(GraphError::Load(format!(
                "{} not found: compile the graphs with the ATC commands `pi0d export --atc SOC` prints",
                path.display()
            )));
        }
        let c_path = CString::new(path.display().to_string())
            .map_err(|_| GraphError::Load(format!("{}: NUL in path", path.display())))?;
        let mut id = 0u32;
        // SAFETY: as in `open`.
        unsafe {
            self.check(
                &format!("aclmdlLoadFromFile({})", path.display()),
                (self.api.aclmdlLoadFromFile)(c_path.as_ptr(), &mut id),
            )?;
            let desc = (self.api.aclmdlCreateDesc)();
            if desc.is_null() {
                return Err(GraphError::Runtime("aclmdlCreateDesc returned null".into()));
            }
            self.check("aclmdlGetDesc", (self.api.aclmdlGetDesc)(desc, id))?;
            Ok(Model { id, desc })
        }
    }

    fn model_io(&self, model: &Model) -> ModelIo {
        let name = |p: *const std::ffi::c_char| {
            // SAFETY: null or a NUL-terminated name owned by the model description.
            (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
        };
        // SAFETY: `desc` describes a loaded model; indices are below the reported counts.
        unsafe {
            let a = &self.api;
            let n_in = (a.aclmdlGetNumInputs)(model.desc);
            let n_out = (a.aclmdlGetNumOutputs)(model.desc);
            ModelIo {
                inputs: (0..n_in)
                    .map(|i| {
                        (
                            name((a.aclmdlGetInputNameByIndex)(model.desc, i)),
                            (a.aclmdlGetInputSizeByIndex)(model.desc, i),
                        )
                    })
                    .collect(),
                outputs: (0..n_out)
                    .map(|i| {
                        (
                            name((a.aclmdlGetOutputNameByIndex)(model.desc, i)),
                            (a.aclmdlGetOutputSizeByIndex)(model.desc, i),
                        )
                    })
                    .collect(),
            }
        }
    }

    /// Input and output datasets over the planned device buffers of one execution.
    fn datasets(&self, e: &Execution) -> Result<Datasets, GraphError> {
        // SAFETY: as in `open`; every slot lies inside its allocation (the plan sized them).
        unsafe {
            let mut ds = Datasets {
                input: (self.api.aclmdlCreateDataset)(),
                output: (self.api.aclmdlCreateDataset)(),
                buffers: Vec::new(),
            };
            if ds.input.is_null() || ds.output.is_null() {
                return Err(GraphError::Runtime(
                    "aclmdlCreateDataset returned null".into(),
                ));
            }
            for (set, slots) in [(ds.input, &e.inputs), (ds.output, &e.outputs)] {
                for s in slots {
                    let ptr = (self.memory[s.buffer] as *mut u8).add(s.offset) as *mut c_void;
                    let buf = (self.api.aclCreateDataBuffer)(ptr, s.bytes);
                    if buf.is_null() {
                        return Err(GraphError::Runtime(
                            "aclCreateDataBuffer returned null".into(),
                        ));
                    }
                    ds.buffers.push(buf);
                    self.check(
                        "aclmdlAddDatasetBuffer",
                        (self.api.aclmdlAddDatasetBuffer)(set, buf),
                    )?;
                }
            }
            Ok(ds)
        }
    }

    fn upload(&self, buffer: usize, data: &[u8], what: &str) -> Result<(), GraphError> {
        let bytes = self.plan.buffers[buffer].bytes;
        if data.len() != bytes {
            return Err(GraphError::Input {
                name: what.into(),
                message: format!("{} bytes, the model takes {bytes}", data.len()),
            });
        }
        // SAFETY: as in `open`; the destination holds `bytes`, the source `data.len()` equal.
        let code = unsafe {
            (self.api.aclrtMemcpy)(
                self.memory[buffer],
                bytes,
                data.as_ptr() as *const c_void,
                bytes,
                ffi::ACL_MEMCPY_HOST_TO_DEVICE,
            )
        };
        self.check(&format!("aclrtMemcpy({what} to the device)"), code)
    }

    /// Everything a denoising takes from the host, `x` as its start.
    fn upload_denoise(
        &self,
        uploads: &[(HostSource, usize)],
        state: Option<&[f32]>,
        x: &[f32],
        time: &[f32],
        tables: &SuffixTables,
    ) -> Result<(), GraphError> {
        for &(source, buffer) in uploads {
            let data: &[u8] = match source {
                HostSource::State => as_bytes(state.unwrap_or(&[])),
                HostSource::Noise => as_bytes(x),
                HostSource::Time => as_bytes(time),
                HostSource::SuffixBias => as_bytes(&tables.bias),
                HostSource::SuffixCos => as_bytes(&tables.cos),
                HostSource::SuffixSin => as_bytes(&tables.sin),
                HostSource::RtcTarget => rtc(tables, |r| &r.target)?,
                HostSource::RtcWeights => rtc(tables, |r| &r.weights)?,
                HostSource::RtcGuidance => rtc(tables, |r| &r.guidance)?,
                HostSource::RtcClean => clean(tables, |c| &c.clean)?,
                HostSource::RtcCleanValues => clean(tables, |c| &c.values)?,
                _ => continue,
            };
            self.upload(buffer, data, &format!("{source:?}"))?;
        }
        Ok(())
    }

    fn synchronize(&self) -> Result<(), GraphError> {
        // SAFETY: as in `open`.
        self.check("aclrtSynchronizeStream", unsafe {
            (self.api.aclrtSynchronizeStream)(self.stream)
        })
    }

    /// A slot's f32 values back to the host.
    fn download(&self, r: plan::Slot) -> Reply {
        let mut out = vec![0.0f32; r.bytes / 4];
        // SAFETY: as in `open`; `out` holds `r.bytes`.
        let code = unsafe {
            (self.api.aclrtMemcpy)(
                out.as_mut_ptr() as *mut c_void,
                r.bytes,
                (self.memory[r.buffer] as *const u8).add(r.offset) as *const c_void,
                r.bytes,
                ffi::ACL_MEMCPY_DEVICE_TO_HOST,
            )
        };
        self.check("aclrtMemcpy(actions to the host)", code)?;
        Ok(out)
    }

    fn execute(&self, model: usize, ds: &Datasets) -> Result<(), GraphError> {
        // SAFETY: as in `open`.
        let code = unsafe {
            (self.api.aclmdlExecuteAsync)(self.models[model].id, ds.input, ds.output, self.stream)
        };
        let refused = self.check("aclmdlExecuteAsync", code);
        if refused.is_err() {
            // What was queued before it runs out now: the next request starts on an empty
            // stream, not behind the rest of a run that failed.
            // SAFETY: as in `open`.
            unsafe { (self.api.aclrtSynchronizeStream)(self.stream) };
        }
        refused
    }

    fn serve(&mut self, request: Request) -> Reply {
        // SAFETY: the context was created by this thread.
        self.check("aclrtSetCurrentContext", unsafe {
            (self.api.aclrtSetCurrentContext)(self.context)
        })?;
        let uploads = self.plan.uploads.clone();
        match request {
            Request::Prefix {
                images,
                tokens,
                tables,
            } => {
                for (source, buffer) in uploads {
                    let data: &[u8] = match source {
                        HostSource::Image(i) => {
                            as_bytes(images.get(i).map(Vec::as_slice).unwrap_or(&[]))
                        }
                        HostSource::Tokens => as_bytes(&tokens),
                        HostSource::PrefixBias => as_bytes(&tables.bias),
                        HostSource::PrefixCos => as_bytes(&tables.cos),
                        HostSource::PrefixSin => as_bytes(&tables.sin),
                        _ => continue,
                    };
                    self.upload(buffer, data, &format!("{source:?}"))?;
                }
                let prefix = self.prefix.as_ref().ok_or_else(|| {
                    GraphError::Runtime("the prefix graph was not made at load".into())
                })?;
                self.execute(0, prefix)?;
                // SAFETY: as in `open`.
                self.check("aclrtSynchronizeStream", unsafe {
                    (self.api.aclrtSynchronizeStream)(self.stream)
                })?;
                Ok(Vec::new())
            }
            Request::Denoise {
                state,
                x,
                time,
                tables,
            } => {
                self.upload_denoise(&uploads, state.as_deref(), &x, &time, &tables)?;
                // All steps queued back to back; one synchronization at the end.
                for ds in &self.denoise {
                    self.execute(1, ds)?;
                }
                self.synchronize()?;
                self.download(self.plan.result)
            }
            Request::DenoiseStep {
                run,
                state,
                x,
                time,
                tables,
            } => {
                let (Some(exec), Some(ds)) = (self.plan.denoise.get(run), self.denoise.get(run))
                else {
                    return Err(GraphError::Runtime(format!("no denoise run {run}")));
                };
                if run == 0 {
                    self.upload_denoise(&uploads, state.as_deref(), &x, &time, &tables)?;
                } else {
                    let slot = exec.inputs[self.plan.x_input];
                    self.upload(slot.buffer, as_bytes(&x), "x_t")?;
                }
                self.execute(1, ds)?;
                self.synchronize()?;
                self.download(exec.outputs[0])
            }
        }
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        // Release in reverse order of creation; errors here can only be logged.
        // SAFETY: every handle was created by this thread and is released once.
        unsafe {
            let a = &self.api;
            // Work may still be queued after a failed run: it ends before the memory it uses
            // is freed and the models it runs are unloaded.
            if !self.stream.is_null() {
                (a.aclrtSynchronizeStream)(self.stream);
            }
            for ds in self.prefix.take().into_iter().chain(self.denoise.drain(..)) {
                for b in ds.buffers {
                    (a.aclDestroyDataBuffer)(b);
                }
                (a.aclmdlDestroyDataset)(ds.input);
                (a.aclmdlDestroyDataset)(ds.output);
            }
            for p in self.memory.drain(..) {
                (a.aclrtFree)(p);
            }
            for m in self.models.drain(..) {
                (a.aclmdlUnload)(m.id);
                (a.aclmdlDestroyDesc)(m.desc);
            }
            if !self.stream.is_null() {
                (a.aclrtDestroyStream)(self.stream);
            }
            if !self.context.is_null() {
                (a.aclrtDestroyContext)(self.context);
            }
            if self.device_set {
                let code = (a.aclrtResetDevice)(self.device_id);
                if code != 0 {
                    tracing::warn!("{}", error::message("aclrtResetDevice", code, None));
                }
            }
            if self.counted {
                let mut runtimes = RUNTIMES.lock().unwrap_or_else(|e| e.into_inner());
                *runtimes -= 1;
                if *runtimes == 0 {
                    let code = (a.aclFinalize)();
                    if code != 0 {
                        tracing::warn!("{}", error::message("aclFinalize", code, None));
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn om_files_are_named_as_atc_writes_them() {
        assert_eq!(om_file("prefix.onnx"), "prefix.om");
        assert_eq!(om_file("denoise_unrolled.onnx"), "denoise_unrolled.om");
    }

    #[test]
    fn without_cann_loading_fails_with_the_library_named() {
        let m = plan::tests::manifest(1, false, "float32");
        let opts = AclOptions {
            library: Some("/opt/none/libascendcl.so".into()),
            device_id: 0,
        };
        let err = match AclRuntime::load(Path::new("/tmp"), &m, &opts) {
            Err(e) => e.to_string(),
            Ok(_) => panic!("AscendCL loaded from nowhere"),
        };
        assert!(
            err.contains("cannot load AscendCL (libascendcl.so)"),
            "{err}"
        );
        assert!(err.contains("/opt/none/libascendcl.so"), "{err}");
    }
}

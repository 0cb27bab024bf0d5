//! The runtime's state: devices, contexts, streams, device memory, models, descriptions,
//! datasets and data buffers, each by handle, with the checks the real runtime makes.

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::ffi::{c_char, CString};
use std::path::{Path, PathBuf};
use std::sync::{LazyLock, Mutex};

use ort::session::Session;

use crate::codes::*;
use crate::exec::{self, Io};

/// Why a call failed: its code and the message `aclGetRecentErrMsg` then returns.
pub struct Fail {
    pub code: i32,
    pub message: String,
}

impl Fail {
    pub fn new(code: i32, message: impl Into<String>) -> Fail {
        Fail {
            code,
            message: message.into(),
        }
    }

    pub fn param(message: impl Into<String>) -> Fail {
        Fail::new(ACL_ERROR_INVALID_PARAM, message)
    }
}

/// Device addresses start here: outside any host address space (non-canonical on x86-64 and
/// aarch64), so a device pointer is never host memory and a host pointer never device memory.
const DEVICE_BASE: u64 = 0x4000_0000_0000_0000;
/// Gap between allocations: a pointer run past one never lands in the next.
const GUARD: u64 = 1 << 16;
/// What fresh device memory holds (the real runtime does not clear it).
const FRESH: u8 = 0xA5;

struct Stream {
    context: usize,
    queue: Vec<Task>,
}

/// A queued execution: the device ranges of its inputs and outputs, taken when queued.
struct Task {
    model: u32,
    inputs: Vec<(u64, usize)>,
    outputs: Vec<(u64, usize)>,
    /// The execution number (1-based) it was queued as: the faults count executions.
    number: u64,
}

struct Model {
    context: usize,
    file: PathBuf,
    soc: String,
    session: Session,
    inputs: Vec<Io>,
    outputs: Vec<Io>,
}

/// A model description: filled by `aclmdlGetDesc` with the model's names and sizes.
#[derive(Default)]
struct Desc {
    inputs: Vec<Named>,
    outputs: Vec<Named>,
}

pub struct Named {
    pub name: CString,
    pub bytes: usize,
}

/// Fault injection, read from the environment at `aclInit`.
#[derive(Default)]
struct Faults {
    execute_fail_after: Option<u64>,
    device_lost_after: Option<u64>,
    malloc_fail_after: Option<u64>,
}

fn env_number<T: std::str::FromStr>(name: &str) -> Option<T> {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok())
}

#[derive(Default)]
pub struct State {
    initialized: bool,
    finalized: bool,
    exit_hook: bool,
    soc: String,
    soc_c: Option<CString>,
    devices: u32,
    memory_limit: usize,
    faults: Faults,
    /// `aclrtSetDevice` count per device.
    set: BTreeMap<i32, u32>,
    /// The default context of each set device.
    defaults: BTreeMap<i32, usize>,
    next_handle: usize,
    /// Every context, the devices' defaults among them.
    contexts: std::collections::BTreeSet<usize>,
    streams: BTreeMap<usize, Stream>,
    memory: BTreeMap<u64, Vec<u8>>,
    next_address: u64,
    used: usize,
    mallocs: u64,
    models: BTreeMap<u32, Model>,
    next_model: u32,
    descs: BTreeMap<usize, Desc>,
    datasets: BTreeMap<usize, Vec<usize>>,
    buffers: BTreeMap<usize, (u64, usize)>,
    executions: u64,
    executed: u64,
    lost: bool,
    calls: BTreeMap<&'static str, u64>,
    errors: Vec<serde_json::Value>,
}

static STATE: LazyLock<Mutex<State>> = LazyLock::new(|| Mutex::new(State::default()));

thread_local! {
    /// This thread's current context (0: none).
    static CURRENT: Cell<usize> = const { Cell::new(0) };
    /// The last failure's message on this thread.
    static RECENT: RefCell<Option<CString>> = const { RefCell::new(None) };
}

fn lock() -> std::sync::MutexGuard<'static, State> {
    STATE.lock().unwrap_or_else(|e| e.into_inner())
}

/// Runs one entry point that returns `aclError`: counted, failures recorded and their message
/// kept for `aclGetRecentErrMsg`.
pub fn call(name: &'static str, f: impl FnOnce(&mut State) -> Result<(), Fail>) -> i32 {
    let mut s = lock();
    *s.calls.entry(name).or_default() += 1;
    match f(&mut s) {
        Ok(()) => 0,
        Err(fail) => {
            s.errors.push(serde_json::json!({
                "call": name, "code": fail.code, "message": fail.message,
            }));
            let message = format!("{name}: {}", fail.message).replace('\0', " ");
            RECENT.with(|r| *r.borrow_mut() = CString::new(message).ok());
            fail.code
        }
    }
}

/// Runs one entry point that returns a value (a handle, a count, a name; null or 0 on error).
pub fn call_value<T>(name: &'static str, f: impl FnOnce(&mut State) -> T) -> T {
    let mut s = lock();
    *s.calls.entry(name).or_default() += 1;
    f(&mut s)
}

pub fn recent_message() -> *const c_char {
    RECENT.with(|r| r.borrow().as_ref().map_or(std::ptr::null(), |c| c.as_ptr()))
}

extern "C" fn at_exit() {
    let s = lock();
    s.write_report();
}

impl State {
    fn handle(&mut self) -> usize {
        // Handles look like pointers (aligned, never null) but point at nothing.
        self.next_handle += 1;
        0x7ac1_0000_0000 + self.next_handle * 16
    }

    fn ready(&self) -> Result<(), Fail> {
        if !self.initialized {
            return Err(Fail::new(ACL_ERROR_UNINITIALIZE, "aclInit was not called"));
        }
        if self.lost {
            return Err(Fail::new(
                ACL_ERROR_RT_LOST_HEARTBEAT,
                "the device stopped answering (ACL_MODEL_DEVICE_LOST_AFTER)",
            ));
        }
        Ok(())
    }

    /// This thread's current context, which must exist.
    fn current(&self) -> Result<usize, Fail> {
        self.ready()?;
        let c = CURRENT.with(Cell::get);
        if c == 0 || !self.contexts.contains(&c) {
            return Err(Fail::new(
                ACL_ERROR_RT_CONTEXT_NULL,
                "no current context on this thread: call aclrtSetDevice or aclrtSetCurrentContext on it first",
            ));
        }
        Ok(c)
    }

    pub fn init(&mut self) -> Result<(), Fail> {
        if self.initialized {
            return Err(Fail::new(
                ACL_ERROR_REPEAT_INITIALIZE,
                "aclInit was already called in this process",
            ));
        }
        self.initialized = true;
        self.finalized = false;
        self.soc = std::env::var("ACL_MODEL_SOC").unwrap_or_else(|_| "Ascend310P1".into());
        self.soc_c = CString::new(self.soc.clone()).ok();
        self.devices = env_number("ACL_MODEL_DEVICES").unwrap_or(1);
        self.memory_limit = env_number::<usize>("ACL_MODEL_DEVICE_MB").unwrap_or(8192) << 20;
        self.faults = Faults {
            execute_fail_after: env_number("ACL_MODEL_EXECUTE_FAIL_AFTER"),
            device_lost_after: env_number("ACL_MODEL_DEVICE_LOST_AFTER"),
            malloc_fail_after: env_number("ACL_MODEL_MALLOC_FAIL_AFTER"),
        };
        if !self.exit_hook {
            // SAFETY: registers a plain function with no captured state.
            unsafe { libc::atexit(at_exit) };
            self.exit_hook = true;
        }
        Ok(())
    }

    pub fn finalize(&mut self) -> Result<(), Fail> {
        if !self.initialized {
            return Err(Fail::new(ACL_ERROR_UNINITIALIZE, "aclInit was not called"));
        }
        self.initialized = false;
        self.finalized = true;
        let leaks = self.leaks();
        if !leaks.as_object().is_some_and(|m| m.is_empty()) {
            eprintln!("AscendCL model: still held at aclFinalize: {leaks}");
        }
        self.write_report();
        Ok(())
    }

    /// What is still held: nothing after a clean release.
    fn leaks(&self) -> serde_json::Value {
        let mut m = serde_json::Map::new();
        let mut put = |k: &str, n: usize| {
            if n > 0 {
                m.insert(k.into(), n.into());
            }
        };
        put("devices set", self.set.values().map(|&n| n as usize).sum());
        put("contexts", self.contexts.len() - self.defaults.len());
        put("streams", self.streams.len());
        put("device allocations", self.memory.len());
        put("device bytes", self.used);
        put("models", self.models.len());
        put("model descriptions", self.descs.len());
        put("datasets", self.datasets.len());
        put("data buffers", self.buffers.len());
        serde_json::Value::Object(m)
    }

    fn write_report(&self) {
        let Some(path) = std::env::var_os("ACL_MODEL_REPORT") else {
            return;
        };
        let report = serde_json::json!({
            "finalized": self.finalized,
            "initialized": self.initialized,
            "soc": self.soc,
            "calls": self.calls,
            "errors": self.errors,
            "leaks": self.leaks(),
            "executions": self.executed,
            "device_lost": self.lost,
        });
        let _ = std::fs::write(path, report.to_string());
    }

    pub fn device_count(&self) -> Result<u32, Fail> {
        self.ready()?;
        Ok(self.devices)
    }

    pub fn soc_name(&self) -> *const c_char {
        match (&self.soc_c, self.initialized) {
            (Some(c), true) => c.as_ptr(),
            _ => std::ptr::null(),
        }
    }

    fn device(&self, device: i32) -> Result<(), Fail> {
        self.ready()?;
        if device < 0 || device as u32 >= self.devices {
            return Err(Fail::new(
                ACL_ERROR_RT_INVALID_DEVICEID,
                format!("device {device}: {} device(s) present", self.devices),
            ));
        }
        Ok(())
    }

    pub fn set_device(&mut self, device: i32) -> Result<(), Fail> {
        self.device(device)?;
        *self.set.entry(device).or_default() += 1;
        let ctx = match self.defaults.get(&device) {
            Some(&c) => c,
            None => {
                let c = self.handle();
                self.contexts.insert(c);
                self.defaults.insert(device, c);
                c
            }
        };
        // The device's default context becomes this thread's current one if it has none.
        CURRENT.with(|cur| {
            if cur.get() == 0 {
                cur.set(ctx)
            }
        });
        Ok(())
    }

    pub fn reset_device(&mut self, device: i32) -> Result<(), Fail> {
        if !self.initialized {
            return Err(Fail::new(ACL_ERROR_UNINITIALIZE, "aclInit was not called"));
        }
        let Some(n) = self.set.get_mut(&device) else {
            return Err(Fail::new(
                ACL_ERROR_RT_INVALID_DEVICEID,
                format!("device {device} was not set"),
            ));
        };
        *n -= 1;
        if *n == 0 {
            self.set.remove(&device);
            if let Some(c) = self.defaults.remove(&device) {
                self.contexts.remove(&c);
                CURRENT.with(|cur| {
                    if cur.get() == c {
                        cur.set(0)
                    }
                });
            }
        }
        Ok(())
    }

    pub fn create_context(&mut self, device: i32) -> Result<usize, Fail> {
        self.device(device)?;
        if !self.set.contains_key(&device) {
            // The real runtime sets the device implicitly; pi0d sets it first.
            self.set_device(device)?;
        }
        let c = self.handle();
        self.contexts.insert(c);
        CURRENT.with(|cur| cur.set(c));
        Ok(c)
    }

    pub fn destroy_context(&mut self, context: usize) -> Result<(), Fail> {
        if self.defaults.values().any(|&d| d == context) || !self.contexts.contains(&context) {
            return Err(Fail::new(
                ACL_ERROR_RT_INVALID_HANDLE,
                "not a context created by aclrtCreateContext",
            ));
        }
        if self.streams.values().any(|s| s.context == context) {
            return Err(Fail::new(
                ACL_ERROR_RT_INTERNAL_ERROR,
                "the context still has streams: destroy them first",
            ));
        }
        self.contexts.remove(&context);
        CURRENT.with(|cur| {
            if cur.get() == context {
                cur.set(0)
            }
        });
        Ok(())
    }

    pub fn set_current_context(&mut self, context: usize) -> Result<(), Fail> {
        self.ready()?;
        if !self.contexts.contains(&context) {
            return Err(Fail::new(ACL_ERROR_RT_INVALID_HANDLE, "no such context"));
        }
        CURRENT.with(|cur| cur.set(context));
        Ok(())
    }

    pub fn create_stream(&mut self) -> Result<usize, Fail> {
        let context = self.current()?;
        let s = self.handle();
        self.streams.insert(
            s,
            Stream {
                context,
                queue: Vec::new(),
            },
        );
        Ok(s)
    }

    pub fn destroy_stream(&mut self, stream: usize) -> Result<(), Fail> {
        let Some(s) = self.streams.get(&stream) else {
            return Err(Fail::new(ACL_ERROR_RT_INVALID_HANDLE, "no such stream"));
        };
        if !s.queue.is_empty() {
            return Err(Fail::new(
                ACL_ERROR_RT_STREAM_NOT_COMPLETE,
                format!(
                    "{} task(s) still queued: synchronize the stream before destroying it",
                    s.queue.len()
                ),
            ));
        }
        self.streams.remove(&stream);
        Ok(())
    }

    pub fn malloc(&mut self, size: usize, policy: i32) -> Result<u64, Fail> {
        self.current()?;
        if size == 0 || !(0..=5).contains(&policy) {
            return Err(Fail::param(format!("size {size}, policy {policy}")));
        }
        self.mallocs += 1;
        if self
            .faults
            .malloc_fail_after
            .is_some_and(|n| self.mallocs > n)
        {
            return Err(Fail::new(
                ACL_ERROR_RT_MEMORY_ALLOCATION,
                "device memory allocation refused (ACL_MODEL_MALLOC_FAIL_AFTER)",
            ));
        }
        if self.used + size > self.memory_limit {
            return Err(Fail::new(
                ACL_ERROR_RT_MEMORY_ALLOCATION,
                format!(
                    "{size} bytes asked, {} of {} in use",
                    self.used, self.memory_limit
                ),
            ));
        }
        let address = DEVICE_BASE + self.next_address;
        self.next_address += (size as u64).div_ceil(GUARD) * GUARD + GUARD;
        self.memory.insert(address, vec![FRESH; size]);
        self.used += size;
        Ok(address)
    }

    pub fn free(&mut self, address: u64) -> Result<(), Fail> {
        if !self.initialized {
            return Err(Fail::new(ACL_ERROR_UNINITIALIZE, "aclInit was not called"));
        }
        let Some(bytes) = self.memory.remove(&address) else {
            return Err(Fail::new(
                ACL_ERROR_RT_MEMORY_FREE,
                format!("{address:#x} is not the start of a device allocation (freed twice?)"),
            ));
        };
        self.used -= bytes.len();
        Ok(())
    }

    /// The allocation holding `[address, address + len)`: its start.
    fn device_range(&self, address: u64, len: usize, what: &str) -> Result<u64, Fail> {
        let found = self
            .memory
            .range(..=address)
            .next_back()
            .filter(|(&base, bytes)| address + len as u64 <= base + bytes.len() as u64);
        match found {
            Some((&base, _)) => Ok(base),
            None => Err(Fail::new(
                ACL_ERROR_RT_PARAM_INVALID,
                format!("{what} {address:#x} (+{len} bytes) is not inside a device allocation"),
            )),
        }
    }

    fn is_device(address: u64) -> bool {
        address >= DEVICE_BASE
    }

    pub fn memcpy(
        &mut self,
        dst: u64,
        dest_max: usize,
        src: u64,
        count: usize,
        kind: i32,
    ) -> Result<(), Fail> {
        self.current()?;
        if dst == 0 || src == 0 || count > dest_max {
            return Err(Fail::param(format!(
                "dst {dst:#x}, src {src:#x}, count {count} > destMax {dest_max}"
            )));
        }
        let (src_device, dst_device) = match kind {
            ACL_MEMCPY_HOST_TO_HOST => (false, false),
            ACL_MEMCPY_HOST_TO_DEVICE => (false, true),
            ACL_MEMCPY_DEVICE_TO_HOST => (true, false),
            ACL_MEMCPY_DEVICE_TO_DEVICE => (true, true),
            _ => return Err(Fail::param(format!("copy kind {kind}"))),
        };
        for (address, device, what) in [
            (src, src_device, "source"),
            (dst, dst_device, "destination"),
        ] {
            if Self::is_device(address) != device {
                return Err(Fail::new(
                    ACL_ERROR_RT_PARAM_INVALID,
                    format!(
                        "copy kind {kind}: the {what} {address:#x} is {} memory",
                        if device { "host" } else { "device" }
                    ),
                ));
            }
        }
        let data: Vec<u8> = if src_device {
            let base = self.device_range(src, count, "source")?;
            let off = (src - base) as usize;
            self.memory[&base][off..off + count].to_vec()
        } else {
            // SAFETY: the caller's host source holds `count` bytes (AscendCL's contract).
            unsafe { std::slice::from_raw_parts(src as *const u8, count) }.to_vec()
        };
        if dst_device {
            let base = self.device_range(dst, count, "destination")?;
            let off = (dst - base) as usize;
            if let Some(m) = self.memory.get_mut(&base) {
                m[off..off + count].copy_from_slice(&data);
            }
        } else {
            // SAFETY: the caller's host destination holds `destMax` >= `count` bytes.
            unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), dst as *mut u8, count) };
        }
        Ok(())
    }

    pub fn load_model(&mut self, path: &Path) -> Result<u32, Fail> {
        let context = self.current()?;
        let text = std::fs::read_to_string(path)
            .map_err(|e| Fail::new(ACL_ERROR_INVALID_FILE, format!("{}: {e}", path.display())))?;
        let om: serde_json::Value = serde_json::from_str(&text).map_err(|e| {
            Fail::new(
                ACL_ERROR_DESERIALIZE_MODEL,
                format!("{}: not an offline model: {e}", path.display()),
            )
        })?;
        let field = |k: &str| {
            om.get(k).and_then(|v| v.as_str()).ok_or_else(|| {
                Fail::new(
                    ACL_ERROR_DESERIALIZE_MODEL,
                    format!("{}: no `{k}`", path.display()),
                )
            })
        };
        if field("format")? != "ascendcl-model-om/1" {
            return Err(Fail::new(
                ACL_ERROR_DESERIALIZE_MODEL,
                format!("{}: not an offline model of this runtime", path.display()),
            ));
        }
        let onnx = path
            .parent()
            .unwrap_or(Path::new("."))
            .join(field("graph")?);
        let soc = field("soc_version")?.to_string();
        if !onnx.is_file() {
            return Err(Fail::new(
                ACL_ERROR_READ_MODEL_FAILURE,
                format!(
                    "{}: its graph {} is missing",
                    path.display(),
                    onnx.display()
                ),
            ));
        }
        let (session, inputs, outputs) =
            exec::open(&onnx).map_err(|e| Fail::new(ACL_ERROR_PARSE_MODEL, e))?;
        self.next_model += 1;
        let id = self.next_model;
        self.models.insert(
            id,
            Model {
                context,
                file: path.to_path_buf(),
                soc,
                session,
                inputs,
                outputs,
            },
        );
        Ok(id)
    }

    pub fn unload_model(&mut self, id: u32) -> Result<(), Fail> {
        if !self.models.contains_key(&id) {
            return Err(Fail::new(
                ACL_ERROR_INVALID_MODEL_ID,
                format!("model {id} is not loaded"),
            ));
        }
        if self
            .streams
            .values()
            .any(|s| s.queue.iter().any(|t| t.model == id))
        {
            return Err(Fail::new(
                ACL_ERROR_RT_MODEL_RUNNING,
                format!("model {id} has executions queued"),
            ));
        }
        self.models.remove(&id);
        Ok(())
    }

    pub fn create_desc(&mut self) -> usize {
        let h = self.handle();
        self.descs.insert(h, Desc::default());
        h
    }

    pub fn destroy_desc(&mut self, desc: usize) -> Result<(), Fail> {
        self.descs
            .remove(&desc)
            .map(|_| ())
            .ok_or_else(|| Fail::param("no such model description"))
    }

    pub fn get_desc(&mut self, desc: usize, id: u32) -> Result<(), Fail> {
        let model = self.models.get(&id).ok_or_else(|| {
            Fail::new(
                ACL_ERROR_INVALID_MODEL_ID,
                format!("model {id} is not loaded"),
            )
        })?;
        let named = |ios: &[Io]| {
            ios.iter()
                .map(|io| Named {
                    name: CString::new(io.name.clone()).unwrap_or_default(),
                    bytes: io.bytes,
                })
                .collect()
        };
        let filled = Desc {
            inputs: named(&model.inputs),
            outputs: named(&model.outputs),
        };
        let d = self
            .descs
            .get_mut(&desc)
            .ok_or_else(|| Fail::param("no such model description"))?;
        *d = filled;
        Ok(())
    }

    pub fn desc_io(&self, desc: usize, inputs: bool) -> &[Named] {
        match self.descs.get(&desc) {
            Some(d) if inputs => &d.inputs,
            Some(d) => &d.outputs,
            None => &[],
        }
    }

    pub fn desc_name(&self, desc: usize, inputs: bool, index: usize) -> *const c_char {
        self.desc_io(desc, inputs)
            .get(index)
            .map_or(std::ptr::null(), |n| n.name.as_ptr())
    }

    pub fn create_dataset(&mut self) -> usize {
        let h = self.handle();
        self.datasets.insert(h, Vec::new());
        h
    }

    pub fn destroy_dataset(&mut self, dataset: usize) -> Result<(), Fail> {
        self.datasets
            .remove(&dataset)
            .map(|_| ())
            .ok_or_else(|| Fail::param("no such dataset"))
    }

    pub fn add_dataset_buffer(&mut self, dataset: usize, buffer: usize) -> Result<(), Fail> {
        if !self.buffers.contains_key(&buffer) {
            return Err(Fail::param("no such data buffer"));
        }
        self.datasets
            .get_mut(&dataset)
            .ok_or_else(|| Fail::param("no such dataset"))?
            .push(buffer);
        Ok(())
    }

    pub fn create_data_buffer(&mut self, data: u64, size: usize) -> usize {
        let h = self.handle();
        self.buffers.insert(h, (data, size));
        h
    }

    pub fn destroy_data_buffer(&mut self, buffer: usize) -> Result<(), Fail> {
        self.buffers
            .remove(&buffer)
            .map(|_| ())
            .ok_or_else(|| Fail::param("no such data buffer"))
    }

    /// A dataset's buffers as device ranges, checked against the model's sizes.
    fn ranges(
        &self,
        dataset: usize,
        ios: &[Io],
        what: &str,
        code: i32,
    ) -> Result<Vec<(u64, usize)>, Fail> {
        let buffers = self
            .datasets
            .get(&dataset)
            .ok_or_else(|| Fail::param(format!("the {what} dataset does not exist")))?;
        if buffers.len() != ios.len() {
            return Err(Fail::new(
                code,
                format!(
                    "the model has {} {what}s, the dataset {}",
                    ios.len(),
                    buffers.len()
                ),
            ));
        }
        let mut out = Vec::new();
        for (b, io) in buffers.iter().zip(ios) {
            let &(address, size) = self.buffers.get(b).ok_or_else(|| {
                Fail::param(format!(
                    "{what} `{}`: its data buffer was destroyed",
                    io.name
                ))
            })?;
            if size < io.bytes {
                return Err(Fail::new(
                    code,
                    format!(
                        "{what} `{}`: a buffer of {size} bytes, the model needs {}",
                        io.name, io.bytes
                    ),
                ));
            }
            self.device_range(address, size, &format!("{what} `{}`", io.name))?;
            out.push((address, size));
        }
        Ok(out)
    }

    pub fn execute_async(
        &mut self,
        id: u32,
        input: usize,
        output: usize,
        stream: usize,
    ) -> Result<(), Fail> {
        let current = self.current()?;
        let s = self
            .streams
            .get(&stream)
            .ok_or_else(|| Fail::new(ACL_ERROR_RT_INVALID_HANDLE, "no such stream"))?;
        if s.context != current {
            return Err(Fail::new(
                ACL_ERROR_RT_STREAM_CONTEXT,
                "the stream belongs to another context",
            ));
        }
        let model = self.models.get(&id).ok_or_else(|| {
            Fail::new(
                ACL_ERROR_INVALID_MODEL_ID,
                format!("model {id} is not loaded"),
            )
        })?;
        if model.context != current {
            return Err(Fail::new(
                ACL_ERROR_RT_MODEL_CONTEXT,
                "the model belongs to another context",
            ));
        }
        let inputs = self.ranges(
            input,
            &model.inputs,
            "input",
            ACL_ERROR_MODEL_INPUT_NOT_MATCH,
        )?;
        let outputs = self.ranges(
            output,
            &model.outputs,
            "output",
            ACL_ERROR_MODEL_OUTPUT_NOT_MATCH,
        )?;
        self.executions += 1;
        let number = self.executions;
        if let Some(s) = self.streams.get_mut(&stream) {
            s.queue.push(Task {
                model: id,
                inputs,
                outputs,
                number,
            });
        }
        Ok(())
    }

    pub fn synchronize(&mut self, stream: usize) -> Result<(), Fail> {
        let current = self.current()?;
        let s = self
            .streams
            .get_mut(&stream)
            .ok_or_else(|| Fail::new(ACL_ERROR_RT_INVALID_HANDLE, "no such stream"))?;
        if s.context != current {
            return Err(Fail::new(
                ACL_ERROR_RT_STREAM_CONTEXT,
                "the stream belongs to another context",
            ));
        }
        // A failed task ends the stream's work: what was queued after it is dropped.
        let tasks = std::mem::take(&mut s.queue);
        for task in tasks {
            self.run(task)?;
        }
        Ok(())
    }

    fn run(&mut self, task: Task) -> Result<(), Fail> {
        if self
            .faults
            .device_lost_after
            .is_some_and(|n| task.number > n)
        {
            self.lost = true;
            return Err(Fail::new(
                ACL_ERROR_RT_LOST_HEARTBEAT,
                "the device stopped answering during execution (ACL_MODEL_DEVICE_LOST_AFTER)",
            ));
        }
        if self
            .faults
            .execute_fail_after
            .is_some_and(|n| task.number > n)
        {
            return Err(Fail::new(
                ACL_ERROR_RT_MODEL_EXECUTE,
                format!(
                    "execution {} failed (ACL_MODEL_EXECUTE_FAIL_AFTER)",
                    task.number
                ),
            ));
        }
        let device_soc = self.soc.clone();
        let Some(model) = self.models.get_mut(&task.model) else {
            return Err(Fail::new(
                ACL_ERROR_INVALID_MODEL_ID,
                "the model was unloaded",
            ));
        };
        if model.soc != device_soc {
            return Err(Fail::new(
                ACL_ERROR_RT_MODEL_EXECUTE,
                format!(
                    "{} was compiled for {}, this device is {device_soc}",
                    model.file.display(),
                    model.soc
                ),
            ));
        }
        let mut data = Vec::with_capacity(task.inputs.len());
        for &(address, size) in &task.inputs {
            // Freed since it was queued: the execution reads nothing.
            let found = self
                .memory
                .range(..=address)
                .next_back()
                .filter(|(&base, b)| address + size as u64 <= base + b.len() as u64);
            let Some((&base, bytes)) = found else {
                return Err(Fail::new(
                    ACL_ERROR_RT_MODEL_EXECUTE,
                    "an input buffer was freed before execution",
                ));
            };
            let off = (address - base) as usize;
            data.push(&bytes[off..off + size]);
        }
        let model = self.models.get_mut(&task.model).expect("checked above");
        let results = exec::run(&mut model.session, &model.inputs, &model.outputs, &data)
            .map_err(|e| Fail::new(ACL_ERROR_RT_MODEL_EXECUTE, e))?;
        for (&(address, _), bytes) in task.outputs.iter().zip(results) {
            let base = self.device_range(address, bytes.len(), "output")?;
            let off = (address - base) as usize;
            if let Some(m) = self.memory.get_mut(&base) {
                m[off..off + bytes.len()].copy_from_slice(&bytes);
            }
        }
        self.executed += 1;
        Ok(())
    }
}

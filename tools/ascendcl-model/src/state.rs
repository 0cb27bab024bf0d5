//! The runtime's state: devices, contexts, streams, device memory, models, descriptions,
//! datasets and data buffers, each by handle, with the checks the real runtime makes.

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::ffi::{c_char, CString};
use std::path::PathBuf;
use std::sync::{LazyLock, Mutex};

use ort::session::Session;

use crate::codes::*;
use crate::exec::Io;

mod memory;
mod models;

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
    // A thread still inside a call at exit holds the lock: the report is then not written
    // (waiting would hang the exit).
    let s = match STATE.try_lock() {
        Ok(s) => s,
        Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
        Err(std::sync::TryLockError::WouldBlock) => return,
    };
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

    #[cfg(test)]
    pub fn leaks_now(&self) -> serde_json::Value {
        self.leaks()
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
}

//! A model of AscendCL, the runtime API of Huawei's CANN (`libascendcl.so`), for pi0d's tests.
//! It is a model, never shipped: written from the CANN 8.0 AscendCL API reference (`acl.h`,
//! `acl_rt.h`, `acl_mdl.h`, `acl_base.h`, `rt_error_codes.h`) so that pi0d's `acl` backend runs
//! its whole calling sequence here, on a machine without an NPU, against something as strict as
//! the real runtime where the real runtime is strict:
//!
//! * every entry point pi0d declares, with the reference's prototypes and error codes;
//! * contexts are per thread: a call that needs one from a thread without a current context
//!   fails (107002); a stream or model used from another context fails (107003 / 107004);
//! * device memory is not host memory: device addresses are outside the host's address space,
//!   a copy whose kind does not match its pointers, or that runs past an allocation, fails; a
//!   data buffer smaller than the model's input fails at execution;
//! * executions are queued on their stream and run at `aclrtSynchronizeStream`: an output copied
//!   back before synchronizing holds the old bytes (fresh device memory holds 0xA5, not zeros);
//! * double init, use after unload or free, destroying a stream with work queued: errors; what
//!   is still held at `aclFinalize` (or at exit, when it is never called) is reported as leaked.
//!
//! An offline model (`.om`) here stands for the ONNX graph it was compiled from: a small JSON
//! file (written by this directory's `atc`) naming the graph, its SoC and its precision; the
//! graph runs on ONNX Runtime's CPU provider (`ORT_DYLIB_PATH`). A model compiled for another
//! SoC than the device's (`ACL_MODEL_SOC`, default Ascend310P1) fails at execution with 507011,
//! as a board answers.
//!
//! Environment: `ACL_MODEL_SOC`, `ACL_MODEL_DEVICES` (device count, default 1),
//! `ACL_MODEL_DEVICE_MB` (device memory, default 8192), `ACL_MODEL_REPORT` (a JSON report of
//! calls, errors and leaks, written at `aclFinalize` and at exit), and faults:
//! `ACL_MODEL_EXECUTE_FAIL_AFTER=N` (executions after the N-th refused as queued, 507011),
//! `ACL_MODEL_DEVICE_LOST_AFTER=N` (the device stops answering after N executions, 507010),
//! `ACL_MODEL_MALLOC_FAIL_AFTER=N` (allocations after the N-th refused, 207001).

#![allow(non_snake_case)] // AscendCL's names.
#![allow(clippy::missing_safety_doc)] // Each entry point's contract is AscendCL's.

mod codes;
mod exec;
mod state;

use std::ffi::{c_char, c_void, CStr};

use state::{call, call_value, Fail};

type AclError = i32;

/// A C string argument, or the error a null one gets.
unsafe fn text<'a>(p: *const c_char, what: &str) -> Result<&'a str, Fail> {
    if p.is_null() {
        return Err(Fail::param(format!("{what} is null")));
    }
    CStr::from_ptr(p)
        .to_str()
        .map_err(|_| Fail::param(format!("{what} is not UTF-8")))
}

#[no_mangle]
pub unsafe extern "C" fn aclInit(_config: *const c_char) -> AclError {
    call("aclInit", |s| s.init())
}

#[no_mangle]
pub unsafe extern "C" fn aclFinalize() -> AclError {
    call("aclFinalize", |s| s.finalize())
}

#[no_mangle]
pub unsafe extern "C" fn aclrtSetDevice(device: i32) -> AclError {
    call("aclrtSetDevice", |s| s.set_device(device))
}

#[no_mangle]
pub unsafe extern "C" fn aclrtResetDevice(device: i32) -> AclError {
    call("aclrtResetDevice", |s| s.reset_device(device))
}

#[no_mangle]
pub unsafe extern "C" fn aclrtCreateContext(context: *mut *mut c_void, device: i32) -> AclError {
    call("aclrtCreateContext", |s| {
        if context.is_null() {
            return Err(Fail::param("context is null"));
        }
        *context = s.create_context(device)? as *mut c_void;
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn aclrtDestroyContext(context: *mut c_void) -> AclError {
    call("aclrtDestroyContext", |s| {
        s.destroy_context(context as usize)
    })
}

#[no_mangle]
pub unsafe extern "C" fn aclrtSetCurrentContext(context: *mut c_void) -> AclError {
    call("aclrtSetCurrentContext", |s| {
        s.set_current_context(context as usize)
    })
}

#[no_mangle]
pub unsafe extern "C" fn aclrtCreateStream(stream: *mut *mut c_void) -> AclError {
    call("aclrtCreateStream", |s| {
        if stream.is_null() {
            return Err(Fail::param("stream is null"));
        }
        *stream = s.create_stream()? as *mut c_void;
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn aclrtDestroyStream(stream: *mut c_void) -> AclError {
    call("aclrtDestroyStream", |s| s.destroy_stream(stream as usize))
}

#[no_mangle]
pub unsafe extern "C" fn aclrtSynchronizeStream(stream: *mut c_void) -> AclError {
    call("aclrtSynchronizeStream", |s| s.synchronize(stream as usize))
}

#[no_mangle]
pub unsafe extern "C" fn aclrtMalloc(ptr: *mut *mut c_void, size: usize, policy: i32) -> AclError {
    call("aclrtMalloc", |s| {
        if ptr.is_null() {
            return Err(Fail::param("devPtr is null"));
        }
        *ptr = s.malloc(size, policy)? as *mut c_void;
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn aclrtFree(ptr: *mut c_void) -> AclError {
    call("aclrtFree", |s| s.free(ptr as u64))
}

#[no_mangle]
pub unsafe extern "C" fn aclrtMemcpy(
    dst: *mut c_void,
    dest_max: usize,
    src: *const c_void,
    count: usize,
    kind: i32,
) -> AclError {
    call("aclrtMemcpy", |s| {
        s.memcpy(dst as u64, dest_max, src as u64, count, kind)
    })
}

#[no_mangle]
pub unsafe extern "C" fn aclmdlLoadFromFile(path: *const c_char, id: *mut u32) -> AclError {
    call("aclmdlLoadFromFile", |s| {
        let path = text(path, "modelPath")?;
        if id.is_null() {
            return Err(Fail::param("modelId is null"));
        }
        *id = s.load_model(std::path::Path::new(path))?;
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn aclmdlUnload(id: u32) -> AclError {
    call("aclmdlUnload", |s| s.unload_model(id))
}

#[no_mangle]
pub unsafe extern "C" fn aclmdlCreateDesc() -> *mut c_void {
    call_value("aclmdlCreateDesc", |s| s.create_desc() as *mut c_void)
}

#[no_mangle]
pub unsafe extern "C" fn aclmdlDestroyDesc(desc: *mut c_void) -> AclError {
    call("aclmdlDestroyDesc", |s| s.destroy_desc(desc as usize))
}

#[no_mangle]
pub unsafe extern "C" fn aclmdlGetDesc(desc: *mut c_void, id: u32) -> AclError {
    call("aclmdlGetDesc", |s| s.get_desc(desc as usize, id))
}

#[no_mangle]
pub unsafe extern "C" fn aclmdlGetNumInputs(desc: *mut c_void) -> usize {
    call_value("aclmdlGetNumInputs", |s| {
        s.desc_io(desc as usize, true).len()
    })
}

#[no_mangle]
pub unsafe extern "C" fn aclmdlGetNumOutputs(desc: *mut c_void) -> usize {
    call_value("aclmdlGetNumOutputs", |s| {
        s.desc_io(desc as usize, false).len()
    })
}

#[no_mangle]
pub unsafe extern "C" fn aclmdlGetInputSizeByIndex(desc: *mut c_void, index: usize) -> usize {
    call_value("aclmdlGetInputSizeByIndex", |s| {
        s.desc_io(desc as usize, true)
            .get(index)
            .map_or(0, |io| io.bytes)
    })
}

#[no_mangle]
pub unsafe extern "C" fn aclmdlGetOutputSizeByIndex(desc: *mut c_void, index: usize) -> usize {
    call_value("aclmdlGetOutputSizeByIndex", |s| {
        s.desc_io(desc as usize, false)
            .get(index)
            .map_or(0, |io| io.bytes)
    })
}

#[no_mangle]
pub unsafe extern "C" fn aclmdlGetInputNameByIndex(
    desc: *const c_void,
    index: usize,
) -> *const c_char {
    call_value("aclmdlGetInputNameByIndex", |s| {
        s.desc_name(desc as usize, true, index)
    })
}

#[no_mangle]
pub unsafe extern "C" fn aclmdlGetOutputNameByIndex(
    desc: *const c_void,
    index: usize,
) -> *const c_char {
    call_value("aclmdlGetOutputNameByIndex", |s| {
        s.desc_name(desc as usize, false, index)
    })
}

#[no_mangle]
pub unsafe extern "C" fn aclmdlCreateDataset() -> *mut c_void {
    call_value("aclmdlCreateDataset", |s| s.create_dataset() as *mut c_void)
}

#[no_mangle]
pub unsafe extern "C" fn aclmdlDestroyDataset(dataset: *const c_void) -> AclError {
    call("aclmdlDestroyDataset", |s| {
        s.destroy_dataset(dataset as usize)
    })
}

#[no_mangle]
pub unsafe extern "C" fn aclmdlAddDatasetBuffer(
    dataset: *mut c_void,
    buffer: *mut c_void,
) -> AclError {
    call("aclmdlAddDatasetBuffer", |s| {
        s.add_dataset_buffer(dataset as usize, buffer as usize)
    })
}

#[no_mangle]
pub unsafe extern "C" fn aclCreateDataBuffer(data: *mut c_void, size: usize) -> *mut c_void {
    call_value("aclCreateDataBuffer", |s| {
        s.create_data_buffer(data as u64, size) as *mut c_void
    })
}

#[no_mangle]
pub unsafe extern "C" fn aclDestroyDataBuffer(buffer: *const c_void) -> AclError {
    call("aclDestroyDataBuffer", |s| {
        s.destroy_data_buffer(buffer as usize)
    })
}

#[no_mangle]
pub unsafe extern "C" fn aclmdlExecuteAsync(
    id: u32,
    input: *const c_void,
    output: *mut c_void,
    stream: *mut c_void,
) -> AclError {
    call("aclmdlExecuteAsync", |s| {
        s.execute_async(id, input as usize, output as usize, stream as usize)
    })
}

#[no_mangle]
pub unsafe extern "C" fn aclrtGetSocName() -> *const c_char {
    call_value("aclrtGetSocName", |s| s.soc_name())
}

#[no_mangle]
pub unsafe extern "C" fn aclrtGetDeviceCount(count: *mut u32) -> AclError {
    call("aclrtGetDeviceCount", |s| {
        if count.is_null() {
            return Err(Fail::param("count is null"));
        }
        *count = s.device_count()?;
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn aclrtGetVersion(
    major: *mut i32,
    minor: *mut i32,
    patch: *mut i32,
) -> AclError {
    call("aclrtGetVersion", |_| {
        if major.is_null() || minor.is_null() || patch.is_null() {
            return Err(Fail::param("a version pointer is null"));
        }
        // The AscendCL of CANN 8.0.
        (*major, *minor, *patch) = (1, 8, 0);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn aclGetRecentErrMsg() -> *const c_char {
    state::recent_message()
}

#[cfg(test)]
mod tests {
    //! The model's own strictness, through its C entry points (one test: the runtime is one
    //! per process, as AscendCL's is).
    use super::*;
    use crate::codes::*;
    use std::ptr::null_mut;

    #[test]
    fn when_called_as_the_reference_forbids_expect_its_error_codes() {
        unsafe {
            // Nothing before aclInit; then once only.
            assert_eq!(aclrtSetDevice(0), 100001);
            assert_eq!(aclInit(std::ptr::null()), 0);
            assert_eq!(aclInit(std::ptr::null()), 100002);
            // A device the machine does not have.
            assert_eq!(aclrtSetDevice(1), 107001);
            assert_eq!(aclrtSetDevice(0), 0);
            // Contexts are per thread: another thread has none.
            let other = std::thread::spawn(|| {
                let mut p = null_mut();
                aclrtMalloc(&mut p, 64, 0)
            });
            assert_eq!(other.join().unwrap(), 107002);
            let mut ctx = null_mut();
            assert_eq!(aclrtCreateContext(&mut ctx, 0), 0);
            let mut dev = null_mut();
            assert_eq!(aclrtMalloc(&mut dev, 64, 0), 0);
            // Device memory is not host memory, in either direction, and has bounds.
            let host = [7u8; 64];
            let mut back = [0u8; 64];
            let h2d = ACL_MEMCPY_HOST_TO_DEVICE;
            let d2h = ACL_MEMCPY_DEVICE_TO_HOST;
            assert_eq!(
                aclrtMemcpy(back.as_mut_ptr().cast(), 64, host.as_ptr().cast(), 64, h2d),
                107000
            );
            assert_eq!(aclrtMemcpy(dev, 64, host.as_ptr().cast(), 64, d2h), 107000);
            assert_eq!(
                aclrtMemcpy(dev, 128, [0u8; 128].as_ptr().cast(), 128, h2d),
                107000
            );
            assert_eq!(aclrtMemcpy(dev, 32, host.as_ptr().cast(), 64, h2d), 100000);
            // Fresh device memory is not zeros; a copy there and back is exact.
            assert_eq!(aclrtMemcpy(back.as_mut_ptr().cast(), 64, dev, 64, d2h), 0);
            assert_eq!(back, [0xA5; 64]);
            assert_eq!(aclrtMemcpy(dev, 64, host.as_ptr().cast(), 64, h2d), 0);
            assert_eq!(aclrtMemcpy(back.as_mut_ptr().cast(), 64, dev, 64, d2h), 0);
            assert_eq!(back, host);
            // The last failure is said.
            let msg = CStr::from_ptr(aclGetRecentErrMsg())
                .to_string_lossy()
                .into_owned();
            assert!(msg.contains("aclrtMemcpy"), "{msg}");
            // Freed once; a model never loaded cannot run or unload.
            assert_eq!(aclrtFree(dev), 0);
            assert_eq!(aclrtFree(dev), 207002);
            assert_eq!(aclrtMemcpy(dev, 64, host.as_ptr().cast(), 64, h2d), 107000);
            assert_eq!(aclmdlUnload(9), 100011);
            let mut stream = null_mut();
            assert_eq!(aclrtCreateStream(&mut stream), 0);
            let (input, output) = (aclmdlCreateDataset(), aclmdlCreateDataset());
            assert_eq!(aclmdlExecuteAsync(9, input, output, stream), 100011);
            // What is still held at aclFinalize is reported: here a stream, an allocation and
            // two datasets.
            let mut leaked = null_mut();
            assert_eq!(aclrtMalloc(&mut leaked, 16, 0), 0);
            let leaks = state::call_value("test", |s| s.leaks_now());
            assert_eq!(leaks["streams"], 1);
            assert_eq!(leaks["device allocations"], 1);
            assert_eq!(leaks["datasets"], 2);
            assert_eq!(aclFinalize(), 0);
            assert_eq!(aclFinalize(), 100001);
        }
    }
}

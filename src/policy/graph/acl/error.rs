//! AscendCL error codes to messages that say what to do. Codes are CANN's (`acl_base.h`,
//! `rt_error_codes.h`, `ge_error_codes.h`); the hints are from deploying pi0 graphs.

/// `(code, name, hint)` for the codes a graph deployment meets.
const KNOWN: &[(i32, &str, &str)] = &[
    (100000, "ACL_ERROR_INVALID_PARAM", "an argument was rejected"),
    (100001, "ACL_ERROR_UNINITIALIZE", "aclInit was not called"),
    (100002, "ACL_ERROR_REPEAT_INITIALIZE", "aclInit was already called in this process"),
    (100003, "ACL_ERROR_INVALID_FILE", "the .om file is missing or unreadable"),
    (100011, "ACL_ERROR_INVALID_MODEL_ID", "the model is not loaded"),
    (100012, "ACL_ERROR_DESERIALIZE_MODEL", "the .om file is not an offline model of this CANN version: re-run ATC with the installed toolkit"),
    (100013, "ACL_ERROR_PARSE_MODEL", "the .om file could not be parsed: re-run ATC"),
    (100014, "ACL_ERROR_READ_MODEL_FAILURE", "the .om file could not be read"),
    (100017, "ACL_ERROR_MODEL_INPUT_NOT_MATCH", "the inputs do not match the model's (sizes or count)"),
    (100018, "ACL_ERROR_MODEL_OUTPUT_NOT_MATCH", "the outputs do not match the model's (sizes or count)"),
    (200000, "ACL_ERROR_BAD_ALLOC", "out of memory"),
    (200001, "ACL_ERROR_API_NOT_SUPPORT", "not supported on this chip or CANN version"),
    (200002, "ACL_ERROR_INVALID_DEVICE", "no such device: check device_id against npu-smi info"),
    (200003, "ACL_ERROR_MEMORY_ADDRESS_UNALIGNED", "a buffer is not aligned as the device needs"),
    (500000, "ACL_ERROR_INTERNAL_ERROR", "AscendCL internal error: see the plog (~/ascend/log)"),
    (500002, "ACL_ERROR_GE_FAILURE", "graph engine failure: see the plog (~/ascend/log)"),
    (500003, "ACL_ERROR_RT_FAILURE", "runtime failure: see the plog (~/ascend/log)"),
    (500004, "ACL_ERROR_DRV_FAILURE", "driver failure: check the NPU driver and firmware versions"),
    (107000, "ACL_ERROR_RT_PARAM_INVALID", "a runtime argument was rejected"),
    (107001, "ACL_ERROR_RT_INVALID_DEVICEID", "no such device: check device_id against npu-smi info"),
    (107002, "ACL_ERROR_RT_CONTEXT_NULL", "no current context on this thread"),
    (107003, "ACL_ERROR_RT_STREAM_CONTEXT", "the stream belongs to another context"),
    (107004, "ACL_ERROR_RT_MODEL_CONTEXT", "the model belongs to another context"),
    (107008, "ACL_ERROR_RT_ADDR_UNALIGNED", "a buffer is not aligned as the device needs"),
    (207000, "ACL_ERROR_RT_FEATURE_NOT_SUPPORT", "not supported on this chip"),
    (207001, "ACL_ERROR_RT_MEMORY_ALLOCATION", "device memory exhausted: a smaller model, f16 graphs or fewer cameras"),
    (207003, "ACL_ERROR_RT_AICORE_OVER_FLOW", "an AI Core operator overflowed (f16): export with --dtype f32, or check for Inf in the weights"),
    (207004, "ACL_ERROR_RT_NO_DEVICE", "no NPU visible: check npu-smi info and the container's device mounts"),
    (207006, "ACL_ERROR_RT_NO_PERMISSION", "no permission for the NPU: run as a user in the HwHiAiUser group"),
    (507000, "ACL_ERROR_RT_INTERNAL_ERROR", "runtime internal error: see the plog (~/ascend/log)"),
    (507004, "ACL_ERROR_RT_STREAM_NOT_COMPLETE", "work still queued on the stream"),
    (507008, "ACL_ERROR_RT_SOC_VERSION", "the .om was compiled for another SoC: re-run ATC with the --soc_version npu-smi reports"),
    (507010, "ACL_ERROR_RT_LOST_HEARTBEAT", "the NPU stopped answering: check npu-smi info and dmesg; the device may need a reset"),
    (507011, "ACL_ERROR_RT_MODEL_EXECUTE", "model execution failed; most often the .om was compiled for another SoC (re-run ATC with the right --soc_version)"),
    (507014, "ACL_ERROR_RT_AICORE_TIMEOUT", "an AI Core task timed out"),
    (507015, "ACL_ERROR_RT_AICORE_EXCEPTION", "an AI Core task faulted: see the plog (~/ascend/log)"),
    (507033, "ACL_ERROR_RT_DEV_SETUP_ERROR", "device setup failed: check the driver and that no other process holds the NPU"),
    (507053, "ACL_ERROR_RT_DEVICE_MEM_ERROR", "the NPU's memory faulted: the device needs a reset"),
    (507054, "ACL_ERROR_RT_HBM_MULTI_BIT_ECC_ERROR", "uncorrectable ECC error in the NPU's memory: the device needs a reset"),
    (507056, "ACL_ERROR_RT_LINK_ERROR", "the link to the NPU failed: check the driver and dmesg"),
    (507899, "ACL_ERROR_RT_DRV_INTERNAL_ERROR", "driver internal error"),
    (507901, "ACL_ERROR_RT_SOCKET_CLOSE", "the host lost its connection to the NPU: check the driver and dmesg"),
    (545001, "ACL_ERROR_GE_LOAD_MODEL", "loading the model failed: SoC or CANN version mismatch, or out of device memory"),
];

/// Codes after which the device answers no more in this process (lost, its driver or link
/// failed, its memory faulted): running again cannot help.
const DEVICE_LOST: &[i32] = &[
    207004, 507010, 507033, 507053, 507054, 507056, 507899, 507901,
];

pub(crate) fn device_lost(code: i32) -> bool {
    DEVICE_LOST.contains(&code)
}

/// The name and a hint for `code`.
pub(crate) fn describe(code: i32) -> (&'static str, &'static str) {
    if let Some((_, name, hint)) = KNOWN.iter().find(|(c, ..)| *c == code) {
        return (name, hint);
    }
    // CANN groups codes by their leading digit.
    match code / 100_000 {
        1 => ("parameter error", "an argument or file was rejected"),
        2 => (
            "resource error",
            "device memory, streams or a feature unavailable",
        ),
        3 => ("storage error", "storage limit exceeded"),
        5 => ("internal error", "see the plog (~/ascend/log)"),
        _ => ("unknown error", "see the plog (~/ascend/log)"),
    }
}

/// `call` failed with `code`: a message with the code's name, its hint and, when AscendCL has
/// one, its own last message.
pub(crate) fn message(call: &str, code: i32, recent: Option<&str>) -> String {
    let (name, hint) = describe(code);
    let mut m = format!("{call} failed: {code} {name}: {hint}");
    if let Some(r) = recent.filter(|r| !r.trim().is_empty()) {
        // The library's own text: shown escaped and cut, as any text from outside pi0d.
        m.push_str(&format!(" (AscendCL: {})", crate::outside::text(r.trim())));
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_codes_get_names_and_hints() {
        let m = message("aclmdlExecuteAsync", 507011, Some("EE1001: soc mismatch\n"));
        assert_eq!(
            m,
            "aclmdlExecuteAsync failed: 507011 ACL_ERROR_RT_MODEL_EXECUTE: model execution failed; most often the .om was compiled for another SoC (re-run ATC with the right --soc_version) (AscendCL: EE1001: soc mismatch)"
        );
        assert!(message("aclrtMalloc", 207001, None).contains("device memory exhausted"));
        assert!(message("aclrtSetDevice", 107001, Some(" ")).ends_with("npu-smi info"));
        // Its own message with a terminal escape and 1 MiB: escaped and cut.
        let long = format!("\x1b]0;title\x07{}", "x".repeat(1 << 20));
        let m = message("aclmdlExecuteAsync", 507011, Some(&long));
        assert!(!m.contains('\x1b') && m.contains("\\x1b]0;title"), "{m}");
        assert!(m.len() < 2048, "{} bytes", m.len());
    }

    #[test]
    fn unknown_codes_fall_back_to_their_group() {
        assert_eq!(describe(100099).0, "parameter error");
        assert_eq!(describe(207099).0, "resource error");
        assert_eq!(describe(507999).0, "internal error");
        assert_eq!(describe(42).0, "unknown error");
    }

    #[test]
    fn every_known_code_is_listed_once_under_its_group() {
        for (i, (code, name, _)) in KNOWN.iter().enumerate() {
            assert!(
                KNOWN[i + 1..].iter().all(|(c, ..)| c != code),
                "{code} twice"
            );
            assert!(name.starts_with("ACL_ERROR_"), "{name}");
            assert!((1..=5).contains(&(code / 100_000)), "{code}");
        }
    }
}

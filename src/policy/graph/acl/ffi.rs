//! The part of AscendCL pi0d calls, loaded from `libascendcl.so` at run time with `libloading`:
//! pi0d builds and runs without CANN installed, and says which library it could not find.
//!
//! `acl_api!` declares each entry point once; it produces the function-pointer table and a
//! textual copy of each Rust signature, which a test checks against the C prototypes in
//! `DOCUMENTED_PROTOTYPES` (transcribed from CANN's AscendCL API reference, `acl.h`,
//! `acl_rt.h`, `acl_mdl.h`, `acl_base.h`).

use std::ffi::{c_char, c_void};
use std::path::{Path, PathBuf};

/// `aclError`.
pub(crate) type AclError = i32;
/// `aclrtContext`, `aclrtStream`: opaque handles.
pub(crate) type Handle = *mut c_void;

/// `aclrtMemMallocPolicy::ACL_MEM_MALLOC_HUGE_FIRST`.
pub(crate) const ACL_MEM_MALLOC_HUGE_FIRST: i32 = 0;
/// `aclrtMemcpyKind` values.
pub(crate) const ACL_MEMCPY_HOST_TO_DEVICE: i32 = 1;
pub(crate) const ACL_MEMCPY_DEVICE_TO_HOST: i32 = 2;

macro_rules! acl_api {
    ($( $name:ident ( $($ty:ty),* ) -> $ret:ty; )*) => {
        /// AscendCL's entry points, resolved from the loaded library.
        #[allow(non_snake_case)]
        pub(crate) struct AclApi {
            $( pub(crate) $name: unsafe extern "C" fn($($ty),*) -> $ret, )*
            pub(crate) path: PathBuf,
            // Last: the library outlives every pointer taken from it.
            _lib: libloading::Library,
        }

        impl AclApi {
            /// Loads the library and resolves every entry point (all or nothing).
            #[allow(non_snake_case)]
            pub(crate) fn load(path: &Path) -> Result<AclApi, LoadError> {
                // SAFETY: loading runs the library's initializers (CANN's runtime has no
                // preconditions for that); each symbol is cast to the prototype CANN documents
                // for it, which `DOCUMENTED_PROTOTYPES` and its test pin down.
                unsafe {
                    let lib = libloading::Library::new(path).map_err(|source| LoadError::Open {
                        path: path.to_path_buf(),
                        source,
                    })?;
                    $(
                        let $name = *lib
                            .get::<unsafe extern "C" fn($($ty),*) -> $ret>(
                                concat!(stringify!($name), "\0").as_bytes(),
                            )
                            .map_err(|source| LoadError::Symbol {
                                path: path.to_path_buf(),
                                symbol: stringify!($name),
                                source,
                            })?;
                    )*
                    Ok(AclApi { $($name,)* path: path.to_path_buf(), _lib: lib })
                }
            }
        }

        /// `(name, Rust signature)` of every entry point, as declared above.
        #[cfg(test)]
        pub(crate) const RUST_SIGNATURES: &[(&str, &str)] = &[
            $( (stringify!($name), stringify!(fn($($ty),*) -> $ret)), )*
        ];
    };
}

acl_api! {
    aclInit(*const c_char) -> AclError;
    aclFinalize() -> AclError;
    aclrtSetDevice(i32) -> AclError;
    aclrtResetDevice(i32) -> AclError;
    aclrtCreateContext(*mut Handle, i32) -> AclError;
    aclrtDestroyContext(Handle) -> AclError;
    aclrtSetCurrentContext(Handle) -> AclError;
    aclrtCreateStream(*mut Handle) -> AclError;
    aclrtDestroyStream(Handle) -> AclError;
    aclrtSynchronizeStream(Handle) -> AclError;
    aclrtMalloc(*mut *mut c_void, usize, i32) -> AclError;
    aclrtFree(*mut c_void) -> AclError;
    aclrtMemcpy(*mut c_void, usize, *const c_void, usize, i32) -> AclError;
    aclmdlLoadFromFile(*const c_char, *mut u32) -> AclError;
    aclmdlUnload(u32) -> AclError;
    aclmdlCreateDesc() -> *mut c_void;
    aclmdlDestroyDesc(*mut c_void) -> AclError;
    aclmdlGetDesc(*mut c_void, u32) -> AclError;
    aclmdlGetNumInputs(*mut c_void) -> usize;
    aclmdlGetNumOutputs(*mut c_void) -> usize;
    aclmdlGetInputSizeByIndex(*mut c_void, usize) -> usize;
    aclmdlGetOutputSizeByIndex(*mut c_void, usize) -> usize;
    aclmdlGetInputNameByIndex(*const c_void, usize) -> *const c_char;
    aclmdlGetOutputNameByIndex(*const c_void, usize) -> *const c_char;
    aclmdlCreateDataset() -> *mut c_void;
    aclmdlDestroyDataset(*const c_void) -> AclError;
    aclmdlAddDatasetBuffer(*mut c_void, *mut c_void) -> AclError;
    aclCreateDataBuffer(*mut c_void, usize) -> *mut c_void;
    aclDestroyDataBuffer(*const c_void) -> AclError;
    aclmdlExecuteAsync(u32, *const c_void, *mut c_void, Handle) -> AclError;
    aclGetRecentErrMsg() -> *const c_char;
    aclrtGetSocName() -> *const c_char;
    aclrtGetDeviceCount(*mut u32) -> AclError;
    aclrtGetVersion(*mut i32, *mut i32, *mut i32) -> AclError;
}

/// The C prototypes, as CANN's AscendCL reference documents them.
#[cfg(test)]
pub(crate) const DOCUMENTED_PROTOTYPES: &str = "
aclError aclInit(const char *configPath);
aclError aclFinalize();
aclError aclrtSetDevice(int32_t deviceId);
aclError aclrtResetDevice(int32_t deviceId);
aclError aclrtCreateContext(aclrtContext *context, int32_t deviceId);
aclError aclrtDestroyContext(aclrtContext context);
aclError aclrtSetCurrentContext(aclrtContext context);
aclError aclrtCreateStream(aclrtStream *stream);
aclError aclrtDestroyStream(aclrtStream stream);
aclError aclrtSynchronizeStream(aclrtStream stream);
aclError aclrtMalloc(void **devPtr, size_t size, aclrtMemMallocPolicy policy);
aclError aclrtFree(void *devPtr);
aclError aclrtMemcpy(void *dst, size_t destMax, const void *src, size_t count, aclrtMemcpyKind kind);
aclError aclmdlLoadFromFile(const char *modelPath, uint32_t *modelId);
aclError aclmdlUnload(uint32_t modelId);
aclmdlDesc *aclmdlCreateDesc();
aclError aclmdlDestroyDesc(aclmdlDesc *modelDesc);
aclError aclmdlGetDesc(aclmdlDesc *modelDesc, uint32_t modelId);
size_t aclmdlGetNumInputs(aclmdlDesc *modelDesc);
size_t aclmdlGetNumOutputs(aclmdlDesc *modelDesc);
size_t aclmdlGetInputSizeByIndex(aclmdlDesc *modelDesc, size_t index);
size_t aclmdlGetOutputSizeByIndex(aclmdlDesc *modelDesc, size_t index);
const char *aclmdlGetInputNameByIndex(const aclmdlDesc *modelDesc, size_t index);
const char *aclmdlGetOutputNameByIndex(const aclmdlDesc *modelDesc, size_t index);
aclmdlDataset *aclmdlCreateDataset();
aclError aclmdlDestroyDataset(const aclmdlDataset *dataset);
aclError aclmdlAddDatasetBuffer(aclmdlDataset *dataset, aclDataBuffer *dataBuffer);
aclDataBuffer *aclCreateDataBuffer(void *data, size_t size);
aclError aclDestroyDataBuffer(const aclDataBuffer *dataBuffer);
aclError aclmdlExecuteAsync(uint32_t modelId, const aclmdlDataset *input, aclmdlDataset *output, aclrtStream stream);
const char *aclGetRecentErrMsg();
const char *aclrtGetSocName();
aclError aclrtGetDeviceCount(uint32_t *count);
aclError aclrtGetVersion(int32_t *majorVersion, int32_t *minorVersion, int32_t *patchVersion);
";

/// Where CANN installs the library, searched after `ASCEND_HOME_PATH` / `ASCEND_TOOLKIT_HOME`
/// and the loader's own path.
pub(crate) const DEFAULT_DIRS: &[&str] = &[
    "/usr/local/Ascend/ascend-toolkit/latest/lib64",
    "/usr/local/Ascend/ascend-toolkit/latest/runtime/lib64",
    "/usr/local/Ascend/nnrt/latest/lib64",
    "/usr/local/Ascend/nnae/latest/lib64",
];

pub(crate) const LIBRARY: &str = "libascendcl.so";

/// Candidate paths for `libascendcl.so`, most specific first.
pub(crate) fn candidates(explicit: Option<&Path>) -> Vec<PathBuf> {
    if let Some(p) = explicit {
        return vec![p.to_path_buf()];
    }
    let mut out = Vec::new();
    for var in ["ASCEND_HOME_PATH", "ASCEND_TOOLKIT_HOME"] {
        if let Some(home) = std::env::var_os(var) {
            out.push(PathBuf::from(home).join("lib64").join(LIBRARY));
        }
    }
    out.extend(DEFAULT_DIRS.iter().map(|d| Path::new(d).join(LIBRARY)));
    // Last: whatever LD_LIBRARY_PATH / ld.so.cache resolve.
    out.push(PathBuf::from(LIBRARY));
    out
}

/// Why AscendCL's library is not loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("{}", path.display())]
    Open {
        path: PathBuf,
        #[source]
        source: libloading::Error,
    },
    #[error("{}: no {symbol}", path.display())]
    Symbol {
        path: PathBuf,
        symbol: &'static str,
        #[source]
        source: libloading::Error,
    },
    /// No candidate loaded: each one's error, with its cause, `; `-separated (several
    /// errors, so no one of them is the source).
    #[error("cannot load AscendCL ({LIBRARY}): install CANN (toolkit or nnrt) and `source set_env.sh`, or name the library with policy.acl.library in the config or --acl-library on pi0d infer; tried {tried}")]
    NotFound { tried: String },
}

/// Loads the first candidate that loads; the error lists every place looked at.
pub(crate) fn load(explicit: Option<&Path>) -> Result<AclApi, LoadError> {
    let mut tried = Vec::new();
    for path in candidates(explicit) {
        match AclApi::load(&path) {
            Ok(api) => return Ok(api),
            Err(e) => tried.push(crate::errors::Chain(&e).to_string()),
        }
    }
    Err(LoadError::NotFound {
        tried: tried.join("; "),
    })
}

/// Maps a C prototype's types onto the Rust types of the table (for the signature check).
#[cfg(test)]
pub(crate) fn c_type_to_rust(c: &str) -> Option<&'static str> {
    let c: String = c.split_whitespace().collect::<Vec<_>>().join(" ");
    Some(match c.as_str() {
        "aclError" => "AclError",
        "int32_t" => "i32",
        "uint32_t" => "u32",
        "size_t" => "usize",
        "aclrtMemMallocPolicy" | "aclrtMemcpyKind" => "i32",
        "aclrtContext" | "aclrtStream" => "Handle",
        "aclrtContext *" | "aclrtStream *" => "*mut Handle",
        "const char *" => "*const c_char",
        "void *" => "*mut c_void",
        "void **" => "*mut *mut c_void",
        "const void *" => "*const c_void",
        "uint32_t *" => "*mut u32",
        "int32_t *" => "*mut i32",
        "aclmdlDesc *" | "aclmdlDataset *" | "aclDataBuffer *" => "*mut c_void",
        "const aclmdlDesc *" | "const aclmdlDataset *" | "const aclDataBuffer *" => "*const c_void",
        _ => return None,
    })
}

/// `(name, Rust signature)` from a documented C prototype such as
/// `aclError aclrtFree(void *devPtr);`.
#[cfg(test)]
pub(crate) fn rust_signature_of(prototype: &str) -> Option<(String, String)> {
    let p = prototype.trim().trim_end_matches(';');
    let open = p.find('(')?;
    let (head, args) = (&p[..open], p[open + 1..].trim_end_matches(')'));
    // The name is the last identifier of the head; the return type is what precedes it.
    let name_start = head.rfind(|c: char| !(c.is_alphanumeric() || c == '_'))? + 1;
    let name = head[name_start..].to_string();
    let ret = c_type_to_rust(head[..name_start].trim().replace('*', " *").trim())?;
    let mut rust_args = Vec::new();
    for arg in args.split(',').map(str::trim).filter(|a| !a.is_empty()) {
        // Drop the parameter name, keep the type with its stars.
        let stars = arg.matches('*').count();
        let without_stars = arg.replace('*', " ");
        let mut words: Vec<&str> = without_stars.split_whitespace().collect();
        words.pop();
        let ty = format!(
            "{}{}",
            words.join(" "),
            if stars > 0 {
                format!(" {}", "*".repeat(stars))
            } else {
                String::new()
            }
        );
        rust_args.push(c_type_to_rust(&ty)?.to_string());
    }
    Some((name, format!("fn({}) -> {ret}", rust_args.join(", "))))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn normalize(s: &str) -> String {
        s.chars().filter(|c| !c.is_whitespace()).collect()
    }

    #[test]
    fn ffi_table_matches_documented_prototypes() {
        let documented: Vec<(String, String)> = DOCUMENTED_PROTOTYPES
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| rust_signature_of(l).unwrap_or_else(|| panic!("cannot parse `{l}`")))
            .collect();
        assert_eq!(documented.len(), RUST_SIGNATURES.len());
        for (name, sig) in RUST_SIGNATURES {
            let (_, want) = documented
                .iter()
                .find(|(n, _)| n == name)
                .unwrap_or_else(|| panic!("{name} is not documented"));
            assert_eq!(normalize(sig), normalize(want), "{name}");
        }
    }

    #[test]
    fn prototype_parser_reads_pointers_and_consts() {
        assert_eq!(
            rust_signature_of(
                "aclError aclrtMalloc(void **devPtr, size_t size, aclrtMemMallocPolicy policy);"
            ),
            Some((
                "aclrtMalloc".into(),
                "fn(*mut *mut c_void, usize, i32) -> AclError".into()
            ))
        );
        assert_eq!(
            rust_signature_of(
                "const char *aclmdlGetInputNameByIndex(const aclmdlDesc *modelDesc, size_t index);"
            ),
            Some((
                "aclmdlGetInputNameByIndex".into(),
                "fn(*const c_void, usize) -> *const c_char".into()
            ))
        );
        // A wrong declaration is caught: argument order swapped.
        let (_, sig) =
            rust_signature_of("aclError aclmdlGetDesc(aclmdlDesc *modelDesc, uint32_t modelId);")
                .unwrap();
        assert_ne!(
            normalize(&sig),
            normalize("fn(u32, *mut c_void) -> AclError")
        );
    }

    #[test]
    fn missing_library_error_names_what_was_tried() {
        let err = match load(Some(Path::new("/nonexistent/libascendcl.so"))) {
            Err(e) => e.to_string(),
            Ok(_) => panic!("loaded a library that does not exist"),
        };
        assert!(err.contains("/nonexistent/libascendcl.so"), "{err}");
        assert!(err.contains("install CANN"), "{err}");
        // Both settings that name the library exist (config key and `pi0d infer` flag).
        assert!(
            err.contains("policy.acl.library") && err.contains("--acl-library"),
            "{err}"
        );
    }
}

//! Scratch directories and repository paths for tests: the library's unit tests and, through
//! `pi0d::testing`, the integration tests use the same helpers.

use std::path::{Path, PathBuf};

/// A fresh directory under the system's temp dir, `pi0d-<name>-<pid>`, removed with everything
/// in it when dropped: also when the test panics, so a failed assertion leaves nothing behind.
/// `PI0D_KEEP_TEST_DIRS=1` keeps them for a post-mortem.
pub struct TempDir(PathBuf);

impl TempDir {
    /// Creates it empty (whatever an earlier run of this process id left there is removed).
    pub fn new(name: &str) -> TempDir {
        let dir = std::env::temp_dir().join(format!("pi0d-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)
            .unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
        TempDir(dir)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl std::ops::Deref for TempDir {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<Path> for TempDir {
    fn as_ref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<std::ffi::OsStr> for TempDir {
    fn as_ref(&self) -> &std::ffi::OsStr {
        self.0.as_os_str()
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if std::env::var_os("PI0D_KEEP_TEST_DIRS").is_none() {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

/// A path inside this repository (a peer script, a fixture), for the unit tests.
#[cfg(test)]
pub(crate) fn repo_path(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

/// The interoperability peers' Python (the venv `tools/test.sh` makes), or `PI0D_PEER_PYTHON`.
pub fn peer_python() -> PathBuf {
    if let Some(p) = std::env::var_os("PI0D_PEER_PYTHON") {
        return PathBuf::from(p);
    }
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv/bin/python");
    assert!(
        p.exists(),
        "{} missing: run ./tools/test.sh, which creates the peers' venv",
        p.display()
    );
    p
}

/// The ONNX Runtime library of the peers' venv (the pinned onnxruntime wheel `tools/test.sh`
/// installs), or `ORT_DYLIB_PATH`.
pub fn ort_library() -> PathBuf {
    if let Some(p) = std::env::var_os("ORT_DYLIB_PATH") {
        return p.into();
    }
    let lib = Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv/lib");
    let found = std::fs::read_dir(&lib).ok().and_then(|dirs| {
        dirs.flatten().find_map(|py| {
            let capi = py.path().join("site-packages/onnxruntime/capi");
            std::fs::read_dir(capi).ok()?.flatten().find_map(|f| {
                let name = f.file_name().to_string_lossy().into_owned();
                name.starts_with("libonnxruntime.so.").then(|| f.path())
            })
        })
    });
    found.unwrap_or_else(|| {
        panic!(
            "no libonnxruntime.so.* under {}: run ./tools/test.sh (it installs the pinned onnxruntime wheel)",
            lib.display()
        )
    })
}

/// A processor golden case (`tests/fixtures/processors/<name>`, written by
/// tools/make_golden_processors.py) made into a checkpoint: the case's config.json, pipeline
/// files and stats beside its base checkpoint's weights, arch.json and tokenizer. Returns the
/// case's directory (its `case.json`, `raw.safetensors`, `expected.safetensors`) and the
/// checkpoint (removed when dropped).
pub fn processor_case(name: &str) -> (PathBuf, TempDir) {
    const CASE_ONLY: [&str; 3] = ["case.json", "raw.safetensors", "expected.safetensors"];
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let dir = fixtures.join("processors").join(name);
    let case: serde_json::Value = std::fs::read_to_string(dir.join("case.json"))
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or_else(|| panic!("{}: no readable case.json", dir.display()));
    let base = fixtures.join(case["checkpoint"].as_str().unwrap_or_default());
    // Tests of one process assemble the same case at once: each gets its own directory.
    static COUNT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = COUNT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let checkpoint = TempDir::new(&format!("processor-{name}-{n}"));
    let copy = |from: &Path, to: &Path| {
        std::fs::copy(from, to)
            .unwrap_or_else(|e| panic!("{} -> {}: {e}", from.display(), to.display()));
    };
    for f in ["model.safetensors", "arch.json", "tokenizer.json"] {
        copy(&base.join(f), &checkpoint.join(f));
    }
    let entries = std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for e in entries.flatten() {
        let f = e.file_name();
        if !CASE_ONLY.iter().any(|c| f == *c) {
            copy(&e.path(), &checkpoint.join(&f));
        }
    }
    (dir, checkpoint)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn when_a_test_panics_holding_a_temp_dir_expect_the_dir_removed() {
        let at = std::sync::Mutex::new(PathBuf::new());
        let r = std::panic::catch_unwind(|| {
            let d = TempDir::new("testing-guard");
            std::fs::write(d.join("file"), b"x").unwrap();
            *at.lock().unwrap() = d.path().to_path_buf();
            panic!("a failing test");
        });
        assert!(r.is_err());
        let at = at.into_inner().unwrap();
        assert!(at.ends_with(format!("pi0d-testing-guard-{}", std::process::id())));
        assert!(!at.exists(), "{} left behind", at.display());
    }
}

//! Helpers for the library's own unit tests (compiled only under `cfg(test)`).

use std::path::{Path, PathBuf};

/// A fresh directory under the system's temp dir, `pi0d-<name>-<pid>`, removed with everything
/// in it when dropped: also when the test panics, so a failed assertion leaves nothing behind.
pub(crate) struct TempDir(PathBuf);

impl TempDir {
    /// Creates it empty (whatever an earlier run of this process id left there is removed).
    pub(crate) fn new(name: &str) -> TempDir {
        let dir = std::env::temp_dir().join(format!("pi0d-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)
            .unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
        TempDir(dir)
    }

    pub(crate) fn path(&self) -> &Path {
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

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
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

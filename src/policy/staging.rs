//! An output directory written whole or not at all (`pi0d export`'s graphs, `pi0d quantize`'s
//! checkpoint): everything goes to a directory beside the target, renamed into place at the end.

use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub(crate) enum StagingError {
    #[error("{path}: cannot write it")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Refused(String),
}

/// The output's directory while it is written: `OUT.tmp-<pid>` beside `OUT` (same filesystem),
/// renamed into place only once everything is written, and removed otherwise (also on panic).
/// An older output at `OUT` (one holding `marker`) is moved aside, replaced, then deleted: `OUT`
/// never holds a mix, and a directory that is not such an output is never replaced.
pub(crate) struct Staging {
    out: PathBuf,
    pub(crate) tmp: PathBuf,
    old: PathBuf,
    committed: bool,
}

impl Staging {
    pub(crate) fn new(out: &Path, marker: &str, what: &str) -> Result<Staging, StagingError> {
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| StagingError::Io { path, source }
        };
        let name = out.file_name().ok_or_else(|| {
            StagingError::Refused(format!(
                "--out {}: name the {what}'s directory (it is written beside it, then renamed)",
                out.display()
            ))
        })?;
        match std::fs::symlink_metadata(out) {
            Ok(meta) if meta.is_dir() => {
                let empty = std::fs::read_dir(out).map_err(io(out))?.next().is_none();
                if !empty && !out.join(marker).is_file() {
                    return Err(StagingError::Refused(format!(
                        "{} exists and is not a pi0d {what} (no {marker}): refusing to replace it",
                        out.display(),
                    )));
                }
            }
            Ok(_) => {
                return Err(StagingError::Refused(format!(
                    "{} exists and is not a directory: refusing to replace it",
                    out.display()
                )))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io(out)(e)),
        }
        let parent = match out.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        std::fs::create_dir_all(&parent).map_err(io(&parent))?;
        let beside = |suffix: &str| {
            let mut n = name.to_os_string();
            n.push(format!(".{suffix}-{}", std::process::id()));
            parent.join(n)
        };
        let staging = Staging {
            out: out.to_path_buf(),
            tmp: beside("tmp"),
            old: beside("old"),
            committed: false,
        };
        // Left by an earlier run that died with this pid: never anyone's data.
        let _ = std::fs::remove_dir_all(&staging.tmp);
        std::fs::create_dir(&staging.tmp).map_err(io(&staging.tmp))?;
        Ok(staging)
    }

    pub(crate) fn commit(mut self) -> Result<(), StagingError> {
        let had_old = self.out.exists();
        if had_old {
            std::fs::rename(&self.out, &self.old).map_err(|source| StagingError::Io {
                path: self.out.clone(),
                source,
            })?;
        }
        if let Err(source) = std::fs::rename(&self.tmp, &self.out) {
            if had_old {
                let _ = std::fs::rename(&self.old, &self.out);
            }
            return Err(StagingError::Io {
                path: self.out.clone(),
                source,
            });
        }
        self.committed = true;
        if had_old {
            if let Err(e) = std::fs::remove_dir_all(&self.old) {
                tracing::warn!(path = %self.old.display(), error = %e, "cannot remove the replaced directory");
            }
        }
        Ok(())
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        if !self.committed {
            let _ = std::fs::remove_dir_all(&self.tmp);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MARKER: &str = "manifest.json";

    fn scratch(name: &str) -> crate::test_dirs::TempDir {
        crate::test_dirs::TempDir::new(&format!("staging-{name}"))
    }

    /// Names in `dir`, sorted.
    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn when_staging_is_dropped_uncommitted_expect_nothing_left() {
        let dir = scratch("dropped");
        let out = dir.join("graphs");
        let s = Staging::new(&out, MARKER, "export").unwrap();
        std::fs::write(s.tmp.join("prefix.onnx"), b"half").unwrap();
        drop(s);
        assert!(names(&dir).is_empty(), "{:?}", names(&dir));
    }

    #[test]
    fn when_staging_commits_over_an_older_export_expect_it_replaced_whole() {
        let dir = scratch("replace");
        let out = dir.join("graphs");
        std::fs::create_dir(&out).unwrap();
        for f in [MARKER, "denoise_step.onnx"] {
            std::fs::write(out.join(f), b"old").unwrap();
        }
        let s = Staging::new(&out, MARKER, "export").unwrap();
        for f in [MARKER, "denoise_unrolled.onnx"] {
            std::fs::write(s.tmp.join(f), b"new").unwrap();
        }
        s.commit().unwrap();
        assert_eq!(names(&dir), ["graphs"]);
        assert_eq!(names(&out), ["denoise_unrolled.onnx", "manifest.json"]);
        assert_eq!(std::fs::read(out.join(MARKER)).unwrap(), b"new");
    }

    #[test]
    fn when_target_is_not_an_export_expect_refusal_and_its_files_kept() {
        let dir = scratch("foreign");
        let notes = dir.join("notes");
        std::fs::create_dir(&notes).unwrap();
        std::fs::write(notes.join("todo.txt"), b"keep me").unwrap();
        let e = Staging::new(&notes, MARKER, "export")
            .err()
            .unwrap()
            .to_string();
        assert!(
            e.contains("is not a pi0d export (no manifest.json): refusing to replace it"),
            "{e}"
        );
        std::fs::write(dir.join("file"), b"x").unwrap();
        let e = Staging::new(&dir.join("file"), MARKER, "export")
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("exists and is not a directory"), "{e}");
        assert!(Staging::new(Path::new("/"), MARKER, "export").is_err());
        assert_eq!(names(&dir), ["file", "notes"]);
        assert_eq!(std::fs::read(notes.join("todo.txt")).unwrap(), b"keep me");
        // An empty directory (made for the export beforehand) is taken.
        let empty = dir.join("empty");
        std::fs::create_dir(&empty).unwrap();
        Staging::new(&empty, MARKER, "export")
            .unwrap()
            .commit()
            .unwrap();
        assert!(empty.is_dir());
    }
}

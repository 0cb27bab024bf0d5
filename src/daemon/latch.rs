//! The fault latch: after a fault, or a process that never got to say how it ended (a watchdog
//! kill, SIGKILL, a power cut), the next start does not move the arm by itself. A marker in the
//! service's state directory (`$STATE_DIRECTORY`, `--state-dir`) is written at start and removed
//! only by an end that needs no person; a start that finds one begins e-stopped, and the
//! marker goes once a reset is accepted and the run ends cleanly.
//!
//! Every doubt latches. A marker that cannot be read or parsed (not UTF-8, a symlink, not a
//! regular file, cut off) latches the next start like a fault. One run keeps the state
//! directory at a time (an exclusive `flock` on it, held until the process ends, however it
//! ends): a second pi0d on it refuses to start rather than share the marker. A run replaces or
//! removes only the marker it wrote itself (its pid and start token); one it did not write is
//! left in place, so it latches the next start. Markers are written whole: a new file created
//! with `O_EXCL | O_NOFOLLOW` (a planted symlink is never written through), synced, then
//! renamed over the marker.

use std::fs::File;
use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use super::exit::ExitReason;

const FILE: &str = "fault-latch.json";
/// A marker is a few hundred bytes; anything much larger is not one.
const MAX_BYTES: u64 = 64 << 10;

#[derive(Debug, thiserror::Error)]
pub enum LatchError {
    #[error("{path}: cannot keep the fault latch there")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{dir}: another pi0d{} keeps its fault latch in this state directory; give each daemon its own (--state-dir, StateDirectory=)", pid.map(|p| format!(" (pid {p})")).unwrap_or_default())]
    InUse { dir: PathBuf, pid: Option<u32> },
    #[error("{path}: the marker is not this run's ({found}): left as it is, so the next start waits for a reset")]
    NotOwned { path: PathBuf, found: String },
}

#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
struct Marker {
    /// `running`, or the exit reason's name of the run that left it.
    state: String,
    /// Why the arm waits for a reset (the run that left the marker ended so), until a reset.
    latched: Option<String>,
    pid: u32,
    /// Tells this run's marker from one a process with the same pid left (markers written
    /// before tokens existed have none).
    #[serde(default)]
    token: Option<String>,
}

/// How the bytes of a marker reach its new file (a seam: a test makes it fail like a full disk).
type WriteFn = fn(&mut File, &[u8]) -> io::Result<()>;

fn write_and_sync(f: &mut File, bytes: &[u8]) -> io::Result<()> {
    f.write_all(bytes)?;
    f.sync_all()
}

pub(crate) struct FaultLatch {
    dir: PathBuf,
    path: PathBuf,
    /// The state directory, opened and `flock`ed: the kernel releases the lock when the process
    /// ends, however it ends.
    _lock: File,
    /// This run's start token, in every marker it writes.
    token: String,
    /// The previous run's end when it latched this run, until a reset clears it.
    latched: Option<String>,
    write_bytes: WriteFn,
}

/// What reading the marker found.
enum Found {
    None,
    Marker(Marker),
    /// Unreadable or unparsable: why.
    Unreadable(String),
}

fn read_marker(path: &Path) -> Found {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path);
    let text = match file.and_then(|f| crate::files::read_open(f, MAX_BYTES)) {
        Ok(t) => t,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Found::None,
        Err(e) => return Found::Unreadable(e.to_string()),
    };
    match serde_json::from_str::<Marker>(&text) {
        Ok(m) => Found::Marker(m),
        Err(e) => Found::Unreadable(e.to_string()),
    }
}

impl FaultLatch {
    /// Takes the state directory `dir` for this run, reads what the previous run left there
    /// and marks this one as running.
    pub(crate) fn open(dir: &Path) -> Result<FaultLatch, LatchError> {
        let io_err = |path: &Path| {
            let path = path.to_path_buf();
            move |source| LatchError::Io { path, source }
        };
        std::fs::create_dir_all(dir).map_err(io_err(dir))?;
        let lock = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECTORY | libc::O_CLOEXEC)
            .open(dir)
            .map_err(io_err(dir))?;
        // SAFETY: flock on a descriptor this function owns.
        if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::WouldBlock {
                let pid = match read_marker(&dir.join(FILE)) {
                    Found::Marker(m) => Some(m.pid),
                    _ => None,
                };
                return Err(LatchError::InUse {
                    dir: dir.to_path_buf(),
                    pid,
                });
            }
            return Err(io_err(dir)(e));
        }
        let path = dir.join(FILE);
        let latched = match read_marker(&path) {
            Found::None => None,
            // Still latched from before (never reset), or a run that did not end well.
            Found::Marker(m) => Some(m.latched.unwrap_or_else(|| match m.state.as_str() {
                "running" => "killed (the previous run never said how it ended)".into(),
                s => s.to_string(),
            })),
            Found::Unreadable(why) => Some(format!(
                "unreadable marker (a previous run was cut off, or something else wrote it): {why}"
            )),
        };
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let latch = FaultLatch {
            dir: dir.to_path_buf(),
            path,
            _lock: lock,
            token: format!("{}-{nanos:x}", std::process::id()),
            latched,
            write_bytes: write_and_sync,
        };
        latch.write("running", latch.latched.clone())?;
        Ok(latch)
    }

    /// Why this run starts e-stopped, if it does.
    pub(crate) fn latched(&self) -> Option<&str> {
        self.latched.as_deref()
    }

    /// A reset was accepted: the latch no longer holds this run. When the marker cannot be
    /// updated the latch stays (the marker on disk still latches).
    pub(crate) fn reset(&mut self) -> Result<(), LatchError> {
        match self.ownership() {
            Ownership::Ours => {}
            Ownership::Gone => return Err(self.not_owned("it is gone".into())),
            Ownership::Other(found) => return Err(self.not_owned(found)),
        }
        self.write("running", None)?;
        self.latched = None;
        Ok(())
    }

    /// How this run ended: a fault keeps the marker (the next start waits for a reset); an end
    /// that needs no person removes it, unless the latch was never reset. Returns why the next
    /// start will wait for a reset, if it will.
    pub(crate) fn finish(self, exit: ExitReason) -> Result<Option<String>, LatchError> {
        let fault = matches!(
            exit,
            ExitReason::StopTimeout
                | ExitReason::ControlFault
                | ExitReason::ThreadFault
                | ExitReason::LimitViolation
                | ExitReason::RuntimeFailure
        );
        let next = match &self.latched {
            Some(why) => Some(why.clone()),
            // A fault end latches the next run with its own name.
            None => fault.then(|| exit.name().to_string()),
        };
        match self.ownership() {
            Ownership::Ours => {}
            // Gone while this run held the directory: something else uses it; latch the next
            // start.
            Ownership::Gone => {
                let why = next.unwrap_or_else(|| {
                    "the marker was removed while pi0d ran (something else uses the state directory)".into()
                });
                self.write(exit.name(), Some(why.clone()))?;
                return Ok(Some(why));
            }
            Ownership::Other(found) => return Err(self.not_owned(found)),
        }
        match next {
            Some(why) => {
                self.write(exit.name(), Some(why.clone()))?;
                Ok(Some(why))
            }
            None => match std::fs::remove_file(&self.path) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => Err(LatchError::Io {
                    path: self.path.clone(),
                    source: e,
                }),
                _ => Ok(None),
            },
        }
    }

    /// Whose the marker on disk is.
    fn ownership(&self) -> Ownership {
        match read_marker(&self.path) {
            Found::Marker(m)
                if m.pid == std::process::id() && m.token.as_ref() == Some(&self.token) =>
            {
                Ownership::Ours
            }
            Found::Marker(m) => Ownership::Other(format!("written by pid {}", m.pid)),
            Found::None => Ownership::Gone,
            Found::Unreadable(why) => Ownership::Other(format!("unreadable: {why}")),
        }
    }

    fn not_owned(&self, found: String) -> LatchError {
        LatchError::NotOwned {
            path: self.path.clone(),
            found,
        }
    }

    fn write(&self, state: &str, latched: Option<String>) -> Result<(), LatchError> {
        let m = Marker {
            state: state.into(),
            latched,
            pid: std::process::id(),
            token: Some(self.token.clone()),
        };
        let text = serde_json::to_string(&m).map_err(|e| LatchError::Io {
            path: self.path.clone(),
            source: io::Error::from(e),
        })?;
        // Whole or not at all: a cut-off write must not read as "no fault". The new file is
        // this process's own (O_EXCL: never an existing file, nor a symlink's target).
        let tmp = self.dir.join(format!(".{FILE}.{}.tmp", std::process::id()));
        let create = || {
            std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
                .mode(0o644)
                .open(&tmp)
        };
        let r = match create() {
            // Left by a run cut off mid-write that had this pid (after a reboot): not ours to
            // keep. `remove_file` removes a symlink itself, never its target.
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                std::fs::remove_file(&tmp).and_then(|()| create())
            }
            r => r,
        }
        .and_then(|mut f| (self.write_bytes)(&mut f, text.as_bytes()))
        .and_then(|()| std::fs::rename(&tmp, &self.path))
        .and_then(|()| File::open(&self.dir)?.sync_all());
        if r.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        r.map_err(|source| LatchError::Io {
            path: self.path.clone(),
            source,
        })
    }
}

enum Ownership {
    Ours,
    Gone,
    /// Another's, or unreadable: what was found.
    Other(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(name: &str) -> crate::test_dirs::TempDir {
        crate::test_dirs::TempDir::new(&format!("latch-{name}"))
    }

    fn enospc(_: &mut File, _: &[u8]) -> io::Result<()> {
        Err(io::Error::from_raw_os_error(libc::ENOSPC))
    }

    /// A run on `d` that never finished: its lock released as a dying process's is, its
    /// marker left as it was.
    fn killed(d: &Path) {
        drop(FaultLatch::open(d).unwrap());
    }

    #[test]
    fn a_clean_run_leaves_nothing_and_a_fault_latches_the_next_until_a_reset() {
        let d = dir("cycle");
        let l = FaultLatch::open(&d).unwrap();
        assert_eq!(l.latched(), None);
        assert_eq!(l.finish(ExitReason::Clean).unwrap(), None);
        assert!(!d.join(FILE).exists());

        let next = FaultLatch::open(&d)
            .unwrap()
            .finish(ExitReason::ControlFault)
            .unwrap();
        assert_eq!(next.as_deref(), Some("control_fault"));
        let l = FaultLatch::open(&d).unwrap();
        assert_eq!(l.latched(), Some("control_fault"));
        // Ended without a reset: still latched next time.
        l.finish(ExitReason::Clean).unwrap();
        let mut l = FaultLatch::open(&d).unwrap();
        assert_eq!(l.latched(), Some("control_fault"));
        l.reset().unwrap();
        l.finish(ExitReason::Clean).unwrap();
        assert_eq!(FaultLatch::open(&d).unwrap().latched(), None);
    }

    #[test]
    fn a_run_that_never_finished_latches_the_next() {
        let d = dir("killed");
        killed(&d);
        let l = FaultLatch::open(&d).unwrap();
        assert!(
            l.latched().unwrap().starts_with("killed"),
            "{:?}",
            l.latched()
        );
        drop(l);
        std::fs::write(d.join(FILE), "{trunc").unwrap();
        assert!(FaultLatch::open(&d)
            .unwrap()
            .latched()
            .unwrap()
            .contains("unreadable"));
        // Not a fault: nothing latched by an invalid configuration.
        let mut l = FaultLatch::open(&d).unwrap();
        l.reset().unwrap();
        l.finish(ExitReason::InvalidInput).unwrap();
        assert_eq!(FaultLatch::open(&d).unwrap().latched(), None);
    }

    #[test]
    fn when_the_marker_is_not_utf8_or_not_a_regular_file_expect_latched_not_an_error() {
        let d = dir("unreadable");
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join(FILE), b"{\"state\":\"running\xff\"}").unwrap();
        let l = FaultLatch::open(&d).expect("an unreadable marker latches, it is no error");
        assert!(
            l.latched().unwrap().contains("unreadable"),
            "{:?}",
            l.latched()
        );
        drop(l);
        // A symlink where the marker goes is not followed: unreadable, so latched.
        std::fs::remove_file(d.join(FILE)).unwrap();
        let target = d.join("target");
        std::fs::write(&target, "keep").unwrap();
        std::os::unix::fs::symlink(&target, d.join(FILE)).unwrap();
        let l = FaultLatch::open(&d).unwrap();
        assert!(
            l.latched().unwrap().contains("unreadable"),
            "{:?}",
            l.latched()
        );
        // The symlink was replaced by this run's marker, its target untouched.
        assert!(!std::fs::symlink_metadata(d.join(FILE))
            .unwrap()
            .file_type()
            .is_symlink());
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep");
    }

    #[test]
    fn when_a_temp_file_symlink_is_planted_expect_its_target_never_written() {
        let d = dir("planted");
        std::fs::create_dir_all(&d).unwrap();
        let victim = d.join("victim");
        std::fs::write(&victim, "keep").unwrap();
        // Where this version and earlier ones put the marker's new file.
        for name in [
            "fault-latch.tmp".to_string(),
            format!(".{FILE}.{}.tmp", std::process::id()),
        ] {
            std::os::unix::fs::symlink(&victim, d.join(name)).unwrap();
        }
        let l = FaultLatch::open(&d).unwrap();
        l.finish(ExitReason::ControlFault).unwrap();
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep");
        assert_eq!(
            FaultLatch::open(&d).unwrap().latched(),
            Some("control_fault")
        );
    }

    #[test]
    fn when_another_latch_holds_the_directory_expect_refused_and_its_marker_kept() {
        let d = dir("two");
        let a = FaultLatch::open(&d).unwrap();
        match FaultLatch::open(&d) {
            Err(LatchError::InUse { pid, .. }) => assert_eq!(pid, Some(std::process::id())),
            Err(e) => panic!("{e}"),
            Ok(_) => panic!("a second latch on one state directory"),
        }
        // The marker is still A's: A's clean end removes it.
        a.finish(ExitReason::Clean).unwrap();
        assert!(!d.join(FILE).exists());
    }

    #[test]
    fn when_the_marker_was_replaced_by_another_run_expect_it_kept_and_an_error() {
        let d = dir("foreign");
        let a = FaultLatch::open(&d).unwrap();
        let theirs = r#"{"state":"running","latched":null,"pid":1,"token":"other"}"#;
        std::fs::write(d.join(FILE), theirs).unwrap();
        let e = a.finish(ExitReason::Clean).unwrap_err();
        assert!(matches!(e, LatchError::NotOwned { .. }), "{e}");
        assert_eq!(std::fs::read_to_string(d.join(FILE)).unwrap(), theirs);
        // And it latches the next start.
        assert!(FaultLatch::open(&d).unwrap().latched().is_some());
    }

    #[test]
    fn when_the_marker_vanishes_during_the_run_expect_the_next_start_latched() {
        let d = dir("vanished");
        let a = FaultLatch::open(&d).unwrap();
        std::fs::remove_file(d.join(FILE)).unwrap();
        let next = a.finish(ExitReason::Clean).unwrap();
        assert!(next.unwrap().contains("removed"));
        assert!(FaultLatch::open(&d).unwrap().latched().is_some());
    }

    #[test]
    fn when_the_disk_is_full_after_a_reset_expect_errors_and_the_latch_kept() {
        let d = dir("enospc");
        FaultLatch::open(&d)
            .unwrap()
            .finish(ExitReason::ControlFault)
            .unwrap();
        let mut l = FaultLatch::open(&d).unwrap();
        l.write_bytes = enospc;
        let e = l.reset().unwrap_err();
        let LatchError::Io { source, .. } = &e else {
            panic!("{e}")
        };
        assert_eq!(source.raw_os_error(), Some(libc::ENOSPC));
        // Not lifted: the marker on disk still latches.
        assert_eq!(l.latched(), Some("control_fault"));
        assert!(l.finish(ExitReason::Clean).is_err());
        assert_eq!(
            FaultLatch::open(&d).unwrap().latched(),
            Some("control_fault")
        );
        assert_eq!(
            std::fs::read_dir(&d).unwrap().count(),
            1,
            "no temp file left"
        );
    }
}

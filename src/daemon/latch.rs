//! The fault latch: after a fault, or a process that never got to say how it ended (a watchdog
//! kill, SIGKILL, a power cut), the next start does not move the arm by itself. A marker in the
//! service's state directory (`$STATE_DIRECTORY`, `--state-dir`) is written at start and removed
//! only by an end that needs no person; a start that finds one begins e-stopped, and the
//! marker goes once a reset is accepted and the run ends cleanly.

use std::path::{Path, PathBuf};

use super::exit::ExitReason;

const FILE: &str = "fault-latch.json";

#[derive(Debug, thiserror::Error)]
#[error("{path}: cannot keep the fault latch there")]
pub struct LatchError {
    pub path: PathBuf,
    #[source]
    pub source: std::io::Error,
}

#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
struct Marker {
    /// `running`, or the exit reason's name of the run that left it.
    state: String,
    /// Why the arm waits for a reset (the run that left the marker ended so), until a reset.
    latched: Option<String>,
    pid: u32,
}

pub struct FaultLatch {
    path: PathBuf,
    /// The previous run's end when it latched this run, until a reset clears it.
    latched: Option<String>,
}

impl FaultLatch {
    /// Reads what the previous run left in `dir` and marks this one as running.
    pub fn open(dir: &Path) -> Result<FaultLatch, LatchError> {
        let path = dir.join(FILE);
        let err = |source| LatchError {
            path: path.clone(),
            source,
        };
        std::fs::create_dir_all(dir).map_err(err)?;
        // Only a regular file: a FIFO left there would block start-up at `read`.
        let latched = match crate::config::file::read_text(&path, 64 << 10) {
            Ok(text) => Some(match serde_json::from_str::<Marker>(&text) {
                // Still latched from before (never reset), or a run that did not end well.
                Ok(m) => m.latched.unwrap_or_else(|| match m.state.as_str() {
                    "running" => "killed (the previous run never said how it ended)".into(),
                    s => s.to_string(),
                }),
                Err(_) => "unreadable marker (a previous run was cut off)".into(),
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(err(e)),
        };
        let latch = FaultLatch { path, latched };
        latch.write("running")?;
        Ok(latch)
    }

    /// Why this run starts e-stopped, if it does.
    pub fn latched(&self) -> Option<&str> {
        self.latched.as_deref()
    }

    /// A reset was accepted: the latch no longer holds this run.
    pub fn reset(&mut self) -> Result<(), LatchError> {
        self.latched = None;
        self.write("running")
    }

    /// How this run ended: a fault keeps the marker (the next start waits for a reset); an end
    /// that needs no person removes it, unless the latch was never reset.
    pub fn finish(self, exit: ExitReason) -> Result<(), LatchError> {
        let fault = matches!(
            exit,
            ExitReason::StopTimeout
                | ExitReason::ControlFault
                | ExitReason::ThreadFault
                | ExitReason::RuntimeFailure
        );
        if fault || self.latched.is_some() {
            return self.write(exit.name());
        }
        match std::fs::remove_file(&self.path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(LatchError {
                path: self.path.clone(),
                source: e,
            }),
            _ => Ok(()),
        }
    }

    fn write(&self, state: &str) -> Result<(), LatchError> {
        let m = Marker {
            state: state.into(),
            latched: self.latched.clone().or_else(|| {
                // A fault end latches the next run with its own name.
                (state != "running").then(|| state.to_string())
            }),
            pid: std::process::id(),
        };
        let text = serde_json::to_string(&m).expect("a plain struct serializes");
        // Whole or not at all: a cut-off write must not read as "no fault".
        let tmp = self.path.with_extension("tmp");
        // A FIFO (or anything) left under the temporary name would block or take the write.
        let _ = std::fs::remove_file(&tmp);
        std::fs::write(&tmp, text)
            .and_then(|()| std::fs::rename(&tmp, &self.path))
            .map_err(|source| LatchError {
                path: self.path.clone(),
                source,
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("pi0d-latch-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn a_clean_run_leaves_nothing_and_a_fault_latches_the_next_until_a_reset() {
        let d = dir("cycle");
        let l = FaultLatch::open(&d).unwrap();
        assert_eq!(l.latched(), None);
        l.finish(ExitReason::Clean).unwrap();
        assert!(!d.join(FILE).exists());

        FaultLatch::open(&d)
            .unwrap()
            .finish(ExitReason::ControlFault)
            .unwrap();
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
        let l = FaultLatch::open(&d).unwrap();
        std::mem::forget(l); // killed: no finish
        let l = FaultLatch::open(&d).unwrap();
        assert!(
            l.latched().unwrap().starts_with("killed"),
            "{:?}",
            l.latched()
        );
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
}

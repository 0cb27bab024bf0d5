//! Recording a run as MCAP (`[record]`): what came in, what went out and why, in a file that
//! opens in Foxglove and in any MCAP reader.
//!
//! The recorder is a thread of its own. The control thread hands it one `TickSample` per tick
//! through a bounded queue and never waits: a full queue drops the sample and counts it. The
//! inference worker and the supervisor hand it chunks and events the same way. Camera frames
//! and diagnostics it samples itself from the blackboard, at `record.camera_hz` and once a
//! second. A recording that fails (disk full, a cap reached) ends with a log line and the run
//! goes on: recording is never a reason to stop the arm.

mod file;
pub mod plot;
pub mod read;
mod schemas;
pub(crate) mod stream;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use serde::Serialize;

use crate::chunk::{JointChunk, ModelOutput};
use crate::config::record::{RecordConfig, RecordTarget};
use crate::control::controller::ChunkOutcome;
use crate::io::Blackboard;
use crate::joints::{JointMeasurement, MotionState};
use crate::safety::supervisor::Transition;
use crate::safety::SafetyEvent;
use crate::telemetry::LiveStats;
use crate::time::MonoTime;

pub(crate) use file::McapFile;
pub(crate) use file::Topics;

#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    /// The configured file exists (a directory gets a new name instead: `NoFreeName`).
    #[error("record.path: {path} already exists; a recording is never overwritten (name a directory to get one file per run)")]
    Exists { path: PathBuf },
    #[error(
        "record.path: no free file name in {dir}: {first} and {tries} more names after it exist"
    )]
    NoFreeName {
        dir: PathBuf,
        first: PathBuf,
        tries: u32,
    },
    #[error("record.path: cannot create {path}")]
    Create {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("recording to {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: mcap::McapError,
    },
    /// The next message would take the file past `record.max_megabytes`.
    #[error("{path}: record.max_megabytes reached ({max_bytes} bytes)")]
    Full { path: PathBuf, max_bytes: u64 },
    #[error("{path}: record.max_megabytes ({max_bytes} bytes) cannot hold even the file's header and index ({needed} bytes)")]
    TooSmall {
        path: PathBuf,
        needed: u64,
        max_bytes: u64,
    },
    #[error("{path}: cannot start the recorder thread")]
    Spawn {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// What the control thread saw and commanded at one tick. `Copy`: queued without allocating.
#[derive(Clone, Copy, Debug)]
pub(crate) struct TickSample {
    pub(crate) at: MonoTime,
    pub(crate) measured: JointMeasurement,
    pub(crate) command: MotionState,
    /// Running totals per `SafetyEvent` (the recorder notes each increase).
    pub(crate) safety_events: [u64; SafetyEvent::COUNT],
}

/// Everything else that is recorded as it happens.
#[derive(Debug)]
pub(crate) enum Note {
    /// A chunk the worker handed to the control thread, in robot joint order, and what the
    /// model gave for it before its postprocessor (a model that runs here).
    Chunk(Box<JointChunk>, Option<Box<ModelOutput>>),
    /// No chunk from inference `seq`: the policy failed, or its chunk failed validation
    /// (`reason`: `non_finite`, `out_of_range`, `jump`, `shape`, `policy_error`,
    /// `policy_panic`, `rtc_late`).
    Refused {
        seq: u64,
        reason: &'static str,
        detail: String,
    },
    Transition(Transition),
    Outcome(ChunkOutcome),
    ResetRefused,
}

/// Ticks queued before samples are dropped: 5 s at 200 Hz.
const TICK_QUEUE: usize = 1024;
const NOTE_QUEUE: usize = 256;
/// The recorder's own period: queues drained, frames sampled, caps checked.
const POLL: Duration = Duration::from_millis(5);
/// Data is flushed to the file (an MCAP chunk closed) this often: a crash loses at most this.
const FLUSH_EVERY_S: f64 = 1.0;
const DIAGNOSTICS_EVERY_S: f64 = 1.0;

/// The control thread's end of the tick queue.
#[derive(Clone)]
pub(crate) struct TickTap {
    tx: SyncSender<TickSample>,
    dropped: Arc<AtomicU64>,
}

impl TickTap {
    /// Never blocks, never allocates.
    pub(crate) fn send(&self, sample: &TickSample) {
        if let Err(TrySendError::Full(_)) = self.tx.try_send(*sample) {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// The worker's and the supervisor's end of the note queue.
#[derive(Clone)]
pub(crate) struct NoteTap {
    tx: SyncSender<Note>,
    dropped: Arc<AtomicU64>,
}

impl NoteTap {
    pub(crate) fn send(&self, note: Note) {
        if let Err(TrySendError::Full(_)) = self.tx.try_send(note) {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Why a recording ended.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum EndedBy {
    #[default]
    RunEnd,
    MaxMegabytes,
    MaxDurationS,
    WriteError,
    Panic,
}

/// The summary's account of the recording.
#[derive(Clone, Debug, Default, Serialize)]
pub struct RecordingSummary {
    pub(crate) path: String,
    pub messages: u64,
    pub(crate) bytes: u64,
    /// Samples the queues had no room for.
    pub dropped: u64,
    pub(crate) ended_by: EndedBy,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) error: Option<String>,
}

/// What the recording needs to know about the run.
pub(crate) struct RecordSetup {
    pub(crate) cfg: RecordConfig,
    pub(crate) topics: Topics,
    /// File metadata (`pi0d` record): version, configuration, model, rate.
    pub(crate) metadata: std::collections::BTreeMap<String, String>,
    pub(crate) control_rate_hz: f64,
}

pub(crate) struct Recorder {
    pub(crate) ticks: TickTap,
    pub(crate) notes: NoteTap,
    stop: Arc<AtomicBool>,
    thread: JoinHandle<RecordingSummary>,
    path: PathBuf,
}

/// Names tried in a directory before giving up: runs starting in the same second.
const NAME_TRIES: u32 = 1000;

/// The `n`th name for a run started at `now` in `dir`: `pi0d-<UTC time>.mcap`, then
/// `pi0d-<UTC time>-2.mcap`, `-3`, ...
pub(crate) fn run_file_name(dir: &Path, now: std::time::SystemTime, n: u32) -> PathBuf {
    let stamp = utc_stamp(now);
    match n {
        0 => dir.join(format!("pi0d-{stamp}.mcap")),
        n => dir.join(format!("pi0d-{stamp}-{}.mcap", n + 1)),
    }
}

/// Creates the file for this run: the configured one (refused if it exists), or a new one in
/// the configured directory, named by the UTC time (and a number when that name is taken:
/// each name is created exclusively, so two runs never share a file).
pub(crate) fn create_run_file(
    cfg: &RecordConfig,
    topics: &Topics,
    metadata: &std::collections::BTreeMap<String, String>,
    now: std::time::SystemTime,
) -> Result<(PathBuf, McapFile), RecordError> {
    let dir = match &cfg.target {
        RecordTarget::File(p) => {
            return McapFile::create(p, topics, metadata, cfg.max_bytes).map(|f| (p.clone(), f))
        }
        RecordTarget::Directory(d) => d,
    };
    std::fs::create_dir_all(dir).map_err(|source| RecordError::Create {
        path: dir.clone(),
        source,
    })?;
    for n in 0..NAME_TRIES {
        let path = run_file_name(dir, now, n);
        match McapFile::create(&path, topics, metadata, cfg.max_bytes) {
            Ok(f) => return Ok((path, f)),
            Err(RecordError::Exists { .. }) => continue,
            Err(e) => return Err(e),
        }
    }
    Err(RecordError::NoFreeName {
        dir: dir.clone(),
        first: run_file_name(dir, now, 0),
        tries: NAME_TRIES - 1,
    })
}

/// `YYYYmmddTHHMMSSZ` (UTC) for file names.
pub(crate) fn utc_stamp(t: std::time::SystemTime) -> String {
    let secs = t
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}{month:02}{day:02}T{:02}{:02}{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

impl Recorder {
    /// Creates the file (see `create_run_file`) and starts the recorder thread, which
    /// calls `on_thread` first (the daemon lowers its priority there).
    pub(crate) fn start(
        setup: RecordSetup,
        board: Arc<Blackboard>,
        live: Arc<LiveStats>,
        on_thread: impl FnOnce() + Send + 'static,
    ) -> Result<Recorder, RecordError> {
        let (path, file) = create_run_file(
            &setup.cfg,
            &setup.topics,
            &setup.metadata,
            std::time::SystemTime::now(),
        )?;
        let (tick_tx, tick_rx) = sync_channel(TICK_QUEUE);
        let (note_tx, note_rx) = sync_channel(NOTE_QUEUE);
        let dropped = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (stop, dropped, shown) =
                (stop.clone(), dropped.clone(), path.display().to_string());
            std::thread::Builder::new()
                .name("pi0d-record".into())
                .spawn(move || {
                    on_thread();
                    let mut rec = Recording {
                        file: Some(file),
                        setup,
                        board,
                        live,
                        ticks: tick_rx,
                        notes: note_rx,
                        summary: RecordingSummary {
                            path: shown,
                            ..RecordingSummary::default()
                        },
                    };
                    let run = crate::panics::caught(|| rec.run(&stop));
                    let mut summary = rec.summary;
                    if let Err(m) = run {
                        tracing::error!(panic = %m, "the recorder panicked; the run goes on unrecorded");
                        summary.ended_by = EndedBy::Panic;
                        summary.error = Some(m.message);
                    }
                    summary.dropped = dropped.load(Ordering::Relaxed);
                    summary
                })
                .map_err(|source| RecordError::Spawn {
                    path: path.clone(),
                    source,
                })?
        };
        tracing::info!(file = %path.display(), "recording");
        Ok(Recorder {
            ticks: TickTap {
                tx: tick_tx,
                dropped: dropped.clone(),
            },
            notes: NoteTap {
                tx: note_tx,
                dropped,
            },
            stop,
            thread,
            path,
        })
    }

    /// Writes what is queued, closes the file (its summary and index) and says how it went.
    /// Call after the control thread has finished, so the final hold is in the file.
    pub(crate) fn finish(self) -> RecordingSummary {
        self.stop.store(true, Ordering::SeqCst);
        let deadline = MonoTime::now().offset_seconds(5.0);
        while !self.thread.is_finished() && MonoTime::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        if !self.thread.is_finished() {
            tracing::error!(file = %self.path.display(), "the recorder did not finish within 5 s; the file may lack its index");
            return RecordingSummary {
                path: self.path.display().to_string(),
                ended_by: EndedBy::WriteError,
                error: Some(format!(
                    "{}: did not finish within 5 s",
                    self.path.display()
                )),
                ..RecordingSummary::default()
            };
        }
        let s = self.thread.join().unwrap_or_default();
        tracing::info!(
            file = %s.path,
            messages = s.messages,
            bytes = s.bytes,
            dropped = s.dropped,
            "recording closed"
        );
        s
    }
}

/// The recorder thread's state.
struct Recording {
    /// `None` once the recording has ended (cap, error); the queues are still drained.
    file: Option<McapFile>,
    setup: RecordSetup,
    board: Arc<Blackboard>,
    live: Arc<LiveStats>,
    ticks: Receiver<TickSample>,
    notes: Receiver<Note>,
    summary: RecordingSummary,
}

impl Recording {
    fn run(&mut self, stop: &AtomicBool) {
        let started = MonoTime::now();
        let mut next_flush = FLUSH_EVERY_S;
        let mut next_diag = 0.0;
        let frame_period = (self.setup.cfg.camera_hz > 0.0).then(|| 1.0 / self.setup.cfg.camera_hz);
        let mut next_frames = 0.0;
        loop {
            let finishing = stop.load(Ordering::SeqCst);
            let t = MonoTime::now().seconds_since(started);
            let mut result = self.drain();
            if let Some(p) = frame_period.filter(|_| t >= next_frames) {
                next_frames = t + p;
                result = result.and_then(|_| self.frames());
            }
            if t >= next_diag {
                next_diag = t + DIAGNOSTICS_EVERY_S;
                result = result.and_then(|_| self.diagnostics());
            }
            if t >= next_flush {
                next_flush = t + FLUSH_EVERY_S;
                result = result.and_then(|_| self.flush());
            }
            match result {
                Ok(()) => {}
                Err(RecordError::Full { .. }) => self.end(EndedBy::MaxMegabytes, None),
                Err(e) => self.end(EndedBy::WriteError, Some(e)),
            }
            if self.setup.cfg.max_duration_s.is_some_and(|d| t >= d) {
                self.end(EndedBy::MaxDurationS, None);
            }
            if finishing {
                break;
            }
            std::thread::sleep(POLL);
        }
        self.end(EndedBy::RunEnd, None);
    }

    fn drain(&mut self) -> Result<(), RecordError> {
        while let Ok(t) = self.ticks.try_recv() {
            if let Some(f) = &mut self.file {
                f.tick(&t)?;
            }
        }
        while let Ok(n) = self.notes.try_recv() {
            if let Some(f) = &mut self.file {
                f.note(n)?;
            }
        }
        Ok(())
    }

    fn frames(&mut self) -> Result<(), RecordError> {
        let Some(f) = &mut self.file else {
            return Ok(());
        };
        for (k, slot) in self.board.inputs.frames.iter().enumerate() {
            let frame = slot.lock().ok().and_then(|g| g.clone());
            if let Some(frame) = frame {
                f.frame(k, &frame)?;
            }
        }
        Ok(())
    }

    fn diagnostics(&mut self) -> Result<(), RecordError> {
        let Some(f) = &mut self.file else {
            return Ok(());
        };
        f.diagnostics(&self.board, &self.live, self.setup.control_rate_hz)
    }

    fn flush(&mut self) -> Result<(), RecordError> {
        if let Some(f) = &mut self.file {
            f.flush()?;
            self.summary.bytes = f.bytes();
            self.summary.messages = f.messages();
        }
        Ok(())
    }

    /// Closes the file, if still open, saying why.
    fn end(&mut self, why: EndedBy, error: Option<RecordError>) {
        let Some(f) = self.file.take() else {
            return;
        };
        self.summary.ended_by = why;
        if let Some(e) = &error {
            self.summary.error = Some(error_chain(e));
            tracing::error!(error = %self.summary.error.as_deref().unwrap_or_default(), "recording stopped; the run goes on unrecorded");
        }
        match why {
            EndedBy::MaxMegabytes => tracing::warn!(
                file = %self.summary.path,
                "recording stopped at record.max_megabytes = {}; the run goes on unrecorded",
                self.setup.cfg.max_bytes as f64 / 1e6
            ),
            EndedBy::MaxDurationS => tracing::warn!(
                file = %self.summary.path,
                "recording stopped at record.max_duration_s = {}; the run goes on unrecorded",
                self.setup.cfg.max_duration_s.unwrap_or_default()
            ),
            _ => {}
        }
        match f.finish() {
            Ok((messages, bytes)) => {
                self.summary.messages = messages;
                self.summary.bytes = bytes;
            }
            Err(e) if error.is_none() => {
                self.summary.ended_by = EndedBy::WriteError;
                self.summary.error = Some(error_chain(&e));
                tracing::error!(error = %self.summary.error.as_deref().unwrap_or_default(), "the recording could not be closed");
            }
            Err(_) => {}
        }
    }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut source = e.source();
    while let Some(c) = source {
        s += &format!(": {c}");
        source = c.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn when_naming_a_run_file_expect_the_utc_time() {
        let t = std::time::UNIX_EPOCH + Duration::from_secs(1_796_083_200 + 3723);
        // 2026-12-01 01:02:03 UTC.
        assert_eq!(utc_stamp(t), "20261201T010203Z");
        assert_eq!(utc_stamp(std::time::UNIX_EPOCH), "19700101T000000Z");
        let leap = std::time::UNIX_EPOCH + Duration::from_secs(951_782_400);
        assert_eq!(utc_stamp(leap), "20000229T000000Z");
    }

    #[test]
    fn when_runs_start_in_the_same_second_in_one_directory_expect_a_file_each() {
        let dir = crate::test_dirs::TempDir::new("record-same-second");
        let cfg = RecordConfig {
            target: RecordTarget::Directory(dir.to_path_buf()),
            max_bytes: 1_000_000,
            max_duration_s: None,
            camera_hz: 0.0,
        };
        let topics = Topics {
            joint_names: vec!["a".into()],
            joint_states: "/joint_states".into(),
            cameras: Vec::new(),
            node: "pi0d".into(),
        };
        let now = std::time::UNIX_EPOCH + Duration::from_secs(1_796_083_200);
        let meta = Default::default();
        let files: Vec<PathBuf> = (0..3)
            .map(|_| create_run_file(&cfg, &topics, &meta, now).unwrap())
            .map(|(path, f)| {
                f.finish().unwrap();
                path
            })
            .collect();
        let names: Vec<String> = files
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().to_string())
            .collect();
        assert_eq!(
            names,
            [
                "pi0d-20261201T000000Z.mcap",
                "pi0d-20261201T000000Z-2.mcap",
                "pi0d-20261201T000000Z-3.mcap"
            ]
        );
        assert!(files.iter().all(|f| f.parent() == Some(dir.path())));
        // A named file is never replaced: the error names it.
        let named = RecordConfig {
            target: RecordTarget::File(files[0].clone()),
            ..cfg
        };
        let before = std::fs::read(&files[0]).unwrap();
        let e = create_run_file(&named, &topics, &meta, now)
            .err()
            .expect("refused");
        assert!(matches!(e, RecordError::Exists { .. }), "{e:?}");
        assert!(
            e.to_string().contains(&files[0].display().to_string()),
            "{e}"
        );
        assert_eq!(std::fs::read(&files[0]).unwrap(), before);
    }
}

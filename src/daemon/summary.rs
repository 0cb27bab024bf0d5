//! The JSON summary written on exit (`pi0d run --summary FILE`).

use std::collections::BTreeMap;

use serde::Serialize;

use super::exit::{error_chain, ExitReason};
use super::latch::LatchError;

#[derive(Debug, Default, Serialize)]
pub struct Percentiles {
    pub p50: f64,
    pub p99: f64,
    pub max: f64,
}

#[derive(Debug, Default, Serialize)]
pub(crate) struct StageSummary {
    pub(crate) queue: Percentiles,
    pub(crate) preprocess: Percentiles,
    pub(crate) prefix: Percentiles,
    pub(crate) steps: Percentiles,
    pub(crate) postprocess: Percentiles,
}

#[derive(Debug, Default, Serialize)]
pub(crate) struct SwitchSummary {
    /// `control.rtc.enabled`.
    pub(crate) rtc: bool,
    /// Requests that carried the running chunk's leftover to the policy.
    pub(crate) guided: u64,
    /// Chunks computed while another one ran.
    pub(crate) switches: u64,
    /// Per switch, the largest joint distance (rad or m) between the new chunk and the old
    /// plan over the steps that run before it takes over.
    pub(crate) prefix_distance: Percentiles,
    /// Per accepted switch, the largest joint distance the blend bridged between the command
    /// and the new chunk (what the blend corrects).
    pub(crate) blend_correction: Percentiles,
    /// The largest inference delay seen, in chunk steps.
    pub(crate) delay_steps_max: usize,
}

#[derive(Debug, Serialize)]
pub(crate) struct TransitionRecord {
    pub(crate) t_s: f64,
    pub(crate) from: String,
    pub(crate) to: String,
    /// The camera whose frames went stale, for a `holding(stale_camera)`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) camera: Option<String>,
}

#[derive(Debug, Default, Serialize)]
pub struct Summary {
    pub(crate) duration_s: f64,
    pub rate_hz: f64,
    pub ticks: u64,
    pub overruns: u64,
    /// The process's resident-memory high-water mark, MB (its whole life, the load included).
    pub(crate) peak_rss_mb: f64,
    pub jitter_us: Percentiles,
    pub(crate) chunks_received: u64,
    pub chunks_accepted: u64,
    pub chunks_rejected: u64,
    pub(crate) chunks_rejected_by_reason: BTreeMap<String, u64>,
    /// A remote policy's failures by kind (`server_down`, `timeout`, `closed`, ...).
    pub(crate) policy_errors_by_kind: BTreeMap<String, u64>,
    /// The latest policy error, as logged.
    pub(crate) last_policy_error: Option<String>,
    /// A remote policy's link: round trips, the server's inference time, reconnects.
    pub(crate) remote_policy: Option<crate::policy::RemoteStats>,
    pub(crate) inference_requests: u64,
    /// How new chunks agreed with the plan they replaced (with real-time chunking or not).
    pub(crate) chunk_switches: SwitchSummary,
    /// Where inference time went, per request, ms: the queueing before inference and, for a
    /// model run here, preprocessing, the prefix, the denoising steps and postprocessing.
    pub(crate) inference_stages_ms: StageSummary,
    /// Observation-to-arrival latency of executed chunks, warm-up excluded.
    pub latency_ms: Percentiles,
    pub(crate) safety_events: BTreeMap<String, u64>,
    pub limit_violations: u64,
    /// `[sim.task]`: the target shown at the end, the tool's distance from it, the targets
    /// reached and missed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) sim_task: Option<crate::io::sim::task::TaskProgress>,
    pub(crate) max_abs_velocity: BTreeMap<String, f64>,
    pub(crate) max_abs_acceleration: BTreeMap<String, f64>,
    pub(crate) max_abs_jerk: BTreeMap<String, f64>,
    pub(crate) reset_refused: u64,
    pub(crate) final_mode: String,
    pub(crate) transitions: Vec<TransitionRecord>,
    /// What the arm was waiting for at the end, if it was not running (never started, holding).
    pub(crate) waiting_for: Option<String>,
    /// Thread faults the supervisor saw (`inference thread panicked: ...`).
    pub(crate) faults: Vec<String>,
    /// Input messages refused by the transport, and those whose decoder panicked (counted at
    /// the last status interval).
    pub(crate) inputs_rejected: u64,
    pub(crate) input_decoder_faults: u64,
    /// Signals that were logged and ignored (SIGHUP, SIGUSR1, ...).
    pub(crate) signals_ignored: u64,
    /// Log lines lost to a failed stderr (a closed pipe, a full disk).
    pub(crate) log_lines_lost: u64,
    /// Log lines held back by a rate limit (what floods of peers' messages caused).
    pub(crate) log_lines_suppressed: u64,
    /// A dry run: no command reached the robot.
    pub(crate) dry_run: bool,
    /// `limits.scale` (1 at full speed).
    pub(crate) limits_scale: f64,
    /// The previous run ended so (a fault, or killed): this one started e-stopped until a
    /// reset (`--state-dir`, `$STATE_DIRECTORY`).
    pub(crate) fault_latch: Option<String>,
    /// Why the next start will wait for a reset: the marker this run left (a fault, or a latch
    /// never reset); null when it removed it, or when `fault_latch_error` says it could not.
    pub(crate) fault_latch_next: Option<String>,
    /// The fault latch could not be updated at the end (the OS error included): the marker
    /// left on disk decides the next start, and a run that was otherwise clean exits
    /// `runtime_failure`.
    pub(crate) fault_latch_error: Option<String>,
    /// The MCAP recording (`[record]`): file, messages, bytes, drops and why it ended.
    pub recording: Option<crate::record::RecordingSummary>,
    pub exit: ExitReason,
    pub exit_code: u8,
    /// E-stop resets granted (the summary's `safety_events.reset` too; typed for the latch).
    #[serde(skip)]
    pub(crate) resets: u64,
}

impl Summary {
    /// What the fault latch's last update at the end did, and so what the process exits with:
    /// a run that ended cleanly but could not record it exits `runtime_failure`; the summary's
    /// `exit` and `exit_code` are always what the process exits with.
    pub(crate) fn settle_fault_latch(&mut self, end: Result<Option<String>, LatchError>) {
        match end {
            Ok(next) => {
                if let Some(why) = &next {
                    tracing::warn!(reason = %why, "fault latch kept: the next start waits for a reset");
                }
                self.fault_latch_next = next;
            }
            Err(e) => {
                let why = error_chain(&e);
                tracing::error!(error = %why, "the fault latch could not be updated");
                if self.exit == ExitReason::Clean {
                    self.exit = ExitReason::RuntimeFailure;
                }
                self.fault_latch_error = Some(why);
            }
        }
        self.exit_code = self.exit.code();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn when_the_latch_cannot_be_written_at_the_end_expect_the_summary_to_say_the_exit() {
        let mut s = Summary {
            exit: ExitReason::Clean,
            ..Summary::default()
        };
        s.settle_fault_latch(Err(LatchError::Io {
            path: "/state/fault-latch.json".into(),
            source: std::io::Error::from_raw_os_error(libc::ENOSPC),
        }));
        assert_eq!(s.exit, ExitReason::RuntimeFailure);
        assert_eq!(s.exit_code, ExitReason::RuntimeFailure.code());
        let why = s.fault_latch_error.unwrap();
        assert!(
            why.contains("No space left on device (os error 28)"),
            "{why}"
        );
        // A fault stays the reason.
        let mut s = Summary {
            exit: ExitReason::ThreadFault,
            ..Summary::default()
        };
        s.settle_fault_latch(Err(LatchError::InUse {
            dir: "/state".into(),
            pid: None,
        }));
        assert_eq!((s.exit, s.exit_code), (ExitReason::ThreadFault, 7));
        let mut s = Summary::default();
        s.settle_fault_latch(Ok(Some("control_fault".into())));
        assert_eq!(s.fault_latch_next.as_deref(), Some("control_fault"));
        assert_eq!(s.exit_code, 0);
    }
}

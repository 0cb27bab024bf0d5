//! The inference worker: waits for a request from the control thread, takes a fresh
//! observation, runs the policy (panics caught), converts and validates the chunk, and hands it
//! to the control thread through a bounded channel. Chunk buffers come back for reuse.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::supervise::{caught, Role, Supervised};
use crate::chunk::{ActionChunk, ChunkPrefix, JointChunk};
use crate::config::{RtcConfig, SafetyConfig};
use crate::control::rtc::RtcPlanner;
use crate::io::Blackboard;
use crate::joints::{ActionMap, StateLayout};
use crate::observation::Observation;
use crate::policy::{AcceleratorFault, Policy, PolicyError, RemoteFault, RemoteStats, StageTiming};
use crate::record::{Note, NoteTap};
use crate::robot::RobotLimits;
use crate::safety::validate::{check_chunk, ChunkFaultKind};
use crate::time::MonoTime;

/// Counters of what the worker produced and refused.
#[derive(Default)]
pub(crate) struct WorkerStats {
    pub(crate) requests: AtomicU64,
    pub(crate) produced: AtomicU64,
    pub(crate) rejected_non_finite: AtomicU64,
    pub(crate) rejected_out_of_range: AtomicU64,
    pub(crate) rejected_jump: AtomicU64,
    pub(crate) rejected_shape: AtomicU64,
    pub(crate) policy_errors: AtomicU64,
    pub(crate) policy_panics: AtomicU64,
    /// Training-time RTC: chunks that arrived later than the delay they were conditioned on.
    pub(crate) rtc_late: AtomicU64,
    /// Inference time of the latest chunk, microseconds.
    pub(crate) last_infer_us: AtomicU64,
    /// Of the policy errors, a remote policy's, by `RemoteFault`.
    pub(crate) remote_faults: [AtomicU64; RemoteFault::ALL.len()],
    /// The latest policy error, as said.
    pub(crate) last_policy_error: Mutex<Option<String>>,
    /// Inferences in a row whose accelerator failed.
    accelerator_failures: AtomicU64,
    /// The accelerator gave out (`accelerator_fault`): 0 not, 1 lost, 2 failed repeatedly.
    accelerator: AtomicU8,
    /// A remote policy's link, as of its latest request.
    pub(crate) remote: Mutex<Option<RemoteStats>>,
    /// Chunk switches: how far each new chunk is from the running one's plan.
    pub(crate) switches: Mutex<SwitchStats>,
    /// Where inference time goes, per request (bounded).
    pub(crate) stages: Mutex<StageSamples>,
}

/// Inferences in a row an accelerator may fail before the run stops: one failure costs a chunk
/// (the arm holds meanwhile); this many say the device will not run the model.
pub(crate) const ACCELERATOR_FAILURES: u64 = 3;

impl WorkerStats {
    /// The accelerator gave out: lost, or failed `ACCELERATOR_FAILURES` inferences in a row.
    pub(crate) fn accelerator_fault(&self) -> Option<AcceleratorFault> {
        match self.accelerator.load(Ordering::Acquire) {
            1 => Some(AcceleratorFault::Lost),
            2 => Some(AcceleratorFault::Failed),
            _ => None,
        }
    }

    /// One inference's outcome on the accelerator: `None` for a success or a failure of
    /// something else (which breaks a run of failures).
    fn note_accelerator(&self, fault: Option<AcceleratorFault>) {
        let gave_out = match fault {
            None => {
                self.accelerator_failures.store(0, Ordering::Relaxed);
                return;
            }
            Some(AcceleratorFault::Lost) => 1,
            Some(AcceleratorFault::Failed) => {
                let n = self.accelerator_failures.fetch_add(1, Ordering::Relaxed) + 1;
                if n < ACCELERATOR_FAILURES {
                    return;
                }
                2
            }
        };
        let _ = self
            .accelerator
            .compare_exchange(0, gave_out, Ordering::AcqRel, Ordering::Acquire);
    }

    /// Counts `e` under its kind when it is a remote policy's (`remote_faults`, the summary's
    /// `policy_errors_by_kind`).
    pub(crate) fn count_kind(&self, e: &PolicyError) {
        if let PolicyError::Remote { fault, .. } = e {
            self.remote_faults[*fault as usize].fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Per request, ms: the wait from the control thread's request to the worker taking it, and
/// the policy's stages (when it runs a model here).
#[derive(Clone, Debug, Default)]
pub(crate) struct StageSamples {
    pub(crate) queue: Vec<f64>,
    pub(crate) preprocess: Vec<f64>,
    pub(crate) prefix: Vec<f64>,
    pub(crate) steps: Vec<f64>,
    pub(crate) postprocess: Vec<f64>,
    /// The latest request's, for the live diagnostics.
    pub(crate) last: Option<(f64, StageTiming)>,
}

impl StageSamples {
    fn record(&mut self, queue_ms: f64, t: Option<StageTiming>) {
        let push = |v: &mut Vec<f64>, x: f64| {
            if v.len() < KEPT_SAMPLES {
                v.push(x);
            }
        };
        push(&mut self.queue, queue_ms);
        if let Some(t) = t {
            push(&mut self.preprocess, t.preprocess_ms);
            push(&mut self.prefix, t.prefix_ms);
            push(&mut self.steps, t.steps_ms);
            push(&mut self.postprocess, t.postprocess_ms);
        }
        self.last = Some((queue_ms, t.unwrap_or_default()));
    }
}

/// How each new chunk agrees with the plan it replaces (measured with and without real-time
/// chunking): over the steps that run before it takes over (the inference delay, at least
/// one), the largest joint distance between the new chunk and the old plan.
#[derive(Clone, Debug, Default)]
pub(crate) struct SwitchStats {
    /// Requests that carried the running chunk's leftover to the policy.
    pub(crate) guided: u64,
    /// Distances (rad or m), one per chunk that replaced a running one.
    pub(crate) prefix_distance: Vec<f64>,
    pub(crate) delay_steps_max: usize,
}

/// Samples (switch distances, stage times) kept for the summary's percentiles.
const KEPT_SAMPLES: usize = 10_000;

impl WorkerStats {
    pub(crate) fn rejected_by_reason(&self) -> [(&'static str, u64); 7] {
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        [
            ("non_finite", g(&self.rejected_non_finite)),
            ("out_of_range", g(&self.rejected_out_of_range)),
            ("jump", g(&self.rejected_jump)),
            ("shape", g(&self.rejected_shape)),
            ("policy_error", g(&self.policy_errors)),
            ("policy_panic", g(&self.policy_panics)),
            ("rtc_late", g(&self.rtc_late)),
        ]
    }
}

/// The control thread's end of the worker.
pub(crate) struct WorkerHandle {
    /// Each request carries when the control thread made it (the queueing before inference).
    requests: SyncSender<MonoTime>,
    chunks: Receiver<Box<JointChunk>>,
    recycle: SyncSender<Box<JointChunk>>,
    in_flight: Arc<AtomicBool>,
    /// The chunk the control thread executes (its `seq`; 0 for none).
    running: Arc<AtomicU64>,
}

impl WorkerHandle {
    /// Asks for one inference; never blocks.
    pub(crate) fn request(&self) {
        // Marked before sending: the worker may take the request, finish and clear the flag
        // before `try_send` even returns; marking afterwards would leave it set forever.
        self.in_flight.store(true, Ordering::Release);
        if let Err(TrySendError::Disconnected(_)) = self.requests.try_send(MonoTime::now()) {
            self.in_flight.store(false, Ordering::Release);
        }
    }

    pub(crate) fn in_flight(&self) -> bool {
        self.in_flight.load(Ordering::Acquire)
    }

    /// Tells the worker which chunk runs (real-time chunking guides the next one towards it).
    pub(crate) fn set_running(&self, seq: Option<u64>) {
        self.running.store(seq.unwrap_or(0), Ordering::Relaxed);
    }

    /// A chunk ready for the control thread, if any; never blocks.
    pub(crate) fn try_chunk(&self) -> Option<Box<JointChunk>> {
        self.chunks.try_recv().ok()
    }

    /// Gives a chunk buffer back for reuse; dropped (on this thread) only if the pool is full.
    pub(crate) fn recycle(&self, chunk: Box<JointChunk>) {
        let _ = self.recycle.try_send(chunk);
    }
}

pub(crate) struct WorkerSetup {
    pub(crate) limits: RobotLimits,
    pub(crate) map: ActionMap,
    /// The policy's state vector, from the measured positions.
    pub(crate) state: StateLayout,
    pub(crate) safety: SafetyConfig,
    pub(crate) chunk_steps: usize,
    pub(crate) rtc: RtcConfig,
    /// Chunks whose latency includes warm-up (not used for the delay estimate).
    pub(crate) warmup_chunks: u32,
    /// Where each chunk handed to the control thread is also recorded.
    pub(crate) record: Option<NoteTap>,
}

impl WorkerSetup {
    pub(crate) fn from_config(cfg: &crate::config::Config) -> WorkerSetup {
        WorkerSetup {
            limits: cfg.limits.clone(),
            map: cfg.policy.action_map.clone(),
            state: cfg.policy.state.clone(),
            safety: cfg.safety.clone(),
            chunk_steps: cfg.policy.chunk_steps,
            rtc: cfg.control.rtc,
            warmup_chunks: cfg.control.warmup_chunks,
            record: None,
        }
    }
}

/// Buffers in circulation: one executing, one being handed over, one being filled, one spare.
const POOL: usize = 4;
/// Rate limit for repeated log lines about rejected chunks.
const LOG_EVERY: u64 = 20;

pub(crate) fn spawn(
    mut policy: Box<dyn Policy>,
    setup: WorkerSetup,
    board: Arc<Blackboard>,
    stats: Arc<WorkerStats>,
    stop: Arc<AtomicBool>,
) -> std::io::Result<(WorkerHandle, Supervised<()>)> {
    let (req_tx, req_rx) = sync_channel::<MonoTime>(1);
    let (chunk_tx, chunk_rx) = sync_channel::<Box<JointChunk>>(2);
    let (recycle_tx, recycle_rx) = sync_channel::<Box<JointChunk>>(POOL);
    for _ in 0..POOL {
        let _ = recycle_tx.try_send(Box::new(JointChunk::with_capacity(setup.chunk_steps)));
    }
    let in_flight = Arc::new(AtomicBool::new(false));
    let running = Arc::new(AtomicU64::new(0));
    let handle = WorkerHandle {
        requests: req_tx,
        chunks: chunk_rx,
        recycle: recycle_tx,
        in_flight: in_flight.clone(),
        running: running.clone(),
    };
    let thread = super::supervise::spawn(Role::Inference, move |heart| {
        super::rt::lower_current_thread(super::rt::INFERENCE_NICE);
        let mut obs = Observation::default();
        let mut seq = 0u64;
        let rtc = setup.rtc;
        let mut planner = RtcPlanner::new(
            rtc.execution_horizon,
            rtc.inference_delay_steps,
            setup.warmup_chunks as usize,
        );
        while !stop.load(Ordering::Relaxed) {
            heart.beat();
            let asked = match req_rx.recv_timeout(Duration::from_millis(50)) {
                Ok(at) => at,
                Err(RecvTimeoutError::Timeout) => continue,
                Err(RecvTimeoutError::Disconnected) => break,
            };
            let queue_ms = MonoTime::now().seconds_since(asked) * 1e3;
            stats.requests.fetch_add(1, Ordering::Relaxed);
            if board.inputs.observe(&setup.state, &mut obs) {
                seq += 1;
                // The running chunk's leftover is worked out with RTC off too: the switch
                // statistics compare both.
                let running = running.load(Ordering::Relaxed);
                let leftover = (running != 0)
                    .then(|| planner.prefix(running, obs.stamp))
                    .flatten();
                obs.rtc = if rtc.enabled { leftover.clone() } else { None };
                if obs.rtc.is_some() {
                    if let Ok(mut s) = stats.switches.lock() {
                        s.guided += 1;
                    }
                }
                let produced = infer_one(
                    policy.as_mut(),
                    &obs,
                    &setup,
                    &board,
                    &stats,
                    &recycle_rx,
                    seq,
                );
                if let Ok(mut s) = stats.stages.lock() {
                    s.record(queue_ms, policy.stage_timing());
                }
                let produced = produced.map(|(chunk, plan)| {
                    let latency = MonoTime::now().seconds_since(obs.stamp);
                    // Counted towards the next delay whether or not it is used, as lerobot does.
                    planner.record(seq, &plan, latency);
                    (chunk, plan, latency)
                });
                let usable = produced.filter(|(_, plan, latency)| {
                    !late_for_its_conditioning(plan, *latency, &stats, &setup, seq)
                });
                if let Some((chunk, plan, _)) = usable {
                    if let Some(l) = &leftover {
                        record_switch(&stats, l, &plan);
                    }
                    if let Some(r) = &setup.record {
                        r.send(Note::Chunk(chunk.clone(), plan.model.clone()));
                    }
                    let _ = chunk_tx.try_send(chunk);
                }
            }
            in_flight.store(false, Ordering::Release);
        }
    })?;
    Ok((handle, thread))
}

fn infer_one(
    policy: &mut dyn Policy,
    obs: &Observation,
    setup: &WorkerSetup,
    board: &Blackboard,
    stats: &WorkerStats,
    pool: &Receiver<Box<JointChunk>>,
    seq: u64,
) -> Option<(Box<JointChunk>, ActionChunk)> {
    let started = MonoTime::now();
    // A panicking policy costs this chunk, not the worker (reported below, rate-limited).
    let result = caught(|| policy.infer(obs));
    stats.last_infer_us.store(
        (MonoTime::now().seconds_since(started) * 1e6) as u64,
        Ordering::Relaxed,
    );
    if let Some(r) = policy.remote_stats() {
        if let Ok(mut slot) = stats.remote.lock() {
            *slot = Some(r);
        }
    }
    let chunk = match result {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => {
            stats.count_kind(&e);
            stats.note_accelerator(e.accelerator_fault());
            // The error with its causes (a model's error keeps its own as the source).
            let said = crate::errors::Chain(&e).to_string();
            if let Ok(mut slot) = stats.last_policy_error.lock() {
                *slot = Some(said.clone());
            }
            let n = stats.policy_errors.fetch_add(1, Ordering::Relaxed);
            if n.is_multiple_of(LOG_EVERY) {
                tracing::warn!(chunk_seq = seq, error = %said, total = n + 1, "policy error: no chunk");
            }
            note_refusal(setup, seq, "policy_error", || said.clone());
            return None;
        }
        Err(msg) => {
            let n = stats.policy_panics.fetch_add(1, Ordering::Relaxed);
            if n.is_multiple_of(LOG_EVERY) {
                tracing::error!(chunk_seq = seq, panic = %msg, total = n + 1, "policy panicked: no chunk");
            }
            note_refusal(setup, seq, "policy_panic", || msg.message.clone());
            return None;
        }
    };
    stats.note_accelerator(None);
    stats.produced.fetch_add(1, Ordering::Relaxed);
    if chunk.action_dim != setup.map.action_dim() || chunk.steps() < 2 {
        let n = stats.rejected_shape.fetch_add(1, Ordering::Relaxed);
        if n.is_multiple_of(LOG_EVERY) {
            tracing::warn!(
                chunk_seq = seq,
                action_dim = chunk.action_dim,
                expected = setup.map.action_dim(),
                steps = chunk.steps(),
                "chunk rejected: wrong shape"
            );
        }
        note_refusal(setup, seq, ChunkFaultKind::Shape.name(), || {
            format!(
                "{} steps of {} actions, expected {} actions and at least 2 steps",
                chunk.steps(),
                chunk.action_dim,
                setup.map.action_dim()
            )
        });
        return None;
    }
    let mut buf = pool
        .try_recv()
        .unwrap_or_else(|_| Box::new(JointChunk::with_capacity(setup.chunk_steps)));
    // Joints the policy does not drive hold where they were measured.
    let hold = board.inputs.joint_state.load().position;
    buf.fill_from(&chunk, &setup.map, &hold, seq);
    if let Err(fault) = check_chunk(
        &buf,
        &setup.limits,
        setup.safety.chunk_position_tolerance,
        setup.safety.chunk_step_velocity_factor,
    ) {
        let counter = match fault.kind {
            ChunkFaultKind::NonFinite => &stats.rejected_non_finite,
            ChunkFaultKind::OutOfRange => &stats.rejected_out_of_range,
            ChunkFaultKind::Jump => &stats.rejected_jump,
            ChunkFaultKind::Shape => &stats.rejected_shape,
        };
        let n = counter.fetch_add(1, Ordering::Relaxed);
        if n % LOG_EVERY == 0 {
            tracing::warn!(
                chunk_seq = seq,
                reason = fault.kind.name(),
                joint = %fault.joint,
                step = fault.step,
                total = n + 1,
                "chunk rejected: {fault}"
            );
        }
        note_refusal(setup, seq, fault.kind.name(), || fault.to_string());
        return None;
    }
    Some((buf, chunk))
}

/// Training-time real-time chunking: a chunk conditioned on its first `d` steps being the
/// leftover is of use only if it arrived within them; one whose measured delay (its latency in
/// steps, rounded up) is longer is discarded, as lerobot's rollout discards it (its new steps
/// would start where the robot already is past them). Counted and noted when it is.
fn late_for_its_conditioning(
    plan: &ActionChunk,
    latency_s: f64,
    stats: &WorkerStats,
    setup: &WorkerSetup,
    seq: u64,
) -> bool {
    let Some((measured, d)) = late_steps(plan, latency_s) else {
        return false;
    };
    let n = stats.rtc_late.fetch_add(1, Ordering::Relaxed);
    if n.is_multiple_of(LOG_EVERY) {
        tracing::warn!(
            chunk_seq = seq,
            measured_delay = measured,
            conditioned_delay = d,
            total = n + 1,
            "chunk discarded: it arrived {measured} steps after its observation, later than the {d} it was conditioned on (training-time real-time chunking)"
        );
    }
    note_refusal(setup, seq, "rtc_late", || {
        format!("arrived {measured} steps after its observation; conditioned on {d}")
    });
    true
}

/// For a chunk conditioned on its first `d` steps, its measured delay when that is longer than
/// `d`: `(measured, d)`. lerobot measures `ceil(latency / step period)`.
fn late_steps(plan: &ActionChunk, latency_s: f64) -> Option<(usize, usize)> {
    let d = plan
        .model
        .as_ref()
        .and_then(|m| m.conditioned_delay)
        .filter(|d| *d > 0)?;
    // A hair below a whole step is that step, as the planner rounds.
    let measured = (latency_s / plan.step_period_s - 1e-9).ceil().max(0.0) as usize;
    (measured > d).then_some((measured, d))
}

/// A chunk refused before the control thread saw it, for the recording.
fn note_refusal(
    setup: &WorkerSetup,
    seq: u64,
    reason: &'static str,
    detail: impl FnOnce() -> String,
) {
    if let Some(r) = &setup.record {
        r.send(Note::Refused {
            seq,
            reason,
            detail: detail(),
        });
    }
}

/// The largest distance between the new chunk and the old plan over the steps that run
/// before it takes over.
fn record_switch(stats: &WorkerStats, old: &ChunkPrefix, new: &ActionChunk) {
    let steps = old.inference_delay.max(1).min(old.steps()).min(new.steps());
    let dim = old.action_dim.min(new.action_dim);
    let mut d = 0.0f64;
    for i in 0..steps {
        let (a, b) = (&old.actions[i * old.action_dim..], new.step(i));
        for j in 0..dim {
            d = d.max((a[j] - b[j]).abs());
        }
    }
    if let Ok(mut s) = stats.switches.lock() {
        if s.prefix_distance.len() < KEPT_SAMPLES {
            s.prefix_distance.push(d);
        }
        s.delay_steps_max = s.delay_steps_max.max(old.inference_delay);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chunk::ModelOutput;

    fn conditioned(d: Option<usize>) -> ActionChunk {
        ActionChunk {
            obs_stamp: MonoTime::ZERO,
            step_period_s: 0.02,
            action_dim: 1,
            actions: vec![0.0; 50],
            model: Some(Box::new(ModelOutput {
                actions: vec![0.0; 50],
                reference_state: None,
                conditioned_delay: d,
            })),
        }
    }

    #[test]
    fn when_a_trained_rtc_chunk_arrives_after_its_conditioned_delay_expect_it_late() {
        // Conditioned on 5 steps of 20 ms: usable up to 100 ms after its observation.
        assert_eq!(late_steps(&conditioned(Some(5)), 0.0999), None);
        assert_eq!(late_steps(&conditioned(Some(5)), 0.1), None);
        assert_eq!(late_steps(&conditioned(Some(5)), 0.1001), Some((6, 5)));
        assert_eq!(late_steps(&conditioned(Some(5)), 0.35), Some((18, 5)));
        // Not conditioned (guided, plain, the first chunk): never late.
        assert_eq!(late_steps(&conditioned(Some(0)), 1.0), None);
        assert_eq!(late_steps(&conditioned(None), 1.0), None);
    }

    #[test]
    fn when_the_accelerator_fails_in_a_row_or_is_lost_expect_it_given_out_and_a_success_to_reset_the_run(
    ) {
        let failed = Some(AcceleratorFault::Failed);
        let s = WorkerStats::default();
        for _ in 1..ACCELERATOR_FAILURES {
            s.note_accelerator(failed);
        }
        // A success (or another kind of error) breaks the run of failures.
        s.note_accelerator(None);
        for _ in 1..ACCELERATOR_FAILURES {
            s.note_accelerator(failed);
        }
        assert_eq!(s.accelerator_fault(), None);
        s.note_accelerator(failed);
        assert_eq!(s.accelerator_fault(), failed);
        // What gave out first stays.
        s.note_accelerator(Some(AcceleratorFault::Lost));
        assert_eq!(s.accelerator_fault(), failed);
        let s = WorkerStats::default();
        s.note_accelerator(Some(AcceleratorFault::Lost));
        assert_eq!(s.accelerator_fault(), Some(AcceleratorFault::Lost));
    }
}

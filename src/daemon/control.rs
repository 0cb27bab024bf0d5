//! The control thread: one `ControlLoop::step` per tick (read the blackboard, tick the
//! controller, write the command, talk to the inference worker), paced by absolute deadlines.
//! `step` is public so a test can prove that it allocates nothing.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::SyncSender;
use std::sync::Arc;
use std::time::Duration;

use crate::control::controller::ChunkOutcome;
use crate::control::stats::Histogram;
use crate::control::ticker::Ticker;
use crate::control::{Controller, TickInputs};
use crate::daemon::worker::WorkerHandle;
use crate::io::{Blackboard, ControlDrill};
use crate::record::{TickSample, TickTap};
use crate::safety::reconfigure::Reconfigure;
use crate::safety::supervisor::{SafetyInputs, Transition};
use crate::telemetry::LiveStats;
use crate::time::MonoTime;

/// The `governor_fault` drill's jump (rad or m): far beyond one period's velocity limit.
const GOVERNOR_FAULT_JUMP: f64 = 0.2;

/// What the control thread reports to the supervisor. `Copy`: sending it never allocates.
#[derive(Clone, Copy, Debug)]
pub enum ControlEvent {
    Transition(Transition),
    Chunk(ChunkOutcome),
    ResetRefused,
    /// What became of reloaded limits.
    Reconfigured(Reconfigure),
    /// The independent monitor refused a command: the arm brakes, the daemon stops.
    LimitViolation,
}

pub struct ControlResult {
    pub controller: Controller,
    pub jitter: Histogram,
    pub ticks: u64,
    pub overruns: u64,
    pub reached_rest: bool,
}

/// Whether the loop goes on after a step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StepOutcome {
    Continue,
    /// Stopping reached rest.
    Done,
    /// Stopping did not reach rest within the stop timeout.
    StopTimeout,
}

pub struct ControlLoop {
    ctl: Controller,
    worker: WorkerHandle,
    board: Arc<Blackboard>,
    live: Arc<LiveStats>,
    stop_requested: Arc<AtomicBool>,
    events: SyncSender<ControlEvent>,
    camera_stamps: Vec<MonoTime>,
    jitter: Histogram,
    ticks: u64,
    overruns: u64,
    streak: u32,
    stop_timeout_s: f64,
    stop_deadline: Option<MonoTime>,
    record: Option<TickTap>,
    /// The `governor_fault` drill is due: the next command jumps.
    governor_fault: bool,
}

impl ControlLoop {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        ctl: Controller,
        worker: WorkerHandle,
        board: Arc<Blackboard>,
        live: Arc<LiveStats>,
        stop_requested: Arc<AtomicBool>,
        events: SyncSender<ControlEvent>,
        cameras: usize,
        stop_timeout_s: f64,
    ) -> ControlLoop {
        ControlLoop {
            ctl,
            worker,
            board,
            live,
            stop_requested,
            events,
            camera_stamps: vec![MonoTime::ZERO; cameras],
            jitter: Histogram::new(1_000, 100_000),
            ticks: 0,
            overruns: 0,
            streak: 0,
            stop_timeout_s,
            stop_deadline: None,
            record: None,
            governor_fault: false,
        }
    }

    /// Every tick's measurement and command also go to the recorder (never waiting for it).
    pub fn with_recorder(mut self, tap: TickTap) -> ControlLoop {
        self.record = Some(tap);
        self
    }

    /// Runs at `period_ns` until stopping completes.
    pub fn run(mut self, period_ns: u64, spin_ns: u64) -> ControlResult {
        let mut ticker = Ticker::new(period_ns, MonoTime::now() + Duration::from_nanos(period_ns))
            .with_spin(spin_ns);
        let outcome = loop {
            let tick = ticker.wait();
            self.jitter.record(tick.jitter_ns);
            let outcome = self.step(tick.deadline);
            let overran = tick.missed > 0 || MonoTime::now() > ticker.next_deadline();
            self.record_overrun(overran, tick.jitter_ns);
            if outcome != StepOutcome::Continue {
                break outcome;
            }
        };
        if outcome == StepOutcome::StopTimeout {
            tracing::error!("arm did not come to rest within control.stop_timeout_s");
        }
        ControlResult {
            controller: self.ctl,
            jitter: self.jitter,
            ticks: self.ticks,
            overruns: self.overruns,
            reached_rest: outcome == StepOutcome::Done,
        }
    }

    /// The simulator's drills for the supervisor (`crash_control`, `stall_control`).
    fn drill(&mut self) {
        match self.board.supervisor.take_control_drill() {
            None => {}
            Some(ControlDrill::Crash) => panic!("sim event `crash_control` (drill)"),
            Some(ControlDrill::GovernorFault) => self.governor_fault = true,
            Some(ControlDrill::Stall(d)) => std::thread::sleep(d),
        }
    }

    /// Counts an overrunning tick and publishes timing figures.
    pub fn record_overrun(&mut self, overran: bool, jitter_ns: u64) {
        if overran {
            self.overruns += 1;
            self.streak += 1;
        } else {
            self.streak = 0;
        }
        LiveStats::set(&self.live.overruns, self.overruns);
        LiveStats::set(&self.live.last_jitter_ns, jitter_ns);
        self.live
            .interval_max_jitter_ns
            .fetch_max(jitter_ns, std::sync::atomic::Ordering::Relaxed);
        LiveStats::set(&self.live.max_jitter_ns, self.jitter.max_ns());
    }

    /// One control tick for the deadline `now`.
    pub fn step(&mut self, now: MonoTime) -> StepOutcome {
        self.drill();
        // Never waits: the supervisor holds this lock only to put reloaded limits in.
        if let Some(l) = self
            .board
            .supervisor
            .reload_limits
            .try_lock()
            .ok()
            .and_then(|mut g| g.take())
        {
            self.ctl.request_limits(l);
        }
        if std::mem::take(&mut self.governor_fault) {
            self.ctl.inject_governor_fault(GOVERNOR_FAULT_JUMP);
        }
        let measured = self.board.inputs.joint_state.load();
        self.board
            .inputs
            .read_camera_stamps(&mut self.camera_stamps);
        let stopping = self.stop_requested.load(Ordering::Relaxed);
        if stopping && self.stop_deadline.is_none() {
            self.stop_deadline = Some(now.offset_seconds(self.stop_timeout_s));
        }
        let worker = &self.worker;
        let inputs = TickInputs {
            safety: SafetyInputs {
                now,
                measured: &measured,
                camera_stamps: &self.camera_stamps,
                estop: self.board.inputs.estop(),
                thread_fault: self.board.supervisor.fault(),
                estop_presses: self.board.inputs.estop_presses(),
                resets: self.board.inputs.resets(),
                overrun_streak: self.streak,
                stop_requested: stopping,
            },
            new_chunk: worker.try_chunk(),
            inference_in_flight: worker.in_flight(),
        };
        let report = self.ctl.tick(inputs, &mut |c| worker.recycle(c));
        worker.set_running(report.running_chunk);
        self.board.command.store((now, report.command));
        if let Some(tap) = &self.record {
            tap.send(&TickSample {
                at: now,
                measured,
                command: report.command,
                safety_events: *self.ctl.event_counts(),
            });
        }
        if report.request_inference {
            worker.request();
        }
        for t in report.transitions.iter().flatten() {
            let _ = self.events.try_send(ControlEvent::Transition(*t));
        }
        let live = &self.live;
        if let Some(c) = report.chunk {
            let _ = self.events.try_send(ControlEvent::Chunk(c));
            LiveStats::add(&live.chunks_received, 1);
            match c {
                ChunkOutcome::Accepted { latency_s, .. } => {
                    LiveStats::set(&live.last_latency_us, (latency_s * 1e6) as u64)
                }
                ChunkOutcome::Rejected { .. } => LiveStats::add(&live.chunks_rejected, 1),
            }
        }
        if report.reset_refused {
            let _ = self.events.try_send(ControlEvent::ResetRefused);
        }
        if let Some(r) = report.reconfigured {
            let _ = self.events.try_send(ControlEvent::Reconfigured(r));
        }
        if report.limit_violation {
            // The flag decides the exit (an event may be dropped on a full channel).
            LiveStats::set(&live.limit_violation, 1);
            let _ = self.events.try_send(ControlEvent::LimitViolation);
        }
        self.ticks += 1;
        LiveStats::set(&live.ticks, self.ticks);
        LiveStats::set(&live.mode, crate::telemetry::mode_code(report.mode));
        LiveStats::set(&live.waiting, report.waiting.code());
        LiveStats::set(&live.safety_events, self.ctl.event_counts().iter().sum());
        if report.done {
            StepOutcome::Done
        } else if self.stop_deadline.is_some_and(|d| now > d) {
            StepOutcome::StopTimeout
        } else {
            StepOutcome::Continue
        }
    }
}

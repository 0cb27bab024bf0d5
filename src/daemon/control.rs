//! The control thread: one `ControlLoop::step` per tick (read the blackboard, tick the
//! controller, write the command, talk to the inference worker), paced by absolute deadlines.
//! The tests that drive `step` tick by tick (no allocation, a reset against a latched fault) are
//! in control_loop_tests.rs.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::SyncSender;
use std::sync::Arc;
use std::time::Duration;

use crate::control::controller::ChunkOutcome;
use crate::control::stats::Histogram;
use crate::control::ticker::Ticker;
use crate::control::{Controller, TickInputs};
use crate::daemon::lifecycle::{Rung, StopLadder};
use crate::daemon::worker::WorkerHandle;
use crate::io::{Blackboard, ControlDrill};
use crate::record::{TickSample, TickTap};
use crate::safety::reconfigure::Reconfigure;
use crate::safety::supervisor::{SafetyInputs, Transition};
use crate::telemetry::LiveStats;
use crate::time::MonoTime;

/// The `governor_fault` drill's jump (rad or m): far beyond one period's velocity limit.
const GOVERNOR_FAULT_JUMP: f64 = 0.2;

/// The drills for the control thread (`crash_control`, `stall_control`, `governor_fault`): set
/// by `[[drill]]`s or simulator events, taken before a step. Installed only when some are
/// configured (`Config::drills_control_thread`), so `ControlLoop::step` never looks at them.
pub(crate) struct DrillHook {
    board: Arc<Blackboard>,
}

impl DrillHook {
    pub(crate) fn new(board: Arc<Blackboard>) -> DrillHook {
        DrillHook { board }
    }

    /// Fires the pending drill, if any: a panic, a stall, or the governor's next command jumping.
    pub(crate) fn fire(&self, ctl: &mut Controller) {
        match self.board.supervisor.take_control_drill() {
            None => {}
            Some(ControlDrill::Crash) => panic!("sim event `crash_control` (drill)"),
            Some(ControlDrill::GovernorFault) => ctl.inject_governor_fault(GOVERNOR_FAULT_JUMP),
            Some(ControlDrill::Stall(d)) => std::thread::sleep(d),
        }
    }
}

/// What the control thread reports to the supervisor. `Copy`: sending it never allocates.
#[derive(Clone, Copy, Debug)]
pub(crate) enum ControlEvent {
    Transition(Transition),
    Chunk(ChunkOutcome),
    ResetRefused,
    /// What became of reloaded limits.
    Reconfigured(Reconfigure),
    /// The independent monitor refused a command: the arm brakes, the daemon stops.
    LimitViolation,
}

pub(crate) struct ControlResult {
    pub(crate) controller: Controller,
    pub(crate) jitter: Histogram,
    pub(crate) ticks: u64,
    pub(crate) overruns: u64,
    pub(crate) reached_rest: bool,
}

/// Whether the loop goes on after a step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum StepOutcome {
    Continue,
    /// Stopping reached rest.
    Done,
    /// Stopping did not reach rest within the stop timeout.
    StopTimeout,
}

pub(crate) struct ControlLoop {
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
    stop: StopLadder,
    record: Option<TickTap>,
    /// Only when `[[drill]]`s are configured: a production tick runs no drill code.
    drills: Option<DrillHook>,
}

impl ControlLoop {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        ctl: Controller,
        worker: WorkerHandle,
        board: Arc<Blackboard>,
        live: Arc<LiveStats>,
        stop_requested: Arc<AtomicBool>,
        events: SyncSender<ControlEvent>,
        cameras: usize,
        stop_timeout_s: f64,
    ) -> ControlLoop {
        board.command.set_lookahead(ctl.lookahead());
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
            stop: StopLadder::new(stop_timeout_s),
            record: None,
            drills: None,
        }
    }

    /// Every tick's measurement and command also go to the recorder (never waiting for it).
    pub(crate) fn with_recorder(mut self, tap: TickTap) -> ControlLoop {
        self.record = Some(tap);
        self
    }

    /// The `[[drill]]`s for the control thread run before each step.
    pub(crate) fn with_drills(mut self, hook: DrillHook) -> ControlLoop {
        self.drills = Some(hook);
        self
    }

    /// Runs at `period_ns` until stopping completes.
    pub(crate) fn run(mut self, period_ns: u64, spin_ns: u64) -> ControlResult {
        let mut ticker = Ticker::new(period_ns, MonoTime::now() + Duration::from_nanos(period_ns))
            .with_spin(spin_ns);
        let outcome = loop {
            // Drills before the wait: a stalled loop (`stall_control`) then wakes late and the
            // ticker skips the deadlines it missed, as when the host does not run this thread
            // while it waits (where it spends nearly all its time).
            if let Some(drills) = &self.drills {
                drills.fire(&mut self.ctl);
            }
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

    /// Counts an overrunning tick and publishes timing figures.
    pub(crate) fn record_overrun(&mut self, overran: bool, jitter_ns: u64) {
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
    pub(crate) fn step(&mut self, now: MonoTime) -> StepOutcome {
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
        let measured = self.board.inputs.joint_state.load();
        self.board
            .inputs
            .read_camera_stamps(&mut self.camera_stamps);
        let stopping = self.stop_requested.load(Ordering::Relaxed);
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
            trajectories_sent: self.board.command.sent(),
        };
        let report = self.ctl.tick(inputs, &mut |c| worker.recycle(c));
        worker.set_running(report.running_chunk);
        if report.reconfigured == Some(Reconfigure::Applied) {
            // Before the first command under them: no tail plans with the limits they replaced.
            self.board.command.set_lookahead(self.ctl.lookahead());
        }
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
        match self.stop.tick(now, stopping, report.done) {
            Rung::AtRest => StepOutcome::Done,
            Rung::TimedOut => StepOutcome::StopTimeout,
            Rung::Going => StepOutcome::Continue,
        }
    }
}

#[cfg(test)]
#[path = "control_loop_tests.rs"]
mod loop_tests;

#[cfg(test)]
mod tests {
    use super::loop_tests::scripted_sim_config;
    use super::*;
    use crate::daemon::worker::{self, WorkerSetup, WorkerStats};
    use crate::joints::JointMeasurement;

    #[test]
    fn when_a_drill_is_set_without_the_hook_expect_step_leaves_it_untouched() {
        let cfg = scripted_sim_config();
        let board = Arc::new(Blackboard::new(cfg.sim.cameras.len(), "test"));
        let start = MonoTime::now();
        board.inputs.joint_state.store(JointMeasurement {
            stamp: start,
            position: cfg.sim.initial_position,
        });
        let stop = Arc::new(AtomicBool::new(false));
        let policy = crate::policy::from_config(&cfg).expect("scripted policy");
        let (handle, worker_thread) = worker::spawn(
            policy,
            WorkerSetup::from_config(&cfg),
            board.clone(),
            Arc::new(WorkerStats::default()),
            stop.clone(),
        )
        .expect("worker thread");
        let ctl = Controller::from_config(&cfg, &board.inputs.joint_state.load(), start)
            .expect("controller");
        let (tx, _rx) = std::sync::mpsc::sync_channel(1024);
        let mut lp = ControlLoop::new(
            ctl,
            handle,
            board.clone(),
            Arc::new(LiveStats::default()),
            Arc::new(AtomicBool::new(false)),
            tx,
            cfg.sim.cameras.len(),
            3.0,
        );
        board.supervisor.drill_crash_control();
        // Before the hook, step took the drill and panicked here.
        let outcome = lp.step(start.offset_seconds(cfg.control.period.as_secs_f64()));
        assert_eq!(outcome, StepOutcome::Continue);
        assert_eq!(
            board.supervisor.take_control_drill(),
            Some(ControlDrill::Crash),
            "step must not look at drills"
        );
        stop.store(true, Ordering::SeqCst);
        drop(lp);
        let _ = worker_thread.join();
    }

    #[test]
    fn when_the_hook_finds_a_drill_expect_it_fires_once() {
        let cfg = scripted_sim_config();
        let board = Arc::new(Blackboard::new(0, "test"));
        let measured = JointMeasurement {
            stamp: MonoTime::now(),
            position: cfg.sim.initial_position,
        };
        let mut ctl = Controller::from_config(&cfg, &measured, measured.stamp).expect("controller");
        let hook = DrillHook::new(board.clone());
        board.supervisor.drill_stall_control(0.0);
        hook.fire(&mut ctl);
        assert_eq!(board.supervisor.take_control_drill(), None, "taken");
        board.supervisor.drill_crash_control();
        let crashed =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| hook.fire(&mut ctl)));
        assert!(crashed.is_err(), "crash_control panics the control thread");
        assert_eq!(board.supervisor.take_control_drill(), None, "fired once");
    }
}

//! The `Blackboard`, split by direction so each writer has its own side: `RobotInputs` (written
//! by the transports), `CommandOut` (written by the control thread) and `SupervisorFlags`
//! (written by the daemon's supervisor, its drills and reloads). Every read on the control path
//! is a lock-free load or a `try_lock`, as before the split.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::sim::task::TaskProgress;
use super::Latest;
use crate::joints::{JointMeasurement, MotionState, StateLayout};
use crate::observation::{CameraFrame, Observation};
use crate::robot::lookahead::Lookahead;
use crate::time::MonoTime;

/// The latest inputs and the latest command, readable by the control thread without blocking.
pub(crate) struct Blackboard {
    pub(crate) inputs: RobotInputs,
    pub(crate) command: CommandOut,
    pub(crate) supervisor: SupervisorFlags,
}

impl Blackboard {
    pub(crate) fn new(cameras: usize, prompt: &str) -> Blackboard {
        Blackboard {
            inputs: RobotInputs::new(cameras, prompt),
            command: CommandOut {
                latest: Latest::new((MonoTime::ZERO, MotionState::default())),
                lookahead: Latest::new(None),
                sent: AtomicU64::new(0),
            },
            supervisor: SupervisorFlags::default(),
        }
    }
}

/// What the robot and its operator say (written by `io`; a reload may replace the prompt).
pub(crate) struct RobotInputs {
    pub(crate) joint_state: Latest<JointMeasurement>,
    /// Capture stamp (ns) of each camera's newest frame; 0 before the first.
    pub(crate) camera_stamps: Vec<AtomicU64>,
    /// Newest frame per camera, read by the inference worker only.
    pub(crate) frames: Vec<Mutex<Option<Arc<CameraFrame>>>>,
    pub(crate) prompt: Mutex<String>,
    /// Private: a press must also count, so a press released before the control loop looked
    /// still latches (`set_estop`).
    estop: AtomicBool,
    estop_presses: AtomicU64,
    /// Reset requests so far (the supervisor acts on a change).
    resets: AtomicU64,
    /// Until the first joint state: what the transport saw instead (messages refused, or the
    /// topics on the graph), for the start-up error.
    pub(crate) startup_note: Mutex<String>,
    /// How the simulator's task is going (`[sim.task]`), for the status line and the summary.
    pub(crate) task: Latest<Option<TaskProgress>>,
}

impl RobotInputs {
    fn new(cameras: usize, prompt: &str) -> RobotInputs {
        RobotInputs {
            joint_state: Latest::new(JointMeasurement::default()),
            camera_stamps: (0..cameras).map(|_| AtomicU64::new(0)).collect(),
            frames: (0..cameras).map(|_| Mutex::new(None)).collect(),
            prompt: Mutex::new(prompt.to_string()),
            estop: AtomicBool::new(false),
            estop_presses: AtomicU64::new(0),
            resets: AtomicU64::new(0),
            startup_note: Mutex::new(String::new()),
            task: Latest::new(None),
        }
    }

    pub(crate) fn note_startup(&self, note: String) {
        if let Ok(mut n) = self.startup_note.lock() {
            *n = note;
        }
    }

    /// The e-stop input changed to `pressed`.
    pub(crate) fn set_estop(&self, pressed: bool) {
        if pressed {
            self.estop_presses.fetch_add(1, Ordering::SeqCst);
        }
        self.estop.store(pressed, Ordering::SeqCst);
    }

    /// A press already released: the arm holds until a reset (the fault latch at start-up).
    pub(crate) fn count_press(&self) {
        self.estop_presses.fetch_add(1, Ordering::SeqCst);
    }

    pub(crate) fn estop(&self) -> bool {
        self.estop.load(Ordering::SeqCst)
    }

    pub(crate) fn estop_presses(&self) -> u64 {
        self.estop_presses.load(Ordering::SeqCst)
    }

    /// The operator asked to lift an e-stop.
    pub(crate) fn request_reset(&self) {
        self.resets.fetch_add(1, Ordering::SeqCst);
    }

    pub(crate) fn resets(&self) -> u64 {
        self.resets.load(Ordering::SeqCst)
    }

    pub(crate) fn publish_frame(&self, camera: usize, frame: CameraFrame) {
        let stamp = frame.stamp;
        if let Ok(mut slot) = self.frames[camera].lock() {
            *slot = Some(Arc::new(frame));
        }
        self.camera_stamps[camera].store(stamp.as_nanos(), Ordering::Release);
    }

    /// Camera stamps into a preallocated slice (control thread: no allocation).
    pub(crate) fn read_camera_stamps(&self, out: &mut [MonoTime]) {
        for (o, s) in out.iter_mut().zip(&self.camera_stamps) {
            *o = MonoTime::from_nanos(s.load(Ordering::Acquire));
        }
    }

    /// A consistent observation for the policy, its state laid out as `state` says.
    pub(crate) fn observe(&self, state: &StateLayout, out: &mut Observation) -> bool {
        let js = self.joint_state.load();
        if js.stamp == MonoTime::ZERO {
            return false;
        }
        out.stamp = js.stamp;
        state.gather(&js.position, &mut out.state);
        out.images.clear();
        for f in &self.frames {
            out.images.push(f.lock().ok().and_then(|g| g.clone()));
        }
        if let Ok(p) = self.prompt.lock() {
            out.prompt.clone_from(&p);
        }
        true
    }
}

/// The latest command (written by the control thread every tick, read by the transports).
pub(crate) struct CommandOut {
    latest: Latest<(MonoTime, MotionState)>,
    /// What a trajectory's braking tail keeps: the limits in force, set by the control thread
    /// before its first command and again whenever reloaded limits take effect, so a tail never
    /// plans with limits the governor no longer keeps.
    lookahead: Latest<Option<Lookahead>>,
    /// The tick (ns) of the newest command the transports sent; 0 before the first.
    sent: AtomicU64,
}

impl CommandOut {
    /// The command of the tick at `tick` went out to every output (written by the transport).
    pub(crate) fn mark_sent(&self, tick: MonoTime) {
        self.sent.store(tick.as_nanos(), Ordering::Release);
    }

    /// The tick of the newest command sent, if one was.
    pub(crate) fn sent(&self) -> Option<MonoTime> {
        match self.sent.load(Ordering::Acquire) {
            0 => None,
            ns => Some(MonoTime::from_nanos(ns)),
        }
    }

    pub(crate) fn set_lookahead(&self, lookahead: Lookahead) {
        self.lookahead.store(Some(lookahead));
    }

    pub(crate) fn lookahead(&self) -> Option<Lookahead> {
        self.lookahead.load()
    }

    pub(crate) fn store(&self, command: (MonoTime, MotionState)) {
        self.latest.store(command);
    }

    pub(crate) fn load(&self) -> (MonoTime, MotionState) {
        self.latest.load()
    }
}

/// A drill for the control thread (`[[drill]]`), taken once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ControlDrill {
    /// `crash_control`: the control thread panics.
    Crash,
    /// `stall_control`: it stops ticking this long.
    Stall(Duration),
    /// `governor_fault`: the governor's next command jumps (the monitor must refuse it).
    GovernorFault,
}

/// What the daemon's supervisor tells the other threads (written by the supervisor thread, its
/// drills and its reloads).
#[derive(Default)]
pub(crate) struct SupervisorFlags {
    /// Latched when a thread died: an e-stop that no reset clears.
    fault: AtomicBool,
    /// A drill for the control thread: 0 none, 1 panic, 2 stall for `drill_stall_ms`, 3
    /// governor fault.
    control_drill: AtomicU64,
    drill_stall_ms: AtomicU64,
    /// A drill for the I/O thread (`crash_io`): it panics at its next iteration.
    io_drill: AtomicBool,
    /// Tighter limits from a configuration reload, for the control thread to take.
    pub(crate) reload_limits: Mutex<Option<Box<crate::robot::RobotLimits>>>,
}

impl SupervisorFlags {
    pub(crate) fn latch_fault(&self) {
        self.fault.store(true, Ordering::SeqCst);
    }

    pub(crate) fn fault(&self) -> bool {
        self.fault.load(Ordering::SeqCst)
    }

    /// Drills for the control thread: it panics at its next tick.
    pub(crate) fn drill_crash_control(&self) {
        self.control_drill.store(1, Ordering::SeqCst);
    }

    /// ... or stops ticking for `duration_s` from its next tick.
    pub(crate) fn drill_stall_control(&self, duration_s: f64) {
        self.drill_stall_ms
            .store((duration_s * 1e3) as u64, Ordering::SeqCst);
        self.control_drill.store(2, Ordering::SeqCst);
    }

    /// ... or has the governor's next command jump (the monitor must refuse it).
    pub(crate) fn drill_governor_fault(&self) {
        self.control_drill.store(3, Ordering::SeqCst);
    }

    /// The control thread's pending drill, if any, taken (it fires once).
    pub(crate) fn take_control_drill(&self) -> Option<ControlDrill> {
        // A read per call; the shared line is written only when a drill is due.
        if self.control_drill.load(Ordering::Relaxed) == 0 {
            return None;
        }
        match self.control_drill.swap(0, Ordering::Relaxed) {
            0 => None,
            1 => Some(ControlDrill::Crash),
            3 => Some(ControlDrill::GovernorFault),
            _ => Some(ControlDrill::Stall(Duration::from_millis(
                self.drill_stall_ms.load(Ordering::Relaxed),
            ))),
        }
    }

    /// A drill for the I/O thread: it panics at its next iteration.
    pub(crate) fn drill_crash_io(&self) {
        self.io_drill.store(true, Ordering::SeqCst);
    }

    pub(crate) fn io_drill_due(&self) -> bool {
        self.io_drill.load(Ordering::Relaxed)
    }
}

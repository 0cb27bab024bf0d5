//! Transports between the daemon and the robot. They all meet at the `Blackboard`: the latest
//! inputs (joint state, camera frames, prompt, e-stop) and the latest command, readable by the
//! control thread without blocking.

pub mod latest;
pub mod ros;
pub mod sim;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

pub use latest::Latest;

use crate::joints::JointMeasurement;
use crate::joints::MotionState;
use crate::joints::StateLayout;
use crate::observation::{CameraFrame, Observation};
use crate::time::MonoTime;

pub struct Blackboard {
    pub joint_state: Latest<JointMeasurement>,
    /// Capture stamp (ns) of each camera's newest frame; 0 before the first.
    pub camera_stamps: Vec<AtomicU64>,
    /// Newest frame per camera, read by the inference worker only.
    pub frames: Vec<Mutex<Option<Arc<CameraFrame>>>>,
    pub prompt: Mutex<String>,
    pub estop: AtomicBool,
    /// E-stop presses so far: a press released before the control loop looked still latches.
    pub estop_presses: AtomicU64,
    /// A drill for the control thread, set by the simulator's events: 1 panic, 2 stall for
    /// `drill_stall_ms` (0: none).
    pub control_drill: AtomicU64,
    pub drill_stall_ms: AtomicU64,
    /// A drill for the I/O thread (`crash_io`): it panics at its next iteration.
    pub io_drill: AtomicBool,
    /// Latched by the daemon's supervisor when a thread died: an e-stop that no reset clears.
    pub fault: AtomicBool,
    pub resets: AtomicU64,
    /// Latest command (written by the control thread every tick).
    pub command: Latest<(MonoTime, MotionState)>,
    /// Until the first joint state: what the transport saw instead (messages refused, or the
    /// topics on the graph), for the start-up error.
    pub startup_note: Mutex<String>,
    /// Tighter limits from a configuration reload, for the control thread to take.
    pub reload_limits: Mutex<Option<Box<crate::robot::RobotLimits>>>,
}

impl Blackboard {
    pub fn new(cameras: usize, prompt: &str) -> Blackboard {
        Blackboard {
            joint_state: Latest::new(JointMeasurement::default()),
            camera_stamps: (0..cameras).map(|_| AtomicU64::new(0)).collect(),
            frames: (0..cameras).map(|_| Mutex::new(None)).collect(),
            prompt: Mutex::new(prompt.to_string()),
            estop: AtomicBool::new(false),
            estop_presses: AtomicU64::new(0),
            fault: AtomicBool::new(false),
            control_drill: AtomicU64::new(0),
            drill_stall_ms: AtomicU64::new(0),
            io_drill: AtomicBool::new(false),
            resets: AtomicU64::new(0),
            command: Latest::new((MonoTime::ZERO, MotionState::default())),
            startup_note: Mutex::new(String::new()),
            reload_limits: Mutex::new(None),
        }
    }

    /// Drills for the control thread: it panics at its next tick.
    pub fn drill_crash_control(&self) {
        self.control_drill.store(1, Ordering::SeqCst);
    }

    /// ... or stops ticking for `duration_s` from its next tick.
    pub fn drill_stall_control(&self, duration_s: f64) {
        self.drill_stall_ms
            .store((duration_s * 1e3) as u64, Ordering::SeqCst);
        self.control_drill.store(2, Ordering::SeqCst);
    }

    /// ... or has the governor's next command jump (the monitor must refuse it).
    pub fn drill_governor_fault(&self) {
        self.control_drill.store(3, Ordering::SeqCst);
    }

    /// A drill for the I/O thread: it panics at its next iteration.
    pub fn drill_crash_io(&self) {
        self.io_drill.store(true, Ordering::SeqCst);
    }

    pub fn note_startup(&self, note: String) {
        if let Ok(mut n) = self.startup_note.lock() {
            *n = note;
        }
    }

    /// The e-stop input changed to `pressed`.
    pub fn set_estop(&self, pressed: bool) {
        if pressed {
            self.estop_presses.fetch_add(1, Ordering::SeqCst);
        }
        self.estop.store(pressed, Ordering::SeqCst);
    }

    pub fn publish_frame(&self, camera: usize, frame: CameraFrame) {
        let stamp = frame.stamp;
        if let Ok(mut slot) = self.frames[camera].lock() {
            *slot = Some(Arc::new(frame));
        }
        self.camera_stamps[camera].store(stamp.as_nanos(), Ordering::Release);
    }

    /// Camera stamps into a preallocated slice (control thread: no allocation).
    pub fn read_camera_stamps(&self, out: &mut [MonoTime]) {
        for (o, s) in out.iter_mut().zip(&self.camera_stamps) {
            *o = MonoTime::from_nanos(s.load(Ordering::Acquire));
        }
    }

    /// A consistent observation for the policy, its state laid out as `state` says.
    pub fn observe(&self, state: &StateLayout, out: &mut Observation) -> bool {
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

//! The simulated arm: first-order position tracking under the URDF velocity limits, a delayed
//! joint-state measurement, synthetic camera images, and scripted operator events (e-stop,
//! reset, stalled sensors, a crash of the simulator thread) for scenario tests.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use super::Blackboard;
use crate::config::{SimConfig, SimEventKind};
use crate::joints::JointMeasurement;
use crate::joints::JointVector;
use crate::observation::{CameraFrame, PixelFormat};
use crate::robot::RobotLimits;
use crate::time::{sleep_until, MonoTime};

pub(crate) struct SimArm {
    /// A dry run: the arm ignores the commands and stays where it is.
    pub(crate) dry_run: bool,
    cfg: SimConfig,
    velocity_limit: JointVector,
    position: JointVector,
}

impl SimArm {
    pub(crate) fn new(cfg: SimConfig, limits: &RobotLimits) -> SimArm {
        SimArm {
            dry_run: false,
            position: cfg.initial_position,
            velocity_limit: limits.velocity,
            cfg,
        }
    }

    /// Advances the arm by `dt` toward the commanded positions.
    pub(crate) fn step(&mut self, command: &JointVector, dt: f64) {
        for j in 0..self.position.len() {
            let v = ((command[j] - self.position[j]) / self.cfg.tau_s)
                .clamp(-self.velocity_limit[j], self.velocity_limit[j]);
            self.position[j] += v * dt;
        }
    }

    /// Runs the simulation until `stop` is set (on a thread the daemon supervises); `beat` is
    /// called on every step.
    pub(crate) fn run(
        &mut self,
        board: &Blackboard,
        stop: &AtomicBool,
        start: MonoTime,
        beat: &dyn Fn(),
    ) {
        let dt = 1.0 / self.cfg.rate_hz;
        let period = Duration::from_secs_f64(dt);
        let delay = self.cfg.measurement_delay_s;
        let mut history: VecDeque<JointMeasurement> = VecDeque::new();
        let mut next_event = 0;
        let mut joint_stall_until = MonoTime::ZERO;
        let mut camera_stall_until = vec![MonoTime::ZERO; self.cfg.cameras.len()];
        let mut next_frame = vec![start; self.cfg.cameras.len()];
        let mut frame_count = 0u64;
        let mut deadline = start;
        let mut events = self.cfg.events.clone();
        events.sort_by(|a, b| a.at_s.total_cmp(&b.at_s));
        while !stop.load(Ordering::Relaxed) {
            if board.supervisor.io_drill_due() {
                panic!("fault drill `crash_io`: the simulator thread panics");
            }
            beat();
            deadline = deadline + period;
            sleep_until(deadline);
            let now = MonoTime::now();
            let elapsed = now.seconds_since(start);
            while next_event < events.len() && events[next_event].at_s <= elapsed {
                let e = &events[next_event];
                tracing::info!(at_s = e.at_s, event = ?e.kind, "sim event");
                match e.kind {
                    SimEventKind::EStop => board.inputs.set_estop(true),
                    SimEventKind::Reset => {
                        board.inputs.set_estop(false);
                        board.inputs.request_reset();
                    }
                    SimEventKind::StallJointStates { duration_s } => {
                        joint_stall_until = now.offset_seconds(duration_s)
                    }
                    SimEventKind::StallCamera { camera, duration_s } => {
                        camera_stall_until[camera] = now.offset_seconds(duration_s)
                    }
                    SimEventKind::Crash => {
                        panic!("sim event `crash` at {} s (drill)", e.at_s)
                    }
                    SimEventKind::CrashControl => board.supervisor.drill_crash_control(),
                    SimEventKind::StallControl { duration_s } => {
                        board.supervisor.drill_stall_control(duration_s)
                    }
                }
                next_event += 1;
            }

            let (_, command) = board.command.load();
            if !self.dry_run && command.position.len() == self.position.len() {
                self.step(&command.position, dt);
            }
            history.push_back(JointMeasurement {
                stamp: now,
                position: self.position,
            });
            // Deliver the newest measurement that is at least `delay` old.
            let mut ready = None;
            while history
                .front()
                .is_some_and(|m| now.seconds_since(m.stamp) >= delay)
            {
                ready = history.pop_front();
            }
            if let (Some(m), true) = (ready, now >= joint_stall_until) {
                board.inputs.joint_state.store(m);
            }

            for k in 0..self.cfg.cameras.len() {
                if now < next_frame[k] {
                    continue;
                }
                next_frame[k] = now.offset_seconds(1.0 / self.cfg.cameras[k].fps);
                if now < camera_stall_until[k] {
                    continue;
                }
                frame_count += 1;
                let frame = self.render(k, now, frame_count);
                board.inputs.publish_frame(k, frame);
            }
        }
    }

    /// A synthetic RGB image: a gradient background with a bright square whose place follows the
    /// first two joints, so the pixels change as the arm moves.
    fn render(&self, camera: usize, stamp: MonoTime, count: u64) -> CameraFrame {
        let cam = &self.cfg.cameras[camera];
        let (w, h) = (cam.width as usize, cam.height as usize);
        let mut data = vec![0u8; w * h * 3];
        let q0 = self.position.as_slice().first().copied().unwrap_or(0.0);
        let q1 = self.position.as_slice().get(1).copied().unwrap_or(0.0);
        let cx = ((0.5 + 0.25 * q0.sin()) * w as f64) as usize;
        let cy = ((0.5 + 0.25 * q1.sin()) * h as f64) as usize;
        let half = (w.min(h) / 10).max(1);
        for y in 0..h {
            for x in 0..w {
                let i = (y * w + x) * 3;
                let inside = x.abs_diff(cx) <= half && y.abs_diff(cy) <= half;
                data[i] = if inside {
                    250
                } else {
                    (x * 255 / w.max(1)) as u8
                };
                data[i + 1] = if inside {
                    200
                } else {
                    (y * 255 / h.max(1)) as u8
                };
                data[i + 2] = ((count + camera as u64 * 40) % 256) as u8;
            }
        }
        CameraFrame {
            stamp,
            width: cam.width,
            height: cam.height,
            format: PixelFormat::Rgb8,
            data,
        }
    }
}

//! The simulated arm: first-order position tracking under the URDF velocity limits, a delayed
//! joint-state measurement, camera images (the table from above with the arm and the task's
//! target when `[sim.task]` is set, else a synthetic pattern), and scripted operator events
//! (e-stop, reset, stalled sensors, a crash of the simulator thread) for scenario tests.

pub(crate) mod demos;
pub(crate) mod scene;
pub(crate) mod task;

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
use scene::Scene;
use task::{Episode, Outcome, Targets, TaskProgress};

pub(crate) struct SimArm {
    /// A dry run: the arm ignores the commands and stays where it is.
    pub(crate) dry_run: bool,
    cfg: SimConfig,
    velocity_limit: JointVector,
    position: JointVector,
    task: Option<TaskRun>,
}

/// `[sim.task]` while it runs: the scene, the target sequence, the target shown.
struct TaskRun {
    scene: Scene,
    targets: Targets,
    episode: Episode,
    progress: TaskProgress,
    /// The first target's clock starts with the first command, not while the policy loads.
    started: bool,
}

impl TaskRun {
    fn new(scene: Scene, base: &JointVector, now: f64) -> TaskRun {
        let mut targets = Targets::new(scene.task().seed);
        let episode = next_episode(&scene, &mut targets, base, now);
        TaskRun {
            scene,
            targets,
            episode,
            progress: TaskProgress {
                target: 1,
                ..TaskProgress::default()
            },
            started: false,
        }
    }

    /// The tool is where `q` puts it at `now`: the progress, a new target when this one is done.
    fn observe(&mut self, q: &JointVector, base: &JointVector, now: f64) -> TaskProgress {
        if !self.started {
            self.started = true;
            self.episode.restart(now);
        }
        let tool = self.scene.tool_xy(q.as_slice());
        let (d, outcome) = self.episode.observe(self.scene.task(), tool, now);
        self.progress.distance_m = d;
        match outcome {
            Outcome::Going => return self.progress,
            Outcome::Reached => self.progress.reached += 1,
            Outcome::Missed => self.progress.missed += 1,
        }
        tracing::info!(
            target = self.progress.target,
            outcome = ?outcome,
            distance_mm = (d * 1e3).round(),
            "sim task"
        );
        self.episode = next_episode(&self.scene, &mut self.targets, base, now);
        self.progress.target += 1;
        self.progress
    }
}

/// A new target drawn, placed where its pose puts the tool.
pub(crate) fn next_episode(
    scene: &Scene,
    targets: &mut Targets,
    base: &JointVector,
    now: f64,
) -> Episode {
    let pose = targets.next(scene.task(), base);
    let xy = scene.tool_xy(pose.as_slice());
    Episode::new(pose, xy, now)
}

impl SimArm {
    pub(crate) fn new(cfg: SimConfig, limits: &RobotLimits) -> SimArm {
        let task = cfg
            .task
            .clone()
            .map(|t| TaskRun::new(Scene::new(t), &cfg.initial_position, 0.0));
        SimArm {
            dry_run: false,
            position: cfg.initial_position,
            velocity_limit: limits.velocity,
            cfg,
            task,
        }
    }

    /// Where the arm is.
    #[cfg(test)]
    pub(crate) fn position(&self) -> &JointVector {
        &self.position
    }

    /// Advances the arm over `dt` while its command moves linearly from `from` to `to`, as
    /// pi0d's interpolation between chunk steps moves it (one simulation step at a time).
    pub(crate) fn follow(&mut self, from: &JointVector, to: &JointVector, dt: f64) {
        let substeps = ((dt * self.cfg.rate_hz).round() as usize).max(1);
        for s in 1..=substeps {
            let f = s as f64 / substeps as f64;
            let mut c = *from;
            for j in 0..c.len() {
                c[j] += (to[j] - from[j]) * f;
            }
            self.step(&c, dt / substeps as f64);
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
            if let (Some(task), true) = (&mut self.task, !command.position.is_empty()) {
                let progress = task.observe(&self.position, &self.cfg.initial_position, elapsed);
                board.inputs.task.store(Some(progress));
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

    /// The camera's image: the task's scene, or without a task a synthetic one (a gradient
    /// background with a bright square whose place follows the first two joints, so the
    /// pixels change as the arm moves).
    fn render(&self, camera: usize, stamp: MonoTime, count: u64) -> CameraFrame {
        let cam = &self.cfg.cameras[camera];
        let (w, h) = (cam.width as usize, cam.height as usize);
        let mut data = vec![0u8; w * h * 3];
        match &self.task {
            Some(task) => {
                let target = Some(task.episode.xy);
                task.scene
                    .render(self.position.as_slice(), target, w, h, &mut data);
            }
            None => self.pattern(camera, count, w, h, &mut data),
        }
        CameraFrame {
            stamp,
            width: cam.width,
            height: cam.height,
            format: PixelFormat::Rgb8,
            data,
        }
    }

    /// The synthetic image without a task.
    fn pattern(&self, camera: usize, count: u64, w: usize, h: usize, data: &mut [u8]) {
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
    }
}

/// config/sim.toml's task, with the random-weight model (no trained checkpoint needed).
#[cfg(test)]
pub(crate) fn demo_task() -> crate::config::sim_task::SimTask {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(root.join("config/sim.toml"))
        .unwrap()
        .replace("\"../", &format!("\"{}/", root.display()))
        .replace("models/sim-reach", "models/tiny-pi0")
        .replace("name = \"top\"", "name = \"front\"");
    let cfg = crate::config::Config::parse(&root.join("config/sim.toml"), &text).unwrap();
    cfg.sim.task.unwrap()
}

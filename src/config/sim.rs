//! `[sim]`: the simulated arm, its cameras and scripted operator events.

use super::check::Check;
use super::raw::{RawSim, SimEventName};
use super::ConfigError;
use crate::joints::JointVector;
use crate::robot::{RobotLimits, Workspace};

#[derive(Clone, Debug)]
pub struct CameraConfig {
    pub(crate) name: String,
    pub(crate) width: u32,
    pub(crate) height: u32,
    pub(crate) fps: f64,
}

#[derive(Clone, Debug, PartialEq)]
pub(crate) enum SimEventKind {
    EStop,
    Reset,
    StallJointStates {
        duration_s: f64,
    },
    StallCamera {
        camera: usize,
        duration_s: f64,
    },
    // A drill for the thread supervisor: the simulator thread panics.
    Crash,
    /// Drills for the control thread: it panics, or stops ticking for `duration_s`.
    CrashControl,
    StallControl {
        duration_s: f64,
    },
}

#[derive(Clone, Debug)]
pub(crate) struct SimEvent {
    pub(crate) at_s: f64,
    pub(crate) kind: SimEventKind,
}

#[derive(Clone, Debug)]
pub struct SimConfig {
    pub(crate) tau_s: f64,
    pub(crate) measurement_delay_s: f64,
    pub(crate) rate_hz: f64,
    pub initial_position: JointVector,
    pub cameras: Vec<CameraConfig>,
    pub(crate) events: Vec<SimEvent>,
    pub(crate) task: Option<super::sim_task::SimTask>,
}

pub(crate) fn validate(
    c: &Check,
    raw: &RawSim,
    limits: &RobotLimits,
    workspace: Option<&Workspace>,
) -> Result<SimConfig, ConfigError> {
    let mut initial = JointVector::zeros(limits.len());
    for (name, value) in &raw.initial_position {
        let field = format!("sim.initial_position.{name}");
        match limits.joints.iter().position(|j| &j.name == name) {
            Some(i) => initial[i] = *value,
            None => return c.fail(&field, "no such joint in robot.joints"),
        }
    }
    for (i, j) in limits.joints.iter().enumerate() {
        if !raw.initial_position.contains_key(&j.name) && j.lower.is_finite() {
            // Unlisted joints start mid-range.
            initial[i] = 0.5 * (j.lower + j.upper);
        }
    }
    if raw.cameras.len() > super::MAX_CAMERAS {
        return c.fail(
            "sim.cameras",
            format!(
                "{} cameras; pi0d takes at most {}",
                raw.cameras.len(),
                super::MAX_CAMERAS
            ),
        );
    }
    let mut cameras: Vec<CameraConfig> = Vec::new();
    for (i, cam) in raw.cameras.iter().enumerate() {
        if cameras.iter().any(|o| o.name == cam.name) {
            return c.fail(
                &format!("sim.cameras[{i}].name"),
                format!("camera `{}` is listed twice", cam.name),
            );
        }
        cameras.push(CameraConfig {
            name: cam.name.clone(),
            width: cam.width,
            height: cam.height,
            fps: cam.fps,
        });
    }
    let mut events = Vec::new();
    for (i, e) in raw.events.iter().enumerate() {
        let field = |k: &str| format!("sim.events[{i}].{k}");
        let at_s = e.at_s;
        let stall = matches!(
            e.event,
            SimEventName::StallJointStates | SimEventName::StallCamera | SimEventName::StallControl
        );
        c.unused(
            &field("duration_s"),
            e.duration_s.is_some() && !stall,
            "only stall events last",
        );
        c.unused(
            &field("camera"),
            e.camera.is_some() && e.event != SimEventName::StallCamera,
            "only stall_camera names a camera",
        );
        let duration_s = e.duration_s.unwrap_or(0.0);
        let kind = match e.event {
            SimEventName::Estop => SimEventKind::EStop,
            SimEventName::Reset => SimEventKind::Reset,
            SimEventName::Crash => SimEventKind::Crash,
            SimEventName::CrashControl => SimEventKind::CrashControl,
            SimEventName::StallControl => SimEventKind::StallControl { duration_s },
            SimEventName::StallJointStates => SimEventKind::StallJointStates { duration_s },
            SimEventName::StallCamera => {
                let name = e.camera.as_deref().unwrap_or("");
                match cameras.iter().position(|cam| cam.name == name) {
                    Some(camera) => SimEventKind::StallCamera { camera, duration_s },
                    None => {
                        return c.fail(&field("camera"), format!("no sim camera named \"{name}\""))
                    }
                }
            }
        };
        events.push(SimEvent { at_s, kind });
    }
    // The simulated joint moves (command - position) / tau_s * dt a step: with tau_s below
    // one step it overshoots every step and never settles.
    if raw.tau_s < 1.0 / raw.rate_hz {
        return c.fail(
            "sim.tau_s",
            format!(
                "{} s is shorter than one simulation step (1 / sim.rate_hz = {} s): the simulated joints would oscillate",
                raw.tau_s,
                1.0 / raw.rate_hz
            ),
        );
    }
    let task = raw
        .task
        .as_ref()
        .map(|t| super::sim_task::validate(c, t, limits, workspace, &initial))
        .transpose()?;
    Ok(SimConfig {
        tau_s: raw.tau_s,
        measurement_delay_s: raw.measurement_delay_s,
        rate_hz: raw.rate_hz,
        initial_position: initial,
        cameras,
        events,
        task,
    })
}

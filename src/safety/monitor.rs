//! Independent check of what was actually commanded: finite differences of consecutive commands
//! against the limits. It shares no code path with the governor, so a governor bug shows up
//! here as `limit_violations`.

use crate::joints::{JointVector, MotionState};
use crate::robot::RobotLimits;

/// Relative slack for floating-point rounding in the finite differences.
const REL_TOL: f64 = 1e-6;
const ABS_TOL: f64 = 1e-9;

pub struct LimitMonitor {
    dt: f64,
    limits: RobotLimits,
    prev: Option<JointVector>,
    prev_velocity: Option<JointVector>,
    prev_acceleration: Option<JointVector>,
    pub violations: u64,
    pub(crate) max_abs_jerk: JointVector,
    pub(crate) max_abs_velocity: JointVector,
    pub(crate) max_abs_acceleration: JointVector,
}

fn exceeds(x: f64, bound: f64) -> bool {
    x.abs() > bound * (1.0 + REL_TOL) + ABS_TOL
}

impl LimitMonitor {
    pub(crate) fn new(limits: RobotLimits, dt: f64) -> LimitMonitor {
        let n = limits.len();
        LimitMonitor {
            dt,
            limits,
            prev: None,
            prev_velocity: None,
            prev_acceleration: None,
            violations: 0,
            max_abs_jerk: JointVector::zeros(n),
            max_abs_velocity: JointVector::zeros(n),
            max_abs_acceleration: JointVector::zeros(n),
        }
    }

    /// New limits (a reload, applied with the command at rest inside them).
    pub(crate) fn set_limits(&mut self, limits: RobotLimits) {
        self.limits = limits;
    }

    /// Starts a fresh history (after the arm stood still, e.g. at start-up) at rest.
    pub(crate) fn reset_at(&mut self, position: &JointVector) {
        let n = position.len();
        self.prev = Some(*position);
        self.prev_velocity = Some(JointVector::zeros(n));
        self.prev_acceleration = Some(JointVector::zeros(n));
    }

    /// The history of joints `joints` resumes at `state` (a controller ran on without pi0d
    /// through a stall and stands there now): the next command is judged as a step from it.
    pub(crate) fn resume_at(&mut self, state: &MotionState, joints: &[usize]) {
        let n = self.limits.len();
        let mut prev = self.prev.unwrap_or(state.position);
        let mut pv = self.prev_velocity.unwrap_or_else(|| JointVector::zeros(n));
        let mut pa = self
            .prev_acceleration
            .unwrap_or_else(|| JointVector::zeros(n));
        for &j in joints {
            prev[j] = state.position[j];
            pv[j] = state.velocity[j];
            pa[j] = state.acceleration[j];
        }
        self.prev = Some(prev);
        self.prev_velocity = Some(pv);
        self.prev_acceleration = Some(pa);
    }

    /// How many joints of `command` would break a limit, were it commanded next; records
    /// nothing (the controller then decides what is commanded instead).
    pub(crate) fn judge(&self, command: &JointVector) -> u32 {
        let mut broken = 0;
        for j in 0..self.limits.len() {
            let p = command[j];
            let mut bad = !p.is_finite()
                || p < self.limits.lower[j] - ABS_TOL
                || p > self.limits.upper[j] + ABS_TOL;
            if let Some(prev) = &self.prev {
                let v = (p - prev[j]) / self.dt;
                bad |= exceeds(v, self.limits.velocity[j]);
                if let Some(pv) = &self.prev_velocity {
                    // Acceleration from two differences of rounded positions carries ~eps/dt² noise.
                    let a = (v - pv[j]) / self.dt;
                    bad |= exceeds(a, self.limits.acceleration[j] + 1e-6);
                }
            }
            broken += u32::from(bad);
        }
        broken
    }

    /// Records one command as commanded, with `broken`, what `judge` said of it.
    pub(crate) fn record(&mut self, command: &JointVector, broken: u32) {
        self.violations += u64::from(broken);
        let n = self.limits.len();
        let mut v = JointVector::zeros(n);
        let mut a = JointVector::zeros(n);
        for j in 0..n {
            if let Some(prev) = &self.prev {
                v[j] = (command[j] - prev[j]) / self.dt;
                self.max_abs_velocity[j] = self.max_abs_velocity[j].max(v[j].abs());
                if let Some(pv) = &self.prev_velocity {
                    a[j] = (v[j] - pv[j]) / self.dt;
                    self.max_abs_acceleration[j] = self.max_abs_acceleration[j].max(a[j].abs());
                    if let Some(pa) = &self.prev_acceleration {
                        let jerk = (a[j] - pa[j]) / self.dt;
                        self.max_abs_jerk[j] = self.max_abs_jerk[j].max(jerk.abs());
                    }
                }
            }
        }
        if self.prev.is_some() {
            if self.prev_velocity.is_some() {
                self.prev_acceleration = Some(a);
            }
            self.prev_velocity = Some(v);
        }
        self.prev = Some(*command);
    }
}

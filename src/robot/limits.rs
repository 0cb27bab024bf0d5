//! Validated per-joint limits in the robot's command order.

use crate::joints::JointVector;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JointKind {
    Revolute,
    Prismatic,
    /// No position limit (a wrist that turns forever).
    Continuous,
}

/// URDF `<safety_controller>` soft limit: near the soft bound the velocity is limited to
/// `-k_position * (p - soft_bound)`, as ros2_control's soft limiter does.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SoftLimit {
    pub(crate) lower: f64,
    pub(crate) upper: f64,
    pub(crate) k_position: f64,
    /// Not used by pi0d's governor (it commands positions); kept so a reload can tell a
    /// looser one from the running one.
    pub(crate) k_velocity: f64,
}

/// Limits of one joint, in its SI units (rad or m, per second, per second², per second³).
#[derive(Clone, Debug, PartialEq)]
pub struct JointLimits {
    pub name: String,
    pub kind: JointKind,
    /// Lowest position ever commanded: URDF/config lower bound plus margin, tightened by the soft
    /// lower limit. `-inf` for continuous joints.
    pub lower: f64,
    /// Highest position ever commanded (see `lower`). `+inf` for continuous joints.
    pub upper: f64,
    pub velocity: f64,
    pub acceleration: f64,
    pub jerk: f64,
    /// URDF effort limit, reported only (pi0d commands positions).
    pub effort: f64,
    pub soft: Option<SoftLimit>,
    /// Largest allowed distance between a commanded target and the measured position.
    pub max_step: f64,
}

impl JointLimits {
    pub(crate) fn contains(&self, position: f64) -> bool {
        position >= self.lower && position <= self.upper
    }
}

/// All joints' limits, in command order, plus their columns as joint vectors for the hot path.
#[derive(Clone, Debug)]
pub struct RobotLimits {
    pub joints: Vec<JointLimits>,
    pub(crate) lower: JointVector,
    pub(crate) upper: JointVector,
    pub(crate) velocity: JointVector,
    pub(crate) acceleration: JointVector,
    pub(crate) jerk: JointVector,
    pub(crate) max_step: JointVector,
    /// The factor every velocity, acceleration and jerk limit was scaled by (`limits.scale`,
    /// for a first run; 1 at full speed).
    pub scale: f64,
}

impl RobotLimits {
    /// The same joints with every velocity, acceleration and jerk limit times `scale`.
    pub(crate) fn scaled(self, scale: f64) -> RobotLimits {
        let joints = self
            .joints
            .into_iter()
            .map(|j| JointLimits {
                velocity: j.velocity * scale,
                acceleration: j.acceleration * scale,
                jerk: j.jerk * scale,
                ..j
            })
            .collect();
        RobotLimits {
            scale: self.scale * scale,
            ..RobotLimits::new(joints)
        }
    }

    pub fn new(joints: Vec<JointLimits>) -> RobotLimits {
        let column = |f: fn(&JointLimits) -> f64| {
            JointVector::from_slice(&joints.iter().map(f).collect::<Vec<_>>())
        };
        RobotLimits {
            lower: column(|j| j.lower),
            upper: column(|j| j.upper),
            velocity: column(|j| j.velocity),
            acceleration: column(|j| j.acceleration),
            jerk: column(|j| j.jerk),
            max_step: column(|j| j.max_step),
            joints,
            scale: 1.0,
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.joints.len()
    }

    pub(crate) fn names(&self) -> impl Iterator<Item = &str> {
        self.joints.iter().map(|j| j.name.as_str())
    }

    /// The first joint whose `position` is outside its command range, if any.
    pub(crate) fn first_outside(&self, position: &JointVector) -> Option<(&JointLimits, f64)> {
        self.joints
            .iter()
            .zip(position.iter())
            .find(|(l, p)| !l.contains(**p))
            .map(|(l, p)| (l, *p))
    }
}

/// One revolute joint `j` in `[lower, upper]` (1 rad/s, 5 rad/s², 100 rad/s³), for unit tests.
#[cfg(test)]
pub(crate) fn one_test_joint(lower: f64, upper: f64) -> RobotLimits {
    RobotLimits::new(vec![JointLimits {
        name: "j".into(),
        kind: JointKind::Revolute,
        lower,
        upper,
        velocity: 1.0,
        acceleration: 5.0,
        jerk: 100.0,
        effort: 0.0,
        soft: None,
        max_step: f64::INFINITY,
    }])
}

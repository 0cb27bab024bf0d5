//! Joint-space vectors with a fixed capacity, so the control tick never allocates.
//!
//! Values are in SI units of the joint: radians for revolute/continuous joints, metres for
//! prismatic ones (grippers included). The order is always the robot's command order
//! (`robot.joints` in the config), never the policy's action order.

use std::ops::{Index, IndexMut};

use crate::time::MonoTime;

/// The most joints one daemon commands; pi0's action vector is 32 wide, so this covers any robot
/// the policy can drive.
pub(crate) const MAX_JOINTS: usize = 32;

#[derive(Clone, Copy, PartialEq)]
pub struct JointVector {
    len: usize,
    values: [f64; MAX_JOINTS],
}

impl JointVector {
    /// A vector of `len` zeros. Panics if `len > MAX_JOINTS` (config validation rejects that first).
    pub fn zeros(len: usize) -> JointVector {
        assert!(len <= MAX_JOINTS, "at most {MAX_JOINTS} joints");
        JointVector {
            len,
            values: [0.0; MAX_JOINTS],
        }
    }

    pub fn from_slice(values: &[f64]) -> JointVector {
        let mut v = JointVector::zeros(values.len());
        v.values[..values.len()].copy_from_slice(values);
        v
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub(crate) fn as_slice(&self) -> &[f64] {
        &self.values[..self.len]
    }

    pub(crate) fn as_mut_slice(&mut self) -> &mut [f64] {
        &mut self.values[..self.len]
    }

    pub(crate) fn iter(&self) -> std::slice::Iter<'_, f64> {
        self.as_slice().iter()
    }

    /// The entries `indices`, in that order.
    pub(crate) fn select(&self, indices: &[usize]) -> JointVector {
        let mut out = JointVector::zeros(indices.len());
        for (k, &j) in indices.iter().enumerate() {
            out[k] = self[j];
        }
        out
    }

    pub(crate) fn all_finite(&self) -> bool {
        self.iter().all(|x| x.is_finite())
    }
}

impl Index<usize> for JointVector {
    type Output = f64;
    fn index(&self, i: usize) -> &f64 {
        &self.as_slice()[i]
    }
}

impl IndexMut<usize> for JointVector {
    fn index_mut(&mut self, i: usize) -> &mut f64 {
        &mut self.as_mut_slice()[i]
    }
}

impl std::fmt::Debug for JointVector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.as_slice()).finish()
    }
}

impl Default for JointVector {
    fn default() -> Self {
        JointVector::zeros(0)
    }
}

/// Commanded position, velocity and acceleration of every joint at one control tick.
#[derive(Clone, Copy, Debug, PartialEq, Default)]
pub struct MotionState {
    pub position: JointVector,
    pub velocity: JointVector,
    pub acceleration: JointVector,
}

impl MotionState {
    /// At rest at `position`.
    pub(crate) fn at_rest(position: JointVector) -> MotionState {
        let n = position.len();
        MotionState {
            position,
            velocity: JointVector::zeros(n),
            acceleration: JointVector::zeros(n),
        }
    }
}

/// The latest measured joint positions and their capture time.
#[derive(Clone, Copy, Debug, Default)]
pub struct JointMeasurement {
    pub stamp: MonoTime,
    pub position: JointVector,
}

/// Which robot joint each policy action index drives.
#[derive(Clone, Debug, PartialEq)]
pub struct ActionMap {
    pub action_names: Vec<String>,
    /// `joint_of_action[k]` = command index of action `k`.
    pub(crate) joint_of_action: Vec<usize>,
}

impl ActionMap {
    pub(crate) fn action_dim(&self) -> usize {
        self.joint_of_action.len()
    }

    /// Scatters an action vector onto `joints`, leaving joints the policy does not drive as they are.
    pub(crate) fn apply(&self, action: &[f64], joints: &mut JointVector) {
        for (k, &j) in self.joint_of_action.iter().enumerate() {
            joints[j] = action[k];
        }
    }
}

/// Where one entry of the policy's state vector comes from.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum StateSource {
    /// The measured position of this joint (command index).
    Joint(usize),
    /// A value the dataset held constant (a fixed joint, a padding slot).
    Constant(f64),
}

/// The policy's state vector, entry by entry (`policy.state`; by default the measured
/// positions in action order).
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct StateLayout {
    pub(crate) sources: Vec<StateSource>,
    /// The setting that laid it out (`policy.state`, or `policy.action_joints` by default),
    /// as messages name it.
    pub(crate) field: &'static str,
}

impl StateLayout {
    pub(crate) fn len(&self) -> usize {
        self.sources.len()
    }

    /// The state vector from the measured joint positions.
    pub(crate) fn gather(&self, joints: &JointVector, out: &mut Vec<f64>) {
        out.clear();
        out.extend(self.sources.iter().map(|s| match *s {
            StateSource::Joint(j) => joints[j],
            StateSource::Constant(c) => c,
        }));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn when_state_mixes_joints_and_constants_expect_them_in_its_order() {
        let layout = StateLayout {
            sources: vec![
                StateSource::Joint(2),
                StateSource::Constant(0.5),
                StateSource::Joint(0),
            ],
            field: "policy.state",
        };
        let mut out = Vec::new();
        layout.gather(&JointVector::from_slice(&[1.0, 2.0, 3.0]), &mut out);
        assert_eq!(out, [3.0, 0.5, 1.0]);
    }
}

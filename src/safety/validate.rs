//! Whole-chunk checks on arrival: a chunk with any non-finite value, any target far outside the
//! limits, or a jump no joint could follow is refused entirely (never partly executed).

use std::fmt;

use crate::chunk::JointChunk;
use crate::robot::RobotLimits;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ChunkFaultKind {
    NonFinite,
    OutOfRange,
    Jump,
    Shape,
}

impl ChunkFaultKind {
    pub(crate) fn name(self) -> &'static str {
        match self {
            ChunkFaultKind::NonFinite => "non_finite",
            ChunkFaultKind::OutOfRange => "out_of_range",
            ChunkFaultKind::Jump => "jump",
            ChunkFaultKind::Shape => "shape",
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub(crate) struct ChunkFault {
    pub(crate) kind: ChunkFaultKind,
    pub(crate) step: usize,
    pub(crate) joint: String,
    pub(crate) value: f64,
    pub(crate) bound: f64,
}

impl fmt::Display for ChunkFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.kind {
            ChunkFaultKind::NonFinite => write!(f, "step {} joint `{}`: value {} is not finite", self.step, self.joint, self.value),
            ChunkFaultKind::OutOfRange => write!(f, "step {} joint `{}`: target {:.4} is beyond the limit {:.4} by more than the tolerance", self.step, self.joint, self.value, self.bound),
            ChunkFaultKind::Jump => write!(f, "step {} joint `{}`: moves at {:.3}/s between steps, more than {:.3}/s", self.step, self.joint, self.value, self.bound),
            ChunkFaultKind::Shape => write!(f, "chunk has {} steps, expected at least 2", self.step),
        }
    }
}

/// Checks a joint-space chunk against the limits.
pub(crate) fn check_chunk(
    chunk: &JointChunk,
    limits: &RobotLimits,
    position_tolerance: f64,
    step_velocity_factor: f64,
) -> Result<(), ChunkFault> {
    let fault = |kind, step, j: usize, value, bound| ChunkFault {
        kind,
        step,
        joint: limits.joints[j].name.clone(),
        value,
        bound,
    };
    if chunk.steps() < 2 || !(chunk.period_s > 0.0 && chunk.period_s.is_finite()) {
        return Err(ChunkFault {
            kind: ChunkFaultKind::Shape,
            step: chunk.steps(),
            joint: String::new(),
            value: chunk.period_s,
            bound: 0.0,
        });
    }
    for (i, p) in chunk.positions.iter().enumerate() {
        for (j, &x) in p.iter().enumerate() {
            if !x.is_finite() {
                return Err(fault(ChunkFaultKind::NonFinite, i, j, x, 0.0));
            }
        }
    }
    for (i, p) in chunk.positions.iter().enumerate() {
        for (j, &x) in p.iter().enumerate() {
            let (lo, hi) = (limits.lower[j], limits.upper[j]);
            if x < lo - position_tolerance {
                return Err(fault(ChunkFaultKind::OutOfRange, i, j, x, lo));
            }
            if x > hi + position_tolerance {
                return Err(fault(ChunkFaultKind::OutOfRange, i, j, x, hi));
            }
        }
    }
    for i in 1..chunk.steps() {
        for j in 0..limits.len() {
            let speed = (chunk.positions[i][j] - chunk.positions[i - 1][j]).abs() / chunk.period_s;
            let bound = step_velocity_factor * limits.velocity[j];
            if speed > bound {
                return Err(fault(ChunkFaultKind::Jump, i, j, speed, bound));
            }
        }
    }
    Ok(())
}

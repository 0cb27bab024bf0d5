//! Wraps a policy and injects one kind of fault into a window of its chunks, for scenario tests
//! and for drills on a real robot: NaN, Inf, a jump, extra latency, a panic, or an error.

use std::time::Duration;

use super::{Policy, PolicyError};
use crate::chunk::ActionChunk;
use crate::config::{FaultConfig, FaultKind};
use crate::observation::Observation;

pub(crate) struct FaultyPolicy {
    inner: Box<dyn Policy>,
    fault: FaultConfig,
    produced: u32,
}

/// Size of the injected jump, in joint units (the first action only).
const JUMP: f64 = 1.0;

impl FaultyPolicy {
    pub(crate) fn new(inner: Box<dyn Policy>, fault: FaultConfig) -> FaultyPolicy {
        FaultyPolicy {
            inner,
            fault,
            produced: 0,
        }
    }

    fn faulty_now(&self) -> bool {
        let k = self.produced;
        k >= self.fault.after_chunks
            && (self.fault.count == 0
                || k < self.fault.after_chunks.saturating_add(self.fault.count))
    }
}

impl Policy for FaultyPolicy {
    fn name(&self) -> &str {
        "faulty"
    }

    fn describe(&self) -> Vec<String> {
        self.inner.describe()
    }

    fn weight_bytes(&self) -> Option<u64> {
        self.inner.weight_bytes()
    }

    // Not a chunk: the fault window counts only the worker's requests.
    fn warm_up(&mut self, obs: &Observation) -> Result<(), PolicyError> {
        self.inner.warm_up(obs)
    }

    fn infer(&mut self, obs: &Observation) -> Result<ActionChunk, PolicyError> {
        let faulty = self.faulty_now();
        self.produced += 1;
        if !faulty {
            return self.inner.infer(obs);
        }
        match self.fault.kind {
            FaultKind::Panic => panic!("injected policy panic (policy.fault.kind = \"panic\")"),
            FaultKind::Error => return Err(PolicyError::Injected),
            // Saturates: `policy.fault.latency_s` is ranged, but a huge value must not panic.
            FaultKind::Slow => std::thread::sleep(
                Duration::try_from_secs_f64(self.fault.latency_s).unwrap_or(Duration::MAX),
            ),
            _ => {}
        }
        let mut chunk = self.inner.infer(obs)?;
        let mid = chunk.steps() / 2 * chunk.action_dim;
        match self.fault.kind {
            FaultKind::Nan => chunk.actions[mid] = f64::NAN,
            FaultKind::Inf => chunk.actions[mid] = f64::INFINITY,
            // The first action jumps from mid-chunk on (a joint with room for it).
            FaultKind::Jump => chunk
                .actions
                .iter_mut()
                .skip(mid)
                .step_by(chunk.action_dim.max(1))
                .for_each(|a| *a += JUMP),
            _ => {}
        }
        Ok(chunk)
    }
}

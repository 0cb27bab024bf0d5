//! Real-time chunking's control side: what is still to be executed of the running chunk,
//! aligned to the next observation, and the inference delay in steps from the measured
//! latencies. The policy turns it into guidance (`policy::rtc`); the executor, time alignment
//! and the governor stay in charge of what is commanded.

use std::collections::VecDeque;

use crate::chunk::{ActionChunk, ChunkPrefix};
use crate::time::MonoTime;

/// Chunks kept for lookup: the running one is among the latest few produced.
const KEPT_CHUNKS: usize = 4;
/// Latencies the delay estimate looks at.
const KEPT_LATENCIES: usize = 10;

pub(crate) struct RtcPlanner {
    execution_horizon: usize,
    fixed_delay: Option<usize>,
    /// Latencies of the first chunks, which include warm-up, are not used.
    warmup: usize,
    seen: usize,
    chunks: VecDeque<(u64, ActionChunk)>,
    latencies_s: VecDeque<f64>,
}

impl RtcPlanner {
    pub(crate) fn new(execution_horizon: usize, fixed_delay: Option<usize>, warmup: usize) -> Self {
        RtcPlanner {
            execution_horizon,
            fixed_delay,
            warmup,
            seen: 0,
            chunks: VecDeque::with_capacity(KEPT_CHUNKS),
            latencies_s: VecDeque::with_capacity(KEPT_LATENCIES),
        }
    }

    /// A chunk handed to the control thread as `seq`, `latency_s` after its observation.
    pub(crate) fn record(&mut self, seq: u64, chunk: &ActionChunk, latency_s: f64) {
        if self.chunks.len() == KEPT_CHUNKS {
            self.chunks.pop_front();
        }
        self.chunks.push_back((seq, chunk.clone()));
        self.seen += 1;
        if self.seen > self.warmup && latency_s.is_finite() {
            if self.latencies_s.len() == KEPT_LATENCIES {
                self.latencies_s.pop_front();
            }
            self.latencies_s.push_back(latency_s.max(0.0));
        }
    }

    /// The largest recent latency, in steps of `period_s`, rounded up. Before any latency
    /// past warm-up is known, 0.
    pub(crate) fn delay_steps(&self, period_s: f64) -> usize {
        if let Some(d) = self.fixed_delay {
            return d;
        }
        let worst = self.latencies_s.iter().copied().fold(0.0f64, f64::max);
        // A hair below a whole step is that step, not the next one.
        (worst / period_s - 1e-9).ceil().max(0.0) as usize
    }

    /// The leftover of chunk `running` for an observation at `stamp`: row `i` is the old plan
    /// at `stamp + i * period` (linear between its steps), up to its last step. `None` when
    /// the chunk is unknown or already over.
    pub(crate) fn prefix(&self, running: u64, stamp: MonoTime) -> Option<ChunkPrefix> {
        let (_, c) = self.chunks.iter().rev().find(|(s, _)| *s == running)?;
        let (p, dim, steps) = (c.step_period_s, c.action_dim, c.steps());
        if steps < 2 || !(p > 0.0) {
            return None;
        }
        let offset = stamp.seconds_since(c.obs_stamp) / p;
        let last = (steps - 1) as f64;
        let mut actions = Vec::new();
        let mut i = 0usize;
        while offset + i as f64 <= last + 1e-9 {
            let k = (offset + i as f64).clamp(0.0, last);
            let lo = (k.floor() as usize).min(steps - 2);
            let f = k - lo as f64;
            let (a, b) = (c.step(lo), c.step(lo + 1));
            actions.extend(a.iter().zip(b).map(|(a, b)| a + f * (b - a)));
            i += 1;
        }
        if actions.is_empty() {
            return None;
        }
        let left = actions.len() / dim;
        Some(ChunkPrefix {
            actions,
            action_dim: dim,
            inference_delay: self.delay_steps(p).min(left),
            execution_horizon: self.execution_horizon.min(left),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk(stamp: MonoTime, steps: usize) -> ActionChunk {
        ActionChunk {
            obs_stamp: stamp,
            step_period_s: 0.02,
            action_dim: 2,
            actions: (0..steps).flat_map(|i| [i as f64, -(i as f64)]).collect(),
            model: None,
        }
    }

    #[test]
    fn leftover_is_the_old_plan_at_the_new_steps() {
        let t0 = MonoTime::now();
        let mut p = RtcPlanner::new(10, None, 1);
        p.record(1, &chunk(t0, 50), 0.5);
        p.record(2, &chunk(t0.offset_seconds(0.1), 50), 0.061);
        // Chunk 2 started 0.1 s after t0; an observation 0.3 s after that is 15 steps in.
        let l = p.prefix(2, t0.offset_seconds(0.4)).unwrap();
        assert_eq!(l.steps(), 35);
        let near = |a: &[f64], b: [f64; 2]| a.iter().zip(b).all(|(a, b)| (a - b).abs() < 1e-6);
        assert!(
            near(&l.actions[..2], [15.0, -15.0]),
            "{:?}",
            &l.actions[..2]
        );
        assert!(
            near(&l.actions[68..], [49.0, -49.0]),
            "{:?}",
            &l.actions[68..]
        );
        // 61 ms at 20 ms steps is 4 steps; the warm-up chunk's 0.5 s is not counted.
        assert_eq!(l.inference_delay, 4);
        assert_eq!(l.execution_horizon, 10);
        // Between steps: interpolated.
        let l = p.prefix(2, t0.offset_seconds(0.41)).unwrap();
        assert!((l.actions[0] - 15.5).abs() < 1e-9, "{:?}", &l.actions[..2]);
        assert_eq!(l.steps(), 34);
    }

    #[test]
    fn unknown_or_finished_chunks_give_no_leftover() {
        let t0 = MonoTime::now();
        let mut p = RtcPlanner::new(10, Some(3), 0);
        p.record(7, &chunk(t0, 10), 0.01);
        assert!(p.prefix(6, t0).is_none());
        assert!(p.prefix(7, t0.offset_seconds(0.5)).is_none());
        // Near its end: the horizon and the delay are cut to what is left.
        let l = p.prefix(7, t0.offset_seconds(0.16)).unwrap();
        assert_eq!(
            (l.steps(), l.execution_horizon, l.inference_delay),
            (2, 2, 2)
        );
        // A fixed delay wins over the measured one.
        assert_eq!(p.delay_steps(0.02), 3);
    }

    #[test]
    fn delay_is_the_largest_recent_latency_rounded_up() {
        let t0 = MonoTime::now();
        let mut p = RtcPlanner::new(10, None, 0);
        assert_eq!(p.delay_steps(0.02), 0);
        for (i, l) in [0.03, 0.07, 0.02].into_iter().enumerate() {
            p.record(i as u64, &chunk(t0, 50), l);
        }
        assert_eq!(p.delay_steps(0.02), 4);
        // Only the latest ten count.
        for i in 0..10 {
            p.record(10 + i, &chunk(t0, 50), 0.021);
        }
        assert_eq!(p.delay_steps(0.02), 2);
        assert_eq!(p.delay_steps(0.0105), 2);
    }
}

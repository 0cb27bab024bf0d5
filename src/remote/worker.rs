//! `pi0d serve`'s model thread: requests in arrival order, batched where several wait, each
//! answered on its own channel.

use std::sync::mpsc;
use std::time::{Duration, Instant};

use rand::SeedableRng;
use rand_distr::{Distribution, StandardNormal};
use tokio::sync::oneshot;

use super::refusal::Refusal;
use super::request::Request as Observation;
use crate::observation::CameraFrame;
use crate::policy::pi0::pipeline::Pi0Pipeline;

/// What the inference thread answers.
pub(super) struct Inferred {
    pub(crate) actions: Vec<Vec<f32>>,
    pub(crate) infer_ms: f64,
    pub(crate) prefix_ms: f64,
    pub(crate) steps_ms: f64,
    /// Requests run together with this one (itself included).
    pub(crate) batch: usize,
}

pub(super) struct Job {
    pub(crate) obs: Observation,
    pub(crate) reply: oneshot::Sender<Result<Inferred, Refusal>>,
}

/// The model's thread: requests in arrival order; those waiting when the model is free (and,
/// with a `window`, those arriving within it), up to `max_batch`, run as one batch; each gets
/// its own answer.
pub(super) fn infer_loop(
    mut pipeline: Pi0Pipeline,
    jobs: mpsc::Receiver<Job>,
    seed: u64,
    max_batch: usize,
    window: Duration,
    rtc: crate::config::RtcSettings,
) {
    use crate::policy::pi0::pipeline::BatchItem;
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let n = pipeline.arch.chunk * pipeline.arch.action_dim;
    while let Ok(first) = jobs.recv() {
        // Those already waiting join at once (requests queue up while the model runs); with
        // a window, the first waits that long for more.
        let mut batch = vec![first];
        let until = Instant::now() + window;
        while batch.len() < max_batch {
            let next = if window.is_zero() {
                jobs.try_recv().ok()
            } else {
                jobs.recv_timeout(until.saturating_duration_since(Instant::now()))
                    .ok()
            };
            match next {
                Some(j) => batch.push(j),
                None => break,
            }
        }
        // A leftover the model cannot be guided with fails that request alone.
        let mut kept = Vec::with_capacity(batch.len());
        let mut guidance = Vec::with_capacity(batch.len());
        for j in batch {
            match j
                .obs
                .rtc
                .as_ref()
                .map(|p| pipeline.conditioning(rtc, p, &j.obs.state))
                .transpose()
            {
                Ok(g) => {
                    kept.push(j);
                    guidance.push(g);
                }
                Err(e) => {
                    let _ = j.reply.send(Err(Refusal::Guidance(e)));
                }
            }
        }
        let mut batch = kept;
        if batch.is_empty() {
            continue;
        }
        let noises: Vec<Vec<f32>> = batch
            .iter_mut()
            .map(|j| {
                j.obs
                    .noise
                    .take()
                    .unwrap_or_else(|| (0..n).map(|_| StandardNormal.sample(&mut rng)).collect())
            })
            .collect();
        let refs: Vec<Vec<Option<&CameraFrame>>> = batch
            .iter()
            .map(|j| j.obs.frames.iter().map(Option::as_ref).collect())
            .collect();
        let items: Vec<BatchItem> = batch
            .iter()
            .zip(&refs)
            .zip(&noises)
            .zip(&guidance)
            .map(|(((j, frames), noise), guidance)| BatchItem {
                frames,
                state: &j.obs.state,
                task: &j.obs.prompt,
                noise,
                rtc: guidance.as_ref(),
            })
            .collect();
        let start = Instant::now();
        // A panic in the model answers these requests and leaves the server up.
        let results =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| pipeline.run_batch(&items)));
        let infer_ms = start.elapsed().as_secs_f64() * 1e3;
        drop(items);
        let size = batch.len();
        match results {
            Ok(results) => {
                for (job, r) in batch.into_iter().zip(results) {
                    let answer = r
                        .map(|(actions, t)| Inferred {
                            actions,
                            infer_ms,
                            prefix_ms: t.prefix_ms,
                            steps_ms: t.steps_ms,
                            batch: size,
                        })
                        .map_err(Refusal::Model);
                    let _ = job.reply.send(answer);
                }
            }
            Err(_) => {
                for job in batch {
                    let _ = job.reply.send(Err(Refusal::ModelPanicked));
                }
            }
        }
    }
}

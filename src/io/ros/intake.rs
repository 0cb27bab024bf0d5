//! Taking samples from subscriptions without letting any of them end the thread: each take
//! (deserialization) runs under `log::guarded`, refusals are logged rate-limited and counted.
//! Shared by the ROS thread and the camera thread.

use std::fmt::Display;

use super::decode::InputError;
use super::log::{guarded, Fault, RateLimitedLog, TopicId, WarnKind};
use super::transport::Take;

/// Samples taken from one reader per poll at most: a reader that kept failing on one sample
/// (or a flood) must not keep the loop from the command.
pub(super) const MAX_TAKES_PER_POLL: usize = 256;

/// The log of refusals and their counts.
pub(super) struct Report {
    pub(crate) log: RateLimitedLog,
    pub(crate) rejected: u64,
    pub(crate) faults: u64,
}

impl Report {
    pub(crate) fn new(log: RateLimitedLog) -> Report {
        Report {
            log,
            rejected: 0,
            faults: 0,
        }
    }

    pub(crate) fn refuse(&mut self, topic: TopicId, e: &InputError) {
        self.rejected += 1;
        self.log.warn(topic, WarnKind::Input(e.kind()), e);
    }

    pub(crate) fn fault(&mut self, topic: TopicId, f: &Fault) {
        self.rejected += 1;
        self.faults += 1;
        self.log.warn(topic, WarnKind::DecoderFault, f);
    }

    pub(crate) fn warn(&mut self, topic: TopicId, kind: WarnKind, message: &dyn Display) {
        self.log.warn(topic, kind, message);
    }
}

pub(super) enum Taken<M> {
    Sample(M),
    /// A sample was there but did not deserialize (reported).
    Failed,
    Empty,
}

pub(super) fn take<M>(sub: &dyn Take<M>, topic: TopicId, report: &mut Report) -> Taken<M> {
    match guarded(|| sub.take_next()) {
        Ok(Ok(Some(m))) => Taken::Sample(m),
        Ok(Ok(None)) => Taken::Empty,
        Ok(Err(e)) => {
            report.rejected += 1;
            report.warn(
                topic,
                WarnKind::Undecodable,
                &format_args!("undecodable sample: {}", crate::errors::Chain(&e)),
            );
            Taken::Failed
        }
        Err(f) => {
            report.fault(topic, &f);
            Taken::Failed
        }
    }
}

/// Hands each waiting sample of `sub` (a bounded number) to `each`.
pub(super) fn drain<M>(
    sub: &dyn Take<M>,
    topic: TopicId,
    report: &mut Report,
    mut each: impl FnMut(M, &mut Report),
) {
    for _ in 0..MAX_TAKES_PER_POLL {
        match take(sub, topic, report) {
            Taken::Sample(m) => each(m, report),
            Taken::Failed => {}
            Taken::Empty => break,
        }
    }
}

/// The newest sample waiting on `sub`; older ones are dropped undecoded.
pub(super) fn newest<M>(sub: &dyn Take<M>, topic: TopicId, report: &mut Report) -> Option<M> {
    let mut newest = None;
    drain(sub, topic, report, |m, _| newest = Some(m));
    newest
}

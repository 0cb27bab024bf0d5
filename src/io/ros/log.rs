//! What the ROS thread says about its inputs, and how it survives a decoder that panics.
//!
//! Every line a message from outside causes (a refusal, and the events a peer triggers: an
//! e-stop pressed, a reset requested, a prompt set) is rate-limited per topic and kind, not per
//! text: reasons carry values (sizes, stamps) that differ from sample to sample, and a sender
//! repeating one thing must print one line per interval and hold one entry, however the values
//! vary. What is held back is counted (`telemetry::log_lines_suppressed`) and printed with the
//! next line of its kind.

use std::collections::HashMap;
use std::fmt::{Display, Write};
use std::time::{Duration, Instant};

use super::decode::InputErrorKind;

/// What a warning is about; with its topic, the key it is rate-limited by.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum WarnKind {
    /// A sample decoded but was refused.
    Input(InputErrorKind),
    /// A sample that does not deserialize (malformed CDR).
    Undecodable,
    /// Decoding a sample panicked; the sample was refused.
    DecoderFault,
    /// A sender's stamps are off from pi0d's clock.
    ClockSkew,
    PublishFailed,
    /// The receiver of a command refused it (an action server refusing goals, or silent).
    CommandRefused,
    ReplyFailed,
    BadRequest,
    /// An e-stop message pressing it.
    EstopPressed,
    /// A reset requested (topic or service).
    ResetRequested,
    /// A task prompt taken.
    PromptSet,
    /// Another publisher on a command topic of pi0d's, or another node with its name.
    Others,
}

/// A topic (or service) the log knows, by its index among those registered.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct TopicId(usize);

/// What became of one warning.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Printed, with the count of the same warning suppressed since the last print.
    Printed {
        suppressed: u64,
    },
    Suppressed,
}

struct Entry {
    /// `None` before the first print.
    last_print: Option<Instant>,
    suppressed: u64,
    /// The newest text of the warning, printed with the count of those suppressed.
    latest: String,
}

/// Bytes of a warning's text kept.
const MAX_TEXT: usize = 512;

/// Entries kept at most (topics x kinds is small; this only bounds a misuse).
const MAX_ENTRIES: usize = 256;

/// One warning per topic and kind per interval, with the count of those suppressed.
pub(crate) struct RateLimitedLog {
    every: Duration,
    topics: Vec<String>,
    entries: HashMap<(TopicId, WarnKind), Entry>,
}

impl RateLimitedLog {
    pub(crate) fn new(every: Duration) -> RateLimitedLog {
        RateLimitedLog {
            every,
            topics: Vec::new(),
            entries: HashMap::new(),
        }
    }

    /// The id of `name`, registered on first use.
    pub(crate) fn topic(&mut self, name: &str) -> TopicId {
        match self.topics.iter().position(|t| t == name) {
            Some(i) => TopicId(i),
            None => {
                self.topics.push(name.to_string());
                TopicId(self.topics.len() - 1)
            }
        }
    }

    pub(crate) fn topic_name(&self, topic: TopicId) -> &str {
        self.topics.get(topic.0).map_or("?", |t| t.as_str())
    }

    pub(crate) fn warn(
        &mut self,
        topic: TopicId,
        kind: WarnKind,
        message: &dyn Display,
    ) -> Verdict {
        let verdict = self.warn_at(Instant::now(), topic, kind, message);
        if let Verdict::Printed { suppressed } = verdict {
            self.print(topic, kind, suppressed);
        }
        verdict
    }

    /// Records a warning at `now`; says whether it is to be printed (and does not print it).
    pub(crate) fn warn_at(
        &mut self,
        now: Instant,
        topic: TopicId,
        kind: WarnKind,
        message: &dyn Display,
    ) -> Verdict {
        if !self.entries.contains_key(&(topic, kind)) && self.entries.len() >= MAX_ENTRIES {
            // Forget the entry printed longest ago.
            if let Some(oldest) = self
                .entries
                .iter()
                .min_by_key(|(_, e)| e.last_print)
                .map(|(k, _)| *k)
            {
                self.entries.remove(&oldest);
            }
        }
        let every = self.every;
        let entry = self.entries.entry((topic, kind)).or_insert_with(|| Entry {
            last_print: None,
            suppressed: 0,
            latest: String::new(),
        });
        entry.latest.clear();
        let _ = write!(entry.latest, "{message}");
        // One line per warning: a library's error text may hold newlines, a sender's anything.
        if entry.latest.contains(char::is_control) {
            let mut clean = String::with_capacity(entry.latest.len() + 8);
            for c in entry.latest.chars() {
                if c.is_control() {
                    clean.extend(c.escape_default());
                } else {
                    clean.push(c);
                }
            }
            entry.latest = clean;
        }
        if entry.latest.len() > MAX_TEXT {
            let mut cut = MAX_TEXT;
            while !entry.latest.is_char_boundary(cut) {
                cut -= 1;
            }
            entry.latest.truncate(cut);
            entry.latest.push('…');
        }
        if entry
            .last_print
            .is_none_or(|last| now.duration_since(last) >= every)
        {
            let suppressed = entry.suppressed;
            entry.last_print = Some(now);
            entry.suppressed = 0;
            Verdict::Printed { suppressed }
        } else {
            entry.suppressed += 1;
            crate::telemetry::note_log_lines_suppressed(1);
            Verdict::Suppressed
        }
    }

    /// Prints the warnings suppressed over a whole interval that no newer one has reported
    /// (a burst followed by silence is still counted). Returns how many lines it printed.
    pub(crate) fn flush(&mut self) -> usize {
        let now = Instant::now();
        let every = self.every;
        let due: Vec<(TopicId, WarnKind, u64)> = self
            .entries
            .iter_mut()
            .filter(|(_, e)| {
                e.suppressed > 0 && e.last_print.is_none_or(|l| now.duration_since(l) >= every)
            })
            .map(|((t, k), e)| {
                let n = e.suppressed;
                e.suppressed = 0;
                e.last_print = Some(now);
                (*t, *k, n)
            })
            .collect();
        for (topic, kind, suppressed) in &due {
            self.print(*topic, *kind, *suppressed);
        }
        due.len()
    }

    /// Warnings kept (one per topic and kind seen).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.entries.len()
    }

    fn print(&self, topic: TopicId, kind: WarnKind, suppressed: u64) {
        let reason = self
            .entries
            .get(&(topic, kind))
            .map_or("", |e| e.latest.as_str());
        let topic = self.topic_name(topic);
        match kind {
            WarnKind::DecoderFault => {
                tracing::error!(topic, %reason, suppressed, "input refused")
            }
            WarnKind::Input(_) | WarnKind::Undecodable => {
                tracing::warn!(topic, %reason, suppressed, "input rejected")
            }
            WarnKind::ClockSkew => tracing::warn!(topic, %reason, suppressed, "clock skew"),
            WarnKind::CommandRefused => {
                tracing::warn!(topic, %reason, suppressed, "commands not taken")
            }
            WarnKind::PublishFailed => {
                tracing::warn!(topic, %reason, suppressed, "publish failed")
            }
            WarnKind::ReplyFailed | WarnKind::BadRequest => {
                tracing::warn!(topic, %reason, suppressed, "service")
            }
            WarnKind::EstopPressed => tracing::warn!(topic, suppressed, "e-stop pressed"),
            WarnKind::ResetRequested => tracing::info!(topic, suppressed, "reset requested"),
            WarnKind::Others => {
                tracing::warn!(topic, %reason, suppressed, "someone else on pi0d's names")
            }
            WarnKind::PromptSet => {
                tracing::info!(topic, prompt = %reason, suppressed, "task prompt")
            }
        }
    }
}

/// A decoder that panicked, with its panic message.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Fault(pub(crate) String);

impl Display for Fault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "decoder fault: {}", self.0)
    }
}

/// Runs one sample's decoding; a panic in it becomes a `Fault` instead of ending the thread.
/// Decoders mutate only their own state, and what a faulted one leaves is not used as a sample.
pub(crate) fn guarded<T>(decode: impl FnOnce() -> T) -> Result<T, Fault> {
    // `caught` keeps the process's panic hook quiet: the fault is reported here, rate-limited.
    crate::panics::caught(decode).map_err(|p| Fault(super::decode::shown(&p.message)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn when_one_warning_repeats_with_different_values_expect_one_line_per_interval_and_one_entry() {
        let mut log = RateLimitedLog::new(Duration::from_secs(1));
        let topic = log.topic("/camera/image_raw");
        let kind = WarnKind::Input(InputErrorKind::ImageSize);
        let t0 = Instant::now();
        let mut printed = Vec::new();
        // 10 000 warnings over 10 s, each naming a different size.
        for i in 0..10_000u64 {
            let at = t0 + Duration::from_millis(i);
            let v = log.warn_at(at, topic, kind, &format_args!("data has {i} bytes"));
            if let Verdict::Printed { suppressed } = v {
                printed.push((i, suppressed));
            }
            assert_eq!(log.len(), 1);
        }
        assert_eq!(printed.len(), 10, "{printed:?}");
        assert_eq!(printed[0], (0, 0));
        assert!(printed[1..].iter().all(|(_, n)| *n == 999), "{printed:?}");
        // Another topic or kind is its own line.
        let other = log.topic("/joint_states");
        assert_eq!(log.topic("/camera/image_raw"), topic);
        let v = log.warn_at(t0, other, kind, &"x");
        assert_eq!(v, Verdict::Printed { suppressed: 0 });
        let v = log.warn_at(t0, topic, WarnKind::DecoderFault, &"x");
        assert_eq!(v, Verdict::Printed { suppressed: 0 });
        assert_eq!(log.len(), 3);
    }

    #[test]
    fn when_warning_text_is_huge_or_multiline_expect_one_short_line() {
        let mut log = RateLimitedLog::new(Duration::from_secs(1));
        let topic = log.topic("/t");
        log.warn_at(
            Instant::now(),
            topic,
            WarnKind::Undecodable,
            &"é".repeat(10_000),
        );
        let e = &log.entries[&(topic, WarnKind::Undecodable)];
        assert!(e.latest.len() <= MAX_TEXT + 3);
        let text = "found 0\n\u{1b}[2J";
        log.warn_at(Instant::now(), topic, WarnKind::BadRequest, &text);
        let e = &log.entries[&(topic, WarnKind::BadRequest)];
        assert_eq!(e.latest, "found 0\\n\\u{1b}[2J");
    }

    #[test]
    fn when_many_topics_warn_expect_entries_bounded() {
        let mut log = RateLimitedLog::new(Duration::from_secs(1));
        for i in 0..MAX_ENTRIES + 50 {
            let t = log.topic(&format!("/t{i}"));
            log.warn_at(Instant::now(), t, WarnKind::Undecodable, &i);
        }
        assert_eq!(log.len(), MAX_ENTRIES);
    }

    #[test]
    fn when_decoder_panics_expect_fault_with_its_message() {
        let f = guarded(|| -> u32 { panic!("chunk size must be non-zero") }).unwrap_err();
        assert_eq!(
            f.to_string(),
            "decoder fault: `chunk size must be non-zero`"
        );
        let f = guarded(|| -> u32 { std::panic::panic_any(7u8) }).unwrap_err();
        assert!(f.0.contains("without a message"), "{f:?}");
        assert_eq!(guarded(|| 5), Ok(5));
    }
}

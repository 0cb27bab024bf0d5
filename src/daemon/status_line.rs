//! The live status line's text: a pure function of the numbers, the width it must fit and the
//! control period, so that a narrow terminal loses the least important fields, never the
//! time, the rate or the state, and jitter and overruns are judged against the configured rate.

use std::time::Duration;

/// Jitter up to this share of the control period is ordinary scheduling noise; beyond it a
/// tick's commands arrive noticeably late for the rate the arm was configured for.
const JITTER_HIGH_SHARE: f64 = 0.1;

/// The width used when stderr is not a terminal (a journal, a file).
pub(crate) const DEFAULT_WIDTH: usize = 100;

/// What one status line reports.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct StatusFields {
    /// Seconds since the start.
    pub t: f64,
    /// Ticks per second since the last line.
    pub rate_hz: f64,
    /// Ticks since the start.
    pub ticks: u64,
    /// The worst tick jitter since the last line, and over the run, us.
    pub jitter_max_us: u64,
    pub jitter_run_us: u64,
    pub overruns: u64,
    pub latency_ms: f64,
    pub infer_ms: f64,
    /// The mode, and what it waits for.
    pub state: String,
    pub chunks: u64,
    pub rejected: u64,
    pub safety_events: u64,
    /// What the arm is doing ("at rest", "moving: ...").
    pub motion: String,
    /// The remote policy server's round trip (ms) and whether it is connected.
    pub server: Option<(f64, bool)>,
    /// How the simulator's task is going ("target 4: 23 mm off, reached 2 of 3"); empty
    /// without one.
    pub task: String,
}

/// A field of the line, in the order shown.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Field {
    Time,
    Rate,
    Jitter,
    JitterRun,
    Overruns,
    Latency,
    Infer,
    State,
    Chunks,
    Safety,
    Motion,
    Server,
    Task,
}

/// Shown left to right.
const ORDER: [Field; 13] = [
    Field::Time,
    Field::Rate,
    Field::Jitter,
    Field::JitterRun,
    Field::Overruns,
    Field::Latency,
    Field::Infer,
    Field::State,
    Field::Task,
    Field::Chunks,
    Field::Safety,
    Field::Motion,
    Field::Server,
];

/// Dropped first to last while the line is too wide; time, rate and state always stay (the
/// task's progress last of the rest: it is what a person watching the demo looks for).
const DROP_ORDER: [Field; 10] = [
    Field::JitterRun,
    Field::Infer,
    Field::Latency,
    Field::Server,
    Field::Chunks,
    Field::Motion,
    Field::Safety,
    Field::Overruns,
    Field::Jitter,
    Field::Task,
];

/// "5 ms", "3.33 ms", "500 us".
fn period_text(period: Duration) -> String {
    let ms = period.as_secs_f64() * 1e3;
    if ms >= 1.0 {
        let s = format!("{ms:.2}");
        format!("{} ms", s.trim_end_matches('0').trim_end_matches('.'))
    } else {
        format!("{} us", period.as_micros())
    }
}

fn field_text(f: Field, s: &StatusFields, period: Duration) -> String {
    match f {
        Field::Time => format!("{:>7.1}s", s.t),
        Field::Rate => format!("{:6.1} Hz", s.rate_hz),
        Field::Jitter => {
            let high = s.jitter_max_us as f64 > period.as_secs_f64() * 1e6 * JITTER_HIGH_SHARE;
            if high {
                format!(
                    "jitter max {} us (high: {} period)",
                    s.jitter_max_us,
                    period_text(period)
                )
            } else {
                format!("jitter max {} us ok", s.jitter_max_us)
            }
        }
        Field::JitterRun => format!("jitter run max {} us", s.jitter_run_us),
        Field::Overruns => match s.overruns {
            0 => "overruns 0 ok".to_string(),
            n => format!(
                "overruns {n} (high: {:.2}% of {} ticks at {} period)",
                100.0 * n as f64 / s.ticks.max(1) as f64,
                s.ticks,
                period_text(period)
            ),
        },
        Field::Latency => format!("latency {:.1} ms", s.latency_ms),
        Field::Infer => format!("infer {:.1} ms", s.infer_ms),
        Field::State => s.state.clone(),
        Field::Chunks => format!("chunks {} ({} rejected)", s.chunks, s.rejected),
        Field::Safety => format!("safety events {}", s.safety_events),
        Field::Motion => s.motion.clone(),
        Field::Task => s.task.clone(),
        Field::Server => match s.server {
            Some((rtt, up)) => format!("server rtt {rtt:.1} ms{}", if up { "" } else { " (down)" }),
            None => String::new(),
        },
    }
}

/// The line for `s`, at most `width` characters when time, rate and state fit in it (`tags`,
/// a dry run or scaled limits, always lead it); the least important fields go first.
pub(crate) fn status_text(tags: &str, s: &StatusFields, width: usize, period: Duration) -> String {
    let parts: Vec<(Field, String)> = ORDER
        .iter()
        .map(|&f| (f, field_text(f, s, period)))
        .filter(|(_, t)| !t.is_empty())
        .collect();
    let join = |shown: &[&(Field, String)]| {
        let body: Vec<&str> = shown.iter().map(|(_, t)| t.as_str()).collect();
        format!("{tags}{}", body.join(" | "))
    };
    let mut shown: Vec<&(Field, String)> = parts.iter().collect();
    let mut line = join(&shown);
    for drop in DROP_ORDER {
        if line.chars().count() <= width {
            break;
        }
        shown.retain(|(f, _)| *f != drop);
        line = join(&shown);
    }
    line
}

/// The terminal's width when stderr is one, else `DEFAULT_WIDTH`. One column is left free: a
/// line that fills the last column wraps on some terminals before the `\r` returns.
pub(crate) fn stderr_width(tty: bool) -> usize {
    if !tty {
        return DEFAULT_WIDTH;
    }
    // SAFETY: TIOCGWINSZ writes a `winsize` into the struct it is given, nothing else.
    let mut ws: libc::winsize = unsafe { std::mem::zeroed() };
    let ok = unsafe { libc::ioctl(libc::STDERR_FILENO, libc::TIOCGWINSZ, &mut ws) } == 0;
    if ok && ws.ws_col > 1 {
        usize::from(ws.ws_col) - 1
    } else {
        DEFAULT_WIDTH
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PERIOD: Duration = Duration::from_millis(5);

    fn busy() -> StatusFields {
        StatusFields {
            t: 12.5,
            rate_hz: 200.0,
            ticks: 2500,
            jitter_max_us: 120,
            jitter_run_us: 24023,
            overruns: 0,
            latency_ms: 81.2,
            infer_ms: 64.0,
            state: "running".into(),
            chunks: 31,
            rejected: 1,
            safety_events: 0,
            motion: "moving: elbow 0.42 rad/s (13% of its limit)".into(),
            server: Some((12.3, true)),
            task: String::new(),
        }
    }

    #[test]
    fn when_the_width_is_ample_expect_every_field() {
        let line = status_text("", &busy(), 400, PERIOD);
        for part in [
            "12.5s",
            "200.0 Hz",
            "jitter max 120 us ok",
            "jitter run max 24023 us",
            "overruns 0 ok",
            "latency 81.2 ms",
            "infer 64.0 ms",
            "running",
            "chunks 31 (1 rejected)",
            "safety events 0",
            "moving: elbow",
            "server rtt 12.3 ms",
        ] {
            assert!(line.contains(part), "{part:?} missing from {line:?}");
        }
    }

    #[test]
    fn when_the_width_is_100_expect_the_line_within_it_and_the_least_important_fields_dropped() {
        let line = status_text("", &busy(), 100, PERIOD);
        assert!(line.chars().count() <= 100, "{} chars: {line}", line.len());
        // Kept: time, rate, state, jitter, overruns.
        for part in [
            "12.5s",
            "200.0 Hz | ",
            "running",
            "jitter max 120 us",
            "overruns 0",
        ] {
            assert!(line.contains(part), "{part:?} missing from {line:?}");
        }
        // Dropped first: the run's jitter and the inference time.
        assert!(!line.contains("jitter run"), "{line}");
        assert!(!line.contains("infer "), "{line}");
    }

    #[test]
    fn when_the_terminal_narrows_expect_fields_dropped_in_order_and_never_time_rate_or_state() {
        let wide = status_text("", &busy(), 400, PERIOD);
        let mut last = wide.chars().count();
        for width in (10..400).rev() {
            let line = status_text("", &busy(), width, PERIOD);
            let n = line.chars().count();
            assert!(
                n <= last,
                "width {width}: longer than at a wider width: {line}"
            );
            last = n;
            for part in ["12.5s", "200.0 Hz", "running"] {
                assert!(
                    line.contains(part),
                    "width {width}: {part:?} dropped: {line}"
                );
            }
        }
        // The safety events outlive the motion, which outlives the chunk counts.
        let line = status_text("", &busy(), 90, PERIOD);
        assert!(line.contains("safety events"), "{line}");
        assert!(!line.contains("chunks"), "{line}");
    }

    #[test]
    fn when_tags_are_given_expect_them_leading_at_any_width() {
        let line = status_text("limits x0.25 | ", &busy(), 20, PERIOD);
        assert!(line.starts_with("limits x0.25 | "), "{line}");
        assert!(line.contains(" Hz | "), "{line}");
    }

    #[test]
    fn when_jitter_exceeds_a_tenth_of_the_period_expect_it_marked_high_with_the_period() {
        let mut f = busy();
        f.jitter_max_us = 24023;
        let line = status_text("", &f, 400, PERIOD);
        assert!(
            line.contains("jitter max 24023 us (high: 5 ms period)"),
            "{line}"
        );
        // 500 us is exactly a tenth of 5 ms: still ok; 501 is not.
        f.jitter_max_us = 500;
        assert!(status_text("", &f, 400, PERIOD).contains("jitter max 500 us ok"));
        f.jitter_max_us = 501;
        let line = status_text("", &f, 400, Duration::from_micros(3333));
        assert!(
            line.contains("jitter max 501 us (high: 3.33 ms period)"),
            "{line}"
        );
    }

    #[test]
    fn when_ticks_overran_expect_their_share_of_the_ticks_and_the_period() {
        let mut f = busy();
        f.overruns = 5;
        let line = status_text("", &f, 400, PERIOD);
        assert!(
            line.contains("overruns 5 (high: 0.20% of 2500 ticks at 5 ms period)"),
            "{line}"
        );
    }

    #[test]
    fn when_the_server_is_down_expect_it_said() {
        let mut f = busy();
        f.server = Some((0.0, false));
        assert!(status_text("", &f, 400, PERIOD).contains("server rtt 0.0 ms (down)"));
        f.server = None;
        assert!(!status_text("", &f, 400, PERIOD).contains("server"));
    }

    #[test]
    fn when_a_task_runs_expect_its_progress_kept_after_everything_but_time_rate_and_state() {
        let mut f = busy();
        f.task = "target 4: 23 mm off, reached 2 of 3".into();
        assert!(status_text("", &f, 400, PERIOD)
            .contains("running | target 4: 23 mm off, reached 2 of 3 | chunks"));
        let line = status_text("", &f, 100, PERIOD);
        assert!(line.chars().count() <= 100, "{line}");
        assert!(
            line.contains("target 4: 23 mm off, reached 2 of 3"),
            "{line}"
        );
        // At a width that leaves room for one more field than time, rate and state: the task.
        let bare = status_text(
            "",
            &StatusFields {
                task: String::new(),
                ..f.clone()
            },
            0,
            PERIOD,
        );
        let width = bare.chars().count() + " | target 4: 23 mm off, reached 2 of 3".len();
        let line = status_text("", &f, width, PERIOD);
        assert!(
            line.ends_with("running | target 4: 23 mm off, reached 2 of 3"),
            "{line}"
        );
        assert!(!line.contains("jitter"), "{line}");
    }

    #[test]
    fn when_stderr_is_not_a_terminal_expect_100_columns() {
        assert_eq!(stderr_width(false), 100);
    }
}

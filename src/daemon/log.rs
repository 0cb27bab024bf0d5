//! Output that can never kill the daemon. Logging goes to stderr through a writer that, when a
//! write fails (a closed pipe, a restarted journald, a full disk), drops the stream and counts
//! what was lost instead of panicking; the count goes into the summary. User-facing output
//! (`check`, `export`) goes through `say`, which ignores a closed stdout (`| head -1`).

use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

static STDERR_BROKEN: AtomicBool = AtomicBool::new(false);
/// A terminal status line is on screen without its newline: a log line first clears it.
static STATUS_OPEN: AtomicBool = AtomicBool::new(false);

/// Draws the terminal status line (`\r`, no newline) so that the next log line clears it
/// instead of being glued onto it.
pub(crate) fn write_status(line: &str) {
    let line = crate::outside::inert(line, &[]).to_string();
    write_stderr(format!("\r{line}\x1b[K").as_bytes());
    STATUS_OPEN.store(true, Ordering::Relaxed);
}

/// Ends the status line (a newline), if one is on screen.
pub(crate) fn close_status() {
    if STATUS_OPEN.swap(false, Ordering::Relaxed) {
        write_stderr(b"\n");
    }
}
static LOST_LINES: AtomicU64 = AtomicU64::new(0);

/// Log lines (and status lines) that could not be written since start-up.
pub(crate) fn lost_lines() -> u64 {
    LOST_LINES.load(Ordering::Relaxed)
}

/// Writes `bytes` to stderr unless it failed before; never panics.
pub(crate) fn write_stderr(bytes: &[u8]) {
    if STDERR_BROKEN.load(Ordering::Relaxed) {
        LOST_LINES.fetch_add(1, Ordering::Relaxed);
        return;
    }
    let mut err = std::io::stderr().lock();
    if err.write_all(bytes).and_then(|()| err.flush()).is_err() {
        STDERR_BROKEN.store(true, Ordering::Relaxed);
        LOST_LINES.fetch_add(1, Ordering::Relaxed);
    }
}

/// A line to stderr (messages at the binary edge, the status line).
pub fn tell(line: &str) {
    close_status();
    // Whatever outside text went into the line reaches the terminal inert.
    let line = crate::outside::inert(line, &['\n', '\t']).to_string();
    let mut buf = String::with_capacity(line.len() + 1);
    buf.push_str(&line);
    buf.push('\n');
    write_stderr(buf.as_bytes());
}

/// A line to stdout; a closed stdout is ignored (the reader went away, e.g. `| head -1`).
pub fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let line = crate::outside::inert(line, &['\n', '\t']).to_string();
    let _ = writeln!(out, "{line}").and_then(|()| out.flush());
}

/// The text log's fields (the message first, then `name=value`), each made inert: a log line
/// is one line on the terminal whatever text went into its fields.
struct InertFields;

impl<'w> tracing_subscriber::fmt::FormatFields<'w> for InertFields {
    fn format_fields<R: tracing_subscriber::field::RecordFields>(
        &self,
        mut writer: tracing_subscriber::fmt::format::Writer<'w>,
        fields: R,
    ) -> std::fmt::Result {
        let mut visit = InertVisitor {
            writer: &mut writer,
            first: true,
            result: Ok(()),
        };
        fields.record(&mut visit);
        visit.result
    }
}

struct InertVisitor<'a, 'w> {
    writer: &'a mut tracing_subscriber::fmt::format::Writer<'w>,
    first: bool,
    result: std::fmt::Result,
}

impl tracing::field::Visit for InertVisitor<'_, '_> {
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        if field.name() == "message" {
            self.record_debug(field, &format_args!("{value}"));
        } else {
            self.record_debug(field, &value);
        }
    }

    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        // The `log` crate's records carry their origin as `log.*` fields: not shown.
        if self.result.is_err() || field.name().starts_with("log.") {
            return;
        }
        let text = format!("{value:?}");
        let text = crate::outside::inert(&text, &[]);
        let sep = if self.first { "" } else { " " };
        self.first = false;
        self.result = if field.name() == "message" {
            write!(self.writer, "{sep}{text}")
        } else {
            write!(self.writer, "{sep}{}={text}", field.name())
        };
    }
}

/// The tracing writer: each event is buffered whole and written with one call.
pub(crate) struct SafeStderr;

impl Write for SafeStderr {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if STATUS_OPEN.swap(false, Ordering::Relaxed) {
            // Clear the status line; it is drawn again at the next interval.
            write_stderr(b"\r\x1b[K");
        }
        write_stderr(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for SafeStderr {
    type Writer = SafeStderr;
    fn make_writer(&'a self) -> SafeStderr {
        SafeStderr
    }
}

/// Crates whose INFO and WARN lines are protocol detail, not the operator's business (RustDDS
/// warns on every message to a reader without locators; the CDR decoder on every malformed
/// string a peer sends): shown from ERROR on, and not at all once the middleware is torn down,
/// unless `RUST_LOG` names them. Whatever they print is also rate-limited (`ThirdPartyLimit`).
const THIRD_PARTY: [&str; 4] = ["rustdds", "ros2_client", "zenoh", "cdr_encoding"];

/// Lines a dependency may print per window before the rest of the window is counted instead:
/// a line a peer can cause once per message must not reach the journal at the peer's rate.
const THIRD_PARTY_LINES: u32 = 20;
const THIRD_PARTY_WINDOW: std::time::Duration = std::time::Duration::from_secs(10);

/// pi0d's own code that logs once per connection or request of a remote peer (`pi0d serve`):
/// each of its log lines (call sites) is held to the dependencies' budget too.
const PEER_FACING: [&str; 1] = ["pi0d::remote"];

/// What a line's budget is kept by: its dependency, or its peer-facing call site.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Budget {
    /// `THIRD_PARTY`'s index.
    Crate(usize),
    /// The call site's metadata address.
    Site(usize),
}

/// Per budget: the current window's start and the lines printed in it.
struct ThirdPartyLimit {
    windows: std::sync::Mutex<Vec<(Budget, Option<std::time::Instant>, u32)>>,
}

impl ThirdPartyLimit {
    const fn new() -> ThirdPartyLimit {
        ThirdPartyLimit {
            windows: std::sync::Mutex::new(Vec::new()),
        }
    }

    /// Whether a line of `target` from call site `site` may print at `now` (lines of pi0d's
    /// own code that no peer drives always may).
    fn admit(&self, target: &str, site: usize, now: std::time::Instant) -> bool {
        let budget = if PEER_FACING.iter().any(|c| target.starts_with(c)) {
            Budget::Site(site)
        } else if let Some(k) = THIRD_PARTY.iter().position(|c| target.starts_with(c)) {
            Budget::Crate(k)
        } else {
            return true;
        };
        let Ok(mut windows) = self.windows.lock() else {
            return true;
        };
        let i = match windows.iter().position(|(b, _, _)| *b == budget) {
            Some(i) => i,
            None => {
                windows.push((budget, None, 0));
                windows.len() - 1
            }
        };
        let (_, start, printed) = &mut windows[i];
        Self::spend(start, printed, now)
    }

    /// One line from a window's budget, if any is left (else the line is counted).
    fn spend(
        start: &mut Option<std::time::Instant>,
        printed: &mut u32,
        now: std::time::Instant,
    ) -> bool {
        if start.is_none_or(|s| now.duration_since(s) >= THIRD_PARTY_WINDOW) {
            *start = Some(now);
            *printed = 0;
        }
        if *printed < THIRD_PARTY_LINES {
            *printed += 1;
            true
        } else {
            crate::telemetry::note_log_lines_suppressed(1);
            false
        }
    }
}

static THIRD_PARTY_LIMIT: ThirdPartyLimit = ThirdPartyLimit::new();

/// Whether stderr is the journal's stream (systemd sets `JOURNAL_STREAM` to its device and
/// inode; a child whose stderr was redirected inherits the variable but not the stream).
fn stderr_is_journal() -> bool {
    let Some((dev, ino)) = std::env::var("JOURNAL_STREAM").ok().and_then(|v| {
        let (d, i) = v.split_once(':')?;
        Some((d.parse::<u64>().ok()?, i.parse::<u64>().ok()?))
    }) else {
        return false;
    };
    use std::os::fd::AsFd;
    use std::os::unix::fs::MetadataExt;
    let Ok(meta) = std::io::stderr()
        .as_fd()
        .try_clone_to_owned()
        .and_then(|fd| std::fs::File::from(fd).metadata())
    else {
        return false;
    };
    meta.dev() == dev && meta.ino() == ino
}

/// Installs the `tracing` subscriber (filter from `RUST_LOG`, default `info`; the `log` crate's
/// records too). Under systemd (stderr is the journal) events go natively to journald with
/// their fields (`PI0D_MODE`, `PI0D_SAFETY_EVENT`, `PI0D_JOINT`, `PI0D_CHUNK_SEQ`, ...) and
/// the priority of their level; otherwise as text to stderr. The text writer's own
/// write-error reports are off: they are printed with `eprintln!`, which panics on a closed
/// stderr.
pub fn init() {
    use tracing_subscriber::filter::{filter_fn, FilterExt};
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::Layer;

    let spec = std::env::var("RUST_LOG").ok();
    let mut filter = spec
        .as_deref()
        .and_then(|s| tracing_subscriber::EnvFilter::try_new(s).ok())
        .unwrap_or_else(|| tracing_subscriber::EnvFilter::new("info"));
    // The crates the user did not ask about.
    let quiet: Vec<&'static str> = THIRD_PARTY
        .into_iter()
        .filter(|c| !spec.as_deref().is_some_and(|s| s.contains(c)))
        .collect();
    for krate in &quiet {
        if let Ok(d) = format!("{krate}=error").parse() {
            filter = filter.add_directive(d);
        }
    }
    let teardown = filter_fn(move |meta| {
        !(crate::io::ros::teardown::tearing_down()
            && quiet.iter().any(|k| meta.target().starts_with(k)))
    });
    // Last: only what would print counts against the dependencies' budget.
    // (DEBUG and TRACE lines are the operator's choice, asked for by RUST_LOG: not limited.)
    let limit = filter_fn(|meta| {
        !meta.is_event()
            || *meta.level() > tracing::Level::INFO
            || THIRD_PARTY_LIMIT.admit(
                meta.target(),
                std::ptr::from_ref(meta) as usize,
                std::time::Instant::now(),
            )
    });
    let filter = filter.and(teardown).and(limit);
    let mut journal_error = None;
    if stderr_is_journal() {
        match tracing_journald::layer() {
            Ok(j) => {
                let j = j
                    .with_syslog_identifier("pi0d".into())
                    .with_field_prefix(Some("PI0D".into()));
                let _ = tracing_subscriber::registry()
                    .with(j.with_filter(filter))
                    .try_init();
                return;
            }
            Err(e) => journal_error = Some(e),
        }
    }
    let text = tracing_subscriber::fmt::layer()
        .fmt_fields(InertFields)
        .with_writer(SafeStderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .log_internal_errors(false);
    let _ = tracing_subscriber::registry()
        .with(text.with_filter(filter))
        .try_init();
    if let Some(e) = journal_error {
        tracing::warn!(error = %e, "stderr is the journal, but its socket cannot be reached: logging as text");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    #[test]
    fn when_a_dependency_logs_per_message_expect_its_lines_capped_per_window_and_counted() {
        let limit = ThirdPartyLimit::new();
        let t0 = Instant::now();
        let before = crate::telemetry::log_lines_suppressed();
        // A 10 kHz flood for 25 s of CDR decoder warnings.
        let admitted = (0..250_000u64)
            .filter(|i| {
                limit.admit(
                    "cdr_encoding::cdr_deserializer",
                    0,
                    t0 + Duration::from_micros(i * 100),
                )
            })
            .count();
        assert_eq!(admitted, 3 * THIRD_PARTY_LINES as usize);
        assert!(crate::telemetry::log_lines_suppressed() - before >= 250_000 - 60);
        // pi0d's own lines are not this limit's business, but for those peers drive: each of
        // those call sites has a budget of its own.
        assert!((0..1000).all(|_| limit.admit("pi0d::daemon", 1, t0)));
        let site = |s| {
            (0..1000)
                .filter(|_| limit.admit("pi0d::remote::serve", s, t0))
                .count()
        };
        assert_eq!((site(7), site(8)), (20, 20));
    }
}

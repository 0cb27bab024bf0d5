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
pub fn write_status(line: &str) {
    write_stderr(format!("\r{line}\x1b[K").as_bytes());
    STATUS_OPEN.store(true, Ordering::Relaxed);
}

/// Ends the status line (a newline), if one is on screen.
pub fn close_status() {
    if STATUS_OPEN.swap(false, Ordering::Relaxed) {
        write_stderr(b"\n");
    }
}
static LOST_LINES: AtomicU64 = AtomicU64::new(0);

/// Log lines (and status lines) that could not be written since start-up.
pub fn lost_lines() -> u64 {
    LOST_LINES.load(Ordering::Relaxed)
}

/// Whether stderr failed and is no longer written to.
pub fn stderr_broken() -> bool {
    STDERR_BROKEN.load(Ordering::Relaxed)
}

/// Writes `bytes` to stderr unless it failed before; never panics.
pub fn write_stderr(bytes: &[u8]) {
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
    let mut buf = String::with_capacity(line.len() + 1);
    buf.push_str(line);
    buf.push('\n');
    write_stderr(buf.as_bytes());
}

/// A line to stdout; a closed stdout is ignored (the reader went away, e.g. `| head -1`).
pub fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}").and_then(|()| out.flush());
}

/// The tracing writer: each event is buffered whole and written with one call.
pub struct SafeStderr;

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

/// Installs the `tracing` subscriber (filter from `RUST_LOG`, default `info`). Its own
/// write-error reports are off: they are printed with `eprintln!`, which panics on a closed
/// stderr.
pub fn init() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_writer(SafeStderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_env_filter(filter)
        .log_internal_errors(false)
        .try_init();
}

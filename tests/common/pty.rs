//! Running the real binary on a pseudo-terminal, as an operator's terminal runs it: what the
//! terminal receives (stdout and stderr, colours and status lines included) is read back as
//! bytes, so that a test can tell what a hostile text would have done to the screen.

use std::io::Read;
use std::os::fd::{FromRawFd, OwnedFd};
use std::process::{Command, ExitStatus, Stdio};

/// What the terminal received and how the command ended.
pub struct Screen {
    pub status: ExitStatus,
    pub bytes: Vec<u8>,
}

impl Screen {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.bytes).into_owned()
    }

    /// The text with its colours (SGR sequences, `ESC [ digits m`) taken out, for reading what
    /// the lines say.
    pub fn plain(&self) -> String {
        let text = self.text();
        let mut out = String::with_capacity(text.len());
        let mut rest = text.as_str();
        while let Some(at) = rest.find("\x1b[") {
            out.push_str(&rest[..at]);
            let after = &rest[at + 2..];
            let params = after
                .find(|c: char| !(c.is_ascii_digit() || c == ';'))
                .unwrap_or(after.len());
            if after[params..].starts_with('m') {
                rest = &after[params + 1..];
            } else {
                out.push_str("\x1b[");
                rest = after;
            }
        }
        out.push_str(rest);
        out
    }

    /// Fails the test when a sequence that changes the terminal beyond a colour reached it
    /// (an operating-system command such as a title, a screen clear, a cursor move), when
    /// `marker` appears other than shown escaped (`\x1b]0;MARKER`), or when more than
    /// `max_bytes` arrived (a long outside text was not cut).
    pub fn assert_inert(&self, marker: &str, max_bytes: usize) {
        let text = self.text();
        for (seq, what) in [
            (
                "\x1b]",
                "an operating-system command (window title, clipboard)",
            ),
            ("\x1b[2J", "a screen clear"),
            ("\x1b[H", "a cursor move"),
            ("\x07", "a bell"),
            ("\u{202e}", "a right-to-left override"),
        ] {
            assert!(
                !text.contains(seq),
                "{what} reached the terminal:\n{}",
                shown(&text)
            );
        }
        let escaped = format!("\\x1b]0;{marker}");
        assert_eq!(
            text.matches(marker).count(),
            text.matches(&escaped).count(),
            "`{marker}` reached the terminal other than escaped:\n{}",
            shown(&text)
        );
        assert!(
            self.bytes.len() <= max_bytes,
            "{} bytes reached the terminal (at most {max_bytes} expected): a long text was not cut",
            self.bytes.len()
        );
    }
}

/// The terminal's bytes for a failure message: escaped, and only the start of a long one.
fn shown(text: &str) -> String {
    let cut: String = text.chars().take(8000).collect();
    cut.escape_debug().to_string()
}

/// Runs `cmd` with stdout and stderr on one pseudo-terminal (stdin empty); kills it after
/// `limit_s`.
pub fn run(mut cmd: Command, limit_s: f64) -> Screen {
    let (mut master, slave) = open();
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::from(slave.try_clone().unwrap()))
        .stderr(Stdio::from(slave))
        .spawn()
        .expect("pi0d starts");
    // The child holds the only ends of the terminal's slave now: reading ends when it exits.
    drop(cmd);
    let reader = std::thread::spawn(move || {
        let mut bytes = Vec::new();
        let mut buf = [0u8; 65536];
        // EIO once every slave end is closed.
        while let Ok(n @ 1..) = master.read(&mut buf) {
            bytes.extend_from_slice(&buf[..n]);
        }
        bytes
    });
    let status = super::procs::wait_for_exit(&mut child, limit_s);
    Screen {
        status,
        bytes: reader.join().unwrap(),
    }
}

/// A pseudo-terminal: its master as a file, its slave's descriptor.
fn open() -> (std::fs::File, OwnedFd) {
    let (mut master, mut slave) = (0, 0);
    // SAFETY: openpty writes two new descriptors; no name, termios or size is passed.
    let r = unsafe {
        libc::openpty(
            &mut master,
            &mut slave,
            std::ptr::null_mut(),
            std::ptr::null(),
            std::ptr::null(),
        )
    };
    assert_eq!(r, 0, "openpty: {}", std::io::Error::last_os_error());
    // SAFETY: both descriptors were just created and are owned by nobody else.
    unsafe {
        libc::fcntl(master, libc::F_SETFD, libc::FD_CLOEXEC);
        libc::fcntl(slave, libc::F_SETFD, libc::FD_CLOEXEC);
        (
            std::fs::File::from_raw_fd(master),
            OwnedFd::from_raw_fd(slave),
        )
    }
}

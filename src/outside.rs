//! Text that came from outside pi0d (a server's metadata, error frames and close reasons, ROS
//! strings, prompts, checkpoint and configuration strings, file names), rendered for a log
//! line or a terminal as data: a control character or escape sequence is shown escaped, never
//! sent to the terminal (a hostile server must not set a title, move the cursor or overwrite
//! pi0d's lines), and a long text is cut with its size said. Every place such text is printed
//! or logged goes through [`text`] (or [`bytes`], [`path`]).

use std::fmt::{self, Write};
use std::path::Path;

/// Bytes of a text shown at most; the rest is counted.
pub const SHOWN_BYTES: usize = 512;
/// Bytes of a line pi0d writes itself ([`inert`]) shown at most: its own lines are far
/// shorter, so only outside text that escaped its own cap can reach this one.
pub const LINE_BYTES: usize = 16 * 1024;

/// `text` as it may be shown: see the module's documentation.
pub fn text(text: &str) -> Shown<'_> {
    bytes(text.as_bytes())
}

/// As [`text`], for bytes that may not be UTF-8 (an invalid byte is shown as `\xNN`).
pub fn bytes(bytes: &[u8]) -> Shown<'_> {
    Shown {
        bytes,
        cap: SHOWN_BYTES,
        keep: &[],
    }
}

/// A file name as it may be shown (a Unix path is bytes, not necessarily UTF-8).
pub fn path(path: &Path) -> Shown<'_> {
    use std::os::unix::ffi::OsStrExt;
    bytes(path.as_os_str().as_bytes())
}

/// Outside text, displayed escaped and capped.
#[derive(Clone, Copy)]
pub struct Shown<'a> {
    bytes: &'a [u8],
    cap: usize,
    /// Controls shown as themselves (newlines and tabs in a line of pi0d's own).
    keep: &'static [char],
}

impl Shown<'_> {
    /// At most `cap` bytes shown (a narrower place: a status line, a metric label).
    pub fn cap(self, cap: usize) -> Self {
        Shown { cap, ..self }
    }
}

/// Whether `c` may reach a terminal as itself. Controls (C0, DEL, C1) start escape sequences
/// or move the cursor; the bidirectional overrides and invisible formatting characters make a
/// line read other than it is; line and paragraph separators break it. A backslash stays:
/// rendering is idempotent (text shown once and logged again is shown the same).
fn shown_as_is(c: char) -> bool {
    !(c.is_control()
        || matches!(c,
            '\u{061C}'
            | '\u{200B}'..='\u{200F}'
            | '\u{2028}'..='\u{202E}'
            | '\u{2060}'..='\u{2069}'
            | '\u{FEFF}'
            | '\u{FFF9}'..='\u{FFFB}'))
}

fn escape(f: &mut fmt::Formatter<'_>, c: char) -> fmt::Result {
    match c {
        '\n' => f.write_str("\\n"),
        '\r' => f.write_str("\\r"),
        '\t' => f.write_str("\\t"),
        c if (c as u32) < 0x80 => write!(f, "\\x{:02x}", c as u32),
        c => write!(f, "\\u{{{:x}}}", c as u32),
    }
}

impl fmt::Display for Shown<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let total = self.bytes.len();
        // Cut at a character boundary at most `cap` bytes in (a cut character is left out).
        let mut shown = &self.bytes[..total.min(self.cap)];
        if shown.len() < total {
            let valid = match std::str::from_utf8(shown) {
                Ok(_) => shown.len(),
                Err(e) if e.error_len().is_none() => e.valid_up_to(),
                Err(_) => shown.len(),
            };
            shown = &shown[..valid];
        }
        for chunk in shown.utf8_chunks() {
            for c in chunk.valid().chars() {
                if shown_as_is(c) || self.keep.contains(&c) {
                    f.write_char(c)?;
                } else {
                    escape(f, c)?;
                }
            }
            for b in chunk.invalid() {
                write!(f, "\\x{b:02x}")?;
            }
        }
        if shown.len() < total {
            write!(f, "... {total} bytes, first {} shown", shown.len())?;
        }
        Ok(())
    }
}

/// A line pi0d writes itself (a log line, `check`'s output) made inert at the sink, whatever
/// text went into it: as [`text`], with `keep` (newlines, tabs where a line of pi0d's own
/// has them) shown as themselves, and capped at [`LINE_BYTES`].
pub fn inert<'a>(line: &'a str, keep: &'static [char]) -> Shown<'a> {
    Shown {
        bytes: line.as_bytes(),
        cap: LINE_BYTES,
        keep,
    }
}

impl fmt::Debug for Shown<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "\"{self}\"")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn when_text_holds_escape_sequences_expect_them_shown_escaped() {
        let hostile = "ok\x1b]0;owned\x07\x1b[2J\r\nfake line\u{9b}31m\u{202e}gnp.exe\\";
        let shown = text(hostile).to_string();
        assert_eq!(
            shown,
            "ok\\x1b]0;owned\\x07\\x1b[2J\\r\\nfake line\\u{9b}31m\\u{202e}gnp.exe\\"
        );
        assert!(shown.chars().all(|c| !c.is_control()));
        // Shown twice is shown once.
        assert_eq!(text(&shown).to_string(), shown);
        assert_eq!(inert(&shown, &[]).to_string(), shown);
    }

    #[test]
    fn when_text_is_printable_expect_it_unchanged() {
        for t in [
            "pick up the cube",
            "把方块放进碗里",
            "joint_1 [rad] = -0.5 (ok)",
        ] {
            assert_eq!(text(t).to_string(), t);
        }
    }

    #[test]
    fn when_text_is_long_expect_it_cut_with_its_size_said() {
        let long = "a".repeat(1 << 20);
        let shown = text(&long).to_string();
        assert_eq!(
            shown,
            format!("{}... 1048576 bytes, first 512 shown", "a".repeat(512))
        );
        // A multi-byte character across the cut is left out whole.
        let wide = format!("{}é{}", "a".repeat(511), "b".repeat(10));
        assert_eq!(
            text(&wide).to_string(),
            format!("{}... 523 bytes, first 511 shown", "a".repeat(511))
        );
        assert_eq!(
            text("abcdef").cap(3).to_string(),
            "abc... 6 bytes, first 3 shown"
        );
    }

    #[test]
    fn when_bytes_are_not_utf8_expect_the_invalid_ones_as_hex() {
        assert_eq!(bytes(b"cam\xff\x1b.png").to_string(), "cam\\xff\\x1b.png");
        assert_eq!(path(Path::new("/tmp/a\nb")).to_string(), "/tmp/a\\nb");
    }

    #[test]
    fn when_a_line_is_made_inert_expect_only_the_kept_controls_left() {
        assert_eq!(inert("a\tb\nc", &['\n', '\t']).to_string(), "a\tb\nc");
        assert_eq!(
            inert("a\tb\nc\x1b[2J", &['\n']).to_string(),
            "a\\tb\nc\\x1b[2J"
        );
        let long = "x".repeat(LINE_BYTES + 1);
        assert!(inert(&long, &[])
            .to_string()
            .ends_with("... 16385 bytes, first 16384 shown"));
    }

    proptest::proptest! {
        /// Whatever the bytes, nothing shown is a control character or a bidirectional
        /// override, and the shown text is bounded.
        #[test]
        fn any_bytes_render_inert_and_bounded(b in proptest::collection::vec(proptest::num::u8::ANY, 0..2000)) {
            let shown = bytes(&b).to_string();
            proptest::prop_assert!(shown.chars().all(shown_as_is));
            // Each byte becomes at most `\u{10ffff}` per 4 bytes or `\xNN` per byte.
            proptest::prop_assert!(shown.len() <= 4 * SHOWN_BYTES + 64);
        }
    }
}

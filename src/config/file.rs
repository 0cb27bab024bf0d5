//! Reading a file a setting or an option names: only a regular file, and only so much of it.
//! A FIFO (or a device) named by mistake would block start-up silently at `read`, and a huge
//! file would be read whole before anything is checked; both are refused at once instead.

use std::io;
use std::path::Path;

/// The largest configuration, parameter or key file read (they are a few kilobytes).
pub(crate) const MAX_TEXT_BYTES: u64 = 4 << 20;

/// Opens `path` without blocking (a FIFO with no writer would block `open` itself), refuses
/// anything but a regular file, and reads at most `max_bytes` of UTF-8 text: the one reader
/// every input file goes through (`crate::files`).
pub(crate) fn read_text(path: &Path, max_bytes: u64) -> io::Result<String> {
    crate::files::read_regular(path, max_bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(name: &str) -> crate::test_dirs::TempDir {
        crate::test_dirs::TempDir::new(&format!("file-{name}"))
    }

    #[test]
    fn when_path_is_fifo_directory_or_too_large_expect_refusal_without_blocking() {
        let d = dir("kinds");
        let fifo = d.join("fifo");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let e = read_text(&fifo, 100).unwrap_err().to_string();
        assert_eq!(e, "is a FIFO, expected a regular file");
        let e = read_text(&d, 100).unwrap_err().to_string();
        assert!(e.contains("a directory"), "{e}");
        let big = d.join("big");
        std::fs::write(&big, "x".repeat(101)).unwrap();
        let e = read_text(&big, 100).unwrap_err().to_string();
        assert_eq!(
            e,
            "is 101 bytes, more than the 100 bytes read from such a file"
        );
        std::fs::write(&big, "ok").unwrap();
        assert_eq!(read_text(&big, 100).unwrap(), "ok");
    }
}

//! Reading a file a setting or an option names: only a regular file, and only so much of it.
//! A FIFO (or a device) named by mistake would block start-up silently at `read`, and a huge
//! file would be read whole before anything is checked; both are refused at once instead.

use std::fs::File;
use std::io::{self, Read};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;

/// The largest configuration, parameter or key file read (they are a few kilobytes).
pub const MAX_TEXT_BYTES: u64 = 4 << 20;

/// Why a path is not something to read: what it is instead.
fn kind_of(t: std::fs::FileType) -> &'static str {
    if t.is_dir() {
        "a directory"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_socket() {
        "a socket"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else {
        "not a regular file"
    }
}

/// Opens `path` without blocking (a FIFO with no writer would block `open` itself), refuses
/// anything but a regular file, and reads at most `max_bytes` of UTF-8 text.
pub fn read_text(path: &Path, max_bytes: u64) -> io::Result<String> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)?;
    let meta = file.metadata()?;
    if !meta.file_type().is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{}, expected a regular file", kind_of(meta.file_type())),
        ));
    }
    if meta.len() > max_bytes {
        return Err(too_large(meta.len(), max_bytes));
    }
    let mut text = String::new();
    // A file that grows while it is read is still cut at the cap.
    (&file as &File)
        .take(max_bytes + 1)
        .read_to_string(&mut text)?;
    if text.len() as u64 > max_bytes {
        return Err(too_large(text.len() as u64, max_bytes));
    }
    Ok(text)
}

fn too_large(len: u64, max: u64) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("{len} bytes, expected at most {max}"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(name: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("pi0d-file-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn when_path_is_fifo_directory_or_too_large_expect_refusal_without_blocking() {
        let d = dir("kinds");
        let fifo = d.join("fifo");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let e = read_text(&fifo, 100).unwrap_err().to_string();
        assert_eq!(e, "a FIFO, expected a regular file");
        let e = read_text(&d, 100).unwrap_err().to_string();
        assert!(e.contains("a directory"), "{e}");
        let big = d.join("big");
        std::fs::write(&big, "x".repeat(101)).unwrap();
        let e = read_text(&big, 100).unwrap_err().to_string();
        assert_eq!(e, "101 bytes, expected at most 100");
        std::fs::write(&big, "ok").unwrap();
        assert_eq!(read_text(&big, 100).unwrap(), "ok");
    }
}

//! Reading a whole input file only when it is a regular file of bounded size: a FIFO, a
//! socket or a device at that path would block the reader (or never end), so it is refused
//! before anything is read.

use std::fs::{File, FileType};
use std::io::{self, Read};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;

/// What a non-regular file is, for messages.
fn kind(t: FileType) -> &'static str {
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

/// Opens `path` without blocking (O_NONBLOCK: opening a FIFO with no writer returns at once),
/// checks on the open file that it is regular and at most `cap` bytes, then reads it as UTF-8.
/// A refusal is an `io::Error` saying what the file is (`InvalidInput`) or that it is too
/// large or not text (`InvalidData`).
pub(crate) fn read_regular(path: &Path, cap: u64) -> io::Result<String> {
    read_open(open_nonblocking(path)?, cap)
}

/// Opens `path` for reading as `read_regular` does (never blocking on a FIFO), for a reader
/// that streams it: anything but a regular file is refused (`InvalidInput`, saying what it is).
pub(crate) fn open_regular(path: &Path) -> io::Result<File> {
    let file = open_nonblocking(path)?;
    regular(&file)?;
    Ok(file)
}

/// A whole binary file (a model, a graph), only when it is a regular file: as large as it
/// is, no more (its size was stated by the file system, not by the file).
pub(crate) fn read_regular_bytes(path: &Path) -> io::Result<Vec<u8>> {
    let file = open_nonblocking(path)?;
    let len = regular(&file)?.len();
    let mut bytes = Vec::with_capacity(usize::try_from(len).unwrap_or(0));
    file.take(len).read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// O_NONBLOCK: opening a FIFO with no writer returns at once (its type is then checked).
fn open_nonblocking(path: &Path) -> io::Result<File> {
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
}

fn regular(file: &File) -> io::Result<std::fs::Metadata> {
    let meta = file.metadata()?;
    if !meta.file_type().is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("is {}, expected a regular file", kind(meta.file_type())),
        ));
    }
    Ok(meta)
}

/// As `read_regular`, on a file already open.
pub(crate) fn read_open(file: File, cap: u64) -> io::Result<String> {
    let meta = regular(&file)?;
    let too_large = |n: u64| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("is {n} bytes, more than the {cap} bytes read from such a file"),
        )
    };
    if meta.len() > cap {
        return Err(too_large(meta.len()));
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    // The file may grow after fstat: never more than the cap.
    file.take(cap + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > cap {
        return Err(too_large(bytes.len() as u64));
    }
    String::from_utf8(bytes).map_err(|e| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "is not UTF-8 text (invalid byte at {})",
                e.utf8_error().valid_up_to()
            ),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> crate::test_dirs::TempDir {
        crate::test_dirs::TempDir::new(&format!("files-{name}"))
    }

    #[test]
    fn when_path_is_a_fifo_device_or_directory_expect_refused_without_blocking() {
        let d = scratch("kinds");
        let fifo = d.join("fifo");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: mkfifo on a NUL-terminated path we own.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        // No writer ever opens it: a blocking open would hang this test.
        let e = read_regular(&fifo, 1024).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        assert!(e.to_string().contains("a FIFO"), "{e}");
        let e = read_regular(Path::new("/dev/zero"), 1024).unwrap_err();
        assert!(e.to_string().contains("character device"), "{e}");
        let e = read_regular(&d, 1024).unwrap_err();
        assert!(e.to_string().contains("a directory"), "{e}");
    }

    #[test]
    fn when_file_is_larger_than_the_cap_or_not_utf8_expect_refused() {
        let d = scratch("cap");
        let f = d.join("big");
        std::fs::write(&f, vec![b'a'; 100]).unwrap();
        assert_eq!(read_regular(&f, 100).unwrap().len(), 100);
        let e = read_regular(&f, 99).unwrap_err();
        assert!(e.to_string().contains("100 bytes"), "{e}");
        std::fs::write(&f, [b'a', 0xff]).unwrap();
        let e = read_regular(&f, 100).unwrap_err();
        assert!(e.to_string().contains("not UTF-8"), "{e}");
    }
}

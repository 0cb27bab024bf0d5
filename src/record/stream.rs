//! An MCAP file's records, streamed within fixed bounds whatever the file claims: only a
//! regular file is opened (a FIFO or a device is refused by name before anything is read), a
//! record longer than the bound is refused before it is buffered (mcap's linear reader checks
//! each record's and each chunk's stated length), and the decompressed bytes read are bounded
//! by the file's size (a small file that inflates without end is read up to the bound). What
//! `pi0d plot` and calibration from a recording both read through.

use std::io::{BufReader, Read};
use std::path::Path;

use mcap::records::op;
use mcap::sans_io::{LinearReadEvent, LinearReader, LinearReaderOptions};
use mcap::McapError;

/// The bounds of one read.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Bounds {
    /// The longest record read, and the most compressed data buffered for one chunk.
    pub(crate) record_bytes: usize,
    /// Decompressed bytes read at most: this many...
    pub(crate) decoded_floor: u64,
    /// ...or this many times the file's size, if that is more.
    pub(crate) decoded_per_file_byte: u64,
}

impl Default for Bounds {
    fn default() -> Self {
        Bounds {
            // pi0d's largest records are camera frames (JPEG) and chunks: well under this.
            record_bytes: 16 << 20,
            decoded_floor: 1 << 30,
            // pi0d's recordings (zstd) inflate a few times; a file beyond this is a bomb.
            decoded_per_file_byte: 64,
        }
    }
}

/// What the reader of the records says after each.
pub(crate) enum Flow<E> {
    /// Go on.
    Go,
    /// Enough: stop here (not a fault of the file).
    Done,
    /// The record is malformed: the file is read no further.
    Broken(McapError),
    /// The reader refuses the file.
    Fail(E),
}

/// How the streaming ended.
#[derive(Debug)]
pub(crate) enum End {
    /// At the data section's end.
    Complete,
    /// The file ended after a whole record, before its data section did (a killed run).
    Cut,
    /// The reader had enough.
    Done,
    /// A record, a chunk or the file itself is malformed or cut short.
    Broken(McapError),
    /// It inflated past the bound for its size (`bytes`).
    Decoded { bytes: u64 },
}

/// Records read and how the reading ended.
#[derive(Debug)]
pub(crate) struct Streamed {
    pub(crate) records: u64,
    pub(crate) end: End,
}

/// Why nothing could be streamed: the file could not be opened or read, or the reader
/// refused it.
#[derive(Debug)]
pub(crate) enum StreamError<E> {
    Io(std::io::Error),
    Fail(E),
}

/// Streams the records of `path` within `bounds` to `each` (opcode and body), up to the data
/// section's end; the summary section after it is not read.
pub(crate) fn stream<E>(
    path: &Path,
    bounds: Bounds,
    mut each: impl FnMut(u8, &[u8]) -> Flow<E>,
) -> Result<Streamed, StreamError<E>> {
    let file = crate::files::open_regular(path).map_err(StreamError::Io)?;
    let size = file.metadata().map_err(StreamError::Io)?.len();
    let mut src = BufReader::new(file);
    let decoded_max = bounds
        .decoded_floor
        .max(size.saturating_mul(bounds.decoded_per_file_byte));
    let mut reader = LinearReader::new_with_options(
        LinearReaderOptions::default()
            .with_skip_end_magic(true)
            .with_record_length_limit(bounds.record_bytes),
    );
    let (mut records, mut decoded) = (0u64, 0u64);
    let end = loop {
        let Some(event) = reader.next_event() else {
            break End::Cut;
        };
        match event {
            Err(e) => break End::Broken(e),
            Ok(LinearReadEvent::ReadRequest(need)) => {
                let got = loop {
                    match src.read(reader.insert(need)) {
                        Ok(n) => break n,
                        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                        Err(e) => return Err(StreamError::Io(e)),
                    }
                };
                reader.notify_read(got);
            }
            Ok(LinearReadEvent::Record { opcode, data }) => {
                records += 1;
                // The record's opcode and length count too: a flood of empty records is work.
                decoded += data.len() as u64 + 9;
                if decoded > decoded_max {
                    break End::Decoded { bytes: decoded_max };
                }
                if opcode == op::DATA_END {
                    break End::Complete;
                }
                match each(opcode, data) {
                    Flow::Go => {}
                    Flow::Done => break End::Done,
                    Flow::Broken(e) => break End::Broken(e),
                    Flow::Fail(e) => return Err(StreamError::Fail(e)),
                }
            }
        }
    };
    Ok(Streamed { records, end })
}

//! An HTTP request's head, read within a bound: what `pi0d serve` and the metrics endpoint
//! read before they answer.

use tokio::io::{AsyncRead, AsyncReadExt};

/// How reading a request's head ended, with the bytes read.
pub(crate) enum Head {
    /// Up to its blank line, and whatever followed it in the same reads.
    Complete(Vec<u8>),
    /// The client closed first.
    Eof(Vec<u8>),
    /// `cap` bytes came without a blank line.
    TooLarge(Vec<u8>),
}

impl Head {
    /// The bytes read, however it ended.
    pub(crate) fn bytes(self) -> Vec<u8> {
        match self {
            Head::Complete(b) | Head::Eof(b) | Head::TooLarge(b) => b,
        }
    }
}

/// Reads up to the blank line that ends an HTTP request head, at most `cap` bytes. Reads,
/// never peeks: a client that sends a few bytes and closes is seen closing at once.
pub(crate) async fn read_head<S: AsyncRead + Unpin>(
    stream: &mut S,
    cap: usize,
) -> std::io::Result<Head> {
    let mut head = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    loop {
        let room = (cap - head.len()).min(chunk.len());
        let n = stream.read(&mut chunk[..room]).await?;
        if n == 0 {
            return Ok(Head::Eof(head));
        }
        // Only the new bytes (and the 3 before them) can complete the blank line.
        let from = head.len().saturating_sub(3);
        head.extend_from_slice(&chunk[..n]);
        if head[from..].windows(4).any(|w| w == b"\r\n\r\n") {
            return Ok(Head::Complete(head));
        }
        if head.len() >= cap {
            return Ok(Head::TooLarge(head));
        }
    }
}

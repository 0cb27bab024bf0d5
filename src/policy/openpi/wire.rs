//! The byte streams under openpi's websocket client, from the socket up:
//!
//! * `DeadlineTcp`: every read and write waits at most until one deadline (the request's, or
//!   the connection's), so a server trickling a byte at a time cannot stretch a reply past it
//!   (a per-read timeout starts again with every byte);
//! * `Transport`: plain, or TLS for wss:// (feature `tls`), over it;
//! * `Framed`: between the transport and tungstenite, handing tungstenite no byte past the end
//!   of the HTTP handshake or of the websocket frame under way. Nothing of a later frame then
//!   waits unseen in tungstenite's buffer, and it tells whether anything is left of a frame or
//!   a fragmented message: data that no request asked for, or a reply cut off mid-frame.

use std::io::{self, ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::Instant;

/// What a read past the deadline fails with (`ErrorKind::TimedOut`).
#[derive(Debug, thiserror::Error)]
#[error("the deadline passed")]
pub(crate) struct DeadlinePassed;

pub(crate) struct DeadlineTcp {
    tcp: TcpStream,
    deadline: Instant,
    /// Probing for data that waits: reads return `WouldBlock` at once.
    nonblocking: bool,
}

impl DeadlineTcp {
    pub(crate) fn new(tcp: TcpStream, deadline: Instant) -> DeadlineTcp {
        DeadlineTcp {
            tcp,
            deadline,
            nonblocking: false,
        }
    }

    pub(crate) fn set_deadline(&mut self, deadline: Instant) {
        self.deadline = deadline;
    }

    pub(crate) fn set_nonblocking(&mut self, on: bool) -> io::Result<()> {
        self.tcp.set_nonblocking(on)?;
        self.nonblocking = on;
        Ok(())
    }

    /// The time left, set as the socket's timeouts; an error once it is gone.
    fn arm(&self) -> io::Result<()> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::Error::new(ErrorKind::TimedOut, DeadlinePassed));
        }
        self.tcp.set_read_timeout(Some(left))?;
        self.tcp.set_write_timeout(Some(left))
    }

    /// A socket timeout (`WouldBlock` on Unix) is the deadline passing, unless probing.
    fn timed(&self, r: io::Result<usize>) -> io::Result<usize> {
        match r {
            Err(e) if e.kind() == ErrorKind::WouldBlock && !self.nonblocking => {
                Err(io::Error::new(ErrorKind::TimedOut, DeadlinePassed))
            }
            r => r,
        }
    }
}

impl Read for DeadlineTcp {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if !self.nonblocking {
            self.arm()?;
        }
        let r = self.tcp.read(buf);
        self.timed(r)
    }
}

impl Write for DeadlineTcp {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if !self.nonblocking {
            self.arm()?;
        }
        let r = self.tcp.write(buf);
        self.timed(r)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.tcp.flush()
    }
}

/// The socket as is (ws://) or inside TLS (wss://).
pub(crate) enum Transport {
    Plain(DeadlineTcp),
    #[cfg(feature = "tls")]
    Tls(Box<rustls::StreamOwned<rustls::ClientConnection, DeadlineTcp>>),
}

impl Transport {
    pub(crate) fn tcp(&mut self) -> &mut DeadlineTcp {
        match self {
            Transport::Plain(s) => s,
            #[cfg(feature = "tls")]
            Transport::Tls(s) => &mut s.sock,
        }
    }
}

impl Read for Transport {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Transport::Plain(s) => s.read(buf),
            #[cfg(feature = "tls")]
            Transport::Tls(s) => s.read(buf),
        }
    }
}

impl Write for Transport {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Transport::Plain(s) => s.write(buf),
            #[cfg(feature = "tls")]
            Transport::Tls(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Transport::Plain(s) => s.flush(),
            #[cfg(feature = "tls")]
            Transport::Tls(s) => s.flush(),
        }
    }
}

/// Bytes read ahead from the transport at a time.
const READ_AHEAD: usize = 8192;
/// The end of an HTTP response's head.
const HEAD_END: &[u8; 4] = b"\r\n\r\n";

pub(crate) struct Framed<S> {
    inner: S,
    buf: Box<[u8; READ_AHEAD]>,
    start: usize,
    end: usize,
    /// In the HTTP handshake: how much of `HEAD_END` the bytes handed out end with.
    handshake: Option<usize>,
    /// The frame header under way: its bytes so far, and how many it has in all (2 until
    /// the second byte says).
    head: [u8; 14],
    have: usize,
    need: usize,
    /// Payload bytes of the frame under way still to come, and its first byte (FIN, opcode).
    payload_left: u64,
    first: u8,
    /// A data message's first fragment came and its last has not.
    fragmented: bool,
}

impl<S: Read> Framed<S> {
    pub(crate) fn new(inner: S) -> Framed<S> {
        Framed {
            inner,
            buf: Box::new([0; READ_AHEAD]),
            start: 0,
            end: 0,
            handshake: Some(0),
            head: [0; 14],
            have: 0,
            need: 2,
            payload_left: 0,
            first: 0,
            fragmented: false,
        }
    }

    pub(crate) fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Bytes read and not yet handed to tungstenite, or a frame or a fragmented message
    /// begun and not ended. Between requests, anything here came unasked; during a request,
    /// the reply is incomplete.
    pub(crate) fn holds_partial(&self) -> bool {
        self.end > self.start || self.mid_message()
    }

    /// A frame or a fragmented message begun and not ended.
    fn mid_message(&self) -> bool {
        self.have > 0 || self.payload_left > 0 || self.fragmented
    }

    /// How many of the buffered bytes may go now: up to the end of the HTTP head, of the
    /// frame header, or of the payload.
    fn may_hand_out(&mut self, want: usize) -> usize {
        let avail = (self.end - self.start).min(want);
        if let Some(matched) = &mut self.handshake {
            for (i, b) in self.buf[self.start..self.start + avail].iter().enumerate() {
                *matched = if *b == HEAD_END[*matched] {
                    *matched + 1
                } else {
                    usize::from(*b == b'\r')
                };
                if *matched == HEAD_END.len() {
                    self.handshake = None;
                    return i + 1;
                }
            }
            return avail;
        }
        if self.payload_left > 0 {
            return avail.min(usize::try_from(self.payload_left).unwrap_or(usize::MAX));
        }
        avail.min(self.need - self.have)
    }

    /// Follows the frames through `bytes`, just handed out (all header or all payload).
    fn track(&mut self, bytes: &[u8]) {
        if self.payload_left > 0 {
            self.payload_left -= bytes.len() as u64;
            if self.payload_left == 0 {
                self.frame_done();
            }
            return;
        }
        self.head[self.have..self.have + bytes.len()].copy_from_slice(bytes);
        self.have += bytes.len();
        if self.have < 2 {
            return;
        }
        let len7 = self.head[1] & 0x7f;
        let ext = match len7 {
            126 => 2,
            127 => 8,
            _ => 0,
        };
        let mask = if self.head[1] & 0x80 != 0 { 4 } else { 0 };
        self.need = 2 + ext + mask;
        if self.have < self.need {
            return;
        }
        let len = match ext {
            0 => u64::from(len7),
            2 => u64::from(u16::from_be_bytes([self.head[2], self.head[3]])),
            _ => {
                let mut b = [0; 8];
                b.copy_from_slice(&self.head[2..10]);
                u64::from_be_bytes(b)
            }
        };
        self.first = self.head[0];
        self.have = 0;
        self.need = 2;
        self.payload_left = len;
        if len == 0 {
            self.frame_done();
        }
    }

    fn frame_done(&mut self) {
        let fin = self.first & 0x80 != 0;
        match self.first & 0x0f {
            // Text, binary: a message begins, and ends here if FIN.
            1 | 2 => self.fragmented = !fin,
            // Continuation: the last fragment if FIN.
            0 if fin => self.fragmented = false,
            // Control frames come between fragments and change nothing.
            _ => {}
        }
    }
}

impl<S: Read> Read for Framed<S> {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        if out.is_empty() {
            return Ok(0);
        }
        if self.start == self.end {
            let n = self.inner.read(&mut self.buf[..])?;
            if n == 0 {
                return Ok(0);
            }
            (self.start, self.end) = (0, n);
        }
        let framing = self.handshake.is_none();
        let n = self.may_hand_out(out.len());
        out[..n].copy_from_slice(&self.buf[self.start..self.start + n]);
        self.start += n;
        if framing {
            self.track(&out[..n]);
        }
        Ok(n)
    }
}

impl<S: Write> Write for Framed<S> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.inner.write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Hands out at most 7 bytes a read, as a slow socket may.
    struct Dribble(std::io::Cursor<Vec<u8>>);

    impl Read for Dribble {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            let n = buf.len().min(7);
            self.0.read(&mut buf[..n])
        }
    }

    fn frame(first: u8, len: usize) -> Vec<u8> {
        let mut f = vec![first];
        if len < 126 {
            f.push(len as u8);
        } else {
            f.push(126);
            f.extend((len as u16).to_be_bytes());
        }
        f.resize(f.len() + len, 0xab);
        f
    }

    /// Reads from `f` with a large buffer until `n` bytes came, checking that no read
    /// crosses a boundary (the ends of the HTTP head and of each frame, in `ends`).
    fn read_through(f: &mut Framed<Dribble>, n: usize, ends: &[usize], at: &mut usize) {
        let mut buf = [0u8; 4096];
        let stop = *at + n;
        while *at < stop {
            let got = f.read(&mut buf).unwrap();
            assert!(got > 0, "ended early at {at}");
            let crossed = ends.iter().find(|e| *at < **e && *at + got > **e);
            assert!(
                crossed.is_none(),
                "a read from {at} of {got} crossed {crossed:?}"
            );
            *at += got;
        }
    }

    #[test]
    fn when_frames_follow_one_another_expect_no_read_past_one_and_partials_seen() {
        let head = b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n".to_vec();
        let parts = [
            head,
            frame(0x82, 300),               // a reply
            frame(0x89, 1),                 // a ping
            frame(0x02, 5),                 // a fragmented reply: first fragment,
            frame(0x80, 0),                 // an empty last one
            frame(0x82, 40)[..20].to_vec(), // half of another
        ];
        let mut ends = Vec::new();
        let mut total = 0;
        for p in &parts {
            total += p.len();
            ends.push(total);
        }
        let mut f = Framed::new(Dribble(std::io::Cursor::new(parts.concat())));
        let mut at = 0;
        for (i, p) in parts.iter().enumerate() {
            read_through(&mut f, p.len(), &ends, &mut at);
            let partial = match i {
                // Mid-message after the first fragment; mid-frame after the half.
                3 | 5 => true,
                _ => false,
            };
            assert_eq!(f.mid_message(), partial, "after part {i}");
        }
        assert!(f.holds_partial());
        assert_eq!(f.read(&mut [0u8; 64]).unwrap(), 0);
    }
}

//! The endpoint under idle, slow and excess connections, on loopback.

use std::io::{Read, Write};
use std::net::TcpStream;

use super::*;

struct Endpoint {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The endpoint, its connections' deadline `deadline`.
fn endpoint(deadline: Duration) -> Endpoint {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let metrics = Arc::new(Metrics::new(
        Arc::new(LiveStats::default()),
        Arc::new(WorkerStats::default()),
        Arc::new(Blackboard::new(1, "test")),
    ));
    let stop = Arc::new(AtomicBool::new(false));
    let thread = serve_on(listener, metrics, stop.clone(), deadline).unwrap();
    Endpoint {
        addr,
        stop,
        thread: Some(thread),
    }
}

/// A whole scrape: the answer as text.
fn scrape(addr: SocketAddr) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    // Far beyond the server's own deadline: a stuck server fails the test, not a slow host.
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: pi0d\r\n\r\n")
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

/// Whether the server still holds `s` open (nothing to read, no end of stream).
fn held_open(s: &mut TcpStream) -> bool {
    s.set_nonblocking(true).unwrap();
    let mut b = [0u8; 16];
    let open = matches!(s.read(&mut b), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock);
    s.set_nonblocking(false).unwrap();
    open
}

/// Whether the server closed `s` (end of stream or reset) within `within`.
fn closed_within(s: &mut TcpStream, within: Duration) -> bool {
    s.set_read_timeout(Some(within)).unwrap();
    let mut b = [0u8; 16];
    match s.read(&mut b) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => !matches!(
            e.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        ),
    }
}

fn refused(text: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix("pi0d_metrics_connections_refused_total "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no refused count in:\n{text}"))
}

#[test]
fn when_twenty_connections_sit_idle_expect_a_scrape_answered_while_they_are_held() {
    // A deadline no host's delay reaches: the idle ones are held throughout.
    let e = endpoint(Duration::from_secs(600));
    let mut idle: Vec<TcpStream> = (0..20)
        .map(|_| TcpStream::connect(e.addr).unwrap())
        .collect();
    let text = scrape(e.addr);
    assert!(text.starts_with("HTTP/1.1 200 OK"), "{text}");
    assert!(text.contains("pi0d_control_ticks_total"), "{text}");
    assert!(text.trim_end().ends_with("# EOF"), "{text}");
    // Answered while every idle connection was still held: the scrape waited on none of them
    // (a server answering one connection at a time answers it only after their deadlines).
    for (i, s) in idle.iter_mut().enumerate() {
        assert!(
            held_open(s),
            "idle connection {i} was closed before the scrape's answer"
        );
    }
    assert_eq!(refused(&text), 0);
}

#[test]
fn when_more_connections_than_places_arrive_expect_the_oldest_idle_closed_and_counted() {
    let e = endpoint(Duration::from_secs(600));
    let extra = 8;
    // Accepted in the order they connect (the listen queue's).
    let mut idle: Vec<TcpStream> = (0..MAX_CONNECTIONS + extra)
        .map(|_| TcpStream::connect(e.addr).unwrap())
        .collect();
    let text = scrape(e.addr);
    assert!(text.starts_with("HTTP/1.1 200 OK"), "{text}");
    // The `extra` oldest made room for the newest, and one more for the scrape.
    assert_eq!(refused(&text), extra as u64 + 1, "{text}");
    for (i, s) in idle.iter_mut().enumerate().take(extra + 1) {
        assert!(
            closed_within(s, Duration::from_secs(30)),
            "the oldest connection {i} was not closed"
        );
    }
}

#[test]
fn when_a_request_trickles_in_expect_it_closed_at_its_deadline_and_counted() {
    let deadline = Duration::from_secs(1);
    let e = endpoint(deadline);
    let mut slow = TcpStream::connect(e.addr).unwrap();
    let started = Instant::now();
    slow.write_all(b"GET /met").unwrap();
    let writer = {
        let mut w = slow.try_clone().unwrap();
        std::thread::spawn(move || {
            // A byte every 100 ms, never the blank line: the deadline ends it.
            for _ in 0..100 {
                if w.write_all(b"r").is_err() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        })
    };
    assert!(closed_within(&mut slow, Duration::from_secs(30)));
    // Never before its deadline: the server does not cut a connection short.
    assert!(started.elapsed() >= deadline);
    writer.join().unwrap();
    assert_eq!(refused(&scrape(e.addr)), 1);
}

#[test]
fn when_the_path_is_not_metrics_expect_404() {
    let e = endpoint(Duration::from_secs(600));
    let mut s = TcpStream::connect(e.addr).unwrap();
    s.write_all(b"GET /\x1b]0;x HTTP/1.1\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    assert!(out.starts_with("HTTP/1.1 404 Not Found"), "{out}");
}

//! pi0d's openpi client against hostile servers (small websocket servers in this test): a
//! second reply, a reply trickled byte by byte or in 1-byte fragments, a reply or metadata of
//! 150k keys, a chunk of 200,000 steps, a close mid-reply. Each is a typed error naming what
//! went wrong, counted under its kind, with the connection dropped where the reply can no
//! longer be matched to its request; no chunk is ever taken for a request it does not answer.
//! Then, through the binary: SIGTERM during a hostile warm-up stops the daemon within the
//! configured timeouts.

mod common;

use std::io::Write;
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use pi0d::chunk::ActionChunk;
use pi0d::config::OpenpiOptions;
use pi0d::observation::Observation;
use pi0d::policy::openpi::msgpack_numpy::{self, Item, NdArray, Out};
use pi0d::policy::openpi::{OpenpiPolicy, Websocket};
use pi0d::policy::{Policy, PolicyError, RemoteFault};
use tungstenite::{Message, WebSocket};

const STATE_KEY: &str = "observation.state";
/// `policy.chunk_steps` of the client; the servers' chunks have `STEPS`.
const CHUNK_STEPS: usize = 50;
const STEPS: usize = 10;

type Conn = WebSocket<TcpStream>;

/// A server on a loopback port: each connection, after the websocket handshake, goes to
/// `serve` with its index (0, 1, ...) on its own thread.
fn server(serve: impl Fn(usize, Conn) + Send + Sync + 'static) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let serve = Arc::new(serve);
    std::thread::spawn(move || {
        for (i, conn) in listener.incoming().enumerate() {
            let Ok(conn) = conn else { continue };
            // What the server wrote is then on its way at once (no Nagle delay).
            conn.set_nodelay(true).unwrap();
            let serve = serve.clone();
            std::thread::spawn(move || {
                if let Ok(ws) = tungstenite::accept(conn) {
                    serve(i, ws);
                }
            });
        }
    });
    port
}

fn metadata() -> Vec<u8> {
    msgpack_numpy::encode(&Out::Map(vec![(
        "policy".into(),
        Out::Text("hostile".into()),
    )]))
}

/// A reply of `steps` actions of one value each, all `value`.
fn reply(value: f32, steps: usize) -> Vec<u8> {
    msgpack_numpy::encode(&Out::Map(vec![(
        "actions".into(),
        Out::Array(NdArray::f32(vec![steps, 1], &vec![value; steps])),
    )]))
}

/// A map of `n` distinct keys, nil values.
fn many_keys(n: u32) -> Vec<u8> {
    let mut b = Vec::new();
    rmp::encode::write_map_len(&mut b, n).unwrap();
    for i in 0..n {
        rmp::encode::write_str(&mut b, &format!("k{i}")).unwrap();
        rmp::encode::write_nil(&mut b).unwrap();
    }
    b
}

/// A server's websocket frame (unmasked): `first` is FIN and the opcode.
fn frame(first: u8, payload: &[u8]) -> Vec<u8> {
    let mut f = vec![first];
    match payload.len() {
        n @ 0..=125 => f.push(n as u8),
        n @ 126..=0xffff => {
            f.push(126);
            f.extend((n as u16).to_be_bytes());
        }
        n => {
            f.push(127);
            f.extend((n as u64).to_be_bytes());
        }
    }
    f.extend(payload);
    f
}

/// Bytes written as they are, bypassing the websocket (errors: the client is gone).
fn raw(ws: &mut Conn, bytes: &[u8]) -> bool {
    ws.get_mut().write_all(bytes).is_ok()
}

/// The next request's state value; `None` once the client has gone.
fn next_request(ws: &mut Conn) -> Option<f32> {
    loop {
        match ws.read() {
            Ok(Message::Binary(b)) => {
                let items = msgpack_numpy::decode_request(&b).unwrap();
                let state = items.iter().find(|(k, _)| k == STATE_KEY);
                let Some((_, Item::Array(a))) = state else {
                    panic!("no state in the request: {items:?}")
                };
                return Some(a.to_f32()[0]);
            }
            Ok(Message::Close(_)) | Err(_) => return None,
            Ok(_) => {}
        }
    }
}

fn options(port: u16, timeout_s: f64) -> OpenpiOptions {
    OpenpiOptions {
        url: format!("ws://127.0.0.1:{port}"),
        api_key: None,
        ca_file: None,
        connect_timeout_s: timeout_s,
        request_timeout_s: timeout_s,
        reconnect_initial_s: 0.05,
        reconnect_max_s: 0.1,
        images: None,
        state_key: STATE_KEY.into(),
        prompt_key: "prompt".into(),
        extra: Vec::new(),
        image_size: 0,
        action_dim: None,
        max_reply_bytes: 16 << 20,
        zenoh: None,
    }
}

/// The client of one action value, chunks of at most `CHUNK_STEPS`.
fn client(port: u16, timeout_s: f64) -> OpenpiPolicy {
    let opts = options(port, timeout_s);
    let link = Box::new(Websocket::new(&opts).unwrap());
    OpenpiPolicy::with_link(&opts, link, &[], 1, CHUNK_STEPS, 0.02).unwrap()
}

/// The observation of request `k`: its state is `k`, which the servers echo.
fn obs(k: usize) -> Observation {
    Observation {
        state: vec![k as f64],
        prompt: "hold".into(),
        ..Observation::default()
    }
}

fn remote(r: &Result<ActionChunk, PolicyError>) -> (RemoteFault, &str) {
    match r {
        Err(PolicyError::Remote { fault, message }) => (*fault, message),
        other => panic!("expected a policy server error, got {other:?}"),
    }
}

fn connected(p: &OpenpiPolicy) -> bool {
    p.remote_stats().unwrap().connected
}

/// How a server answers request 4 a second time.
#[derive(Clone, Copy, Debug)]
enum Second {
    /// Both replies in one write: they wait together.
    Together,
    /// The reply, and half of another frame with it.
    HalfFrame,
    /// The second reply in a write of its own, after the first.
    Later,
}

#[test]
fn when_a_server_answers_a_request_twice_expect_the_connection_dropped_and_no_chunk_for_another_request(
) {
    for second in [Second::Together, Second::HalfFrame, Second::Later] {
        let (written_tx, written) = mpsc::channel();
        let port = server(move |conn, mut ws| {
            assert!(raw(&mut ws, &frame(0x82, &metadata())));
            while let Some(v) = next_request(&mut ws) {
                let r = frame(0x82, &reply(v, STEPS));
                if conn > 0 || v != 4.0 {
                    if !raw(&mut ws, &r) {
                        return;
                    }
                    continue;
                }
                let _ = match second {
                    Second::Together => raw(&mut ws, &[r.clone(), r].concat()),
                    Second::HalfFrame => raw(&mut ws, &[&r[..], &r[..r.len() / 2]].concat()),
                    Second::Later => raw(&mut ws, &r) && raw(&mut ws, &r),
                };
                let _ = written_tx.send(());
            }
        });
        let mut p = client(port, 2.0);
        p.warm_up(&obs(0)).unwrap();
        for k in 1..=7 {
            if k == 5 {
                // The second reply has been written before request 5 goes.
                written.recv_timeout(Duration::from_secs(10)).unwrap();
            }
            let r = p.infer(&obs(k));
            if k == 5 {
                let (fault, message) = remote(&r);
                assert_eq!(fault, RemoteFault::Unsolicited, "{second:?}: {message}");
                assert!(
                    message.contains("came while no request was in flight"),
                    "{message}"
                );
                assert!(!connected(&p), "{second:?}: the connection is dropped");
                continue;
            }
            // Every chunk is the reply to its own request: never the one before.
            let chunk = r.unwrap_or_else(|e| panic!("{second:?}, request {k}: {e}"));
            assert_eq!(chunk.steps(), STEPS);
            assert!(
                chunk.actions.iter().all(|a| *a == k as f64),
                "{second:?}: request {k} got the chunk of request {}",
                chunk.actions[0]
            );
        }
        let stats = p.remote_stats().unwrap();
        assert!(stats.connected, "{second:?}: reconnected");
        assert_eq!(stats.reconnects, 1, "{second:?}");
    }
}

#[test]
fn when_a_server_sends_pings_and_fragments_between_and_in_replies_expect_every_reply_taken() {
    let port = server(|_, mut ws| {
        assert!(raw(&mut ws, &frame(0x82, &metadata())));
        while let Some(v) = next_request(&mut ws) {
            // A ping before the reply, the reply in three fragments with a ping among them,
            // and a ping after it, which waits for the next request.
            let r = reply(v, STEPS);
            let (a, rest) = r.split_at(5);
            let (b, c) = rest.split_at(7);
            let bytes = [
                frame(0x89, b"1"),
                frame(0x02, a),
                frame(0x00, b),
                frame(0x89, b"2"),
                frame(0x80, c),
                frame(0x89, b"3"),
            ]
            .concat();
            if !raw(&mut ws, &bytes) {
                return;
            }
        }
    });
    let mut p = client(port, 2.0);
    for k in 1..=5 {
        let chunk = p.infer(&obs(k)).unwrap();
        assert!(chunk.actions.iter().all(|a| *a == k as f64));
    }
    let stats = p.remote_stats().unwrap();
    assert!(stats.connected);
    assert_eq!(stats.reconnects, 0);
}

/// How a server trickles its reply.
#[derive(Clone, Copy, Debug)]
enum Trickle {
    /// A byte at a time.
    Bytes,
    /// In 1-byte fragments (continuation frames).
    Fragments,
}

/// Between two pieces of a trickled reply: a reply of ~60 bytes takes seconds.
const TRICKLE_GAP: Duration = Duration::from_millis(50);

#[test]
fn when_a_reply_trickles_in_bytes_or_in_1_byte_fragments_expect_a_timeout_at_the_deadline() {
    for how in [Trickle::Bytes, Trickle::Fragments] {
        let port = server(move |_, mut ws| {
            assert!(raw(&mut ws, &frame(0x82, &metadata())));
            let Some(v) = next_request(&mut ws) else {
                return;
            };
            let r = reply(v, 2);
            let pieces: Vec<Vec<u8>> = match how {
                Trickle::Bytes => frame(0x82, &r).into_iter().map(|b| vec![b]).collect(),
                Trickle::Fragments => r
                    .iter()
                    .enumerate()
                    .map(|(i, b)| {
                        let first = match i {
                            0 => 0x02,
                            i if i == r.len() - 1 => 0x80,
                            _ => 0x00,
                        };
                        frame(first, &[*b])
                    })
                    .collect(),
            };
            for p in pieces {
                if !raw(&mut ws, &p) {
                    return;
                }
                std::thread::sleep(TRICKLE_GAP);
            }
        });
        let timeout_s = 0.3;
        let mut p = client(port, timeout_s);
        p.warm_up(&obs(0)).unwrap();
        let asked = Instant::now();
        let r = p.infer(&obs(1));
        let waited = asked.elapsed();
        let (fault, message) = remote(&r);
        assert_eq!(fault, RemoteFault::Timeout, "{how:?}: {message}");
        assert!(
            message.contains("within policy.openpi.request_timeout_s = 0.3 s"),
            "{message}"
        );
        assert!(!connected(&p), "{how:?}: a timeout drops the connection");
        // The whole reply would take ~60 gaps; the deadline ends it long before (wide margin
        // for a busy host).
        assert!(
            waited < TRICKLE_GAP * 40,
            "{how:?}: the request took {waited:?} with a {timeout_s} s timeout"
        );
    }
}

#[test]
fn when_a_reply_has_150k_keys_or_200k_steps_expect_the_cap_named_and_the_connection_kept() {
    let port = server(|_, mut ws| {
        assert!(raw(&mut ws, &frame(0x82, &metadata())));
        while let Some(v) = next_request(&mut ws) {
            let r = match v as u32 {
                1 => many_keys(150_000),
                2 => reply(v, 200_000),
                _ => reply(v, STEPS),
            };
            if ws.send(Message::Binary(r)).is_err() {
                return;
            }
        }
    });
    let mut p = client(port, 5.0);
    let r = p.infer(&obs(1));
    let (fault, message) = remote(&r);
    assert_eq!(fault, RemoteFault::Malformed, "{message}");
    assert!(
        message.contains("a map of 150000 keys") && message.contains("at most 1024 keys"),
        "{message}"
    );
    let r = p.infer(&obs(2));
    let (fault, message) = remote(&r);
    assert_eq!(fault, RemoteFault::Shape, "{message}");
    assert!(
        message.contains("200000 steps: at most policy.chunk_steps = 50"),
        "{message}"
    );
    // Whole replies, read to their end: the connection still pairs requests and replies.
    assert!(connected(&p));
    let chunk = p.infer(&obs(3)).unwrap();
    assert!(chunk.actions.iter().all(|a| *a == 3.0));
    assert_eq!(p.remote_stats().unwrap().reconnects, 0);
}

#[test]
fn when_the_server_closes_mid_reply_or_before_it_expect_a_closed_connection_said_so() {
    let port = server(|conn, mut ws| {
        assert!(raw(&mut ws, &frame(0x82, &metadata())));
        let Some(v) = next_request(&mut ws) else {
            return;
        };
        if conn == 0 {
            let r = frame(0x82, &reply(v, STEPS));
            let _ = raw(&mut ws, &r[..r.len() / 2]);
        }
        // Dropped: the TCP connection closes without a websocket close.
    });
    let mut p = client(port, 2.0);
    let r = p.infer(&obs(1));
    let (fault, message) = remote(&r);
    assert_eq!(fault, RemoteFault::Closed, "{message}");
    assert!(
        message.contains("closed the connection mid-reply"),
        "{message}"
    );
    assert!(!connected(&p));
    let r = p.infer(&obs(2));
    let (fault, message) = remote(&r);
    assert_eq!(fault, RemoteFault::Closed, "{message}");
    assert!(
        message.contains("closed the connection during the request"),
        "{message}"
    );
}

#[test]
fn when_the_metadata_trickles_or_has_150k_keys_expect_the_warm_up_to_end_in_time_with_the_reason() {
    let port = server(|conn, mut ws| {
        if conn == 0 {
            let _ = raw(&mut ws, &frame(0x82, &many_keys(150_000)));
            std::thread::sleep(Duration::from_secs(5));
            return;
        }
        for b in frame(0x82, &metadata()) {
            if !raw(&mut ws, &[b]) {
                return;
            }
            std::thread::sleep(TRICKLE_GAP);
        }
    });
    let mut p = client(port, 0.3);
    let (fault, message) = warm_up_fault(&mut p);
    assert_eq!(fault, RemoteFault::Malformed, "{message}");
    assert!(
        message.contains("metadata") && message.contains("at most 1024 keys"),
        "{message}"
    );
    let asked = Instant::now();
    let (fault, message) = warm_up_fault(&mut p);
    let waited = asked.elapsed();
    assert_eq!(fault, RemoteFault::Timeout, "{message}");
    assert!(
        message.contains("no metadata frame within policy.openpi.connect_timeout_s = 0.3 s"),
        "{message}"
    );
    assert!(waited < TRICKLE_GAP * 20, "the warm-up took {waited:?}");
    assert!(!connected(&p));
}

fn warm_up_fault(p: &mut OpenpiPolicy) -> (RemoteFault, String) {
    match p.warm_up(&obs(0)) {
        Err(PolicyError::Remote { fault, message }) => (fault, message),
        other => panic!("expected a policy server error, got {other:?}"),
    }
}

/// Through the binary: a server that trickles its metadata forever holds every connection
/// attempt for `connect_timeout_s` and no longer; SIGTERM then stops the daemon within a few
/// of those, with the timeouts counted in the summary and the server shown disconnected.
#[test]
fn when_sigterm_comes_during_a_hostile_warm_up_expect_a_controlled_stop_within_the_timeouts() {
    use common::procs::*;
    use toml::Value;
    let connections = Arc::new(AtomicUsize::new(0));
    let seen = connections.clone();
    let port = server(move |_, mut ws| {
        seen.fetch_add(1, Ordering::SeqCst);
        // A metadata frame of 1000 bytes, a byte every 100 ms.
        if !raw(&mut ws, &[0x82, 126, 0x03, 0xe8]) {
            return;
        }
        while raw(&mut ws, &[0xc0]) {
            std::thread::sleep(Duration::from_millis(100));
        }
    });
    let connect_timeout_s = 0.5;
    let cfg = common::remote_policy_config(
        "openpi",
        &[
            ("url", Value::String(format!("ws://127.0.0.1:{port}"))),
            ("connect_timeout_s", Value::Float(connect_timeout_s)),
            ("request_timeout_s", Value::Float(0.5)),
            ("reconnect_initial_s", Value::Float(0.1)),
            ("reconnect_max_s", Value::Float(0.2)),
        ],
    );
    let _serial = common::SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = common::scratch_dir("openpi-hostile-warm-up");
    let mut run = Watched::start(run_command(&dir, &cfg, 60.0));
    // The warm-up's connection and two of the worker's: the first two have timed out.
    let limit = Instant::now() + Duration::from_secs(30);
    while connections.load(Ordering::SeqCst) < 3 {
        if Instant::now() > limit {
            let _ = run.child.kill();
            panic!(
                "{} connections in 30 s: a connection attempt outlived connect_timeout_s = {connect_timeout_s} s\n{}",
                connections.load(Ordering::SeqCst),
                run.stderr()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let sent = Instant::now();
    send_signal(&run.child, libc::SIGTERM);
    let (status, stderr) = run.finish(20.0);
    let stopped = sent.elapsed();
    assert_eq!(status.code(), Some(0), "{stderr}");
    // A connection attempt or two of connect_timeout_s, and the stop: wide margin.
    assert!(
        stopped < Duration::from_secs_f64(4.0 * connect_timeout_s + 8.0),
        "stopped {stopped:?} after SIGTERM\n{stderr}"
    );
    let s = summary_in(&dir).unwrap_or_else(|| panic!("no summary:\n{stderr}"));
    assert!(
        s["policy_errors_by_kind"]["timeout"].as_u64().unwrap_or(0) >= 1,
        "{s}"
    );
    assert_eq!(s["remote_policy"]["connected"], false, "{s}");
    let last = s["last_policy_error"].as_str().unwrap_or_default();
    assert!(last.contains("connect_timeout_s"), "{last}");
    assert_eq!(s["limit_violations"], 0, "{s}");
}

/// Through the binary: a warm-up that fails is counted under its kind in the summary, like a
/// request's failure. The server answers the warm-up's connection (the first) with a text
/// frame where the metadata belongs (malformed) and never sends metadata on the worker's
/// (timeouts): `malformed_reply` can only be the warm-up's.
#[test]
fn when_the_warm_up_fails_expect_its_kind_counted_in_the_summary() {
    use toml::Value;
    let port = server(move |conn, mut ws| {
        if conn == 0 {
            let _ = ws.send(Message::Text("not metadata".into()));
            return;
        }
        // Held open, silent, until the client gives up on it.
        let _ = ws.read();
    });
    let cfg = common::remote_policy_config(
        "openpi",
        &[
            ("url", Value::String(format!("ws://127.0.0.1:{port}"))),
            ("connect_timeout_s", Value::Float(0.5)),
            ("request_timeout_s", Value::Float(0.5)),
            ("reconnect_initial_s", Value::Float(0.1)),
            ("reconnect_max_s", Value::Float(0.2)),
        ],
    );
    let run = common::run_daemon("openpi-hostile-warm-up-count", &cfg, 2.0);
    // No chunk ever came: the run ends with exit 8 naming the policy's latest error.
    assert_eq!(run.code(), 8, "{}", run.stderr);
    let s = run.summary();
    assert_eq!(s["policy_errors_by_kind"]["malformed_reply"], 1, "{s}");
    assert!(
        run.stderr.contains("policy warm-up failed")
            && run.stderr.contains("expected the metadata frame first"),
        "{}",
        run.stderr
    );
}

//! A fleet over Zenoh (feature `zenoh`): two `pi0d serve --zenoh KEY` processes answer the same
//! key, the robot-side daemon (`policy.backend = "zenoh"`) queries it, and Zenoh's routing
//! picks a server. The server answering is killed (SIGKILL) mid-run: the next query goes to
//! the other, and chunks keep coming within one request timeout (the arm never holds).
//!
//! Then hostile servers (tests/peers/hostile_zenoh_policy.py, Python's eclipse-zenoh): a query
//! answered twice, back to back and 50 ms apart, and two queryables on one key each answering
//! every query: the first reply is the chunk, every later one is dropped and counted. A server
//! that never answers is a timeout; one that answers with an error is a server error. A 200 MB
//! reply against an 8 MiB limit is dropped by Zenoh as it arrives: the daemon's peak memory
//! stays far below it and each such query is a timeout.
//!
//! Last, closed by default: a stranger scouting by multicast with Zenoh's default configuration
//! (tests/peers/zenoh_scout.py) finds neither `pi0d serve --zenoh` nor the daemon's ROS session
//! configured with nothing but an endpoint to connect to; it finds each once a setting allows
//! multicast scouting (which shows the scout would have seen them).
#![cfg(feature = "zenoh")]

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use pi0d::config::openpi::ZenohLinkOptions;
use pi0d::config::OpenpiOptions;
use pi0d::observation::Observation;
use pi0d::policy::openpi::OpenpiPolicy;
use pi0d::policy::{Policy, PolicyError, RemoteFault};
use toml::Value;

const KEY: &str = "pi0d/policy/test-fleet";

/// A server on KEY listening for Zenoh on `port`; its count of answered queries.
fn server(port: u16) -> (Child, Arc<AtomicU64>) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_pi0d"))
        .args(["serve", "--checkpoint"])
        .arg(root().join("models/tiny-pi0"))
        .args(["--listen", "127.0.0.1:0", "--threads", "1", "--zenoh", KEY])
        .args(["--zenoh-listen", &format!("tcp/127.0.0.1:{port}")])
        .env("RUST_LOG", "info,pi0d::remote=debug")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let answered = Arc::new(AtomicU64::new(0));
    let log = BufReader::new(child.stderr.take().unwrap());
    let (count, ready) = (answered.clone(), std::sync::mpsc::channel());
    std::thread::spawn(move || {
        for line in log.lines().map_while(Result::ok) {
            if line.contains("answering Zenoh queries") {
                let _ = ready.0.send(());
            }
            if line.contains("Zenoh query answered") {
                count.fetch_add(1, Ordering::Relaxed);
            }
        }
    });
    ready
        .1
        .recv_timeout(Duration::from_secs(30))
        .expect("the server declares its queryable");
    (child, answered)
}

#[test]
fn when_the_answering_server_is_killed_expect_the_other_to_answer_within_one_timeout() {
    let (pa, pb) = (free_port(), free_port());
    let (mut a, na) = server(pa);
    let (mut b, nb) = server(pb);
    let mut cfg = remote_policy_config(
        "zenoh",
        &[
            ("key", Value::String(KEY.into())),
            (
                "connect",
                Value::Array(vec![
                    Value::String(format!("tcp/127.0.0.1:{pa}")),
                    Value::String(format!("tcp/127.0.0.1:{pb}")),
                ]),
            ),
            ("request_timeout_s", Value::Float(0.4)),
        ],
    );
    cfg["control"]["request_threshold_s"] = Value::Float(0.9);
    // Kill whichever server has been answering once 20 queries were answered (the daemon may
    // wait for another test's run to end before it starts).
    let (na2, nb2) = (na.clone(), nb.clone());
    let (ida, idb) = (a.id() as i32, b.id() as i32);
    let killer = std::thread::spawn(move || {
        let waited = std::time::Instant::now();
        while na2.load(Ordering::Relaxed) + nb2.load(Ordering::Relaxed) < 20
            && waited.elapsed() < Duration::from_secs(120)
        {
            std::thread::sleep(Duration::from_millis(20));
        }
        let (victim, counts) = if na2.load(Ordering::Relaxed) >= nb2.load(Ordering::Relaxed) {
            (ida, "a")
        } else {
            (idb, "b")
        };
        let before = (na2.load(Ordering::Relaxed), nb2.load(Ordering::Relaxed));
        // SAFETY: kill(2) on our own child.
        unsafe {
            libc::kill(victim, libc::SIGKILL);
        }
        (counts, before)
    });
    let run = run_daemon("zenoh-fleet", &cfg, 9.0);
    let (victim, before) = killer.join().unwrap();
    let after = (na.load(Ordering::Relaxed), nb.load(Ordering::Relaxed));
    for c in [&mut a, &mut b] {
        let _ = c.kill();
        let _ = c.wait();
    }
    let s = run.summary();
    assert_eq!(s["limit_violations"], 0, "{s}");
    // The victim had answered; the survivor answered after it died.
    let (killed_before, survivor_gain) = match victim {
        "a" => (before.0, after.1 - before.1),
        _ => (before.1, after.0 - before.0),
    };
    assert!(
        killed_before >= 3,
        "the killed server answered {killed_before}: {s}"
    );
    assert!(
        survivor_gain >= 3,
        "the survivor answered {survivor_gain} after: {s}"
    );
    // Never a hold once running: each chunk came before the last one ran out.
    let transitions = s["transitions"].as_array().unwrap();
    let holds: Vec<_> = transitions
        .iter()
        .skip_while(|t| t["to"] != "running")
        .filter(|t| t["to"] != "running" && t["to"] != "stopping")
        .collect();
    assert!(holds.is_empty(), "held after starting: {holds:?}\n{s}");
    assert!(
        s["policy_errors_by_kind"]["timeout"].as_u64().unwrap_or(0) <= 2,
        "{s}"
    );
}

const HOSTILE_KEY: &str = "pi0d/policy/hostile";

/// A peer process, killed when dropped (also when an assertion fails first).
struct Peer(Child);

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A hostile server (`hostile_zenoh_policy.py --mode MODE ARGS`) listening on `port`, once its
/// queryable is declared.
fn hostile(port: u16, mode: &str, args: &[&str]) -> Peer {
    let mut child = Command::new(peer_python())
        .arg(root().join("tests/peers/hostile_zenoh_policy.py"))
        .args(["--listen", &format!("tcp/127.0.0.1:{port}")])
        .args(["--key", HOSTILE_KEY, "--mode", mode])
        .args(args)
        .stdout(Stdio::piped())
        .spawn()
        .expect("the hostile peer starts");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(
        line.trim(),
        "ready",
        "the hostile peer declares its queryable"
    );
    Peer(child)
}

/// A one-joint client of the hostile key through the peers on `ports`.
fn client(ports: &[u16], timeout_s: f64) -> OpenpiPolicy {
    let opts = OpenpiOptions {
        url: format!("zenoh:{HOSTILE_KEY}"),
        api_key: None,
        ca_file: None,
        connect_timeout_s: timeout_s,
        request_timeout_s: timeout_s,
        reconnect_initial_s: 0.05,
        reconnect_max_s: 0.1,
        images: None,
        state_key: "observation.state".into(),
        prompt_key: "prompt".into(),
        extra: Vec::new(),
        image_size: 0,
        action_dim: None,
        max_reply_bytes: 1 << 20,
        zenoh: Some(ZenohLinkOptions {
            key: HOSTILE_KEY.into(),
            connect: ports.iter().map(|p| format!("tcp/127.0.0.1:{p}")).collect(),
            listen: Vec::new(),
            session_config: None,
            multicast_scouting: false,
        }),
    };
    let mut p = OpenpiPolicy::new(&opts, &[], 1, 50, 0.02).unwrap();
    // The session finds the peers' queryables before the first real query.
    p.warm_up(&obs(0.0)).unwrap();
    std::thread::sleep(Duration::from_millis(500));
    p
}

fn obs(state: f64) -> Observation {
    Observation {
        state: vec![state],
        prompt: "hold".into(),
        ..Observation::default()
    }
}

/// Runs `n` queries with states 1, 2, ...; each chunk's one value per query.
fn values(p: &mut OpenpiPolicy, n: usize) -> Vec<(f64, f64)> {
    (1..=n)
        .map(|k| {
            let state = k as f64;
            let chunk = p
                .infer(&obs(state))
                .unwrap_or_else(|e| panic!("query {k}: {e}"));
            let first = chunk.actions[0];
            assert!(
                chunk.actions.iter().all(|a| *a == first),
                "query {k}: a chunk mixes replies: {:?}",
                chunk.actions
            );
            (state, first)
        })
        .collect()
}

#[test]
fn when_a_server_answers_each_query_twice_expect_the_first_reply_run_and_the_second_counted() {
    for gap in ["0", "0.05"] {
        let port = free_port();
        let peer = hostile(port, "twice", &["--gap-s", gap]);
        let mut p = client(&[port], 2.0);
        let n = 6;
        for (state, got) in values(&mut p, n) {
            // The first reply holds (the state itself); the second would move by 0.5.
            assert_eq!(got, state, "gap {gap} s: a later reply was run");
        }
        // The last query's second reply is on its way.
        std::thread::sleep(Duration::from_millis(300));
        let dropped = p.remote_stats().unwrap().replies_dropped;
        drop(peer);
        assert_eq!(
            dropped, n as u64,
            "gap {gap} s: every second reply dropped and counted"
        );
    }
}

#[test]
fn when_two_queryables_answer_on_one_key_expect_one_reply_per_query_and_the_other_counted() {
    let (pa, pb) = (free_port(), free_port());
    let a = hostile(pa, "value", &["--offset", "0"]);
    let b = hostile(pb, "value", &["--offset", "0.5"]);
    let mut p = client(&[pa, pb], 2.0);
    let n = 8;
    for (state, got) in values(&mut p, n) {
        assert!(got == state || got == state + 0.5, "query {state}: {got}");
    }
    std::thread::sleep(Duration::from_millis(300));
    let dropped = p.remote_stats().unwrap().replies_dropped;
    drop(a);
    drop(b);
    // Both queryables answer each query (neither is complete): one reply runs, one is dropped.
    assert_eq!(dropped, n as u64);
}

fn fault_of(r: Result<pi0d::chunk::ActionChunk, PolicyError>) -> (RemoteFault, String) {
    match r {
        Err(PolicyError::Remote { fault, message }) => (fault, message),
        other => panic!("expected a policy server error, got {other:?}"),
    }
}

#[test]
fn when_a_server_never_answers_or_answers_an_error_expect_a_timeout_and_a_server_error() {
    let port = free_port();
    let peer = hostile(port, "silent", &[]);
    let mut p = client(&[port], 0.3);
    let started = std::time::Instant::now();
    let (fault, message) = fault_of(p.infer(&obs(1.0)));
    assert_eq!(fault, RemoteFault::Timeout, "{message}");
    assert!(
        started.elapsed() >= Duration::from_millis(250),
        "ended before its timeout: {message}"
    );
    drop(peer);
    let port = free_port();
    let peer = hostile(port, "error", &[]);
    let mut p = client(&[port], 2.0);
    let (fault, message) = fault_of(p.infer(&obs(1.0)));
    drop(peer);
    assert_eq!(fault, RemoteFault::ServerError, "{message}");
    assert!(
        message.contains("refused by the hostile server"),
        "{message}"
    );
}

#[test]
fn when_replies_are_200_mb_against_an_8_mib_limit_expect_them_dropped_on_arrival_and_timeouts() {
    let port = free_port();
    let peer = hostile(port, "huge", &["--size-mb", "200", "--steps", "50"]);
    let mut cfg = remote_policy_config(
        "zenoh",
        &[
            ("key", Value::String(HOSTILE_KEY.into())),
            (
                "connect",
                Value::Array(vec![Value::String(format!("tcp/127.0.0.1:{port}"))]),
            ),
            ("request_timeout_s", Value::Float(0.4)),
            ("max_reply_mib", Value::Integer(8)),
        ],
    );
    cfg["control"]["request_threshold_s"] = Value::Float(0.9);
    let run = run_daemon("zenoh-huge-reply", &cfg, 6.0);
    drop(peer);
    let s = run.summary();
    let errors = &s["policy_errors_by_kind"];
    assert!(errors["timeout"].as_u64().unwrap_or(0) >= 2, "{s}");
    for other in ["server_error", "malformed"] {
        assert!(errors.get(other).is_none(), "{other}: {s}");
    }
    assert_eq!(s["chunks_accepted"], 0, "{s}");
    // Zenoh would have held each 200 MB reply whole; its receive limit drops it in pieces.
    let peak = s["peak_rss_mb"].as_f64().unwrap();
    assert!(peak < 120.0, "peak resident memory {peak} MB: {s}");
}

/// Starts `cmd` and returns it with the Zenoh id its log gives after `marker` (`zid=...`).
fn with_zid(mut cmd: Command, marker: &'static str) -> (Peer, String) {
    let mut child = cmd
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("pi0d starts");
    let log = BufReader::new(child.stderr.take().unwrap());
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in log.lines().map_while(Result::ok) {
            if line.contains(marker) {
                if let Some(zid) = line.split("zid=").nth(1) {
                    let _ = tx.send(zid.split_whitespace().next().unwrap_or("").to_string());
                }
            }
        }
    });
    let zid = rx
        .recv_timeout(Duration::from_secs(30))
        .unwrap_or_else(|_| panic!("no \"{marker}\" line with a zid"));
    (Peer(child), zid)
}

fn serve_zenoh(open: bool) -> (Peer, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_pi0d"));
    cmd.args(["serve", "--checkpoint"])
        .arg(root().join("models/tiny-pi0"))
        .args(["--listen", "127.0.0.1:0", "--threads", "1"])
        .args(["--zenoh", "pi0d/policy/exposure"]);
    if open {
        cmd.arg("--zenoh-multicast-scouting");
    }
    with_zid(cmd, "answering Zenoh queries")
}

/// A config on ROS over Zenoh whose session is given an endpoint to connect to and nothing
/// else, or is also allowed to scout by multicast: its directory and path.
fn ros_zenoh_config(name: &str, open: bool) -> (TempDir, std::path::PathBuf) {
    let mut cfg = sim_config();
    cfg["robot"]["io"] = Value::String("ros".into());
    let mut ros = toml::Table::new();
    ros.insert("middleware".into(), Value::String("zenoh".into()));
    ros.insert(
        "zenoh_connect".into(),
        Value::Array(vec![Value::String(format!(
            "tcp/127.0.0.1:{}",
            free_port()
        ))]),
    );
    if open {
        ros.insert("zenoh_multicast_scouting".into(), Value::Boolean(true));
    }
    cfg.insert("ros".into(), Value::Table(ros));
    let dir = scratch_dir(name);
    let path = dir.join("config.toml");
    std::fs::write(&path, toml::to_string(&cfg).unwrap()).unwrap();
    (dir, path)
}

/// `pi0d run` on `ros_zenoh_config`'s config (no peer at the endpoint: the session waits).
fn ros_zenoh(name: &str, open: bool) -> (Peer, String, TempDir) {
    let (dir, path) = ros_zenoh_config(name, open);
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_pi0d"));
    cmd.args(["run", "--config"])
        .arg(&path)
        .args(["--duration", "30"]);
    let (peer, zid) = with_zid(cmd, "Zenoh session for ROS 2");
    (peer, zid, dir)
}

#[test]
fn when_a_stranger_scouts_with_zenohs_defaults_expect_pi0d_found_only_where_a_setting_opens_it() {
    let (_serve_closed, serve_closed) = serve_zenoh(false);
    let (_serve_open, serve_open) = serve_zenoh(true);
    let (_run_closed, run_closed, _dir_closed) = ros_zenoh("exposure-closed", false);
    let (_run_open, run_open, _dir_open) = ros_zenoh("exposure-open", true);
    let out = Command::new(peer_python())
        .arg(root().join("tests/peers/zenoh_scout.py"))
        .args(["--seconds", "3"])
        .output()
        .expect("the scout runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let found: Vec<String> = serde_json::from_slice(&out.stdout).unwrap();
    for (what, zid) in [("pi0d serve", &serve_open), ("pi0d run", &run_open)] {
        assert!(
            found.contains(zid),
            "{what} allowed to scout was not found: {found:?}"
        );
    }
    for (what, zid) in [("pi0d serve", &serve_closed), ("pi0d run", &run_closed)] {
        assert!(
            !found.contains(zid),
            "{what} was found by a stranger: {found:?}"
        );
    }
}

/// One of config/zenoh's example session files, its key paths pointed at `keys` and its
/// listening endpoint at 127.0.0.1:`port`, written to `to`.
fn session_file(example: &str, keys: &std::path::Path, port: u16, to: &std::path::Path) {
    let text = std::fs::read_to_string(root().join("config/zenoh").join(example)).unwrap();
    let text = text
        .replace("/etc/pi0d/tls/", &format!("{}/", keys.display()))
        .replace("tls/0.0.0.0:7447", &format!("tls/127.0.0.1:{port}"));
    std::fs::write(to, text).unwrap();
}

/// What `zenoh_tls_peer.py` saw: whether a link came up, and the reset service's answers.
fn steer(
    port: u16,
    ca: &std::path::Path,
    cert: Option<(&std::path::Path, &std::path::Path)>,
    prompt: &str,
) -> std::process::Child {
    let mut cmd = Command::new(peer_python());
    cmd.arg(root().join("tests/peers/zenoh_tls_peer.py"))
        .args(["--connect", &format!("tls/127.0.0.1:{port}"), "--ca"])
        .arg(ca)
        .args(["--prompt", prompt])
        .stdout(Stdio::piped());
    if let Some((c, k)) = cert {
        cmd.arg("--cert").arg(c).arg("--key").arg(k);
    }
    cmd.spawn().expect("the TLS peer starts")
}

fn steered(child: std::process::Child) -> serde_json::Value {
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    serde_json::from_slice(&out.stdout).unwrap()
}

/// config/zenoh/robot-session.json5 on the daemon's ROS session: mutual TLS and access control
/// by certificate name. A peer with a certificate from another CA gets no link; one from the
/// robot's CA named "intruder" gets a link but is heard on nothing; the robot driver is not
/// heard on the e-stop, reset or prompt; the operator is (its prompt arrives, the reset service
/// answers it).
#[test]
fn when_peers_steer_a_tls_session_with_access_control_expect_only_the_operator_heard() {
    let dir = scratch_dir("zenoh-acl-ros");
    let ca = common::tls::TestCa::new(&dir, "ca");
    for cn in ["pi0d", "operator", "robot-driver", "intruder"] {
        ca.issue(cn);
    }
    let other_dir = dir.join("other");
    std::fs::create_dir_all(&other_dir).unwrap();
    let other = common::tls::TestCa::new(&other_dir, "ca");
    let (stranger_cert, stranger_key) = other.issue("operator");
    let port = free_port();
    let session = dir.join("robot-session.json5");
    session_file("robot-session.json5", &dir, port, &session);
    let mut cfg = sim_config();
    cfg["robot"]["io"] = Value::String("ros".into());
    let mut ros = toml::Table::new();
    ros.insert("middleware".into(), Value::String("zenoh".into()));
    ros.insert(
        "zenoh_config".into(),
        Value::String(session.display().to_string()),
    );
    cfg.insert("ros".into(), Value::Table(ros));
    let path = dir.join("config.toml");
    std::fs::write(&path, toml::to_string(&cfg).unwrap()).unwrap();
    let mut pi0d = Command::new(env!("CARGO_BIN_EXE_pi0d"))
        .args(["run", "--config"])
        .arg(&path)
        .args(["--duration", "12"])
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let log = BufReader::new(pi0d.stderr.take().unwrap());
    let (up_tx, up) = std::sync::mpsc::channel();
    let lines = std::thread::spawn(move || {
        let mut all = Vec::new();
        for line in log.lines().map_while(Result::ok) {
            if line.contains("Zenoh session for ROS 2") {
                let _ = up_tx.send(());
            }
            all.push(line);
        }
        all.join("\n")
    });
    up.recv_timeout(Duration::from_secs(30))
        .expect("pi0d's session opens");
    let cert = |cn: &str| {
        (
            dir.join(format!("{cn}.pem")),
            dir.join(format!("{cn}-key.pem")),
        )
    };
    let (intruder, driver, operator) = (cert("intruder"), cert("robot-driver"), cert("operator"));
    let strangers = [
        steer(
            port,
            &ca.cert,
            Some((&stranger_cert, &stranger_key)),
            "prompt from a stranger",
        ),
        steer(
            port,
            &ca.cert,
            None,
            "prompt from a peer without a certificate",
        ),
        steer(
            port,
            &ca.cert,
            Some((&intruder.0, &intruder.1)),
            "prompt from an intruder",
        ),
        steer(
            port,
            &ca.cert,
            Some((&driver.0, &driver.1)),
            "prompt from the robot driver",
        ),
    ];
    let seen: Vec<serde_json::Value> = strangers.into_iter().map(steered).collect();
    let op = steered(steer(
        port,
        &ca.cert,
        Some((&operator.0, &operator.1)),
        "prompt from the operator",
    ));
    let _ = pi0d.wait();
    let log = lines.join().unwrap();
    assert_eq!(
        seen[0]["linked"], false,
        "another CA's certificate: {}",
        seen[0]
    );
    assert_eq!(seen[1]["linked"], false, "no certificate: {}", seen[1]);
    assert_eq!(
        seen[2]["linked"], true,
        "the CA's certificate links: {}",
        seen[2]
    );
    assert_eq!(seen[3]["linked"], true, "{}", seen[3]);
    for s in &seen {
        assert_eq!(s["reset_answers"], serde_json::json!([]), "{s}");
    }
    assert_eq!(op["linked"], true, "{op}");
    assert_eq!(
        op["reset_answers"].as_array().map(Vec::len),
        Some(1),
        "{op}\n{log}"
    );
    assert!(log.contains("prompt from the operator"), "{log}");
    for other in [
        "stranger",
        "without a certificate",
        "intruder",
        "robot driver",
    ] {
        assert!(
            !log.contains(&format!("from {other}"))
                && !log.contains(&format!("from a {other}"))
                && !log.contains(&format!("from an {other}"))
                && !log.contains(&format!("from the {other}")),
            "{other} was heard:\n{log}"
        );
    }
}

/// config/zenoh's policy fleet pair: `pi0d serve --zenoh-config` with mutual TLS and access
/// control answers a robot whose certificate is named "robot"; a robot showing a certificate
/// from the same CA under another name gets no chunk (every query a timeout).
#[test]
fn when_a_robot_queries_a_tls_policy_server_expect_chunks_only_for_a_certified_robot() {
    let dir = scratch_dir("zenoh-acl-policy");
    let ca = common::tls::TestCa::new(&dir, "ca");
    for cn in ["policy-server", "robot", "intruder"] {
        ca.issue(cn);
    }
    let port = free_port();
    let serve_session = dir.join("serve.json5");
    session_file("policy-server-session.json5", &dir, port, &serve_session);
    let mut serve = Command::new(env!("CARGO_BIN_EXE_pi0d"));
    serve
        .args(["serve", "--checkpoint"])
        .arg(root().join("models/tiny-pi0"))
        .args(["--listen", "127.0.0.1:0", "--threads", "1"])
        .args(["--zenoh", "pi0d/policy/arm", "--zenoh-config"])
        .arg(&serve_session);
    let (_serve, _) = with_zid(serve, "answering Zenoh queries");
    let robot = |name: &str, cn: &str| {
        let session = dir.join(format!("{name}.json5"));
        session_file("robot-policy-session.json5", &dir, port, &session);
        let text = std::fs::read_to_string(&session)
            .unwrap()
            .replace("robot.pem", &format!("{cn}.pem"))
            .replace("robot-key.pem", &format!("{cn}-key.pem"));
        std::fs::write(&session, text).unwrap();
        let mut cfg = remote_policy_config(
            "zenoh",
            &[
                ("key", Value::String("pi0d/policy/arm".into())),
                (
                    "connect",
                    Value::Array(vec![Value::String(format!("tls/127.0.0.1:{port}"))]),
                ),
                (
                    "session_config",
                    Value::String(session.display().to_string()),
                ),
                ("request_timeout_s", Value::Float(0.4)),
            ],
        );
        cfg["control"]["request_threshold_s"] = Value::Float(0.9);
        run_daemon(name, &cfg, 4.0)
    };
    let certified = robot("acl-robot", "robot");
    let s = certified.summary();
    assert!(
        s["chunks_accepted"].as_u64().unwrap() >= 3,
        "{s}\n{}",
        certified.stderr
    );
    let intruder = robot("acl-intruder", "intruder");
    let s = intruder.summary();
    assert_eq!(s["chunks_accepted"], 0, "{s}");
    assert!(
        s["policy_errors_by_kind"]["timeout"].as_u64().unwrap_or(0) >= 2,
        "{s}"
    );
}

#[test]
fn when_check_reads_a_zenoh_session_expect_it_said_closed_or_open_and_why() {
    for (open, want) in [
        (false, "Zenoh session (ROS 2): closed: listens on this machine only (tcp/127.0.0.1:0), multicast scouting off; connects to tcp/127.0.0.1:"),
        (true, "Zenoh session (ROS 2): OPEN to the network: multicast scouting on (any Zenoh peer on the network finds it)"),
    ] {
        let (_dir, path) = ros_zenoh_config(if open { "check-open" } else { "check-closed" }, open);
        let out = Command::new(env!("CARGO_BIN_EXE_pi0d"))
            .args(["check", "--config"])
            .arg(&path)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains(want), "{text}");
    }
}

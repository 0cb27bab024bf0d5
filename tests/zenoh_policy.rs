//! A fleet over Zenoh (feature `zenoh`): two `pi0d serve --zenoh KEY` processes answer the same
//! key, the robot-side daemon (`policy.backend = "zenoh"`) queries it, and Zenoh's routing
//! picks a server. The server answering is killed (SIGKILL) mid-run: the next query goes to
//! the other, and chunks keep coming within one request timeout (the arm never holds).
#![cfg(feature = "zenoh")]

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;
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
    // Kill whichever server has been answering, 4 s into the run.
    let (na2, nb2) = (na.clone(), nb.clone());
    let (ida, idb) = (a.id() as i32, b.id() as i32);
    let killer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(4));
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

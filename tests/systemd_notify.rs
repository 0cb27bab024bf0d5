//! The systemd notify protocol against a real datagram socket, as systemd provides it:
//! READY=1 after start-up, WATCHDOG=1 while the loop ticks, STATUS= lines, STOPPING=1.

mod common;

use std::os::unix::net::UnixDatagram;
use std::process::Command;
use std::time::Duration;

#[test]
fn when_run_under_systemd_expect_ready_watchdog_status_stopping() {
    let dir = common::scratch_dir("notify");
    let socket_path = dir.join("notify.sock");
    let socket = UnixDatagram::bind(&socket_path).unwrap();
    socket
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let cfg = dir.join("config.toml");
    std::fs::write(&cfg, toml::to_string(&common::sim_config()).unwrap()).unwrap();

    // Read as systemd does, while the daemon runs: a datagram queue holds only ~10 messages.
    let reader = std::thread::spawn(move || {
        let mut messages = Vec::new();
        let mut buf = [0u8; 4096];
        let mut idle = 0;
        while idle < 10 {
            match socket.recv(&mut buf) {
                Ok(n) => {
                    idle = 0;
                    messages.push(String::from_utf8_lossy(&buf[..n]).to_string());
                }
                Err(_) => idle += 1,
            }
        }
        messages
    });
    let _serial = common::SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let status = Command::new(env!("CARGO_BIN_EXE_pi0d"))
        .args(["run", "--quiet", "--duration", "2.5", "--config"])
        .arg(&cfg)
        .env("NOTIFY_SOCKET", &socket_path)
        .env("WATCHDOG_USEC", "400000")
        .status()
        .unwrap();
    assert!(status.success());

    let messages = reader.join().unwrap();
    let first = |m: &str| messages.iter().position(|x| x.contains(m));
    let ready = first("READY=1").unwrap_or_else(|| panic!("no READY=1 in {messages:?}"));
    let stopping = first("STOPPING=1").unwrap_or_else(|| panic!("no STOPPING=1 in {messages:?}"));
    assert!(ready < stopping);
    let pings = messages.iter().filter(|m| m.contains("WATCHDOG=1")).count();
    assert!(
        pings >= 5,
        "watchdog every 200 ms over 2.5 s, got {pings}: {messages:?}"
    );
    assert!(
        messages.iter().any(|m| m.contains("STATUS=running")),
        "{messages:?}"
    );
}

//! Native journald logging, against a real datagram socket the test opens: pi0d, its stderr
//! being the journal's stream (`JOURNAL_STREAM` naming it, as systemd sets it), sends each
//! event to `/run/systemd/journal/socket` in the journal's native format with its fields.
//! The test's socket is put at that path in a mount namespace of the daemon's own (`unshare`,
//! root), so nothing on the machine is touched. With `JOURNAL_STREAM` naming another stream
//! (a redirected child), the log stays text on stderr.

use crate::common;

use std::os::unix::fs::MetadataExt;
use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use toml::Value;

type Entry = Vec<(String, String)>;

/// One datagram of the journal's native protocol: `KEY=value\n`, or for values that may hold
/// newlines `KEY\n`, a little-endian u64 length, the bytes, `\n`.
fn parse_entry(d: &[u8]) -> Result<Entry, String> {
    let mut fields = Vec::new();
    let mut i = 0;
    while i < d.len() {
        let nl = d[i..]
            .iter()
            .position(|b| *b == b'\n')
            .ok_or("a field without its newline")?
            + i;
        let line = &d[i..nl];
        if let Some(eq) = line.iter().position(|b| *b == b'=') {
            let key = String::from_utf8_lossy(&line[..eq]).to_string();
            fields.push((key, String::from_utf8_lossy(&line[eq + 1..]).to_string()));
            i = nl + 1;
        } else {
            let len = d
                .get(nl + 1..nl + 9)
                .ok_or("a binary field without its length")?;
            let len = u64::from_le_bytes(len.try_into().unwrap()) as usize;
            let value = d
                .get(nl + 9..nl + 9 + len)
                .ok_or("a binary field shorter than its length")?;
            if d.get(nl + 9 + len) != Some(&b'\n') {
                return Err("a binary field not ended by a newline".into());
            }
            fields.push((
                String::from_utf8_lossy(line).to_string(),
                String::from_utf8_lossy(value).to_string(),
            ));
            i = nl + 10 + len;
        }
    }
    Ok(fields)
}

fn field<'a>(e: &'a Entry, key: &str) -> Option<&'a str> {
    e.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
}

/// Runs pi0d on `cfg` in a mount namespace whose /run/systemd/journal is `dir`, its stderr
/// `stderr` and `JOURNAL_STREAM` as given; returns the datagrams that reached `dir/socket`.
fn run_under_journal(dir: &Path, cfg: &Path, journal_stream: &str, stderr: &Path) -> Vec<Entry> {
    // Before the reader starts: it gives up after a few idle seconds.
    let _serial = common::SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let socket = UnixDatagram::bind(dir.join("socket")).unwrap();
    socket
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    // Read while the daemon runs: a datagram queue holds only a few messages.
    let reader = std::thread::spawn(move || {
        let mut entries = Vec::new();
        let mut buf = vec![0u8; 1 << 16];
        let mut idle = 0;
        while idle < 15 {
            match socket.recv(&mut buf) {
                Ok(0) => {} // the layer's probe at start-up
                Ok(n) => {
                    idle = 0;
                    entries.push(parse_entry(&buf[..n]).unwrap_or_else(|e| {
                        panic!("{e}: {:?}", String::from_utf8_lossy(&buf[..n]))
                    }));
                }
                Err(_) => idle += 1,
            }
        }
        entries
    });
    let status = Command::new("unshare")
        .args([
            "--mount",
            "sh",
            "-c",
            "mount -t tmpfs pi0d-test /run && mkdir -p /run/systemd/journal \
             && mount --bind \"$1\" /run/systemd/journal && shift && exec \"$@\"",
            "sh",
        ])
        .arg(dir)
        .arg(env!("CARGO_BIN_EXE_pi0d"))
        .args(["run", "--quiet", "--duration", "3", "--config"])
        .arg(cfg)
        .env("JOURNAL_STREAM", journal_stream)
        .env("RUST_LOG", "info")
        .stderr(Stdio::from(std::fs::File::create(stderr).unwrap()))
        .status()
        .expect("unshare (util-linux) runs");
    assert!(
        status.success(),
        "{}",
        std::fs::read_to_string(stderr).unwrap()
    );
    reader.join().unwrap()
}

/// The NaN-emitting scripted policy: rejected chunks (naming a joint) and a hold.
fn faulty_config(dir: &Path) -> std::path::PathBuf {
    let mut cfg = common::sim_config();
    cfg["policy"].as_table_mut().unwrap().insert(
        "fault".into(),
        common::table(&[
            ("kind", Value::String("nan".into())),
            ("after_chunks", Value::Integer(2)),
            ("count", Value::Integer(0)),
            ("latency_s", Value::Float(0.0)),
        ]),
    );
    let path = dir.join("config.toml");
    std::fs::write(&path, toml::to_string(&cfg).unwrap()).unwrap();
    path
}

#[test]
fn when_stderr_is_the_journal_expect_native_entries_with_fields() {
    let dir = common::scratch_dir("journald");
    let cfg = faulty_config(&dir);
    let stderr = dir.join("stderr.log");
    std::fs::write(&stderr, "").unwrap();
    let meta = std::fs::metadata(&stderr).unwrap();
    let stream = format!("{}:{}", meta.dev(), meta.ino());
    let entries = run_under_journal(&dir, &cfg, &stream, &stderr);

    assert!(!entries.is_empty(), "nothing reached the journal socket");
    for e in &entries {
        assert_eq!(field(e, "SYSLOG_IDENTIFIER"), Some("pi0d"), "{e:?}");
        let p: u8 = field(e, "PRIORITY").and_then(|p| p.parse().ok()).unwrap();
        assert!((2..=7).contains(&p), "{e:?}");
        assert!(field(e, "MESSAGE").is_some(), "{e:?}");
    }
    // The first transition: starting -> running, a notice with its mode.
    let running = entries
        .iter()
        .find(|e| field(e, "PI0D_MODE") == Some("running"))
        .unwrap_or_else(|| panic!("no transition to running: {entries:?}"));
    assert_eq!(field(running, "PRIORITY"), Some("5"));
    // The hold, a warning naming its safety event.
    let hold = entries
        .iter()
        .find(|e| field(e, "PI0D_MODE") == Some("holding"))
        .unwrap_or_else(|| panic!("no hold: {entries:?}"));
    assert_eq!(field(hold, "PRIORITY"), Some("4"), "{hold:?}");
    assert_eq!(
        field(hold, "PI0D_SAFETY_EVENT"),
        Some("chunk_starved"),
        "{hold:?}"
    );
    // A rejected chunk: its sequence number and the joint whose action was not finite.
    let rejected = entries
        .iter()
        .find(|e| field(e, "PI0D_REASON") == Some("non_finite"))
        .unwrap_or_else(|| panic!("no rejected chunk: {entries:?}"));
    let joints = common::sim_config()["robot"]["joints"].clone();
    let joint = field(rejected, "PI0D_JOINT").unwrap_or_default();
    assert!(
        joints
            .as_array()
            .unwrap()
            .iter()
            .any(|j| j.as_str() == Some(joint)),
        "{rejected:?}"
    );
    assert!(field(rejected, "PI0D_CHUNK_SEQ").is_some_and(|s| s.parse::<u64>().is_ok()));
    // Not twice: the text log is not written to the journal's stream as well.
    let text = std::fs::read_to_string(&stderr).unwrap();
    assert!(!text.contains("chunk rejected"), "{text}");
}

#[test]
fn when_journal_stream_names_another_stream_expect_text_on_stderr() {
    let dir = common::scratch_dir("journald-other");
    let cfg = faulty_config(&dir);
    let stderr = dir.join("stderr.log");
    // The variable a child of a service inherits after its stderr was redirected.
    let entries = run_under_journal(&dir, &cfg, "1:1", &stderr);
    assert!(entries.is_empty(), "{entries:?}");
    let text = std::fs::read_to_string(&stderr).unwrap();
    assert!(text.contains("chunk rejected"), "{text}");
}

#[test]
fn when_entry_is_malformed_expect_the_parser_to_say_so() {
    // The checks above rest on this parser: it must refuse what journald would.
    assert!(parse_entry(b"MESSAGE=hi\n").is_ok());
    assert!(parse_entry(b"MESSAGE=hi").is_err());
    assert!(parse_entry(b"MESSAGE\n\x05\0\0\0\0\0\0\0hi\n").is_err());
    let ok = parse_entry(b"MESSAGE\n\x03\0\0\0\0\0\0\0a\nb\nPRIORITY=5\n").unwrap();
    assert_eq!(field(&ok, "MESSAGE"), Some("a\nb"));
    assert_eq!(field(&ok, "PRIORITY"), Some("5"));
}

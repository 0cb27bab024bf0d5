//! Calibration inputs are checked before they are trusted: a recording pi0d made, then copies
//! of it damaged as a disk, a killed run or a hostile hand would damage them (a chunk's record
//! length or uncompressed size claiming 1 TiB, the summary's chunk index lying, the file cut
//! mid-record), and a FIFO in its place. A lying length is refused naming the file; a cut
//! file gives what it holds with a line saying so; the summary is never trusted (the data is
//! streamed); a FIFO is refused by name at once. `pi0d quantize` and `pi0d export` read
//! calibration through the same reader.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::common;

use common::procs::wait_for_exit;
use common::*;

const TIB: u64 = 1 << 40;
const CHUNK: u8 = 0x06;
const CHUNK_INDEX: u8 = 0x08;
const FOOTER: u8 = 0x02;

/// Each record of an MCAP file: its opcode and the offset of its body.
fn records(bytes: &[u8]) -> Vec<(u8, usize)> {
    let mut out = Vec::new();
    let mut at = 8;
    while at + 9 <= bytes.len() {
        let op = bytes[at];
        let len = u64::from_le_bytes(bytes[at + 1..at + 9].try_into().unwrap()) as usize;
        out.push((op, at + 9));
        if op == FOOTER {
            break;
        }
        at += 9 + len;
    }
    out
}

/// A copy of `bytes` at `path` with the u64 at `offset` set to `value`.
fn with_u64(path: &Path, bytes: &[u8], offset: usize, value: u64) -> PathBuf {
    let mut b = bytes.to_vec();
    b[offset..offset + 8].copy_from_slice(&value.to_le_bytes());
    std::fs::write(path, b).unwrap();
    path.to_path_buf()
}

/// `pi0d quantize` of the bundled model, calibrated on `input`: exit code and output, killed
/// (failing the test) if it outlives `limit_s`.
fn calibrate(dir: &Path, name: &str, input: &Path) -> (Option<i32>, String) {
    let out = dir.join(format!("out-{name}"));
    let mut child = Command::new(env!("CARGO_BIN_EXE_pi0d"))
        .args(["quantize", "--scheme", "w8a8", "--checkpoint"])
        .arg(root().join("models/tiny-pi0"))
        .arg("--out")
        .arg(&out)
        .arg("--calibration")
        .arg(input)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let status = wait_for_exit(&mut child, 120.0);
    let output = child.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&output.stdout).into_owned()
        + &String::from_utf8_lossy(&output.stderr);
    (status.code(), text)
}

/// The observation count a calibration says it ran on its one input.
fn observations(text: &str) -> u64 {
    text.split("running the float model on ")
        .nth(1)
        .and_then(|t| t.split(" (").nth(1))
        .and_then(|t| t.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no observation count in:\n{text}"))
}

#[test]
fn when_a_calibration_recording_is_damaged_or_a_fifo_expect_it_refused_or_read_in_part_by_name() {
    let dir = scratch_dir("calibration-files");
    let recording = dir.join("run.mcap");
    let run = run_daemon("calibration-files", &recording_config(&recording), 3.0);
    assert_eq!(run.code(), 0, "{}", run.stderr);
    let bytes = std::fs::read(&recording).unwrap();
    let recs = records(&bytes);
    let (code, text) = calibrate(&dir, "intact", &recording);
    assert_eq!(code, Some(0), "{text}");
    let whole = observations(&text);

    // A chunk whose record length, then whose uncompressed size, claims 1 TiB.
    let chunk = recs.iter().find(|(op, _)| *op == CHUNK).expect("a chunk").1;
    for (name, offset) in [
        ("record-length", chunk - 8),
        ("uncompressed-size", chunk + 16),
    ] {
        let bad = with_u64(&dir.join(format!("{name}.mcap")), &bytes, offset, TIB);
        let (code, text) = calibrate(&dir, name, &bad);
        assert_eq!(code, Some(1), "{name}: {text}");
        assert!(
            text.contains(&format!(
                "--calibration {}: damaged after record",
                bad.display()
            )),
            "{name}: {text}"
        );
        assert!(!dir.join(format!("out-{name}")).exists(), "{name}");
    }

    // The summary's chunk index claims a 1 TiB chunk: never read, the data is what counts.
    let index = recs
        .iter()
        .find(|(op, _)| *op == CHUNK_INDEX)
        .expect("a chunk index")
        .1;
    let bad = with_u64(&dir.join("index.mcap"), &bytes, index + 24, TIB);
    let (code, text) = calibrate(&dir, "index", &bad);
    assert_eq!(code, Some(0), "{text}");
    assert_eq!(observations(&text), whole, "{text}");

    // Cut in the middle of its last chunk (a killed run): what it holds, with a line.
    let last = recs.iter().rfind(|(op, _)| *op == CHUNK).unwrap().1;
    let cut = dir.join("cut.mcap");
    std::fs::write(&cut, &bytes[..last + 40]).unwrap();
    let (code, text) = calibrate(&dir, "cut", &cut);
    assert_eq!(code, Some(0), "{text}");
    assert!(
        text.contains(&format!(
            "--calibration {}: the file ends before its data section does",
            cut.display()
        )),
        "{text}"
    );
    let part = observations(&text);
    assert!(part >= 1 && part <= whole, "{part} of {whole}: {text}");

    // A FIFO no one writes: refused by name at once, never opened for reading.
    let fifo = dir.join("fifo.mcap");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: mkfifo on a path this test owns; no memory is shared.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let (code, text) = calibrate(&dir, "fifo", &fifo);
    assert_eq!(code, Some(1), "{text}");
    assert!(text.contains("fifo.mcap is a FIFO, expected a"), "{text}");
    assert!(text.contains(&fifo.display().to_string()), "{text}");
}

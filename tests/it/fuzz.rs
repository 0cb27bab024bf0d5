//! Every parser of outside bytes, fuzzed (`pi0d::fuzz`'s targets): configuration TOML, ROS
//! parameter YAML, a checkpoint's config.json and processor JSON, safetensors files, openpi
//! msgpack frames (a request as `serve` reads it, a reply as the client reads it), MCAP files
//! (as `plot` and calibration read them), the websocket handshake's answer, and a client's
//! first bytes to `pi0d serve`. Each corpus file (`tests/fuzz/<target>/`, plus the
//! repository's own files of that kind) is run as it is, then mutated: bytes flipped,
//! inserted, deleted and repeated, lengths and counts set to hostile values, parts of two
//! inputs spliced. A parser must answer each input within `HANG_S` without panicking; its
//! answer (a value or a refusal) is its own business. A crash found is kept: its input as a
//! corpus file (run every time) and proptest's seed in `tests/fuzz/regressions.txt`.
//! `PI0D_FUZZ_CASES` sets the mutated inputs per target.

use crate::common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use pi0d::fuzz::{self, Scratch, Target};
use pi0d::policy::openpi::msgpack_numpy::{self, Dtype, NdArray, Out};
use proptest::prelude::*;
use proptest::test_runner::{Config, FileFailurePersistence, TestRunner};

/// An input answered later than this is a hang.
const HANG_S: u64 = 20;
/// Mutated inputs per target, unless `PI0D_FUZZ_CASES` says otherwise.
const CASES: u32 = 2000;

/// Files of the repository that are inputs of `t`'s kind: seeds beside the corpus.
fn repository_seeds(t: Target) -> Vec<PathBuf> {
    let root = common::root();
    let fixtures = root.join("tests/fixtures");
    let mut out: Vec<PathBuf> = match t {
        Target::ConfigToml => vec![
            root.join("config/sim.toml"),
            root.join("config/pi0d.example.toml"),
        ],
        Target::RosParamsYaml => vec![root.join("tests/config/params.yaml")],
        Target::ConfigJson => vec![
            root.join("models/tiny-pi0/config.json"),
            fixtures.join("pi05_float32/config.json"),
        ],
        Target::ProcessorJson => vec![root.join("models/tiny-pi0/policy_preprocessor.json")],
        Target::Safetensors => vec![
            root.join(
                "models/tiny-pi0/policy_preprocessor_step_6_normalizer_processor.safetensors",
            ),
            fixtures
                .join("pi0_float32/policy_postprocessor_step_0_unnormalizer_processor.safetensors"),
        ],
        _ => Vec::new(),
    };
    if t == Target::ProcessorJson {
        if let Ok(dirs) = std::fs::read_dir(fixtures.join("processors")) {
            let mut more: Vec<PathBuf> = dirs
                .flatten()
                .map(|d| d.path().join("policy_preprocessor.json"))
                .filter(|p| p.is_file())
                .collect();
            more.sort();
            out.extend(more);
        }
    }
    out
}

/// Frames as openpi's client and server send them: a request and a reply.
fn frames() -> Vec<Vec<u8>> {
    let array = |shape: Vec<usize>, values: &[f32]| {
        Out::Array(NdArray {
            dtype: Dtype::F32,
            shape,
            data: values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        })
    };
    let image = Out::Array(NdArray {
        dtype: Dtype::U8,
        shape: vec![4, 4, 3],
        data: vec![7; 48],
    });
    let request = Out::Map(vec![
        ("observation/image".into(), image),
        ("observation/state".into(), array(vec![7], &[0.1; 7])),
        ("prompt".into(), Out::Text("pick up the cube".into())),
    ]);
    let reply = Out::Map(vec![
        ("actions".into(), array(vec![50, 7], &[0.2; 350])),
        (
            "server_timing".into(),
            Out::Map(vec![("infer_ms".into(), Out::Number(12.5))]),
        ),
    ]);
    vec![
        msgpack_numpy::encode(&request),
        msgpack_numpy::encode(&reply),
    ]
}

/// Answers to pi0d's upgrade request: a server's, a refusal, a redirect.
fn handshakes() -> Vec<Vec<u8>> {
    let answers: [&[u8]; 3] = [
        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n\r\n\x82\x05hello",
        b"HTTP/1.1 401 Unauthorized\r\nContent-Length: 12\r\n\r\nno such key\n",
        b"HTTP/1.1 302 Found\r\nLocation: ws://elsewhere/\r\n\r\n",
    ];
    answers.iter().map(|a| a.to_vec()).collect()
}

/// What clients send `pi0d serve`: an upgrade with the key, one without, a health check.
fn requests() -> Vec<Vec<u8>> {
    let requests: [&[u8]; 3] = [
        b"GET / HTTP/1.1\r\nHost: 127.0.0.1:8000\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\nAuthorization: Api-Key key\r\n\r\n\x82\x85\x01\x02\x03\x04ignmk",
        b"GET / HTTP/1.1\r\nHost: 127.0.0.1:8000\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n",
        b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1:8000\r\n\r\n",
    ];
    requests.iter().map(|r| r.to_vec()).collect()
}

/// Every seed of `t`: its corpus directory's files, the repository's, the generated ones.
fn seeds(t: Target) -> Vec<Vec<u8>> {
    let dir = common::root().join("tests/fuzz").join(t.name());
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    files.sort();
    files.extend(repository_seeds(t));
    let mut out: Vec<Vec<u8>> = files
        .iter()
        .map(|f| std::fs::read(f).unwrap_or_else(|e| panic!("{}: {e}", f.display())))
        .collect();
    match t {
        Target::OpenpiFrame => out.extend(frames()),
        Target::WebsocketHandshake => out.extend(handshakes()),
        Target::ServeHandshake => out.extend(requests()),
        _ => {}
    }
    assert!(!out.is_empty(), "no seed for {}", t.name());
    out
}

/// One mutation of an input.
#[derive(Clone, Debug)]
enum Op {
    Flip {
        at: usize,
        bits: u8,
    },
    Insert {
        at: usize,
        bytes: Vec<u8>,
    },
    Delete {
        at: usize,
        len: usize,
    },
    /// A hostile 8-, 4- or 2-byte little-endian value (a length, a count, an offset).
    Set {
        at: usize,
        value: u64,
        width: usize,
    },
    /// A run of the input repeated.
    Repeat {
        at: usize,
        len: usize,
        times: usize,
    },
    /// Another seed's bytes in place of the rest.
    Splice {
        at: usize,
        seed: usize,
        from: usize,
    },
    Truncate {
        at: usize,
    },
}

fn op() -> impl Strategy<Value = Op> {
    let hostile = prop_oneof![
        Just(0u64),
        Just(1),
        Just(0x7f),
        Just(0xff),
        Just(0xffff),
        Just(0x7fff_ffff),
        Just(0xffff_ffff),
        Just(1 << 40),
        Just(u64::MAX),
        any::<u64>(),
    ];
    prop_oneof![
        (any::<usize>(), 1u8..=255).prop_map(|(at, bits)| Op::Flip { at, bits }),
        (
            any::<usize>(),
            prop_oneof![
                proptest::collection::vec(any::<u8>(), 1..16),
                Just(b"\x1b]0;x\x07".to_vec()),
                Just(b"\"{[".to_vec()),
                Just(vec![0xff; 9]),
            ]
        )
            .prop_map(|(at, bytes)| Op::Insert { at, bytes }),
        (any::<usize>(), 1usize..64).prop_map(|(at, len)| Op::Delete { at, len }),
        (
            any::<usize>(),
            hostile,
            prop_oneof![Just(8usize), Just(4), Just(2)]
        )
            .prop_map(|(at, value, width)| Op::Set { at, value, width }),
        (any::<usize>(), 1usize..32, 2usize..64).prop_map(|(at, len, times)| Op::Repeat {
            at,
            len,
            times
        }),
        (any::<usize>(), any::<usize>(), any::<usize>()).prop_map(|(at, seed, from)| Op::Splice {
            at,
            seed,
            from
        }),
        any::<usize>().prop_map(|at| Op::Truncate { at }),
    ]
}

fn apply(mut b: Vec<u8>, ops: &[Op], seeds: &[Vec<u8>]) -> Vec<u8> {
    for op in ops {
        let n = b.len();
        let at = |i: usize| if n == 0 { 0 } else { i % (n + 1) };
        match op {
            Op::Flip { at: i, bits } => {
                if n > 0 {
                    b[i % n] ^= bits;
                }
            }
            Op::Insert { at: i, bytes } => {
                let i = at(*i);
                b.splice(i..i, bytes.iter().copied());
            }
            Op::Delete { at: i, len } => {
                let i = at(*i);
                b.drain(i..(i + len).min(n));
            }
            Op::Set {
                at: i,
                value,
                width,
            } => {
                if n >= *width {
                    let i = i % (n - width + 1);
                    b[i..i + width].copy_from_slice(&value.to_le_bytes()[..*width]);
                }
            }
            Op::Repeat { at: i, len, times } => {
                let i = at(*i);
                let run: Vec<u8> = b[i..(i + len).min(n)].to_vec();
                let more: Vec<u8> = run
                    .iter()
                    .copied()
                    .cycle()
                    .take(run.len() * times)
                    .collect();
                b.splice(i..i, more);
            }
            Op::Splice { at: i, seed, from } => {
                let other = &seeds[seed % seeds.len()];
                let from = if other.is_empty() {
                    0
                } else {
                    from % other.len()
                };
                b.truncate(at(*i));
                b.extend_from_slice(&other[from..]);
            }
            Op::Truncate { at: i } => b.truncate(at(*i)),
        }
    }
    b
}

/// Runs `t` on `bytes` on a thread of its own: a panic or an answer later than `HANG_S` fails.
fn answer(t: Target, bytes: Vec<u8>, scratch: &Arc<Scratch>) -> Result<(), String> {
    let (tx, rx) = std::sync::mpsc::channel();
    let scratch = scratch.clone();
    std::thread::spawn(move || {
        let verdict = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            fuzz::run(t, &bytes, &scratch)
        }));
        let _ = tx.send(verdict.is_ok());
    });
    match rx.recv_timeout(Duration::from_secs(HANG_S)) {
        Ok(true) => Ok(()),
        Ok(false) => Err(format!("{}: the parser panicked", t.name())),
        Err(_) => Err(format!("{}: no answer within {HANG_S} s", t.name())),
    }
}

/// A scratch directory and a copy of the bundled model for `t`: kept alive by the caller.
fn scratch(t: Target) -> ([common::TempDir; 2], Arc<Scratch>) {
    let dir = common::scratch_dir(&format!("fuzz-{}", t.name()));
    let checkpoint = common::copied_checkpoint(
        &common::root().join("models/tiny-pi0"),
        &format!("fuzz-{}-checkpoint", t.name()),
    );
    let s = Arc::new(Scratch {
        dir: dir.to_path_buf(),
        checkpoint: checkpoint.to_path_buf(),
    });
    ([dir, checkpoint], s)
}

fn cases() -> u32 {
    std::env::var("PI0D_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(CASES)
}

fn fuzz_target(t: Target) {
    let (_dir, scratch) = scratch(t);
    let seeds = seeds(t);
    // Each seed as it is first: the corpus, crashes found before included.
    for (i, s) in seeds.iter().enumerate() {
        if let Err(e) = answer(t, s.clone(), &scratch) {
            panic!("seed {i} of {}: {e}", t.name());
        }
    }
    let mut runner = TestRunner::new(Config {
        cases: cases(),
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(
            "tests/fuzz/regressions.txt",
        ))),
        // A failing input is shrunk, within reason.
        max_shrink_iters: 2000,
        ..Config::default()
    });
    let strategy = (0..seeds.len(), proptest::collection::vec(op(), 1..6));
    let result = runner.run(&strategy, |(seed, ops)| {
        let input = apply(seeds[seed].clone(), &ops, &seeds);
        answer(t, input, &scratch).map_err(TestCaseError::fail)
    });
    if let Err(e) = result {
        panic!("{}: {e}", t.name());
    }
}

#[test]
fn config_toml() {
    fuzz_target(Target::ConfigToml);
}

#[test]
fn ros_params_yaml() {
    fuzz_target(Target::RosParamsYaml);
}

#[test]
fn config_json() {
    fuzz_target(Target::ConfigJson);
}

#[test]
fn processor_json() {
    fuzz_target(Target::ProcessorJson);
}

#[test]
fn safetensors() {
    fuzz_target(Target::Safetensors);
}

#[test]
fn openpi_frame() {
    fuzz_target(Target::OpenpiFrame);
}

#[test]
fn mcap() {
    fuzz_target(Target::Mcap);
}

#[test]
fn websocket_handshake() {
    fuzz_target(Target::WebsocketHandshake);
}

#[test]
fn serve_handshake() {
    fuzz_target(Target::ServeHandshake);
}

#[test]
fn every_target_has_a_test_and_a_corpus() {
    let src = std::fs::read_to_string(Path::new(file!())).unwrap();
    for t in Target::ALL {
        assert!(
            src.contains(&format!("fuzz_target(Target::{t:?})")),
            "{} is not fuzzed here",
            t.name()
        );
        assert!(seeds(t).len() >= 2, "{}: fewer than 2 seeds", t.name());
    }
}

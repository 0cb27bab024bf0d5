//! Reading a pi0d recording back: what `pi0d plot` draws. Only pi0d's own channels are read
//! (the commands, the measured joint states, chunks, events) and the run's metadata; a file
//! that ends early (a killed run) gives what it holds, with a note.
//!
//! Any file is read within fixed bounds, whatever it claims: it is streamed (memory follows
//! the largest record, at most `stream::Bounds::record_bytes`), the series are thinned evenly as
//! they are read (a long run costs no more memory than a short one), a recording names at most
//! `MAX_JOINTS` joints (more is refused: pi0d never writes them), and the decompressed bytes
//! read are bounded by the file's size (a small file that inflates without end is read up to
//! the bound and plotted up to there).

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use byteorder::LittleEndian;
use mcap::records::{op, Record};
use mcap::McapError;
use serde::Deserialize;

use super::file::{CHUNKS_TOPIC, COMMAND_TOPIC, EVENTS_TOPIC};
use super::stream::{self, Bounds, End, Flow, StreamError};
use crate::io::ros::msgs;
pub(crate) use crate::joints::MAX_JOINTS;

#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("{path}: cannot read")]
    Open {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: not an MCAP file")]
    NotMcap {
        path: PathBuf,
        #[source]
        source: McapError,
    },
    #[error("{path}: the MCAP data is unreadable before the first {COMMAND_TOPIC} message")]
    Broken {
        path: PathBuf,
        #[source]
        source: McapError,
    },
    #[error("{path}: no {COMMAND_TOPIC} channel with sensor_msgs/msg/JointState messages: not a pi0d recording")]
    NotPi0d { path: PathBuf },
    #[error("{path}: message {index} on {topic} does not decode as {expected}: {message}")]
    Decode {
        path: PathBuf,
        topic: String,
        index: u64,
        expected: &'static str,
        message: String,
    },
    #[error("{path}: message {index} on {topic} names {count} joints; a pi0d recording has 1 to {MAX_JOINTS}")]
    Joints {
        path: PathBuf,
        topic: String,
        index: u64,
        count: usize,
    },
    #[error("{path}: a metadata record of {bytes} bytes; pi0d writes at most {METADATA_BYTES}")]
    Metadata { path: PathBuf, bytes: usize },
}

/// The bounds every read keeps to (`Default`: what `pi0d plot` uses).
#[derive(Clone, Copy, Debug)]
pub(crate) struct ReadLimits {
    /// The file's: the longest record, the decompressed bytes read (`stream::Bounds`).
    pub(crate) stream: Bounds,
    /// Samples kept per series: a longer run is thinned evenly as it is read.
    pub(crate) keep_samples: usize,
    /// State transitions read at most.
    pub(crate) transitions: usize,
}

impl Default for ReadLimits {
    fn default() -> Self {
        ReadLimits {
            stream: Bounds::default(),
            // `plot` draws at most 4000 points per line: 4 to 8 thousand kept leaves it room.
            keep_samples: 8000,
            transitions: 10_000,
        }
    }
}

/// pi0d's own metadata record is a few kB (version, configuration path, prompt, limits).
pub(crate) const METADATA_BYTES: usize = 1 << 20;

/// A joint's commanded range and velocity limit, from the recording's metadata.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct PlotLimits {
    pub(crate) lower: Option<f64>,
    pub(crate) upper: Option<f64>,
    pub(crate) velocity: Option<f64>,
}

/// Samples of every joint at times `t` (seconds since the recording's first command).
#[derive(Clone, Debug, Default)]
pub(crate) struct Series {
    pub(crate) t: Vec<f64>,
    /// `[joint][sample]`.
    pub(crate) position: Vec<Vec<f64>>,
    pub(crate) velocity: Vec<Vec<f64>>,
}

/// A span the arm was not running: holding (`reason`), e-stopped, or stopping.
#[derive(Clone, Debug, PartialEq)]
pub struct Span {
    pub(crate) from_s: f64,
    pub(crate) to_s: f64,
    pub(crate) state: String,
}

/// Why a recording was read only in part.
#[derive(Clone, Debug, PartialEq)]
pub enum Partial {
    /// The file ends (or breaks) before its data section does: a killed run.
    EndsEarly(String),
    /// It inflates past the bound for its size.
    Decoded { bytes: u64 },
    /// It holds more state transitions than are read.
    Transitions { max: usize },
}

impl std::fmt::Display for Partial {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Partial::EndsEarly(why) => write!(f, "the file ends early ({why})"),
            Partial::Decoded { bytes } => write!(
                f,
                "the file decompresses to more than {bytes} bytes, the most read from a file of its size"
            ),
            Partial::Transitions { max } => {
                write!(f, "the file holds more than {max} state transitions")
            }
        }
    }
}

#[derive(Clone, Debug, Default)]
pub struct RunTrace {
    /// The file it was read from.
    pub(crate) path: PathBuf,
    pub(crate) metadata: BTreeMap<String, String>,
    pub joints: Vec<String>,
    pub(crate) limits: Vec<PlotLimits>,
    /// Unix time (ns) of t = 0.
    pub(crate) start_ns: u64,
    /// Thinned evenly when long (see `ReadLimits::keep_samples`).
    pub(crate) command: Series,
    /// Measured positions; velocities by finite differences (before any thinning).
    pub(crate) measured: Series,
    /// Chunks recorded.
    pub chunks: u64,
    /// Their arrivals, thinned evenly when many.
    pub(crate) chunk_arrivals_s: Vec<f64>,
    pub spans: Vec<Span>,
    /// Why the file was read only up to some point, when it was.
    pub partial: Option<Partial>,
}

impl RunTrace {
    /// The last command's time (the run's length for a recording in order).
    pub fn duration_s(&self) -> f64 {
        self.command.t.last().copied().unwrap_or(0.0)
    }
}

/// A CDR string (or byte sequence: the same on the wire) as it lies in the message: no
/// allocation, and no complaint logged per string from the decoder.
struct CdrText<'a>(&'a [u8]);

impl<'de: 'a, 'a> Deserialize<'de> for CdrText<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = CdrText<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a CDR string")
            }
            fn visit_borrowed_bytes<E>(self, v: &'de [u8]) -> Result<Self::Value, E> {
                Ok(CdrText(v))
            }
        }
        d.deserialize_bytes(V)
    }
}

impl CdrText<'_> {
    /// Without its terminating NUL, invalid UTF-8 replaced.
    fn text(&self) -> String {
        let b = self.0.strip_suffix(&[0]).unwrap_or(self.0);
        String::from_utf8_lossy(b).into_owned()
    }
}

#[derive(Deserialize)]
struct HeaderIn<'a> {
    stamp: msgs::Time,
    #[serde(borrow)]
    _frame_id: CdrText<'a>,
}

/// `sensor_msgs/msg/JointState` as read (its efforts are not).
#[derive(Deserialize)]
struct JointStateIn<'a> {
    #[serde(borrow)]
    header: HeaderIn<'a>,
    #[serde(borrow)]
    name: Vec<CdrText<'a>>,
    position: Vec<f64>,
    velocity: Vec<f64>,
}

/// The events read: only transitions are kept.
#[derive(Deserialize)]
struct EventIn<'a> {
    #[serde(borrow)]
    kind: Option<Cow<'a, str>>,
    #[serde(borrow)]
    to: Option<Cow<'a, str>>,
}

/// Where a message goes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Command,
    Measured,
    Chunks,
    Events,
    Other,
}

/// Samples as they are read, kept evenly: when `keep` are held, every other one is dropped
/// and from then on only every `stride`-th is taken.
struct Thinned {
    keep: usize,
    stride: u64,
    seen: u64,
    ns: Vec<u64>,
    position: Vec<Vec<f64>>,
    velocity: Vec<Vec<f64>>,
}

impl Thinned {
    fn new(joints: usize, keep: usize) -> Thinned {
        Thinned {
            keep: keep.max(2),
            stride: 1,
            seen: 0,
            ns: Vec::new(),
            position: vec![Vec::new(); joints],
            velocity: vec![Vec::new(); joints],
        }
    }

    fn push(&mut self, ns: u64, position: &[f64], velocity: impl Fn(usize) -> f64) {
        let take = self.seen.is_multiple_of(self.stride);
        self.seen += 1;
        if !take {
            return;
        }
        if self.ns.len() >= self.keep {
            fn halve<T: Copy>(v: &mut Vec<T>) {
                let mut i = 0;
                v.retain(|_| {
                    i += 1;
                    i % 2 == 1
                });
            }
            halve(&mut self.ns);
            self.position.iter_mut().for_each(halve);
            self.velocity.iter_mut().for_each(halve);
            self.stride *= 2;
            // This sample is on the new grid only if its index is.
            if !(self.seen - 1).is_multiple_of(self.stride) {
                return;
            }
        }
        self.ns.push(ns);
        for (j, p) in self.position.iter_mut().enumerate() {
            p.push(position[j]);
        }
        for (j, v) in self.velocity.iter_mut().enumerate() {
            v.push(velocity(j));
        }
    }

    fn into_series(self, secs: impl Fn(u64) -> f64) -> Series {
        Series {
            t: self.ns.into_iter().map(secs).collect(),
            position: self.position,
            velocity: self.velocity,
        }
    }
}

/// Velocities from positions by central differences (one-sided at the ends), over the
/// samples as read: each sample is handed on once the next one is known.
struct Differentiated {
    before: Option<(u64, Vec<f64>)>,
    current: Option<(u64, Vec<f64>)>,
}

impl Differentiated {
    fn new() -> Differentiated {
        Differentiated {
            before: None,
            current: None,
        }
    }

    fn emit(a: &(u64, Vec<f64>), c: &(u64, Vec<f64>), b: &(u64, Vec<f64>), out: &mut Thinned) {
        let dt = (b.0 as f64 - a.0 as f64) * 1e-9;
        out.push(c.0, &c.1, |j| {
            if dt > 0.0 {
                (b.1[j] - a.1[j]) / dt
            } else {
                0.0
            }
        });
    }

    fn push(&mut self, ns: u64, position: &[f64], out: &mut Thinned) {
        let next = (ns, position.to_vec());
        if let Some(c) = &self.current {
            Self::emit(self.before.as_ref().unwrap_or(c), c, &next, out);
        }
        self.before = self.current.replace(next);
    }

    fn finish(self, out: &mut Thinned) {
        if let Some(c) = &self.current {
            Self::emit(self.before.as_ref().unwrap_or(c), c, c, out);
        }
    }
}

/// Everything gathered while streaming through the file.
struct Reading<'p> {
    path: &'p Path,
    limits: ReadLimits,
    schemas: HashMap<u16, bool>,
    channels: HashMap<u16, (Kind, String)>,
    metadata: BTreeMap<String, String>,
    joints: Vec<String>,
    start_ns: Option<u64>,
    commands: Option<Thinned>,
    measured: Option<(Differentiated, Thinned)>,
    chunks: Thinned,
    transitions: Vec<(u64, String)>,
    index: u64,
}

/// A transition's state is shown, so kept short whatever the file says.
const STATE_CHARS: usize = 64;
const TOPIC_CHARS: usize = 256;

impl Reading<'_> {
    /// Takes one record; `Ok(false)` once reading should stop (`partial` says why, if it must).
    fn record(
        &mut self,
        opcode: u8,
        data: &[u8],
        partial: &mut Option<Partial>,
    ) -> Result<bool, Stop> {
        match opcode {
            op::METADATA if data.len() > METADATA_BYTES => {
                return Err(Stop::Read(ReadError::Metadata {
                    path: self.path.to_path_buf(),
                    bytes: data.len(),
                }))
            }
            op::SCHEMA | op::CHANNEL | op::MESSAGE | op::METADATA => {}
            _ => return Ok(true),
        }
        match mcap::parse_record(opcode, data).map_err(Stop::Mcap)? {
            Record::Schema { header, .. } => {
                self.schemas
                    .insert(header.id, header.name == "sensor_msgs/msg/JointState");
            }
            Record::Channel(c) => {
                let joint_state = self.schemas.get(&c.schema_id).copied().unwrap_or(false);
                let kind = match c.topic.as_str() {
                    COMMAND_TOPIC if joint_state => Kind::Command,
                    CHUNKS_TOPIC => Kind::Chunks,
                    EVENTS_TOPIC => Kind::Events,
                    _ if joint_state => Kind::Measured,
                    _ => Kind::Other,
                };
                // Named in errors only: kept short whatever the file says.
                let topic = match kind {
                    Kind::Other => String::new(),
                    _ => c.topic.chars().take(TOPIC_CHARS).collect(),
                };
                self.channels.insert(c.id, (kind, topic));
            }
            Record::Metadata(m) if m.name == "pi0d" => self.metadata = m.metadata,
            Record::Message { header, data } => {
                self.index += 1;
                let Some((kind, _)) = self.channels.get(&header.channel_id) else {
                    return Err(Stop::Mcap(McapError::UnknownChannel(
                        header.sequence,
                        header.channel_id,
                    )));
                };
                match *kind {
                    Kind::Command | Kind::Measured => self.joint_state(
                        header.channel_id,
                        header.log_time,
                        &data,
                        *kind == Kind::Command,
                    )?,
                    Kind::Chunks => self.chunks.push(header.log_time, &[], |_| 0.0),
                    Kind::Events => {
                        let Ok(EventIn {
                            kind: Some(k),
                            to: Some(to),
                        }) = serde_json::from_slice(&data)
                        else {
                            return Ok(true);
                        };
                        if k != "transition" {
                            return Ok(true);
                        }
                        if self.transitions.len() >= self.limits.transitions {
                            *partial = Some(Partial::Transitions {
                                max: self.limits.transitions,
                            });
                            return Ok(false);
                        }
                        let to: String = to.chars().take(STATE_CHARS).collect();
                        self.transitions.push((header.log_time, to));
                    }
                    Kind::Other => {}
                }
            }
            _ => {}
        }
        Ok(true)
    }

    fn joint_state(
        &mut self,
        channel: u16,
        log_ns: u64,
        data: &[u8],
        command: bool,
    ) -> Result<(), Stop> {
        let topic = || {
            self.channels
                .get(&channel)
                .map(|(_, t)| t.clone())
                .unwrap_or_default()
        };
        let decode_err = |message: String| {
            Stop::Read(ReadError::Decode {
                path: self.path.to_path_buf(),
                topic: topic(),
                index: self.index,
                expected: "sensor_msgs/msg/JointState (CDR)",
                message,
            })
        };
        if data.len() < 4 || data[1] != 1 {
            return Err(decode_err("not little-endian CDR".into()));
        }
        let js = cdr_encoding::from_bytes::<JointStateIn, LittleEndian>(&data[4..])
            .map(|(m, _)| m)
            .map_err(|e| decode_err(e.to_string()))?;
        if js.name.is_empty() || js.name.len() > MAX_JOINTS {
            return Err(Stop::Read(ReadError::Joints {
                path: self.path.to_path_buf(),
                topic: topic(),
                index: self.index,
                count: js.name.len(),
            }));
        }
        if self.joints.is_empty() {
            self.joints = js.name.iter().map(CdrText::text).collect();
        }
        let n = self.joints.len();
        // A message of another width is not this run's (as before: left out).
        if js.position.len() != n {
            return Ok(());
        }
        let keep = self.limits.keep_samples;
        if command {
            self.start_ns.get_or_insert(log_ns);
            let v = &js.velocity;
            self.commands
                .get_or_insert_with(|| Thinned::new(n, keep))
                .push(log_ns, &js.position, |j| {
                    v.get(j).copied().unwrap_or(f64::NAN)
                });
        } else {
            let stamp = js.header.stamp;
            let stamp_ns = stamp.sec.max(0) as u64 * 1_000_000_000 + u64::from(stamp.nanosec);
            let (d, out) = self
                .measured
                .get_or_insert_with(|| (Differentiated::new(), Thinned::new(n, keep)));
            d.push(stamp_ns, &js.position, out);
        }
        Ok(())
    }
}

/// Why the streaming stopped short of the data's end.
enum Stop {
    Mcap(McapError),
    Read(ReadError),
}

/// Reads `path` into a `RunTrace`, within `ReadLimits::default()`.
pub fn read(path: &Path) -> Result<RunTrace, ReadError> {
    read_within(path, ReadLimits::default())
}

/// Reads `path` into a `RunTrace` within `limits`.
pub(crate) fn read_within(path: &Path, limits: ReadLimits) -> Result<RunTrace, ReadError> {
    let mut r = Reading {
        path,
        limits,
        schemas: HashMap::new(),
        channels: HashMap::new(),
        metadata: BTreeMap::new(),
        joints: Vec::new(),
        start_ns: None,
        commands: None,
        measured: None,
        chunks: Thinned::new(0, limits.keep_samples),
        transitions: Vec::new(),
        index: 0,
    };
    let mut partial = None;
    let streamed = stream::stream(path, limits.stream, |opcode, data| {
        match r.record(opcode, data, &mut partial) {
            Ok(true) => Flow::Go,
            Ok(false) => Flow::Done,
            Err(Stop::Mcap(e)) => Flow::Broken(e),
            Err(Stop::Read(e)) => Flow::Fail(e),
        }
    })
    .map_err(|e| match e {
        StreamError::Io(source) => ReadError::Open {
            path: path.to_path_buf(),
            source,
        },
        StreamError::Fail(e) => e,
    })?;
    if streamed.records == 0 {
        return Err(ReadError::NotMcap {
            path: path.to_path_buf(),
            source: match streamed.end {
                End::Broken(e) => e,
                _ => McapError::UnexpectedEof,
            },
        });
    }
    match streamed.end {
        End::Complete | End::Done => {}
        End::Broken(e) => {
            if r.commands.is_none() {
                return Err(ReadError::Broken {
                    path: path.to_path_buf(),
                    source: e,
                });
            }
            partial = Some(Partial::EndsEarly(e.to_string()));
        }
        End::Cut => partial = Some(Partial::EndsEarly("no end of its data section".into())),
        End::Decoded { bytes } => partial = Some(Partial::Decoded { bytes }),
    }
    trace_of(r, partial)
}

fn trace_of(r: Reading, partial: Option<Partial>) -> Result<RunTrace, ReadError> {
    let (Some(commands), Some(start)) = (r.commands, r.start_ns) else {
        return Err(ReadError::NotPi0d {
            path: r.path.to_path_buf(),
        });
    };
    let secs = |ns: u64| (ns as f64 - start as f64) * 1e-9;
    let measured = match r.measured {
        Some((d, mut out)) => {
            d.finish(&mut out);
            out.into_series(secs)
        }
        None => Series {
            position: vec![Vec::new(); r.joints.len()],
            velocity: vec![Vec::new(); r.joints.len()],
            ..Series::default()
        },
    };
    let mut trace = RunTrace {
        path: r.path.to_path_buf(),
        limits: limits(&r.metadata, &r.joints),
        metadata: r.metadata,
        joints: r.joints,
        start_ns: start,
        command: commands.into_series(secs),
        measured,
        chunks: r.chunks.seen,
        chunk_arrivals_s: r.chunks.ns.iter().map(|&ns| secs(ns)).collect(),
        spans: Vec::new(),
        partial,
    };
    trace.spans = spans(&r.transitions, secs, trace.duration_s());
    Ok(trace)
}

/// The spans between each transition out of `running` and the next one back. A transition
/// stamped before the one it follows is left out, so spans never overlap.
fn spans(transitions: &[(u64, String)], secs: impl Fn(u64) -> f64, end_s: f64) -> Vec<Span> {
    let mut out = Vec::new();
    let mut open: Option<(f64, &str)> = None;
    let mut last = f64::NEG_INFINITY;
    for (ns, to) in transitions {
        let t = secs(*ns);
        if t < last {
            continue;
        }
        last = t;
        if let Some((from_s, state)) = open.take() {
            out.push(Span {
                from_s,
                to_s: t,
                state: state.to_string(),
            });
        }
        if to != "running" && to != "starting" {
            open = Some((t, to));
        }
    }
    if let Some((from_s, state)) = open {
        out.push(Span {
            from_s,
            to_s: end_s.max(from_s),
            state: state.to_string(),
        });
    }
    out
}

fn limits(metadata: &BTreeMap<String, String>, joints: &[String]) -> Vec<PlotLimits> {
    let parsed: serde_json::Value = metadata
        .get("limits")
        .and_then(|l| serde_json::from_str(l).ok())
        .unwrap_or_default();
    joints
        .iter()
        .map(|j| PlotLimits {
            lower: parsed[j]["lower"].as_f64(),
            upper: parsed[j]["upper"].as_f64(),
            velocity: parsed[j]["velocity"].as_f64(),
        })
        .collect()
}

#[cfg(test)]
#[path = "read_tests.rs"]
mod tests;

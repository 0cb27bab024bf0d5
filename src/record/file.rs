//! The MCAP file: its schemas and channels, and how each record is encoded. ROS 2 channels
//! carry `ros2msg` schemas (the .msg text with its dependencies, as rosbag2 writes them) and
//! CDR payloads; pi0d's own records (chunks, events) are JSON with a JSON Schema.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use byteorder::LittleEndian;
use mcap::records::{MessageHeader, Metadata};
use serde::Serialize;
use serde_json::json;

use super::schemas;
use super::{Note, RecordError, TickSample};
use crate::control::controller::ChunkOutcome;
use crate::io::ros::{encode, msgs};
use crate::io::Blackboard;
use crate::observation::{CameraFrame, PixelFormat};
use crate::safety::{Mode, SafetyEvent};
use crate::telemetry::LiveStats;
use crate::time::MonoTime;

/// Topic names in the file.
#[derive(Clone, Debug)]
pub(crate) struct Topics {
    /// Robot joint names, in command order.
    pub(crate) joint_names: Vec<String>,
    /// The measured joint states (the robot's topic, or `/joint_states` for the simulator).
    pub(crate) joint_states: String,
    /// Camera names, in input order; each is recorded on `/pi0d/camera/<name>/compressed`.
    pub(crate) cameras: Vec<String>,
    /// The node name the diagnostics carry.
    pub(crate) node: String,
}

pub(crate) const COMMAND_TOPIC: &str = "/pi0d/command";
pub(crate) const CHUNKS_TOPIC: &str = "/pi0d/chunks";
pub(crate) const EVENTS_TOPIC: &str = "/pi0d/events";
pub(crate) const DIAGNOSTICS_TOPIC: &str = "/diagnostics";

pub(crate) fn camera_topic(name: &str) -> String {
    format!("/pi0d/camera/{name}/compressed")
}

struct Channels {
    joint_states: u16,
    command: u16,
    chunks: u16,
    events: u16,
    diagnostics: u16,
    cameras: Vec<u16>,
}

pub(crate) struct McapFile {
    w: mcap::Writer<BufWriter<File>>,
    /// The same file, for its size.
    file: File,
    path: PathBuf,
    size: SizeBound,
    ch: Channels,
    names: Vec<String>,
    node: String,
    last_measured: MonoTime,
    last_events: [u64; SafetyEvent::COUNT],
    last_frames: Vec<MonoTime>,
    sequence: u32,
    messages: u64,
}

fn write_err(path: &Path) -> impl Fn(mcap::McapError) -> RecordError + '_ {
    move |source| RecordError::Write {
        path: path.to_path_buf(),
        source,
    }
}

/// A ROS 2 message as rosbag2 stores it: the CDR encapsulation header (little endian), then
/// the CDR body.
fn cdr<T: Serialize>(msg: &T) -> Result<Vec<u8>, mcap::McapError> {
    let mut out = vec![0, 1, 0, 0];
    cdr_encoding::to_writer::<_, LittleEndian, _>(&mut out, msg)
        .map_err(|e| mcap::McapError::Io(std::io::Error::other(e)))?;
    Ok(out)
}

impl McapFile {
    /// Creates `path` (never replacing a file) with every schema and channel. The file never
    /// grows past `max_bytes`, index and all: a message that would take it there is refused
    /// (`RecordError::Full`) and the file can still be closed within the bound.
    pub(crate) fn create(
        path: &Path,
        topics: &Topics,
        metadata: &BTreeMap<String, String>,
        max_bytes: u64,
    ) -> Result<McapFile, RecordError> {
        let file = File::options()
            .write(true)
            .create_new(true)
            .open(path)
            .map_err(|source| match source.kind() {
                std::io::ErrorKind::AlreadyExists => RecordError::Exists {
                    path: path.to_path_buf(),
                },
                _ => RecordError::Create {
                    path: path.to_path_buf(),
                    source,
                },
            })?;
        let size_handle = file.try_clone().map_err(|source| RecordError::Create {
            path: path.to_path_buf(),
            source,
        })?;
        let err = write_err(path);
        let mut w = mcap::WriteOptions::new()
            .compression(Some(mcap::Compression::Zstd))
            .library(format!("pi0d {}", env!("CARGO_PKG_VERSION")))
            // Chunks end where `put` ends them, so that their number is known (see SizeBound).
            .chunk_size(None)
            .create(BufWriter::new(file))
            .map_err(&err)?;
        let none = BTreeMap::new();
        let joint_state = w
            .add_schema(schemas::JOINT_STATE.0, "ros2msg", schemas::JOINT_STATE.1)
            .map_err(&err)?;
        let image = w
            .add_schema(
                schemas::COMPRESSED_IMAGE.0,
                "ros2msg",
                schemas::COMPRESSED_IMAGE.1,
            )
            .map_err(&err)?;
        let diag = w
            .add_schema(
                schemas::DIAGNOSTIC_ARRAY.0,
                "ros2msg",
                schemas::DIAGNOSTIC_ARRAY.1,
            )
            .map_err(&err)?;
        let chunk = w
            .add_schema("pi0d.Chunk", "jsonschema", schemas::CHUNK_JSON.as_bytes())
            .map_err(&err)?;
        let event = w
            .add_schema("pi0d.Event", "jsonschema", schemas::EVENT_JSON.as_bytes())
            .map_err(&err)?;
        let ch = Channels {
            joint_states: w
                .add_channel(joint_state, &topics.joint_states, "cdr", &none)
                .map_err(&err)?,
            command: w
                .add_channel(joint_state, COMMAND_TOPIC, "cdr", &none)
                .map_err(&err)?,
            chunks: w
                .add_channel(chunk, CHUNKS_TOPIC, "json", &none)
                .map_err(&err)?,
            events: w
                .add_channel(event, EVENTS_TOPIC, "json", &none)
                .map_err(&err)?,
            diagnostics: w
                .add_channel(diag, DIAGNOSTICS_TOPIC, "cdr", &none)
                .map_err(&err)?,
            cameras: topics
                .cameras
                .iter()
                .map(|c| w.add_channel(image, &camera_topic(c), "cdr", &none))
                .collect::<Result<_, _>>()
                .map_err(&err)?,
        };
        let metadata = Metadata {
            name: "pi0d".into(),
            metadata: metadata.clone(),
        };
        w.write_metadata(&metadata).map_err(&err)?;
        w.flush().map_err(&err)?;
        let size = SizeBound::new(
            max_bytes,
            topics,
            &metadata.name,
            file_len(&size_handle, path)?,
        );
        if size.closed_size() > max_bytes {
            drop(w);
            // Ours (created above): a file that cannot hold its own index is no recording.
            let _ = std::fs::remove_file(path);
            return Err(RecordError::TooSmall {
                path: path.to_path_buf(),
                needed: size.closed_size(),
                max_bytes,
            });
        }
        Ok(McapFile {
            w,
            file: size_handle,
            path: path.to_path_buf(),
            size,
            last_frames: vec![MonoTime::ZERO; ch.cameras.len()],
            ch,
            names: topics.joint_names.clone(),
            node: topics.node.clone(),
            last_measured: MonoTime::ZERO,
            last_events: [0; SafetyEvent::COUNT],
            sequence: 0,
            messages: 0,
        })
    }

    fn wall_ns(&self, t: MonoTime) -> u64 {
        // Stamps in the file are wall-clock times, on the process's one offset, the one the ROS
        // edge converts stamps with: a frame's stamp is written as it came in.
        (t.as_nanos() as i128 + crate::time::wall_minus_mono_ns()).max(0) as u64
    }

    fn ros_time(&self, t: MonoTime) -> msgs::Time {
        msgs::Time::from_nanos(self.wall_ns(t) as i128)
    }

    fn put(
        &mut self,
        channel: u16,
        log: MonoTime,
        publish: MonoTime,
        data: &[u8],
    ) -> Result<(), RecordError> {
        let record = MESSAGE_RECORD + data.len() as u64;
        // Closing the open chunk replaces its bound by its real (compressed) size: the file
        // gets as close to the cap as it can before it is full.
        if self.size.open_messages > 0
            && (self.size.open_bytes + record > CHUNK_BYTES || !self.size.fits(channel, record))
        {
            self.flush()?;
        }
        if !self.size.fits(channel, record) {
            return Err(RecordError::Full {
                path: self.path.clone(),
                max_bytes: self.size.max_bytes,
            });
        }
        self.sequence = self.sequence.wrapping_add(1);
        let header = MessageHeader {
            channel_id: channel,
            sequence: self.sequence,
            log_time: self.wall_ns(log),
            publish_time: self.wall_ns(publish),
        };
        self.w
            .write_to_known_channel(&header, data)
            .map_err(write_err(&self.path))?;
        self.size.written(channel, record);
        self.messages += 1;
        Ok(())
    }

    fn put_cdr<T: Serialize>(
        &mut self,
        channel: u16,
        log: MonoTime,
        publish: MonoTime,
        msg: &T,
    ) -> Result<(), RecordError> {
        let data = cdr(msg).map_err(write_err(&self.path))?;
        self.put(channel, log, publish, &data)
    }

    fn put_json(
        &mut self,
        channel: u16,
        at: MonoTime,
        value: &serde_json::Value,
    ) -> Result<(), RecordError> {
        self.put(channel, at, at, value.to_string().as_bytes())
    }

    fn header(&self, stamp: MonoTime, frame_id: &str) -> msgs::Header {
        msgs::Header {
            stamp: self.ros_time(stamp),
            frame_id: frame_id.to_string(),
        }
    }

    /// The measured state (when it is new), the command, and any new safety events.
    pub(crate) fn tick(&mut self, t: &TickSample) -> Result<(), RecordError> {
        let m = &t.measured;
        if m.stamp != MonoTime::ZERO && m.stamp != self.last_measured {
            self.last_measured = m.stamp;
            let msg = msgs::JointState {
                header: self.header(m.stamp, ""),
                name: self.names.clone(),
                position: m.position.as_slice().to_vec(),
                velocity: Vec::new(),
                effort: Vec::new(),
            };
            self.put_cdr(self.ch.joint_states, t.at, m.stamp, &msg)?;
        }
        let c = &t.command;
        if c.position.len() == self.names.len() {
            let msg = msgs::JointState {
                header: self.header(t.at, ""),
                name: self.names.clone(),
                position: c.position.as_slice().to_vec(),
                velocity: c.velocity.as_slice().to_vec(),
                effort: Vec::new(),
            };
            self.put_cdr(self.ch.command, t.at, t.at, &msg)?;
        }
        for e in SafetyEvent::ALL {
            let (now, before) = (t.safety_events[e as usize], self.last_events[e as usize]);
            if now > before {
                let v = json!({"kind": "safety_event", "event": e.name(), "new": now - before, "total": now});
                self.put_json(self.ch.events, t.at, &v)?;
            }
        }
        self.last_events = t.safety_events;
        Ok(())
    }

    pub(crate) fn note(&mut self, n: Note) -> Result<(), RecordError> {
        let now = MonoTime::now();
        match n {
            Note::Chunk(c, model) => {
                let steps: Vec<_> = (0..c.steps())
                    .map(|i| {
                        let due = c.obs_stamp.offset_seconds(i as f64 * c.period_s);
                        json!({
                            "due_ns": self.wall_ns(due),
                            "position": c.positions[i].as_slice(),
                            "velocity": c.velocities[i].as_slice(),
                        })
                    })
                    .collect();
                let mut v = json!({
                    "seq": c.seq,
                    "observation_ns": self.wall_ns(c.obs_stamp),
                    "period_s": c.period_s,
                    "joints": self.names,
                    "steps": steps,
                });
                if let Some(m) = model {
                    let width = m.actions.len().checked_div(c.steps()).unwrap_or(0).max(1);
                    let rows: Vec<&[f32]> = m.actions.chunks(width).collect();
                    v["model"] = json!({
                        "actions": rows,
                        "reference_state": m.reference_state,
                        "conditioned_delay": m.conditioned_delay,
                    });
                }
                self.put_json(self.ch.chunks, now, &v)
            }
            Note::Transition(t) => {
                let event = match t.to {
                    Mode::Holding(r) => SafetyEvent::for_hold(r).map(SafetyEvent::name),
                    Mode::EStopped => Some(SafetyEvent::EStop.name()),
                    _ => None,
                };
                let v = json!({
                    "kind": "transition",
                    "from": t.from.to_string(),
                    "to": t.to.to_string(),
                    "mode": t.to.name(),
                    "safety_event": event,
                });
                self.put_json(self.ch.events, t.at, &v)
            }
            Note::Outcome(ChunkOutcome::Accepted {
                latency_s,
                seq,
                blend_correction,
            }) => {
                let v = json!({"kind": "chunk_accepted", "seq": seq, "latency_s": latency_s, "blend_correction": blend_correction});
                self.put_json(self.ch.events, now, &v)
            }
            Note::Outcome(ChunkOutcome::Rejected { reason, seq }) => {
                let v = json!({"kind": "chunk_late", "seq": seq, "reason": reason.name()});
                self.put_json(self.ch.events, now, &v)
            }
            Note::Refused {
                seq,
                reason,
                detail,
            } => {
                let v = json!({"kind": "chunk_refused", "seq": seq, "reason": reason, "detail": detail});
                self.put_json(self.ch.events, now, &v)
            }
            Note::ResetRefused => {
                self.put_json(self.ch.events, now, &json!({"kind": "reset_refused"}))
            }
        }
    }

    /// Camera `k`'s newest frame as JPEG, unless it was recorded already.
    pub(crate) fn frame(&mut self, k: usize, frame: &CameraFrame) -> Result<(), RecordError> {
        if k >= self.ch.cameras.len() || frame.stamp == self.last_frames[k] {
            return Ok(());
        }
        self.last_frames[k] = frame.stamp;
        let Some(jpeg) = jpeg(frame) else {
            return Ok(());
        };
        let msg = msgs::CompressedImage {
            header: self.header(frame.stamp, ""),
            format: "jpeg".into(),
            data: jpeg,
        };
        self.put_cdr(self.ch.cameras[k], MonoTime::now(), frame.stamp, &msg)
    }

    /// The daemon's health, as the ROS node publishes it on `/diagnostics`.
    pub(crate) fn diagnostics(
        &mut self,
        board: &Blackboard,
        live: &LiveStats,
        rate_hz: f64,
    ) -> Result<(), RecordError> {
        let now = MonoTime::now();
        let js_age = now.seconds_since(board.inputs.joint_state.load().stamp);
        let mut stamps = vec![MonoTime::ZERO; board.inputs.camera_stamps.len()];
        board.inputs.read_camera_stamps(&mut stamps);
        let ages: Vec<f64> = stamps.iter().map(|s| now.seconds_since(*s)).collect();
        let none = vec![None; ages.len()];
        let no_offsets = vec![None; ages.len()];
        let d = encode::diagnostics(
            self.ros_time(now),
            &self.node,
            live,
            rate_hz,
            &encode::InputHealth {
                joint_state_age_s: js_age,
                camera_ages_s: &ages,
                camera_latency_ms: &none,
                joint_state_clock_offset_s: None,
                camera_clock_offsets_s: &no_offsets,
                inputs_rejected: LiveStats::get(&live.inputs_rejected),
                decoder_faults: LiveStats::get(&live.input_decoder_faults),
                others: crate::io::ros::others::Others {
                    command_publishers: LiveStats::get(&live.others_command_publishers),
                    namesakes: LiveStats::get(&live.others_namesakes),
                },
            },
        );
        self.put_cdr(self.ch.diagnostics, now, now, &d)
    }

    /// Closes the current MCAP chunk and writes it out.
    pub(crate) fn flush(&mut self) -> Result<(), RecordError> {
        self.w.flush().map_err(write_err(&self.path))?;
        let len = file_len(&self.file, &self.path)?;
        self.size.closed(len);
        Ok(())
    }

    pub(crate) fn bytes(&self) -> u64 {
        self.file.metadata().map(|m| m.len()).unwrap_or(0)
    }

    pub(crate) fn messages(&self) -> u64 {
        self.messages
    }

    /// Writes the summary and index and closes the file: `(messages, bytes)`.
    pub(crate) fn finish(mut self) -> Result<(u64, u64), RecordError> {
        let err = write_err(&self.path);
        self.w.finish().map_err(&err)?;
        let mut inner = self.w.into_inner();
        inner.flush().map_err(|e| err(mcap::McapError::Io(e)))?;
        drop(inner);
        self.file
            .sync_all()
            .map_err(|e| err(mcap::McapError::Io(e)))?;
        let bytes = self.file.metadata().map(|m| m.len()).unwrap_or(0);
        Ok((self.messages, bytes))
    }
}

fn file_len(file: &File, path: &Path) -> Result<u64, RecordError> {
    file.metadata()
        .map(|m| m.len())
        .map_err(|e| write_err(path)(mcap::McapError::Io(e)))
}

/// Uncompressed bytes in a chunk before it is closed.
const CHUNK_BYTES: u64 = 1 << 20;
/// A message record: opcode and length, channel, sequence, log and publish time, data.
const MESSAGE_RECORD: u64 = 9 + 2 + 4 + 8 + 8;
/// A chunk record without its data: opcode and length, start and end time, uncompressed size
/// and CRC, compression ("zstd"), compressed size.
const CHUNK_RECORD: u64 = 9 + 8 + 8 + 8 + 4 + (4 + 4) + 8;
/// A chunk's message index for one channel, without its entries (16 bytes a message).
const MESSAGE_INDEX: u64 = 9 + 2 + 4;
/// A chunk index in the summary, without its per-channel offsets (10 bytes a channel).
const CHUNK_INDEX: u64 = 9 + 8 + 8 + 8 + 8 + 4 + 8 + (4 + 4) + 8 + 8;
/// Summary offsets (one per group: schemas, channels, statistics, chunk, attachment and
/// metadata indexes), data end, footer, end magic.
const CLOSING: u64 = 6 * (9 + 1 + 8 + 8) + (9 + 4) + (9 + 8 + 8 + 4) + 8;
/// Slack for what the arithmetic below might miss.
const SAFETY: u64 = 256;

/// zstd's output for `n` bytes at most: its own bound (ZSTD_COMPRESSBOUND) is `n + n/256 +
/// 64`; twice that margin covers the block headers of multithreaded streaming.
fn zstd_bound(n: u64) -> u64 {
    n + n / 128 + 512
}

/// A chunk of `bytes` (uncompressed records) holding `messages` on `channels`, closed: its
/// record compressed at worst, its message indexes, and its chunk index in the summary.
fn chunk_bound(bytes: u64, messages: u64, channels: u64) -> u64 {
    CHUNK_RECORD
        + zstd_bound(bytes)
        + channels * MESSAGE_INDEX
        + 16 * messages
        + CHUNK_INDEX
        + 10 * channels
}

/// What the file will take on disk once closed, bounded from above, as the MCAP writer lays
/// it out (github.com/foxglove/mcap, spec: records, chunks, summary section).
#[derive(Clone, Copy, Debug)]
struct SizeBound {
    max_bytes: u64,
    /// The file's length after the last closed chunk (exact: the writer was flushed).
    committed: u64,
    /// The open chunk: uncompressed bytes of its records, its messages, and the channels
    /// they are on (bit `id`; an id past 127 counts as a new channel each time).
    open_bytes: u64,
    open_messages: u64,
    open_channels: u128,
    open_untracked: u64,
    /// The summary's chunk indexes for the chunks closed so far (the first holds the schemas
    /// and channels: no messages).
    chunk_indexes: u64,
    /// The summary's part that does not grow: schemas and channels again, statistics, the
    /// metadata index, and `CLOSING`.
    fixed_tail: u64,
}

impl SizeBound {
    fn new(max_bytes: u64, topics: &Topics, metadata_name: &str, committed: u64) -> SizeBound {
        let schema = |(name, data): (&str, &[u8]), encoding: &str| {
            9 + 2 + (4 + name.len() + 4 + encoding.len() + 4 + data.len()) as u64
        };
        let schemas = schema(schemas::JOINT_STATE, "ros2msg")
            + schema(schemas::COMPRESSED_IMAGE, "ros2msg")
            + schema(schemas::DIAGNOSTIC_ARRAY, "ros2msg")
            + schema(("pi0d.Chunk", schemas::CHUNK_JSON.as_bytes()), "jsonschema")
            + schema(("pi0d.Event", schemas::EVENT_JSON.as_bytes()), "jsonschema");
        let channel = |topic: &str, encoding: &str| {
            9 + 2 + 2 + (4 + topic.len() + 4 + encoding.len() + 4) as u64
        };
        let channels = channel(&topics.joint_states, "cdr")
            + channel(COMMAND_TOPIC, "cdr")
            + channel(CHUNKS_TOPIC, "json")
            + channel(EVENTS_TOPIC, "json")
            + channel(DIAGNOSTICS_TOPIC, "cdr")
            + topics
                .cameras
                .iter()
                .map(|c| channel(&camera_topic(c), "cdr"))
                .sum::<u64>();
        let count = 5 + topics.cameras.len() as u64;
        let statistics = 9 + 8 + 2 + 4 + 4 + 4 + 4 + 8 + 8 + 4 + 10 * count;
        let metadata_index = 9 + 8 + 8 + 4 + metadata_name.len() as u64;
        SizeBound {
            max_bytes,
            committed,
            open_bytes: 0,
            open_messages: 0,
            open_channels: 0,
            open_untracked: 0,
            chunk_indexes: CHUNK_INDEX,
            fixed_tail: schemas + channels + statistics + metadata_index + CLOSING + SAFETY,
        }
    }

    /// The summary if the file were closed with no chunk open.
    fn tail(&self) -> u64 {
        self.fixed_tail + self.chunk_indexes
    }

    /// Channels in the open chunk (at most).
    fn open_channels(&self) -> u64 {
        u64::from(self.open_channels.count_ones()) + self.open_untracked
    }

    /// Channels in the open chunk, with `channel`'s message added.
    fn channels_with(&self, channel: u16) -> u64 {
        match 1u128.checked_shl(u32::from(channel)) {
            Some(bit) => u64::from((self.open_channels | bit).count_ones()) + self.open_untracked,
            None => self.open_channels() + 1,
        }
    }

    /// The file's size if it were closed now with no chunk open.
    fn closed_size(&self) -> u64 {
        self.committed + self.tail()
    }

    /// The file's size, closed, with a message record of `record` bytes on `channel` more in
    /// the open chunk: the chunk compressed at worst, its message indexes, its chunk index.
    fn with(&self, channel: u16, record: u64) -> u64 {
        let chunk = chunk_bound(
            self.open_bytes + record,
            self.open_messages + 1,
            self.channels_with(channel),
        );
        self.closed_size() + chunk
    }

    /// The file's size if it were closed now.
    #[cfg(test)]
    fn bound(&self) -> u64 {
        let open = (self.open_messages > 0)
            .then(|| chunk_bound(self.open_bytes, self.open_messages, self.open_channels()));
        self.closed_size() + open.unwrap_or(0)
    }

    fn fits(&self, channel: u16, record: u64) -> bool {
        self.with(channel, record) <= self.max_bytes
    }

    fn written(&mut self, channel: u16, record: u64) {
        self.open_bytes += record;
        self.open_messages += 1;
        match 1u128.checked_shl(u32::from(channel)) {
            Some(bit) => self.open_channels |= bit,
            None => self.open_untracked += 1,
        }
    }

    /// The open chunk was closed: the file is `len` bytes long.
    fn closed(&mut self, len: u64) {
        if self.open_messages > 0 {
            self.chunk_indexes += CHUNK_INDEX + 10 * self.open_channels();
        }
        self.committed = len;
        self.open_bytes = 0;
        self.open_messages = 0;
        self.open_channels = 0;
        self.open_untracked = 0;
    }
}

/// A frame as JPEG (colour or grey), or `None` for a frame whose size does not match its data.
fn jpeg(f: &CameraFrame) -> Option<Vec<u8>> {
    use image::ExtendedColorType;
    let (w, h) = (f.width, f.height);
    let pixels = w as usize * h as usize;
    let (data, kind): (std::borrow::Cow<[u8]>, _) = match f.format {
        PixelFormat::Rgb8 if f.data.len() == pixels * 3 => {
            (f.data.as_slice().into(), ExtendedColorType::Rgb8)
        }
        PixelFormat::Bgr8 if f.data.len() == pixels * 3 => (
            f.data
                .chunks_exact(3)
                .flat_map(|p| [p[2], p[1], p[0]])
                .collect::<Vec<u8>>()
                .into(),
            ExtendedColorType::Rgb8,
        ),
        PixelFormat::Mono8 if f.data.len() == pixels => {
            (f.data.as_slice().into(), ExtendedColorType::L8)
        }
        _ => return None,
    };
    let mut out = Vec::new();
    image::codecs::jpeg::JpegEncoder::new_with_quality(&mut out, 85)
        .encode(&data, w, h, kind)
        .ok()?;
    Some(out)
}

#[cfg(test)]
#[path = "file_tests.rs"]
mod tests;

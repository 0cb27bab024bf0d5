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
use crate::control::stats::LiveStats;
use crate::io::ros::{encode, msgs};
use crate::io::Blackboard;
use crate::policy::{CameraFrame, PixelFormat};
use crate::safety::{Mode, SafetyEvent};
use crate::time::MonoTime;

/// Topic names in the file.
#[derive(Clone, Debug)]
pub struct Topics {
    /// Robot joint names, in command order.
    pub joint_names: Vec<String>,
    /// The measured joint states (the robot's topic, or `/joint_states` for the simulator).
    pub joint_states: String,
    /// Camera names, in input order; each is recorded on `/pi0d/camera/<name>/compressed`.
    pub cameras: Vec<String>,
    /// The node name the diagnostics carry.
    pub node: String,
}

pub const COMMAND_TOPIC: &str = "/pi0d/command";
pub const CHUNKS_TOPIC: &str = "/pi0d/chunks";
pub const EVENTS_TOPIC: &str = "/pi0d/events";
pub const DIAGNOSTICS_TOPIC: &str = "/diagnostics";

pub fn camera_topic(name: &str) -> String {
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

pub struct McapFile {
    w: mcap::Writer<BufWriter<File>>,
    /// The same file, for its size.
    file: File,
    path: PathBuf,
    ch: Channels,
    names: Vec<String>,
    node: String,
    /// Unix time minus monotonic time, ns: stamps in the file are wall-clock times.
    wall_offset_ns: i128,
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
    /// Creates `path` (never replacing a file) with every schema and channel.
    pub fn create(
        path: &Path,
        topics: &Topics,
        metadata: &BTreeMap<String, String>,
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
        w.write_metadata(&Metadata {
            name: "pi0d".into(),
            metadata: metadata.clone(),
        })
        .map_err(&err)?;
        let wall = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as i128)
            .unwrap_or(0);
        Ok(McapFile {
            w,
            file: size_handle,
            path: path.to_path_buf(),
            last_frames: vec![MonoTime::ZERO; ch.cameras.len()],
            ch,
            names: topics.joint_names.clone(),
            node: topics.node.clone(),
            wall_offset_ns: wall - MonoTime::now().as_nanos() as i128,
            last_measured: MonoTime::ZERO,
            last_events: [0; SafetyEvent::COUNT],
            sequence: 0,
            messages: 0,
        })
    }

    fn wall_ns(&self, t: MonoTime) -> u64 {
        (t.as_nanos() as i128 + self.wall_offset_ns).max(0) as u64
    }

    fn ros_time(&self, t: MonoTime) -> msgs::Time {
        let ns = self.wall_ns(t);
        msgs::Time {
            sec: (ns / 1_000_000_000).min(i32::MAX as u64) as i32,
            nanosec: (ns % 1_000_000_000) as u32,
        }
    }

    fn put(
        &mut self,
        channel: u16,
        log: MonoTime,
        publish: MonoTime,
        data: &[u8],
    ) -> Result<(), RecordError> {
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
    pub fn tick(&mut self, t: &TickSample) -> Result<(), RecordError> {
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

    pub fn note(&mut self, n: Note) -> Result<(), RecordError> {
        let now = MonoTime::now();
        match n {
            Note::Chunk(c) => {
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
                let v = json!({
                    "seq": c.seq,
                    "observation_ns": self.wall_ns(c.obs_stamp),
                    "period_s": c.period_s,
                    "joints": self.names,
                    "steps": steps,
                });
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
    pub fn frame(&mut self, k: usize, frame: &CameraFrame) -> Result<(), RecordError> {
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
    pub fn diagnostics(
        &mut self,
        board: &Blackboard,
        live: &LiveStats,
        rate_hz: f64,
    ) -> Result<(), RecordError> {
        let now = MonoTime::now();
        let js_age = now.seconds_since(board.joint_state.load().stamp);
        let mut stamps = vec![MonoTime::ZERO; board.camera_stamps.len()];
        board.read_camera_stamps(&mut stamps);
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
            },
        );
        self.put_cdr(self.ch.diagnostics, now, now, &d)
    }

    /// Closes the current MCAP chunk and writes it out.
    pub fn flush(&mut self) -> Result<(), RecordError> {
        self.w.flush().map_err(write_err(&self.path))
    }

    pub fn bytes(&self) -> u64 {
        self.file.metadata().map(|m| m.len()).unwrap_or(0)
    }

    pub fn messages(&self) -> u64 {
        self.messages
    }

    /// Writes the summary and index and closes the file: `(messages, bytes)`.
    pub fn finish(mut self) -> Result<(u64, u64), RecordError> {
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

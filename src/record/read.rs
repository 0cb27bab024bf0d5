//! Reading a pi0d recording back: what `pi0d plot` draws. Only pi0d's own channels are read
//! (the commands, the measured joint states, chunks, events) and the run's metadata; a file
//! that ends early (a killed run) gives what it holds, with a note.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use byteorder::LittleEndian;
use mcap::read::Options;
use mcap::records::Record;

use super::file::{CHUNKS_TOPIC, COMMAND_TOPIC, EVENTS_TOPIC};
use crate::io::ros::msgs;

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
        source: mcap::McapError,
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
}

/// A joint's commanded range and velocity limit, from the recording's metadata.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct PlotLimits {
    pub lower: Option<f64>,
    pub upper: Option<f64>,
    pub velocity: Option<f64>,
}

/// Samples of every joint at times `t` (seconds since the recording's first command).
#[derive(Clone, Debug, Default)]
pub struct Series {
    pub t: Vec<f64>,
    /// `[joint][sample]`.
    pub position: Vec<Vec<f64>>,
    pub velocity: Vec<Vec<f64>>,
}

/// A span the arm was not running: holding (`reason`), e-stopped, or stopping.
#[derive(Clone, Debug, PartialEq)]
pub struct Span {
    pub from_s: f64,
    pub to_s: f64,
    pub state: String,
}

#[derive(Clone, Debug, Default)]
pub struct RunTrace {
    pub metadata: BTreeMap<String, String>,
    pub joints: Vec<String>,
    pub limits: Vec<PlotLimits>,
    /// Unix time (ns) of t = 0.
    pub start_ns: u64,
    pub command: Series,
    /// Measured positions; velocities by finite differences.
    pub measured: Series,
    pub chunk_arrivals_s: Vec<f64>,
    pub spans: Vec<Span>,
    /// Why the file could not be read to its end, when it could not.
    pub truncated: Option<String>,
}

impl RunTrace {
    pub fn duration_s(&self) -> f64 {
        self.command.t.last().copied().unwrap_or(0.0)
    }
}

struct Raw {
    log_ns: u64,
    stamp_ns: u64,
    position: Vec<f64>,
    velocity: Vec<f64>,
}

fn joint_state(
    data: &[u8],
    path: &Path,
    topic: &str,
    index: u64,
) -> Result<msgs::JointState, ReadError> {
    let decode_err = |message: String| ReadError::Decode {
        path: path.to_path_buf(),
        topic: topic.to_string(),
        index,
        expected: "sensor_msgs/msg/JointState (CDR)",
        message,
    };
    if data.len() < 4 || data[1] != 1 {
        return Err(decode_err("not little-endian CDR".into()));
    }
    cdr_encoding::from_bytes::<msgs::JointState, LittleEndian>(&data[4..])
        .map(|(m, _)| m)
        .map_err(|e| decode_err(e.to_string()))
}

/// Reads `path` into a `RunTrace`.
pub fn read(path: &Path) -> Result<RunTrace, ReadError> {
    let bytes = std::fs::read(path).map_err(|source| ReadError::Open {
        path: path.to_path_buf(),
        source,
    })?;
    if !bytes.starts_with(mcap::MAGIC) {
        return Err(ReadError::NotMcap {
            path: path.to_path_buf(),
            source: mcap::McapError::BadMagic,
        });
    }
    let mut trace = RunTrace::default();
    let linear = mcap::read::LinearReader::new_with_options(&bytes, Options::IgnoreEndMagic.into())
        .map_err(|source| ReadError::NotMcap {
            path: path.to_path_buf(),
            source,
        })?;
    for record in linear {
        match record {
            Ok(Record::Metadata(m)) if m.name == "pi0d" => trace.metadata = m.metadata,
            Ok(_) => {}
            Err(_) => break,
        }
    }
    let stream = mcap::MessageStream::new_with_options(&bytes, Options::IgnoreEndMagic.into())
        .map_err(|source| ReadError::NotMcap {
            path: path.to_path_buf(),
            source,
        })?;
    let (mut commands, mut measured) = (Vec::new(), Vec::new());
    let mut chunks = Vec::new();
    let mut events: Vec<(u64, serde_json::Value)> = Vec::new();
    let mut index = 0u64;
    for m in stream {
        let m = match m {
            Ok(m) => m,
            Err(e) => {
                trace.truncated = Some(e.to_string());
                break;
            }
        };
        index += 1;
        let topic = m.channel.topic.as_str();
        let schema = m.channel.schema.as_ref().map(|s| s.name.as_str());
        if topic == CHUNKS_TOPIC {
            chunks.push(m.log_time);
        } else if topic == EVENTS_TOPIC {
            if let Ok(v) = serde_json::from_slice::<serde_json::Value>(&m.data) {
                events.push((m.log_time, v));
            }
        } else if schema == Some("sensor_msgs/msg/JointState") {
            let js = joint_state(&m.data, path, topic, index)?;
            if trace.joints.is_empty() {
                trace.joints = js.name.clone();
            }
            let raw = Raw {
                log_ns: m.log_time,
                stamp_ns: js.header.stamp.sec.max(0) as u64 * 1_000_000_000
                    + js.header.stamp.nanosec as u64,
                position: js.position,
                velocity: js.velocity,
            };
            if topic == COMMAND_TOPIC {
                commands.push(raw);
            } else {
                measured.push(raw);
            }
        }
    }
    let Some(first) = commands.first() else {
        return Err(ReadError::NotPi0d {
            path: path.to_path_buf(),
        });
    };
    let n = trace.joints.len();
    trace.start_ns = first.log_ns;
    let start = trace.start_ns;
    let secs = |ns: u64| (ns as f64 - start as f64) * 1e-9;
    trace.command = series(&commands, n, |r| secs(r.log_ns));
    trace.measured = series(&measured, n, |r| secs(r.stamp_ns));
    differentiate(&mut trace.measured);
    trace.chunk_arrivals_s = chunks.into_iter().map(secs).collect();
    trace.spans = spans(&events, secs, trace.duration_s());
    trace.limits = limits(&trace.metadata, &trace.joints);
    Ok(trace)
}

fn series(raw: &[Raw], joints: usize, t: impl Fn(&Raw) -> f64) -> Series {
    let mut s = Series {
        t: Vec::with_capacity(raw.len()),
        position: vec![Vec::with_capacity(raw.len()); joints],
        velocity: vec![Vec::with_capacity(raw.len()); joints],
    };
    for r in raw.iter().filter(|r| r.position.len() == joints) {
        s.t.push(t(r));
        for j in 0..joints {
            s.position[j].push(r.position[j]);
            s.velocity[j].push(r.velocity.get(j).copied().unwrap_or(f64::NAN));
        }
    }
    s
}

/// Velocities from positions by central differences (one-sided at the ends).
fn differentiate(s: &mut Series) {
    let n = s.t.len();
    for (p, v) in s.position.iter().zip(s.velocity.iter_mut()) {
        for (i, v) in v.iter_mut().enumerate().take(n) {
            let (a, b) = (i.saturating_sub(1), (i + 1).min(n - 1));
            let dt = s.t[b] - s.t[a];
            *v = if dt > 0.0 { (p[b] - p[a]) / dt } else { 0.0 };
        }
    }
}

/// The spans between each transition out of `running` and the next one back.
fn spans(events: &[(u64, serde_json::Value)], secs: impl Fn(u64) -> f64, end_s: f64) -> Vec<Span> {
    let mut out = Vec::new();
    let mut open: Option<(f64, String)> = None;
    for (ns, e) in events.iter().filter(|(_, e)| e["kind"] == "transition") {
        let (Some(to), t) = (e["to"].as_str(), secs(*ns)) else {
            continue;
        };
        if let Some((from_s, state)) = open.take() {
            out.push(Span {
                from_s,
                to_s: t,
                state,
            });
        }
        if to != "running" && to != "starting" {
            open = Some((t, to.to_string()));
        }
    }
    if let Some((from_s, state)) = open {
        out.push(Span {
            from_s,
            to_s: end_s,
            state,
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
mod tests {
    use super::*;

    #[test]
    fn when_a_hold_interrupts_running_expect_one_span_until_running_again() {
        let ev = |kind: &str, to: &str| serde_json::json!({"kind": kind, "to": to});
        let events = vec![
            (1_000_000_000, ev("transition", "running")),
            (2_000_000_000, ev("transition", "estopped")),
            (2_100_000_000, ev("safety_event", "")),
            (3_000_000_000, ev("transition", "holding(after_reset)")),
            (3_500_000_000, ev("transition", "running")),
            (4_000_000_000, ev("transition", "stopping")),
        ];
        let s = spans(&events, |ns| ns as f64 * 1e-9, 5.0);
        let got: Vec<(f64, f64, &str)> = s
            .iter()
            .map(|s| (s.from_s, s.to_s, s.state.as_str()))
            .collect();
        assert_eq!(
            got,
            [
                (2.0, 3.0, "estopped"),
                (3.0, 3.5, "holding(after_reset)"),
                (4.0, 5.0, "stopping")
            ]
        );
    }

    #[test]
    fn when_positions_ramp_expect_their_slope_as_velocity() {
        let mut s = Series {
            t: vec![0.0, 0.1, 0.2, 0.3],
            position: vec![vec![0.0, 0.2, 0.4, 0.6]],
            velocity: vec![vec![0.0; 4]],
        };
        differentiate(&mut s);
        for v in &s.velocity[0] {
            assert!((v - 2.0).abs() < 1e-12, "{v}");
        }
    }
}

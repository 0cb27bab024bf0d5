//! Calibration from a `[record]` recording: the robot's own observations (camera frames, joint
//! positions, the prompt) run through the real preprocessing and the float model, as the
//! daemon would have run them.
//!
//! From the MCAP file: the frames of `/pi0d/camera/<name>/compressed` (cameras in the order
//! the recording created them, which is the configuration's), the measured joint states (the
//! `sensor_msgs/msg/JointState` channel that is not pi0d's own command), and the `prompt` of
//! pi0d's metadata. Each observation is the first camera's frame with every camera's latest
//! frame and the latest joint state at that time; at most `MAX_OBSERVATIONS`, spread evenly
//! over the run.

use std::io::Cursor;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use byteorder::LittleEndian;
use cdr_encoding::from_bytes;
use mcap::records::Record;
use rand::SeedableRng;
use rand_distr::{Distribution, StandardNormal};

use super::calibrate::{Calibration, Purpose, Recorder};
use super::QuantizeError;
use crate::config::BackendOptions;
use crate::io::ros::msgs;
use crate::observation::{CameraFrame, PixelFormat};
use crate::policy::pi0::pipeline::{Pi0Pipeline, PipelineOptions};

/// Observations run per recording, at most.
const MAX_OBSERVATIONS: usize = 32;
/// A decoded frame's bytes, at most (as the camera input's own cap).
const MAX_FRAME_BYTES: u64 = 64 << 20;
const MAGIC: &[u8] = b"\x89MCAP0\r\n";

/// Whether `path` is an MCAP file (by its magic bytes).
pub(crate) fn is_recording(path: &Path) -> bool {
    use std::io::Read;
    let mut head = [0u8; 8];
    std::fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut head))
        .is_ok_and(|()| head == MAGIC)
}

/// One observation as recorded.
pub(crate) struct Recorded {
    pub(crate) frames: Vec<Option<Arc<CameraFrame>>>,
    pub(crate) state: Vec<f32>,
}

fn refused(path: &Path, reason: impl std::fmt::Display) -> QuantizeError {
    QuantizeError::Invalid(format!(
        "--calibration {}: {reason} (expected a `pi0d infer` inputs file, or a recording pi0d made with [record])",
        path.display()
    ))
}

/// The observations of the recording at `path`, and its prompt.
pub(crate) fn read(path: &Path) -> Result<(Vec<Recorded>, String), QuantizeError> {
    let bytes = std::fs::read(path).map_err(|source| QuantizeError::Io {
        path: path.into(),
        source,
    })?;
    let records = mcap::read::ChunkFlattener::new(&bytes).map_err(|e| refused(path, e))?;
    let mut cameras: Vec<u16> = Vec::new();
    let mut joints: Option<u16> = None;
    let mut prompt = None;
    let mut latest: Vec<Option<Arc<CameraFrame>>> = Vec::new();
    let mut state: Option<Vec<f32>> = None;
    let mut out = Vec::new();
    for record in records {
        // A recording cut short (a killed run) still gives what it holds.
        let Ok(record) = record else { break };
        match record {
            Record::Channel(c) => {
                if c.topic.starts_with("/pi0d/camera/") && c.topic.ends_with("/compressed") {
                    cameras.push(c.id);
                    latest.push(None);
                } else if !c.topic.starts_with("/pi0d/") && joints.is_none() {
                    // pi0d records the measured joint states on the robot's own topic.
                    if c.topic != "/diagnostics" {
                        joints = Some(c.id);
                    }
                }
            }
            Record::Metadata(m) if m.name == "pi0d" => prompt = m.metadata.get("prompt").cloned(),
            Record::Message { header, data } => {
                let cdr = || data.get(4..).filter(|_| data.get(1) == Some(&1));
                if Some(header.channel_id) == joints {
                    let Some(body) = cdr() else {
                        return Err(refused(path, "a joint state is not little-endian CDR"));
                    };
                    let (js, _) = from_bytes::<msgs::JointState, LittleEndian>(body)
                        .map_err(|e| refused(path, format!("a joint state: {e}")))?;
                    state = Some(js.position.iter().map(|v| *v as f32).collect());
                } else if let Some(k) = cameras.iter().position(|c| *c == header.channel_id) {
                    let Some(body) = cdr() else {
                        return Err(refused(path, "a camera frame is not little-endian CDR"));
                    };
                    let (img, _) = from_bytes::<msgs::CompressedImage, LittleEndian>(body)
                        .map_err(|e| refused(path, format!("a camera frame: {e}")))?;
                    latest[k] = Some(Arc::new(decode(&img.data).map_err(|e| {
                        refused(path, format!("a camera frame does not decode: {e}"))
                    })?));
                    if let (0, Some(s)) = (k, &state) {
                        out.push(Recorded {
                            frames: latest.clone(),
                            state: s.clone(),
                        });
                    }
                }
            }
            _ => {}
        }
    }
    let Some(prompt) = prompt else {
        return Err(refused(path, "no pi0d metadata with the prompt"));
    };
    if out.is_empty() {
        return Err(refused(
            path,
            "no camera frame with a joint state before it (record.camera_hz 0, or the run ended before the first)",
        ));
    }
    // Evenly spread over the run.
    let step = out.len().div_ceil(MAX_OBSERVATIONS);
    let out = out.into_iter().step_by(step).collect();
    Ok((out, prompt))
}

/// A recorded JPEG or PNG frame, as RGB8.
fn decode(data: &[u8]) -> Result<CameraFrame, image::ImageError> {
    let mut reader = image::ImageReader::new(Cursor::new(data)).with_guessed_format()?;
    let mut limits = image::Limits::default();
    limits.max_alloc = Some(MAX_FRAME_BYTES);
    reader.limits(limits);
    let rgb = reader.decode()?.into_rgb8();
    Ok(CameraFrame {
        stamp: crate::time::MonoTime::ZERO,
        width: rgb.width(),
        height: rgb.height(),
        format: PixelFormat::Rgb8,
        data: rgb.into_raw(),
    })
}

/// Runs the float checkpoint's whole pipeline on every recording's observations (seeded noise,
/// so a rerun calibrates the same) and collects what its linear layers see.
pub(crate) fn collect(
    checkpoint: &Path,
    arch: Option<&Path>,
    recordings: &[PathBuf],
    purpose: Purpose,
    threads: usize,
) -> Result<Calibration, QuantizeError> {
    let recorder = Arc::new(Recorder::new(purpose));
    let mut pipeline = Pi0Pipeline::load_observed(
        &PipelineOptions {
            checkpoint: checkpoint.into(),
            arch: arch.map(Path::to_path_buf),
            tokenizer: None,
            threads,
            backend: BackendOptions::Cpu,
            openpi_delta_actions: None,
        },
        Some(recorder.clone()),
    )
    .map_err(|e| QuantizeError::Invalid(format!("{}: {e}", checkpoint.display())))?;
    let mut rng = rand::rngs::StdRng::seed_from_u64(0);
    for path in recordings {
        let (observations, prompt) = read(path)?;
        tracing::info!(
            "calibration: running the float model on {} ({} observations)",
            path.display(),
            observations.len()
        );
        for o in observations {
            if o.state.len() != pipeline.state_dim {
                return Err(refused(
                    path,
                    format!(
                        "its joint states have {} positions, the checkpoint's state {}",
                        o.state.len(),
                        pipeline.state_dim
                    ),
                ));
            }
            let a = &pipeline.arch;
            let noise: Vec<f32> = (0..a.chunk * a.action_dim)
                .map(|_| StandardNormal.sample(&mut rng))
                .collect();
            let frames: Vec<Option<&CameraFrame>> = o.frames.iter().map(|f| f.as_deref()).collect();
            recorder.begin_observation();
            pipeline
                .run(&frames, &o.state, &prompt, &noise)
                .map_err(|e| refused(path, e))?;
        }
    }
    drop(pipeline);
    Ok(recorder.finish())
}

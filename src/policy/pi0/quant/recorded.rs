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

/// Whether `path` is an MCAP file (by its magic bytes); a FIFO or a device is not opened for
/// good (its reader refuses it by name).
pub(crate) fn is_recording(path: &Path) -> bool {
    use std::io::Read;
    let mut head = [0u8; 8];
    crate::files::open_regular(path)
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
        crate::outside::path(path)
    ))
}

/// A camera frame as recorded (JPEG or PNG), decoded only for the observations kept.
type Compressed = Arc<Vec<u8>>;

/// What the reading keeps: the channels found, the latest of each input, and the
/// observations, thinned evenly as they are read (at most `2 * MAX_OBSERVATIONS` held, so a
/// long run costs no more memory than a short one).
#[derive(Default)]
struct Reading {
    cameras: Vec<u16>,
    joints: Option<u16>,
    prompt: Option<String>,
    latest: Vec<Option<Compressed>>,
    state: Option<Vec<f32>>,
    kept: Vec<(Vec<Option<Compressed>>, Vec<f32>)>,
    /// Every `stride`-th observation is kept.
    stride: usize,
    seen: usize,
}

impl Reading {
    fn record(&mut self, record: Record<'_>) -> Result<(), String> {
        match record {
            Record::Channel(c) => {
                if c.topic.starts_with("/pi0d/camera/") && c.topic.ends_with("/compressed") {
                    if self.cameras.len() >= crate::config::MAX_CAMERAS {
                        return Err(format!(
                            "more than {} camera channels; pi0d records at most that many",
                            crate::config::MAX_CAMERAS
                        ));
                    }
                    self.cameras.push(c.id);
                    self.latest.push(None);
                } else if !c.topic.starts_with("/pi0d/")
                    && self.joints.is_none()
                    && c.topic != "/diagnostics"
                {
                    // pi0d records the measured joint states on the robot's own topic.
                    self.joints = Some(c.id);
                }
            }
            Record::Metadata(m) if m.name == "pi0d" => {
                self.prompt = m.metadata.get("prompt").cloned()
            }
            Record::Message { header, data } => {
                let cdr = || data.get(4..).filter(|_| data.get(1) == Some(&1));
                if Some(header.channel_id) == self.joints {
                    let body = cdr().ok_or("a joint state is not little-endian CDR")?;
                    let (js, _) = from_bytes::<msgs::JointState, LittleEndian>(body)
                        .map_err(|e| format!("a joint state: {e}"))?;
                    if js.position.len() > crate::joints::MAX_JOINTS {
                        return Err(format!(
                            "a joint state of {} positions; pi0d commands at most {}",
                            js.position.len(),
                            crate::joints::MAX_JOINTS
                        ));
                    }
                    self.state = Some(js.position.iter().map(|v| *v as f32).collect());
                } else if let Some(k) = self.cameras.iter().position(|c| *c == header.channel_id) {
                    let body = cdr().ok_or("a camera frame is not little-endian CDR")?;
                    let (img, _) = from_bytes::<msgs::CompressedImage, LittleEndian>(body)
                        .map_err(|e| format!("a camera frame: {e}"))?;
                    self.latest[k] = Some(Arc::new(img.data));
                    if let (0, Some(s)) = (k, &self.state) {
                        self.observe(s.clone());
                    }
                }
            }
            _ => {}
        }
        Ok(())
    }

    fn observe(&mut self, state: Vec<f32>) {
        let stride = self.stride.max(1);
        if self.seen.is_multiple_of(stride) {
            self.kept.push((self.latest.clone(), state));
            if self.kept.len() >= 2 * MAX_OBSERVATIONS {
                // Every other one goes, and from now on every other one is taken.
                let mut i = 0;
                self.kept.retain(|_| {
                    i += 1;
                    i % 2 == 1
                });
                // Those kept are the multiples of the doubled stride: `seen` goes on counting.
                self.stride = stride * 2;
            }
        }
        self.seen += 1;
    }
}

/// The observations of the recording at `path`, and its prompt. The file is streamed within
/// the recordings' bounds (`record::stream`); a recording that ends early (a killed run)
/// gives what it holds, with a line saying so; a damaged one is refused naming it.
pub(crate) fn read(path: &Path) -> Result<(Vec<Recorded>, String), QuantizeError> {
    use crate::record::stream::{self, Bounds, End, Flow, StreamError};
    use mcap::records::op;
    let mut r = Reading::default();
    let streamed = stream::stream(path, Bounds::default(), |opcode, data| {
        match opcode {
            op::METADATA if data.len() > crate::record::read::METADATA_BYTES => {
                return Flow::Fail(refused(
                    path,
                    format!(
                        "a metadata record of {} bytes; pi0d writes at most {}",
                        data.len(),
                        crate::record::read::METADATA_BYTES
                    ),
                ))
            }
            op::CHANNEL | op::MESSAGE | op::METADATA => {}
            _ => return Flow::Go,
        }
        match mcap::parse_record(opcode, data) {
            Ok(record) => match r.record(record) {
                Ok(()) => Flow::Go,
                Err(e) => Flow::Fail(refused(path, e)),
            },
            Err(e) => Flow::Broken(e),
        }
    })
    .map_err(|e| match e {
        StreamError::Io(source) => QuantizeError::Io {
            path: path.into(),
            source,
        },
        StreamError::Fail(e) => e,
    })?;
    match streamed.end {
        End::Complete | End::Done => {}
        End::Cut | End::Broken(mcap::McapError::UnexpectedEof) => tracing::warn!(
            "--calibration {}: the file ends before its data section does (a run killed or still recording): calibrating on the {} observations before that",
            crate::outside::path(path),
            r.seen
        ),
        End::Broken(e) => {
            return Err(refused(
                path,
                format!("damaged after record {}: {e}", streamed.records),
            ))
        }
        End::Decoded { bytes } => {
            return Err(refused(
                path,
                format!("it inflates past {bytes} bytes, far beyond any recording of its size"),
            ))
        }
    }
    let Some(prompt) = r.prompt else {
        return Err(refused(path, "no pi0d metadata with the prompt"));
    };
    if r.kept.is_empty() {
        return Err(refused(
            path,
            "no camera frame with a joint state before it (record.camera_hz 0, or the run ended before the first)",
        ));
    }
    // Evenly spread over the run.
    let step = r.kept.len().div_ceil(MAX_OBSERVATIONS);
    let mut out = Vec::new();
    for (frames, state) in r.kept.into_iter().step_by(step) {
        let frames = frames
            .iter()
            .map(|f| {
                f.as_ref()
                    .map(|bytes| decode(bytes).map(Arc::new))
                    .transpose()
            })
            .collect::<Result<_, _>>()
            .map_err(|e| refused(path, format!("a camera frame does not decode: {e}")))?;
        out.push(Recorded { frames, state });
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// However long the run, the observations kept are evenly spaced and bounded.
    #[test]
    fn when_a_long_run_is_read_expect_observations_kept_evenly_within_the_bound() {
        for n in [10usize, 64, 65, 200, 1000, 5000] {
            let mut r = Reading::default();
            for k in 0..n {
                r.observe(vec![k as f32]);
            }
            let kept: Vec<usize> = r.kept.iter().map(|(_, s)| s[0] as usize).collect();
            assert!(
                kept.len() < 2 * MAX_OBSERVATIONS,
                "{n}: {} kept",
                kept.len()
            );
            assert_eq!(kept[0], 0, "{n}");
            let gaps: std::collections::BTreeSet<usize> =
                kept.windows(2).map(|w| w[1] - w[0]).collect();
            assert!(gaps.len() <= 1, "{n}: uneven gaps {gaps:?}");
            // The last kept is within one gap of the run's end.
            let gap = gaps.first().copied().unwrap_or(1);
            assert!(n - 1 - kept[kept.len() - 1] < gap, "{n}: {kept:?}");
        }
    }
}

//! `[record]`: an MCAP recording of the run (joint states in, commands out, camera frames,
//! chunks, safety events, transitions and diagnostics).

use std::path::PathBuf;

use serde::Deserialize;

use super::check::Check;
use super::ConfigError;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRecord {
    /// A directory (one `pi0d-<UTC time>.mcap` per run) or a `.mcap` file.
    pub(crate) path: Option<PathBuf>,
    pub(crate) max_megabytes: Option<f64>,
    pub(crate) max_duration_s: Option<f64>,
    pub(crate) camera_hz: Option<f64>,
}

/// Where the recording goes.
#[derive(Clone, Debug, PartialEq)]
pub enum RecordTarget {
    /// One new file per run inside this directory (created if missing).
    Directory(PathBuf),
    /// This file (refused at start if it exists: a recording is never overwritten).
    File(PathBuf),
}

#[derive(Clone, Debug, PartialEq)]
pub struct RecordConfig {
    pub target: RecordTarget,
    /// The recording ends (the file is closed, the run goes on) past this size.
    pub max_bytes: u64,
    /// ... or after this long.
    pub max_duration_s: Option<f64>,
    /// Camera frames recorded per second and camera (0: none).
    pub camera_hz: f64,
}

pub(crate) const DEFAULT_MAX_MEGABYTES: f64 = 1024.0;
pub(crate) const DEFAULT_CAMERA_HZ: f64 = 5.0;

pub(crate) fn validate(c: &Check, r: &RawRecord) -> Result<RecordConfig, ConfigError> {
    let Some(path) = &r.path else {
        return c.fail(
            "record.path",
            "missing: a directory (one file per run) or a file ending in .mcap",
        );
    };
    let path = c.resolve(path);
    // A trailing slash names a directory even before it exists (created at start, as
    // rosbag2 creates its output directory).
    let target = if path.is_dir() || path.as_os_str().to_string_lossy().ends_with('/') {
        if path.exists() && !path.is_dir() {
            return c.fail(
                "record.path",
                format!("{} is a file, not a directory", path.display()),
            );
        }
        RecordTarget::Directory(path)
    } else {
        if path.extension().and_then(|e| e.to_str()) != Some("mcap") {
            return c.fail(
                "record.path",
                format!(
                    "expected an existing directory or a file name ending in .mcap, found {}",
                    path.display()
                ),
            );
        }
        match path.parent() {
            Some(dir) if dir.as_os_str().is_empty() || dir.is_dir() => {}
            Some(dir) => {
                return c.fail(
                    "record.path",
                    format!("no such directory: {}", dir.display()),
                )
            }
            None => {}
        }
        RecordTarget::File(path)
    };
    // Sizes, durations and rates are within their ranges (`ranges::RANGES`).
    let megabytes = r.max_megabytes.unwrap_or(DEFAULT_MAX_MEGABYTES);
    let camera_hz = r.camera_hz.unwrap_or(DEFAULT_CAMERA_HZ);
    Ok(RecordConfig {
        target,
        max_bytes: (megabytes * 1e6) as u64,
        max_duration_s: r.max_duration_s,
        camera_hz,
    })
}

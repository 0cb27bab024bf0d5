//! What a policy sees: camera frames and the observation gathered from the robot's inputs.
//! Below `io` (which fills them), `policy` (which reads them) and `control`, so none of those
//! has to import another for these types.

use std::sync::Arc;

use crate::time::MonoTime;

/// Pixel layouts a camera frame can carry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PixelFormat {
    Rgb8,
    Bgr8,
    Mono8,
}

/// One camera image with its capture time.
#[derive(Clone, Debug)]
pub struct CameraFrame {
    pub stamp: MonoTime,
    pub width: u32,
    pub height: u32,
    pub format: PixelFormat,
    pub data: Vec<u8>,
}

/// Everything a policy sees at one instant.
#[derive(Clone, Debug, Default)]
pub struct Observation {
    /// Capture time of the joint state; the chunk's step 0 is due at this time.
    pub stamp: MonoTime,
    /// Measured joint positions in the policy's action order.
    pub state: Vec<f64>,
    pub images: Vec<Option<Arc<CameraFrame>>>,
    pub prompt: String,
    /// Real-time chunking: the running chunk's leftover, when `[control.rtc]` is on and a chunk
    /// runs. Policies that cannot be guided ignore it.
    pub rtc: Option<crate::chunk::ChunkPrefix>,
}

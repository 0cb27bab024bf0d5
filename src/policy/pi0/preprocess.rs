//! Camera frames to model input, as lerobot / openpi do it: bytes to [0,1], bilinear
//! resize-with-pad to the model's square size keeping the aspect ratio (align_corners=False,
//! no antialias, padding centered with zeros), then `x*2-1` so values are in [-1,1] and the
//! padding is -1.

use crate::policy::{CameraFrame, PixelFormat};

#[derive(Debug, thiserror::Error)]
#[error("camera frame: {0}")]
pub struct FrameError(pub String);

/// `[3, h, w]` floats in [0,1] from an 8-bit frame.
pub fn frame_to_chw(frame: &CameraFrame) -> Result<Vec<f32>, FrameError> {
    let (w, h) = (frame.width as usize, frame.height as usize);
    let channels = match frame.format {
        PixelFormat::Rgb8 | PixelFormat::Bgr8 => 3,
        PixelFormat::Mono8 => 1,
    };
    if frame.data.len() != w * h * channels {
        return Err(FrameError(format!(
            "{}x{} {:?} needs {} bytes, found {}",
            w,
            h,
            frame.format,
            w * h * channels,
            frame.data.len()
        )));
    }
    let mut out = vec![0.0f32; 3 * h * w];
    for i in 0..h * w {
        let px = &frame.data[i * channels..(i + 1) * channels];
        let rgb = match frame.format {
            PixelFormat::Rgb8 => [px[0], px[1], px[2]],
            PixelFormat::Bgr8 => [px[2], px[1], px[0]],
            PixelFormat::Mono8 => [px[0]; 3],
        };
        for c in 0..3 {
            out[c * h * w + i] = rgb[c] as f32 / 255.0;
        }
    }
    Ok(out)
}

/// PyTorch's bilinear source coordinate for `align_corners=False`. Its vectorized CPU kernel
/// computes `scale * (dst + 0.5) - 0.5` as one fused multiply-add in f32; so does this, or the
/// coordinate would differ by an ulp (about 8e-6 at index 128).
fn source_index(dst: usize, scale: f32, size: usize) -> (usize, usize, f32) {
    let src = scale.mul_add(dst as f32 + 0.5, -0.5).max(0.0);
    let i0 = (src as usize).min(size - 1);
    let i1 = (i0 + 1).min(size - 1);
    (i0, i1, src - i0 as f32)
}

/// Resizes `[3, h, w]` in [0,1] to fit `size x size` keeping the aspect ratio, pads centered
/// with zeros, and maps to [-1,1].
pub fn resize_with_pad(chw: &[f32], h: usize, w: usize, size: usize) -> Vec<f32> {
    let ratio = (w as f64 / size as f64).max(h as f64 / size as f64);
    let rh = ((h as f64 / ratio) as usize).clamp(1, size);
    let rw = ((w as f64 / ratio) as usize).clamp(1, size);
    let (sy, sx) = (h as f32 / rh as f32, w as f32 / rw as f32);
    let pad_top = (size - rh) / 2;
    let pad_left = (size - rw) / 2;
    let mut out = vec![-1.0f32; 3 * size * size];
    let xs: Vec<(usize, usize, f32)> = (0..rw).map(|x| source_index(x, sx, w)).collect();
    for y in 0..rh {
        let (y0, y1, ly) = source_index(y, sy, h);
        for c in 0..3 {
            let plane = &chw[c * h * w..(c + 1) * h * w];
            for (x, &(x0, x1, lx)) in xs.iter().enumerate() {
                let top = plane[y0 * w + x0] * (1.0 - lx) + plane[y0 * w + x1] * lx;
                let bottom = plane[y1 * w + x0] * (1.0 - lx) + plane[y1 * w + x1] * lx;
                let v = (top * (1.0 - ly) + bottom * ly).clamp(0.0, 1.0);
                out[c * size * size + (pad_top + y) * size + pad_left + x] = v * 2.0 - 1.0;
            }
        }
    }
    out
}

/// A frame straight to model input `[3, size, size]` in [-1,1].
pub fn frame_to_model_input(frame: &CameraFrame, size: usize) -> Result<Vec<f32>, FrameError> {
    let chw = frame_to_chw(frame)?;
    Ok(resize_with_pad(
        &chw,
        frame.height as usize,
        frame.width as usize,
        size,
    ))
}

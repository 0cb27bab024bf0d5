//! Camera frames to model input, as lerobot / openpi do it: bytes to `[0, 1]`, bilinear
//! resize-with-pad to the model's square size keeping the aspect ratio (align_corners=False,
//! no antialias, padding centered with zeros), then `x*2-1` so values are in [-1,1] and the
//! padding is -1.

use crate::observation::{CameraFrame, PixelFormat};

#[derive(Debug, thiserror::Error)]
#[error("camera frame: {0}")]
pub struct FrameError(pub(crate) String);

/// The largest frame side taken: far above any camera's (8K is 7680 wide), small enough that
/// the float copies of a frame cannot overflow a size or exhaust memory.
pub(crate) const MAX_FRAME_SIDE: u32 = 16384;

fn channels(format: PixelFormat) -> usize {
    match format {
        PixelFormat::Rgb8 | PixelFormat::Bgr8 => 3,
        PixelFormat::Mono8 => 1,
    }
}

/// Refuses empty and absurdly large frames (and so every size computation below is in range).
fn check_size(w: u32, h: u32) -> Result<(), FrameError> {
    if w == 0 || h == 0 {
        return Err(FrameError(format!("{w}x{h} is empty")));
    }
    if w > MAX_FRAME_SIDE || h > MAX_FRAME_SIDE {
        return Err(FrameError(format!(
            "{w}x{h} is larger than {MAX_FRAME_SIDE} pixels on a side"
        )));
    }
    Ok(())
}

/// `[3, h, w]` floats in [0,1] from an 8-bit frame.
pub(crate) fn frame_to_chw(frame: &CameraFrame) -> Result<Vec<f32>, FrameError> {
    check_size(frame.width, frame.height)?;
    let (w, h) = (frame.width as usize, frame.height as usize);
    let channels = channels(frame.format);
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
    for (i, px) in frame.data.chunks_exact(channels).enumerate() {
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
/// coordinate would differ by an ulp (about 8e-6 at index 128). `size` is at least 1.
fn source_index(dst: usize, scale: f32, size: usize) -> (usize, usize, f32) {
    let last = size.saturating_sub(1);
    let src = scale.mul_add(dst as f32 + 0.5, -0.5).max(0.0);
    let i0 = (src as usize).min(last);
    let i1 = (i0 + 1).min(last);
    (i0, i1, src - i0 as f32)
}

/// Resizes `[3, h, w]` in `[0, 1]` to fit `size x size` keeping the aspect ratio, pads centered
/// with zeros, and maps to [-1,1]. Empty sizes and a `chw` of the wrong length are refused.
pub(crate) fn resize_with_pad(
    chw: &[f32],
    h: usize,
    w: usize,
    size: usize,
) -> Result<Vec<f32>, FrameError> {
    if h == 0 || w == 0 || size == 0 {
        return Err(FrameError(format!(
            "cannot resize {w}x{h} to {size}x{size}: a size is 0"
        )));
    }
    let want = h.checked_mul(w).and_then(|n| n.checked_mul(3));
    if want != Some(chw.len()) {
        return Err(FrameError(format!(
            "{w}x{h} needs 3x{w}x{h} values, found {}",
            chw.len()
        )));
    }
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
        for (c, plane) in chw.chunks_exact(h * w).enumerate() {
            for (x, &(x0, x1, lx)) in xs.iter().enumerate() {
                let top = plane[y0 * w + x0] * (1.0 - lx) + plane[y0 * w + x1] * lx;
                let bottom = plane[y1 * w + x0] * (1.0 - lx) + plane[y1 * w + x1] * lx;
                let v = (top * (1.0 - ly) + bottom * ly).clamp(0.0, 1.0);
                out[c * size * size + (pad_top + y) * size + pad_left + x] = v * 2.0 - 1.0;
            }
        }
    }
    Ok(out)
}

/// A frame straight to model input `[3, size, size]` in [-1,1].
pub(crate) fn frame_to_model_input(
    frame: &CameraFrame,
    size: usize,
) -> Result<Vec<f32>, FrameError> {
    let chw = frame_to_chw(frame)?;
    resize_with_pad(&chw, frame.height as usize, frame.width as usize, size)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::time::MonoTime;

    fn frame(width: u32, height: u32, data: Vec<u8>) -> CameraFrame {
        CameraFrame {
            stamp: MonoTime::ZERO,
            width,
            height,
            format: PixelFormat::Rgb8,
            data,
        }
    }

    #[test]
    fn when_frame_has_zero_width_or_height_expect_frame_error_not_panic() {
        for (w, h) in [(0, 0), (0, 480), (640, 0)] {
            let e = frame_to_model_input(&frame(w, h, Vec::new()), 224).unwrap_err();
            assert!(e.to_string().contains("is empty"), "{w}x{h}: {e}");
        }
    }

    #[test]
    fn when_frame_size_is_absurd_expect_frame_error_not_overflow() {
        let e = frame_to_model_input(&frame(u32::MAX, u32::MAX, vec![0; 3]), 224).unwrap_err();
        assert!(e.to_string().contains("larger than 16384"), "{e}");
    }

    #[test]
    fn when_resize_gets_zero_sizes_or_short_data_expect_frame_error() {
        assert!(resize_with_pad(&[], 0, 4, 224).is_err());
        assert!(resize_with_pad(&[0.0; 12], 2, 2, 0).is_err());
        let e = resize_with_pad(&[0.0; 11], 2, 2, 224).unwrap_err();
        assert!(e.to_string().contains("found 11"), "{e}");
        // A 1x1 frame is fine: one source pixel everywhere.
        let out = resize_with_pad(&[1.0, 0.0, 0.0], 1, 1, 4).unwrap();
        assert_eq!(&out[..16], &[1.0; 16]);
        let one = frame_to_model_input(&frame(1, 1, vec![255, 0, 0]), 4).unwrap();
        assert_eq!(one, out);
    }
}

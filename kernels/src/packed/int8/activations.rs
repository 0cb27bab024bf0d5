//! Per-token (per-row) int8 quantization of the activations, fused with packing them in the
//! layout a kernel reads: one pass over each row for its absmax, one that writes its codes.
//!
//! Rule, per row: `scale = absmax / 127`, `q = round(v * (127 / absmax))` (ties to even),
//! clamped to +-127; a row of zeros gets scale 0 and codes 0, so its outputs are exact zeros
//! (as does a row whose absmax is subnormal, below 1.2e-38, where `127 / absmax` overflows).
//! A non-finite value is refused with its position: the product of an int8 code by a scale of
//! infinity or NaN would be garbage that looks like numbers.
//!
//! Layouts (`Layout`), `kp` = `k` padded to 16 with zero codes:
//! - `Rows`: row `i` at `i * kp`, int8.
//! - `RowsOffset`: the same, each code + 128 as u8 (`vpdpbusd`'s unsigned operand).
//! - `Pairs`: rows `2P` and `2P + 1` at `P * 2 kp`, interleaved 8 `k` at a time (16 bytes a
//!   group: 8 of the even row, 8 of the odd), `smmla`'s 2x8 operand; an odd `m` gets a row
//!   of zeros.

use rayon::prelude::*;

use super::{padded_k, I8Error, I8Isa, Layout};

/// Values below which quantizing runs on the calling thread alone.
const MIN_PARALLEL_VALUES: usize = 1 << 16;

/// `1.5 * 2^23`: adding it to an f32 of magnitude below 2^22 rounds it to an integer (ties to
/// even) held in the low mantissa bits, so `bits - MAGIC_BITS` is that integer. Vectorizes
/// with plain SSE2, where `f32::round` is a library call.
const MAGIC: f32 = 12_582_912.0;

/// Quantized activations, in the layout of one kernel, and the buffers they live in: reused
/// from call to call, they only grow (a second call with the same or a smaller shape allocates
/// nothing: pi0d's denoising loop runs allocation-free).
#[derive(Debug)]
pub struct I8Activations {
    q: Vec<u8>,
    scales: Vec<f32>,
    m: usize,
    k: usize,
    layout: Layout,
}

impl Default for I8Activations {
    fn default() -> I8Activations {
        I8Activations::new()
    }
}

impl I8Activations {
    /// Empty buffers (the first `quantize` sizes them).
    pub fn new() -> I8Activations {
        I8Activations {
            q: Vec::new(),
            scales: Vec::new(),
            m: 0,
            k: 0,
            layout: Layout::Rows,
        }
    }

    /// Quantizes `m` rows of `k` values (row `i` at `a[i * lda]`) for `isa`'s kernels, on up to
    /// `threads` threads of rayon's pool. Refuses a non-finite value (the first one in row-major
    /// order), leaving nothing quantized (`rows() == 0`).
    pub fn quantize(
        &mut self,
        isa: I8Isa,
        a: &[f32],
        m: usize,
        k: usize,
        lda: usize,
        threads: usize,
    ) -> Result<(), I8Error> {
        assert!(
            m == 0 || (a.len() >= (m - 1) * lda + k && lda >= k),
            "input has {} values, not {m} rows of {k} (stride {lda})",
            a.len()
        );
        let layout = isa.layout();
        let kp = padded_k(k);
        // Whole pairs of rows (each pair is one unit of work in every layout).
        let pairs = m.div_ceil(2);
        if self.q.len() < pairs * 2 * kp {
            self.q.resize(pairs * 2 * kp, 0);
        }
        if self.scales.len() < pairs * 2 {
            self.scales.resize(pairs * 2, 0.0);
        }
        (self.m, self.k, self.layout) = (0, k, layout);
        let q = QPtr(self.q.as_mut_ptr());
        let s = SPtr(self.scales.as_mut_ptr());
        let unit = |range: std::ops::Range<usize>| -> bool {
            // SAFETY: pair ranges of different tasks are disjoint; the buffers hold `pairs`.
            let (q, s) = unsafe {
                (
                    std::slice::from_raw_parts_mut(
                        q.get().add(range.start * 2 * kp),
                        range.len() * 2 * kp,
                    ),
                    std::slice::from_raw_parts_mut(s.get().add(range.start * 2), range.len() * 2),
                )
            };
            let mut ok = true;
            for (u, s) in s.chunks_exact_mut(2).enumerate() {
                let pair = &mut q[u * 2 * kp..(u + 1) * 2 * kp];
                for (half, scale) in s.iter_mut().enumerate() {
                    let row = (range.start + u) * 2 + half;
                    let src = if row < m {
                        &a[row * lda..row * lda + k]
                    } else {
                        &[][..]
                    };
                    match quantize_row(src, pair, kp, half, layout) {
                        Some(v) => *scale = v,
                        None => ok = false,
                    }
                }
            }
            ok
        };
        let tasks = threads
            .min(pairs)
            .min((m * k / MIN_PARALLEL_VALUES).max(1))
            .max(1);
        let ok = if tasks == 1 {
            unit(0..pairs)
        } else {
            (0..tasks)
                .into_par_iter()
                .map(|t| unit(pairs * t / tasks..pairs * (t + 1) / tasks))
                .reduce(|| true, |x, y| x && y)
        };
        if !ok {
            return Err(first_non_finite(a, m, k, lda));
        }
        self.m = m;
        Ok(())
    }

    /// Rows quantized (0 after a refused call).
    pub fn rows(&self) -> usize {
        self.m
    }

    /// Values a row.
    pub fn cols(&self) -> usize {
        self.k
    }

    /// The rows' scales.
    pub fn scales(&self) -> &[f32] {
        &self.scales[..self.m]
    }

    /// Bytes the buffers hold (their capacity: what a reuse must not grow).
    pub fn capacity(&self) -> usize {
        self.q.capacity() + self.scales.capacity() * 4
    }

    /// Code `(i, kk)`, whatever the layout.
    pub fn code(&self, i: usize, kk: usize) -> i8 {
        assert!(
            i < self.m && kk < self.k,
            "({i}, {kk}) outside {} x {}",
            self.m,
            self.k
        );
        let kp = padded_k(self.k);
        match self.layout {
            Layout::Rows => self.q[i * kp + kk] as i8,
            Layout::RowsOffset => (self.q[i * kp + kk] ^ 0x80) as i8,
            Layout::Pairs => self.q[i / 2 * 2 * kp + kk / 8 * 16 + i % 2 * 8 + kk % 8] as i8,
        }
    }

    pub(crate) fn layout(&self) -> Layout {
        self.layout
    }

    pub(crate) fn data(&self) -> *const u8 {
        self.q.as_ptr()
    }

    /// Bytes from one row (`Rows`, `RowsOffset`) or pair of rows (`Pairs`) to the next.
    pub(crate) fn stride(&self) -> usize {
        let kp = padded_k(self.k);
        match self.layout {
            Layout::Pairs => 2 * kp,
            _ => kp,
        }
    }
}

/// Quantizes `src` (empty: a padding row) into its place in `pair`, the `2 kp` bytes of the
/// pair of rows it belongs to (`half` 0 or 1). Returns its scale, or `None` if a value is not
/// finite.
fn quantize_row(
    src: &[f32],
    pair: &mut [u8],
    kp: usize,
    half: usize,
    layout: Layout,
) -> Option<f32> {
    // Baseline x86-64 (SSE2) lacks the 32-bit max and the narrowing the loops vectorize into.
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 is present.
        return unsafe { quantize_row_avx2(src, pair, kp, half, layout) };
    }
    quantize_row_any(src, pair, kp, half, layout)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn quantize_row_avx2(
    src: &[f32],
    pair: &mut [u8],
    kp: usize,
    half: usize,
    layout: Layout,
) -> Option<f32> {
    quantize_row_any(src, pair, kp, half, layout)
}

#[inline(always)]
fn quantize_row_any(
    src: &[f32],
    pair: &mut [u8],
    kp: usize,
    half: usize,
    layout: Layout,
) -> Option<f32> {
    // Absmax over the bits: for finite values, |v|'s bits order as |v| does, and infinity and
    // NaN have larger bits than any finite value (one integer max finds both).
    // (An integer max reduction: vectorized, unlike a float one.)
    let max = src
        .iter()
        .fold(0u32, |m, v| m.max(v.to_bits() & 0x7FFF_FFFF));
    if max >= 0x7F80_0000 {
        return None;
    }
    let absmax = f32::from_bits(max);
    // Below the smallest normal f32, `127 / absmax` overflows: such a row counts as zeros.
    let (scale, inv) = if absmax < f32::MIN_POSITIVE {
        (0.0, 0.0)
    } else {
        (absmax / 127.0, 127.0 / absmax)
    };
    let xor = if layout == Layout::RowsOffset {
        0x80
    } else {
        0
    };
    let code = |v: f32| {
        let x = (v * inv).clamp(-127.0, 127.0) + MAGIC;
        (x.to_bits() as i32 - MAGIC.to_bits() as i32) as i8 as u8 ^ xor
    };
    let k = src.len();
    if kp == 0 {
        return Some(scale);
    }
    if layout == Layout::Pairs {
        // 8 codes of this row, then 8 of the other, group after group.
        let groups = pair[half * 8..].chunks_mut(16);
        let mut values = src.chunks_exact(8);
        let mut groups = groups.map(|g| &mut g[..8]);
        // `values` first: `zip` polls it first, so no group is taken when it runs out.
        for (v, dst) in (&mut values).zip(&mut groups) {
            for (d, &v) in dst.iter_mut().zip(v) {
                *d = code(v);
            }
        }
        let rest = values.remainder();
        for (g, dst) in groups.enumerate() {
            for (t, d) in dst.iter_mut().enumerate() {
                *d = if g == 0 {
                    rest.get(t).map_or(xor, |&v| code(v))
                } else {
                    xor
                };
            }
        }
    } else {
        let row = &mut pair[half * kp..(half + 1) * kp];
        for (d, &v) in row.iter_mut().zip(src) {
            *d = code(v);
        }
        row[k..].fill(xor);
    }
    Some(scale)
}

/// The error for the first non-finite value of `a` (one is known to be there).
fn first_non_finite(a: &[f32], m: usize, k: usize, lda: usize) -> I8Error {
    for row in 0..m {
        if let Some(col) = a[row * lda..row * lda + k]
            .iter()
            .position(|v| !v.is_finite())
        {
            let value = a[row * lda + col];
            return I8Error::NonFinite { row, col, value };
        }
    }
    unreachable!("a non-finite value was seen")
}

#[derive(Clone, Copy)]
struct QPtr(*mut u8);
// SAFETY: tasks write disjoint pair ranges.
unsafe impl Send for QPtr {}
unsafe impl Sync for QPtr {}
impl QPtr {
    fn get(self) -> *mut u8 {
        self.0
    }
}

#[derive(Clone, Copy)]
struct SPtr(*mut f32);
// SAFETY: tasks write disjoint pair ranges.
unsafe impl Send for SPtr {}
unsafe impl Sync for SPtr {}
impl SPtr {
    fn get(self) -> *mut f32 {
        self.0
    }
}

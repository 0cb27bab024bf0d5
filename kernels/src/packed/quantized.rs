//! Packing of weights already quantized by [`crate::quant`], straight from their integers (no
//! f32 copy of the weight is ever made: a model that only fits quantized must load quantized).
//!
//! Layouts, per panel of `NR` output columns (rows of the weight), `k`-major as the f32 panels:
//! - `I8`: one byte a value, `k`-row `kk` of panel `p` at `p * NR * k + kk * NR`; scales `NR` a
//!   panel (`p * NR + j`), applied to the accumulators at store time.
//! - `I4`: `NR / 2` bytes a `k`-row; byte `j` holds column `j` in its low nibble and column
//!   `j + NR / 2` in its high one, so that a kernel of two vectors a row (AVX-512, AVX2) splits
//!   one load into both with an `and` and a shift. Scales `NR` a (panel, block):
//!   `(p * k / block + b) * NR + j`, applied to the weights as they are loaded.
//!
//! Padding columns of a partial last panel hold code 0 (int8) or 8 (int4) and scale 0.

use rayon::prelude::*;

use super::{aligned, pack_panels, Isa, PackedMatrix, Storage, Threads};
use crate::quant::{QuantI4, QuantI8};

/// Bytes past the last panel that the kernels' loads may read (a 16-byte load of the last
/// row's last vector: NEON widens 4 int8 values from an 8-byte load, and 6 int4 bytes from 8).
const TAIL: usize = 16;

impl PackedMatrix {
    /// Packs an int8 weight `[n, k]` for the best kernel of this CPU.
    pub fn pack_i8(q: &QuantI8, n: usize, k: usize) -> PackedMatrix {
        PackedMatrix::pack_i8_for(Isa::best(), q, n, k)
    }

    /// Packs an int8 weight `[n, k]` for `isa`. Panics if `isa` does not run here or `q` does
    /// not hold `n x k` values and `n` scales.
    pub fn pack_i8_for(isa: Isa, q: &QuantI8, n: usize, k: usize) -> PackedMatrix {
        assert!(
            q.q.len() == n * k && q.scales.len() == n,
            "int8 weight has {} values and {} scales, not {n} x {k} and {n}",
            q.q.len(),
            q.scales.len()
        );
        let mut m = PackedMatrix::empty(isa);
        let nr = isa.panel_width();
        let padded = n.div_ceil(nr) * nr;
        m.start = aligned(&mut m.bytes, padded * k + TAIL);
        let out = &mut m.bytes[m.start..m.start + padded * k];
        pack_panels(&q.q, n, k, k, nr, out, |v| v as u8, Threads::Pool);
        m.scales = vec![0.0; padded];
        m.scales[..n].copy_from_slice(&q.scales);
        (m.n, m.k, m.storage) = (n, k, Storage::I8);
        m
    }

    /// Packs an int4 weight `[n, k]` for the best kernel of this CPU.
    pub fn pack_i4(q: &QuantI4, n: usize, k: usize) -> PackedMatrix {
        PackedMatrix::pack_i4_for(Isa::best(), q, n, k)
    }

    /// Packs an int4 weight `[n, k]` for `isa`. Panics if `isa` does not run here, or `q` does
    /// not hold `n x k` values in blocks (a power of two of at least 16) that divide `k`.
    pub fn pack_i4_for(isa: Isa, q: &QuantI4, n: usize, k: usize) -> PackedMatrix {
        let block = q.block;
        assert!(
            block >= 16 && block.is_power_of_two() && k.is_multiple_of(block),
            "int4 block of {block} for k = {k}"
        );
        let blocks = k / block;
        assert!(
            q.packed.len() == n * k / 2 && q.scales.len() == n * blocks,
            "int4 weight has {} bytes and {} scales, not {n} x {k} / 2 and {n} x {blocks}",
            q.packed.len(),
            q.scales.len()
        );
        let mut m = PackedMatrix::empty(isa);
        let nr = isa.panel_width();
        let half = nr / 2;
        let panels = n.div_ceil(nr);
        m.start = aligned(&mut m.bytes, panels * half * k + TAIL);
        let out = &mut m.bytes[m.start..m.start + panels * half * k];
        if k > 0 {
            out.par_chunks_exact_mut(half * k)
                .enumerate()
                .for_each(|(p, panel)| {
                    let code = |j: usize, kk: usize| {
                        let r = p * nr + j;
                        if r < n {
                            q.code(k, r, kk)
                        } else {
                            8
                        }
                    };
                    for (kk, row) in panel.chunks_exact_mut(half).enumerate() {
                        for (j, byte) in row.iter_mut().enumerate() {
                            *byte = code(j, kk) | code(j + half, kk) << 4;
                        }
                    }
                });
        }
        m.scales = vec![0.0; panels * blocks * nr];
        for r in 0..n {
            let (p, j) = (r / nr, r % nr);
            for b in 0..blocks {
                m.scales[(p * blocks + b) * nr + j] = q.scales[r * blocks + b];
            }
        }
        (m.n, m.k, m.storage) = (n, k, Storage::I4 { block });
        m
    }

    /// Value `(r, kk)` of quantized storage, dequantized as `crate::quant` does.
    pub(super) fn value_q(&self, r: usize, kk: usize) -> f32 {
        let (nr, k) = (self.isa.panel_width(), self.k);
        let (p, j) = (r / nr, r % nr);
        match self.storage {
            Storage::I8 => {
                let q = self.bytes[self.start + p * nr * k + kk * nr + j] as i8;
                q as f32 * self.scales[p * nr + j]
            }
            Storage::I4 { block } => {
                let half = nr / 2;
                let byte = self.bytes[self.start + p * half * k + kk * half + j % half];
                let code = if j < half { byte & 0xF } else { byte >> 4 };
                let d = self.scales[(p * (k / block) + kk / block) * nr + j];
                (code as i32 - 8) as f32 * d
            }
            _ => unreachable!("{:?} is not quantized", self.storage),
        }
    }
}

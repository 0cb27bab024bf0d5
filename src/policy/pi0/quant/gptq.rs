//! GPTQ (Frantar et al., 2022): a weight's columns rounded one after another, each column's
//! rounding error moved onto the columns not yet rounded, weighted by how the layer's inputs
//! correlate, so that the product `x W^T` on inputs like the calibration's moves as little as
//! rounding allows. Rounding to nearest treats every column alone; on inputs whose channels
//! correlate (every transformer's), GPTQ's product error is several times smaller for the same
//! integers' format: the storage and the kernels do not change.
//!
//! The correlation is `H = X^T X` over every calibration row, in diagonal windows of `WINDOW`
//! channels, dampened (`DAMPING`). The update for column `i` is
//! `W[:, j] -= (W[:, i] - q_i) / U_ii * U_ij` for the window's `j > i`, `U` the upper Cholesky
//! factor of `H^-1`. The scale rules are the round-to-nearest ones: int8's per row from the float
//! row's largest value (so the integers never clip more than there), int4's per block from the
//! block's values as they stand when its first column is reached.

use pi0d_kernels::quant::{
    int4_block_scale, quantize_i4_blocks, quantize_i8_rows, QuantError, QuantI4, QuantI8,
};

/// Fraction of the mean diagonal added to `H`: more than the reference implementation's 1 %,
/// which fitted the calibration rows too closely on the golden models (damping pulls GPTQ
/// towards rounding to nearest; 10 % measured best on every fixture).
const DAMPING: f64 = 0.1;

/// Columns whose errors are spread among each other: `H` is kept block-diagonal in windows of
/// this many input channels. The whole `k x k` would cost `k^3` to factor and `k^2` values
/// per layer to hold (16384 wide in Gemma's MLP); the windows keep GPTQ's gain on the
/// neighbouring columns at a fraction of that. A multiple of every int4 block.
const WINDOW: usize = 256;

/// The sums `X^T X` of a layer's inputs over every calibration row, in the diagonal windows
/// of `WINDOW` channels (`k x WINDOW` values).
#[derive(Clone, Debug, Default)]
pub(crate) struct Gram {
    k: usize,
    /// Window `w`'s `[size, size]` block, one after another.
    sums: Vec<f64>,
    rows: u64,
}

/// The windows of `k` channels: `(first, size)`.
fn windows(k: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..k).step_by(WINDOW).map(move |c| (c, WINDOW.min(k - c)))
}

impl Gram {
    pub(crate) fn new(k: usize) -> Gram {
        let len = windows(k).map(|(_, s)| s * s).sum();
        Gram {
            k,
            sums: vec![0.0; len],
            rows: 0,
        }
    }

    /// Adds `x`'s rows (`k` values each).
    pub(crate) fn add(&mut self, x: &[f32]) {
        let k = self.k;
        let mut at = 0;
        let mut acc = Vec::new();
        for (c0, size) in windows(k) {
            // f32 sums over this call's rows (a few hundred), added to the f64 totals.
            acc.clear();
            acc.resize(size * size, 0.0f32);
            for row in x.chunks_exact(k) {
                let v = &row[c0..c0 + size];
                for (i, &a) in v.iter().enumerate() {
                    if a != 0.0 {
                        for (s, &b) in acc[i * size..(i + 1) * size].iter_mut().zip(v) {
                            *s += a * b;
                        }
                    }
                }
            }
            for (t, a) in self.sums[at..at + size * size].iter_mut().zip(&acc) {
                *t += f64::from(*a);
            }
            at += size * size;
        }
        self.rows += (x.len() / k.max(1)) as u64;
    }

    /// Adds another set of rows' sums (same layer).
    pub(crate) fn absorb(&mut self, other: &Gram) {
        if other.k == self.k {
            self.sums
                .iter_mut()
                .zip(&other.sums)
                .for_each(|(a, b)| *a += b);
            self.rows += other.rows;
        }
    }

    /// `H` for the weight stored as `W diag(s)` (its inputs `x / s`), or as it is.
    pub(crate) fn hessian(&self, s: Option<&[f32]>) -> Hessian {
        let norm = 1.0 / self.rows.max(1) as f64;
        let mut blocks = Vec::new();
        let mut at = 0;
        for (c0, size) in windows(self.k) {
            let mut h: Vec<f64> = self.sums[at..at + size * size]
                .iter()
                .map(|v| v * norm)
                .collect();
            if let Some(s) = s {
                for i in 0..size {
                    for j in 0..size {
                        h[i * size + j] /= f64::from(s[c0 + i]) * f64::from(s[c0 + j]);
                    }
                }
            }
            blocks.push(h);
            at += size * size;
        }
        Hessian { k: self.k, blocks }
    }
}

/// A layer's input correlation `X^T X / m`, its diagonal windows (`[size, size]` each).
#[derive(Clone, Debug)]
pub(crate) struct Hessian {
    k: usize,
    blocks: Vec<Vec<f64>>,
}

/// `U`, the upper Cholesky factor of the dampened window `h`'s inverse (row-major). A channel
/// calibration never saw nonzero gets a row and column of its own in `H`: its weight is
/// rounded to nearest and takes no other column's error (the robot's inputs may use it).
/// `None` when `h` is not positive definite even dampened (non-finite inputs).
fn inverse_factor(h: &[f64], k: usize) -> Option<Vec<f64>> {
    let mut h = h.to_vec();
    let dead: Vec<bool> = (0..k).map(|i| h[i * k + i] <= 0.0).collect();
    let mean = (0..k).map(|i| h[i * k + i].max(0.0)).sum::<f64>() / k.max(1) as f64;
    let damp = if mean > 0.0 { DAMPING * mean } else { 1.0 };
    for (i, &d) in dead.iter().enumerate() {
        if d {
            for j in 0..k {
                h[i * k + j] = 0.0;
                h[j * k + i] = 0.0;
            }
            h[i * k + i] = 1.0;
        }
        h[i * k + i] += damp;
    }
    let l = cholesky(&h, k)?;
    // H^-1 = L^-T L^-1; its upper factor U (H^-1 = U^T U) is the lower factor of H^-1
    // transposed.
    let li = lower_inverse(&l, k);
    let mut inv = vec![0.0f64; k * k];
    for i in 0..k {
        for j in 0..=i {
            // (L^-T L^-1)_ij = sum_r Li[r, i] Li[r, j], r >= max(i, j) = i.
            let v: f64 = (i..k).map(|r| li[r * k + i] * li[r * k + j]).sum();
            inv[i * k + j] = v;
            inv[j * k + i] = v;
        }
    }
    let l2 = cholesky(&inv, k)?;
    let mut u = vec![0.0f64; k * k];
    for i in 0..k {
        for j in 0..=i {
            u[j * k + i] = l2[i * k + j];
        }
    }
    Some(u)
}

/// The lower Cholesky factor of symmetric `a` (`k x k`), or `None` if it is not positive
/// definite.
fn cholesky(a: &[f64], k: usize) -> Option<Vec<f64>> {
    let mut l = vec![0.0f64; k * k];
    for i in 0..k {
        for j in 0..=i {
            let dot: f64 = (0..j).map(|r| l[i * k + r] * l[j * k + r]).sum();
            let v = a[i * k + j] - dot;
            if i == j {
                if !(v > 0.0 && v.is_finite()) {
                    return None;
                }
                l[i * k + i] = v.sqrt();
            } else {
                l[i * k + j] = v / l[j * k + j];
            }
        }
    }
    Some(l)
}

/// The inverse of lower-triangular `l` (itself lower-triangular).
fn lower_inverse(l: &[f64], k: usize) -> Vec<f64> {
    let mut inv = vec![0.0f64; k * k];
    for c in 0..k {
        inv[c * k + c] = 1.0 / l[c * k + c];
        for i in c + 1..k {
            let s: f64 = (c..i).map(|r| l[i * k + r] * inv[r * k + c]).sum();
            inv[i * k + c] = -s / l[i * k + i];
        }
    }
    inv
}

/// How each column is rounded: the codes' range and where the scales come from.
#[derive(Clone, Copy)]
enum Grid {
    /// Symmetric int8, one scale per row (fixed beforehand).
    Int8,
    /// int4 codes `0..=15` around 8, one scale per row and block of columns.
    Int4 { block: usize },
}

/// The GPTQ loop on `w` (`[n, k]`, row-major), window by window: the codes (row-major) and
/// the scales (per row for int8, `[n, k / block]` for int4). Rows are independent of each
/// other (the update moves a row's error along that row), so they are split among `threads`.
/// `None` when a window of `h` cannot be factored.
fn round(
    w: &[f32],
    n: usize,
    k: usize,
    h: &Hessian,
    grid: Grid,
    threads: usize,
) -> Option<(Vec<i8>, Vec<f32>)> {
    if h.k != k || w.len() != n * k {
        return None;
    }
    let factors: Vec<Vec<f64>> = windows(k)
        .zip(&h.blocks)
        .map(|((_, size), block)| inverse_factor(block, size))
        .collect::<Option<_>>()?;
    let per_row = match grid {
        Grid::Int8 => 1,
        Grid::Int4 { block } => k / block,
    };
    let mut codes = vec![0i8; n * k];
    let mut scales = vec![0.0f32; n * per_row];
    let chunk = n.div_ceil(threads.max(1)).max(1);
    std::thread::scope(|scope| {
        for ((w, codes), scales) in w
            .chunks(chunk * k)
            .zip(codes.chunks_mut(chunk * k))
            .zip(scales.chunks_mut(chunk * per_row))
        {
            let factors = &factors;
            scope.spawn(move || {
                for ((row, codes), scales) in w
                    .chunks_exact(k)
                    .zip(codes.chunks_exact_mut(k))
                    .zip(scales.chunks_exact_mut(per_row))
                {
                    round_row(row, codes, scales, factors, grid);
                }
            });
        }
    });
    Some((codes, scales))
}

/// One row through GPTQ's loop: `codes` and `scales` written.
fn round_row(row: &[f32], codes: &mut [i8], scales: &mut [f32], factors: &[Vec<f64>], grid: Grid) {
    let (lo, hi) = match grid {
        Grid::Int8 => (-127.0, 127.0),
        Grid::Int4 { .. } => (-8.0, 7.0),
    };
    if let Grid::Int8 = grid {
        scales[0] = row.iter().fold(0.0f32, |m, v| m.max(v.abs())) / 127.0;
    }
    let mut buf = Vec::with_capacity(WINDOW);
    for ((c0, size), u) in windows(row.len()).zip(factors) {
        buf.clear();
        buf.extend_from_slice(&row[c0..c0 + size]);
        for i in 0..size {
            let col = c0 + i;
            let d = match grid {
                Grid::Int8 => scales[0],
                Grid::Int4 { block } => {
                    if col % block == 0 {
                        scales[col / block] = int4_block_scale(&buf[i..i + block]);
                    }
                    scales[col / block]
                }
            };
            let q = if d == 0.0 {
                0.0
            } else {
                (buf[i] / d).round().clamp(lo, hi)
            };
            codes[col] = q as i8;
            let err = (buf[i] - q * d) / u[i * size + i] as f32;
            for (v, &uij) in buf[i + 1..]
                .iter_mut()
                .zip(&u[i * size + i + 1..(i + 1) * size])
            {
                *v -= err * uij as f32;
            }
        }
    }
}

/// `w` (`[n, k]`) as `quantize_i8_rows` stores it: its integers chosen by GPTQ on `h` when
/// there is one it can factor, else rounded to nearest.
pub(crate) fn rounded_i8(
    w: &[f32],
    n: usize,
    k: usize,
    h: Option<&Hessian>,
    threads: usize,
) -> Result<QuantI8, QuantError> {
    match h.and_then(|h| gptq_i8(w, n, k, h, threads)) {
        Some(q) => Ok(q),
        None => quantize_i8_rows(w, n, k),
    }
}

/// `w` (`[n, k]`) as `quantize_i4_blocks` stores it: its codes chosen by GPTQ on `h` when
/// there is one it can factor, else rounded to nearest.
pub(crate) fn rounded_i4(
    w: &[f32],
    n: usize,
    k: usize,
    block: usize,
    h: Option<&Hessian>,
    threads: usize,
) -> Result<QuantI4, QuantError> {
    match h.and_then(|h| gptq_i4(w, n, k, block, h, threads)) {
        Some(q) => Ok(q),
        None => quantize_i4_blocks(w, n, k, block),
    }
}

/// `w` (`[n, k]`) as `quantize_i8_rows` stores it, its integers chosen by GPTQ on `h`.
fn gptq_i8(w: &[f32], n: usize, k: usize, h: &Hessian, threads: usize) -> Option<QuantI8> {
    let (q, scales) = round(w, n, k, h, Grid::Int8, threads)?;
    Some(QuantI8 { q, scales })
}

/// `w` (`[n, k]`) as `quantize_i4_blocks` stores it, its codes chosen by GPTQ on `h`.
fn gptq_i4(
    w: &[f32],
    n: usize,
    k: usize,
    block: usize,
    h: &Hessian,
    threads: usize,
) -> Option<QuantI4> {
    let (q, scales) = round(w, n, k, h, Grid::Int4 { block }, threads)?;
    let mut packed = vec![0u8; n * k / 2];
    for (p, pair) in packed.iter_mut().zip(q.chunks_exact(2)) {
        *p = (pair[0] + 8) as u8 | ((pair[1] + 8) as u8) << 4;
    }
    Some(QuantI4 {
        packed,
        scales,
        block,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use pi0d_kernels::quant::{dequantize_i4, dequantize_i8};

    /// Deterministic correlated inputs: few underlying factors mixed into k channels.
    fn uniform(seed: u64) -> impl FnMut() -> f32 {
        let mut s = seed;
        move || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 11) as f32 / (1u64 << 53) as f32 - 0.5
        }
    }

    /// `m` rows of `k` channels mixed from a few factors (the mix fixed by `mix_seed`, the
    /// rows drawn from `seed`).
    fn correlated_rows(m: usize, k: usize, mix_seed: u64, seed: u64) -> Vec<f32> {
        let factors = 6;
        let mix: Vec<f32> = (0..factors * k)
            .map({
                let mut u = uniform(mix_seed);
                move |_| u()
            })
            .collect();
        let mut next = uniform(seed);
        (0..m)
            .flat_map(|_| {
                let f: Vec<f32> = (0..factors).map(|_| next()).collect();
                let noise: Vec<f32> = (0..k).map(|_| 0.05 * next()).collect();
                (0..k)
                    .map(|c| (0..factors).map(|j| f[j] * mix[j * k + c]).sum::<f32>() + noise[c])
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    fn product_error(x: &[f32], k: usize, w: &[f32], deq: &[f32]) -> f64 {
        let mut e = 0.0;
        for row in x.chunks_exact(k) {
            for (wr, dr) in w.chunks_exact(k).zip(deq.chunks_exact(k)) {
                let d: f32 = row
                    .iter()
                    .zip(wr.iter().zip(dr))
                    .map(|(a, (b, c))| a * (b - c))
                    .sum();
                e += f64::from(d) * f64::from(d);
            }
        }
        e
    }

    #[test]
    fn when_inputs_correlate_expect_gptq_products_nearer_than_rounding_to_nearest() {
        let (n, k, block) = (24, 64, 32);
        let mut u = uniform(3);
        let w: Vec<f32> = (0..n * k).map(|_| u()).collect();
        let train = correlated_rows(256, k, 1, 2);
        // Other rows from the same channels' mix: what the layer sees later.
        let test = correlated_rows(256, k, 1, 5);
        let mut gram = Gram::new(k);
        gram.add(&train);
        let h = gram.hessian(None);
        let rtn8 = dequantize_i8(&quantize_i8_rows(&w, n, k).unwrap(), n, k);
        let g8 = dequantize_i8(&gptq_i8(&w, n, k, &h, 2).unwrap(), n, k);
        let rtn4 = dequantize_i4(&quantize_i4_blocks(&w, n, k, block).unwrap(), n, k);
        let g4 = dequantize_i4(&gptq_i4(&w, n, k, block, &h, 2).unwrap(), n, k);
        let (e8, e8g) = (
            product_error(&test, k, &w, &rtn8),
            product_error(&test, k, &w, &g8),
        );
        let (e4, e4g) = (
            product_error(&test, k, &w, &rtn4),
            product_error(&test, k, &w, &g4),
        );
        assert!(e8g < 0.5 * e8, "int8: gptq {e8g}, nearest {e8}");
        assert!(e4g < 0.5 * e4, "int4: gptq {e4g}, nearest {e4}");
    }

    #[test]
    fn when_k_spans_windows_and_a_channel_is_dead_expect_valid_codes_and_a_smaller_error() {
        // 320 inputs: a full window and a partial one; channel 5 never nonzero in calibration
        // (its `H` row and column zero: factored all the same) but nonzero in the inputs the
        // error is measured on (its weight must not have been dropped).
        let (n, k, block) = (16, 320, 32);
        let mut u = uniform(11);
        let w: Vec<f32> = (0..n * k).map(|_| u()).collect();
        let mut x = correlated_rows(512, k, 4, 9);
        x.chunks_exact_mut(k).for_each(|r| r[5] = 0.0);
        let mut gram = Gram::new(k);
        gram.add(&x[..256 * k]);
        gram.add(&x[256 * k..]);
        let h = gram.hessian(None);
        let g8 = gptq_i8(&w, n, k, &h, 3).unwrap();
        let rtn8 = quantize_i8_rows(&w, n, k).unwrap();
        assert_eq!(g8.scales, rtn8.scales);
        assert!(g8.q.iter().all(|q| (-127..=127).contains(q)));
        let g4 = gptq_i4(&w, n, k, block, &h, 3).unwrap();
        assert_eq!(g4.scales.len(), n * k / block);
        let test = correlated_rows(256, k, 4, 10);
        let e = |deq: &[f32]| product_error(&test, k, &w, deq);
        let rtn4 = quantize_i4_blocks(&w, n, k, block).unwrap();
        assert!(e(&dequantize_i8(&g8, n, k)) < e(&dequantize_i8(&rtn8, n, k)));
        assert!(e(&dequantize_i4(&g4, n, k)) < e(&dequantize_i4(&rtn4, n, k)));
        // Split among any number of threads, the same integers.
        assert_eq!(gptq_i4(&w, n, k, block, &h, 1).unwrap(), g4);
        // A non-finite input makes `H` unusable: no GPTQ (the caller rounds to nearest).
        let mut bad = Gram::new(k);
        bad.add(&vec![f32::NAN; k]);
        assert!(gptq_i8(&w, n, k, &bad.hessian(None), 1).is_none());
    }

    #[test]
    fn when_rows_come_in_several_calls_expect_the_windows_of_x_transpose_x_over_all_of_them() {
        let k = 300;
        let x = correlated_rows(40, k, 2, 3);
        let mut gram = Gram::new(k);
        gram.add(&x[..7 * k]);
        gram.add(&x[7 * k..]);
        let mut other = Gram::new(k);
        other.add(&x[..5 * k]);
        gram.absorb(&other);
        let rows: Vec<&[f32]> = x
            .chunks_exact(k)
            .chain(x[..5 * k].chunks_exact(k))
            .collect();
        let h = gram.hessian(None);
        assert_eq!(h.blocks.len(), 2);
        for (block, (c0, size)) in h.blocks.iter().zip([(0, 256), (256, 44)]) {
            assert_eq!(block.len(), size * size);
            for i in 0..size {
                for j in 0..size {
                    let want: f64 = rows
                        .iter()
                        .map(|r| f64::from(r[c0 + i]) * f64::from(r[c0 + j]))
                        .sum::<f64>()
                        / rows.len() as f64;
                    assert!((block[i * size + j] - want).abs() <= 1e-5 * want.abs().max(1e-3));
                }
            }
        }
        // Scaled for a weight stored as W diag(s): the inputs x / s.
        let s: Vec<f32> = (0..k).map(|c| 1.0 + c as f32 / 100.0).collect();
        let hs = gram.hessian(Some(&s));
        let (i, j) = (260, 299);
        let (bi, bj) = (i - 256, j - 256);
        let want = h.blocks[1][bi * 44 + bj] / (f64::from(s[i]) * f64::from(s[j]));
        assert!((hs.blocks[1][bi * 44 + bj] - want).abs() <= 1e-9 * want.abs().max(1e-6));
    }
}

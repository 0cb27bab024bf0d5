//! A Walsh-Hadamard rotation of a matrix's rows, for int8 activations (`w8a8`).
//!
//! Per-token int8 spends a row's 255 levels on its largest value: a row with a few values far
//! above the rest (the MLP's gated product, attention's output) rounds everything else
//! coarsely. An orthonormal `H` spreads every value over the whole row, so the rotated row's
//! largest value is near its typical one, and `x W^T = (x R)(W R)^T` exactly for an orthonormal
//! `R`. The weight is stored rotated; the input is rotated before it is quantized (QuaRot;
//! vla.cpp's FoldQuant).
//!
//! The rotation is `D H`. `D` flips the sign of some channels (`sign`, a fixed pseudo-random
//! pattern): without it a row's mean would gather in each block's first value (the all-ones
//! row of `H`), an outlier made by the rotation. `H` is block-diagonal: a width of `k` is split
//! by its binary expansion, largest block first (`4304 = 4096 + 128 + 64 + 16`), each block a
//! Sylvester Hadamard matrix scaled by `1 / sqrt(size)`. So `D H` is orthonormal for any `k`
//! (its inverse `H D`), and a power of two is one block. Applied with the fast transform,
//! `size log2(size)` additions.

/// The blocks a row of `k` values is rotated in, `(first, size)`, largest first.
pub fn blocks(k: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..usize::BITS)
        .rev()
        .map(|bit| 1usize << bit)
        .filter(move |size| k & size != 0)
        .scan(0, |first, size| {
            let at = *first;
            *first += size;
            Some((at, size))
        })
}

/// The `size x size` orthonormal Sylvester Hadamard matrix (`size` a power of two), row-major:
/// entry `(i, j)` is `(-1)^popcount(i & j) / sqrt(size)`, what `transform` multiplies by.
pub fn matrix(size: usize) -> Vec<f32> {
    let scale = 1.0 / (size as f32).sqrt();
    (0..size * size)
        .map(|ij| {
            if ((ij / size) & (ij % size)).count_ones().is_multiple_of(2) {
                scale
            } else {
                -scale
            }
        })
        .collect()
}

/// Values below which rows are rotated on the calling thread alone.
const MIN_PARALLEL_VALUES: usize = 1 << 16;

/// Rotates each of `x`'s rows of `k` values in place (`x R = x D H`), on up to `threads`
/// threads of rayon's pool; a partial row at the end is left as it is.
pub fn rotate_rows(x: &mut [f32], k: usize, threads: usize) {
    use rayon::prelude::*;
    if k == 0 {
        return;
    }
    let rows = x.len() / k;
    let tasks = threads.min(rows).min(x.len() / MIN_PARALLEL_VALUES).max(1);
    if tasks == 1 {
        return rotate_serial(x, k);
    }
    x[..rows * k]
        .par_chunks_mut(rows.div_ceil(tasks) * k)
        .for_each(|part| rotate_serial(part, k));
}

/// Channel `i`'s sign: `+1` or `-1`, the top bit of a Fibonacci hash of `i` (fixed: stored
/// weights depend on it).
#[inline(always)]
pub fn sign(i: usize) -> f32 {
    if (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 63 == 0 {
        1.0
    } else {
        -1.0
    }
}

fn rotate_serial(x: &mut [f32], k: usize) {
    for row in x.chunks_exact_mut(k) {
        row.iter_mut().enumerate().for_each(|(i, v)| *v *= sign(i));
        for (first, size) in blocks(k) {
            transform(&mut row[first..first + size]);
        }
    }
}

/// The orthonormal fast Walsh-Hadamard transform of `v` (a power-of-two length), in place.
fn transform(v: &mut [f32]) {
    let n = v.len();
    if n < 2 {
        return;
    }
    let mut half = 1;
    while half < n {
        for pair in v.chunks_exact_mut(2 * half) {
            let (a, b) = pair.split_at_mut(half);
            for (x, y) in a.iter_mut().zip(b.iter_mut()) {
                let (s, d) = (*x + *y, *x - *y);
                *x = s;
                *y = d;
            }
        }
        half *= 2;
    }
    let scale = 1.0 / (n as f32).sqrt();
    v.iter_mut().for_each(|x| *x *= scale);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(n: usize, seed: u32) -> Vec<f32> {
        let mut s = seed;
        (0..n)
            .map(|_| {
                s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                (s >> 8) as f32 / (1 << 24) as f32 - 0.5
            })
            .collect()
    }

    /// Standard normal values (Box-Muller on `values`).
    fn gaussian(n: usize, seed: u32) -> Vec<f32> {
        values(2 * n, seed)
            .chunks_exact(2)
            .map(|p| {
                let r = (-2.0 * (p[0] + 0.5).max(1e-7).ln()).sqrt();
                r * (std::f32::consts::TAU * (p[1] + 0.5)).cos()
            })
            .collect()
    }

    #[test]
    fn when_a_width_is_split_expect_its_binary_expansion_in_order() {
        let b: Vec<_> = blocks(4304).collect();
        assert_eq!(b, [(0, 4096), (4096, 128), (4224, 64), (4288, 16)]);
        assert_eq!(blocks(2048).collect::<Vec<_>>(), [(0, 2048)]);
        assert_eq!(blocks(1152).collect::<Vec<_>>(), [(0, 1024), (1024, 128)]);
        assert_eq!(blocks(7).collect::<Vec<_>>(), [(0, 4), (4, 2), (6, 1)]);
        assert_eq!(blocks(0).count(), 0);
    }

    #[test]
    fn when_rows_are_rotated_expect_the_dense_product_with_the_block_matrix() {
        // Against `x D H` computed entry by entry from the definition, for widths that are and
        // are not powers of two.
        for k in [1, 2, 3, 8, 12, 37, 64, 200] {
            let rows = 3;
            let x = values(rows * k, k as u32);
            let mut got = x.clone();
            rotate_rows(&mut got, k, 1);
            for r in 0..rows {
                for (first, size) in blocks(k) {
                    let h = matrix(size);
                    for j in 0..size {
                        let want: f32 = (0..size)
                            .map(|i| x[r * k + first + i] * sign(first + i) * h[i * size + j])
                            .sum();
                        let g = got[r * k + first + j];
                        assert!(
                            (g - want).abs() < 1e-5,
                            "k {k} row {r} col {j}: {g} vs {want}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn when_rotated_expect_norms_kept_and_the_rows_back_from_the_inverse() {
        for k in [16, 1152, 4304, 16384] {
            let x = values(8 * k, 7);
            let mut y = x.clone();
            rotate_rows(&mut y, k, 2);
            let norm = |v: &[f32]| v.iter().map(|a| f64::from(*a).powi(2)).sum::<f64>();
            for (a, b) in x.chunks_exact(k).zip(y.chunks_exact(k)) {
                assert!((norm(a) - norm(b)).abs() < 1e-4 * norm(a), "k {k}");
            }
            // Undone: the transforms again (each its own inverse), then the signs.
            for row in y.chunks_exact_mut(k) {
                for (first, size) in blocks(k) {
                    transform(&mut row[first..first + size]);
                }
                row.iter_mut().enumerate().for_each(|(i, v)| *v *= sign(i));
            }
            let worst = x
                .iter()
                .zip(&y)
                .fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
            assert!(worst < 1e-5, "k {k}: {worst}");
        }
    }

    #[test]
    fn when_a_wide_gated_product_is_multiplied_in_int8_expect_the_rotated_product_nearer() {
        // What `w8a8` rotates for: rows of `gelu(g) * u` (an MLP's down-projection input, heavy
        // tailed), int8 per token by int8 per output channel, against the f32 product. The
        // rotated pair `(x R, W R)` multiplies to the same product with about half the error
        // (the activations' part 2.4x smaller; the weights' is the same either way).
        use crate::packed::int8::{I8Activations, PackedI8Matrix};
        use crate::quant::quantize_i8_rows;
        use crate::vecmath::gelu_tanh;
        let (m, k, n) = (16, 4096, 64);
        let (g, u) = (gaussian(m * k, 11), gaussian(m * k, 12));
        let x: Vec<f32> = g
            .iter()
            .zip(&u)
            .map(|(g, u)| gelu_tanh(2.0 * g) * u)
            .collect();
        let w = gaussian(n * k, 13);
        let exact: Vec<f32> = x
            .chunks_exact(k)
            .flat_map(|row| {
                w.chunks_exact(k)
                    .map(move |col| row.iter().zip(col).map(|(a, b)| a * b).sum::<f32>())
            })
            .collect();
        let error = |x: &[f32], w: &[f32]| {
            let packed =
                PackedI8Matrix::from_quant(&quantize_i8_rows(w, n, k).unwrap(), n, k).unwrap();
            let mut out = vec![0.0; m * n];
            packed
                .matmul_w8a8(x, m, &mut out, &mut I8Activations::new(), 1)
                .unwrap();
            let num: f32 = out.iter().zip(&exact).map(|(a, b)| (a - b).powi(2)).sum();
            let den: f32 = exact.iter().map(|b| b * b).sum();
            (num / den).sqrt()
        };
        let plain = error(&x, &w);
        let (mut xr, mut wr) = (x.clone(), w.clone());
        rotate_rows(&mut xr, k, 1);
        rotate_rows(&mut wr, k, 1);
        let rotated = error(&xr, &wr);
        assert!(
            rotated < plain / 1.5,
            "plain {plain:.2e}, rotated {rotated:.2e}"
        );
    }

    #[test]
    fn when_one_value_stands_out_expect_it_spread_over_its_block() {
        // The reason for the rotation: a row of small values and one outlier comes out with
        // its largest value near the typical one.
        let k = 4096;
        let mut x = values(k, 3);
        x[17] = 100.0;
        let before = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        rotate_rows(&mut x, k, 1);
        let after = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        assert!(after < before / 20.0, "{before} -> {after}");
    }
}

//! Quantized storage: the quantizers' rules, and every kernel's product against the weight the
//! quantized values stand for (dequantized by `crate::quant`, which reads the row-major layout
//! and knows nothing of the panels).

use super::tests::{check_products, values};
use super::*;
use crate::quant::{
    dequantize_i4, dequantize_i8, quantize_i4_blocks, quantize_i8_rows, QuantError,
};

/// A weight whose magnitude changes with the row and every 16 columns, so that a scale taken
/// from the wrong row or block (or none) changes the product.
fn weight(n: usize, k: usize, seed: u32) -> Vec<f32> {
    let mut w = values(n * k, seed);
    for (i, v) in w.iter_mut().enumerate() {
        let (r, c) = (i / k, i % k);
        *v *= (1 + r % 3) as f32 * (1 + (c / 16) % 5) as f32 * 0.37;
    }
    w
}

#[test]
fn int8_panels_give_the_f32_product_of_the_dequantized_weight() {
    // Row tails (m % MR), partial panels (n % NR), several KC blocks, odd k.
    let shapes = [
        (1, 1, 1),
        (3, 5, 7),
        (13, 33, 17),
        (51, 40, 300),
        (25, 1, 513),
        (12, 64, 256),
        (37, 100, 2 * KC + 32),
        (5, 9, 0),
    ];
    for isa in Isa::ALL.into_iter().filter(|i| i.available()) {
        for (m, n, k) in shapes {
            let w = weight(n, k, 2);
            let q = quantize_i8_rows(&w, n, k).unwrap();
            let packed = PackedMatrix::pack_i8_for(isa, &q, n, k);
            assert_eq!(packed.storage(), Storage::I8);
            check_products(isa, &packed, &dequantize_i8(&q, n, k), m, "int8");
        }
    }
}

#[test]
fn int4_panels_give_the_f32_product_of_the_dequantized_weight() {
    for isa in Isa::ALL.into_iter().filter(|i| i.available()) {
        for block in [16, 32, 64, 512] {
            // k = block, a few blocks, several KC blocks and a block past them.
            let ks = [block, 3 * block, 2 * KC + block];
            for (m, n) in [(1, 1), (13, 33), (51, 40), (25, 3), (37, 100)] {
                for k in ks {
                    let w = weight(n, k, 3);
                    let q = quantize_i4_blocks(&w, n, k, block).unwrap();
                    let packed = PackedMatrix::pack_i4_for(isa, &q, n, k);
                    assert_eq!(packed.storage(), Storage::I4 { block });
                    let what = format!("int4 block {block}");
                    check_products(isa, &packed, &dequantize_i4(&q, n, k), m, &what);
                }
            }
        }
    }
}

#[test]
fn quantized_panels_hold_a_byte_or_half_a_byte_a_value_plus_scales() {
    let (n, k) = (100, 1024);
    let w = weight(n, k, 4);
    for isa in Isa::ALL.into_iter().filter(|i| i.available()) {
        let nr = isa.panel_width();
        let padded = n.div_ceil(nr) * nr;
        let f32_bytes = PackedMatrix::pack_for(isa, &w, n, k).bytes();
        // Values, 16 bytes of slack for the kernels' loads, 64 of alignment slack, scales.
        let i8 = PackedMatrix::pack_i8_for(isa, &quantize_i8_rows(&w, n, k).unwrap(), n, k);
        assert_eq!(
            i8.bytes(),
            padded * k + 16 + 64 + padded * 4,
            "{isa:?} int8"
        );
        assert!(i8.bytes() * 4 < f32_bytes + 4096);
        for block in [32, 64] {
            let q = quantize_i4_blocks(&w, n, k, block).unwrap();
            let i4 = PackedMatrix::pack_i4_for(isa, &q, n, k);
            let scales = padded * (k / block) * 4;
            assert_eq!(
                i4.bytes(),
                padded * k / 2 + 16 + 64 + scales,
                "{isa:?} int4"
            );
        }
    }
}

#[test]
fn pack_as_a_quantized_storage_quantizes() {
    let (m, n, k) = (7, 20, 64);
    let w = weight(n, k, 5);
    for isa in Isa::ALL.into_iter().filter(|i| i.available()) {
        let i8 = PackedMatrix::pack_for_as(isa, Storage::I8, &w, n, k);
        let q8 = quantize_i8_rows(&w, n, k).unwrap();
        check_products(isa, &i8, &dequantize_i8(&q8, n, k), m, "pack_as int8");
        let i4 = PackedMatrix::pack_for_as(isa, Storage::I4 { block: 32 }, &w, n, k);
        let q4 = quantize_i4_blocks(&w, n, k, 32).unwrap();
        check_products(isa, &i4, &dequantize_i4(&q4, n, k), m, "pack_as int4");
    }
}

/// Squared error of `x` rounded to the grid `[lo, hi]` of step `d` (an independent reference).
fn rtn_sse(x: &[f32], d: f32, lo: f32, hi: f32) -> f64 {
    x.iter()
        .map(|&v| {
            let q = if d == 0.0 {
                0.0
            } else {
                (v / d).round().clamp(lo, hi)
            };
            (v as f64 - q as f64 * d as f64).powi(2)
        })
        .sum()
}

#[test]
fn int8_rounds_to_the_nearest_step_of_absmax_over_127() {
    let (n, k) = (6, 300);
    let mut w = weight(n, k, 6);
    w[2 * k..3 * k].fill(0.0); // an all-zero row
    w[4 * k + 17] = -9.5; // the absmax of row 4, negative
    w[5 * k..6 * k]
        .iter_mut()
        .enumerate()
        .for_each(|(i, v)| *v = ((i % 255) as f32 - 127.0) * 0.01);
    let q = quantize_i8_rows(&w, n, k).unwrap();
    let deq = dequantize_i8(&q, n, k);
    for r in 0..n {
        let row = &w[r * k..(r + 1) * k];
        let absmax = row.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let scale = q.scales[r];
        assert_eq!(scale, absmax / 127.0, "row {r}");
        for c in 0..k {
            let want = if scale == 0.0 {
                0.0
            } else {
                (row[c] / scale).round().clamp(-127.0, 127.0)
            };
            assert_eq!(
                q.q[r * k + c] as f32,
                want,
                "[{r},{c}] not the nearest step"
            );
            assert_eq!(deq[r * k + c], q.q[r * k + c] as f32 * scale);
            if row[c].abs() <= 127.0 * scale {
                let err = (row[c] as f64 - deq[r * k + c] as f64).abs();
                assert!(err <= scale as f64 * (0.5 + 1e-5), "[{r},{c}] off by {err}");
            }
        }
    }
    // A row on the grid of absmax / 127 already: no error.
    assert_eq!(q.scales[5], 1.27 / 127.0);
    assert!(rtn_sse(&w[5 * k..], q.scales[5], -127.0, 127.0) < 1e-9);
    assert_eq!(q.scales[2], 0.0);
    assert!(q.q[2 * k..3 * k].iter().all(|&v| v == 0));
    assert!(deq[2 * k..3 * k].iter().all(|&v| v == 0.0));
}

#[test]
fn int4_follows_q4_0_and_the_matmulnbits_layout() {
    // One block of 16 on Q4_0's grid already (largest magnitude negative: d = -8 / -8 = 1,
    // codes x + 8): no error, so the search keeps Q4_0's scale.
    let mut w = vec![0.0f32; 32];
    w[0] = -8.0;
    w[1] = 4.0;
    w[2] = 7.0;
    w[3] = -1.0;
    w[15] = 2.0;
    // Second block: all zeros (d = 0, codes 8).
    let q = quantize_i4_blocks(&w, 1, 32, 16).unwrap();
    assert_eq!(q.scales, [1.0, 0.0]);
    // Even column in the low nibble, odd in the high one.
    assert_eq!(q.packed[0], 12 << 4); // codes 0 (low) and 12 (high)
    assert_eq!(q.packed[1], 15 | 7 << 4);
    assert_eq!(q.packed[7], 8 | 10 << 4);
    assert!(q.packed[8..].iter().all(|&b| b == 0x88));
    let deq = dequantize_i4(&q, 1, 32);
    assert_eq!(&deq[..4], [-8.0, 4.0, 7.0, -1.0]);
    assert!(deq[16..].iter().all(|&v| v == 0.0));

    // Any block: the nearest code for its scale, a squared error no worse than Q4_0's.
    let (n, k, block) = (5, 256, 32);
    let w = weight(n, k, 7);
    let q = quantize_i4_blocks(&w, n, k, block).unwrap();
    let deq = dequantize_i4(&q, n, k);
    let mut searched = 0;
    for r in 0..n {
        for b in 0..k / block {
            let x = &w[r * k + b * block..][..block];
            let m = x
                .iter()
                .fold(0.0f32, |m, &v| if v.abs() > m.abs() { v } else { m });
            let d = q.scales[r * (k / block) + b];
            assert!(
                rtn_sse(x, d, -8.0, 7.0) <= rtn_sse(x, m / -8.0, -8.0, 7.0),
                "[{r}] block {b}"
            );
            // Q4_0's scale, or the symmetric one where that rounds the block closer.
            let symmetric = rtn_sse(x, m / 7.0, -8.0, 7.0) < rtn_sse(x, m / -8.0, -8.0, 7.0);
            assert_eq!(
                d,
                if symmetric { m / 7.0 } else { m / -8.0 },
                "[{r}] block {b}"
            );
            searched += usize::from(symmetric);
            for (i, &v) in x.iter().enumerate() {
                let c = b * block + i;
                let code = ((v / d).round() + 8.0).clamp(0.0, 15.0) as u8;
                assert_eq!(q.code(k, r, c), code, "[{r},{c}] not the nearest code");
                assert_eq!(deq[r * k + c], (code as f32 - 8.0) * d);
            }
        }
    }
    // Both scales occur (else the choice was not exercised).
    assert!(searched > 0 && searched < n * k / block, "{searched}");
}

#[test]
fn quantizers_refuse_bad_blocks_and_non_finite_values() {
    let (n, k) = (4, 64);
    let mut w = weight(n, k, 8);
    for block in [0, 8, 24, 48] {
        assert_eq!(
            quantize_i4_blocks(&w, n, k, block),
            Err(QuantError::BadBlock(block))
        );
    }
    assert!(quantize_i4_blocks(&w, 2, 2 * k, 128).is_ok()); // a block past 64 is fine
    assert_eq!(
        quantize_i4_blocks(&w[..4 * 48], 4, 48, 32),
        Err(QuantError::KNotMultipleOfBlock { k: 48, block: 32 })
    );
    assert_eq!(
        quantize_i8_rows(&w[1..], n, k),
        Err(QuantError::Shape {
            len: n * k - 1,
            n,
            k
        })
    );
    for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        w[2 * k + 5] = bad;
        let i8 = quantize_i8_rows(&w, n, k).unwrap_err();
        let i4 = quantize_i4_blocks(&w, n, k, 16).unwrap_err();
        for e in [i8, i4] {
            assert!(
                matches!(e, QuantError::NonFinite { row: 2, col: 5, .. }),
                "{e:?}"
            );
            assert!(e.to_string().contains("row 2, column 5"), "{e}");
        }
    }
}

//! Every int8 kernel against a scalar reference: the activations' codes and scales against an
//! independent quantizer (`f32::round_ties_even`), the i32 sums bit for bit, and the f32
//! outputs bit for bit against `(sum as f32 * a_scale) * w_scale`.

use super::super::tests::values;
use super::*;

/// The activation rule, spelled with the standard library: codes and scale of one row.
fn quantize_ref(row: &[f32]) -> (Vec<i8>, f32) {
    let absmax = row.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    if absmax < f32::MIN_POSITIVE {
        return (vec![0; row.len()], 0.0);
    }
    let inv = 127.0 / absmax;
    let q = row
        .iter()
        .map(|v| (v * inv).clamp(-127.0, 127.0).round_ties_even() as i8)
        .collect();
    (q, absmax / 127.0)
}

/// A small deterministic generator (xorshift) for shapes and values.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

fn isas() -> impl Iterator<Item = I8Isa> {
    I8Isa::ALL.into_iter().filter(|i| i.available())
}

/// `isa`'s product of `a` (`[m, k]`) by `w` (`[n, k]`) against the reference: codes, scales,
/// i32 sums and f32 outputs all exact, on 1 to 3 threads, nothing written past the output.
fn check(isa: I8Isa, a: &[f32], w: &[f32], m: usize, n: usize, k: usize, what: &str) {
    let what = format!("{isa:?} {what} {m}x{n}x{k}");
    let q = crate::quant::quantize_i8_rows(w, n, k).unwrap();
    let packed = PackedI8Matrix::from_quant_for(isa, &q, n, k).unwrap();
    assert_eq!(packed.scales(), &q.scales[..], "{what}: scales");
    for r in 0..n {
        for kk in 0..k {
            assert_eq!(
                packed.code(r, kk),
                (q.q[r * k + kk], q.scales[r]),
                "{what}: weight layout"
            );
        }
    }
    let mut acts = I8Activations::new();
    acts.quantize(isa, a, m, k, k, 1).unwrap();
    assert_eq!(acts.rows(), m);
    let mut sums = vec![0i32; m * n];
    for i in 0..m {
        let (codes, scale) = quantize_ref(&a[i * k..(i + 1) * k]);
        assert_eq!(
            acts.scales()[i].to_bits(),
            scale.to_bits(),
            "{what}: scale of row {i}"
        );
        for (kk, &c) in codes.iter().enumerate() {
            assert_eq!(acts.code(i, kk), c, "{what}: code ({i}, {kk})");
        }
        for j in 0..n {
            let s: i64 = (0..k)
                .map(|kk| codes[kk] as i64 * q.q[j * k + kk] as i64)
                .sum();
            sums[i * n + j] = i32::try_from(s).unwrap();
        }
    }
    let mut raw = vec![0.0f32; m * n];
    packed.matmul_raw(&acts, &mut raw);
    for (idx, (g, s)) in raw.iter().zip(&sums).enumerate() {
        assert_eq!(
            g.to_bits() as i32,
            *s,
            "{what}: i32 sum [{}, {}]",
            idx / n.max(1),
            idx % n.max(1)
        );
    }
    for threads in [1, 2, 3] {
        let mut out = vec![f32::NAN; m * n + 5];
        packed
            .matmul_w8a8(a, m, &mut out, &mut acts, threads)
            .unwrap();
        for i in 0..m {
            for j in 0..n {
                let want = sums[i * n + j] as f32 * acts.scales()[i] * q.scales[j];
                let got = out[i * n + j];
                assert_eq!(
                    got.to_bits(),
                    want.to_bits(),
                    "{what} t{threads}: [{i}, {j}] = {got}, want {want}"
                );
            }
        }
        assert!(
            out[m * n..].iter().all(|v| v.is_nan()),
            "{what}: wrote past the output"
        );
    }
}

#[test]
fn every_kernel_is_exact_at_edge_shapes() {
    // Row tiles (MR 4, 6, 8, 12; pairs for smmla), panels (NR 8, 12, 16, 32), groups of 4 and
    // 8 and the padding of k to 16.
    let ms = [1, 2, 3, 5, 6, 7, 8, 9, 11, 12, 13, 25];
    let nks = [
        (1, 1),
        (5, 7),
        (33, 17),
        (12, 16),
        (40, 300),
        (1, 513),
        (100, 4),
        (9, 31),
        (7, 0),
    ];
    for isa in isas() {
        for &m in &ms {
            for &(n, k) in &nks {
                let a = values(m * k, 11);
                let w = values(n * k, 2);
                check(isa, &a, &w, m, n, k, "edges");
            }
        }
    }
}

#[test]
fn every_kernel_is_exact_at_random_shapes() {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    for round in 0..24 {
        let (m, n, k) = (1 + rng.below(40), 1 + rng.below(70), 1 + rng.below(700));
        // Values of several magnitudes per row, so the rows' scales differ.
        let a: Vec<f32> = values(m * k, round)
            .iter()
            .enumerate()
            .map(|(i, v)| v * (1 + (i / k) % 7) as f32)
            .collect();
        let w = values(n * k, round + 100);
        for isa in isas() {
            check(isa, &a, &w, m, n, k, "random");
        }
    }
}

#[test]
fn extreme_codes_and_zero_rows_are_exact() {
    // Every code +-127 (the largest products, and vpdpbusd's 1 and 255 after the offset), a row
    // of zeros among them (scale 0: outputs 0, not NaN), and a row with a single non-zero.
    let (m, n, k) = (14, 35, 1030);
    let mut a: Vec<f32> = (0..m * k)
        .map(|i| if (i / 3) % 2 == 0 { 2.5 } else { -2.5 })
        .collect();
    a[4 * k..5 * k].fill(0.0);
    a[7 * k..8 * k].fill(0.0);
    a[7 * k + 9] = -1e-30;
    // A subnormal absmax counts as a row of zeros (`127 / absmax` would overflow).
    a[10 * k..11 * k].fill(0.0);
    a[10 * k + 3] = 1e-40;
    let w: Vec<f32> = (0..n * k)
        .map(|i| if i % 5 < 2 { -0.75 } else { 0.75 })
        .collect();
    for isa in isas() {
        check(isa, &a, &w, m, n, k, "extremes");
        let packed = PackedI8Matrix::pack_for(isa, &w, n, k).unwrap();
        let mut acts = I8Activations::new();
        let mut out = vec![f32::NAN; m * n];
        packed.matmul_w8a8(&a, m, &mut out, &mut acts, 2).unwrap();
        for row in [4, 10] {
            assert_eq!(acts.scales()[row], 0.0);
            assert!(
                out[row * n..(row + 1) * n].iter().all(|&v| v == 0.0),
                "{isa:?}: zero row {row}"
            );
        }
        assert!(
            out.iter().all(|v| v.is_finite()),
            "{isa:?}: non-finite output"
        );
    }
}

#[test]
fn the_largest_k_does_not_overflow_and_a_larger_one_is_refused() {
    // k = MAX_K with every product 127 * 127 (255 * 127 before vpdpbusd's compensation).
    let (m, n, k) = (3, 2, MAX_K);
    let a = vec![1.0f32; m * k];
    let w = vec![1.0f32; n * k];
    for isa in isas() {
        let packed = PackedI8Matrix::pack_for(isa, &w, n, k).unwrap();
        let mut acts = I8Activations::new();
        acts.quantize(isa, &a, m, k, k, 1).unwrap();
        let mut raw = vec![0.0f32; m * n];
        packed.matmul_raw(&acts, &mut raw);
        let want = (127 * 127 * k) as i32;
        assert!(raw.iter().all(|v| v.to_bits() as i32 == want), "{isa:?}");
    }
    let k = MAX_K + 1;
    assert_eq!(
        PackedI8Matrix::pack(&vec![0.5; k], 1, k).unwrap_err(),
        I8Error::KTooLarge { k, max: MAX_K }
    );
}

#[test]
fn non_finite_activations_are_refused_with_their_place() {
    let (m, n, k) = (6, 9, 40);
    let packed = PackedI8Matrix::pack(&values(n * k, 3), n, k).unwrap();
    let mut acts = I8Activations::new();
    for (row, col, value) in [
        (3, 5, f32::NAN),
        (0, 39, f32::INFINITY),
        (5, 0, f32::NEG_INFINITY),
    ] {
        let mut a = values(m * k, 4);
        a[row * k + col] = value;
        // A later one too: the first in row-major order is the one reported.
        a[(m - 1) * k + k - 1] = f32::NAN;
        let mut out = vec![7.0f32; m * n];
        let err = packed
            .matmul_w8a8(&a, m, &mut out, &mut acts, 2)
            .unwrap_err();
        match err {
            I8Error::NonFinite {
                row: r,
                col: c,
                value: v,
            } => {
                assert_eq!((r, c), (row, col));
                assert_eq!(v.to_bits(), value.to_bits());
            }
            e => panic!("{e}"),
        }
        assert!(err
            .to_string()
            .contains(&format!("row {row}, column {col}")));
        assert_eq!(acts.rows(), 0, "nothing left quantized");
        assert!(out.iter().all(|&v| v == 7.0), "output untouched");
    }
}

#[test]
fn reusing_the_activation_buffers_allocates_nothing() {
    let (n, k) = (20, 300);
    for isa in isas() {
        let packed = PackedI8Matrix::pack_for(isa, &values(n * k, 5), n, k).unwrap();
        let mut acts = I8Activations::new();
        let mut out = vec![0.0f32; 51 * n];
        packed
            .matmul_w8a8(&values(51 * k, 6), 51, &mut out, &mut acts, 2)
            .unwrap();
        let (cap, q_ptr) = (acts.capacity(), acts.data());
        for m in [51, 50, 1, 51] {
            packed
                .matmul_w8a8(&values(m * k, 7), m, &mut out, &mut acts, 2)
                .unwrap();
            assert_eq!(acts.capacity(), cap, "{isa:?} m = {m}: buffers grew");
            assert_eq!(acts.data(), q_ptr, "{isa:?} m = {m}: buffers moved");
        }
        // A larger shape grows them (and the check above could have failed).
        packed
            .matmul_w8a8(&values(60 * k, 7), 60, &mut vec![0.0; 60 * n], &mut acts, 2)
            .unwrap();
        assert!(
            acts.capacity() > cap,
            "{isa:?}: 60 rows fit in 51 rows' buffers"
        );
    }
}

#[test]
fn int8_products_approximate_the_f32_product() {
    // Not exactness (the tests above) but sense: w8a8 stays near the float product.
    let (m, n, k) = (9, 40, 512);
    let a = values(m * k, 8);
    let w = values(n * k, 9);
    let want = super::super::tests::naive(&a, &w, m, n, k);
    let scale = want.iter().fold(0.0f32, |s, v| s.max(v.abs()));
    for isa in isas() {
        let packed = PackedI8Matrix::pack_for(isa, &w, n, k).unwrap();
        let mut out = vec![0.0; m * n];
        packed
            .matmul_w8a8(&a, m, &mut out, &mut I8Activations::new(), 1)
            .unwrap();
        for (g, w) in out.iter().zip(&want) {
            assert!((g - w).abs() < 0.02 * scale, "{isa:?}: {g} vs {w}");
        }
    }
}

#[test]
fn the_kernels_the_test_script_expects_are_detected() {
    // tools/test_aarch64.sh names the kernels qemu's CPU runs: a detection that fell back to
    // another kernel fails here instead of leaving those kernels untested.
    let Ok(list) = std::env::var("PI0D_EXPECT_I8_KERNELS") else {
        return;
    };
    for name in list.split(',') {
        assert!(
            isas().any(|i| format!("{i:?}") == name),
            "{name} kernels expected, found {:?}",
            isas().collect::<Vec<_>>()
        );
    }
}

#[test]
fn every_activation_layout_holds_the_reference_codes() {
    // Quantizing needs no kernel, so every layout is checked on any CPU (smmla's row pairs
    // included), at ks around the groups of 8 and the padding to 16, odd and even m.
    for isa in I8Isa::ALL {
        for (m, k) in [
            (1, 1),
            (3, 7),
            (4, 8),
            (5, 15),
            (2, 16),
            (7, 17),
            (6, 40),
            (3, 0),
        ] {
            let a = values(m * k, 12);
            let mut acts = I8Activations::new();
            acts.quantize(isa, &a, m, k, k, 1).unwrap();
            for i in 0..m {
                let (codes, scale) = quantize_ref(&a[i * k..(i + 1) * k]);
                assert_eq!(
                    acts.scales()[i].to_bits(),
                    scale.to_bits(),
                    "{isa:?} {m}x{k}"
                );
                let got: Vec<i8> = (0..k).map(|kk| acts.code(i, kk)).collect();
                assert_eq!(got, codes, "{isa:?} {m}x{k} row {i}");
            }
        }
    }
}

#[test]
fn a_weight_code_of_minus_128_is_refused_with_its_place() {
    // Symmetric quantization never makes -128; a QuantI8 from elsewhere might.
    let (n, k) = (3, 10);
    let mut q = crate::quant::quantize_i8_rows(&values(n * k, 13), n, k).unwrap();
    assert!(PackedI8Matrix::from_quant(&q, n, k).is_ok());
    q.q[2 * k + 7] = i8::MIN;
    let err = PackedI8Matrix::from_quant(&q, n, k).unwrap_err();
    assert_eq!(err, I8Error::WeightCode { row: 2, col: 7 });
    assert!(err.to_string().contains("row 2, column 7"));
}

#[test]
fn strided_rows_give_the_dense_product_and_leave_the_gaps() {
    // Rows of the input inside wider rows, outputs into a wider buffer (a slice of its columns).
    let (m, n, k, lda, ldc) = (13, 37, 45, 60, 50);
    let a = values((m - 1) * lda + k, 14);
    let dense: Vec<f32> = (0..m * k).map(|i| a[(i / k) * lda + i % k]).collect();
    for isa in isas() {
        let packed = PackedI8Matrix::pack_for(isa, &values(n * k, 15), n, k).unwrap();
        let mut want = vec![0.0f32; m * n];
        packed
            .matmul_w8a8(&dense, m, &mut want, &mut I8Activations::new(), 1)
            .unwrap();
        let mut out = vec![f32::NAN; (m - 1) * ldc + n];
        let mut acts = I8Activations::new();
        packed
            .matmul_w8a8_strided(&a, lda, m, &mut out, ldc, &mut acts, 2)
            .unwrap();
        for i in 0..m {
            let row = &out[i * ldc..i * ldc + n];
            assert_eq!(row, &want[i * n..(i + 1) * n], "{isa:?} row {i}");
            let gap = &out[i * ldc + n..(i * ldc + ldc).min(out.len())];
            assert!(
                gap.iter().all(|v| v.is_nan()),
                "{isa:?}: wrote in the gap after row {i}"
            );
        }
    }
}

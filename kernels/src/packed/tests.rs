use super::*;

pub(super) fn naive(a: &[f32], w: &[f32], m: usize, n: usize, k: usize) -> Vec<f32> {
    let mut out = vec![0.0f32; m * n];
    for i in 0..m {
        for j in 0..n {
            out[i * n + j] = (0..k)
                .map(|kk| a[i * k + kk] as f64 * w[j * k + kk] as f64)
                .sum::<f64>() as f32;
        }
    }
    out
}

pub(super) fn values(len: usize, seed: u32) -> Vec<f32> {
    (0..len)
        .map(|i| {
            let h = (i as u32 ^ seed)
                .wrapping_mul(2_654_435_761)
                .rotate_left(13);
            (h % 2001) as f32 / 1000.0 - 1.0
        })
        .collect()
}

/// `out` against the f64 product `want`, to 1e-4 relative.
pub(super) fn assert_close(out: &[f32], want: &[f32], what: &str) {
    for (i, (g, w)) in out.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= 1e-4 * (1.0 + w.abs()),
            "{what}: out[{i}] = {g}, want {w}"
        );
    }
}

/// `packed` unpacks to `w` (the weight it stands for, dequantized where it is quantized),
/// and its product on 1, 2 and 3 threads is the f64 product against `w`, with nothing written
/// past the output.
pub(super) fn check_products(isa: Isa, packed: &PackedMatrix, deq: &[f32], m: usize, what: &str) {
    let (n, k) = (packed.n, packed.k);
    assert_eq!(
        packed.unpack(),
        deq,
        "{what}: unpack is not the dequantized weight"
    );
    let a = values(m * k, 11);
    let want = naive(&a, deq, m, n, k);
    for threads in [1, 2, 3] {
        let mut out = vec![f32::NAN; m * n + 5];
        packed.matmul(&a, m, &mut out, threads);
        assert_close(
            &out,
            &want,
            &format!("{isa:?} {what} {m}x{n}x{k} t{threads}"),
        );
        assert!(
            out[m * n..].iter().all(|v| v.is_nan()),
            "{isa:?} {what}: wrote past the output"
        );
    }
}

#[test]
fn every_kernel_matches_a_naive_product_at_ragged_shapes() {
    // Shapes around every edge: tails of rows (m % MR), of panels (n % NR) and of k blocks.
    let shapes = [
        (1, 1, 1),
        (3, 5, 7),
        (13, 33, 17),
        (51, 40, 300),
        (25, 1, 513),
        (12, 64, 256),
        (7, 100, 0),
    ];
    for isa in Isa::ALL.into_iter().filter(|i| i.available()) {
        for (m, n, k) in shapes {
            let w = values(n * k, 2);
            let packed = PackedMatrix::pack_for(isa, &w, n, k);
            check_products(isa, &packed, &w, m, "f32");
        }
    }
}

#[test]
fn strided_views_and_transposed_packing_match_a_naive_product() {
    // Attention's shapes: rows of one head inside wider rows, values packed from [k, n].
    let (m, n, k, lda, ldc, ldw) = (19, 37, 45, 60, 50, 41);
    for isa in Isa::ALL.into_iter().filter(|i| i.available()) {
        let a = values((m - 1) * lda + k, 5);
        let wt = values((k - 1) * ldw + n, 6); // [k, n], stride ldw
        let w: Vec<f32> = (0..n * k).map(|i| wt[(i % k) * ldw + i / k]).collect();
        let dense_a: Vec<f32> = (0..m * k).map(|i| a[(i / k) * lda + i % k]).collect();
        let want = naive(&dense_a, &w, m, n, k);
        let mut packed = PackedMatrix::empty(isa);
        // Reused: a bigger matrix first, so the smaller one lands in an old buffer.
        packed.repack_rows(&values(64 * 64, 7), 64, 64, 64);
        packed.repack_cols(&wt, k, n, ldw);
        assert_eq!(packed.unpack(), w, "{isa:?} transposed packing");
        let mut out = vec![f32::NAN; (m - 1) * ldc + n];
        packed.matmul_strided(&a, lda, m, &mut out, ldc, 2);
        for i in 0..m {
            for j in 0..n {
                let (g, w) = (out[i * ldc + j], want[i * n + j]);
                assert!((g - w).abs() <= 1e-4 * (1.0 + w.abs()), "{isa:?} [{i},{j}]");
            }
            assert!(out[i * ldc + n..(i * ldc + ldc).min(out.len())]
                .iter()
                .all(|v| v.is_nan()));
        }
        packed.repack_rows(&w, n, k, k);
        assert_eq!(packed.unpack(), w, "{isa:?} repacked rows");
    }
}

#[test]
fn half_width_panels_give_the_f32_product_of_the_rounded_weights() {
    let shapes = [(1, 1, 1), (13, 33, 17), (51, 40, 300), (25, 3, 513)];
    for isa in Isa::ALL.into_iter().filter(|i| i.available()) {
        for storage in [Storage::Bf16, Storage::F16] {
            for (m, n, k) in shapes {
                let a = values(m * k, 8);
                let w = values(n * k, 9);
                let packed = PackedMatrix::pack_for_as(isa, storage, &w, n, k);
                let rounded: Vec<f32> = match packed.storage() {
                    Storage::Bf16 => w
                        .iter()
                        .map(|&v| half::bf16::from_f32(v).to_f32())
                        .collect(),
                    Storage::F16 => w.iter().map(|&v| half::f16::from_f32(v).to_f32()).collect(),
                    Storage::F32 => w.clone(),
                    Storage::I8 | Storage::I4 { .. } => unreachable!("asked for half width"),
                };
                assert_eq!(packed.storage() == storage, isa.widens(storage));
                assert_eq!(packed.unpack(), rounded, "{isa:?} {storage:?} unpack");
                if packed.storage() != Storage::F32 {
                    // Two bytes a value (and 64 of alignment slack).
                    let padded = n.div_ceil(isa.panel_width()) * isa.panel_width() * k;
                    assert_eq!(packed.bytes(), padded * 2 + 64);
                }
                let want = naive(&a, &rounded, m, n, k);
                let mut out = vec![0.0f32; m * n];
                packed.matmul(&a, m, &mut out, 2);
                for (i, (g, w)) in out.iter().zip(&want).enumerate() {
                    assert!(
                        (g - w).abs() <= 1e-4 * (1.0 + w.abs()),
                        "{isa:?} {storage:?} {m}x{n}x{k}: out[{i}] = {g}, want {w}"
                    );
                }
            }
        }
    }
}

#[test]
fn large_products_split_across_threads_match_one_thread() {
    let (m, n, k) = (70, 300, 600);
    let a = values(m * k, 3);
    let packed = PackedMatrix::pack(&values(n * k, 4), n, k);
    let mut one = vec![0.0; m * n];
    let mut two = vec![0.0; m * n];
    packed.matmul(&a, m, &mut one, 1);
    packed.matmul(&a, m, &mut two, 2);
    assert_eq!(one, two);
}

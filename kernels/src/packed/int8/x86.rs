//! The x86-64 int8 kernels: AVX-512 VNNI and AVX-VNNI (`vpdpbusd`, activations + 128), and
//! AVX2 (both operands sign-extended to i16, `vpmaddwd`). Weights in groups of 4 `k` a column.

use std::arch::x86_64::*;

use super::{drive, Job, MAX_MR, MAX_NR};

pub const AVX512_NR: usize = 32;
pub const AVXVNNI_NR: usize = 16;
pub const AVX2_NR: usize = 8;

type Acc = [i32; MAX_MR * MAX_NR];

/// The 4 activation bytes of group `g` of row `i`, as one i32 to broadcast.
#[inline(always)]
unsafe fn group(a: *const u8, lda: usize, i: usize, g: usize) -> i32 {
    unsafe { (a.add(i * lda + g * 4) as *const i32).read_unaligned() }
}

/// `H` rows by one 32-column panel: per group, two vectors of 16 columns x 4 `k`.
#[inline(always)]
unsafe fn tile_avx512<const H: usize>(
    a: *const u8,
    lda: usize,
    b: *const u8,
    kp: usize,
    out: &mut Acc,
) {
    unsafe {
        let mut acc = [[_mm512_setzero_si512(); 2]; H];
        for g in 0..kp / 4 {
            let w = b.add(g * 4 * AVX512_NR);
            let b0 = _mm512_loadu_si512(w.cast());
            let b1 = _mm512_loadu_si512(w.add(64).cast());
            for (i, row) in acc.iter_mut().enumerate() {
                let av = _mm512_set1_epi32(group(a, lda, i, g));
                row[0] = _mm512_dpbusd_epi32(row[0], av, b0);
                row[1] = _mm512_dpbusd_epi32(row[1], av, b1);
            }
        }
        for (i, row) in acc.iter().enumerate() {
            let o = out.as_mut_ptr().add(i * AVX512_NR);
            _mm512_storeu_si512(o.cast(), row[0]);
            _mm512_storeu_si512(o.add(16).cast(), row[1]);
        }
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
pub unsafe fn run_avx512vnni(job: &Job) {
    let (lda, kp) = (job.lda, job.kp);
    unsafe {
        drive::<12, AVX512_NR, 128, false>(
            job,
            |h, a, b, acc| by_height!(h, tile_avx512, (a, lda, b, kp, acc), 1 2 3 4 5 6 7 8 9 10 11 12),
        )
    }
}

/// `H` rows by one 16-column panel, 256-bit `vpdpbusd`.
#[inline(always)]
unsafe fn tile_avxvnni<const H: usize>(
    a: *const u8,
    lda: usize,
    b: *const u8,
    kp: usize,
    out: &mut Acc,
) {
    unsafe {
        let mut acc = [[_mm256_setzero_si256(); 2]; H];
        for g in 0..kp / 4 {
            let w = b.add(g * 4 * AVXVNNI_NR);
            let b0 = _mm256_loadu_si256(w.cast());
            let b1 = _mm256_loadu_si256(w.add(32).cast());
            for (i, row) in acc.iter_mut().enumerate() {
                let av = _mm256_set1_epi32(group(a, lda, i, g));
                row[0] = _mm256_dpbusd_avx_epi32(row[0], av, b0);
                row[1] = _mm256_dpbusd_avx_epi32(row[1], av, b1);
            }
        }
        for (i, row) in acc.iter().enumerate() {
            let o = out.as_mut_ptr().add(i * AVXVNNI_NR);
            _mm256_storeu_si256(o.cast(), row[0]);
            _mm256_storeu_si256(o.add(8).cast(), row[1]);
        }
    }
}

#[target_feature(enable = "avx2,avxvnni")]
pub unsafe fn run_avxvnni(job: &Job) {
    let (lda, kp) = (job.lda, job.kp);
    unsafe {
        drive::<6, AVXVNNI_NR, 128, false>(
            job,
            |h, a, b, acc| by_height!(h, tile_avxvnni, (a, lda, b, kp, acc), 1 2 3 4 5 6),
        )
    }
}

/// `H` rows by one 8-column panel. A group's 32 weight bytes widen to two vectors of 4
/// columns x 4 `k` in i16; `vpmaddwd` by the row's 4 values (repeated) leaves two partial sums
/// a column in adjacent i32 lanes, which `vphaddd` adds once at the end.
#[inline(always)]
unsafe fn tile_avx2<const H: usize>(
    a: *const u8,
    lda: usize,
    b: *const u8,
    kp: usize,
    out: &mut Acc,
) {
    unsafe {
        let mut acc = [[_mm256_setzero_si256(); 2]; H];
        for g in 0..kp / 4 {
            let w = b.add(g * 4 * AVX2_NR);
            let b0 = _mm256_cvtepi8_epi16(_mm_loadu_si128(w.cast()));
            let b1 = _mm256_cvtepi8_epi16(_mm_loadu_si128(w.add(16).cast()));
            for (i, row) in acc.iter_mut().enumerate() {
                let av = _mm256_cvtepi8_epi16(_mm_set1_epi32(group(a, lda, i, g)));
                row[0] = _mm256_add_epi32(row[0], _mm256_madd_epi16(b0, av));
                row[1] = _mm256_add_epi32(row[1], _mm256_madd_epi16(b1, av));
            }
        }
        for (i, row) in acc.iter().enumerate() {
            // Lanes: [c0 c1 c4 c5 | c2 c3 c6 c7] after the pairwise add; 64-bit halves reordered.
            let sums = _mm256_hadd_epi32(row[0], row[1]);
            let sums = _mm256_permute4x64_epi64::<0b11_01_10_00>(sums);
            _mm256_storeu_si256(out.as_mut_ptr().add(i * AVX2_NR).cast(), sums);
        }
    }
}

#[target_feature(enable = "avx2")]
pub unsafe fn run_avx2(job: &Job) {
    let (lda, kp) = (job.lda, job.kp);
    unsafe {
        drive::<4, AVX2_NR, 0, false>(
            job,
            |h, a, b, acc| by_height!(h, tile_avx2, (a, lda, b, kp, acc), 1 2 3 4),
        )
    }
}

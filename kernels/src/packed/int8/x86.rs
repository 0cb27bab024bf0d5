//! The x86-64 int8 kernels: AVX-512 VNNI and AVX-VNNI (`vpdpbusd`, activations + 128), and
//! AVX2 (`vpsignb` + `vpmaddubsw` + `vpmaddwd`). Weights in groups of 4 `k` a column.

use std::arch::x86_64::*;

use super::{drive, Job, MAX_MR, MAX_NR};

pub const AVX512_NR: usize = 32;
pub const AVXVNNI_NR: usize = 16;
pub const AVX2_NR: usize = 16;

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

/// `H` rows by one 16-column panel: per group, two vectors of 8 columns x 4 `k`. Each row's
/// 4 values, broadcast, give their sign to the weights (`vpsignb`) and their magnitude to
/// `vpmaddubsw`, whose pairs of products then cannot saturate (see the module doc); `vpmaddwd`
/// by ones adds the pairs into one i32 a column.
#[inline(always)]
unsafe fn tile_avx2<const H: usize>(
    a: *const u8,
    lda: usize,
    b: *const u8,
    kp: usize,
    out: &mut Acc,
) {
    unsafe {
        let ones = _mm256_set1_epi16(1);
        let mut acc = [[_mm256_setzero_si256(); 2]; H];
        for g in 0..kp / 4 {
            let w = b.add(g * 4 * AVX2_NR);
            let b0 = _mm256_loadu_si256(w.cast());
            let b1 = _mm256_loadu_si256(w.add(32).cast());
            for (i, row) in acc.iter_mut().enumerate() {
                let av = _mm256_set1_epi32(group(a, lda, i, g));
                let abs = _mm256_abs_epi8(av);
                let p0 = _mm256_maddubs_epi16(abs, _mm256_sign_epi8(b0, av));
                let p1 = _mm256_maddubs_epi16(abs, _mm256_sign_epi8(b1, av));
                row[0] = _mm256_add_epi32(row[0], _mm256_madd_epi16(p0, ones));
                row[1] = _mm256_add_epi32(row[1], _mm256_madd_epi16(p1, ones));
            }
        }
        for (i, row) in acc.iter().enumerate() {
            let o = out.as_mut_ptr().add(i * AVX2_NR);
            _mm256_storeu_si256(o.cast(), row[0]);
            _mm256_storeu_si256(o.add(8).cast(), row[1]);
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

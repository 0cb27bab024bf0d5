//! The aarch64 int8 kernels: `sdot` (FEAT_DotProd, groups of 4 `k`), `smmla` (FEAT_I8MM,
//! groups of 8 `k`, activations in pairs of rows), and plain NEON (`smull` + `sadalp`, groups
//! of 4) for cores with neither. `sdot` and `smmla` are written with `asm!`: their intrinsics
//! (`vdotq_s32`, `vmmlaq_s32`) are not stable in Rust yet.

use std::arch::aarch64::*;
use std::arch::asm;

use super::{drive, Job, MAX_MR, MAX_NR};

pub const DOT_NR: usize = 12;
pub const I8MM_NR: usize = 8;
pub const NEON_NR: usize = 8;

type Acc = [i32; MAX_MR * MAX_NR];

/// `acc += ` per lane, the dot product of 4 bytes of `a` by the 4 of `b`.
macro_rules! sdot {
    ($acc:expr, $a:expr, $b:expr) => {
        asm!(
            "sdot {acc:v}.4s, {a:v}.16b, {b:v}.16b",
            acc = inout(vreg) $acc,
            a = in(vreg) $a,
            b = in(vreg) $b,
            options(pure, nomem, nostack)
        )
    };
}

/// `acc (2x2) += a (2x8) b (2x8)^T`.
macro_rules! smmla {
    ($acc:expr, $a:expr, $b:expr) => {
        asm!(
            "smmla {acc:v}.4s, {a:v}.16b, {b:v}.16b",
            acc = inout(vreg) $acc,
            a = in(vreg) $a,
            b = in(vreg) $b,
            options(pure, nomem, nostack)
        )
    };
}

/// `H` rows by one 12-column panel: per group, three vectors of 4 columns x 4 `k`, each row's
/// 4 values broadcast (`ld1r`).
#[inline(always)]
unsafe fn tile_dot<const H: usize>(
    a: *const u8,
    lda: usize,
    b: *const u8,
    kp: usize,
    out: &mut Acc,
) {
    unsafe {
        let mut acc = [[vdupq_n_s32(0); 3]; H];
        for g in 0..kp / 4 {
            let w = b.add(g * 4 * DOT_NR) as *const i8;
            let bv = [vld1q_s8(w), vld1q_s8(w.add(16)), vld1q_s8(w.add(32))];
            for (i, row) in acc.iter_mut().enumerate() {
                let av = vreinterpretq_s8_s32(vld1q_dup_s32(a.add(i * lda + g * 4).cast()));
                for (s, w) in row.iter_mut().zip(bv) {
                    sdot!(*s, av, w);
                }
            }
        }
        for (i, row) in acc.iter().enumerate() {
            for (v, s) in row.iter().enumerate() {
                vst1q_s32(out.as_mut_ptr().add(i * DOT_NR + v * 4), *s);
            }
        }
    }
}

#[target_feature(enable = "neon,dotprod")]
pub unsafe fn run_dot(job: &Job) {
    let (lda, kp) = (job.lda, job.kp);
    unsafe {
        drive::<8, DOT_NR, 0, false>(
            job,
            |h, a, b, acc| by_height!(h, tile_dot, (a, lda, b, kp, acc), 1 2 3 4 5 6 7 8),
        )
    }
}

/// `P` pairs of rows by one 8-column panel: per group of 8 `k`, four vectors of 2 columns and
/// one of 2 rows (`lda` bytes a pair), each `smmla` a 2x2 block of sums.
#[inline(always)]
unsafe fn tile_mm<const P: usize>(
    a: *const u8,
    lda: usize,
    b: *const u8,
    kp: usize,
    out: &mut Acc,
) {
    unsafe {
        let mut acc = [[vdupq_n_s32(0); 4]; P];
        for g in 0..kp / 8 {
            let w = b.add(g * 8 * I8MM_NR) as *const i8;
            let bv = [
                vld1q_s8(w),
                vld1q_s8(w.add(16)),
                vld1q_s8(w.add(32)),
                vld1q_s8(w.add(48)),
            ];
            for (p, pair) in acc.iter_mut().enumerate() {
                let av = vld1q_s8(a.add(p * lda + g * 16) as *const i8);
                for (s, w) in pair.iter_mut().zip(bv) {
                    smmla!(*s, av, w);
                }
            }
        }
        // Block `q` of pair `p` holds rows 2p, 2p + 1 by columns 2q, 2q + 1.
        for (p, pair) in acc.iter().enumerate() {
            for (q, s) in pair.iter().enumerate() {
                let o = out.as_mut_ptr().add(2 * p * I8MM_NR + 2 * q);
                vst1_s32(o, vget_low_s32(*s));
                vst1_s32(o.add(I8MM_NR), vget_high_s32(*s));
            }
        }
    }
}

#[target_feature(enable = "neon,i8mm")]
pub unsafe fn run_i8mm(job: &Job) {
    let (lda, kp) = (job.lda, job.kp);
    unsafe {
        drive::<8, I8MM_NR, 0, true>(
            job,
            |h, a, b, acc| by_height!(h.div_ceil(2), tile_mm, (a, lda, b, kp, acc), 1 2 3 4),
        )
    }
}

/// `H` rows by one 8-column panel without dot-product instructions: per group, two vectors of
/// 4 columns x 4 `k`; `smull` multiplies 2 columns' values into i16 (at most 127^2) and
/// `sadalp` adds adjacent pairs into i32 lanes, two partial sums a column, added at the end.
#[inline(always)]
unsafe fn tile_neon<const H: usize>(
    a: *const u8,
    lda: usize,
    b: *const u8,
    kp: usize,
    out: &mut Acc,
) {
    unsafe {
        let mut acc = [[vdupq_n_s32(0); 4]; H];
        for g in 0..kp / 4 {
            let w = b.add(g * 4 * NEON_NR) as *const i8;
            let (w0, w1) = (vld1q_s8(w), vld1q_s8(w.add(16)));
            for (i, row) in acc.iter_mut().enumerate() {
                let av = vreinterpretq_s8_s32(vld1q_dup_s32(a.add(i * lda + g * 4).cast()));
                let a8 = vget_low_s8(av);
                row[0] = vpadalq_s16(row[0], vmull_s8(vget_low_s8(w0), a8));
                row[1] = vpadalq_s16(row[1], vmull_high_s8(w0, av));
                row[2] = vpadalq_s16(row[2], vmull_s8(vget_low_s8(w1), a8));
                row[3] = vpadalq_s16(row[3], vmull_high_s8(w1, av));
            }
        }
        for (i, row) in acc.iter().enumerate() {
            let o = out.as_mut_ptr().add(i * NEON_NR);
            vst1q_s32(o, vpaddq_s32(row[0], row[1]));
            vst1q_s32(o.add(4), vpaddq_s32(row[2], row[3]));
        }
    }
}

#[target_feature(enable = "neon")]
pub unsafe fn run_neon(job: &Job) {
    let (lda, kp) = (job.lda, job.kp);
    unsafe {
        drive::<6, NEON_NR, 0, false>(
            job,
            |h, a, b, acc| by_height!(h, tile_neon, (a, lda, b, kp, acc), 1 2 3 4 5 6),
        )
    }
}

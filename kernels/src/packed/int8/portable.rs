//! The portable int8 kernel: plain i32 arithmetic on the same group-of-4 layout.

use super::{drive, Job, MAX_MR, MAX_NR};

pub const NR: usize = 8;

/// `H` rows by one `NR`-column panel.
#[inline(always)]
unsafe fn tile<const H: usize>(
    a: *const u8,
    lda: usize,
    b: *const u8,
    kp: usize,
    out: &mut [i32; MAX_MR * MAX_NR],
) {
    let mut acc = [[0i32; NR]; H];
    for g in 0..kp / 4 {
        for (i, row) in acc.iter_mut().enumerate() {
            for (j, sum) in row.iter_mut().enumerate() {
                for t in 0..4 {
                    // SAFETY: group `g` of row `i` and of column `j` lie inside the caller's
                    // rows and panel (`kp` values each).
                    let (x, w) = unsafe {
                        (
                            *a.add(i * lda + g * 4 + t) as i8,
                            *b.add(g * 4 * NR + j * 4 + t) as i8,
                        )
                    };
                    *sum += x as i32 * w as i32;
                }
            }
        }
    }
    for (i, row) in acc.iter().enumerate() {
        out[i * NR..(i + 1) * NR].copy_from_slice(row);
    }
}

pub unsafe fn run(job: &Job) {
    let (lda, kp) = (job.lda, job.kp);
    unsafe {
        drive::<4, NR, 0, false>(
            job,
            |h, a, b, acc| by_height!(h, tile, (a, lda, b, kp, acc), 1 2 3 4),
        )
    }
}

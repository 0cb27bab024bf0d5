//! The NEON micro-kernel (aarch64).

use std::arch::aarch64::*;

use super::{Elem, Job, Lanes};

const MR: usize = 8;
const NV: usize = 3;
pub const NR: usize = NV * 4;

#[derive(Clone, Copy)]
struct V(float32x4_t);

impl Lanes for V {
    const N: usize = 4;
    #[inline(always)]
    unsafe fn zero() -> V {
        V(unsafe { vdupq_n_f32(0.0) })
    }
    #[inline(always)]
    unsafe fn splat(x: f32) -> V {
        V(unsafe { vdupq_n_f32(x) })
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> V {
        V(unsafe { vld1q_f32(p) })
    }
    #[inline(always)]
    unsafe fn store(self, p: *mut f32) {
        unsafe { vst1q_f32(p, self.0) }
    }
    #[inline(always)]
    unsafe fn mul_add(self, a: V, b: V) -> V {
        V(unsafe { vfmaq_f32(self.0, a.0, b.0) })
    }
    #[inline(always)]
    unsafe fn add(self, b: V) -> V {
        V(unsafe { vaddq_f32(self.0, b.0) })
    }
    #[inline(always)]
    unsafe fn load_bf16(p: *const u16) -> V {
        let bits = unsafe { vshlq_n_u32::<16>(vmovl_u16(vld1_u16(p))) };
        V(unsafe { vreinterpretq_f32_u32(bits) })
    }
    #[inline(always)]
    unsafe fn load_f16(_p: *const u16) -> V {
        unreachable!("f16 panels are not packed for NEON (Isa::widens)")
    }
    #[inline(always)]
    unsafe fn mul(self, b: V) -> V {
        V(unsafe { vmulq_f32(self.0, b.0) })
    }
    #[inline(always)]
    unsafe fn load_i8(p: *const u8) -> V {
        // 8 bytes loaded, 4 used (the panels keep slack after their end for it).
        let q = unsafe { vmovl_s8(vld1_s8(p as *const i8)) };
        V(unsafe { vcvtq_f32_s32(vmovl_s16(vget_low_s16(q))) })
    }
    #[inline(always)]
    unsafe fn load_i4_row<const NV: usize>(p: *const u8) -> [V; NV] {
        // Twelve columns in 6 bytes: columns 0-5 in the low nibbles, 6-11 in the high ones.
        // One table lookup puts them in column order, then they widen as int8 would.
        const { assert!(NV == 3) };
        const ORDER: [u8; 16] = [0, 1, 2, 3, 4, 5, 8, 9, 10, 11, 12, 13, 0, 0, 0, 0];
        let mut r = [unsafe { V::zero() }; NV];
        unsafe {
            let b = vld1_u8(p);
            let both = vcombine_u8(vand_u8(b, vdup_n_u8(0xF)), vshr_n_u8::<4>(b));
            let cols = vqtbl1q_u8(both, vld1q_u8(ORDER.as_ptr()));
            let eight = vdupq_n_s16(8);
            let w0 = vsubq_s16(vreinterpretq_s16_u16(vmovl_u8(vget_low_u8(cols))), eight);
            let w1 = vsubq_s16(vreinterpretq_s16_u16(vmovl_high_u8(cols)), eight);
            r[0] = V(vcvtq_f32_s32(vmovl_s16(vget_low_s16(w0))));
            r[1] = V(vcvtq_f32_s32(vmovl_high_s16(w0)));
            r[2] = V(vcvtq_f32_s32(vmovl_s16(vget_low_s16(w1))));
        }
        r
    }
}

#[target_feature(enable = "neon")]
pub unsafe fn run<E: Elem>(job: &Job) {
    unsafe { super::drive::<V, E, MR, NV>(job) }
}

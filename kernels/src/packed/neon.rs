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
}

#[target_feature(enable = "neon")]
pub unsafe fn run<E: Elem>(job: &Job) {
    unsafe { super::drive::<V, E, MR, NV>(job) }
}

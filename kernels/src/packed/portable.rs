//! The portable micro-kernel, for any other instruction set (and the reference the others are
//! tested against).

use super::{Elem, Job, Lanes};

const MR: usize = 4;
const NV: usize = 8;
pub const NR: usize = NV;

impl Lanes for f32 {
    const N: usize = 1;
    #[inline(always)]
    unsafe fn zero() -> f32 {
        0.0
    }
    #[inline(always)]
    unsafe fn splat(x: f32) -> f32 {
        x
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> f32 {
        unsafe { *p }
    }
    #[inline(always)]
    unsafe fn store(self, p: *mut f32) {
        unsafe { *p = self }
    }
    #[inline(always)]
    unsafe fn mul_add(self, a: f32, b: f32) -> f32 {
        // Not `f32::mul_add`: without FMA hardware that is a slow library call.
        self + a * b
    }
    #[inline(always)]
    unsafe fn add(self, b: f32) -> f32 {
        self + b
    }
    #[inline(always)]
    unsafe fn load_bf16(p: *const u16) -> f32 {
        f32::from_bits((unsafe { *p } as u32) << 16)
    }
    #[inline(always)]
    unsafe fn load_f16(p: *const u16) -> f32 {
        half::f16::from_bits(unsafe { *p }).to_f32()
    }
    #[inline(always)]
    unsafe fn mul(self, b: f32) -> f32 {
        self * b
    }
    #[inline(always)]
    unsafe fn load_i8(p: *const u8) -> f32 {
        unsafe { *p as i8 as f32 }
    }
    #[inline(always)]
    unsafe fn load_i4_row<const NV: usize>(p: *const u8) -> [f32; NV] {
        unsafe {
            super::i4_row_in_pairs(p, |p| {
                let b = *p;
                ((b & 0xF) as i32 as f32 - 8.0, (b >> 4) as i32 as f32 - 8.0)
            })
        }
    }
}

pub unsafe fn run<E: Elem>(job: &Job) {
    unsafe { super::drive::<f32, E, MR, NV>(job) }
}

//! The AVX2 + FMA micro-kernel (x86-64).

use std::arch::x86_64::*;

use super::{Elem, Job, Lanes};

const MR: usize = 6;
const NV: usize = 2;
pub const NR: usize = NV * 8;

#[derive(Clone, Copy)]
struct V(__m256);

impl Lanes for V {
    const N: usize = 8;
    #[inline(always)]
    unsafe fn zero() -> V {
        V(unsafe { _mm256_setzero_ps() })
    }
    #[inline(always)]
    unsafe fn splat(x: f32) -> V {
        V(unsafe { _mm256_set1_ps(x) })
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> V {
        V(unsafe { _mm256_loadu_ps(p) })
    }
    #[inline(always)]
    unsafe fn store(self, p: *mut f32) {
        unsafe { _mm256_storeu_ps(p, self.0) }
    }
    #[inline(always)]
    unsafe fn mul_add(self, a: V, b: V) -> V {
        V(unsafe { _mm256_fmadd_ps(a.0, b.0, self.0) })
    }
    #[inline(always)]
    unsafe fn add(self, b: V) -> V {
        V(unsafe { _mm256_add_ps(self.0, b.0) })
    }
    #[inline(always)]
    unsafe fn load_bf16(p: *const u16) -> V {
        let bits = unsafe { _mm256_cvtepu16_epi32(_mm_loadu_si128(p as *const __m128i)) };
        V(unsafe { _mm256_castsi256_ps(_mm256_slli_epi32::<16>(bits)) })
    }
    #[inline(always)]
    unsafe fn load_f16(p: *const u16) -> V {
        V(unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i)) })
    }
    #[inline(always)]
    unsafe fn mul(self, b: V) -> V {
        V(unsafe { _mm256_mul_ps(self.0, b.0) })
    }
    #[inline(always)]
    unsafe fn load_i8(p: *const u8) -> V {
        let q = unsafe { _mm256_cvtepi8_epi32(_mm_loadl_epi64(p as *const __m128i)) };
        V(unsafe { _mm256_cvtepi32_ps(q) })
    }
    #[inline(always)]
    unsafe fn load_i4_row<const NV: usize>(p: *const u8) -> [V; NV] {
        unsafe { super::i4_row_in_pairs(p, |p| nibbles(p)) }
    }
}

/// The 8 bytes at `p` as their low and their high nibbles, less 8, in f32.
#[inline(always)]
unsafe fn nibbles(p: *const u8) -> (V, V) {
    unsafe {
        let b = _mm256_cvtepu8_epi32(_mm_loadl_epi64(p as *const __m128i));
        let eight = _mm256_set1_epi32(8);
        let lo = _mm256_sub_epi32(_mm256_and_si256(b, _mm256_set1_epi32(0xF)), eight);
        let hi = _mm256_sub_epi32(_mm256_srli_epi32::<4>(b), eight);
        (V(_mm256_cvtepi32_ps(lo)), V(_mm256_cvtepi32_ps(hi)))
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn run<E: Elem>(job: &Job) {
    unsafe { super::drive::<V, E, MR, NV>(job) }
}

//! The AVX-512F micro-kernel (x86-64).

use std::arch::x86_64::*;

use super::{Elem, Job, Lanes};

const MR: usize = 12;
const NV: usize = 2;
pub const NR: usize = NV * 16;

#[derive(Clone, Copy)]
struct V(__m512);

impl Lanes for V {
    const N: usize = 16;
    #[inline(always)]
    unsafe fn zero() -> V {
        V(unsafe { _mm512_setzero_ps() })
    }
    #[inline(always)]
    unsafe fn splat(x: f32) -> V {
        V(unsafe { _mm512_set1_ps(x) })
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> V {
        V(unsafe { _mm512_loadu_ps(p) })
    }
    #[inline(always)]
    unsafe fn store(self, p: *mut f32) {
        unsafe { _mm512_storeu_ps(p, self.0) }
    }
    #[inline(always)]
    unsafe fn mul_add(self, a: V, b: V) -> V {
        V(unsafe { _mm512_fmadd_ps(a.0, b.0, self.0) })
    }
    #[inline(always)]
    unsafe fn add(self, b: V) -> V {
        V(unsafe { _mm512_add_ps(self.0, b.0) })
    }
    #[inline(always)]
    unsafe fn load_bf16(p: *const u16) -> V {
        // bf16 is the top half of an f32: widen to 32 bits and shift into place.
        let bits = unsafe { _mm512_cvtepu16_epi32(_mm256_loadu_si256(p as *const __m256i)) };
        V(unsafe { _mm512_castsi512_ps(_mm512_slli_epi32::<16>(bits)) })
    }
    #[inline(always)]
    unsafe fn load_f16(p: *const u16) -> V {
        V(unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i)) })
    }
    #[inline(always)]
    unsafe fn mul(self, b: V) -> V {
        V(unsafe { _mm512_mul_ps(self.0, b.0) })
    }
    #[inline(always)]
    unsafe fn load_i8(p: *const u8) -> V {
        let q = unsafe { _mm512_cvtepi8_epi32(_mm_loadu_si128(p as *const __m128i)) };
        V(unsafe { _mm512_cvtepi32_ps(q) })
    }
    #[inline(always)]
    unsafe fn load_i4_row<const NV: usize>(p: *const u8) -> [V; NV] {
        unsafe { super::i4_row_in_pairs(p, |p| nibbles(p)) }
    }
}

/// The 16 bytes at `p` as their low and their high nibbles, less 8, in f32.
#[inline(always)]
unsafe fn nibbles(p: *const u8) -> (V, V) {
    unsafe {
        let b = _mm512_cvtepu8_epi32(_mm_loadu_si128(p as *const __m128i));
        let eight = _mm512_set1_epi32(8);
        let lo = _mm512_sub_epi32(_mm512_and_si512(b, _mm512_set1_epi32(0xF)), eight);
        let hi = _mm512_sub_epi32(_mm512_srli_epi32::<4>(b), eight);
        (V(_mm512_cvtepi32_ps(lo)), V(_mm512_cvtepi32_ps(hi)))
    }
}

#[target_feature(enable = "avx512f")]
pub unsafe fn run<E: Elem>(job: &Job) {
    unsafe { super::drive::<V, E, MR, NV>(job) }
}

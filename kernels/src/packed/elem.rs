//! The element types of packed panels: how one `k`-row of a panel becomes f32 vectors.

use super::Lanes;

/// bf16 bits in a packed panel.
#[derive(Clone, Copy)]
pub(super) struct Bf16Bits;

/// IEEE f16 bits in a packed panel.
#[derive(Clone, Copy)]
pub(super) struct F16Bits;

/// int8 values in a packed panel, one scale per column.
#[derive(Clone, Copy)]
pub(super) struct I8Val;

/// int4 codes in a packed panel, two a byte (see `quantized.rs`), one scale per column and block.
#[derive(Clone, Copy)]
pub(super) struct I4Pair;

/// Where a packed element type's scales apply.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Scale {
    None,
    /// One per output column, applied to the accumulators as they are stored.
    PerColumn,
    /// One per output column and block of `k`, applied to the weights as they are loaded.
    PerBlock,
}

/// A packed element type: how one `k`-row of a panel (`NV` vectors of `V::N` values) becomes
/// f32 vectors.
pub(super) trait Elem: Copy {
    const SCALE: Scale;
    /// Bytes that `values` packed values take.
    fn bytes(values: usize) -> usize;
    /// The `k`-row at `p`, times `scale` where `SCALE` is `PerBlock` (ignored otherwise).
    unsafe fn row<V: Lanes, const NV: usize>(p: *const u8, scale: &[V; NV]) -> [V; NV];
}

impl Elem for f32 {
    const SCALE: Scale = Scale::None;
    #[inline(always)]
    fn bytes(values: usize) -> usize {
        values * 4
    }
    #[inline(always)]
    unsafe fn row<V: Lanes, const NV: usize>(p: *const u8, _: &[V; NV]) -> [V; NV] {
        unsafe { vectors(|j| V::load((p as *const f32).add(j * V::N))) }
    }
}

impl Elem for Bf16Bits {
    const SCALE: Scale = Scale::None;
    #[inline(always)]
    fn bytes(values: usize) -> usize {
        values * 2
    }
    #[inline(always)]
    unsafe fn row<V: Lanes, const NV: usize>(p: *const u8, _: &[V; NV]) -> [V; NV] {
        unsafe { vectors(|j| V::load_bf16((p as *const u16).add(j * V::N))) }
    }
}

impl Elem for F16Bits {
    const SCALE: Scale = Scale::None;
    #[inline(always)]
    fn bytes(values: usize) -> usize {
        values * 2
    }
    #[inline(always)]
    unsafe fn row<V: Lanes, const NV: usize>(p: *const u8, _: &[V; NV]) -> [V; NV] {
        unsafe { vectors(|j| V::load_f16((p as *const u16).add(j * V::N))) }
    }
}

impl Elem for I8Val {
    const SCALE: Scale = Scale::PerColumn;
    #[inline(always)]
    fn bytes(values: usize) -> usize {
        values
    }
    #[inline(always)]
    unsafe fn row<V: Lanes, const NV: usize>(p: *const u8, _: &[V; NV]) -> [V; NV] {
        unsafe { vectors(|j| V::load_i8(p.add(j * V::N))) }
    }
}

impl Elem for I4Pair {
    const SCALE: Scale = Scale::PerBlock;
    #[inline(always)]
    fn bytes(values: usize) -> usize {
        values / 2
    }
    #[inline(always)]
    unsafe fn row<V: Lanes, const NV: usize>(p: *const u8, scale: &[V; NV]) -> [V; NV] {
        let mut r = unsafe { V::load_i4_row::<NV>(p) };
        for (v, s) in r.iter_mut().zip(scale) {
            *v = unsafe { v.mul(*s) };
        }
        r
    }
}

/// `NV` vectors, vector `j` loaded by `load(j)`.
#[inline(always)]
unsafe fn vectors<V: Lanes, const NV: usize>(load: impl Fn(usize) -> V) -> [V; NV] {
    let mut r = [unsafe { V::zero() }; NV];
    for (j, v) in r.iter_mut().enumerate() {
        *v = load(j);
    }
    r
}

/// An `I4Pair` row for kernels with an even `NV`: the `N` bytes at `g * N` hold vector `g` in
/// their low nibbles and vector `g + NV / 2` in their high ones, as `nibbles` splits them.
#[inline(always)]
pub(super) unsafe fn i4_row_in_pairs<V: Lanes, const NV: usize>(
    p: *const u8,
    nibbles: impl Fn(*const u8) -> (V, V),
) -> [V; NV] {
    const { assert!(NV.is_multiple_of(2)) };
    let mut r = [unsafe { V::zero() }; NV];
    for g in 0..NV / 2 {
        (r[g], r[g + NV / 2]) = nibbles(unsafe { p.add(g * V::N) });
    }
    r
}

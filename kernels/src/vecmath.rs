//! Element-wise activations and softmax over whole slices, vectorized.
//!
//! libm's `expf`/`tanhf` are scalar calls: on pi0's MLPs (up to 560 x 16384 values a layer) they
//! cost a tenth of the prefix once the matmuls were fast. Here `exp` is a branch-free polynomial
//! (Cephes' `expf`, within 2 ulp) that the compiler vectorizes, and each slice function is
//! compiled once more for AVX-512 and AVX2, picked at run time like the matmul kernels.

/// `e^x` for f32, within 2 ulp of the exact value on the normal range; 0 below it, and large
/// arguments saturate at `f32::MAX`'s neighbourhood rather than overflowing (NaN stays NaN).
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    // ln 2 split in two so `x - n ln2` stays exact for |n| <= 128.
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    const LO: f32 = -87.336_55; // ln of the smallest normal f32
    let xc = x.clamp(LO, 88.0);
    let n = (xc * LOG2E).round();
    let r = xc - n * LN2_HI - n * LN2_LO;
    let mut p = 1.987_569_1e-4;
    p = p * r + 1.398_2e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 0.166_666_65;
    p = p * r + 0.5;
    let y = p * r * r + r + 1.0;
    // 2^n through the exponent bits; n is in [-126, 127] after the clamp.
    let scaled = y * f32::from_bits(((n as i32 + 127) as u32) << 23);
    if x < LO {
        0.0
    } else {
        scaled
    }
}

/// PyTorch's `gelu(approximate="tanh")`, as `x * sigmoid(2u)` (the same function:
/// `0.5 (1 + tanh u) = sigmoid(2u)`).
#[inline(always)]
pub fn gelu_tanh(x: f32) -> f32 {
    const C: f32 = 0.797_884_6; // sqrt(2/pi)
    let u = C * (x + 0.044_715 * x * x * x);
    x / (1.0 + exp(-2.0 * u))
}

#[inline(always)]
pub fn silu(x: f32) -> f32 {
    x / (1.0 + exp(-x))
}

/// Defines `pub fn $name(args)` that runs `$body` compiled for the widest vector unit here.
macro_rules! vectorized {
    ($(#[$doc:meta])* pub fn $name:ident($($arg:ident: $ty:ty),*) $body:block) => {
        $(#[$doc])*
        pub fn $name($($arg: $ty),*) {
            #[inline(always)]
            fn body($($arg: $ty),*) $body
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f")]
                unsafe fn avx512($($arg: $ty),*) {
                    body($($arg),*)
                }
                #[target_feature(enable = "avx2,fma")]
                unsafe fn avx2($($arg: $ty),*) {
                    body($($arg),*)
                }
                use $crate::packed::Isa;
                match Isa::best() {
                    // SAFETY: `Isa::best` only names instruction sets this CPU has.
                    Isa::Avx512 => return unsafe { avx512($($arg),*) },
                    Isa::Avx2 => return unsafe { avx2($($arg),*) },
                    _ => {}
                }
            }
            body($($arg),*)
        }
    };
}

vectorized! {
    /// `x = gelu_tanh(x)` for every value.
    pub fn gelu_in_place(x: &mut [f32]) {
        x.iter_mut().for_each(|v| *v = gelu_tanh(*v));
    }
}

vectorized! {
    /// `g = gelu_tanh(g) * u` (Gemma's gated MLP).
    pub fn gelu_gate(g: &mut [f32], u: &[f32]) {
        g.iter_mut().zip(u).for_each(|(g, u)| *g = gelu_tanh(*g) * u);
    }
}

vectorized! {
    /// `x = silu(x)` for every value.
    pub fn silu_in_place(x: &mut [f32]) {
        x.iter_mut().for_each(|v| *v = silu(*v));
    }
}

vectorized! {
    /// Softmax of one row in place (max subtracted first, as PyTorch does).
    pub fn softmax_in_place(row: &mut [f32]) {
        let max = row.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
        // Partial sums in lanes, so the compiler can vectorize the reduction.
        let mut lanes = [0.0f32; 16];
        let mut chunks = row.chunks_exact_mut(16);
        for c in &mut chunks {
            for (l, v) in lanes.iter_mut().zip(c.iter_mut()) {
                *v = exp(*v - max);
                *l += *v;
            }
        }
        let mut sum: f32 = lanes.iter().sum();
        for v in chunks.into_remainder() {
            *v = exp(*v - max);
            sum += *v;
        }
        let inv = 1.0 / sum;
        row.iter_mut().for_each(|v| *v *= inv);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_is_within_two_ulp_of_the_exact_value() {
        let mut x = -87.0f32;
        while x < 88.0 {
            let exact = (x as f64).exp();
            let got = exp(x) as f64;
            let ulp = (exact as f32).abs() * f32::EPSILON;
            assert!(
                (got - exact).abs() <= 2.0 * ulp as f64,
                "exp({x}) = {got}, exact {exact}"
            );
            x += 0.0137;
        }
        assert_eq!(exp(-200.0), 0.0);
        assert_eq!(exp(f32::MIN), 0.0);
        assert!(exp(100.0).is_finite() && exp(100.0) > 1e38);
        assert!(exp(f32::NAN).is_nan());
    }

    #[test]
    fn activations_match_their_libm_formulas() {
        for i in -4000..4000 {
            let x = i as f32 / 400.0;
            let xd = x as f64;
            let gelu = 0.5 * xd * (1.0 + (0.797_884_560_8 * (xd + 0.044_715 * xd.powi(3))).tanh());
            let silu_d = xd / (1.0 + (-xd).exp());
            let mut g = [x];
            gelu_in_place(&mut g);
            let mut s = [x];
            silu_in_place(&mut s);
            assert!(
                (g[0] as f64 - gelu).abs() <= 1e-6 * (1.0 + gelu.abs()),
                "gelu({x})"
            );
            assert!(
                (s[0] as f64 - silu_d).abs() <= 1e-6 * (1.0 + silu_d.abs()),
                "silu({x})"
            );
        }
        let mut far = [-1e4f32, 1e4, -50.0];
        gelu_in_place(&mut far);
        assert!(far[0].abs() < 1e-30 && far[2].abs() < 1e-30, "{far:?}");
        assert_eq!(far[1], 1e4);
    }

    #[test]
    fn softmax_matches_a_naive_one_and_ignores_masked_entries() {
        for len in [1usize, 5, 16, 33, 611] {
            let mut row: Vec<f32> = (0..len).map(|i| ((i * 37) % 23) as f32 / 3.0).collect();
            row[len / 2] = -2.381_976_3e38; // the attention mask value
            let max = row
                .iter()
                .cloned()
                .fold(f64::NEG_INFINITY, |m, v| m.max(v as f64));
            let e: Vec<f64> = row.iter().map(|&v| (v as f64 - max).exp()).collect();
            let sum: f64 = e.iter().sum();
            softmax_in_place(&mut row);
            for (i, (g, w)) in row.iter().zip(&e).enumerate() {
                assert!((*g as f64 - w / sum).abs() < 1e-6, "len {len}: p[{i}]");
            }
            if len > 1 {
                assert_eq!(row[len / 2], 0.0);
            }
        }
    }
}

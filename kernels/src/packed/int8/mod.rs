//! int8 x int8 products with int32 accumulation (the `w8a8` scheme): weights quantized once,
//! symmetric, one scale per output channel (`crate::quant::quantize_i8_rows`' rule), and the
//! activations quantized per row (token) at every call, symmetric `absmax / 127`, by the same
//! pass that packs them for the kernel ([`I8Activations`]). Then
//! `y[i][j] = (sum_k a_q[i][k] * w_q[j][k]) as f32 * a_scale[i] * w_scale[j]`.
//!
//! The weight is laid out as the f32 panels are ([`super`]): panels of `NR` output columns,
//! `k`-major, but in groups of `G` consecutive `k` per column (`G` = 4 for `vpdpbusd`, `sdot`
//! and the AVX2 kernel, 8 for `smmla`): group `g` of panel `p` holds `NR * G` bytes, column `j`'s
//! `G` values at `j * G`. `k` is padded with zeros to a multiple of 16.
//!
//! Why `vpdpbusd`'s offset is exact: it multiplies *unsigned* bytes by signed ones, so the
//! activations are stored as `a + 128` (0..=254) and the kernel computes
//! `sum (a + 128) w = sum a w + 128 sum w`. The column sums `sum w` are computed when packing
//! and subtracted after the loop. Every term is an integer and nothing saturates: a product is
//! at most 255 * 127 in magnitude, and `vpdpbusd` (unlike `vpmaddubsw`) adds its four into the
//! 32-bit accumulator without an intermediate 16-bit sum; with `k <= MAX_K` the running sum
//! stays inside i32, so the subtraction gives `sum a w` exactly. The AVX2 kernel cannot take
//! that offset: `vpmaddubsw` adds its pairs of products into *saturating* i16, and two
//! products of 254 * 127 overflow it. Instead it moves each activation's sign onto the weight
//! (`vpsignb`: `|a| * (w sign(a)) = a w`), so both products of a pair are at most 127 * 127
//! and their sum, at most 32258, fits i16: exact; `vpmaddwd` by ones then adds the pairs into
//! i32. The codes are symmetric (-127..=127; -128 is refused at packing), so negating a weight
//! never overflows. The plain NEON kernel multiplies into i16 (`smull`, at most 127^2) and
//! adds pairs into i32 (`sadalp`). `sdot` and `smmla` take signed bytes directly.
//!
//! Exact integer sums mean every kernel's f32 output is the same: `(sum as f32 * a_scale) *
//! w_scale`, computed the same way by all of them (the tests compare bit for bit).

use std::ops::Range;
use std::sync::OnceLock;

use rayon::prelude::*;
use thiserror::Error;

use crate::quant::{quantize_i8_rows, QuantError, QuantI8};

mod activations;
pub use activations::I8Activations;

/// The largest `k` whose sums cannot overflow i32 in any kernel: `k * 255 * 127 < 2^31`.
pub const MAX_K: usize = i32::MAX as usize / (255 * 127);

/// `k` is padded to a multiple of this (whole `sdot` steps of 16, whole `smmla` groups of 8).
const K_ALIGN: usize = 16;

/// Multiply-adds below which a product runs on the calling thread alone.
const MIN_PARALLEL_WORK: usize = 1 << 18;

/// Why an int8 product or packing was refused.
#[derive(Clone, Copy, Debug, PartialEq, Error)]
pub enum I8Error {
    #[error("activation value at row {row}, column {col} is {value}: not finite")]
    NonFinite { row: usize, col: usize, value: f32 },
    #[error("k = {k} is more than the {max} values an int32 sum of int8 products holds")]
    KTooLarge { k: usize, max: usize },
    #[error("weight code at row {row}, column {col} is -128: symmetric codes are -127..=127")]
    WeightCode { row: usize, col: usize },
    #[error("weight: {0}")]
    Weight(#[from] QuantError),
}

/// The int8 micro-kernel family.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum I8Isa {
    /// AVX-512 VNNI `vpdpbusd` on 512-bit vectors.
    Avx512Vnni,
    /// AVX-VNNI (VEX-encoded `vpdpbusd`) on 256-bit vectors.
    AvxVnni,
    /// AVX2 without VNNI: `vpsignb` + `vpmaddubsw` + `vpmaddwd`.
    Avx2,
    /// aarch64 `smmla` (FEAT_I8MM).
    I8mm,
    /// aarch64 `sdot` (FEAT_DotProd).
    Dotprod,
    /// aarch64 without either (Cortex-A72, A53): `smull` to i16, `sadalp` into i32.
    Neon,
    Portable,
}

/// How a kernel wants its activations laid out (see `activations.rs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Layout {
    /// Rows of `kp` bytes, int8.
    Rows,
    /// Rows of `kp` bytes, int8 + 128 (unsigned, for `vpdpbusd`).
    RowsOffset,
    /// Pairs of rows interleaved 8 `k` at a time (`smmla`'s 2x8 operand), `m` padded to even.
    Pairs,
}

impl I8Isa {
    pub const ALL: [I8Isa; 7] = [
        I8Isa::Avx512Vnni,
        I8Isa::AvxVnni,
        I8Isa::Avx2,
        I8Isa::I8mm,
        I8Isa::Dotprod,
        I8Isa::Neon,
        I8Isa::Portable,
    ];

    /// The fastest kernel this CPU runs (detected once).
    pub fn best() -> I8Isa {
        static BEST: OnceLock<I8Isa> = OnceLock::new();
        *BEST.get_or_init(|| {
            I8Isa::ALL
                .into_iter()
                .find(|i| i.available())
                .unwrap_or(I8Isa::Portable)
        })
    }

    pub fn available(self) -> bool {
        match self {
            #[cfg(target_arch = "x86_64")]
            I8Isa::Avx512Vnni => {
                std::arch::is_x86_feature_detected!("avx512f")
                    && std::arch::is_x86_feature_detected!("avx512bw")
                    && std::arch::is_x86_feature_detected!("avx512vnni")
            }
            #[cfg(target_arch = "x86_64")]
            I8Isa::AvxVnni => {
                std::arch::is_x86_feature_detected!("avx2")
                    && std::arch::is_x86_feature_detected!("avxvnni")
            }
            #[cfg(target_arch = "x86_64")]
            I8Isa::Avx2 => std::arch::is_x86_feature_detected!("avx2"),
            #[cfg(target_arch = "aarch64")]
            I8Isa::I8mm => std::arch::is_aarch64_feature_detected!("i8mm"),
            #[cfg(target_arch = "aarch64")]
            I8Isa::Dotprod => std::arch::is_aarch64_feature_detected!("dotprod"),
            #[cfg(target_arch = "aarch64")]
            I8Isa::Neon => std::arch::is_aarch64_feature_detected!("neon"),
            I8Isa::Portable => true,
            #[allow(unreachable_patterns)]
            _ => false,
        }
    }

    /// Output columns per packed panel.
    pub fn panel_width(self) -> usize {
        self.kernel().nr
    }

    fn kernel(self) -> Kernel {
        match self {
            I8Isa::Avx512Vnni => Kernel::new(x86::AVX512_NR, 4, Layout::RowsOffset),
            I8Isa::AvxVnni => Kernel::new(x86::AVXVNNI_NR, 4, Layout::RowsOffset),
            I8Isa::Avx2 => Kernel::new(x86::AVX2_NR, 4, Layout::Rows),
            I8Isa::I8mm => Kernel::new(neon::I8MM_NR, 8, Layout::Pairs),
            I8Isa::Dotprod => Kernel::new(neon::DOT_NR, 4, Layout::Rows),
            I8Isa::Neon => Kernel::new(neon::NEON_NR, 4, Layout::Rows),
            I8Isa::Portable => Kernel::new(portable::NR, 4, Layout::Rows),
        }
    }

    pub(crate) fn layout(self) -> Layout {
        self.kernel().layout
    }
}

/// A kernel's packing: panel width, `k` values a group, activation layout.
#[derive(Clone, Copy)]
struct Kernel {
    nr: usize,
    group: usize,
    layout: Layout,
}

impl Kernel {
    const fn new(nr: usize, group: usize, layout: Layout) -> Kernel {
        Kernel { nr, group, layout }
    }
}

/// `k` padded to whole kernel steps.
pub(crate) fn padded_k(k: usize) -> usize {
    k.div_ceil(K_ALIGN) * K_ALIGN
}

/// An int8 weight `[n, k]` packed for one int8 kernel, with its per-column scales and sums.
pub struct PackedI8Matrix {
    bytes: Vec<u8>,
    /// Per padded column: `sum_k w_q` (the `vpdpbusd` offset's compensation).
    sums: Vec<i32>,
    /// Per padded column (0 for padding).
    scales: Vec<f32>,
    n: usize,
    k: usize,
    kp: usize,
    isa: I8Isa,
}

impl std::fmt::Debug for PackedI8Matrix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PackedI8Matrix({}x{}, {:?})", self.n, self.k, self.isa)
    }
}

impl PackedI8Matrix {
    /// Quantizes row-major `w` (`[n, k]`, one scale per row) and packs it for the best kernel.
    pub fn pack(w: &[f32], n: usize, k: usize) -> Result<PackedI8Matrix, I8Error> {
        PackedI8Matrix::pack_for(I8Isa::best(), w, n, k)
    }

    /// As `pack`, for a given kernel. Panics if `isa` does not run here.
    pub fn pack_for(isa: I8Isa, w: &[f32], n: usize, k: usize) -> Result<PackedI8Matrix, I8Error> {
        let q = quantize_i8_rows(w, n, k)?;
        PackedI8Matrix::from_quant_for(isa, &q, n, k)
    }

    /// Packs an already quantized weight for the best kernel.
    pub fn from_quant(q: &QuantI8, n: usize, k: usize) -> Result<PackedI8Matrix, I8Error> {
        PackedI8Matrix::from_quant_for(I8Isa::best(), q, n, k)
    }

    /// Packs an already quantized weight for `isa`. Panics if `isa` does not run here or `q`
    /// does not hold `n x k` values and `n` scales.
    pub fn from_quant_for(
        isa: I8Isa,
        q: &QuantI8,
        n: usize,
        k: usize,
    ) -> Result<PackedI8Matrix, I8Error> {
        assert!(isa.available(), "{isa:?} kernels do not run on this CPU");
        assert!(
            q.q.len() == n * k && q.scales.len() == n,
            "int8 weight has {} values and {} scales, not {n} x {k} and {n}",
            q.q.len(),
            q.scales.len()
        );
        if k > MAX_K {
            return Err(I8Error::KTooLarge { k, max: MAX_K });
        }
        // -128 has no negation in i8 (the AVX2 kernel negates weights) and would lift the
        // largest product past `MAX_K`'s bound; `quantize_i8_rows` never makes it.
        if let Some(i) = q.q.iter().position(|&v| v == i8::MIN) {
            let (row, col) = (i / k, i % k);
            return Err(I8Error::WeightCode { row, col });
        }
        let Kernel { nr, group, .. } = isa.kernel();
        let kp = padded_k(k);
        let padded = n.div_ceil(nr) * nr;
        let mut bytes = vec![0u8; padded * kp];
        if kp > 0 {
            bytes
                .par_chunks_exact_mut(nr * kp)
                .enumerate()
                .for_each(|(p, panel)| {
                    for r in p * nr..n.min((p + 1) * nr) {
                        let j = r - p * nr;
                        for (kk, &v) in q.q[r * k..(r + 1) * k].iter().enumerate() {
                            let (g, t) = (kk / group, kk % group);
                            panel[g * nr * group + j * group + t] = v as u8;
                        }
                    }
                });
        }
        let mut sums = vec![0i32; padded];
        let mut scales = vec![0.0f32; padded];
        for r in 0..n {
            sums[r] = q.q[r * k..(r + 1) * k].iter().map(|&v| v as i32).sum();
            scales[r] = q.scales[r];
        }
        Ok(PackedI8Matrix {
            bytes,
            sums,
            scales,
            n,
            k,
            kp,
            isa,
        })
    }

    pub fn isa(&self) -> I8Isa {
        self.isa
    }

    /// Output columns (rows of the weight).
    pub fn n(&self) -> usize {
        self.n
    }

    /// Input width.
    pub fn k(&self) -> usize {
        self.k
    }

    /// The weight's scales, one per output column (row of the weight).
    pub fn scales(&self) -> &[f32] {
        &self.scales[..self.n]
    }

    /// Bytes held: packed values, column sums and scales.
    pub fn bytes(&self) -> usize {
        self.bytes.len() + self.sums.len() * 4 + self.scales.len() * 4
    }

    /// Weight value `(r, kk)` as its int8 code and scale (for checks).
    pub fn code(&self, r: usize, kk: usize) -> (i8, f32) {
        let Kernel { nr, group, .. } = self.isa.kernel();
        let (p, j, g, t) = (r / nr, r % nr, kk / group, kk % group);
        let at = p * nr * self.kp + g * nr * group + j * group + t;
        (self.bytes[at] as i8, self.scales[r])
    }

    /// `out[m, n] = quant(a[m, k]) quant(W)^T`: quantizes the rows of `a` into `scratch` (which
    /// keeps its buffers from call to call: with the same or a smaller shape, nothing is
    /// allocated) and multiplies, on up to `threads` threads of rayon's pool. A non-finite
    /// activation is refused (`I8Error::NonFinite`, `out` untouched).
    pub fn matmul_w8a8(
        &self,
        a: &[f32],
        m: usize,
        out: &mut [f32],
        scratch: &mut I8Activations,
        threads: usize,
    ) -> Result<(), I8Error> {
        self.matmul_w8a8_strided(a, self.k, m, out, self.n, scratch, threads)
    }

    /// As `matmul_w8a8`, with row `i` of `a` at `a[i * lda]` and of `out` at `out[i * ldc]`.
    #[allow(clippy::too_many_arguments)]
    pub fn matmul_w8a8_strided(
        &self,
        a: &[f32],
        lda: usize,
        m: usize,
        out: &mut [f32],
        ldc: usize,
        scratch: &mut I8Activations,
        threads: usize,
    ) -> Result<(), I8Error> {
        scratch.quantize(self.isa, a, m, self.k, lda, threads)?;
        self.matmul_quantized_strided(scratch, out, ldc, threads);
        Ok(())
    }

    /// `out[m, n]` from activations already quantized for this matrix's kernel (several weights
    /// that share an input, such as attention's q, k and v, quantize it once).
    pub fn matmul_quantized(&self, acts: &I8Activations, out: &mut [f32], threads: usize) {
        self.run_product(acts, out, self.n, threads, false)
    }

    /// As `matmul_quantized`, with row `i` of `out` at `out[i * ldc]` (`ldc >= n`).
    pub fn matmul_quantized_strided(
        &self,
        acts: &I8Activations,
        out: &mut [f32],
        ldc: usize,
        threads: usize,
    ) {
        self.run_product(acts, out, ldc, threads, false)
    }

    /// The raw i32 sums `sum_k a_q w_q`, their bits stored in `out` (the kernels' exactness).
    #[cfg(test)]
    pub(crate) fn matmul_raw(&self, acts: &I8Activations, out: &mut [f32]) {
        self.run_product(acts, out, self.n, 1, true)
    }

    fn run_product(
        &self,
        acts: &I8Activations,
        out: &mut [f32],
        ldc: usize,
        threads: usize,
        raw: bool,
    ) {
        let (m, n) = (acts.rows(), self.n);
        assert!(
            acts.layout() == self.isa.layout() && acts.cols() == self.k,
            "activations quantized as {:?} with {} columns, for {:?} with {}",
            acts.layout(),
            acts.cols(),
            self.isa,
            self.k
        );
        if m == 0 || n == 0 {
            return;
        }
        assert!(
            out.len() >= (m - 1) * ldc + n && ldc >= n,
            "output has {} values, not {m} rows of {n} (stride {ldc})",
            out.len()
        );
        let nr = self.isa.panel_width();
        let panels = n.div_ceil(nr);
        let tasks = threads
            .min(panels)
            .min((m * n * self.kp / MIN_PARALLEL_WORK).max(1))
            .max(1);
        let job = |c: *mut f32, panels| Job {
            a: acts.data(),
            lda: acts.stride(),
            a_scales: acts.scales().as_ptr(),
            m,
            c,
            ldc,
            b: self.bytes.as_ptr(),
            sums: self.sums.as_ptr(),
            scales: self.scales.as_ptr(),
            n,
            kp: self.kp,
            panels,
            raw,
        };
        if tasks == 1 {
            // SAFETY: bounds asserted above; one task owns all of `out`.
            unsafe { run(self.isa, &job(out.as_mut_ptr(), 0..panels)) };
            return;
        }
        let c = OutPtr(out.as_mut_ptr());
        (0..tasks).into_par_iter().for_each(|t| {
            let range = panels * t / tasks..panels * (t + 1) / tasks;
            // SAFETY: bounds asserted above; tasks write disjoint column ranges of `out`.
            unsafe { run(self.isa, &job(c.get(), range)) };
        });
    }
}

/// # Safety
/// `job`'s pointers cover its rows; no one else writes its panels' columns; `isa` runs here.
unsafe fn run(isa: I8Isa, job: &Job) {
    unsafe {
        match isa {
            #[cfg(target_arch = "x86_64")]
            I8Isa::Avx512Vnni => x86::run_avx512vnni(job),
            #[cfg(target_arch = "x86_64")]
            I8Isa::AvxVnni => x86::run_avxvnni(job),
            #[cfg(target_arch = "x86_64")]
            I8Isa::Avx2 => x86::run_avx2(job),
            #[cfg(target_arch = "aarch64")]
            I8Isa::I8mm => neon::run_i8mm(job),
            #[cfg(target_arch = "aarch64")]
            I8Isa::Dotprod => neon::run_dot(job),
            #[cfg(target_arch = "aarch64")]
            I8Isa::Neon => neon::run_neon(job),
            _ => portable::run(job),
        }
    }
}

/// The output pointer, shared by tasks that write disjoint columns.
#[derive(Clone, Copy)]
struct OutPtr(*mut f32);
// SAFETY: each task writes only the columns of its own panels.
unsafe impl Send for OutPtr {}
unsafe impl Sync for OutPtr {}
impl OutPtr {
    fn get(self) -> *mut f32 {
        self.0
    }
}

/// One task: the columns of `panels` for all `m` rows.
struct Job {
    /// Quantized activations in the kernel's layout; row (or row pair) `i` at `a + i * lda`.
    a: *const u8,
    lda: usize,
    a_scales: *const f32,
    m: usize,
    c: *mut f32,
    ldc: usize,
    b: *const u8,
    sums: *const i32,
    scales: *const f32,
    n: usize,
    kp: usize,
    panels: Range<usize>,
    /// Store the i32 sums' bits instead of scaled f32 (tests).
    raw: bool,
}

/// Tallest row tile of any kernel, and widest panel: the i32 tile buffer's size.
const MAX_MR: usize = 12;
const MAX_NR: usize = 32;

/// Every row tile against every panel of `job`. `tile(h, a, b, acc)` writes the i32 sums of
/// `h` rows (starting at `a`) by one panel (at `b`) into `acc`, row `i` at `i * NR`; rows
/// advance `a` by `lda` each, or by `lda` a pair when `PAIRS`.
#[inline(always)]
unsafe fn drive<const MR: usize, const NR: usize, const OFFSET: i32, const PAIRS: bool>(
    job: &Job,
    tile: impl Fn(usize, *const u8, *const u8, &mut [i32; MAX_MR * MAX_NR]),
) {
    const { assert!(MR <= MAX_MR && NR <= MAX_NR) };
    let mut acc = [0i32; MAX_MR * MAX_NR];
    for p in job.panels.clone() {
        let b = unsafe { job.b.add(p * NR * job.kp) };
        let cols = NR.min(job.n - p * NR);
        let mut r = 0;
        while r < job.m {
            let h = MR.min(job.m - r);
            let a_off = if PAIRS { r / 2 * job.lda } else { r * job.lda };
            tile(h, unsafe { job.a.add(a_off) }, b, &mut acc);
            for i in 0..h {
                let a_scale = unsafe { *job.a_scales.add(r + i) };
                let c = unsafe { job.c.add((r + i) * job.ldc + p * NR) };
                for j in 0..cols {
                    let col = p * NR + j;
                    let s = acc[i * NR + j].wrapping_sub(OFFSET * unsafe { *job.sums.add(col) });
                    let v = if job.raw {
                        f32::from_bits(s as u32)
                    } else {
                        s as f32 * a_scale * unsafe { *job.scales.add(col) }
                    };
                    unsafe { *c.add(j) = v };
                }
            }
            r += h;
        }
    }
}

/// Dispatches a row count to a tile function of that constant height.
macro_rules! by_height {
    ($h:expr, $f:ident, ($a:expr, $lda:expr, $b:expr, $kp:expr, $acc:expr), $($n:literal)*) => {
        match $h {
            $($n => $f::<$n>($a, $lda, $b, $kp, $acc),)*
            _ => unreachable!("tile of {} rows", $h),
        }
    };
}

#[cfg(target_arch = "x86_64")]
mod x86;
#[cfg(not(target_arch = "x86_64"))]
mod x86 {
    pub const AVX512_NR: usize = 32;
    pub const AVXVNNI_NR: usize = 16;
    pub const AVX2_NR: usize = 16;
}

#[cfg(target_arch = "aarch64")]
mod neon;
#[cfg(not(target_arch = "aarch64"))]
mod neon {
    pub const I8MM_NR: usize = 8;
    pub const DOT_NR: usize = 12;
    pub const NEON_NR: usize = 8;
}

mod portable;

#[cfg(test)]
mod tests;

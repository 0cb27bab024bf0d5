//! f32 products with weight matrices packed once, when the model loads.
//!
//! pi0's weights never change, and the denoise step multiplies them by only ~50 rows: a general
//! GEMM that packs both operands inside every call (the `gemm` crate does) spends about as long
//! copying a 4-64 MB weight as multiplying by it. Here each `[out, in]` weight is laid out once as
//! panels of `NR` output columns, `k`-major (the order the micro-kernel streams them), and the
//! activations are read in place. One micro-kernel per instruction set, picked at run time:
//! AVX-512F or AVX2+FMA on x86-64, NEON on aarch64, and a portable one for anything else.
//! [`int8`] holds the int8 x int8 products (integer arithmetic, its own kernels).

use std::ops::Range;
use std::sync::OnceLock;

use rayon::prelude::*;

use elem::{i4_row_in_pairs, Bf16Bits, Elem, F16Bits, I4Pair, I8Val, Scale};

/// Depth of one cache block: a panel's `KC x NR` slice (32 KiB with AVX-512) stays in L1 while
/// every row tile of the activations passes over it (and, when the activations are too big for
/// the cache, their `rows x KC` slice stays cached while the panels pass).
const KC: usize = 256;

/// Multiply-adds below which a product runs on the calling thread alone: handing work to the
/// pool costs a few microseconds.
const MIN_PARALLEL_WORK: usize = 1 << 18;

/// The micro-kernel family.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Isa {
    Avx512,
    Avx2,
    Neon,
    Portable,
}

impl Isa {
    pub const ALL: [Isa; 4] = [Isa::Avx512, Isa::Avx2, Isa::Neon, Isa::Portable];

    /// The widest kernel this CPU runs (detected once).
    pub fn best() -> Isa {
        static BEST: OnceLock<Isa> = OnceLock::new();
        *BEST.get_or_init(|| {
            Isa::ALL
                .into_iter()
                .find(|i| i.available())
                .unwrap_or(Isa::Portable)
        })
    }

    pub fn available(self) -> bool {
        match self {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => std::arch::is_x86_feature_detected!("avx512f"),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => {
                std::arch::is_x86_feature_detected!("avx2")
                    && std::arch::is_x86_feature_detected!("fma")
                    && std::arch::is_x86_feature_detected!("f16c")
            }
            #[cfg(target_arch = "aarch64")]
            Isa::Neon => std::arch::is_aarch64_feature_detected!("neon"),
            Isa::Portable => true,
            #[allow(unreachable_patterns)]
            _ => false,
        }
    }

    /// Whether this kernel widens `storage` as it loads (else such weights are packed as f32).
    pub fn widens(self, storage: Storage) -> bool {
        // NEON's f16 conversion needs Rust's unstable `f16` vector types.
        !(self == Isa::Neon && storage == Storage::F16)
    }

    /// Output columns per packed panel (the micro-kernel's width).
    pub fn panel_width(self) -> usize {
        match self {
            Isa::Avx512 => avx512::NR,
            Isa::Avx2 => avx2::NR,
            Isa::Neon => neon::NR,
            Isa::Portable => portable::NR,
        }
    }
}

/// How a packed matrix stores its values. Half-width storage halves the memory of a bf16 or
/// f16 checkpoint's weights (and the bytes each product streams); the kernels widen each value
/// to f32 as they load it, so the arithmetic is the same f32 as with `F32`. The quantized ones
/// (see [`crate::quant`]) widen the same way and apply their scales in f32.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Storage {
    F32,
    Bf16,
    F16,
    /// int8, one scale per output row (`pack_i8`).
    I8,
    /// int4 pairs, one scale per output row and `block` values along `k` (`pack_i4`).
    I4 {
        block: usize,
    },
}

/// A `[n, k]` weight (PyTorch's `[out, in]`) in panels of `NR` rows, each stored `k`-major and
/// zero-padded to a whole panel, 64-byte aligned.
pub struct PackedMatrix {
    /// f32 storage (`Storage::F32`).
    buf: Vec<f32>,
    /// Half-width storage, the raw bits (`Storage::Bf16`, `Storage::F16`).
    half: Vec<u16>,
    /// Quantized storage (`Storage::I8`: one value a byte; `Storage::I4`: two).
    bytes: Vec<u8>,
    /// The quantized storage's scales, panel by panel (see `quantized.rs`).
    scales: Vec<f32>,
    /// Where the panels start in `buf`, `half` or `bytes` (for alignment).
    start: usize,
    n: usize,
    k: usize,
    isa: Isa,
    storage: Storage,
}

impl std::fmt::Debug for PackedMatrix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "PackedMatrix({}x{}, {:?}, {:?})",
            self.n, self.k, self.isa, self.storage
        )
    }
}

impl PackedMatrix {
    /// Packs row-major `w` (`[n, k]`) for the best kernel of this CPU.
    pub fn pack(w: &[f32], n: usize, k: usize) -> PackedMatrix {
        PackedMatrix::pack_for(Isa::best(), w, n, k)
    }

    /// Packs for a given kernel. Panics if `isa` does not run here or `w` is shorter than `n * k`.
    pub fn pack_for(isa: Isa, w: &[f32], n: usize, k: usize) -> PackedMatrix {
        PackedMatrix::pack_for_as(isa, Storage::F32, w, n, k)
    }

    /// Packs row-major `w` (`[n, k]`) for the best kernel of this CPU, stored as `storage`
    /// (values rounded to it: exact for weights that came from a checkpoint of that type). Falls
    /// back to f32 storage where the kernel cannot widen that type.
    pub fn pack_as(storage: Storage, w: &[f32], n: usize, k: usize) -> PackedMatrix {
        PackedMatrix::pack_for_as(Isa::best(), storage, w, n, k)
    }

    /// As `pack_as`, for a given kernel.
    ///
    /// # Panics
    /// For `I8` and `I4` storage, the weight is quantized here (`crate::quant`), and a weight
    /// the quantizer refuses (a non-finite value, a bad block) panics: a loader that must
    /// report it quantizes first and calls `pack_i8` / `pack_i4`.
    pub fn pack_for_as(isa: Isa, storage: Storage, w: &[f32], n: usize, k: usize) -> PackedMatrix {
        assert!(
            w.len() >= n * k,
            "weight has {} values, not {n} x {k}",
            w.len()
        );
        let w = &w[..n * k];
        let mut m = PackedMatrix::empty(isa);
        match storage {
            Storage::I8 => match crate::quant::quantize_i8_rows(w, n, k) {
                Ok(q) => return PackedMatrix::pack_i8_for(isa, &q, n, k),
                Err(e) => panic!("{e}"),
            },
            Storage::I4 { block } => match crate::quant::quantize_i4_blocks(w, n, k, block) {
                Ok(q) => return PackedMatrix::pack_i4_for(isa, &q, n, k),
                Err(e) => panic!("{e}"),
            },
            Storage::Bf16 if isa.widens(storage) => {
                m.pack_half(w, n, k, storage, |v| half::bf16::from_f32(v).to_bits())
            }
            Storage::F16 if isa.widens(storage) => {
                m.pack_half(w, n, k, storage, |v| half::f16::from_f32(v).to_bits())
            }
            _ => {
                let packed = m.reset(n, k);
                pack_panels(w, n, k, k, isa.panel_width(), packed, |v| v, Threads::Pool);
            }
        }
        m
    }

    /// Packs `[n, k]` into `half`, each value as `convert` encodes it for `storage`.
    fn pack_half(
        &mut self,
        w: &[f32],
        n: usize,
        k: usize,
        storage: Storage,
        convert: impl Fn(f32) -> u16 + Sync,
    ) {
        let nr = self.isa.panel_width();
        let len = n.div_ceil(nr) * nr * k;
        self.start = aligned(&mut self.half, len);
        (self.n, self.k, self.storage) = (n, k, storage);
        let out = &mut self.half[self.start..self.start + len];
        pack_panels(w, n, k, k, nr, out, convert, Threads::Pool);
    }

    /// A matrix with nothing packed yet, whose buffer later `repack_*` calls fill and reuse.
    pub fn empty(isa: Isa) -> PackedMatrix {
        assert!(isa.available(), "{isa:?} kernels do not run on this CPU");
        PackedMatrix {
            buf: Vec::new(),
            half: Vec::new(),
            bytes: Vec::new(),
            scales: Vec::new(),
            start: 0,
            n: 0,
            k: 0,
            isa,
            storage: Storage::F32,
        }
    }

    pub fn storage(&self) -> Storage {
        self.storage
    }

    /// Bytes of packed values (and scales) held.
    pub fn bytes(&self) -> usize {
        self.buf.len() * 4 + self.half.len() * 2 + self.bytes.len() + self.scales.len() * 4
    }

    /// Sizes the buffer for `[n, k]` (growing it only if it is too small) and returns the
    /// packed area. Padding columns of a partial last panel keep whatever they held: the
    /// kernel computes them but never stores them.
    fn reset(&mut self, n: usize, k: usize) -> &mut [f32] {
        let nr = self.isa.panel_width();
        let len = n.div_ceil(nr) * nr * k;
        self.start = aligned(&mut self.buf, len);
        self.n = n;
        self.k = k;
        self.storage = Storage::F32;
        self.half = Vec::new();
        self.bytes = Vec::new();
        self.scales = Vec::new();
        &mut self.buf[self.start..self.start + len]
    }

    /// Packs `[n, k]` from `w`, whose row `r` starts at `w[r * ldw]` (rows are the outputs).
    pub fn repack_rows(&mut self, w: &[f32], n: usize, k: usize, ldw: usize) {
        assert!(
            n == 0 || w.len() >= (n - 1) * ldw + k,
            "weight has {} values, not {n} rows of {k} (stride {ldw})",
            w.len()
        );
        let nr = self.isa.panel_width();
        let packed = self.reset(n, k);
        pack_panels(w, n, k, ldw, nr, packed, |v| v, Threads::Caller);
    }

    /// Packs `[n, k]` from its transpose: `w` holds `k` rows of `n` outputs, row `kk` starting
    /// at `w[kk * ldw]` (attention's values).
    pub fn repack_cols(&mut self, w: &[f32], k: usize, n: usize, ldw: usize) {
        assert!(
            k == 0 || w.len() >= (k - 1) * ldw + n,
            "matrix has {} values, not {k} rows of {n} (stride {ldw})",
            w.len()
        );
        let nr = self.isa.panel_width();
        let packed = self.reset(n, k);
        if k == 0 {
            return;
        }
        for (p, panel) in packed.chunks_exact_mut(nr * k).enumerate() {
            let cols = nr.min(n - p * nr);
            for kk in 0..k {
                let src = &w[kk * ldw + p * nr..][..cols];
                panel[kk * nr..kk * nr + cols].copy_from_slice(src);
            }
        }
    }

    fn panels(&self) -> usize {
        self.n.div_ceil(self.isa.panel_width())
    }

    /// The weight back in its `[n, k]` row-major form (as f32; quantized storage dequantized).
    pub fn unpack(&self) -> Vec<f32> {
        let nr = self.isa.panel_width();
        let value = |i: usize| match self.storage {
            Storage::F32 => self.buf[self.start + i],
            Storage::Bf16 => half::bf16::from_bits(self.half[self.start + i]).to_f32(),
            Storage::F16 => half::f16::from_bits(self.half[self.start + i]).to_f32(),
            Storage::I8 | Storage::I4 { .. } => unreachable!("quantized values read by value_q"),
        };
        let mut w = vec![0.0f32; self.n * self.k];
        for (r, row) in w.chunks_exact_mut(self.k.max(1)).enumerate() {
            let panel = (r / nr) * nr * self.k;
            for (kk, v) in row.iter_mut().enumerate() {
                *v = match self.storage {
                    Storage::I8 | Storage::I4 { .. } => self.value_q(r, kk),
                    _ => value(panel + kk * nr + r % nr),
                };
            }
        }
        w
    }

    /// `out[m, n] = a[m, k] W^T` (row-major `a` and `out`), on up to `threads` threads of rayon's
    /// pool. Allocates nothing.
    pub fn matmul(&self, a: &[f32], m: usize, out: &mut [f32], threads: usize) {
        self.matmul_strided(a, self.k, m, out, self.n, threads)
    }

    /// As `matmul`, with row `i` of `a` at `a[i * lda]` and of `out` at `out[i * ldc]`.
    pub fn matmul_strided(
        &self,
        a: &[f32],
        lda: usize,
        m: usize,
        out: &mut [f32],
        ldc: usize,
        threads: usize,
    ) {
        let (n, k) = (self.n, self.k);
        if m == 0 || n == 0 {
            return;
        }
        assert!(
            a.len() >= (m - 1) * lda + k && lda >= k,
            "input has {} values, not {m} rows of {k} (stride {lda})",
            a.len()
        );
        assert!(
            out.len() >= (m - 1) * ldc + n && ldc >= n,
            "output has {} values, not {m} rows of {n} (stride {ldc})",
            out.len()
        );
        if k == 0 {
            (0..m).for_each(|i| out[i * ldc..i * ldc + n].fill(0.0));
            return;
        }
        let panels = self.panels();
        let tasks = threads
            .min(panels)
            .min((m * n * k / MIN_PARALLEL_WORK).max(1))
            .max(1);
        let job = |c: *mut f32, panels| Job {
            a: a.as_ptr(),
            lda,
            m,
            c,
            ldc,
            // SAFETY: `start` is inside the buffer in use (see `reset`, `pack_for_as`,
            // `pack_i8_for`, `pack_i4_for`).
            b: unsafe {
                match self.storage {
                    Storage::F32 => self.buf.as_ptr().add(self.start) as *const u8,
                    Storage::Bf16 | Storage::F16 => self.half.as_ptr().add(self.start) as *const u8,
                    Storage::I8 | Storage::I4 { .. } => self.bytes.as_ptr().add(self.start),
                }
            },
            scales: self.scales.as_ptr(),
            block: match self.storage {
                Storage::I4 { block } => block,
                _ => KC,
            },
            n,
            k,
            panels,
        };
        if tasks == 1 {
            // SAFETY: bounds asserted above; one task owns all of `out`.
            unsafe { self.run(&job(out.as_mut_ptr(), 0..panels)) };
            return;
        }
        let c = OutPtr(out.as_mut_ptr());
        (0..tasks).into_par_iter().for_each(|t| {
            let range = panels * t / tasks..panels * (t + 1) / tasks;
            // SAFETY: bounds asserted above; tasks write disjoint column ranges of `out`.
            unsafe { self.run(&job(c.get(), range)) };
        });
    }

    /// # Safety
    /// `job`'s pointers cover its rows and strides; no one else writes its panels' columns.
    unsafe fn run(&self, job: &Job) {
        macro_rules! on {
            ($isa:ident) => {
                match self.storage {
                    Storage::F32 => $isa::run::<f32>(job),
                    Storage::Bf16 => $isa::run::<Bf16Bits>(job),
                    Storage::F16 => $isa::run::<F16Bits>(job),
                    Storage::I8 => $isa::run::<I8Val>(job),
                    Storage::I4 { .. } => $isa::run::<I4Pair>(job),
                }
            };
        }
        unsafe {
            match self.isa {
                #[cfg(target_arch = "x86_64")]
                Isa::Avx512 => on!(avx512),
                #[cfg(target_arch = "x86_64")]
                Isa::Avx2 => on!(avx2),
                #[cfg(target_arch = "aarch64")]
                Isa::Neon => on!(neon),
                _ => on!(portable),
            }
        }
    }
}

impl Default for PackedMatrix {
    fn default() -> PackedMatrix {
        PackedMatrix::empty(Isa::best())
    }
}

/// Grows `buf` (never shrinks it) to hold `len` values starting on a 64-byte boundary (aligned
/// vector loads); returns where they start.
fn aligned<T: Copy + Default>(buf: &mut Vec<T>, len: usize) -> usize {
    let slack = 64 / std::mem::size_of::<T>();
    if buf.len() < len + slack {
        buf.resize(len + slack, T::default());
    }
    buf.as_ptr().align_offset(64).min(slack)
}

/// Where packing runs: on rayon's pool (loading a model: many megabytes, once) or on the
/// calling thread (attention's per-call packing, which must not allocate or wait on the pool).
#[derive(Clone, Copy, PartialEq)]
enum Threads {
    Pool,
    Caller,
}

/// Writes `[n, k]` (row `r` at `w[r * ldw]`) into `out` as `k`-major panels of `nr` rows.
#[allow(clippy::too_many_arguments)]
fn pack_panels<S: Copy + Sync, T: Copy + Send>(
    w: &[S],
    n: usize,
    k: usize,
    ldw: usize,
    nr: usize,
    out: &mut [T],
    convert: impl Fn(S) -> T + Sync,
    threads: Threads,
) {
    if k == 0 {
        return;
    }
    let pack = |(p, panel): (usize, &mut [T])| {
        for r in p * nr..n.min((p + 1) * nr) {
            let j = r - p * nr;
            for (kk, &v) in w[r * ldw..r * ldw + k].iter().enumerate() {
                panel[kk * nr + j] = convert(v);
            }
        }
    };
    if threads == Threads::Pool {
        out.par_chunks_exact_mut(nr * k).enumerate().for_each(pack);
    } else {
        out.chunks_exact_mut(nr * k).enumerate().for_each(pack);
    }
}

/// The output pointer, shared by tasks that write disjoint columns.
#[derive(Clone, Copy)]
struct OutPtr(*mut f32);
// SAFETY: each task writes only the columns of its own panels.
unsafe impl Send for OutPtr {}
unsafe impl Sync for OutPtr {}
impl OutPtr {
    // A method, so closures capture the whole (Send) wrapper rather than its raw field.
    fn get(self) -> *mut f32 {
        self.0
    }
}

/// One task: the columns of `panels` for all `m` rows.
struct Job {
    a: *const f32,
    lda: usize,
    m: usize,
    c: *mut f32,
    ldc: usize,
    /// The packed panels, of the matrix's element type.
    b: *const u8,
    /// The quantized storage's scales (see `quantized.rs`).
    scales: *const f32,
    /// `k` values a scale of `I4` storage (`KC` for the others).
    block: usize,
    n: usize,
    k: usize,
    panels: Range<usize>,
}

/// The vector operations a micro-kernel needs.
trait Lanes: Copy {
    const N: usize;
    unsafe fn zero() -> Self;
    unsafe fn splat(x: f32) -> Self;
    unsafe fn load(p: *const f32) -> Self;
    unsafe fn store(self, p: *mut f32);
    /// `self + a * b`.
    unsafe fn mul_add(self, a: Self, b: Self) -> Self;
    unsafe fn add(self, b: Self) -> Self;
    /// `N` bf16 values widened (exactly) to f32.
    unsafe fn load_bf16(p: *const u16) -> Self;
    /// `N` f16 values widened (exactly) to f32.
    unsafe fn load_f16(p: *const u16) -> Self;
    unsafe fn mul(self, b: Self) -> Self;
    /// `N` int8 values widened to f32 (loads may read up to 16 bytes from `p`).
    unsafe fn load_i8(p: *const u8) -> Self;
    /// One `k`-row of an `I4Pair` panel, `NV` vectors of codes less 8, as f32: byte `j` holds
    /// column `j` (low nibble) and `j + NV * N / 2` (high). Loads may read 16 bytes from `p`.
    unsafe fn load_i4_row<const NV: usize>(p: *const u8) -> [Self; NV];
}

/// Every row tile of `job` against every panel, in blocks of `KC` along `k`.
#[inline(always)]
unsafe fn drive<V: Lanes, E: Elem, const MR: usize, const NV: usize>(job: &Job) {
    let k = job.k;
    let blocks = (0..k).step_by(KC);
    if job.m * job.lda * 4 <= activations_in_cache() {
        // The activations stay in cache (L2 for the denoise step's ~50 rows, the last level for
        // the prefix's hundreds): each panel is read once, front to back, while its output
        // tile stays in L1/L2 across the `k` blocks.
        for p in job.panels.clone() {
            for k0 in blocks.clone() {
                unsafe { panel_block::<V, E, MR, NV>(job, p, k0) };
            }
        }
    } else {
        // Activations larger than the cache: one `KC` slice of them stays cached while every
        // panel passes (the output is read and written once per slice).
        for k0 in blocks {
            for p in job.panels.clone() {
                unsafe { panel_block::<V, E, MR, NV>(job, p, k0) };
            }
        }
    }
}

/// Bytes of activations worth keeping in cache across panels: half the last-level cache
/// (read from sysfs once), 4 MiB where it cannot be read.
fn activations_in_cache() -> usize {
    static BYTES: OnceLock<usize> = OnceLock::new();
    *BYTES.get_or_init(|| last_level_cache().map_or(4 << 20, |b| (b / 2).max(512 << 10)))
}

/// The largest CPU cache Linux reports for cpu0, in bytes.
fn last_level_cache() -> Option<usize> {
    let dir = std::fs::read_dir("/sys/devices/system/cpu/cpu0/cache").ok()?;
    dir.filter_map(|e| {
        let size = std::fs::read_to_string(e.ok()?.path().join("size")).ok()?;
        let size = size.trim();
        let (digits, unit) = size.split_at(size.find(|c: char| !c.is_ascii_digit())?);
        let scale = match unit {
            "K" => 1 << 10,
            "M" => 1 << 20,
            _ => return None,
        };
        Some(digits.parse::<usize>().ok()? * scale)
    })
    .max()
}

/// All rows of `job` against the `KC` block at `k0` of panel `p`.
#[inline(always)]
unsafe fn panel_block<V: Lanes, E: Elem, const MR: usize, const NV: usize>(
    job: &Job,
    p: usize,
    k0: usize,
) {
    let nr = NV * V::N;
    let (m, n, k, lda, ldc) = (job.m, job.n, job.k, job.lda, job.ldc);
    let t = Tile {
        kc: KC.min(k - k0),
        lda,
        b: unsafe { job.b.add(E::bytes(p * nr * k + k0 * nr)) },
        // SAFETY: inside the scales (`quantized.rs` lays them out); unused for `Scale::None`.
        scales: match E::SCALE {
            Scale::None => job.scales,
            Scale::PerColumn => unsafe { job.scales.add(p * nr) },
            Scale::PerBlock => unsafe {
                job.scales.add((p * (k / job.block) + k0 / job.block) * nr)
            },
        },
        block: job.block,
        ldc,
        cols: nr.min(n - p * nr),
        first: k0 == 0,
    };
    let mut r = 0;
    while r + MR <= m {
        let (a, c) = unsafe { (job.a.add(r * lda + k0), job.c.add(r * ldc + p * nr)) };
        unsafe { tile::<V, E, MR, NV>(&t, a, c) };
        r += MR;
    }
    if r < m {
        let (a, c) = unsafe { (job.a.add(r * lda + k0), job.c.add(r * ldc + p * nr)) };
        unsafe { tail::<V, E, NV>(m - r, &t, a, c) };
    }
}

/// The rows left over after whole `MR` tiles, with a kernel of exactly their height (fewer than
/// the tallest `MR`, AVX-512's 12).
#[inline(always)]
unsafe fn tail<V: Lanes, E: Elem, const NV: usize>(
    rows: usize,
    t: &Tile,
    a: *const f32,
    c: *mut f32,
) {
    macro_rules! by_height {
        ($($h:literal)*) => {
            match rows {
                $($h => unsafe { tile::<V, E, $h, NV>(t, a, c) },)*
                _ => unreachable!("tail of {rows} rows"),
            }
        };
    }
    by_height!(1 2 3 4 5 6 7 8 9 10 11);
}

/// What a micro-kernel call shares with its neighbours in the same panel and `k` block.
struct Tile {
    kc: usize,
    lda: usize,
    /// This panel's `k` block, of the element type `E` of the kernel.
    b: *const u8,
    /// `Scale::PerColumn`: the panel's `NR` scales; `Scale::PerBlock`: those of its `block`s
    /// from this `k` block on, `NR` a block.
    scales: *const f32,
    /// `k` values a `Scale::PerBlock` scale (a power of two: it divides `KC` or `KC` divides it).
    block: usize,
    ldc: usize,
    cols: usize,
    /// The first `k` block writes `c`; later ones add to it.
    first: bool,
}

/// `c[MR, cols] (+)= a[MR, kc] b[kc, NR]`: the accumulators stay in registers for all of `kc`.
#[inline(always)]
unsafe fn tile<V: Lanes, E: Elem, const MR: usize, const NV: usize>(
    t: &Tile,
    a: *const f32,
    c: *mut f32,
) {
    let nr = NV * V::N;
    let mut acc = [[unsafe { V::zero() }; NV]; MR];
    let mut scale = [unsafe { V::zero() }; NV];
    // Scales per block: one pass per block (a single pass for the other element types).
    let seg = if E::SCALE == Scale::PerBlock {
        t.block
    } else {
        KC
    };
    let mut k0 = 0;
    while k0 < t.kc {
        let end = t.kc.min(k0 + seg);
        if E::SCALE == Scale::PerBlock {
            let s = unsafe { t.scales.add(k0 / seg * nr) };
            for (j, v) in scale.iter_mut().enumerate() {
                *v = unsafe { V::load(s.add(j * V::N)) };
            }
        }
        for kk in k0..end {
            let bv = unsafe { E::row::<V, NV>(t.b.add(E::bytes(kk * nr)), &scale) };
            for (i, row) in acc.iter_mut().enumerate() {
                let av = unsafe { V::splat(*a.add(i * t.lda + kk)) };
                for (acc, b) in row.iter_mut().zip(&bv) {
                    *acc = unsafe { acc.mul_add(av, *b) };
                }
            }
        }
        k0 = end;
    }
    if E::SCALE == Scale::PerColumn {
        // One scale per output column: scaled once here rather than on every load. Before the
        // store or the add, so each `k` block's partial sum is scaled exactly once.
        for row in acc.iter_mut() {
            for (j, v) in row.iter_mut().enumerate() {
                *v = unsafe { v.mul(V::load(t.scales.add(j * V::N))) };
            }
        }
    }
    for (i, row) in acc.iter().enumerate() {
        let cr = unsafe { c.add(i * t.ldc) };
        if t.cols == nr {
            for (j, v) in row.iter().enumerate() {
                let p = unsafe { cr.add(j * V::N) };
                unsafe {
                    if t.first {
                        v.store(p)
                    } else {
                        V::load(p).add(*v).store(p)
                    }
                }
            }
        } else {
            // A partial last panel: through a buffer, so nothing past the row is touched.
            let mut buf = [0.0f32; 64];
            for (j, v) in row.iter().enumerate() {
                unsafe { v.store(buf.as_mut_ptr().add(j * V::N)) };
            }
            for (j, v) in buf[..t.cols].iter().enumerate() {
                unsafe {
                    let p = cr.add(j);
                    *p = if t.first { *v } else { *p + v };
                }
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
#[cfg(not(target_arch = "x86_64"))]
mod avx512 {
    pub const NR: usize = 32;
}

#[cfg(not(target_arch = "x86_64"))]
mod avx2 {
    pub const NR: usize = 16;
}

#[cfg(target_arch = "aarch64")]
mod neon;
#[cfg(not(target_arch = "aarch64"))]
mod neon {
    pub const NR: usize = 12;
}

mod elem;
pub mod int8;
mod portable;
mod quantized;

#[cfg(test)]
mod quant_tests;
#[cfg(test)]
mod tests;

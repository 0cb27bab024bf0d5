//! pi0d's CPU compute kernels, a crate of their own so that they are always compiled with
//! optimizations (the workspace's dev profile raises this crate's opt-level): the daemon's
//! tests run the real model path in dev builds, and unoptimized SIMD kernels are 50x slower.
//!
//! - [`packed`]: `y = x W^T` against weights packed once at load, AVX-512 / AVX2 / NEON /
//!   portable micro-kernels picked at run time, rayon threads over output panels.
//!   [`packed::int8`]: int8 x int8 products with int32 sums (`w8a8`: weights per output
//!   channel, activations per row quantized inside the call), VNNI / AVX2 / sdot / smmla / NEON.
//! - [`hadamard`]: the orthonormal rotation `w8a8` applies to a layer's inputs and weight.
//! - [`quant`]: weight-only int8 (per output row) and int4 (per block) quantization, which
//!   `packed` multiplies by in f32.
//! - [`vecmath`]: vectorized `exp`, GELU (tanh), SiLU and softmax over slices.

pub mod hadamard;
pub mod packed;
pub mod quant;
pub mod vecmath;

/// Starts the compute threads the kernels run on (rayon's global pool) with `threads` threads.
/// Call it once at start-up: left to rayon, a pool that cannot create its threads (a process or
/// thread limit) panics at the first product instead of failing where it can be reported.
pub fn init_threads(threads: usize) -> Result<(), rayon::ThreadPoolBuildError> {
    init_threads_with(threads, |_| {})
}

/// As `init_threads`, running `start` first on each compute thread (its index).
pub fn init_threads_with(
    threads: usize,
    start: impl Fn(usize) + Send + Sync + 'static,
) -> Result<(), rayon::ThreadPoolBuildError> {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads.max(1))
        .thread_name(|i| format!("pi0d-compute-{i}"))
        .start_handler(start)
        .build_global()
}

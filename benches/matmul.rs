//! pi0d's packed-weight matmul against the `gemm` crate (which packs inside every call), at the
//! shapes of pi0's layers, in one run:
//!
//!     cargo bench --bench matmul [-- --threads 2 --seconds 1] [--peak]
//!
//! Prints GFLOP/s of both and their time ratio (packed / gemm: below 1 is faster) for the
//! denoise step's ~50-row products and the prefix's ~560-row ones, then a second table: the
//! time of pi0d's kernel with each weight storage (f32, bf16, int8, int4 in blocks of 32 and
//! 64), its ratio to f32 and the bytes a value the weight takes. With `--peak` it prints only
//! the best rate pi0d's kernel reaches on a product that fits in cache (the machine's practical
//! f32 peak, as a JSON line for tools/bench_pi0.py).

use std::time::Duration;

use gemm::Parallelism;
use pi0d::policy::pi0::packed::{Isa, PackedMatrix};

// The storages' table, the shapes and the timing helpers: one copy, shared with the kernels
// crate's example that prints the table without building pi0d
// (`cargo run --release -p pi0d-kernels --example matmul_quant`).
#[path = "../kernels/examples/matmul_quant.rs"]
mod matmul_quant;

use matmul_quant::{median, values, SHAPES};

/// `out[m, n] = a[m, k] b[n, k]^T` through the `gemm` crate (row-major, as pi0d's weights).
fn gemm_bt(a: &[f32], b: &[f32], out: &mut [f32], m: usize, k: usize, n: usize, par: Parallelism) {
    assert!(a.len() >= m * k && b.len() >= n * k && out.len() >= m * n);
    // SAFETY: bounds asserted above; strides describe row-major a, b^T and out.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            out.as_mut_ptr(),
            1,
            n as isize,
            false,
            a.as_ptr(),
            1,
            k as isize,
            b.as_ptr(),
            k as isize,
            1,
            0.0,
            1.0,
            false,
            false,
            false,
            par,
        );
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let flag = |name: &str, default: f64| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let threads = flag("--threads", 2.0) as usize;
    let budget = Duration::from_secs_f64(flag("--seconds", 1.0));
    if args.iter().any(|a| a == "--peak") {
        // Weights and activations (1 MiB each) stay in cache: arithmetic, not memory, is the limit.
        let (m, n, k) = (480, 512, 512);
        let (a, w) = (values(m * k), values(n * k));
        let packed = PackedMatrix::pack(&w, n, k);
        let mut out = vec![0.0f32; m * n];
        let s = median(budget, || packed.matmul(&a, m, &mut out, threads));
        println!(
            "{{\"peak_gflops\": {:.1}}}",
            2.0 * (m * n * k) as f64 / s / 1e9
        );
        return;
    }
    let par = if threads > 1 {
        Parallelism::Rayon(threads)
    } else {
        Parallelism::None
    };
    println!(
        "kernel {:?}, {threads} threads; GFLOP/s (median call)",
        Isa::best()
    );
    println!(
        "{:<14} {:>5} {:>6} {:>6} {:>9} {:>9} {:>7}",
        "layer", "rows", "out", "in", "packed", "gemm", "ratio"
    );
    for (what, m, n, k) in SHAPES {
        let a = values(m * k);
        let w = values(n * k);
        let packed = PackedMatrix::pack(&w, n, k);
        let mut out = vec![0.0f32; m * n];
        let flops = 2.0 * (m * n * k) as f64;
        let ours = median(budget, || packed.matmul(&a, m, &mut out, threads));
        let theirs = median(budget, || gemm_bt(&a, &w, &mut out, m, k, n, par));
        println!(
            "{what:<14} {m:>5} {n:>6} {k:>6} {:>9.1} {:>9.1} {:>7.2}",
            flops / ours / 1e9,
            flops / theirs / 1e9,
            ours / theirs
        );
    }
    println!();
    matmul_quant::print_storage_table(threads, budget);
}

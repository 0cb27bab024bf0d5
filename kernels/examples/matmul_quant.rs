//! Time per product of the packed kernels with each weight storage (f32, bf16, int8, int4 in
//! blocks of 32 and 64), and of the int8 x int8 product (w8a8: the activations quantized per
//! row inside the call), at the shapes of pi0's layers, and each one's ratio to f32:
//!
//!     cargo run --release -p pi0d-kernels --example matmul_quant [-- --threads 2 --seconds 1]
//!
//! The workspace's `benches/matmul.rs` prints the same table (it includes this file), but
//! building it builds all of pi0d; this runs with the kernels crate alone.

use std::time::{Duration, Instant};

use pi0d_kernels::packed::int8::{I8Activations, I8Isa, PackedI8Matrix};
use pi0d_kernels::packed::{Isa, PackedMatrix, Storage};
use pi0d_kernels::quant::{quantize_i4_blocks, quantize_i8_rows};

/// (what, rows, out, in)
pub const SHAPES: [(&str, usize, usize, usize); 10] = [
    ("expert q+k+v", 51, 2560, 1024),
    ("expert gate", 51, 4096, 1024),
    ("expert down", 51, 1024, 4096),
    ("action out", 50, 32, 1024),
    ("siglip qkv", 256, 1152, 1152),
    ("siglip fc1", 256, 4304, 1152),
    ("gemma q", 560, 2048, 2048),
    // The prefix of three images (256 tokens each) and the prompt.
    ("prefix q+k+v", 816, 2560, 2048),
    ("gemma gate", 128, 16384, 2048),
    ("gemma down", 128, 2048, 16384),
];

/// Deterministic values in [-1, 1).
pub fn values(len: usize) -> Vec<f32> {
    (0..len)
        .map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0)
        .collect()
}

/// Median seconds per call of `f`, run for about `budget`.
pub fn median(budget: Duration, mut f: impl FnMut()) -> f64 {
    f();
    let mut samples = Vec::new();
    let start = Instant::now();
    while start.elapsed() < budget || samples.len() < 3 {
        let t = Instant::now();
        f();
        samples.push(t.elapsed().as_secs_f64());
    }
    samples.sort_by(f64::total_cmp);
    samples[samples.len() / 2]
}

/// Prints, for every shape, the median time of one product with each storage, its ratio to
/// f32's (below 1 is faster) and the packed weight's bytes a value.
pub fn print_storage_table(threads: usize, budget: Duration) {
    println!(
        "kernels {:?} and {:?} (w8a8), {threads} threads; ms per product (median), \
         (x f32 time), [bytes a value]",
        Isa::best(),
        I8Isa::best()
    );
    let names = ["f32", "bf16", "int8", "int4/32", "int4/64", "w8a8"];
    print!("{:<14} {:>5} {:>6} {:>6}", "layer", "rows", "out", "in");
    names.iter().for_each(|s| print!(" {s:>22}"));
    println!();
    for (what, m, n, k) in SHAPES {
        let a = values(m * k);
        let w = values(n * k);
        let packed = [
            PackedMatrix::pack(&w, n, k),
            PackedMatrix::pack_as(Storage::Bf16, &w, n, k),
            match quantize_i8_rows(&w, n, k) {
                Ok(q) => PackedMatrix::pack_i8(&q, n, k),
                Err(e) => panic!("{e}"),
            },
            match quantize_i4_blocks(&w, n, k, 32) {
                Ok(q) => PackedMatrix::pack_i4(&q, n, k),
                Err(e) => panic!("{e}"),
            },
            match quantize_i4_blocks(&w, n, k, 64) {
                Ok(q) => PackedMatrix::pack_i4(&q, n, k),
                Err(e) => panic!("{e}"),
            },
        ];
        let mut out = vec![0.0f32; m * n];
        print!("{what:<14} {m:>5} {n:>6} {k:>6}");
        let mut f32_time = 0.0;
        for p in &packed {
            let s = median(budget, || p.matmul(&a, m, &mut out, threads));
            if p.storage() == Storage::F32 {
                f32_time = s;
            }
            let per_value = p.bytes() as f64 / (n * k) as f64;
            let cell = format!("{:.3} ({:.2}) [{per_value:.2}]", s * 1e3, s / f32_time);
            print!(" {cell:>22}");
        }
        let w8a8 = match PackedI8Matrix::pack(&w, n, k) {
            Ok(p) => p,
            Err(e) => panic!("{e}"),
        };
        // The activations' buffers are reused from call to call, as in the denoising loop.
        let mut scratch = I8Activations::new();
        let s = median(budget, || {
            if let Err(e) = w8a8.matmul_w8a8(&a, m, &mut out, &mut scratch, threads) {
                panic!("{e}");
            }
        });
        let per_value = w8a8.bytes() as f64 / (n * k) as f64;
        let cell = format!("{:.3} ({:.2}) [{per_value:.2}]", s * 1e3, s / f32_time);
        print!(" {cell:>22}");
        println!();
    }
}

/// Prints, for every shape, the median time of the w8a8 product with each int8 kernel this CPU
/// runs, and of quantizing its activations alone (which each of them includes).
#[allow(dead_code)] // only this example's `main` prints it, not the bench that includes the file
pub fn print_int8_table(threads: usize, budget: Duration) {
    let isas: Vec<I8Isa> = I8Isa::ALL.into_iter().filter(|i| i.available()).collect();
    println!("w8a8, {threads} threads; ms per product (median), (x the first kernel's time)");
    print!(
        "{:<14} {:>5} {:>6} {:>6} {:>9}",
        "layer", "rows", "out", "in", "quantize"
    );
    isas.iter()
        .for_each(|i| print!(" {:>16}", format!("{i:?}")));
    println!();
    for (what, m, n, k) in SHAPES {
        let a = values(m * k);
        let w = values(n * k);
        let mut out = vec![0.0f32; m * n];
        let mut scratch = I8Activations::new();
        let quantize = median(budget, || {
            if let Err(e) = scratch.quantize(I8Isa::best(), &a, m, k, k, threads) {
                panic!("{e}");
            }
        });
        print!("{what:<14} {m:>5} {n:>6} {k:>6} {:>9.3}", quantize * 1e3);
        let mut first = 0.0;
        for &isa in &isas {
            let packed = match PackedI8Matrix::pack_for(isa, &w, n, k) {
                Ok(p) => p,
                Err(e) => panic!("{e}"),
            };
            let s = median(budget, || {
                if let Err(e) = packed.matmul_w8a8(&a, m, &mut out, &mut scratch, threads) {
                    panic!("{e}");
                }
            });
            if first == 0.0 {
                first = s;
            }
            print!(" {:>16}", format!("{:.3} ({:.2})", s * 1e3, s / first));
        }
        println!();
    }
}

#[allow(dead_code)] // the bench that includes this file has its own `main`
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
    print_storage_table(threads, budget);
    println!();
    print_int8_table(threads, budget);
}

//! Prints the cost model of the exported pi0 graphs (docs/ascend.md's tables, the README's
//! hardware estimates):
//! `cargo run --release --example npu_cost`.

use pi0d::policy::export::cost::{
    chunk_ms, chunk_ms_at, fits, prefix_cost, real_pi0, resident_weight_bytes, step_cost,
    Precision, ASCEND, BANDWIDTH_EFFICIENCY, COMPUTE_EFFICIENCY, GPU, MEMORY_RESERVE_GB,
};

fn main() {
    let a = real_pi0();
    let prompt = 48;
    println!("Real pi0, {prompt} prompt tokens, f16 weights and KV cache (2 bytes):\n");
    println!(
        "| cameras | prefix TFLOP | prefix GB read | step GFLOP | step GB read | KV cache MB |"
    );
    println!("|---|---|---|---|---|---|");
    for cams in 1..=3 {
        let p = prefix_cost(&a, cams, prompt, 2.0);
        let s = step_cost(&a, cams * a.tokens_per_image() + prompt, 2.0);
        println!(
            "| {cams} | {:.2} | {:.2} | {:.1} | {:.3} | {:.1} |",
            p.flops / 1e12,
            p.weight_bytes / 1e9,
            s.flops / 1e9,
            s.bytes() / 1e9,
            p.kv_bytes / 1e6
        );
    }
    println!(
        "\nRoofline at {:.0} % of the fp16 peak and {:.0} % of the memory bandwidth (ms):\n",
        COMPUTE_EFFICIENCY * 100.0,
        BANDWIDTH_EFFICIENCY * 100.0
    );
    println!("| chip | fp16 TFLOPS | GB/s | cameras | prefix | 10 steps | chunk |");
    println!("|---|---|---|---|---|---|---|");
    for chip in ASCEND.iter().chain(GPU) {
        for cams in 1..=3 {
            let (p, s) = chunk_ms(&a, cams, prompt, chip);
            println!(
                "| {} | {:.0} | {:.0} | {cams} | {p:.1} | {s:.1} | {:.1} |",
                chip.name,
                chip.fp16_tflops,
                chip.bandwidth_gbs,
                p + s
            );
        }
    }
    println!(
        "\nPer weight scheme, 2 cameras (w8 and w4 compute in fp16; w8a8 at the int8 rate where one is published); fits: the weights plus {MEMORY_RESERVE_GB} GB in the board's memory:\n"
    );
    println!("| chip | scheme | weights GB | prefix | 10 steps | chunk | fits |");
    println!("|---|---|---|---|---|---|---|");
    for chip in ASCEND.iter().chain(GPU) {
        for p in Precision::ALL {
            let (pre, steps) = chunk_ms_at(&a, 2, prompt, chip, p);
            let fit = match fits(&a, p, chip) {
                Some(true) => "yes",
                Some(false) => "no",
                None => "?",
            };
            println!(
                "| {} | {} | {:.2} | {pre:.0} | {steps:.0} | {:.0} | {fit} |",
                chip.name,
                p.name(),
                resident_weight_bytes(&a, p) / 1e9,
                pre + steps
            );
        }
    }
}

//! A cost model of the exported graphs: FLOPs and bytes moved per graph run, and the latency a
//! roofline of an accelerator predicts from them. It counts what the graphs compute (the last
//! language layer reduced to its keys and values, pi0's time projection once per step), so it
//! is also a check on what the export fusions save.

use crate::policy::pi0::model::{Arch, Variant};

/// Work and traffic of one graph run.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct GraphCost {
    /// Floating-point operations (2 per multiply-add).
    pub(crate) flops: f64,
    /// Weight bytes read (each weight once per run).
    pub(crate) weight_bytes: f64,
    /// KV cache bytes written (prefix) or read (step).
    pub(crate) kv_bytes: f64,
}

impl GraphCost {
    pub(crate) fn bytes(&self) -> f64 {
        self.weight_bytes + self.kv_bytes
    }
}

/// The real pi0 (PaliGemma 3B + Gemma 300M expert, see the spec's table).
pub(crate) fn real_pi0() -> Arch {
    Arch {
        variant: Variant::Pi0,
        image_size: 224,
        patch: 14,
        vision_width: 1152,
        vision_layers: 27,
        vision_mlp: 4304,
        vision_heads: 16,
        width: 2048,
        vocab: 257_152,
        layers: 18,
        mlp: 16384,
        expert_width: 1024,
        expert_mlp: 4096,
        heads: 8,
        kv_heads: 1,
        head_dim: 256,
        action_dim: 32,
        state_dim: 32,
        chunk: 50,
        steps: 10,
    }
}

/// Vision tower + projector for one image.
pub(crate) fn vision_cost(a: &Arch, bytes_per_weight: f64) -> GraphCost {
    let n = a.tokens_per_image() as f64;
    let (w, m) = (a.vision_width as f64, a.vision_mlp as f64);
    let patch = (3 * a.patch * a.patch) as f64;
    let per_layer_params = 4.0 * w * w + 2.0 * w * m;
    let flops = 2.0
        * (n * patch * w
            + a.vision_layers as f64 * (n * per_layer_params + 2.0 * n * n * w)
            + n * w * a.width as f64);
    let params = patch * w + n * w + a.vision_layers as f64 * per_layer_params + w * a.width as f64;
    GraphCost {
        flops,
        weight_bytes: params * bytes_per_weight,
        kv_bytes: 0.0,
    }
}

/// FLOPs and parameters of one full language-model layer over `seq` tokens.
pub(crate) fn language_layer(a: &Arch, seq: usize) -> (f64, f64) {
    let (n, w, m) = (seq as f64, a.width as f64, a.mlp as f64);
    let q = (a.heads * a.head_dim) as f64;
    let kv = (a.kv_heads * a.head_dim) as f64;
    let params = w * (q + 2.0 * kv) + q * w + 3.0 * w * m;
    (2.0 * (n * params + 2.0 * n * n * q), params)
}

/// Language-model part of the prefix for `seq` tokens (all but the last layer in full).
pub(crate) fn language_cost(a: &Arch, seq: usize, bytes_per_weight: f64) -> GraphCost {
    let (n, w) = (seq as f64, a.width as f64);
    let kv = (a.kv_heads * a.head_dim) as f64;
    let (full_flops, full_params) = language_layer(a, seq);
    let kv_params = 2.0 * w * kv;
    let layers = a.layers as f64;
    GraphCost {
        flops: (layers - 1.0) * full_flops + 2.0 * n * kv_params,
        // The embedding table is gathered, not streamed: only the prompt's rows are read.
        weight_bytes: ((layers - 1.0) * full_params + kv_params) * bytes_per_weight,
        kv_bytes: layers * 2.0 * n * kv * bytes_per_weight,
    }
}

/// The prefix graph for `cameras` images and `prompt_len` tokens.
pub(crate) fn prefix_cost(
    a: &Arch,
    cameras: usize,
    prompt_len: usize,
    bytes_per_weight: f64,
) -> GraphCost {
    let v = vision_cost(a, bytes_per_weight);
    let seq = cameras * a.tokens_per_image() + prompt_len;
    let l = language_cost(a, seq, bytes_per_weight);
    GraphCost {
        flops: cameras as f64 * v.flops + l.flops,
        weight_bytes: v.weight_bytes
            + l.weight_bytes
            + prompt_len as f64 * a.width as f64 * bytes_per_weight,
        kv_bytes: l.kv_bytes,
    }
}

/// One denoising step over a prefix of `prefix_len` tokens.
pub(crate) fn step_cost(a: &Arch, prefix_len: usize, bytes_per_weight: f64) -> GraphCost {
    let pi0 = a.variant == Variant::Pi0;
    let n = (a.chunk + usize::from(pi0)) as f64;
    let t = prefix_len as f64 + n;
    let (w, m) = (a.expert_width as f64, a.expert_mlp as f64);
    let q = (a.heads * a.head_dim) as f64;
    let kv = (a.kv_heads * a.head_dim) as f64;
    let layer_params = w * (q + 2.0 * kv) + q * w + 3.0 * w * m;
    let layers = a.layers as f64;
    let chunk = a.chunk as f64;
    let ad = a.action_dim as f64;
    // Action in/out projections; pi0: time MLP (action half per token, time half once) and
    // the state token; pi0.5: time MLP once and the adaptive norms' dense layers.
    let (head_flops, head_params) = if pi0 {
        (
            2.0 * (chunk * ad * w
                + chunk * w * w
                + w * w
                + chunk * w * w
                + a.state_dim as f64 * w
                + chunk * w * ad),
            ad * w + 2.0 * w * w + w * w + a.state_dim as f64 * w + w * ad,
        )
    } else {
        let dense = (2.0 * layers + 1.0) * w * 3.0 * w;
        (
            2.0 * (chunk * ad * w + 2.0 * w * w + dense + chunk * w * ad),
            ad * w + 2.0 * w * w + dense + w * ad,
        )
    };
    GraphCost {
        flops: layers * 2.0 * (n * layer_params + 2.0 * n * t * q) + head_flops,
        weight_bytes: (layers * layer_params + head_params) * bytes_per_weight,
        kv_bytes: layers * 2.0 * prefix_len as f64 * kv * bytes_per_weight,
    }
}

/// An accelerator's roofline: dense fp16 (and int8) throughput, memory bandwidth and size.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Chip {
    pub(crate) name: &'static str,
    pub(crate) fp16_tflops: f64,
    /// Dense int8 throughput; `None` where none is published (int8 then runs at the fp16 rate).
    pub(crate) int8_tops: Option<f64>,
    pub(crate) bandwidth_gbs: f64,
    /// The memory the board has; `None` where it comes in several sizes or is not published.
    pub(crate) memory_gb: Option<f64>,
}

/// Published peak figures of the Ascend chips pi0d targets (one chip).
pub(crate) const ASCEND: &[Chip] = &[
    // Atlas 300I Pro (one 310P3): 140 TOPS int8, 70 TFLOPS fp16, LPDDR4X 204.8 GB/s, 24 GB.
    Chip {
        name: "Ascend 310P",
        fp16_tflops: 70.0,
        int8_tops: Some(140.0),
        bandwidth_gbs: 204.8,
        memory_gb: Some(24.0),
    },
    // Atlas 200I DK A2 in its default 8T mode (one 310B AI core at 500 MHz): 8 TOPS int8,
    // 4 TFLOPS fp16, 4 GB LPDDR4X-3200 on a 64-bit bus (25.6 GB/s).
    Chip {
        name: "Ascend 310B 8T (Atlas 200I DK A2)",
        fp16_tflops: 4.0,
        int8_tops: Some(8.0),
        bandwidth_gbs: 25.6,
        memory_gb: Some(4.0),
    },
    // The 310B's 20T grade (Atlas 200I/500 A2 modules): 20 TOPS int8, fp16 taken as half of
    // it; LPDDR4X taken at twice the DK's bus (51.2 GB/s); memory varies by board.
    Chip {
        name: "Ascend 310B 20T",
        fp16_tflops: 10.0,
        int8_tops: Some(20.0),
        bandwidth_gbs: 51.2,
        memory_gb: None,
    },
    // Atlas 800T A2 (910B3): 313 TFLOPS fp16, HBM2e 1.6 TB/s, 64 GB.
    Chip {
        name: "Ascend 910B",
        fp16_tflops: 313.0,
        int8_tops: None,
        bandwidth_gbs: 1600.0,
        memory_gb: Some(64.0),
    },
];

/// Published dense fp16 tensor peaks (no sparsity) and memory bandwidths of NVIDIA GPUs pi0
/// is run on, for the same roofline.
pub(crate) const GPU: &[Chip] = &[
    // Jetson AGX Orin 64GB: 170 sparse int8 TOPS on the GPU, so 85 dense int8 and 42.5 dense
    // fp16; LPDDR5 204.8 GB/s.
    Chip {
        name: "Jetson AGX Orin 64GB",
        fp16_tflops: 42.5,
        int8_tops: Some(85.0),
        bandwidth_gbs: 204.8,
        memory_gb: Some(64.0),
    },
    // GeForce RTX 4090: 165.2 TFLOPS fp16 with fp32 accumulation, 660.6 dense int8 TOPS,
    // GDDR6X 1008 GB/s, 24 GB.
    Chip {
        name: "RTX 4090",
        fp16_tflops: 165.2,
        int8_tops: Some(660.6),
        bandwidth_gbs: 1008.0,
        memory_gb: Some(24.0),
    },
    // H100 SXM: 989 TFLOPS fp16, 1979 dense int8 TOPS, HBM3 3.35 TB/s, 80 GB.
    Chip {
        name: "H100 SXM",
        fp16_tflops: 989.0,
        int8_tops: Some(1979.0),
        bandwidth_gbs: 3350.0,
        memory_gb: Some(80.0),
    },
    // Jetson Orin Nano 8GB: 40 sparse int8 TOPS, so 20 dense int8 and 10 dense fp16; LPDDR5
    // 68 GB/s, 8 GB shared with the CPU.
    Chip {
        name: "Jetson Orin Nano 8GB",
        fp16_tflops: 10.0,
        int8_tops: Some(20.0),
        bandwidth_gbs: 68.0,
        memory_gb: Some(8.0),
    },
];

/// How the weights are stored and multiplied: what a run reads and at which rate it computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Precision {
    /// 16-bit weights and activations (an NPU's or GPU's default).
    F16,
    /// int8 weights, one scale per output channel, computed in 16 bit (for memory).
    W8,
    /// int4 weights in blocks of 32 with an f32 scale each (pi0d's checkpoints), computed in
    /// 16 bit (for memory).
    W4,
    /// int8 weights and activations, int32 accumulation (the int8 rate).
    W8A8,
}

impl Precision {
    pub(crate) const ALL: [Precision; 4] = [
        Precision::F16,
        Precision::W8,
        Precision::W4,
        Precision::W8A8,
    ];

    pub(crate) fn name(self) -> &'static str {
        match self {
            Precision::F16 => "f16",
            Precision::W8 => "w8",
            Precision::W4 => "w4",
            Precision::W8A8 => "w8a8",
        }
    }

    /// Bytes a weight takes, its scales included.
    pub(crate) fn bytes_per_weight(self) -> f64 {
        match self {
            Precision::F16 => 2.0,
            Precision::W8 | Precision::W8A8 => 1.0,
            Precision::W4 => 0.5 + 4.0 / 32.0,
        }
    }

    /// The chip's dense rate for this precision's multiplications (ops/s).
    fn ops_per_s(self, chip: &Chip) -> f64 {
        match (self, chip.int8_tops) {
            (Precision::W8A8, Some(tops)) => tops * 1e12,
            _ => chip.fp16_tflops * 1e12,
        }
    }
}

/// Fractions of peak a well-fused static graph reaches: matmul-heavy work at half the dense
/// peak, streaming at 70 % of the bandwidth.
pub(crate) const COMPUTE_EFFICIENCY: f64 = 0.5;
pub(crate) const BANDWIDTH_EFFICIENCY: f64 = 0.7;

/// Roofline latency of one run in milliseconds: the slower of compute and memory traffic.
fn predict_ms_at(c: &GraphCost, chip: &Chip, precision: Precision) -> f64 {
    let compute = c.flops / (precision.ops_per_s(chip) * COMPUTE_EFFICIENCY);
    let memory = c.bytes() / (chip.bandwidth_gbs * 1e9 * BANDWIDTH_EFFICIENCY);
    compute.max(memory) * 1e3
}

/// Whole-chunk prediction in 16 bit: prefix plus every step.
pub(crate) fn chunk_ms(a: &Arch, cameras: usize, prompt_len: usize, chip: &Chip) -> (f64, f64) {
    chunk_ms_at(a, cameras, prompt_len, chip, Precision::F16)
}

/// The same with the weights stored as `precision` says (the KV cache stays 16 bit).
pub(crate) fn chunk_ms_at(
    a: &Arch,
    cameras: usize,
    prompt_len: usize,
    chip: &Chip,
    precision: Precision,
) -> (f64, f64) {
    let with_weights = |mut c: GraphCost| {
        c.weight_bytes *= precision.bytes_per_weight() / 2.0;
        c
    };
    let p = with_weights(prefix_cost(a, cameras, prompt_len, 2.0));
    let s = with_weights(step_cost(
        a,
        cameras * a.tokens_per_image() + prompt_len,
        2.0,
    ));
    (
        predict_ms_at(&p, chip, precision),
        a.steps as f64 * predict_ms_at(&s, chip, precision),
    )
}

/// The weights a run holds in memory (bytes): the vision tower and projector, every language
/// layer, the action expert and its heads, stored as `precision` says. The token embedding is
/// not counted: only the prompt's rows are read from the mapped file.
pub(crate) fn resident_weight_bytes(a: &Arch, precision: Precision) -> f64 {
    let vision = vision_cost(a, 1.0).weight_bytes;
    let language = a.layers as f64 * language_layer(a, 1).1;
    let expert = step_cost(a, 0, 1.0).weight_bytes;
    (vision + language + expert) * precision.bytes_per_weight()
}

/// Memory kept for the system, the activations and the KV cache on a board (GB).
pub(crate) const MEMORY_RESERVE_GB: f64 = 1.0;

/// Whether the weights fit `chip`'s memory with `MEMORY_RESERVE_GB` to spare; `None` where
/// the memory is not known.
pub(crate) fn fits(a: &Arch, precision: Precision, chip: &Chip) -> Option<bool> {
    let need = resident_weight_bytes(a, precision) / 1e9 + MEMORY_RESERVE_GB;
    chip.memory_gb.map(|have| need <= have)
}

/// The cost model's tables as docs/ascend.md shows them (markdown): the real pi0's work per
/// graph, the roofline latency per chip, and memory and latency per weight scheme.
pub fn report() -> String {
    let mut out = String::new();
    let mut line = |s: &str| {
        out.push_str(s);
        out.push('\n');
    };
    let a = real_pi0();
    let prompt = 48;
    line(&format!(
        "Real pi0, {prompt} prompt tokens, f16 weights and KV cache (2 bytes):\n"
    ));
    line("| cameras | prefix TFLOP | prefix GB read | step GFLOP | step GB read | KV cache MB |");
    line("|---|---|---|---|---|---|");
    for cams in 1..=3 {
        let p = prefix_cost(&a, cams, prompt, 2.0);
        let s = step_cost(&a, cams * a.tokens_per_image() + prompt, 2.0);
        line(&format!(
            "| {cams} | {:.2} | {:.2} | {:.1} | {:.3} | {:.1} |",
            p.flops / 1e12,
            p.weight_bytes / 1e9,
            s.flops / 1e9,
            s.bytes() / 1e9,
            p.kv_bytes / 1e6
        ));
    }
    line(&format!(
        "\nRoofline at {:.0} % of the fp16 peak and {:.0} % of the memory bandwidth (ms):\n",
        COMPUTE_EFFICIENCY * 100.0,
        BANDWIDTH_EFFICIENCY * 100.0
    ));
    line("| chip | fp16 TFLOPS | GB/s | cameras | prefix | 10 steps | chunk |");
    line("|---|---|---|---|---|---|---|");
    for chip in ASCEND.iter().chain(GPU) {
        for cams in 1..=3 {
            let (p, s) = chunk_ms(&a, cams, prompt, chip);
            line(&format!(
                "| {} | {:.0} | {:.0} | {cams} | {p:.1} | {s:.1} | {:.1} |",
                chip.name,
                chip.fp16_tflops,
                chip.bandwidth_gbs,
                p + s
            ));
        }
    }
    line(&format!(
        "\nPer weight scheme, 2 cameras (w8 and w4 compute in fp16; w8a8 at the int8 rate where one is published); fits: the weights plus {MEMORY_RESERVE_GB} GB in the board's memory:\n"
    ));
    line("| chip | scheme | weights GB | prefix | 10 steps | chunk | fits |");
    line("|---|---|---|---|---|---|---|");
    for chip in ASCEND.iter().chain(GPU) {
        for p in Precision::ALL {
            let (pre, steps) = chunk_ms_at(&a, 2, prompt, chip, p);
            let fit = match fits(&a, p, chip) {
                Some(true) => "yes",
                Some(false) => "no",
                None => "?",
            };
            line(&format!(
                "| {} | {} | {:.2} | {pre:.0} | {steps:.0} | {:.0} | {fit} |",
                chip.name,
                p.name(),
                resident_weight_bytes(&a, p) / 1e9,
                pre + steps
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_report_prints_the_work_table_docs_ascend_shows() {
        let report = report();
        let doc = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/ascend.md"),
        )
        .unwrap();
        // The first table (work per graph) is shown there as printed; the others are
        // abridged with published figures beside them.
        let table: Vec<&str> = report
            .lines()
            .skip_while(|l| !l.starts_with("| cameras"))
            .take_while(|l| l.starts_with('|'))
            .collect();
        assert_eq!(table.len(), 5, "{report}");
        assert!(doc.contains(&table.join("\n")), "{}", table.join("\n"));
        // One row per chip and camera count, one per chip and scheme.
        let rows = |head: &str| {
            report
                .lines()
                .skip_while(|l| !l.starts_with(head))
                .skip(2)
                .take_while(|l| l.starts_with('|'))
                .count()
        };
        let chips = ASCEND.len() + GPU.len();
        assert_eq!(rows("| chip | fp16"), chips * 3);
        assert_eq!(rows("| chip | scheme"), chips * Precision::ALL.len());
    }

    #[test]
    fn flops_match_the_spec_figures_for_real_pi0() {
        let a = real_pi0();
        // The spec: prefix language model about 1.2 / 2.3 / 3.3 TFLOP for 1 / 2 / 3 cameras
        // (all 18 layers), each step 35-39 GFLOP.
        for (cams, tflop) in [(1, 1.2), (2, 2.3), (3, 3.3)] {
            let seq = cams * 256 + 48;
            let all = 18.0 * language_layer(&a, seq).0;
            // The exported graph skips most of the last layer.
            let l = language_cost(&a, seq, 2.0);
            assert!(
                l.flops < all * 0.95 && l.flops > all * 0.94,
                "{} of {all}",
                l.flops
            );
            assert!(
                (all / 1e12 - tflop).abs() / tflop < 0.06,
                "{cams} cameras: {} TFLOP",
                all / 1e12
            );
            let s = step_cost(&a, seq, 2.0);
            assert!(
                (34e9..40e9).contains(&s.flops),
                "{cams} cameras: step {} GFLOP",
                s.flops / 1e9
            );
        }
        // About 400 M vision, 2 B language (without the embedding), 300 M expert parameters.
        let v = vision_cost(&a, 1.0).weight_bytes;
        assert!((3.9e8..4.4e8).contains(&v), "{v}");
        let s = step_cost(&a, 560, 1.0).weight_bytes;
        assert!((3.0e8..3.3e8).contains(&s), "{s}");
    }

    #[test]
    fn when_weights_shrink_expect_steps_faster_and_only_int8_compute_faster_prefixes() {
        let a = real_pi0();
        let dk = ASCEND
            .iter()
            .find(|c| c.name.contains("DK A2"))
            .expect("the DK A2");
        let at = |p| chunk_ms_at(&a, 2, 48, dk, p);
        let (f16, w8, w4, w8a8) = (
            at(Precision::F16),
            at(Precision::W8),
            at(Precision::W4),
            at(Precision::W8A8),
        );
        // The steps stream their weights: half the bytes, about half the time (the KV cache
        // stays 16 bit, so a little more).
        assert!(
            w8.1 < 0.6 * f16.1 && w8.1 > 0.5 * f16.1,
            "{w8:?} vs {f16:?}"
        );
        // In int8 they reach the DK's fp16 rate; int4 streams less but computes no faster,
        // int8 activations compute twice as fast.
        assert!(w4.1 <= w8.1 && w8a8.1 < w8.1, "{w4:?}, {w8a8:?} vs {w8:?}");
        // The prefix is compute-bound: weight-only schemes compute in fp16 at the same rate,
        // int8 at twice it.
        assert!((w8.0 - f16.0).abs() < 1e-9 && (w4.0 - f16.0).abs() < 1e-9);
        assert!(
            (w8a8.0 - f16.0 / 2.0).abs() < 1e-6 * f16.0,
            "{w8a8:?} vs {f16:?}"
        );
        // The full pi0's 2.7 billion weights: 5.4 GB in 16 bit (no fit in the DK's 4 GB),
        // 2.7 GB in int8 (fits with the 1 GB kept), 1.7 GB in int4 with its scales.
        let gb = |p| resident_weight_bytes(&a, p) / 1e9;
        assert!(
            (5.2..5.6).contains(&gb(Precision::F16)),
            "{}",
            gb(Precision::F16)
        );
        assert!(
            (2.6..2.8).contains(&gb(Precision::W8)),
            "{}",
            gb(Precision::W8)
        );
        assert!(
            (1.6..1.8).contains(&gb(Precision::W4)),
            "{}",
            gb(Precision::W4)
        );
        assert_eq!(fits(&a, Precision::F16, dk), Some(false));
        assert_eq!(fits(&a, Precision::W8, dk), Some(true));
        assert_eq!(fits(&a, Precision::W8, &ASCEND[2]), None);
    }

    #[test]
    fn steps_are_bandwidth_bound_and_prefixes_compute_bound_on_ascend() {
        let a = real_pi0();
        let chip = &ASCEND[0];
        let p = prefix_cost(&a, 1, 48, 2.0);
        let s = step_cost(&a, 304, 2.0);
        let compute =
            |c: &GraphCost| c.flops / (chip.fp16_tflops * 1e12 * COMPUTE_EFFICIENCY) * 1e3;
        assert!((predict_ms_at(&p, chip, Precision::F16) - compute(&p)).abs() < 1e-9);
        assert!(predict_ms_at(&s, chip, Precision::F16) > compute(&s) * 2.0);
        // The published 310P measurement (about 270 ms for pi0, 1 camera) is above the
        // roofline: the model leaves headroom, it does not promise the impossible.
        let (prefix_ms, steps_ms) = chunk_ms(&a, 1, 48, chip);
        assert!(prefix_ms + steps_ms < 270.0, "{prefix_ms} + {steps_ms}");
        // Likewise the pi0 paper's RTX 4090 figure (73 ms, 3 cameras), within 2x of it.
        let (p, s) = chunk_ms(&a, 3, 48, &GPU[1]);
        assert!((36.5..73.0).contains(&(p + s)), "{p} + {s}");
    }
}

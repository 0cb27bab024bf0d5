//! A cost model of the exported graphs: FLOPs and bytes moved per graph run, and the latency a
//! roofline of an accelerator predicts from them. It counts what the graphs compute (the last
//! language layer reduced to its keys and values, pi0's time projection once per step), so it
//! is also a check on what the export fusions save.

use crate::policy::pi0::model::{Arch, Variant};

/// Work and traffic of one graph run.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct GraphCost {
    /// Floating-point operations (2 per multiply-add).
    pub flops: f64,
    /// Weight bytes read (each weight once per run).
    pub weight_bytes: f64,
    /// KV cache bytes written (prefix) or read (step).
    pub kv_bytes: f64,
}

impl GraphCost {
    pub fn bytes(&self) -> f64 {
        self.weight_bytes + self.kv_bytes
    }
}

/// The real pi0 (PaliGemma 3B + Gemma 300M expert, see the spec's table).
pub fn real_pi0() -> Arch {
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
pub fn prefix_cost(
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
pub fn step_cost(a: &Arch, prefix_len: usize, bytes_per_weight: f64) -> GraphCost {
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

/// An accelerator's roofline: dense fp16 throughput and memory bandwidth.
#[derive(Clone, Copy, Debug)]
pub struct Chip {
    pub name: &'static str,
    pub fp16_tflops: f64,
    pub bandwidth_gbs: f64,
}

/// Published peak figures of the Ascend chips pi0d targets (one chip).
pub const ASCEND: &[Chip] = &[
    // Atlas 300I Pro (one 310P3): 140 TOPS int8, 70 TFLOPS fp16, LPDDR4X 204.8 GB/s.
    Chip {
        name: "Ascend 310P",
        fp16_tflops: 70.0,
        bandwidth_gbs: 204.8,
    },
    // Atlas 200I A2 (310B): 20 TOPS int8, taken as 10 TFLOPS fp16; LPDDR4X 51.2 GB/s.
    Chip {
        name: "Ascend 310B",
        fp16_tflops: 10.0,
        bandwidth_gbs: 51.2,
    },
    // Atlas 800T A2 (910B3): 313 TFLOPS fp16, HBM2e 1.6 TB/s.
    Chip {
        name: "Ascend 910B",
        fp16_tflops: 313.0,
        bandwidth_gbs: 1600.0,
    },
];

/// Published dense fp16 tensor peaks (no sparsity) and memory bandwidths of NVIDIA GPUs pi0
/// is run on, for the same roofline.
pub const GPU: &[Chip] = &[
    // Jetson AGX Orin 64GB: 170 sparse int8 TOPS on the GPU, so 42.5 dense fp16; LPDDR5 204.8 GB/s.
    Chip {
        name: "Jetson AGX Orin 64GB",
        fp16_tflops: 42.5,
        bandwidth_gbs: 204.8,
    },
    // GeForce RTX 4090: 165.2 TFLOPS fp16 with fp32 accumulation, GDDR6X 1008 GB/s.
    Chip {
        name: "RTX 4090",
        fp16_tflops: 165.2,
        bandwidth_gbs: 1008.0,
    },
    // H100 SXM: 989 TFLOPS fp16, HBM3 3.35 TB/s.
    Chip {
        name: "H100 SXM",
        fp16_tflops: 989.0,
        bandwidth_gbs: 3350.0,
    },
];

/// Fractions of peak a well-fused static graph reaches: matmul-heavy work at half the dense
/// peak, streaming at 70 % of the bandwidth.
pub const COMPUTE_EFFICIENCY: f64 = 0.5;
pub const BANDWIDTH_EFFICIENCY: f64 = 0.7;

/// Roofline latency of one run in milliseconds: the slower of compute and memory traffic.
pub(crate) fn predict_ms(c: &GraphCost, chip: &Chip) -> f64 {
    let compute = c.flops / (chip.fp16_tflops * 1e12 * COMPUTE_EFFICIENCY);
    let memory = c.bytes() / (chip.bandwidth_gbs * 1e9 * BANDWIDTH_EFFICIENCY);
    compute.max(memory) * 1e3
}

/// Whole-chunk prediction: prefix plus every step.
pub fn chunk_ms(a: &Arch, cameras: usize, prompt_len: usize, chip: &Chip) -> (f64, f64) {
    let p = prefix_cost(a, cameras, prompt_len, 2.0);
    let s = step_cost(a, cameras * a.tokens_per_image() + prompt_len, 2.0);
    (predict_ms(&p, chip), a.steps as f64 * predict_ms(&s, chip))
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn steps_are_bandwidth_bound_and_prefixes_compute_bound_on_ascend() {
        let a = real_pi0();
        let chip = &ASCEND[0];
        let p = prefix_cost(&a, 1, 48, 2.0);
        let s = step_cost(&a, 304, 2.0);
        let compute =
            |c: &GraphCost| c.flops / (chip.fp16_tflops * 1e12 * COMPUTE_EFFICIENCY) * 1e3;
        assert!((predict_ms(&p, chip) - compute(&p)).abs() < 1e-9);
        assert!(predict_ms(&s, chip) > compute(&s) * 2.0);
        // The published 310P measurement (about 270 ms for pi0, 1 camera) is above the
        // roofline: the model leaves headroom, it does not promise the impossible.
        let (prefix_ms, steps_ms) = chunk_ms(&a, 1, 48, chip);
        assert!(prefix_ms + steps_ms < 270.0, "{prefix_ms} + {steps_ms}");
        // Likewise the pi0 paper's RTX 4090 figure (73 ms, 3 cameras), within 2x of it.
        let (p, s) = chunk_ms(&a, 3, 48, &GPU[1]);
        assert!((36.5..73.0).contains(&(p + s)), "{p} + {s}");
    }
}

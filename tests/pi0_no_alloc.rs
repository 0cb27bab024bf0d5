//! pi0d's denoising loop allocates nothing: a counting global allocator watches the 10 steps of
//! a chunk once the workspace has been sized (by the first step of the first chunk), for pi0 and
//! pi0.5, on every thread of the process. On one thread the count must be zero. On two, the
//! matmuls hand work to rayon's pool, whose shared job queue is a list of 63-slot blocks: now and
//! then a job starts a fresh block and a used one is freed, so a few such allocations are allowed
//! in a chunk (a per-step or per-layer allocation would be ten or a hundred times more).

mod common;

use std::path::Path;

use pi0d::policy::pi0::infer::Batch;
use pi0d::policy::pi0::quant::{self, Group, QuantizeOptions, Scheme};
use pi0d::policy::pi0::{Checkpoint, Pi0Model, Workspace};

/// Allocations and frees of rayon's job-queue blocks allowed in one chunk on two threads.
const RAYON_QUEUE_BLOCKS: u64 = 4;

#[global_allocator]
static ALLOCATOR: common::counting_alloc::Counting = common::counting_alloc::Counting;

fn check(checkpoint: &str, case: &str) {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    check_dir(&fixtures.join(checkpoint), case);
}

fn check_dir(checkpoint: &Path, case: &str) {
    let _alone = common::counting_alloc::exclusive();
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let ck = Checkpoint::load(checkpoint).unwrap();
    let inputs = fixtures.join("cases").join(case).join("inputs.safetensors");
    for threads in [1, 2] {
        check_with(&ck, case, &inputs, threads);
    }
}

fn check_with(ck: &Checkpoint, case: &str, inputs: &Path, threads: usize) {
    let model = Pi0Model::load(ck, None, threads).unwrap();
    let batch = Batch::read(inputs, &model).unwrap();
    let input = batch.element(0);
    let mut ws = Workspace::default();
    let (chunk, dim) = (model.arch.chunk, model.arch.action_dim);
    for round in 0..2 {
        let cache = model.prefix(&input);
        model.prepare_steps(&cache, &mut ws);
        let mut x = input.noise.to_vec();
        let mut v = vec![0.0f32; chunk * dim];
        // The first step of the first chunk sizes the buffers; everything after reuses them.
        let first = round == 0;
        if first {
            model.denoise_step(&cache, input.state, &x, 1.0, &mut ws, &mut v);
        }
        let ((), n) = common::counting_alloc::watched_everywhere(|| {
            model.denoise(&cache, input.state, &mut x, &mut v, &mut ws)
        });
        let allowed = if threads == 1 { 0 } else { RAYON_QUEUE_BLOCKS };
        assert!(
            n <= allowed,
            "{case}, {threads} threads, round {round}: {n} allocations or frees in the denoising loop \
             (at most {allowed})"
        );
        assert!(x.iter().all(|a| a.is_finite()));
    }
}

#[test]
fn when_denoising_expect_no_allocation_pi0() {
    check("pi0_float32", "pi0_f32_2cam_batch2");
}

#[test]
fn when_denoising_expect_no_allocation_pi05() {
    check("pi05_float32", "pi05_f32_1cam");
}

/// With int8 activations (`w8a8`) every product also quantizes its input: into each thread's
/// scratch, sized by the first step like the workspace. Calibrated, the inputs are divided by
/// their scales first, into another such scratch.
#[test]
fn when_denoising_with_int8_activations_expect_no_allocation() {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let dir = common::scratch_dir("no-alloc-w8a8");
    let out = dir.join("pi0-w8a8");
    // Quantizing (calibration runs the model) allocates: not while another test counts.
    let alone = common::counting_alloc::exclusive();
    quant::quantize(&QuantizeOptions {
        checkpoint: fixtures.join("pi0_float32"),
        out: out.clone(),
        scheme: Scheme::W8a8,
        block: 32,
        groups: Group::DEFAULT.to_vec(),
        calibration: vec![fixtures.join("cases/pi0_f32_1cam_short/inputs.safetensors")],
    })
    .unwrap();
    let m = std::fs::read_to_string(out.join("quantization.json")).unwrap();
    assert!(!m.contains("\"smoothed\": 0"), "{m}");
    drop(alone);
    check_dir(&out, "pi0_f32_2cam_batch2");
}

/// `w8a8` on wide MLPs rotates the down-projections' inputs (`x R`, in the same scratch as the
/// division by scales), on both threads when a step's rows are many.
#[test]
fn when_denoising_with_rotated_int8_activations_expect_no_allocation() {
    let alone = common::counting_alloc::exclusive();
    let wide = common::wide_mlp_checkpoint("no-alloc", 2048);
    let dir = common::scratch_dir("no-alloc-w8a8-rotated");
    let out = dir.join("pi0-w8a8");
    let m = quant::quantize(&QuantizeOptions {
        checkpoint: wide.to_path_buf(),
        out: out.clone(),
        scheme: Scheme::W8a8,
        block: 32,
        groups: Group::DEFAULT.to_vec(),
        calibration: Vec::new(),
    })
    .unwrap()
    .manifest;
    assert!(
        m.rotated.iter().any(|n| n.contains("gemma_expert")),
        "{m:?}"
    );
    drop(alone);
    check_dir(&out, "pi0_f32_2cam_batch2");
}

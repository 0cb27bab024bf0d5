//! pi0d's denoising loop allocates nothing: a counting global allocator watches the 10 steps of
//! a chunk once the workspace has been sized (by the first step of the first chunk), for pi0 and
//! pi0.5. The `gemm` crate allocates packing buffers inside each of its calls; those are counted
//! apart (`ops::IN_GEMM`) and reported, not attributed to pi0d.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use pi0d::policy::pi0::infer::Batch;
use pi0d::policy::pi0::{Checkpoint, Pi0Model, Workspace};

struct Counting;

thread_local! {
    static WATCHED: Cell<bool> = const { Cell::new(false) };
}
static EVENTS: AtomicU64 = AtomicU64::new(0);
static GEMM_EVENTS: AtomicU64 = AtomicU64::new(0);

fn note() {
    if WATCHED.try_with(|w| w.get()).unwrap_or(false) {
        let in_gemm = pi0d::policy::pi0::ops::IN_GEMM
            .try_with(|d| d.get() > 0)
            .unwrap_or(false);
        if in_gemm {
            GEMM_EVENTS.fetch_add(1, Ordering::Relaxed);
        } else {
            EVENTS.fetch_add(1, Ordering::Relaxed);
        }
    }
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note();
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        note();
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note();
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fn watched<R>(f: impl FnOnce() -> R) -> (R, u64) {
    EVENTS.store(0, Ordering::SeqCst);
    WATCHED.with(|w| w.set(true));
    let r = f();
    WATCHED.with(|w| w.set(false));
    (r, EVENTS.load(Ordering::SeqCst))
}

fn check(checkpoint: &str, case: &str) {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let ck = Checkpoint::load(&fixtures.join(checkpoint)).unwrap();
    // One thread: gemm's rayon pool would allocate on its own threads anyway, but keeps this simple.
    let model = Pi0Model::load(&ck, None, 1).unwrap();
    let batch = Batch::read(
        &fixtures.join("cases").join(case).join("inputs.safetensors"),
        &model,
    )
    .unwrap();
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
        GEMM_EVENTS.store(0, Ordering::SeqCst);
        let ((), n) = watched(|| model.denoise(&cache, input.state, &mut x, &mut v, &mut ws));
        assert_eq!(
            n, 0,
            "{checkpoint}: round {round}: {n} allocations or frees by pi0d in the denoising loop"
        );
        eprintln!(
            "{checkpoint}: round {round}: pi0d 0 allocations; the gemm crate {} (its packing buffers)",
            GEMM_EVENTS.load(Ordering::SeqCst)
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

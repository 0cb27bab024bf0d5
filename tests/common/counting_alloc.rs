//! A global allocator (register it with `#[global_allocator]` in a test) that counts the
//! allocations, reallocations and frees made on a watched thread, split into those made inside
//! GEMM-library calls (`pi0d::policy::pi0::ops::IN_GEMM`) and all others.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};

pub struct Counting;

thread_local! {
    static WATCHED: Cell<bool> = const { Cell::new(false) };
}
static OURS: AtomicU64 = AtomicU64::new(0);
static GEMM: AtomicU64 = AtomicU64::new(0);

fn note() {
    if WATCHED.try_with(|w| w.get()).unwrap_or(false) {
        let in_gemm = pi0d::policy::pi0::ops::IN_GEMM
            .try_with(|d| d.get() > 0)
            .unwrap_or(false);
        if in_gemm { &GEMM } else { &OURS }.fetch_add(1, Ordering::Relaxed);
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

/// Runs `f` with this thread watched: (its result, allocations by pi0d's code, by the GEMM library).
pub fn watched<R>(f: impl FnOnce() -> R) -> (R, u64, u64) {
    OURS.store(0, Ordering::SeqCst);
    GEMM.store(0, Ordering::SeqCst);
    WATCHED.with(|w| w.set(true));
    let r = f();
    WATCHED.with(|w| w.set(false));
    (r, OURS.load(Ordering::SeqCst), GEMM.load(Ordering::SeqCst))
}

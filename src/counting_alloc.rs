//! A global allocator that counts allocations, reallocations and frees while a closure runs:
//! those of the calling thread only (`watched`: other threads may work meanwhile), or of every
//! thread in the process (`watched_everywhere`: worker pools included; a test using it holds
//! `exclusive()` for its whole run, so tests running side by side in the binary do not count
//! each other). The library's unit tests register it (the control tick's test watches its own
//! thread, so the other unit tests are not counted); `tests/pi0_no_alloc.rs` includes this file
//! through tests/common and registers it in its own binary.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

pub(crate) struct Counting;

thread_local! {
    static THIS_THREAD: Cell<bool> = const { Cell::new(false) };
}
static EVERY_THREAD: AtomicBool = AtomicBool::new(false);
static COUNT: AtomicU64 = AtomicU64::new(0);
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn note() {
    if EVERY_THREAD.load(Ordering::Relaxed) || THIS_THREAD.try_with(|w| w.get()).unwrap_or(false) {
        COUNT.fetch_add(1, Ordering::Relaxed);
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

/// Held by a test for its whole run so that no other test of the binary runs meanwhile.
#[allow(dead_code)]
pub(crate) fn exclusive() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

/// Runs `f`; returns its result and the allocations this thread made meanwhile.
pub(crate) fn watched<R>(f: impl FnOnce() -> R) -> (R, u64) {
    COUNT.store(0, Ordering::SeqCst);
    THIS_THREAD.with(|w| w.set(true));
    let r = f();
    THIS_THREAD.with(|w| w.set(false));
    (r, COUNT.load(Ordering::SeqCst))
}

/// Runs `f`; returns its result and the allocations any thread made meanwhile. Hold
/// `exclusive()` around the test.
#[allow(dead_code)] // not every test binary that includes this module uses both
pub(crate) fn watched_everywhere<R>(f: impl FnOnce() -> R) -> (R, u64) {
    COUNT.store(0, Ordering::SeqCst);
    EVERY_THREAD.store(true, Ordering::SeqCst);
    let r = f();
    EVERY_THREAD.store(false, Ordering::SeqCst);
    (r, COUNT.load(Ordering::SeqCst))
}

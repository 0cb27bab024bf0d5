//! `Latest<T>`: the newest value of something, handed from one writer to many readers without
//! a reader ever waiting for the writer.
//!
//! The control thread runs on SCHED_FIFO while the I/O thread that writes joint states (and
//! reads commands) runs on the normal scheduler. A lock between them is a priority inversion:
//! crossbeam's `AtomicCell` for values this large takes a global striped spin lock, and a
//! real-time thread spinning on a lock held by a preempted normal thread on the same core waits
//! until the kernel moves one of them (milliseconds). Crates with wait-free readers either
//! allocate per write (`arc-swap`, not allowed on the control thread) or serve one reader
//! (`triple_buffer`).
//!
//! So: two slots, each with a sequence number (a seqlock per slot). The writer always fills the
//! slot readers are *not* directed to, then points them at it; a reader copies the published
//! slot and retries only if the writer finished a whole write and began the next one on that
//! same slot meanwhile. A writer paused in the middle of a write never holds a reader up: the
//! published slot is complete. Writers are serialized by a mutex that is uncontended in the
//! daemon (each `Latest` has one writing thread).

use std::cell::UnsafeCell;
use std::sync::atomic::{fence, AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

pub(crate) struct Latest<T: Copy> {
    slots: [UnsafeCell<T>; 2],
    /// Per slot: odd while that slot is being written.
    seq: [AtomicU64; 2],
    /// The slot readers copy.
    current: AtomicUsize,
    writer: Mutex<()>,
}

// SAFETY: values are only moved in and copied out (T: Copy + Send); a copy that raced with a
// write is detected by the slot's sequence number and discarded, as in any seqlock.
unsafe impl<T: Copy + Send> Sync for Latest<T> {}

impl<T: Copy> Latest<T> {
    pub(crate) fn new(value: T) -> Latest<T> {
        Latest {
            slots: [UnsafeCell::new(value), UnsafeCell::new(value)],
            seq: [AtomicU64::new(0), AtomicU64::new(0)],
            current: AtomicUsize::new(0),
            writer: Mutex::new(()),
        }
    }

    /// The newest stored value. Never blocks and never allocates.
    pub(crate) fn load(&self) -> T {
        loop {
            let i = self.current.load(Ordering::Acquire);
            let before = self.seq[i].load(Ordering::Acquire);
            if before % 2 == 1 {
                // The writer moved on to this slot after we read `current`: the other one is
                // published now.
                std::hint::spin_loop();
                continue;
            }
            // SAFETY: the pointer is valid and aligned; a torn copy is thrown away below.
            let value = unsafe { std::ptr::read_volatile(self.slots[i].get()) };
            fence(Ordering::Acquire);
            if self.seq[i].load(Ordering::Relaxed) == before {
                return value;
            }
        }
    }

    /// Publishes `value`; readers see it from their next `load`. Never allocates.
    pub(crate) fn store(&self, value: T) {
        self.store_pausing(value, || {});
    }

    /// `store`, calling `mid_write` while the unpublished slot is half written (tests use it
    /// to hold the writer there).
    fn store_pausing(&self, value: T, mid_write: impl FnOnce()) {
        // A poisoned lock only means another writer panicked; the slots are still consistent.
        let _writing = self.writer.lock().unwrap_or_else(|p| p.into_inner());
        let i = 1 - self.current.load(Ordering::Relaxed);
        let s = self.seq[i].load(Ordering::Relaxed);
        self.seq[i].store(s + 1, Ordering::Relaxed);
        fence(Ordering::Release);
        mid_write();
        // SAFETY: only writers touch the unpublished slot, and they hold `writer`.
        unsafe { std::ptr::write_volatile(self.slots[i].get(), value) };
        self.seq[i].store(s + 2, Ordering::Release);
        self.current.store(i, Ordering::Release);
    }
}

impl<T: Copy + Default> Default for Latest<T> {
    fn default() -> Self {
        Latest::new(T::default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::sync::{Arc, Barrier};

    #[derive(Clone, Copy)]
    struct Wide([u64; 64]);

    #[test]
    fn when_a_writer_is_paused_mid_write_expect_readers_get_the_last_published_value() {
        let cell = Arc::new(Latest::new(Wide([1; 64])));
        let inside = Arc::new(Barrier::new(2));
        let release = Arc::new(Barrier::new(2));
        let writer = {
            let (cell, inside, release) = (cell.clone(), inside.clone(), release.clone());
            std::thread::spawn(move || {
                cell.store_pausing(Wide([2; 64]), || {
                    inside.wait();
                    release.wait();
                })
            })
        };
        inside.wait();
        // The writer is stopped with its slot half written: every read returns at once.
        for _ in 0..1000 {
            assert_eq!(cell.load().0, [1; 64]);
        }
        release.wait();
        writer.join().unwrap();
        assert_eq!(cell.load().0, [2; 64]);
    }

    #[test]
    fn when_written_continuously_expect_no_torn_or_older_reads() {
        let cell = Arc::new(Latest::new(Wide([0; 64])));
        let done = Arc::new(AtomicBool::new(false));
        let readers: Vec<_> = (0..3)
            .map(|_| {
                let (cell, done) = (cell.clone(), done.clone());
                std::thread::spawn(move || {
                    let (mut last, mut reads) = (0, 0u64);
                    while !done.load(Ordering::Relaxed) || reads == 0 {
                        let v = cell.load().0;
                        assert!(v.iter().all(|&x| x == v[0]), "torn read: {v:?}");
                        assert!(v[0] >= last, "went back from {last} to {}", v[0]);
                        last = v[0];
                        reads += 1;
                    }
                    last
                })
            })
            .collect();
        for k in 1..=200_000u64 {
            cell.store(Wide([k; 64]));
        }
        done.store(true, Ordering::Relaxed);
        for r in readers {
            assert!(r.join().unwrap() <= 200_000);
        }
        assert_eq!(cell.load().0[0], 200_000);
    }
}

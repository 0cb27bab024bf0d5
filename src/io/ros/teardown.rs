//! Whether the middleware is being torn down. RustDDS and ros2-client report errors while their
//! threads wind down on every clean exit (a writer removed from a publisher already gone, a
//! multicast group left twice): the log shows third-party lines from then on only when
//! `RUST_LOG` names the crate.

use std::sync::atomic::{AtomicBool, Ordering};

static TEARING_DOWN: AtomicBool = AtomicBool::new(false);

/// The ROS side is done: what its crates say from now on is teardown.
pub(crate) fn begin() {
    TEARING_DOWN.store(true, Ordering::Relaxed);
}

pub(crate) fn tearing_down() -> bool {
    TEARING_DOWN.load(Ordering::Relaxed)
}

/// Marks the teardown when dropped: the first field of what owns the middleware, so that it
/// is dropped before the endpoints and the middleware are.
pub(crate) struct Guard;

impl Drop for Guard {
    fn drop(&mut self) {
        begin();
    }
}

//! Panics: a hook logs every panic that no one handles (through `tracing`, which cannot fail on
//! a closed stderr), and code that handles its own panics (a policy's inference, one decoded
//! message) runs it through `caught`, which keeps the hook quiet. A leaf module, so the
//! transports can use it too.

use std::cell::Cell;
use std::panic::{catch_unwind, AssertUnwindSafe};

pub(crate) fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".into())
}

thread_local! {
    /// Set while `caught` runs: the panic is handled by the caller, not logged by the hook.
    static HANDLED: Cell<bool> = const { Cell::new(false) };
}

/// A panic that `caught` turned into an error: its message.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct Panic {
    pub(crate) message: String,
}

/// Runs `f`, turning a panic into `Err(Panic)`; the panic hook stays quiet for it (the caller
/// reports it, rate-limited).
pub(crate) fn caught<R>(f: impl FnOnce() -> R) -> Result<R, Panic> {
    let was = HANDLED.with(|h| h.replace(true));
    let r = catch_unwind(AssertUnwindSafe(f)).map_err(|p| Panic {
        message: panic_message(p.as_ref()),
    });
    HANDLED.with(|h| h.set(was));
    r
}

/// Logs unhandled panics through `tracing` instead of the default hook's direct write (and
/// without a backtrace walk, which takes long on the thread that panicked).
pub fn install_panic_hook() {
    std::panic::set_hook(Box::new(|info| {
        if HANDLED.with(|h| h.get()) {
            return;
        }
        let thread = std::thread::current();
        let name = thread.name().unwrap_or("unnamed");
        let at = info
            .location()
            .map(|l| format!("{}:{}", l.file(), l.line()))
            .unwrap_or_default();
        let msg = panic_message(info.payload());
        tracing::error!(thread = name, at = %at, "panic: {msg}");
    }));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn when_panic_caught_expect_message_returned() {
        let panic = |m: &str| Panic { message: m.into() };
        assert_eq!(caught(|| 3), Ok(3));
        assert_eq!(caught(|| -> i32 { panic!("x") }), Err(panic("x")));
        assert_eq!(
            caught(|| -> i32 { panic!("{} {}", "y", 2) }),
            Err(panic("y 2"))
        );
    }
}

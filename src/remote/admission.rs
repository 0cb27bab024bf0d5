//! Who may hold a connection to `pi0d serve`. Two budgets, so that clients that have not
//! authenticated can never crowd out those that have: one for connections still in their HTTP
//! request or websocket handshake (`pending`), one for authenticated sessions. A full budget
//! makes room by evicting: a pending budget its oldest connection (a well-behaved client
//! finishes its handshake in milliseconds, so the oldest is the likeliest to be a hostile one),
//! a session budget the session idle the longest. Only a session mid-request is never evicted;
//! a session budget whose every session is mid-request refuses the newcomer.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use tokio::sync::Notify;

/// Unauthenticated connections (HTTP request or websocket handshake not finished) held at once.
pub const MAX_PENDING: usize = 64;
/// Authenticated websocket sessions held at once.
pub const MAX_SESSIONS: usize = 64;

/// Every slot of a budget is mid-request: nothing may be evicted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Full;

/// Whether making room evicted another holder.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Room {
    Free,
    Evicted,
}

pub(crate) struct Budget {
    cap: usize,
    inner: Mutex<Inner>,
}

struct Inner {
    next_id: u64,
    held: Vec<Held>,
}

struct Held {
    id: u64,
    /// Admitted, or last idle from (a session's last reply).
    since: Instant,
    busy: bool,
    evict: Arc<Notify>,
}

/// One held place; dropping it gives the place back.
pub(crate) struct Slot {
    budget: Arc<Budget>,
    id: u64,
    evict: Arc<Notify>,
}

impl Budget {
    pub(crate) fn new(cap: usize) -> Arc<Budget> {
        Arc::new(Budget {
            cap: cap.max(1),
            inner: Mutex::new(Inner {
                next_id: 0,
                held: Vec::with_capacity(cap),
            }),
        })
    }

    /// Places held now.
    pub(crate) fn held(&self) -> usize {
        self.lock().held.len()
    }

    // Nothing panics while the lock is held; a poisoned one is still consistent.
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A place, idle since `now`; when the budget is full, the holder idle the longest is
    /// evicted to make it.
    pub(crate) fn admit(self: &Arc<Self>, now: Instant) -> Result<(Slot, Room), Full> {
        let mut inner = self.lock();
        let mut room = Room::Free;
        if inner.held.len() >= self.cap {
            let victim = inner
                .held
                .iter()
                .enumerate()
                .filter(|(_, h)| !h.busy)
                .min_by_key(|(_, h)| h.since)
                .map(|(i, _)| i)
                .ok_or(Full)?;
            // A stored permit: the victim sees it even if it is not waiting right now.
            inner.held.swap_remove(victim).evict.notify_one();
            room = Room::Evicted;
        }
        let id = inner.next_id;
        inner.next_id += 1;
        let evict = Arc::new(Notify::new());
        inner.held.push(Held {
            id,
            since: now,
            busy: false,
            evict: evict.clone(),
        });
        Ok((
            Slot {
                budget: self.clone(),
                id,
                evict,
            },
            room,
        ))
    }
}

impl Slot {
    /// Resolves once this place was given to another holder.
    pub(crate) async fn evicted(&self) {
        self.evict.notified().await;
    }

    /// Marks the holder busy (mid-request: not evicted); false if it was evicted already.
    pub(crate) fn begin(&self) -> bool {
        let mut inner = self.budget.lock();
        match inner.held.iter_mut().find(|h| h.id == self.id) {
            Some(h) => {
                h.busy = true;
                true
            }
            None => false,
        }
    }

    /// Idle again from `now`.
    pub(crate) fn end(&self, now: Instant) {
        let mut inner = self.budget.lock();
        if let Some(h) = inner.held.iter_mut().find(|h| h.id == self.id) {
            h.busy = false;
            h.since = now;
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut inner = self.budget.lock();
        if let Some(i) = inner.held.iter().position(|h| h.id == self.id) {
            inner.held.swap_remove(i);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn at(base: Instant, s: u64) -> Instant {
        base + Duration::from_secs(s)
    }

    /// Whether `slot` was told it is evicted (without waiting).
    fn was_evicted(slot: &Slot) -> bool {
        let n = slot.evict.notified();
        tokio::pin!(n);
        n.as_mut().enable()
    }

    #[test]
    fn when_budget_has_room_expect_admitted_without_eviction() {
        let b = Budget::new(2);
        let t = Instant::now();
        let (s1, r1) = b.admit(t).unwrap();
        let (s2, r2) = b.admit(t).unwrap();
        assert_eq!((r1, r2), (Room::Free, Room::Free));
        assert_eq!(b.held(), 2);
        assert!(!was_evicted(&s1) && !was_evicted(&s2));
        drop(s1);
        assert_eq!(b.held(), 1);
    }

    #[test]
    fn when_budget_is_full_expect_the_longest_idle_evicted_and_the_newcomer_admitted() {
        let b = Budget::new(3);
        let t = Instant::now();
        let (a, _) = b.admit(at(t, 0)).unwrap();
        let (c, _) = b.admit(at(t, 1)).unwrap();
        let (d, _) = b.admit(at(t, 2)).unwrap();
        // `a` answered a request at 5 s: `c` is now the longest idle.
        assert!(a.begin());
        a.end(at(t, 5));
        let (e, room) = b.admit(at(t, 6)).unwrap();
        assert_eq!(room, Room::Evicted);
        assert!(was_evicted(&c), "the longest idle goes");
        assert!(!was_evicted(&a) && !was_evicted(&d) && !was_evicted(&e));
        assert!(!c.begin(), "an evicted holder cannot start a request");
        assert_eq!(b.held(), 3);
        drop(c);
        assert_eq!(
            b.held(),
            3,
            "the evicted one's place is already the newcomer's"
        );
    }

    #[test]
    fn when_every_holder_is_mid_request_expect_full_and_none_evicted() {
        let b = Budget::new(2);
        let t = Instant::now();
        let (a, _) = b.admit(t).unwrap();
        let (c, _) = b.admit(t).unwrap();
        assert!(a.begin() && c.begin());
        assert_eq!(b.admit(t).err(), Some(Full));
        assert!(!was_evicted(&a) && !was_evicted(&c));
        c.end(at(t, 1));
        let (_d, room) = b.admit(at(t, 2)).unwrap();
        assert_eq!(room, Room::Evicted);
        assert!(
            was_evicted(&c) && !was_evicted(&a),
            "only the idle one goes"
        );
    }
}

//! Fixed-rate timing with absolute deadlines on the monotonic clock: no drift, and missed ticks
//! are skipped (never replayed in a burst).

use crate::time::{sleep_until, MonoTime};

pub(crate) struct Ticker {
    period_ns: u64,
    next: MonoTime,
    spin_ns: u64,
}

/// What happened at one wake-up.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Tick {
    /// The deadline this tick was scheduled for.
    pub(crate) deadline: MonoTime,
    /// Wake-up lateness after the deadline.
    pub(crate) jitter_ns: u64,
    /// Deadlines skipped because the previous tick ran past them.
    pub(crate) missed: u64,
}

impl Ticker {
    pub(crate) fn new(period_ns: u64, start: MonoTime) -> Ticker {
        Ticker {
            period_ns,
            next: start,
            spin_ns: 0,
        }
    }

    /// Sleeps until `spin_ns` before each deadline and busy-waits the rest: trades a little CPU
    /// for wake-up jitter below the kernel's timer latency.
    pub(crate) fn with_spin(mut self, spin_ns: u64) -> Ticker {
        self.spin_ns = spin_ns.min(self.period_ns / 2);
        self
    }

    /// Sleeps until the next deadline and returns it. If the caller is already past one or more
    /// deadlines, the latest passed one is used and the others are counted as missed.
    pub(crate) fn wait(&mut self) -> Tick {
        let now = MonoTime::now();
        let mut missed = 0;
        if now.as_nanos() >= self.next.as_nanos() + self.period_ns {
            let behind = (now.as_nanos() - self.next.as_nanos()) / self.period_ns;
            missed = behind;
            self.next = MonoTime::from_nanos(self.next.as_nanos() + behind * self.period_ns);
        }
        if self.spin_ns > 0 {
            sleep_until(MonoTime::from_nanos(
                self.next.as_nanos().saturating_sub(self.spin_ns),
            ));
            while MonoTime::now() < self.next {
                std::hint::spin_loop();
            }
        } else {
            sleep_until(self.next);
        }
        let woke = MonoTime::now();
        let deadline = self.next;
        self.next = MonoTime::from_nanos(deadline.as_nanos() + self.period_ns);
        Tick {
            deadline,
            jitter_ns: woke.as_nanos().saturating_sub(deadline.as_nanos()),
            missed,
        }
    }

    /// Deadline of the coming tick; a tick that finishes after it has overrun.
    pub(crate) fn next_deadline(&self) -> MonoTime {
        self.next
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn when_tick_overruns_expect_missed_deadlines_skipped_not_replayed() {
        let period = 2_000_000;
        let mut t = Ticker::new(period, MonoTime::now());
        t.wait();
        std::thread::sleep(std::time::Duration::from_millis(9));
        let tick = t.wait();
        assert!(tick.missed >= 3, "{tick:?}");
        // The following tick is one period later, not immediately.
        let next = t.wait();
        assert_eq!(next.deadline.as_nanos() - tick.deadline.as_nanos(), period);
        assert_eq!(next.missed, 0);
    }
}

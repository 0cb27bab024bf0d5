//! The commands of the last ticks, kept so that when the transports fell behind (no trajectory
//! went out for a while: the I/O thread was not run) the controller can tell which command the
//! trajectory controllers last got, and so which look-ahead they have been running since.
//! A fixed ring: nothing allocates after construction.

use crate::joints::MotionState;
use crate::time::MonoTime;

pub(crate) struct Recent {
    items: Vec<(MonoTime, MotionState)>,
    /// Where the next command goes once the ring is full.
    next: usize,
}

impl Recent {
    /// Room for the last `ticks` commands.
    pub(crate) fn new(ticks: usize) -> Recent {
        Recent {
            items: Vec::with_capacity(ticks.max(1)),
            next: 0,
        }
    }

    pub(crate) fn push(&mut self, tick: MonoTime, command: MotionState) {
        if self.items.len() < self.items.capacity() {
            self.items.push((tick, command));
        } else {
            self.items[self.next] = (tick, command);
            self.next = (self.next + 1) % self.items.len();
        }
    }

    /// The command of the tick at `tick`, if it is still kept.
    pub(crate) fn find(&self, tick: MonoTime) -> Option<MotionState> {
        self.items.iter().find(|(t, _)| *t == tick).map(|(_, s)| *s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::joints::JointVector;

    #[test]
    fn when_more_commands_come_than_it_keeps_expect_the_newest_kept_without_growing() {
        let mut r = Recent::new(3);
        let at = |k: u64| MonoTime::from_nanos(k * 1_000_000);
        let cmd = |k: u64| MotionState::at_rest(JointVector::from_slice(&[k as f64]));
        for k in 1..=7 {
            r.push(at(k), cmd(k));
        }
        assert_eq!(r.items.capacity(), 3);
        assert_eq!(r.find(at(4)), None);
        for k in 5..=7 {
            assert_eq!(r.find(at(k)), Some(cmd(k)));
        }
    }
}

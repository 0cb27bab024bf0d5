//! Fires the configured `[[drill]]`s at their times: the supervisor sets the flags that the
//! control and I/O threads look at once per tick or iteration.

use crate::config::drill::{name, Drill, DrillKind};
use crate::io::Blackboard;

pub(crate) struct Drills {
    drills: Vec<Drill>,
    /// The first not fired yet.
    next: usize,
}

impl Drills {
    /// `drills` in time order (as the configuration keeps them).
    pub(crate) fn new(drills: &[Drill]) -> Drills {
        Drills {
            drills: drills.to_vec(),
            next: 0,
        }
    }

    /// Fires every drill due `t_s` seconds into the run.
    pub(crate) fn fire_due(&mut self, t_s: f64, board: &Blackboard) {
        while let Some(&d) = self.drills.get(self.next).filter(|d| d.at_s <= t_s) {
            tracing::warn!(
                at_s = d.at_s,
                "fault drill `{}` now (configured in [[drill]])",
                name(d.kind)
            );
            match d.kind {
                DrillKind::CrashControl => board.supervisor.drill_crash_control(),
                DrillKind::StallControl { duration_s } => {
                    board.supervisor.drill_stall_control(duration_s)
                }
                DrillKind::CrashIo => board.supervisor.drill_crash_io(),
                DrillKind::GovernorFault => board.supervisor.drill_governor_fault(),
            }
            self.next += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::io::ControlDrill;

    #[test]
    fn when_time_passes_expect_each_drill_once_in_order() {
        let board = Blackboard::new(0, "");
        let mut d = Drills::new(&[
            Drill {
                at_s: 1.0,
                kind: DrillKind::StallControl { duration_s: 0.25 },
            },
            Drill {
                at_s: 2.0,
                kind: DrillKind::CrashIo,
            },
        ]);
        d.fire_due(0.5, &board);
        assert_eq!(board.supervisor.take_control_drill(), None);
        d.fire_due(1.5, &board);
        assert_eq!(
            board.supervisor.take_control_drill(),
            Some(ControlDrill::Stall(Duration::from_millis(250)))
        );
        assert!(!board.supervisor.io_drill_due());
        d.fire_due(5.0, &board);
        assert!(board.supervisor.io_drill_due());
        // Fired once: the stall is not set again.
        assert_eq!(board.supervisor.take_control_drill(), None);
    }
}

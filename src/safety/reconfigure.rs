//! Reconfiguration (limits from a SIGHUP reload) as a safety transition: new limits take effect
//! only where the command already keeps them, so applying them can never make the command jump.
//!
//! Only tighter limits reach here (the reload refuses looser ones). Velocity, acceleration and
//! jerk limits are met by a command at rest whatever they are; a position range is not: a
//! joint braking to rest under the old limits may come to rest beyond the new range, and
//! clamping it there would jump. So the decision is taken twice from the arm's state: when
//! the limits arrive, from where the command would come to rest if it braked now (refused at
//! once if outside, without stopping the arm), and again at rest, from where it did.

use crate::joints::JointVector;
use crate::robot::RobotLimits;

/// A joint whose command lies (or would come to rest) outside a new position range.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct OutsideRange {
    /// Index in command order.
    pub joint: usize,
    pub position: f64,
    pub(crate) lower: f64,
    pub upper: f64,
}

/// What became of reloaded limits; reported once per reload.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Reconfigure {
    /// In force from this tick: the arm stood at rest inside them.
    Applied,
    /// The command would come to rest (or stood at rest) outside the new range of a joint:
    /// the running limits stay in force.
    Refused(OutsideRange),
    /// The daemon began stopping first: the running limits stay in force.
    Abandoned,
}

/// What to do with pending limits this tick.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Step {
    /// Not yet at rest: keep braking (a running arm holds first).
    Wait,
    Decided(Reconfigure),
}

/// The first joint of `position` outside the position range of `limits`.
pub(crate) fn outside(limits: &RobotLimits, position: &JointVector) -> Option<OutsideRange> {
    (0..limits.len().min(position.len())).find_map(|j| {
        let (p, lower, upper) = (position[j], limits.lower[j], limits.upper[j]);
        (!(p >= lower && p <= upper)).then_some(OutsideRange {
            joint: j,
            position: p,
            lower,
            upper,
        })
    })
}

/// On arrival: refuse at once limits whose range excludes where the command would come to rest
/// braking now (`stopping_point`; `None` when no rest is foreseen, then judged at rest).
pub(crate) fn on_arrival(
    new: &RobotLimits,
    stopping_point: Option<&JointVector>,
) -> Option<Reconfigure> {
    stopping_point
        .and_then(|p| outside(new, p))
        .map(Reconfigure::Refused)
}

/// Each tick while limits are pending: applied only at rest and inside them; abandoned when
/// stopping (the stop keeps the limits it began under).
pub(crate) fn step(
    new: &RobotLimits,
    stopping: bool,
    at_rest: bool,
    command: &JointVector,
) -> Step {
    if stopping {
        Step::Decided(Reconfigure::Abandoned)
    } else if !at_rest {
        Step::Wait
    } else {
        Step::Decided(match outside(new, command) {
            Some(o) => Reconfigure::Refused(o),
            None => Reconfigure::Applied,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::robot::limits::one_test_joint;

    #[test]
    fn when_rest_lies_outside_new_range_expect_refused_at_arrival_and_at_rest() {
        let new = one_test_joint(-1.0, 1.05);
        let beyond = JointVector::from_slice(&[1.78]);
        let inside = JointVector::from_slice(&[1.0]);
        let refused = Reconfigure::Refused(OutsideRange {
            joint: 0,
            position: 1.78,
            lower: -1.0,
            upper: 1.05,
        });
        assert_eq!(on_arrival(&new, Some(&beyond)), Some(refused));
        assert_eq!(on_arrival(&new, Some(&inside)), None);
        assert_eq!(on_arrival(&new, None), None, "judged at rest instead");
        assert_eq!(step(&new, false, false, &beyond), Step::Wait);
        assert_eq!(step(&new, false, true, &beyond), Step::Decided(refused));
        assert_eq!(
            step(&new, false, true, &inside),
            Step::Decided(Reconfigure::Applied)
        );
        assert_eq!(
            step(&new, true, true, &inside),
            Step::Decided(Reconfigure::Abandoned)
        );
    }

    #[test]
    fn when_position_not_finite_expect_outside() {
        let new = one_test_joint(-1.0, 1.0);
        assert!(outside(&new, &JointVector::from_slice(&[f64::NAN])).is_some());
        assert!(outside(&new, &JointVector::from_slice(&[1.0])).is_none());
    }
}

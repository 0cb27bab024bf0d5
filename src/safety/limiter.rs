//! The hard joint limits, apart from any smoothing (the shape of ros2_control's joint_limits:
//! one `enforce` per joint and period). Whatever acceleration is asked for, the result keeps
//! `|a| <= a_max`, `|v| <= v_max`, and a velocity from which the joint can still stop before
//! its position limits at `a_max`; from a state that met them last period this is always
//! possible. Nothing here allocates.

/// One joint's hard limits (position range after margins and soft limits; SI units).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct JointBounds {
    pub(crate) lower: f64,
    pub(crate) upper: f64,
    pub(crate) velocity: f64,
    pub(crate) acceleration: f64,
}

/// Largest velocity toward a bound `distance` away from which a constant deceleration `decel`
/// still stops in time, in discrete steps of `dt` (`v*dt + v²/2a <= distance`).
pub(crate) fn braking_velocity(distance: f64, decel: f64, dt: f64) -> f64 {
    if distance.is_infinite() {
        return f64::INFINITY;
    }
    let d = distance.max(0.0);
    if d == 0.0 {
        return 0.0;
    }
    // The root of v² + 2·a·dt·v - 2·a·d = 0 written without cancellation or overflow: the
    // textbook `-a·dt + sqrt(a²dt² + 2ad)` loses every digit once a·dt dwarfs the distance (a
    // jerk limit of 1e19 gave 0, so a stop never removed the last 0.008 rad/s and the joint
    // crept on). An infinite rate gives d/dt, a zero one 0.
    (2.0 * d / (dt + (dt * dt + 2.0 * d / decel).sqrt())).max(0.0)
}

/// `braking_velocity` with the sign of `x`: how much of a quantity may be built up toward a
/// bound `x` away (negative: how much must be removed when already past it).
pub(crate) fn signed_braking(x: f64, rate: f64, dt: f64) -> f64 {
    braking_velocity(x.abs(), rate, dt).copysign(x)
}

/// The acceleration a joint at position `p` with velocity `v` may take for the next period
/// `dt`, as close to `desired` as the hard limits allow.
pub(crate) fn enforce(b: &JointBounds, p: f64, v: f64, desired: f64, dt: f64) -> f64 {
    let amax = b.acceleration;
    let vhi = b.velocity.min(braking_velocity(b.upper - p, amax, dt));
    let vlo = (-b.velocity).max(-braking_velocity(p - b.lower, amax, dt));
    let a_hi = amax.min((vhi - v) / dt);
    let a_lo = (-amax).max((vlo - v) / dt);
    if a_lo <= a_hi {
        desired.clamp(a_lo, a_hi)
    } else {
        // Only reachable through rounding: brake toward zero velocity.
        (-v / dt).clamp(-amax, amax)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A joint state inside the limits from which it can still stop before them.
    fn feasible() -> impl Strategy<Value = (JointBounds, f64, f64, f64)> {
        (0.1f64..3.0, 0.1f64..4.0, 0.5f64..20.0, 0.001f64..0.02).prop_flat_map(
            |(range, vmax, amax, dt)| {
                let b = JointBounds {
                    lower: -range,
                    upper: range,
                    velocity: vmax,
                    acceleration: amax,
                };
                (Just(b), -range..range, Just(dt)).prop_flat_map(move |(b, p, dt)| {
                    let vhi = vmax.min(braking_velocity(b.upper - p, amax, dt));
                    let vlo = (-vmax).max(-braking_velocity(p - b.lower, amax, dt));
                    (Just(b), Just(p), vlo..=vhi, Just(dt))
                })
            },
        )
    }

    /// The braking velocity is exact where the textbook form cancels to nothing: with an
    /// enormous rate the joint may close the whole distance in one period.
    #[test]
    fn when_rate_dwarfs_distance_expect_braking_velocity_without_cancellation() {
        let dt = 0.005;
        for rate in [1e12, 8e18, 1e300, f64::INFINITY] {
            let v = braking_velocity(0.0077, rate, dt);
            assert!(
                (v - 0.0077 / dt).abs() < 1e-9 * (0.0077 / dt),
                "{rate}: {v}"
            );
        }
        // Ordinary rates: v·dt + v²/2a = d.
        for (d, a) in [(0.5, 2.0), (1e-6, 100.0), (3.0, 0.01)] {
            let v = braking_velocity(d, a, dt);
            assert!(
                (v * dt + v * v / (2.0 * a) - d).abs() < 1e-12,
                "{d} {a}: {v}"
            );
        }
        assert_eq!(braking_velocity(0.0, 5.0, dt), 0.0);
        assert_eq!(braking_velocity(-1e-16, 5.0, dt), 0.0);
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 4000, ..ProptestConfig::default() })]

        /// Whatever is asked (including absurd or infinite accelerations), the next state keeps
        /// every hard limit, and the joint can go on braking without leaving its range.
        #[test]
        fn when_any_acceleration_asked_expect_hard_limits_kept(
            (b, p, v, dt) in feasible(),
            desired in prop_oneof![-1e6f64..1e6, Just(f64::INFINITY), Just(f64::NEG_INFINITY)],
        ) {
            let a = enforce(&b, p, v, desired, dt);
            prop_assert!(a.abs() <= b.acceleration * (1.0 + 1e-12), "a {a}");
            let v1 = v + a * dt;
            prop_assert!(v1.abs() <= b.velocity * (1.0 + 1e-9) + 1e-12, "v {v1}");
            let mut p1 = p + v1 * dt;
            prop_assert!(p1 >= b.lower - 1e-9 && p1 <= b.upper + 1e-9, "p {p1}");
            // Braking at the limit from here stops inside the range.
            let mut vk = v1;
            for _ in 0..100_000 {
                if vk == 0.0 { break; }
                let a = enforce(&b, p1, vk, -vk / dt, dt);
                vk += a * dt;
                p1 += vk * dt;
                prop_assert!(p1 >= b.lower - 1e-9 && p1 <= b.upper + 1e-9, "braking to {p1}");
            }
        }

        /// Inside the limits, a feasible request is passed through unchanged.
        #[test]
        fn when_request_is_feasible_expect_it_unchanged(
            (b, p, v, dt) in feasible(),
            frac in -1.0f64..1.0,
        ) {
            let desired = frac * b.acceleration;
            let v1 = v + desired * dt;
            // With a little room, so rounding at a bound does not count.
            let room = 1e-9;
            let roomy = v1.abs() <= b.velocity - room
                && v1 <= braking_velocity(b.upper - p, b.acceleration, dt) - room
                && -v1 <= braking_velocity(p - b.lower, b.acceleration, dt) - room;
            prop_assume!(roomy);
            prop_assert_eq!(enforce(&b, p, v, desired, dt), desired);
        }
    }
}

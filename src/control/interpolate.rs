//! Sampling a chunk between its knots: linear (C0), cubic Hermite (C1), quintic Hermite (C2).

use crate::chunk::JointChunk;
use crate::config::Interpolation;
use crate::joints::JointVector;

/// Position of `chunk` at `t` seconds after its observation stamp, written into `out`.
/// Times before the first or after the last knot are clamped to it.
pub(crate) fn sample(chunk: &JointChunk, mode: Interpolation, t: f64, out: &mut JointVector) {
    let n = chunk.steps();
    let h = chunk.period_s;
    if n == 1 {
        *out = chunk.positions[0];
        return;
    }
    let s = (t / h).clamp(0.0, (n - 1) as f64);
    let i = (s.floor() as usize).min(n - 2);
    let u = s - i as f64;
    let (p0, p1) = (&chunk.positions[i], &chunk.positions[i + 1]);
    let dim = p0.len();
    if out.len() != dim {
        *out = JointVector::zeros(dim);
    }
    match mode {
        Interpolation::Linear => {
            for j in 0..dim {
                out[j] = p0[j] + (p1[j] - p0[j]) * u;
            }
        }
        Interpolation::Cubic => {
            let (v0, v1) = (&chunk.velocities[i], &chunk.velocities[i + 1]);
            let (u2, u3) = (u * u, u * u * u);
            let h00 = 2.0 * u3 - 3.0 * u2 + 1.0;
            let h10 = u3 - 2.0 * u2 + u;
            let h01 = -2.0 * u3 + 3.0 * u2;
            let h11 = u3 - u2;
            for j in 0..dim {
                out[j] = h00 * p0[j] + h10 * h * v0[j] + h01 * p1[j] + h11 * h * v1[j];
            }
        }
        Interpolation::Quintic => {
            let (v0, v1) = (&chunk.velocities[i], &chunk.velocities[i + 1]);
            let (a0, a1) = (&chunk.accelerations[i], &chunk.accelerations[i + 1]);
            let b = quintic_basis(u);
            let h2 = h * h;
            for j in 0..dim {
                out[j] = b[0] * p0[j]
                    + b[1] * h * v0[j]
                    + b[2] * h2 * a0[j]
                    + b[3] * p1[j]
                    + b[4] * h * v1[j]
                    + b[5] * h2 * a1[j];
            }
        }
    }
}

/// Quintic Hermite basis at `u` in [0,1]: weights of p0, v0*h, a0*h², p1, v1*h, a1*h².
pub(crate) fn quintic_basis(u: f64) -> [f64; 6] {
    let (u2, u3) = (u * u, u * u * u);
    let (u4, u5) = (u3 * u, u3 * u2);
    [
        1.0 - 10.0 * u3 + 15.0 * u4 - 6.0 * u5,
        u - 6.0 * u3 + 8.0 * u4 - 3.0 * u5,
        0.5 * u2 - 1.5 * u3 + 1.5 * u4 - 0.5 * u5,
        10.0 * u3 - 15.0 * u4 + 6.0 * u5,
        -4.0 * u3 + 7.0 * u4 - 3.0 * u5,
        0.5 * u3 - u4 + 0.5 * u5,
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::time::MonoTime;

    fn chunk_of(f: impl Fn(f64) -> f64, steps: usize, h: f64) -> JointChunk {
        let mut c = JointChunk::with_capacity(steps);
        c.obs_stamp = MonoTime::ZERO;
        c.period_s = h;
        for i in 0..steps {
            c.positions
                .push(JointVector::from_slice(&[f(i as f64 * h)]));
        }
        c.update_derivatives();
        c
    }

    #[test]
    fn when_sampling_on_knots_expect_exact_knot_values() {
        let c = chunk_of(|t| (3.0 * t).sin(), 50, 0.02);
        let mut out = JointVector::zeros(1);
        for mode in [
            Interpolation::Linear,
            Interpolation::Cubic,
            Interpolation::Quintic,
        ] {
            for i in 0..50 {
                sample(&c, mode, i as f64 * 0.02, &mut out);
                assert!(
                    (out[0] - c.positions[i][0]).abs() < 1e-12,
                    "{mode:?} knot {i}"
                );
            }
        }
    }

    #[test]
    fn when_signal_is_smooth_expect_higher_order_more_accurate() {
        let f = |t: f64| (3.0 * t).sin();
        let c = chunk_of(f, 50, 0.02);
        let mut out = JointVector::zeros(1);
        let mut err = |mode| {
            let mut worst: f64 = 0.0;
            for k in 20..900 {
                let t = k as f64 * 0.001;
                sample(&c, mode, t, &mut out);
                worst = worst.max((out[0] - f(t)).abs());
            }
            worst
        };
        let (lin, cub, quin) = (
            err(Interpolation::Linear),
            err(Interpolation::Cubic),
            err(Interpolation::Quintic),
        );
        assert!(
            cub < lin && quin < lin,
            "linear {lin} cubic {cub} quintic {quin}"
        );
        assert!(quin < 1e-4, "quintic {quin}");
    }

    #[test]
    fn quintic_basis_reproduces_boundary_conditions() {
        let b0 = quintic_basis(0.0);
        let b1 = quintic_basis(1.0);
        assert_eq!(b0, [1.0, 0.0, 0.0, 0.0, 0.0, 0.0]);
        for (k, want) in [0.0, 0.0, 0.0, 1.0, 0.0, 0.0].iter().enumerate() {
            assert!((b1[k] - want).abs() < 1e-12);
        }
    }
}

//! The controller's state machine, driven tick by tick: watchdogs and freshness rules that the
//! scenario tests cannot hit deterministically.

use crate::chunk::JointChunk;
use crate::config::{Interpolation, MergeMode};
use crate::control::{
    ChunkOutcome, Controller, ControllerSettings, Executor, TickInputs, TickReport,
};
use crate::joints::JointMeasurement;
use crate::joints::JointVector;
use crate::robot::{JointKind, JointLimits, RobotLimits};
use crate::safety::supervisor::LateRejection;
use crate::safety::supervisor::SafetyInputs;
use crate::safety::{HoldReason, Mode};
use crate::time::MonoTime;

const DT: f64 = 0.005;

/// A controller on two joints in synthetic time, tick `k` at `t0 + k DT` (shared with the
/// stall tests).
pub(super) struct Rig {
    pub(super) ctl: Controller,
    t0: MonoTime,
    pub(super) k: u64,
    measured: JointMeasurement,
    /// The newest command's tick the transport sent; while `io_stalled`, nothing goes out.
    sent: Option<MonoTime>,
    pub(super) io_stalled: bool,
}

pub(super) fn limits() -> RobotLimits {
    RobotLimits::new(
        (0..2)
            .map(|j| JointLimits {
                name: format!("j{j}"),
                kind: JointKind::Revolute,
                lower: -2.0,
                upper: 2.0,
                velocity: 1.0,
                acceleration: 5.0,
                jerk: 100.0,
                effort: 0.0,
                soft: None,
                max_step: f64::INFINITY,
            })
            .collect(),
    )
}

impl Rig {
    fn new() -> Rig {
        Rig::with_settings(ControllerSettings {
            joint_state_timeout_s: 0.1,
            camera_timeout_s: 0.5,
            overrun_streak: 5,
            request_threshold_s: 0.5,
            warmup_chunks: 0,
            trajectory_joints: Vec::new(),
            trajectory_coast_s: 0.05,
            trajectory_interval_s: 0.0,
        })
    }

    pub(super) fn with_settings(settings: ControllerSettings) -> Rig {
        let t0 = MonoTime::from_nanos(5_000_000_000);
        let measured = JointMeasurement {
            stamp: t0,
            position: JointVector::zeros(2),
        };
        let ex = Executor::new(Interpolation::Quintic, MergeMode::Blend, 0.1, DT);
        let ctl = Controller::new(limits(), DT, ex, None, settings, &measured, t0).unwrap();
        let mut rig = Rig {
            ctl,
            t0,
            k: 0,
            measured,
            sent: None,
            io_stalled: false,
        };
        // Observations from before the start-gate measurement are not fresh: run a little first.
        for _ in 0..20 {
            rig.tick(None, 0, false, 0);
        }
        rig
    }

    pub(super) fn now(&self) -> MonoTime {
        self.t0.offset_seconds(self.k as f64 * DT)
    }

    /// A slow ramp chunk observed `age_s` before now.
    fn chunk(&self, age_s: f64) -> Box<JointChunk> {
        let mut c = JointChunk::with_capacity(50);
        c.obs_stamp = self.now().offset_seconds(-age_s);
        c.period_s = 0.02;
        for i in 0..50 {
            let x = 0.2 * i as f64 * 0.02;
            c.positions.push(JointVector::from_slice(&[x, -x]));
        }
        c.update_derivatives();
        Box::new(c)
    }

    pub(super) fn tick(
        &mut self,
        chunk: Option<Box<JointChunk>>,
        overrun_streak: u32,
        estop: bool,
        resets: u64,
    ) -> TickReport {
        self.k += 1;
        let now = self.now();
        self.measured.stamp = now.offset_seconds(-0.002);
        let r = self.ctl.tick(
            TickInputs {
                safety: SafetyInputs {
                    estop,
                    resets,
                    overrun_streak,
                    ..SafetyInputs::quiet(now, &self.measured)
                },
                new_chunk: chunk,
                inference_in_flight: false,
                trajectories_sent: self.sent,
            },
            &mut |_| {},
        );
        self.measured.position = r.command.position;
        // The transport sends each command at once, unless the test holds it back.
        if !self.io_stalled {
            self.sent = Some(now);
        }
        r
    }
}

#[test]
fn when_overrun_streak_reaches_limit_expect_hold() {
    let mut rig = Rig::new();
    let c = rig.chunk(0.05);
    rig.tick(Some(c), 0, false, 0);
    assert_eq!(rig.ctl.mode(), Mode::Running);
    for streak in 1..5 {
        rig.tick(None, streak, false, 0);
        assert_eq!(
            rig.ctl.mode(),
            Mode::Running,
            "streak {streak} is below the limit of 5"
        );
    }
    rig.tick(None, 5, false, 0);
    assert_eq!(rig.ctl.mode(), Mode::Holding(HoldReason::Overruns));
}

#[test]
fn when_chunk_predates_hold_expect_not_fresh_and_never_replayed() {
    let mut rig = Rig::new();
    let c = rig.chunk(0.05);
    rig.tick(Some(c), 0, false, 0);
    // Joint states stall: hold.
    let stale_since = rig.measured.stamp;
    for _ in 0..30 {
        rig.k += 1;
        let now = rig.now();
        let measured = JointMeasurement {
            stamp: stale_since,
            position: rig.measured.position,
        };
        rig.ctl.tick(
            TickInputs {
                safety: SafetyInputs::quiet(now, &measured),
                new_chunk: None,
                inference_in_flight: false,
                trajectories_sent: None,
            },
            &mut |_| {},
        );
    }
    assert_eq!(rig.ctl.mode(), Mode::Holding(HoldReason::StaleJointState));
    // Inputs are fresh again; a chunk computed from an observation before the hold is refused.
    let old = rig.chunk(0.2);
    let r = rig.tick(Some(old), 0, false, 0);
    assert!(
        matches!(
            r.chunk,
            Some(ChunkOutcome::Rejected {
                reason: LateRejection::NotFresh,
                ..
            })
        ),
        "{:?}",
        r.chunk
    );
    assert!(matches!(rig.ctl.mode(), Mode::Holding(_)));
    let fresh = rig.chunk(0.01);
    let r = rig.tick(Some(fresh), 0, false, 0);
    assert!(
        matches!(r.chunk, Some(ChunkOutcome::Accepted { .. })),
        "{:?}",
        r.chunk
    );
    assert_eq!(rig.ctl.mode(), Mode::Running);
}

#[test]
fn when_reset_while_still_moving_expect_refused_and_latched() {
    let mut rig = Rig::new();
    let c = rig.chunk(0.05);
    rig.tick(Some(c), 0, false, 0);
    for _ in 0..100 {
        rig.tick(None, 0, false, 0);
    }
    assert!(rig.ctl.commanded().velocity[0] > 0.1, "moving");
    rig.tick(None, 0, true, 0);
    assert_eq!(rig.ctl.mode(), Mode::EStopped);
    // E-stop released and reset at once, while the arm still decelerates.
    let r = rig.tick(None, 0, false, 1);
    assert!(r.reset_refused);
    assert_eq!(rig.ctl.mode(), Mode::EStopped);
    for _ in 0..200 {
        rig.tick(None, 0, false, 1);
    }
    assert_eq!(rig.ctl.commanded().velocity[0], 0.0, "at rest");
    let r = rig.tick(None, 0, false, 2);
    assert!(!r.reset_refused);
    assert_eq!(rig.ctl.mode(), Mode::Holding(HoldReason::AfterReset));
    // Still nothing moves until a fresh chunk arrives.
    let p = rig.ctl.commanded().position;
    for _ in 0..50 {
        rig.tick(None, 0, false, 2);
    }
    assert_eq!(rig.ctl.commanded().position, p);
}

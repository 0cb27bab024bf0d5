//! `[robot]` and `[limits]`: the commanded joints and their limits, the URDF's merged with the
//! configuration's overrides. Overrides that widen what the URDF allows are warned about.

use super::check::{first_duplicate, Check};
use super::raw::{RawJointLimits, RawLimits, RawRobot};
use super::ConfigError;
use crate::joints::MAX_JOINTS;
use crate::robot::urdf::{UrdfJointType, UrdfModel};
use crate::robot::{JointKind, JointLimits, RobotLimits, SoftLimit};

/// `robot.joints`: 1 to `MAX_JOINTS` names, none twice.
pub fn joint_names<'r>(c: &Check, raw: &'r RawRobot) -> Result<&'r [String], ConfigError> {
    let names = &raw.joints;
    if names.is_empty() || names.len() > MAX_JOINTS {
        return c.fail(
            "robot.joints",
            format!(
                "expected 1 to {MAX_JOINTS} joint names, found {}",
                names.len()
            ),
        );
    }
    if let Some(dup) = first_duplicate(names) {
        return c.fail("robot.joints", format!("joint `{dup}` is listed twice"));
    }
    Ok(names)
}

/// The defaults every joint takes unless it overrides them, each checked under its own name.
struct Defaults {
    acceleration: Option<f64>,
    jerk: Option<f64>,
    position_margin: f64,
    max_step: f64,
}

fn defaults(c: &Check, raw: &RawLimits) -> Result<Defaults, ConfigError> {
    let opt = |field: &str, v: Option<f64>| v.map(|x| c.positive(field, x)).transpose();
    Ok(Defaults {
        acceleration: opt("limits.acceleration", raw.acceleration)?,
        jerk: opt("limits.jerk", raw.jerk)?,
        position_margin: match raw.position_margin {
            Some(m) => c.non_negative("limits.position_margin", m)?,
            None => 0.0,
        },
        max_step: opt("limits.max_step", raw.max_step)?.unwrap_or(f64::INFINITY),
    })
}

pub fn joint_limits(
    c: &Check,
    model: &UrdfModel,
    names: &[String],
    raw: &RawLimits,
) -> Result<RobotLimits, ConfigError> {
    for name in raw.joints.keys() {
        if !names.contains(name) {
            return c.fail(
                &format!("limits.joints.{name}"),
                "no such joint in robot.joints",
            );
        }
    }
    let d = defaults(c, raw)?;
    let none = RawJointLimits::default();
    let mut out = Vec::with_capacity(names.len());
    for name in names {
        out.push(one_joint(
            c,
            model,
            name,
            raw.joints.get(name).unwrap_or(&none),
            &d,
        )?);
    }
    let scale = match raw.scale {
        Some(s) if s > 0.0 && s <= 1.0 => s,
        Some(s) => {
            return c.fail(
                "limits.scale",
                format!("expected more than 0 and at most 1 (a fraction of every velocity, acceleration and jerk limit), found {s}"),
            )
        }
        None => 1.0,
    };
    Ok(RobotLimits::new(out).scaled(scale))
}

fn one_joint(
    c: &Check,
    model: &UrdfModel,
    name: &str,
    over: &RawJointLimits,
    d: &Defaults,
) -> Result<JointLimits, ConfigError> {
    let file = model.file.display();
    let uj = model.joints.get(name).ok_or_else(|| {
        c.error(
            "robot.joints",
            format!(
                "joint `{name}` is not a joint of {file} (it has: {})",
                model.joint_order.join(", ")
            ),
        )
    })?;
    let at = model.at(name);
    if !uj.kind.is_commandable() {
        return c.fail(
            "robot.joints",
            format!(
                "joint `{name}` is a {} joint in {file}{at}: pi0d commands one position per joint (revolute, prismatic or continuous)",
                uj.kind.name()
            ),
        );
    }
    let field = |key: &str| format!("limits.joints.{name}.{key}");
    let urdf_limit = uj.limit.unwrap_or_default();

    let velocity = match (over.velocity, urdf_limit.velocity) {
        (Some(v), urdf) => {
            let v = c.positive(&field("velocity"), v)?;
            if let Some(u) = urdf.filter(|u| *u > 0.0 && v > *u) {
                c.warn(
                    &field("velocity"),
                    format!("{v} widens the URDF's velocity limit {u} ({file}{at})"),
                );
            }
            v
        }
        (None, Some(u)) if u > 0.0 => u,
        (None, Some(u)) => {
            return c.fail(
                &field("velocity"),
                format!(
                    "{file}{at} gives <limit velocity=\"{u}\">, which is no usable limit (expected > 0): set one here"
                ),
            )
        }
        (None, None) => {
            return c.fail(
                &field("velocity"),
                format!("{file}{at} gives no velocity limit for this joint: set one here"),
            )
        }
    };
    // The URDF has no acceleration or jerk: a joint's own value, else the global default.
    let required = |key: &str, own: Option<f64>, default: Option<f64>| match own {
        Some(x) => c.positive(&field(key), x),
        None => default.ok_or_else(|| {
            c.error(
                &format!("limits.{key}"),
                format!(
                    "URDF has no {key} limits: set limits.{key} or {}",
                    field(key)
                ),
            )
        }),
    };
    let acceleration = required("acceleration", over.acceleration, d.acceleration)?;
    let jerk = required("jerk", over.jerk, d.jerk)?;
    let margin = match over.position_margin {
        Some(m) => c.non_negative(&field("position_margin"), m)?,
        None => d.position_margin,
    };
    let max_step = match over.max_step {
        Some(s) => c.positive(&field("max_step"), s)?,
        None => d.max_step,
    };
    let lower_over = over
        .lower
        .map(|x| c.finite(&field("lower"), x))
        .transpose()?;
    let upper_over = over
        .upper
        .map(|x| c.finite(&field("upper"), x))
        .transpose()?;

    let (kind, lower, upper) = match uj.range() {
        None => {
            if lower_over.is_some() || upper_over.is_some() {
                // A continuous joint may still be given a range by config (a cable-limited wrist).
                let lo = lower_over.unwrap_or(f64::NEG_INFINITY);
                let hi = upper_over.unwrap_or(f64::INFINITY);
                (JointKind::Revolute, lo + margin, hi - margin)
            } else {
                (JointKind::Continuous, f64::NEG_INFINITY, f64::INFINITY)
            }
        }
        Some((lo, hi)) => {
            if let Some(l) = lower_over.filter(|l| *l < lo) {
                c.warn(
                    &field("lower"),
                    format!("{l} widens the URDF's lower limit {lo} ({file}{at})"),
                );
            }
            if let Some(u) = upper_over.filter(|u| *u > hi) {
                c.warn(
                    &field("upper"),
                    format!("{u} widens the URDF's upper limit {hi} ({file}{at})"),
                );
            }
            let kind = if uj.kind == UrdfJointType::Prismatic {
                JointKind::Prismatic
            } else {
                JointKind::Revolute
            };
            (
                kind,
                lower_over.unwrap_or(lo) + margin,
                upper_over.unwrap_or(hi) - margin,
            )
        }
    };
    let (mut lower, mut upper) = (lower, upper);
    let soft = uj.soft.filter(|_| kind != JointKind::Continuous);
    if let Some(SoftLimit {
        lower: sl,
        upper: su,
        ..
    }) = soft
    {
        lower = lower.max(sl);
        upper = upper.min(su);
    }
    if !(lower < upper) {
        let what = if uj.range() == Some((0.0, 0.0)) && lower_over.is_none() {
            format!(" ({file}{at} gives <limit> without lower/upper: both default to 0)")
        } else {
            String::new()
        };
        return c.fail(
            &field("position_margin"),
            format!(
                "no range left: lower {lower} >= upper {upper} after margins and soft limits{what}"
            ),
        );
    }
    Ok(JointLimits {
        name: name.to_string(),
        kind,
        lower,
        upper,
        velocity,
        acceleration,
        jerk,
        effort: urdf_limit.effort.unwrap_or(0.0),
        soft,
        max_step,
    })
}

//! `[robot]` and `[limits]`: the commanded joints and their limits, the URDF's merged with the
//! configuration's overrides. Overrides that widen what the URDF allows are warned about.

use super::check::{first_duplicate, Check};
use super::ranges::{self, Range};
use super::raw::{RawJointLimits, RawLimits, RawRobot};
use super::ConfigError;
use crate::joints::MAX_JOINTS;
use crate::robot::urdf::{UrdfJointType, UrdfModel};
use crate::robot::{JointKind, JointLimits, RobotLimits, SoftLimit};

/// `robot.joints`: 1 to `MAX_JOINTS` names, none twice.
pub(crate) fn joint_names<'r>(c: &Check, raw: &'r RawRobot) -> Result<&'r [String], ConfigError> {
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

/// The defaults every joint takes unless it overrides them (each within its range,
/// `ranges::RANGES`).
struct Defaults {
    acceleration: Option<f64>,
    jerk: Option<f64>,
    position_margin: f64,
    max_step: f64,
}

fn defaults(raw: &RawLimits) -> Defaults {
    Defaults {
        acceleration: raw.acceleration,
        jerk: raw.jerk,
        position_margin: raw.position_margin.unwrap_or(0.0),
        max_step: raw.max_step.unwrap_or(f64::INFINITY),
    }
}

pub(crate) fn joint_limits(
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
    let d = defaults(raw);
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
    // A fraction of every velocity, acceleration and jerk limit, within its range.
    Ok(RobotLimits::new(out).scaled(raw.scale.unwrap_or(1.0)))
}

fn one_joint(
    c: &Check,
    model: &UrdfModel,
    name: &str,
    over: &RawJointLimits,
    d: &Defaults,
) -> Result<JointLimits, ConfigError> {
    let file = model.file.display().to_string();
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

    // The configuration's values are within their ranges (`ranges::RANGES`); the URDF's are
    // held to the same ranges where pi0d uses them.
    let velocity = match (over.velocity, urdf_limit.velocity) {
        (Some(v), urdf) => {
            if let Some(u) = urdf.filter(|u| *u > 0.0 && v > *u) {
                c.warn(
                    &field("velocity"),
                    format!("{v} widens the URDF's velocity limit {u} ({file}{at})"),
                );
            }
            v
        }
        (None, Some(u)) if u > 0.0 => urdf_value(&file, &at, name, "velocity", u)?,
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
        Some(x) => Ok(x),
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
    let margin = over.position_margin.unwrap_or(d.position_margin);
    let max_step = over.max_step.unwrap_or(d.max_step);
    let (lower_over, upper_over) = (over.lower, over.upper);
    if let Some((lo, hi)) = uj.range() {
        // Only the bounds the configuration does not replace.
        if lower_over.is_none() {
            urdf_value(&file, &at, name, "lower", lo)?;
        }
        if upper_over.is_none() {
            urdf_value(&file, &at, name, "upper", hi)?;
        }
    }
    let effort = urdf_value(&file, &at, name, "effort", urdf_limit.effort.unwrap_or(0.0))?;
    safety_controller(model, name, &file, &at)?;

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
        effort,
        soft,
        max_step,
    })
}

/// The range a URDF attribute pi0d uses is held to (the setting that overrides it, where one
/// does), and its element.
fn urdf_range(key: &str) -> (Range, &'static str, bool) {
    let own = |(min, max): (f64, f64), unit| Range {
        field: "",
        min,
        max,
        unit,
        integer: false,
    };
    let setting = |key: &str| *ranges::range(&format!("limits.joints.*.{key}"));
    let position = (-ranges::POSITION, ranges::POSITION);
    match key {
        "velocity" | "lower" | "upper" => (setting(key), "limit", true),
        "effort" => (own(ranges::EFFORT, "N (N·m)"), "limit", false),
        "k_position" => (own(ranges::K_POSITION, "1/s"), "safety_controller", false),
        "k_velocity" => (own(ranges::K_VELOCITY, ""), "safety_controller", false),
        _ => (own(position, "rad (m)"), "safety_controller", false),
    }
}

/// `x`, the URDF's `key` of `joint`, if within its range; else an error naming the URDF, the
/// joint, its line and the attribute (and the setting that can replace it).
fn urdf_value(file: &str, at: &str, joint: &str, key: &str, x: f64) -> Result<f64, ConfigError> {
    let (range, element, overridable) = urdf_range(key);
    if range.contains(x) {
        return Ok(x);
    }
    let hint = if overridable {
        format!("; or set limits.joints.{joint}.{key}")
    } else {
        String::new()
    };
    Err(ConfigError::Urdf(crate::robot::urdf::UrdfError::Joint {
        file: file.into(),
        joint: joint.to_string(),
        at: at.to_string(),
        message: format!(
            "<{element} {key}=\"{}\">: {}{hint}",
            ranges::number(x),
            range.expected(&ranges::number(x))
        ),
    }))
}

/// `<safety_controller>`: the soft limits and k_position (the soft limiter's gain), and
/// k_velocity (pi0d does not use it; still held to a sane range).
fn safety_controller(
    model: &UrdfModel,
    joint: &str,
    file: &str,
    at: &str,
) -> Result<(), ConfigError> {
    let Some(sc) = model
        .robot
        .joints
        .iter()
        .find(|j| j.name == joint)
        .and_then(|j| j.safety_controller.as_ref())
    else {
        return Ok(());
    };
    for (key, x) in [
        ("soft_lower_limit", sc.soft_lower_limit),
        ("soft_upper_limit", sc.soft_upper_limit),
        ("k_position", sc.k_position),
        ("k_velocity", sc.k_velocity),
    ] {
        urdf_value(file, at, joint, key, x)?;
    }
    Ok(())
}

//! Reading joint limits and kinematics from a URDF file.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use super::limits::{JointKind, SoftLimit};

#[derive(Debug, thiserror::Error)]
pub enum UrdfError {
    #[error("{file}: cannot parse URDF: {message}")]
    Parse { file: PathBuf, message: String },
    #[error("{file}: joint `{joint}`: {message}")]
    Joint {
        file: PathBuf,
        joint: String,
        message: String,
    },
    #[error("{file}: {message}")]
    Robot { file: PathBuf, message: String },
}

/// A movable joint's limits as the URDF states them.
#[derive(Clone, Debug)]
pub struct UrdfJoint {
    pub kind: JointKind,
    /// `None` for continuous joints (urdf-rs reads their absent limits as 0.0).
    pub position: Option<(f64, f64)>,
    /// `None` when the URDF gives no positive velocity limit.
    pub velocity: Option<f64>,
    pub effort: f64,
    pub soft: Option<SoftLimit>,
}

pub struct UrdfModel {
    pub file: PathBuf,
    pub robot: urdf_rs::Robot,
    pub joints: HashMap<String, UrdfJoint>,
}

pub fn load(file: &Path) -> Result<UrdfModel, UrdfError> {
    let text = std::fs::read_to_string(file).map_err(|e| UrdfError::Parse {
        file: file.to_path_buf(),
        message: e.to_string(),
    })?;
    parse(file, &text)
}

pub fn parse(file: &Path, text: &str) -> Result<UrdfModel, UrdfError> {
    let robot = urdf_rs::read_from_string(text).map_err(|e| UrdfError::Parse {
        file: file.to_path_buf(),
        message: e.to_string(),
    })?;
    let mut joints = HashMap::new();
    for joint in &robot.joints {
        let err = |message: String| UrdfError::Joint {
            file: file.to_path_buf(),
            joint: joint.name.clone(),
            message,
        };
        let kind = match joint.joint_type {
            urdf_rs::JointType::Revolute => JointKind::Revolute,
            urdf_rs::JointType::Prismatic => JointKind::Prismatic,
            urdf_rs::JointType::Continuous => JointKind::Continuous,
            urdf_rs::JointType::Fixed => continue,
            ref other => {
                // Floating/planar/spherical joints cannot be position-commanded as one scalar.
                joints.insert(
                    joint.name.clone(),
                    UrdfJoint {
                        kind: JointKind::Continuous,
                        position: None,
                        velocity: None,
                        effort: 0.0,
                        soft: None,
                    },
                );
                tracing::debug!(joint = %joint.name, kind = ?other, "joint type not commandable");
                continue;
            }
        };
        let l = &joint.limit;
        let position = match kind {
            JointKind::Continuous => None,
            _ => {
                if !(l.lower.is_finite() && l.upper.is_finite() && l.lower < l.upper) {
                    return Err(err(format!(
                        "<limit lower upper> must be finite with lower < upper, found lower={} upper={}",
                        l.lower, l.upper
                    )));
                }
                Some((l.lower, l.upper))
            }
        };
        let velocity = (l.velocity.is_finite() && l.velocity > 0.0).then_some(l.velocity);
        let soft = match &joint.safety_controller {
            None => None,
            Some(sc) => {
                if !(sc.soft_lower_limit < sc.soft_upper_limit && sc.k_position > 0.0) {
                    return Err(err(format!(
                        "<safety_controller> needs soft_lower_limit < soft_upper_limit and k_position > 0, found {} / {} / {}",
                        sc.soft_lower_limit, sc.soft_upper_limit, sc.k_position
                    )));
                }
                Some(SoftLimit {
                    lower: sc.soft_lower_limit,
                    upper: sc.soft_upper_limit,
                    k_position: sc.k_position,
                })
            }
        };
        joints.insert(
            joint.name.clone(),
            UrdfJoint {
                kind,
                position,
                velocity,
                effort: l.effort,
                soft,
            },
        );
    }
    Ok(UrdfModel {
        file: file.to_path_buf(),
        robot,
        joints,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const ARM: &str = r#"<robot name="t">
      <link name="base"/><link name="a"/><link name="b"/>
      <joint name="j1" type="revolute"><parent link="base"/><child link="a"/>
        <limit lower="-1" upper="1" velocity="2" effort="10"/>
        <safety_controller soft_lower_limit="-0.9" soft_upper_limit="0.9" k_position="20" k_velocity="1"/></joint>
      <joint name="j2" type="continuous"><parent link="a"/><child link="b"/></joint>
    </robot>"#;

    #[test]
    fn when_continuous_joint_expect_no_position_limit() {
        let m = parse(Path::new("t.urdf"), ARM).unwrap();
        assert_eq!(m.joints["j1"].position, Some((-1.0, 1.0)));
        assert_eq!(m.joints["j1"].velocity, Some(2.0));
        assert!(m.joints["j1"].soft.is_some());
        assert_eq!(m.joints["j2"].position, None);
        assert_eq!(m.joints["j2"].velocity, None);
    }

    #[test]
    fn when_revolute_limits_inverted_expect_error_naming_joint() {
        let bad = ARM.replace(r#"lower="-1" upper="1""#, r#"lower="1" upper="-1""#);
        let e = parse(Path::new("t.urdf"), &bad).err().unwrap().to_string();
        assert!(
            e.contains("t.urdf") && e.contains("j1") && e.contains("lower < upper"),
            "{e}"
        );
    }

    #[test]
    fn when_not_xml_expect_parse_error_naming_file() {
        let e = parse(Path::new("broken.urdf"), "<robot")
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("broken.urdf"), "{e}");
    }
}

//! Forward kinematics along the URDF chain from a base link to a tool link.

use nalgebra::{Isometry3, Point3, Translation3, Unit, UnitQuaternion, Vector3};

use super::urdf::UrdfError;
use super::urdf::UrdfModel;

#[derive(Clone, Debug)]
enum Motion {
    Fixed,
    Revolute(Unit<Vector3<f64>>),
    Prismatic(Unit<Vector3<f64>>),
}

#[derive(Clone, Debug)]
struct ChainLink {
    origin: Isometry3<f64>,
    motion: Motion,
    /// Index of the joint in command order; `None` for joints pi0d does not command (held at 0).
    command_index: Option<usize>,
}

/// The serial chain base -> tool, evaluated for a command vector without allocating.
#[derive(Clone, Debug)]
pub(crate) struct KinematicChain {
    links: Vec<ChainLink>,
    pub base_link: String,
    pub tool_link: String,
}

impl KinematicChain {
    /// Builds the chain by walking parent links from `tool_link` up to `base_link`.
    pub(crate) fn from_urdf(
        model: &UrdfModel,
        base_link: &str,
        tool_link: &str,
        command_joints: &[String],
    ) -> Result<KinematicChain, UrdfError> {
        let robot_err = |message: String| UrdfError::Robot {
            file: model.file.clone(),
            message,
        };
        for link in [base_link, tool_link] {
            if !model.robot.links.iter().any(|l| l.name == link) {
                return Err(robot_err(format!("no link named `{link}`")));
            }
        }
        let mut links = Vec::new();
        let mut current = tool_link.to_string();
        while current != base_link {
            let joint = model
                .robot
                .joints
                .iter()
                .find(|j| j.child.link == current)
                .ok_or_else(|| {
                    robot_err(format!(
                        "link `{tool_link}` is not below `{base_link}` (no joint has child `{current}`)"
                    ))
                })?;
            if links.len() > model.robot.joints.len() {
                return Err(robot_err("the joint tree has a cycle".into()));
            }
            let axis = Vector3::from(joint.axis.xyz.0);
            let axis = Unit::try_new(axis, 1e-12).ok_or_else(|| UrdfError::Joint {
                file: model.file.clone(),
                joint: joint.name.clone(),
                at: model.at(&joint.name),
                message: "axis has zero length".into(),
            });
            let motion = match joint.joint_type {
                urdf_rs::JointType::Revolute | urdf_rs::JointType::Continuous => {
                    Motion::Revolute(axis?)
                }
                urdf_rs::JointType::Prismatic => Motion::Prismatic(axis?),
                _ => Motion::Fixed,
            };
            let [x, y, z] = joint.origin.xyz.0;
            let [r, p, yaw] = joint.origin.rpy.0;
            links.push(ChainLink {
                origin: Isometry3::from_parts(
                    Translation3::new(x, y, z),
                    UnitQuaternion::from_euler_angles(r, p, yaw),
                ),
                motion,
                command_index: command_joints.iter().position(|n| *n == joint.name),
            });
            current = joint.parent.link.clone();
        }
        links.reverse();
        Ok(KinematicChain {
            links,
            base_link: base_link.to_string(),
            tool_link: tool_link.to_string(),
        })
    }

    /// Position of the tool link's origin in the base frame for the command vector `q`.
    pub(crate) fn tool_position(&self, q: &[f64]) -> Point3<f64> {
        self.walk(q, |_| {})
    }

    /// The origin of each moving joint from the base out, then the tool's: the arm as a
    /// polyline (what the simulator's camera draws).
    pub(crate) fn joint_positions(&self, q: &[f64], out: &mut Vec<Point3<f64>>) {
        out.clear();
        let tool = self.walk(q, |p| out.push(p));
        out.push(tool);
    }

    /// Walks the chain for `q`, calling `joint` with each moving joint's origin, and returns
    /// the tool's.
    fn walk(&self, q: &[f64], mut joint: impl FnMut(Point3<f64>)) -> Point3<f64> {
        let mut pose = Isometry3::identity();
        for link in &self.links {
            if !matches!(link.motion, Motion::Fixed) {
                joint(pose * link.origin * Point3::origin());
            }
            pose *= link.origin;
            let value = link.command_index.map_or(0.0, |i| q[i]);
            match &link.motion {
                Motion::Fixed => {}
                Motion::Revolute(axis) => {
                    pose *= UnitQuaternion::from_axis_angle(axis, value);
                }
                Motion::Prismatic(axis) => {
                    pose *= Translation3::from(axis.into_inner() * value);
                }
            }
        }
        pose * Point3::origin()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::robot::urdf::parse;
    use std::path::Path;

    /// Planar two-link arm: both joints turn about z, links 1 m and 0.5 m along x.
    const PLANAR: &str = r#"<robot name="p">
      <link name="base"/><link name="l1"/><link name="l2"/><link name="tool"/>
      <joint name="j1" type="revolute"><parent link="base"/><child link="l1"/><axis xyz="0 0 1"/>
        <limit lower="-3" upper="3" velocity="1"/></joint>
      <joint name="j2" type="revolute"><parent link="l1"/><child link="l2"/><origin xyz="1 0 0"/><axis xyz="0 0 1"/>
        <limit lower="-3" upper="3" velocity="1"/></joint>
      <joint name="tool_fixed" type="fixed"><parent link="l2"/><child link="tool"/><origin xyz="0.5 0 0"/></joint>
    </robot>"#;

    #[test]
    fn when_planar_arm_expect_textbook_forward_kinematics() {
        let m = parse(Path::new("p.urdf"), PLANAR).unwrap();
        let names = vec!["j2".to_string(), "j1".to_string()]; // command order differs from URDF order
        let chain = KinematicChain::from_urdf(&m, "base", "tool", &names).unwrap();
        for (q1, q2) in [(0.0, 0.0), (0.5, -0.3), (-1.2, 2.0)] {
            let p = chain.tool_position(&[q2, q1]);
            let x = q1.cos() + 0.5 * (q1 + q2).cos();
            let y = q1.sin() + 0.5 * (q1 + q2).sin();
            assert!((p.x - x).abs() < 1e-12 && (p.y - y).abs() < 1e-12 && p.z.abs() < 1e-12);
        }
    }

    #[test]
    fn when_tool_link_unknown_expect_error_naming_it() {
        let m = parse(Path::new("p.urdf"), PLANAR).unwrap();
        let e = KinematicChain::from_urdf(&m, "base", "gripper", &[])
            .err()
            .unwrap();
        assert!(e.to_string().contains("`gripper`"), "{e}");
    }
}

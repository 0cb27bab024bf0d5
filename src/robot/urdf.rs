//! Reading a URDF: first a validating pass over the XML (roxmltree), which refuses what
//! urdf-rs would accept silently or report without naming the element (a joint or link defined
//! twice, a link with two parents, a cycle, several roots, references to links that do not
//! exist, non-numeric or non-finite origins, axes and limits, a revolute or prismatic joint
//! without `<limit>`), and records each joint's limits as written (absent stays absent). Then
//! urdf-rs builds the typed model the kinematics use.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use super::limits::SoftLimit;

#[derive(Debug, thiserror::Error)]
pub enum UrdfError {
    #[error("{file}: cannot read it")]
    Read {
        file: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{file}: cannot parse URDF: {message}")]
    Parse { file: PathBuf, message: String },
    #[error("{file}: joint `{joint}`{at}: {message}")]
    Joint {
        file: PathBuf,
        joint: String,
        /// " (line N)" when known.
        at: String,
        message: String,
    },
    #[error("{file}: {message}")]
    Robot { file: PathBuf, message: String },
}

/// A URDF joint type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum UrdfJointType {
    Revolute,
    Continuous,
    Prismatic,
    Fixed,
    Floating,
    Planar,
    Spherical,
}

impl UrdfJointType {
    fn parse(s: &str) -> Option<UrdfJointType> {
        Some(match s {
            "revolute" => UrdfJointType::Revolute,
            "continuous" => UrdfJointType::Continuous,
            "prismatic" => UrdfJointType::Prismatic,
            "fixed" => UrdfJointType::Fixed,
            "floating" => UrdfJointType::Floating,
            "planar" => UrdfJointType::Planar,
            "spherical" => UrdfJointType::Spherical,
            _ => return None,
        })
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            UrdfJointType::Revolute => "revolute",
            UrdfJointType::Continuous => "continuous",
            UrdfJointType::Prismatic => "prismatic",
            UrdfJointType::Fixed => "fixed",
            UrdfJointType::Floating => "floating",
            UrdfJointType::Planar => "planar",
            UrdfJointType::Spherical => "spherical",
        }
    }

    /// One scalar position pi0d can command.
    pub(crate) fn is_commandable(self) -> bool {
        matches!(
            self,
            UrdfJointType::Revolute | UrdfJointType::Continuous | UrdfJointType::Prismatic
        )
    }
}

/// `<limit>` as written; every value finite where present.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct UrdfLimit {
    pub(crate) lower: Option<f64>,
    pub(crate) upper: Option<f64>,
    pub(crate) velocity: Option<f64>,
    pub(crate) effort: Option<f64>,
}

/// A joint's limits as the URDF states them.
#[derive(Clone, Debug)]
pub(crate) struct UrdfJoint {
    pub(crate) kind: UrdfJointType,
    pub(crate) limit: Option<UrdfLimit>,
    pub(crate) soft: Option<SoftLimit>,
    /// Line of the `<joint>` element, for messages.
    pub(crate) line: u32,
}

impl UrdfJoint {
    /// The position range the URDF gives (revolute and prismatic joints; the URDF default
    /// for an absent bound is 0).
    pub(crate) fn range(&self) -> Option<(f64, f64)> {
        match self.kind {
            UrdfJointType::Revolute | UrdfJointType::Prismatic => {
                let l = self.limit.unwrap_or_default();
                Some((l.lower.unwrap_or(0.0), l.upper.unwrap_or(0.0)))
            }
            _ => None,
        }
    }
}

pub(crate) struct UrdfModel {
    pub(crate) file: PathBuf,
    pub(crate) robot: urdf_rs::Robot,
    pub(crate) joints: HashMap<String, UrdfJoint>,
    /// Joint names in file order (for messages listing them).
    pub(crate) joint_order: Vec<String>,
}

impl UrdfModel {
    /// `" (line N)"` for a joint, for messages.
    pub(crate) fn at(&self, joint: &str) -> String {
        self.joints
            .get(joint)
            .map(|j| format!(" (line {})", j.line))
            .unwrap_or_default()
    }
}

/// The largest URDF read (a whole robot's is well under a megabyte; meshes are separate files).
const MAX_BYTES: u64 = 32 << 20;

pub(crate) fn load(file: &Path) -> Result<UrdfModel, UrdfError> {
    if file.is_dir() {
        return Err(UrdfError::Parse {
            file: file.to_path_buf(),
            message: "is a directory, expected a URDF file".into(),
        });
    }
    // Only a regular file: a FIFO or device here would block the reader (a SIGHUP reload too).
    let text = crate::files::read_regular(file, MAX_BYTES).map_err(|source| UrdfError::Read {
        file: file.to_path_buf(),
        source,
    })?;
    parse(file, &text)
}

/// Reads attributes of one element, naming the joint (or link) and the line in errors.
#[derive(Clone, Copy)]
struct Element<'a, 'input> {
    node: roxmltree::Node<'a, 'input>,
    doc: &'a roxmltree::Document<'input>,
    file: &'a Path,
    /// The joint it belongs to (`None`: a link's or the robot's).
    joint: Option<&'a str>,
}

impl<'a, 'input> Element<'a, 'input> {
    fn line(&self) -> u32 {
        self.doc.text_pos_at(self.node.range().start).row
    }

    fn err(&self, message: String) -> UrdfError {
        match self.joint {
            Some(j) => UrdfError::Joint {
                file: self.file.to_path_buf(),
                joint: j.to_string(),
                at: format!(" (line {})", self.line()),
                message,
            },
            None => UrdfError::Robot {
                file: self.file.to_path_buf(),
                message: format!("line {}: {message}", self.line()),
            },
        }
    }

    fn tag(&self) -> &str {
        self.node.tag_name().name()
    }

    /// A finite number, if the attribute is present.
    fn number(&self, attr: &str) -> Result<Option<f64>, UrdfError> {
        let Some(text) = self.node.attribute(attr) else {
            return Ok(None);
        };
        match text.trim().parse::<f64>() {
            Ok(x) if x.is_finite() => Ok(Some(x)),
            Ok(x) => Err(self.err(format!(
                "<{} {attr}=\"{text}\">: expected a finite number, found {x}",
                self.tag()
            ))),
            Err(_) => Err(self.err(format!(
                "<{} {attr}=\"{text}\">: expected a number",
                self.tag()
            ))),
        }
    }

    /// Three finite numbers separated by spaces, if present.
    fn triple(&self, attr: &str) -> Result<Option<[f64; 3]>, UrdfError> {
        let Some(text) = self.node.attribute(attr) else {
            return Ok(None);
        };
        let values: Vec<Option<f64>> = text
            .split_whitespace()
            .map(|t| t.parse::<f64>().ok().filter(|x| x.is_finite()))
            .collect();
        match values[..] {
            [Some(a), Some(b), Some(c)] => Ok(Some([a, b, c])),
            _ => Err(self.err(format!(
                "<{} {attr}=\"{text}\">: expected three finite numbers",
                self.tag()
            ))),
        }
    }

    fn child(&self, tag: &str) -> Option<roxmltree::Node<'a, 'input>> {
        self.node.children().find(|c| c.has_tag_name(tag))
    }
}

/// Every numeric attribute URDF defines, and how many numbers it holds. All of them are
/// checked (also those pi0d does not use), so urdf-rs never meets a malformed number: its
/// errors would not say where.
const NUMBERS: &[(&str, &[&str], usize)] = &[
    ("origin", &["xyz", "rpy"], 3),
    ("axis", &["xyz"], 3),
    ("box", &["size"], 3),
    ("mesh", &["scale"], 3),
    ("color", &["rgba"], 4),
    ("mass", &["value"], 1),
    ("inertia", &["ixx", "ixy", "ixz", "iyy", "iyz", "izz"], 1),
    ("cylinder", &["radius", "length"], 1),
    ("capsule", &["radius", "length"], 1),
    ("sphere", &["radius"], 1),
    ("limit", &["lower", "upper", "velocity", "effort"], 1),
    ("dynamics", &["damping", "friction"], 1),
    ("mimic", &["multiplier", "offset"], 1),
    ("calibration", &["rising", "falling"], 1),
    (
        "safety_controller",
        &[
            "soft_lower_limit",
            "soft_upper_limit",
            "k_position",
            "k_velocity",
        ],
        1,
    ),
];

/// An error at `node`, naming the joint or link it belongs to and its line.
fn error_at(
    doc: &roxmltree::Document,
    node: roxmltree::Node,
    file: &Path,
    message: String,
) -> UrdfError {
    let row = doc.text_pos_at(node.range().start).row;
    let owner = node
        .ancestors()
        .find(|a| a.has_tag_name("joint") || a.has_tag_name("link"));
    match owner {
        Some(o) if o.has_tag_name("joint") => UrdfError::Joint {
            file: file.to_path_buf(),
            joint: o.attribute("name").unwrap_or("?").to_string(),
            at: format!(" (line {row})"),
            message,
        },
        Some(o) => UrdfError::Robot {
            file: file.to_path_buf(),
            message: format!(
                "link `{}` (line {row}): {message}",
                o.attribute("name").unwrap_or("?")
            ),
        },
        None => UrdfError::Robot {
            file: file.to_path_buf(),
            message: format!("line {row}: {message}"),
        },
    }
}

fn check_numbers(doc: &roxmltree::Document, file: &Path) -> Result<(), UrdfError> {
    for node in doc.descendants().filter(|n| n.is_element()) {
        let tag = node.tag_name().name();
        let Some((_, attrs, count)) = NUMBERS.iter().find(|(t, ..)| *t == tag) else {
            continue;
        };
        for attr in attrs.iter() {
            let Some(text) = node.attribute(*attr) else {
                continue;
            };
            let values: Vec<Result<f64, _>> =
                text.split_whitespace().map(str::parse::<f64>).collect();
            let expected = match count {
                1 => "a finite number",
                3 => "three finite numbers",
                _ => "four finite numbers",
            };
            let message = if values.len() != *count || values.iter().any(|v| v.is_err()) {
                Some(if *count == 1 {
                    "expected a number".to_string()
                } else {
                    format!("expected {expected}")
                })
            } else if values
                .iter()
                .any(|v| !v.as_ref().is_ok_and(|x| x.is_finite()))
            {
                Some(format!("expected {expected}"))
            } else {
                None
            };
            if let Some(m) = message {
                return Err(error_at(
                    doc,
                    node,
                    file,
                    format!("<{tag} {attr}=\"{text}\">: {m}"),
                ));
            }
        }
    }
    Ok(())
}

/// Checks the XML and returns each joint's limits as written (`parse` runs it first).
fn validate(
    file: &Path,
    text: &str,
) -> Result<(HashMap<String, UrdfJoint>, Vec<String>), UrdfError> {
    let parse_err = |message: String| UrdfError::Parse {
        file: file.to_path_buf(),
        message,
    };
    let doc = roxmltree::Document::parse(text).map_err(|e| parse_err(e.to_string()))?;
    let root = doc.root_element();
    if !root.has_tag_name("robot") {
        return Err(parse_err(format!(
            "the root element is <{}>, expected <robot>",
            root.tag_name().name()
        )));
    }
    check_numbers(&doc, file)?;
    let robot_err = |message: String| UrdfError::Robot {
        file: file.to_path_buf(),
        message,
    };
    let line = |n: roxmltree::Node| doc.text_pos_at(n.range().start).row;

    let mut links = HashSet::new();
    for l in root.children().filter(|c| c.has_tag_name("link")) {
        let name = l
            .attribute("name")
            .ok_or_else(|| robot_err(format!("line {}: <link> without a name", line(l))))?;
        if !links.insert(name) {
            return Err(robot_err(format!(
                "line {}: link `{name}` is defined twice",
                line(l)
            )));
        }
    }

    let mut joints = HashMap::new();
    let mut order = Vec::new();
    // child link -> (joint, parent link)
    let mut parent_of: HashMap<&str, (&str, &str)> = HashMap::new();
    for j in root.children().filter(|c| c.has_tag_name("joint")) {
        let name = j
            .attribute("name")
            .ok_or_else(|| robot_err(format!("line {}: <joint> without a name", line(j))))?;
        let el = Element {
            node: j,
            doc: &doc,
            file,
            joint: Some(name),
        };
        if joints.contains_key(name) {
            return Err(el.err("is defined twice (the later limits would silently win)".into()));
        }
        let kind_text = j.attribute("type").unwrap_or("");
        let kind = UrdfJointType::parse(kind_text).ok_or_else(|| {
            el.err(format!(
                "type \"{kind_text}\": expected revolute, continuous, prismatic, fixed, floating or planar"
            ))
        })?;
        let link_of = |tag: &str| -> Result<&str, UrdfError> {
            let n = el
                .child(tag)
                .ok_or_else(|| el.err(format!("has no <{tag} link=\"...\"/>")))?;
            let link = n
                .attribute("link")
                .ok_or_else(|| el.err(format!("<{tag}> has no link attribute")))?;
            if !links.contains(link) {
                return Err(el.err(format!("<{tag} link=\"{link}\">: no such link")));
            }
            Ok(link)
        };
        let (parent, child) = (link_of("parent")?, link_of("child")?);
        if parent == child {
            return Err(el.err(format!("link `{child}` is its own parent")));
        }
        if let Some((other, _)) = parent_of.insert(child, (name, parent)) {
            return Err(el.err(format!(
                "link `{child}` already has a parent through joint `{other}`: a URDF is a tree"
            )));
        }
        for tag in ["origin", "axis"] {
            if let Some(n) = el.child(tag) {
                let sub = Element { node: n, ..el };
                sub.triple("xyz")?;
                if tag == "origin" {
                    sub.triple("rpy")?;
                }
            }
        }
        if let Some(n) = el.child("axis") {
            let sub = Element { node: n, ..el };
            if let Some(a) = sub.triple("xyz")? {
                if kind != UrdfJointType::Fixed && a.iter().all(|x| *x == 0.0) {
                    return Err(sub.err("<axis xyz=\"0 0 0\">: the axis has zero length".into()));
                }
            }
        }
        let limit = match el.child("limit") {
            None => None,
            Some(n) => {
                let sub = Element { node: n, ..el };
                if n.attribute("velocity").is_none() {
                    return Err(sub.err(
                        "<limit> has no velocity attribute (URDF requires velocity and effort)"
                            .into(),
                    ));
                }
                Some(UrdfLimit {
                    lower: sub.number("lower")?,
                    upper: sub.number("upper")?,
                    velocity: sub.number("velocity")?,
                    effort: sub.number("effort")?,
                })
            }
        };
        if limit.is_none() && matches!(kind, UrdfJointType::Revolute | UrdfJointType::Prismatic) {
            return Err(el.err(format!(
                "a {} joint needs <limit lower=\"...\" upper=\"...\" velocity=\"...\" effort=\"...\"/>",
                kind.name()
            )));
        }
        if let Some(UrdfLimit {
            lower: Some(lo),
            upper: Some(hi),
            ..
        }) = limit
        {
            if lo > hi {
                return Err(el.err(format!(
                    "<limit lower upper> must have lower <= upper, found lower={lo} upper={hi}"
                )));
            }
        }
        let soft = match el.child("safety_controller") {
            None => None,
            Some(n) => {
                let sub = Element { node: n, ..el };
                let lo = sub.number("soft_lower_limit")?.unwrap_or(0.0);
                let hi = sub.number("soft_upper_limit")?.unwrap_or(0.0);
                let k = sub.number("k_position")?.unwrap_or(0.0);
                let k_velocity = sub.number("k_velocity")?.unwrap_or(0.0);
                if !(lo < hi && k > 0.0) {
                    return Err(sub.err(format!(
                        "<safety_controller> needs soft_lower_limit < soft_upper_limit and k_position > 0, found {lo} / {hi} / {k}"
                    )));
                }
                Some(SoftLimit {
                    lower: lo,
                    upper: hi,
                    k_position: k,
                    k_velocity,
                })
            }
        };
        order.push(name.to_string());
        joints.insert(
            name.to_string(),
            UrdfJoint {
                kind,
                limit,
                soft,
                line: el.line(),
            },
        );
    }

    // A tree: exactly one link without a parent, and following parents from any link ends there.
    let roots: Vec<&str> = {
        let mut r: Vec<&str> = links
            .iter()
            .copied()
            .filter(|l| !parent_of.contains_key(l))
            .collect();
        r.sort_unstable();
        r
    };
    for &start in parent_of.keys() {
        let mut link = start;
        for _ in 0..=parent_of.len() {
            match parent_of.get(link) {
                Some((_, parent)) => link = parent,
                None => break,
            }
        }
        if parent_of.contains_key(link) {
            let (joint, _) = parent_of[start];
            return Err(robot_err(format!(
                "the joints form a cycle through link `{start}` (joint `{joint}`): a URDF is a tree"
            )));
        }
    }
    if roots.len() != 1 {
        return Err(robot_err(format!(
            "expected one root link (a tree), found {}: {}",
            roots.len(),
            roots.join(", ")
        )));
    }
    Ok((joints, order))
}

pub(crate) fn parse(file: &Path, text: &str) -> Result<UrdfModel, UrdfError> {
    let (joints, joint_order) = validate(file, text)?;
    let robot = urdf_rs::read_from_string(text).map_err(|e| UrdfError::Parse {
        file: file.to_path_buf(),
        message: e.to_string(),
    })?;
    Ok(UrdfModel {
        file: file.to_path_buf(),
        robot,
        joints,
        joint_order,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const ARM: &str = r#"<robot name="t">
      <link name="base"/><link name="a"/><link name="b"/>
      <joint name="j1" type="revolute"><parent link="base"/><child link="a"/>
        <origin xyz="0 0 0.1" rpy="0 0 0"/><axis xyz="0 0 1"/>
        <limit lower="-1" upper="1" velocity="2" effort="10"/>
        <safety_controller soft_lower_limit="-0.9" soft_upper_limit="0.9" k_position="20" k_velocity="1"/></joint>
      <joint name="j2" type="continuous"><parent link="a"/><child link="b"/></joint>
    </robot>"#;

    fn err(text: &str) -> String {
        parse(Path::new("t.urdf"), text).err().unwrap().to_string()
    }

    #[test]
    fn when_continuous_joint_expect_no_position_limit() {
        let m = parse(Path::new("t.urdf"), ARM).unwrap();
        assert_eq!(m.joints["j1"].range(), Some((-1.0, 1.0)));
        assert_eq!(m.joints["j1"].limit.unwrap().velocity, Some(2.0));
        assert!(m.joints["j1"].soft.is_some());
        assert_eq!(m.joints["j2"].range(), None);
        assert_eq!(m.joints["j2"].limit, None);
        assert_eq!(m.joint_order, ["j1", "j2"]);
    }

    #[test]
    fn when_revolute_limits_inverted_expect_error_naming_joint() {
        let e = err(&ARM.replace(r#"lower="-1" upper="1""#, r#"lower="1" upper="-1""#));
        assert!(
            e.contains("t.urdf") && e.contains("`j1`") && e.contains("lower <= upper"),
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

    #[test]
    fn when_joint_defined_twice_expect_refused() {
        let twice = ARM.replace(
            "</robot>",
            r#"<link name="c"/><joint name="j1" type="revolute"><parent link="b"/><child link="c"/>
            <limit lower="-3" upper="3" velocity="9" effort="1"/></joint></robot>"#,
        );
        let e = err(&twice);
        assert!(e.contains("`j1`") && e.contains("defined twice"), "{e}");
    }

    #[test]
    fn when_link_defined_twice_or_missing_expect_refused() {
        let e = err(&ARM.replace(r#"<link name="b"/>"#, r#"<link name="b"/><link name="a"/>"#));
        assert!(e.contains("link `a` is defined twice"), "{e}");
        let e = err(&ARM.replace(r#"<child link="b"/>"#, r#"<child link="nope"/>"#));
        assert!(
            e.contains("`j2`") && e.contains("nope") && e.contains("no such link"),
            "{e}"
        );
    }

    #[test]
    fn when_link_has_two_parents_expect_refused() {
        let e = err(&ARM.replace(
            "</robot>",
            r#"<joint name="j3" type="fixed"><parent link="base"/><child link="b"/></joint></robot>"#,
        ));
        assert!(
            e.contains("`j3`") && e.contains("already has a parent"),
            "{e}"
        );
    }

    #[test]
    fn when_joints_form_a_cycle_expect_refused() {
        // base -> a -> b -> base: every link has a parent.
        let e = err(&ARM.replace(
            "</robot>",
            r#"<joint name="back" type="fixed"><parent link="b"/><child link="base"/></joint></robot>"#,
        ));
        assert!(e.contains("cycle"), "{e}");
    }

    #[test]
    fn when_two_roots_expect_refused() {
        let e = err(&ARM.replace(r#"<link name="b"/>"#, r#"<link name="b"/><link name="x"/>"#));
        assert!(e.contains("one root link") && e.contains("x"), "{e}");
    }

    #[test]
    fn when_origin_or_axis_not_finite_expect_refused_naming_joint_and_line() {
        let e = err(&ARM.replace(r#"xyz="0 0 0.1""#, r#"xyz="0 0 NaN""#));
        assert!(
            e.contains("`j1` (line 4)") && e.contains("<origin xyz=\"0 0 NaN\">"),
            "{e}"
        );
        let e = err(&ARM.replace(r#"rpy="0 0 0""#, r#"rpy="0 0""#));
        assert!(e.contains("three finite numbers"), "{e}");
        let e = err(&ARM.replace(r#"<axis xyz="0 0 1"/>"#, r#"<axis xyz="0 0 0"/>"#));
        assert!(e.contains("zero length"), "{e}");
    }

    #[test]
    fn when_limit_value_not_a_number_expect_joint_and_attribute_named() {
        let e = err(&ARM.replace(r#"lower="-1""#, r#"lower="abc""#));
        assert!(
            e.contains("`j1`") && e.contains("<limit lower=\"abc\">"),
            "{e}"
        );
        let e = err(&ARM.replace(r#"velocity="2""#, r#"velocity="inf""#));
        assert!(e.contains("`j1`") && e.contains("finite"), "{e}");
    }

    #[test]
    fn when_any_urdf_number_is_malformed_expect_element_and_owner_named() {
        let with_link = |inner: &str| {
            ARM.replace(
                r#"<link name="a"/>"#,
                &format!(r#"<link name="a">{inner}</link>"#),
            )
        };
        let e = err(&with_link(r#"<inertial><mass value="abc"/></inertial>"#));
        assert!(
            e.contains("link `a` (line 2): <mass value=\"abc\">: expected a number"),
            "{e}"
        );
        let e = err(&with_link(
            r#"<visual><geometry><box size="1 2"/></geometry></visual>"#,
        ));
        assert!(
            e.contains("link `a`") && e.contains("expected three finite numbers"),
            "{e}"
        );
        let e = err(&ARM.replace(
            "</robot>",
            r#"<material name="m"><color rgba="1 0 0"/></material></robot>"#,
        ));
        assert!(
            e.contains("<color rgba=\"1 0 0\">: expected four finite numbers"),
            "{e}"
        );
        let e = err(&ARM.replace(
            r#"<axis xyz="0 0 1"/>"#,
            r#"<axis xyz="0 0 1"/><dynamics damping="x"/>"#,
        ));
        assert!(
            e.contains("`j1`") && e.contains("<dynamics damping=\"x\">"),
            "{e}"
        );
        // Well-formed unused elements are accepted.
        let inertial = r#"<inertial><mass value="1.5"/><inertia ixx="1" ixy="0" ixz="0" iyy="1" iyz="0" izz="1"/></inertial>"#;
        parse(Path::new("t.urdf"), &with_link(inertial)).unwrap();
    }

    #[test]
    fn when_limit_lacks_velocity_expect_joint_named() {
        let e = err(&ARM.replace(r#" velocity="2""#, ""));
        assert!(
            e.contains("`j1`") && e.contains("no velocity attribute"),
            "{e}"
        );
    }

    #[test]
    fn when_revolute_has_no_limit_expect_refused() {
        let e = err(&ARM.replace(
            r#"<limit lower="-1" upper="1" velocity="2" effort="10"/>"#,
            "",
        ));
        assert!(e.contains("`j1`") && e.contains("needs <limit"), "{e}");
    }

    #[test]
    fn when_planar_joint_expect_recorded_as_not_commandable() {
        let m = parse(
            Path::new("t.urdf"),
            &ARM.replace(
                r#"name="j2" type="continuous""#,
                r#"name="j2" type="planar""#,
            ),
        )
        .unwrap();
        assert!(!m.joints["j2"].kind.is_commandable());
    }
}

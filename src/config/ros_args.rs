//! `--ros-args`, as `launch_ros` appends them: `-r FROM:=TO` remaps (`__node`, `__ns` and
//! topics), `-p NAME:=VALUE` parameters, `--params-file FILE` (`<node or /**>: ros__parameters:`
//! YAML). Parameters are dotted paths into the configuration (`control.rate_hz`,
//! `ros.domain_id`, ...), so a launch file can carry or override any setting; the parameter
//! `config` names the TOML file itself.

use std::path::{Path, PathBuf};

use super::check::{Origin, Origins};
use super::ConfigError;

/// One `-p NAME:=VALUE` or an entry of a `--params-file`.
#[derive(Clone, Debug, PartialEq)]
pub struct Param {
    /// Dotted configuration path.
    pub name: String,
    pub value: toml::Value,
    /// The parameter file it came from (`None`: the command line).
    pub file: Option<PathBuf>,
}

impl Param {
    fn origin(&self) -> Origin {
        match &self.file {
            None => Origin::Param(self.name.clone()),
            Some(f) => Origin::ParamsFile {
                file: f.clone(),
                name: self.name.clone(),
            },
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct RosArgs {
    pub node: Option<String>,
    pub namespace: Option<String>,
    /// Topic remaps, absolute names.
    pub remaps: Vec<(String, String)>,
    /// Parameters in the order given (later wins).
    pub params: Vec<Param>,
}

/// Splits the command line at `--ros-args`: (arguments for pi0d, ROS arguments). A lone `--`
/// ends the ROS arguments.
pub fn split(args: Vec<String>) -> (Vec<String>, Vec<String>) {
    let mut ours = Vec::new();
    let mut ros = Vec::new();
    let mut in_ros = false;
    for a in args {
        if a == "--ros-args" {
            in_ros = true;
        } else if in_ros && a == "--" {
            in_ros = false;
        } else if in_ros {
            ros.push(a);
        } else {
            ours.push(a);
        }
    }
    (ours, ros)
}

/// A malformed `--ros-args` command line (exit code 2, like any command-line error).
fn err(message: impl Into<String>) -> ConfigError {
    ConfigError::Usage(format!("--ros-args: {}", message.into()))
}

/// A YAML scalar or list as a TOML value.
fn to_toml(name: &str, v: &serde_norway::Value) -> Result<toml::Value, String> {
    use serde_norway::Value as Y;
    Ok(match v {
        Y::Bool(b) => toml::Value::Boolean(*b),
        Y::Number(n) => match n.as_i64() {
            Some(i) => toml::Value::Integer(i),
            None => match n.as_f64() {
                Some(x) => toml::Value::Float(x),
                None => return Err(format!("parameter `{name}`: {n} is out of range")),
            },
        },
        Y::String(s) => toml::Value::String(s.clone()),
        Y::Sequence(items) => toml::Value::Array(
            items
                .iter()
                .map(|i| to_toml(name, i))
                .collect::<Result<_, _>>()?,
        ),
        _ => {
            return Err(format!(
                "parameter `{name}`: expected a number, string, boolean or list"
            ))
        }
    })
}

fn flatten(
    prefix: &str,
    v: &serde_norway::Value,
    out: &mut Vec<(String, toml::Value)>,
) -> Result<(), String> {
    match v {
        serde_norway::Value::Mapping(m) => {
            for (k, v) in m {
                let k = k
                    .as_str()
                    .ok_or_else(|| format!("parameter name under `{prefix}` is not a string"))?;
                let name = if prefix.is_empty() {
                    k.to_string()
                } else {
                    format!("{prefix}.{k}")
                };
                flatten(&name, v, out)?;
            }
            Ok(())
        }
        other => {
            out.push((prefix.to_string(), to_toml(prefix, other)?));
            Ok(())
        }
    }
}

/// Parameters for this node from a ROS parameter file: entries under `/**`, the node's name,
/// or its fully qualified name.
pub fn params_file(path: &Path, node: &str, namespace: &str) -> Result<Vec<Param>, ConfigError> {
    let file_err = |m: String| ConfigError::Parse {
        origin: Origin::File(path.to_path_buf()),
        message: m,
    };
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Io {
        file: path.to_path_buf(),
        source,
    })?;
    let doc: serde_norway::Value =
        serde_norway::from_str(&text).map_err(|e| file_err(e.to_string()))?;
    let map = doc
        .as_mapping()
        .ok_or_else(|| file_err("expected `<node>: ros__parameters: {...}`".into()))?;
    let fqn = format!("{}/{}", namespace.trim_end_matches('/'), node);
    let mut out = Vec::new();
    for (k, v) in map {
        let key = k.as_str().unwrap_or("");
        if [
            String::from("/**"),
            node.to_string(),
            format!("/{node}"),
            fqn.clone(),
        ]
        .iter()
        .any(|n| n == key)
        {
            let params = v
                .get("ros__parameters")
                .ok_or_else(|| file_err(format!("`{key}` has no `ros__parameters`")))?;
            flatten("", params, &mut out).map_err(file_err)?;
        }
    }
    Ok(out
        .into_iter()
        .map(|(name, value)| Param {
            name,
            value,
            file: Some(path.to_path_buf()),
        })
        .collect())
}

/// Parses the arguments after `--ros-args`. Parameter files are read with the final node name.
pub fn parse(args: &[String]) -> Result<RosArgs, ConfigError> {
    let mut out = RosArgs::default();
    let mut files = Vec::new();
    let mut i = 0;
    let next = |i: usize, flag: &str| {
        args.get(i + 1)
            .cloned()
            .ok_or_else(|| err(format!("`{flag}` needs a value")))
    };
    while i < args.len() {
        let a = args[i].as_str();
        match a {
            "-r" | "--remap" => {
                let v = next(i, a)?;
                let (from, to) = v
                    .split_once(":=")
                    .filter(|(from, to)| !from.is_empty() && !to.is_empty())
                    .ok_or_else(|| err(format!("remap `{v}`: expected FROM:=TO")))?;
                match from {
                    "__node" | "__name" => out.node = Some(to.to_string()),
                    "__ns" => out.namespace = Some(to.to_string()),
                    _ => out.remaps.push((absolute(from), absolute(to))),
                }
                i += 2;
            }
            "-p" | "--param" => {
                let v = next(i, a)?;
                let (name, value) = v
                    .split_once(":=")
                    .ok_or_else(|| err(format!("parameter `{v}`: expected NAME:=VALUE")))?;
                let y: serde_norway::Value = serde_norway::from_str(value)
                    .map_err(|e| err(format!("parameter `{name}`: {e}")))?;
                out.params.push(Param {
                    name: name.to_string(),
                    value: to_toml(name, &y).map_err(err)?,
                    file: None,
                });
                i += 2;
            }
            "--params-file" => {
                files.push((out.params.len(), PathBuf::from(next(i, a)?)));
                i += 2;
            }
            "--log-level" | "-e" | "--enclave" => i += 2,
            "--disable-rosout-logs"
            | "--disable-stdout-logs"
            | "--disable-external-lib-logs"
            | "--enable-rosout-logs"
            | "--enable-stdout-logs" => i += 1,
            other => return Err(err(format!("unsupported ROS argument `{other}`"))),
        }
    }
    // File parameters come before command-line ones given after them, as in rcl.
    let node = out.node.clone().unwrap_or_else(|| "pi0d".into());
    let ns = out.namespace.clone().unwrap_or_else(|| "/".into());
    for (pos, file) in files.into_iter().rev() {
        let params = params_file(&file, &node, &ns)?;
        out.params.splice(pos..pos, params);
    }
    Ok(out)
}

fn absolute(topic: &str) -> String {
    if topic.starts_with('/') {
        topic.to_string()
    } else {
        format!("/{topic}")
    }
}

/// Applies parameters and remaps to a parsed configuration table; returns which settings they
/// replaced, so errors in them are blamed on the parameter, not the file.
pub fn apply(table: &mut toml::Table, ros: &RosArgs) -> Result<Origins, ConfigError> {
    let mut origins = Origins::default();
    for p in &ros.params {
        let (name, value) = (&p.name, &p.value);
        if name == "config" {
            continue;
        }
        let err = |m: String| ConfigError::Invalid {
            origin: p.origin(),
            field: name.clone(),
            message: m,
        };
        let mut keys: Vec<&str> = name.split('.').collect();
        let last = keys
            .pop()
            .filter(|k| !k.is_empty())
            .ok_or_else(|| err("empty setting name".into()))?;
        let mut t = &mut *table;
        for k in keys {
            let entry = t
                .entry(k.to_string())
                .or_insert_with(|| toml::Value::Table(toml::Table::new()));
            t = entry
                .as_table_mut()
                .ok_or_else(|| err(format!("`{k}` is not a section")))?;
        }
        t.insert(last.to_string(), value.clone());
        origins.set(name, p.origin());
    }
    let needs_ros = ros.node.is_some() || ros.namespace.is_some() || !ros.remaps.is_empty();
    if needs_ros {
        let section = table
            .entry("ros")
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        let r = section.as_table_mut().ok_or_else(|| ConfigError::Invalid {
            origin: Origin::Param("__node/__ns/remap".into()),
            field: "ros".into(),
            message: "is not a section".into(),
        })?;
        if let Some(n) = &ros.node {
            r.insert("node".into(), toml::Value::String(n.clone()));
        }
        if let Some(ns) = &ros.namespace {
            r.insert("namespace".into(), toml::Value::String(ns.clone()));
        }
        if ros.node.is_some() {
            origins.set("ros.node", Origin::Param("__node".into()));
        }
        if ros.namespace.is_some() {
            origins.set("ros.namespace", Origin::Param("__ns".into()));
        }
        for (from, to) in &ros.remaps {
            let remap = Origin::Param(format!("remap {from}:={to}"));
            for (key, v) in r.iter_mut() {
                match v {
                    toml::Value::String(s) if s == from => {
                        *s = to.clone();
                        origins.set(&format!("ros.{key}"), remap.clone());
                    }
                    toml::Value::Array(items) => {
                        for (i, item) in items.iter_mut().enumerate() {
                            if item.as_str() == Some(from) {
                                *item = toml::Value::String(to.clone());
                                origins.set(&format!("ros.{key}[{i}]"), remap.clone());
                            }
                        }
                    }
                    // `ros.cameras` as a table of model camera name = topic.
                    toml::Value::Table(items) if key == "cameras" => {
                        for (name, item) in items.iter_mut() {
                            if item.as_str() == Some(from) {
                                *item = toml::Value::String(to.clone());
                                origins.set(&format!("ros.{key}.{name}"), remap.clone());
                            }
                        }
                    }
                    _ => {}
                }
            }
        }
    }
    Ok(origins)
}

/// Remaps that name no topic in the configuration (topics pi0d uses under their defaults are
/// not in the table, so they are matched against `defaults` too).
pub fn unmatched_remaps<'a>(ros: &'a RosArgs, topics: &[&str]) -> Vec<&'a (String, String)> {
    ros.remaps
        .iter()
        .filter(|(from, to)| !topics.contains(&from.as_str()) && !topics.contains(&to.as_str()))
        .collect()
}

/// The `config` parameter, if one was given.
pub fn config_path(ros: &RosArgs) -> Option<PathBuf> {
    ros.params
        .iter()
        .rev()
        .find(|p| p.name == "config")
        .and_then(|p| p.value.as_str())
        .map(PathBuf::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn when_launch_ros_appends_args_expect_them_split_and_parsed() {
        let (ours, ros) = split(s(&[
            "run",
            "--config",
            "a.toml",
            "--ros-args",
            "-r",
            "__node:=arm",
            "-r",
            "__ns:=/left",
            "-r",
            "joint_states:=/left/joint_states",
            "-p",
            "control.rate_hz:=500",
            "-p",
            "policy.prompt:=open the drawer",
        ]));
        assert_eq!(ours, s(&["run", "--config", "a.toml"]));
        let r = parse(&ros).unwrap();
        assert_eq!(r.node.as_deref(), Some("arm"));
        assert_eq!(r.namespace.as_deref(), Some("/left"));
        assert_eq!(
            r.remaps,
            vec![(
                "/joint_states".to_string(),
                "/left/joint_states".to_string()
            )]
        );
        assert_eq!(r.params[0].name, "control.rate_hz");
        assert_eq!(r.params[0].value, toml::Value::Integer(500));
        assert_eq!(
            r.params[1].value,
            toml::Value::String("open the drawer".into())
        );
    }

    #[test]
    fn when_params_applied_expect_config_table_changed_and_topics_remapped() {
        let mut t: toml::Table = "[control]\nrate_hz = 200\n[ros]\njoint_states = \"/joint_states\"\ncameras = [\"/cam\"]\n".parse().unwrap();
        let r = parse(&s(&[
            "-p",
            "control.rate_hz:=500",
            "-r",
            "/cam:=/wrist/image",
            "-r",
            "/joint_states:=/arm/joint_states",
            "-r",
            "__node:=x",
        ]))
        .unwrap();
        apply(&mut t, &r).unwrap();
        assert_eq!(t["control"]["rate_hz"].as_integer(), Some(500));
        assert_eq!(t["ros"]["joint_states"].as_str(), Some("/arm/joint_states"));
        assert_eq!(t["ros"]["cameras"][0].as_str(), Some("/wrist/image"));
        assert_eq!(t["ros"]["node"].as_str(), Some("x"));
        // Cameras by name are remapped the same way.
        let mut t: toml::Table = "[ros]\ncameras = { front = \"/cam\" }\n".parse().unwrap();
        apply(&mut t, &r).unwrap();
        assert_eq!(t["ros"]["cameras"]["front"].as_str(), Some("/wrist/image"));
    }

    #[test]
    fn when_unknown_ros_argument_expect_error_naming_it() {
        let e = parse(&s(&["--bogus"])).unwrap_err().to_string();
        assert!(e.contains("--bogus"), "{e}");
        let e = parse(&s(&["-p", "novalue"])).unwrap_err().to_string();
        assert!(e.contains("NAME:=VALUE"), "{e}");
    }
}

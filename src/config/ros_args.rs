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
pub(crate) struct Param {
    /// Dotted configuration path.
    pub(crate) name: String,
    pub(crate) value: toml::Value,
    /// The parameter file it came from (`None`: the command line).
    pub(crate) file: Option<PathBuf>,
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
    pub(crate) node: Option<String>,
    pub(crate) namespace: Option<String>,
    /// Topic remaps, absolute names.
    pub(crate) remaps: Vec<(String, String)>,
    /// Parameters in the order given (later wins).
    pub(crate) params: Vec<Param>,
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

/// Why a parameter's YAML value has no TOML form.
#[derive(Debug, thiserror::Error)]
enum ParamError {
    #[error("parameter `{name}`: {number} is out of range")]
    OutOfRange { name: String, number: String },
    #[error("parameter `{name}`: expected a number, string, boolean or list")]
    NotScalar { name: String },
    #[error("parameter name under `{prefix}` is not a string")]
    KeyNotString { prefix: String },
}

/// A YAML scalar or list as a TOML value.
fn to_toml(name: &str, v: &serde_norway::Value) -> Result<toml::Value, ParamError> {
    use serde_norway::Value as Y;
    Ok(match v {
        Y::Bool(b) => toml::Value::Boolean(*b),
        Y::Number(n) => match n.as_i64() {
            Some(i) => toml::Value::Integer(i),
            None => match n.as_f64() {
                Some(x) => toml::Value::Float(x),
                None => {
                    return Err(ParamError::OutOfRange {
                        name: name.into(),
                        number: n.to_string(),
                    })
                }
            },
        },
        Y::String(s) => toml::Value::String(s.clone()),
        Y::Sequence(items) => toml::Value::Array(
            items
                .iter()
                .map(|i| to_toml(name, i))
                .collect::<Result<_, _>>()?,
        ),
        _ => return Err(ParamError::NotScalar { name: name.into() }),
    })
}

fn flatten(
    prefix: &str,
    v: &serde_norway::Value,
    out: &mut Vec<(String, toml::Value)>,
) -> Result<(), ParamError> {
    match v {
        serde_norway::Value::Mapping(m) => {
            for (k, v) in m {
                let k = k.as_str().ok_or_else(|| ParamError::KeyNotString {
                    prefix: prefix.into(),
                })?;
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

/// Deepest nesting a parameter file may have (`/**: ros__parameters: section: key:` is 4):
/// deeper documents are refused before the YAML parser sees them (100 000 levels of
/// `{a: {a: ...}}` took it minutes).
pub(crate) const MAX_PARAMS_DEPTH: usize = 64;

/// The first line (1-based) of `text` nested deeper than `MAX_PARAMS_DEPTH`: by flow
/// brackets (`{`, `[`) outside quotes and comments, or by block indentation (leading spaces
/// and `- `, `? `, `: ` indicators, a column or more per level).
fn too_deep(text: &str) -> Option<usize> {
    let mut flow = 0usize;
    for (n, line) in text.lines().enumerate() {
        let bytes = line.as_bytes();
        let mut indent = 0;
        while indent < bytes.len() {
            match (bytes[indent], bytes.get(indent + 1)) {
                (b' ', _) => indent += 1,
                (b'-' | b'?' | b':', Some(b' ')) => indent += 2,
                _ => break,
            }
        }
        if indent > 2 * MAX_PARAMS_DEPTH {
            return Some(n + 1);
        }
        let mut quote = None;
        for &b in &bytes[indent..] {
            match (quote, b) {
                (Some(q), _) if b == q => quote = None,
                (Some(_), _) => {}
                (None, b'\'' | b'"') => quote = Some(b),
                (None, b'#') => break,
                (None, b'{' | b'[') => {
                    flow += 1;
                    if flow > MAX_PARAMS_DEPTH {
                        return Some(n + 1);
                    }
                }
                (None, b'}' | b']') => flow = flow.saturating_sub(1),
                _ => {}
            }
        }
    }
    None
}

/// Parameters for this node from a ROS parameter file: entries under `/**`, the node's name,
/// or its fully qualified name. Only a regular file is read (a FIFO would block start-up),
/// of at most `file::MAX_TEXT_BYTES`, nested at most `MAX_PARAMS_DEPTH` deep.
pub(crate) fn params_file(
    path: &Path,
    node: &str,
    namespace: &str,
) -> Result<Vec<Param>, ConfigError> {
    let file_err = |m: String| ConfigError::Parse {
        origin: Origin::File(path.to_path_buf()),
        message: m,
    };
    let text = super::file::read_text(path, super::file::MAX_TEXT_BYTES).map_err(|source| {
        ConfigError::Read {
            option: "--params-file".into(),
            file: path.to_path_buf(),
            source,
        }
    })?;
    if let Some(line) = too_deep(&text) {
        return Err(file_err(format!(
            "line {line}: nested deeper than {MAX_PARAMS_DEPTH} levels"
        )));
    }
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
            flatten("", params, &mut out).map_err(|e| file_err(e.to_string()))?;
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
                    value: to_toml(name, &y).map_err(|e| err(e.to_string()))?,
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
pub(crate) fn apply(table: &mut toml::Table, ros: &RosArgs) -> Result<Origins, ConfigError> {
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
pub(crate) fn unmatched_remaps<'a>(ros: &'a RosArgs, topics: &[&str]) -> Vec<&'a (String, String)> {
    ros.remaps
        .iter()
        .filter(|(from, to)| !topics.contains(&from.as_str()) && !topics.contains(&to.as_str()))
        .collect()
}

/// The configuration file: `--config` (`cli`), or the ROS parameter `config`, with the option
/// that named it (for messages). Both at once is refused unless they name the same file, so
/// a launch file's `config` is never silently ignored beside `--config`.
pub fn config_file(
    cli: Option<PathBuf>,
    ros: &RosArgs,
) -> Result<Option<(PathBuf, &'static str)>, ConfigError> {
    let param = ros.params.iter().rev().find(|p| p.name == "config");
    let from_param = match param {
        None => None,
        Some(p) => match p.value.as_str() {
            Some(s) if !s.is_empty() => Some(PathBuf::from(s)),
            _ => {
                return Err(err(format!(
                    "parameter `config`: expected the configuration file's path, found {}",
                    p.value
                )))
            }
        },
    };
    match (cli, from_param) {
        (Some(c), Some(p)) if c != p => Err(ConfigError::Usage(format!(
            "--config {} and the ROS parameter `config` ({}) name different files: give one",
            c.display(),
            p.display()
        ))),
        (Some(c), _) => Ok(Some((c, "--config"))),
        (None, Some(p)) => Ok(Some((p, "--ros-args parameter `config`"))),
        (None, None) => Ok(None),
    }
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

    fn params_file_with(name: &str, text: &str) -> Result<Vec<Param>, ConfigError> {
        let dir = crate::test_dirs::TempDir::new(&format!("params-{name}"));
        let f = dir.join("params.yaml");
        std::fs::write(&f, text).unwrap();
        params_file(&f, "pi0d", "/")
    }

    #[test]
    fn when_params_file_nests_deeper_than_the_bound_expect_refusal_naming_the_line() {
        let n = 100_000;
        let flow = format!(
            "/**:\n  ros__parameters:\n    x: {}1{}\n",
            "{a: ".repeat(n),
            "}".repeat(n)
        );
        let e = params_file_with("flow", &flow).unwrap_err().to_string();
        assert!(e.contains("line 3: nested deeper than 64 levels"), "{e}");
        let list = format!(
            "/**:\n  ros__parameters:\n    x: {}1{}\n",
            "[".repeat(n),
            "]".repeat(n)
        );
        assert!(params_file_with("list", &list).is_err());
        let dashes = format!(
            "/**:\n  ros__parameters:\n    x:\n      {}1\n",
            "- ".repeat(n)
        );
        let e = params_file_with("dashes", &dashes).unwrap_err().to_string();
        assert!(e.contains("line 4: nested deeper"), "{e}");
        // Brackets in quoted strings and comments are text; a usual file passes.
        let ok = "/**:\n  ros__parameters:\n    policy:\n      prompt: \"[[[[{{{{\" # [[[[\n      chunk_steps: 50\n    ros: {qos: {commands: {depth: 5}}}\n";
        let p = params_file_with("ok", &ok.replace("[[[[{{{{", &"[".repeat(200))).unwrap();
        assert_eq!(p.len(), 3, "{p:?}");
    }

    #[test]
    fn when_config_named_by_option_and_parameter_expect_conflict_refused() {
        let ros = parse(&s(&["-p", "config:=/etc/pi0d/b.toml"])).unwrap();
        let e = config_file(Some("/etc/pi0d/a.toml".into()), &ros)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("--config /etc/pi0d/a.toml and the ROS parameter `config` (/etc/pi0d/b.toml) name different files"),
            "{e}"
        );
        // The same file twice is no conflict; either alone is used, named by its option.
        let same = config_file(Some("/etc/pi0d/b.toml".into()), &ros).unwrap();
        assert_eq!(same, Some(("/etc/pi0d/b.toml".into(), "--config")));
        let param = config_file(None, &ros).unwrap().unwrap();
        assert_eq!(param.1, "--ros-args parameter `config`");
        let e = config_file(None, &parse(&s(&["-p", "config:=5"])).unwrap())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("parameter `config`: expected the configuration file's path, found 5"),
            "{e}"
        );
        assert_eq!(config_file(None, &RosArgs::default()).unwrap(), None);
    }

    #[test]
    fn when_unknown_ros_argument_expect_error_naming_it() {
        let e = parse(&s(&["--bogus"])).unwrap_err().to_string();
        assert!(e.contains("--bogus"), "{e}");
        let e = parse(&s(&["-p", "novalue"])).unwrap_err().to_string();
        assert!(e.contains("NAME:=VALUE"), "{e}");
    }
}

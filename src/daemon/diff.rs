//! Which fields of two values differ, by name, read from their pretty `Debug` forms: a reload
//! compares every section of the configuration this way, so a field added to any of them is
//! compared (and refused until it is classified) without a list here to keep up to date.

use std::collections::BTreeMap;
use std::fmt::Debug;

/// One field that differs: its path (`metrics`, `sim.cameras[1].width`), and its two values as
/// `Debug` shows them (for a nested value, its type and opening bracket).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Difference {
    pub(crate) path: String,
    pub(crate) was: String,
    pub(crate) now: String,
}

impl Difference {
    /// What happened to the field, in a word or two.
    pub(crate) fn what(&self) -> String {
        if self.was == "None" {
            "added".into()
        } else if self.now == "None" {
            "removed".into()
        } else if self.was.ends_with(['{', '[', '(']) || self.now.ends_with(['{', '[', '(']) {
            "changed".into()
        } else {
            format!("{} -> {}", short(&self.was), short(&self.now))
        }
    }
}

/// At most 80 characters of a value, for a log line.
fn short(v: &str) -> String {
    if v.chars().count() <= 80 {
        v.to_string()
    } else {
        format!("{}...", v.chars().take(77).collect::<String>())
    }
}

/// Every path in `{:#?}` of a value, with its value (leaves) or its opening text (a struct,
/// list, tuple or variant that holds more), in order.
fn entries(value: &dyn Debug) -> BTreeMap<String, String> {
    struct Open {
        path: String,
        list: bool,
        next: usize,
    }
    let text = format!("{value:#?}");
    let mut out = BTreeMap::new();
    let mut stack = vec![Open {
        path: String::new(),
        list: false,
        next: 0,
    }];
    for line in text.lines() {
        let line = line.trim();
        let body = line.strip_suffix(',').unwrap_or(line);
        if matches!(body, "}" | "]" | ")") {
            if stack.len() > 1 {
                stack.pop();
            }
            continue;
        }
        let Some(parent) = stack.last_mut() else {
            break;
        };
        // A named field (`name: value`), or an element of a list or a tuple.
        let (name, value) = match body.split_once(": ") {
            Some((n, v)) if !n.is_empty() && n.chars().all(|c| c.is_alphanumeric() || c == '_') => {
                (Some(n), v)
            }
            _ => (None, body),
        };
        let path = match (name, parent.list) {
            (Some(n), _) if parent.path.is_empty() => n.to_string(),
            (Some(n), _) => format!("{}.{n}", parent.path),
            (None, true) => {
                parent.next += 1;
                format!("{}[{}]", parent.path, parent.next - 1)
            }
            // A variant's or a tuple struct's content: the same field.
            (None, false) => parent.path.clone(),
        };
        let slot = out.entry(path.clone()).or_insert_with(String::new);
        // An empty list is a list without elements (an element added to it is "added").
        match value.strip_suffix("[]") {
            Some(open) => {
                slot.push_str(open);
                slot.push('[');
                continue;
            }
            None => slot.push_str(value),
        }
        if value.ends_with(['{', '[', '(']) {
            stack.push(Open {
                path,
                list: value.ends_with('['),
                next: 0,
            });
        }
    }
    out
}

/// The fields that differ between `a` and `b`, outermost first: where a field differs, what
/// it holds is not listed again (a section added or removed is one difference).
pub(crate) fn differences(a: &dyn Debug, b: &dyn Debug) -> Vec<Difference> {
    let (a, b) = (entries(a), entries(b));
    let mut out: Vec<Difference> = Vec::new();
    let inside = |path: &str, outer: &str| {
        outer.is_empty()
            || path
                .strip_prefix(outer)
                .is_some_and(|rest| rest.starts_with(['.', '[']))
    };
    let mut paths: Vec<&String> = a.keys().chain(b.keys()).collect();
    paths.sort();
    paths.dedup();
    for path in paths {
        if out.iter().any(|d| inside(path, &d.path)) {
            continue;
        }
        let (was, now) = (a.get(path), b.get(path));
        if was != now {
            out.push(Difference {
                path: path.clone(),
                was: was.cloned().unwrap_or_else(|| "None".into()),
                now: now.cloned().unwrap_or_else(|| "None".into()),
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    // The fields below are read through `Debug` only.
    #![allow(dead_code)]

    use super::*;

    #[derive(Debug, Clone)]
    struct Camera {
        name: String,
        width: u32,
    }

    #[derive(Debug, Clone)]
    enum Io {
        Sim,
        Ros(Topics),
    }

    #[derive(Debug, Clone)]
    struct Topics {
        joint_states: String,
    }

    #[derive(Debug, Clone)]
    struct Metrics {
        listen: String,
    }

    #[derive(Debug, Clone)]
    struct Cfg {
        rate_hz: f64,
        cameras: Vec<Camera>,
        io: Io,
        metrics: Option<Metrics>,
    }

    fn cfg() -> Cfg {
        Cfg {
            rate_hz: 200.0,
            cameras: vec![
                Camera {
                    name: "top".into(),
                    width: 224,
                },
                Camera {
                    name: "wrist: left".into(),
                    width: 224,
                },
            ],
            io: Io::Ros(Topics {
                joint_states: "/joint_states".into(),
            }),
            metrics: None,
        }
    }

    fn paths(a: &Cfg, b: &Cfg) -> Vec<(String, String)> {
        differences(a, b)
            .into_iter()
            .map(|d| (d.path.clone(), d.what()))
            .collect()
    }

    #[test]
    fn when_fields_differ_expect_each_named_once_by_its_path() {
        let a = cfg();
        assert!(differences(&a, &a.clone()).is_empty());
        let mut b = a.clone();
        b.rate_hz = 500.0;
        b.cameras[1].width = 96;
        b.io = Io::Ros(Topics {
            joint_states: "/arm/joint_states".into(),
        });
        b.metrics = Some(Metrics {
            listen: "0.0.0.0:9000".into(),
        });
        assert_eq!(
            paths(&a, &b),
            [
                ("cameras[1].width".to_string(), "224 -> 96".to_string()),
                (
                    "io.joint_states".into(),
                    "\"/joint_states\" -> \"/arm/joint_states\"".into()
                ),
                ("metrics".into(), "added".into()),
                ("rate_hz".into(), "200.0 -> 500.0".into()),
            ]
        );
    }

    #[test]
    fn when_a_variant_or_a_list_length_changes_expect_the_outer_field_only() {
        let a = cfg();
        let mut b = a.clone();
        b.io = Io::Sim;
        b.cameras.pop();
        let mut empty = a.clone();
        empty.cameras.clear();
        assert_eq!(
            paths(&empty, &a),
            [
                ("cameras[0]".to_string(), "added".to_string()),
                ("cameras[1]".into(), "added".into()),
            ]
        );
        assert_eq!(
            paths(&a, &b),
            [
                ("cameras[1]".to_string(), "removed".to_string()),
                ("io".into(), "changed".into()),
            ]
        );
        assert_eq!(paths(&b, &a)[0], ("cameras[1]".into(), "added".into()));
    }
}

//! Every numeric setting, fuzzed. The numeric leaves are found mechanically: in the bundled
//! configurations, in the settings `config/pi0d.example.toml` lists commented out, and in the
//! range table. Each is set to hostile values (0, -1, a subnormal, 1e19, ±1e308, NaN, "NaN",
//! i64::MAX) and to both ends of its range, and checked in-process: nothing panics, a value
//! outside its range is refused naming the field, any other refusal names the setting.
//! What is accepted for a simulated run is then run (in batches of several settings at once,
//! split when a batch fails): an e-stop, then the end of the run, must end in a controlled
//! way. The binary's `check` is run on a sample, the values filed as defects among them.

use crate::common;

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use pi0d::config::ranges::{self, RANGES};
use pi0d::config::ros_args::RosArgs;
use pi0d::config::Config;
use toml::Value;

use common::{root, scratch_dir, sim_config, table};

/// One step of a setting's path.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Seg {
    Key(String),
    Index(usize),
}

type Leaf = Vec<Seg>;

fn dotted(leaf: &[Seg]) -> String {
    let mut s = String::new();
    for seg in leaf {
        match seg {
            Seg::Key(k) => {
                if !s.is_empty() {
                    s.push('.');
                }
                s.push_str(k);
            }
            Seg::Index(i) => s.push_str(&format!("[{i}]")),
        }
    }
    s
}

fn key(k: &str) -> Seg {
    Seg::Key(k.to_string())
}

/// Every numeric leaf under `v`, at `path`.
fn numeric_leaves(v: &Value, path: &mut Leaf, out: &mut BTreeSet<Leaf>) {
    match v {
        Value::Integer(_) | Value::Float(_) => {
            out.insert(path.clone());
        }
        Value::Table(t) => {
            for (k, v) in t {
                path.push(key(k));
                numeric_leaves(v, path, out);
                path.pop();
            }
        }
        Value::Array(items) => {
            for (i, v) in items.iter().enumerate() {
                path.push(Seg::Index(i));
                numeric_leaves(v, path, out);
                path.pop();
            }
        }
        _ => {}
    }
}

/// `[a.b]` -> a.b; `[[a.b]]` -> a.b[0].
fn section_header(line: &str) -> Option<Leaf> {
    let line = line.trim_start_matches('#').trim();
    let line = line.split(" #").next().unwrap_or(line).trim();
    let (inner, array) = if let Some(x) = line.strip_prefix("[[").and_then(|x| x.strip_suffix("]]"))
    {
        (x, true)
    } else {
        (line.strip_prefix('[')?.strip_suffix(']')?, false)
    };
    if inner.is_empty()
        || !inner
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "_.".contains(c))
    {
        return None;
    }
    let mut leaf: Leaf = inner.split('.').map(key).collect();
    if array {
        leaf.push(Seg::Index(0));
    }
    Some(leaf)
}

/// The settings `config/pi0d.example.toml` lists commented out (`# key = value` under the
/// section header before it, commented or not), as numeric leaves.
fn commented_leaves(text: &str, out: &mut BTreeSet<Leaf>) {
    let mut section: Leaf = Vec::new();
    for line in text.lines() {
        if let Some(s) = section_header(line) {
            section = s;
            continue;
        }
        let Some(rest) = line.strip_prefix('#') else {
            continue;
        };
        let rest = rest.trim();
        let Some((k, _)) = rest.split_once('=') else {
            continue;
        };
        let k = k.trim();
        if k.is_empty() || !k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            continue;
        }
        // The value may be followed by a comment: the longest prefix that parses.
        let parsed = (0..=rest.len())
            .rev()
            .filter(|&i| rest.is_char_boundary(i))
            .find_map(|i| rest[..i].parse::<toml::Table>().ok());
        let Some(t) = parsed else {
            continue;
        };
        let mut relative = BTreeSet::new();
        numeric_leaves(&Value::Table(t), &mut Vec::new(), &mut relative);
        for rel in relative {
            // A commented sub-section (`# [policy.zenoh]`) may be followed by its parent's
            // keys: the nearest enclosing section where the key is a setting.
            let at = |n: usize| -> Leaf { section[..n].iter().chain(&rel).cloned().collect() };
            let leaf = (0..=section.len())
                .rev()
                .map(at)
                .find(|l| ranges::lookup(&dotted(&normalized(l))).is_some())
                .unwrap_or_else(|| at(section.len()));
            out.insert(leaf);
        }
    }
}

/// A range pattern (`sim.cameras[].fps`, `limits.joints.*.jerk`) made concrete.
fn from_pattern(pattern: &str) -> Leaf {
    let mut leaf = Leaf::new();
    for (i, part) in pattern.split('.').enumerate() {
        let (k, indices) = part.split_at(part.find('[').unwrap_or(part.len()));
        let k = match (k, i) {
            ("*", _) if pattern.starts_with("ros.qos") => "commands",
            // config/sim.toml sweeps the pan (reaching with the elbow).
            ("*", _) if pattern.starts_with("sim.task.sweep") => "shoulder_pan",
            ("*", _) => "elbow",
            _ => k,
        };
        leaf.push(key(k));
        for _ in 0..indices.matches("[]").count() {
            leaf.push(Seg::Index(0));
        }
    }
    leaf
}

/// Index 0 for every array and `elbow` for every joint (elements and joints are ranged
/// alike), so that every leaf fits the simulated arm.
fn normalized(leaf: &Leaf) -> Leaf {
    let joint_map = |i: usize| {
        matches!(
            (&leaf[..i], i),
            ([Seg::Key(a), Seg::Key(b)], 2) if (a == "limits" && b == "joints") || (a == "sim" && b == "initial_position")
        )
    };
    leaf.iter()
        .enumerate()
        .map(|(i, s)| match s {
            Seg::Index(_) => Seg::Index(0),
            Seg::Key(_) if joint_map(i) => key("elbow"),
            k => k.clone(),
        })
        .collect()
}

/// Every numeric leaf, found mechanically.
fn all_leaves() -> BTreeSet<Leaf> {
    let mut found = BTreeSet::new();
    let mut files: Vec<_> = ["sim", "pi0d.example", "ur5e", "aloha", "hil", "hil_task"]
        .iter()
        .map(|n| root().join(format!("config/{n}.toml")))
        .collect();
    for e in std::fs::read_dir(root().join("tests/config")).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_str().unwrap().to_string();
        if name.starts_with("valid-") && name.ends_with(".toml") {
            files.push(p);
        }
    }
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap();
        let t: toml::Table = text.parse().unwrap();
        numeric_leaves(&Value::Table(t), &mut Vec::new(), &mut found);
    }
    commented_leaves(
        &std::fs::read_to_string(root().join("config/pi0d.example.toml")).unwrap(),
        &mut found,
    );
    let mut out: BTreeSet<Leaf> = found.iter().map(normalized).collect();
    out.extend(RANGES.iter().map(|r| from_pattern(r.field)));
    out
}

/// Settings that are not ranged: the constants sent to a policy server.
fn unranged(leaf: &Leaf) -> bool {
    leaf.contains(&key("extra"))
}

/// Sets `leaf` to `v`, creating tables on the way (arrays are there already).
fn set(t: &mut toml::Table, leaf: &[Seg], v: Value) {
    let Seg::Key(first) = &leaf[0] else {
        unreachable!()
    };
    let mut cur = t
        .entry(first.clone())
        .or_insert_with(|| Value::Table(toml::Table::new()));
    for (i, seg) in leaf[1..].iter().enumerate() {
        let last = i + 2 == leaf.len();
        let next = match seg {
            Seg::Key(k) => {
                let t = cur.as_table_mut().expect("a table on the way");
                if last {
                    t.insert(k.clone(), v);
                    return;
                }
                t.entry(k.clone())
                    .or_insert_with(|| Value::Table(toml::Table::new()))
            }
            Seg::Index(i) => {
                let a = cur.as_array_mut().expect("an array on the way");
                let e = a.get_mut(*i).expect("an element");
                if last {
                    *e = v;
                    return;
                }
                e
            }
        };
        cur = next;
    }
    *cur = v;
}

fn joints() -> Value {
    Value::Array(
        [
            "shoulder_pan",
            "shoulder_lift",
            "elbow",
            "wrist_1",
            "wrist_2",
            "wrist_3",
            "gripper",
        ]
        .iter()
        .map(|j| Value::String(j.to_string()))
        .collect(),
    )
}

/// The simulated run every accepted value is tried in: scripted motion, a 20 ms joint-state
/// stall (under the timeout), an e-stop while moving, then the end of the run.
fn run_base() -> toml::Table {
    let mut t = sim_config();
    t["sim"].as_table_mut().unwrap().insert(
        "events".into(),
        Value::Array(vec![
            table(&[
                ("at_s", Value::Float(0.45)),
                ("event", Value::String("stall_joint_states".into())),
                ("duration_s", Value::Float(0.02)),
            ]),
            table(&[
                ("at_s", Value::Float(0.5)),
                ("event", Value::String("estop".into())),
            ]),
        ]),
    );
    t
}

/// Makes `leaf`'s section one that is read, in `t` (idempotent, so several settings can share
/// a run); whether such a configuration can run beside nothing but the simulator.
fn prepare(t: &mut toml::Table, leaf: &Leaf, scratch: &Path) -> bool {
    let k = |i: usize| match leaf.get(i) {
        Some(Seg::Key(k)) => k.as_str(),
        _ => "",
    };
    let policy = |t: &mut toml::Table, backend: &str, section: (&str, Value)| {
        let p = t["policy"].as_table_mut().unwrap();
        p.insert("kind".into(), Value::String("pi0".into()));
        for k in ["amplitude", "frequency_hz", "latency_s"] {
            p.remove(k);
        }
        p.insert("backend".into(), Value::String(backend.into()));
        p.entry(section.0).or_insert(section.1);
    };
    match (k(0), k(1)) {
        ("policy", "fault") => {
            t["policy"]
                .as_table_mut()
                .unwrap()
                .entry("fault")
                .or_insert(table(&[
                    ("kind", Value::String("slow".into())),
                    ("after_chunks", Value::Integer(1)),
                    ("count", Value::Integer(1)),
                    ("latency_s", Value::Float(0.01)),
                ]));
            true
        }
        ("policy", "openpi") => {
            let url = table(&[("url", Value::String("ws://127.0.0.1:9".into()))]);
            policy(t, "openpi", ("openpi", url));
            false
        }
        ("policy", "zenoh") => {
            let z = table(&[("key", Value::String("pi0d/fuzz".into()))]);
            policy(t, "zenoh", ("zenoh", z));
            false
        }
        ("policy", b @ ("onnx" | "acl")) => {
            let m = table(&[("model_dir", Value::String("graphs".into()))]);
            policy(t, b, (b, m));
            false
        }
        ("policy", "state" | "threads" | "seed") => {
            let p = t["policy"].as_table_mut().unwrap();
            p.entry("state").or_insert(joints());
            false
        }
        ("policy", "openpi_delta_actions") => {
            let p = t["policy"].as_table_mut().unwrap();
            p.entry("openpi_delta_actions")
                .or_insert(Value::Array(vec![Value::Integer(6), Value::Integer(-1)]));
            false
        }
        ("ros", _) => {
            t["robot"]["io"] = Value::String("ros".into());
            t.remove("sim");
            let ros = t
                .entry("ros")
                .or_insert_with(|| Value::Table(toml::Table::new()))
                .as_table_mut()
                .unwrap();
            if k(1) == "commands" {
                ros.entry("commands").or_insert(Value::Array(vec![table(&[
                    ("joints", joints()),
                    ("topic", Value::String("/arm/gripper_cmd".into())),
                    ("type", Value::String("joint_trajectory".into())),
                ])]));
            }
            false
        }
        ("drill", _) => {
            t.entry("drill").or_insert(Value::Array(vec![table(&[
                ("at_s", Value::Float(0.5)),
                ("event", Value::String("stall_control".into())),
                ("duration_s", Value::Float(0.05)),
            ])]));
            false
        }
        ("serve", _) => false,
        ("record", _) => {
            let dir = format!("{}/", scratch.join("record").display());
            t.entry("record")
                .or_insert(table(&[("path", Value::String(dir))]));
            true
        }
        ("control", "weighted_average_old") => {
            t["control"]["merge"] = Value::String("weighted_average".into());
            true
        }
        ("realtime", "cpu_affinity") => {
            let r = t
                .entry("realtime")
                .or_insert_with(|| Value::Table(toml::Table::new()));
            let r = r.as_table_mut().unwrap();
            if r.get("cpu_affinity")
                .and_then(Value::as_array)
                .is_none_or(|a| a.is_empty())
            {
                r.insert("cpu_affinity".into(), Value::Array(vec![Value::Integer(0)]));
            }
            true
        }
        _ => true,
    }
}

/// Hostile values, and both ends of the leaf's range.
fn values(leaf: &Leaf) -> Vec<Value> {
    let mut v = vec![
        Value::Float(0.0),
        Value::Float(-1.0),
        Value::Float(5e-324),
        Value::Float(1e19),
        Value::Float(1e308),
        Value::Float(-1e308),
        Value::Float(f64::NAN),
        Value::String("NaN".into()),
        Value::Integer(i64::MAX),
        Value::Integer(0),
        Value::Integer(-1),
    ];
    if let Some(r) = ranges::lookup(&dotted(leaf)) {
        for x in [r.min, r.max] {
            v.push(if r.integer && x < i64::MAX as f64 {
                Value::Integer(x as i64)
            } else {
                Value::Float(x)
            });
        }
    }
    v
}

fn number(v: &Value) -> Option<f64> {
    match v {
        Value::Integer(i) => Some(*i as f64),
        Value::Float(x) => Some(*x),
        _ => None,
    }
}

/// The configuration's text as `check` would read it (paths are absolute already).
fn parse(t: &toml::Table) -> Result<Config, String> {
    let text = toml::to_string(t).expect("serializes");
    let path = root().join("tests/config/fuzz.toml");
    std::panic::catch_unwind(|| Config::parse_with(&path, &text, &RosArgs::default()))
        .map_err(|p| {
            let m = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            format!("PANICKED: {m}")
        })?
        .map_err(|e| e.to_string())
}

/// One setting at one value.
#[derive(Clone, Debug)]
struct Case {
    leaf: Leaf,
    value: Value,
}

impl Case {
    fn shown(&self) -> String {
        format!("{} = {}", dotted(&self.leaf), self.value)
    }
}

#[test]
fn when_any_numeric_setting_is_found_expect_a_range_for_it() {
    let missing: Vec<String> = all_leaves()
        .iter()
        .filter(|l| !unranged(l) && ranges::lookup(&dotted(l)).is_none())
        .map(|l| dotted(l))
        .collect();
    assert!(
        missing.is_empty(),
        "numeric settings without a range: {missing:?}"
    );
}

#[test]
fn when_every_numeric_setting_is_fuzzed_expect_no_panic_named_refusals_and_controlled_stops() {
    let scratch = scratch_dir("config-fuzz");
    let leaves = all_leaves();
    assert!(
        leaves.len() > 80,
        "only {} numeric settings found",
        leaves.len()
    );
    let mut failures = Vec::new();
    let mut runnable = Vec::new();
    let (mut checked, mut refused) = (0, 0);
    for leaf in &leaves {
        let field = dotted(leaf);
        let range = ranges::lookup(&field);
        let last = match leaf.iter().rev().find(|s| matches!(s, Seg::Key(_))) {
            Some(Seg::Key(k)) => k.clone(),
            _ => unreachable!(),
        };
        for value in values(leaf) {
            let mut t = run_base();
            let runs = prepare(&mut t, leaf, &scratch);
            set(&mut t, leaf, value.clone());
            let case = Case {
                leaf: leaf.clone(),
                value,
            };
            checked += 1;
            match parse(&t) {
                Err(e) if e.starts_with("PANICKED") => {
                    failures.push(format!("{}: {e}", case.shown()))
                }
                Err(e) => {
                    refused += 1;
                    let outside = match (range, number(&case.value)) {
                        (Some(r), Some(x)) => !r.contains(x),
                        _ => false,
                    };
                    // Outside its range: refused by the range, naming the field exactly.
                    let named = if outside {
                        e.contains(&format!("`{field}`: expected"))
                    } else {
                        e.contains(&last)
                    };
                    if !named {
                        failures.push(format!("{}: refused without naming it: {e}", case.shown()));
                    }
                }
                Ok(_) => {
                    if let (Some(r), Some(x)) = (range, number(&case.value)) {
                        if !r.contains(x) {
                            failures.push(format!("{}: accepted outside {r:?}", case.shown()));
                        }
                    }
                    if runs {
                        runnable.push(case);
                    }
                }
            }
        }
    }
    eprintln!(
        "{} settings, {checked} values checked, {refused} refused, {} accepted to run",
        leaves.len(),
        runnable.len()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // Runs of several accepted values at once; a batch that does not end well is split until
    // the value (or the pair) that breaks it is found.
    let mut pending: Vec<Vec<Case>> = Vec::new();
    while !runnable.is_empty() {
        // Up to 12 cases of different settings.
        let mut batch: Vec<Case> = Vec::new();
        runnable.retain(|c| {
            let take = batch.len() < 12 && batch.iter().all(|b| b.leaf != c.leaf);
            if take {
                batch.push(c.clone());
            }
            !take
        });
        pending.push(batch);
    }
    let mut runs = 0;
    while let Some(batch) = pending.pop() {
        let mut t = run_base();
        for c in &batch {
            prepare(&mut t, &c.leaf, &scratch);
        }
        for c in &batch {
            set(&mut t, &c.leaf, c.value.clone());
        }
        let split = |pending: &mut Vec<Vec<Case>>, batch: &[Case]| {
            let (a, b) = batch.split_at(batch.len() / 2);
            pending.push(a.to_vec());
            pending.push(b.to_vec());
        };
        if parse(&t).is_err() {
            // Values each accepted, refused together (a cross-check between them).
            assert!(batch.len() > 1, "{} alone is accepted", batch[0].shown());
            split(&mut pending, &batch);
            continue;
        }
        runs += 1;
        // Killed (no code) if it has not ended 20 s after it should have: a stop that never
        // comes to rest.
        let run = common::run_daemon_killed_after(
            "config-fuzz-run",
            &t,
            1.0,
            &["--quiet"],
            Duration::from_secs(20),
        );
        let (code, stderr) = (run.output.status.code(), &run.stderr);
        let violations = run
            .summary
            .as_ref()
            .map_or(0, |s| s["limit_violations"].as_u64().unwrap_or(0));
        // Clean, or a start refused (the arm never moved): a controlled end either way.
        let controlled = code.is_some_and(|c| [0, 3, 4, 8].contains(&c))
            && !stderr.contains("panicked")
            && violations == 0;
        if controlled {
            continue;
        }
        if batch.len() > 1 {
            split(&mut pending, &batch);
            continue;
        }
        let tail: Vec<&str> = stderr.lines().rev().take(6).collect();
        failures.push(format!(
            "{}: exit {code:?}, {violations} limit violations: {}",
            batch[0].shown(),
            tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
        ));
    }
    eprintln!("{runs} runs");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The binary's `check` on the values filed as defects and a few more: exit 1 naming the
/// field, never a panic.
#[test]
fn when_check_is_given_hostile_values_expect_exit_1_naming_the_field() {
    let dir = scratch_dir("config-fuzz-check");
    let cases: [(&str, &str, Value); 7] = [
        ("limits", "jerk", Value::Float(1e19)),
        ("control", "stop_timeout_s", Value::Float(1e308)),
        ("control", "stop_timeout_s", Value::Float(5e-324)),
        ("policy", "latency_s", Value::Float(1e308)),
        ("sim", "rate_hz", Value::Float(f64::NAN)),
        ("control", "warmup_chunks", Value::Integer(i64::MAX)),
        ("safety", "camera_timeout_s", Value::String("NaN".into())),
    ];
    for (section, field, value) in cases {
        let mut t = sim_config();
        t[section]
            .as_table_mut()
            .unwrap()
            .insert(field.into(), value.clone());
        let path = dir.join("config.toml");
        std::fs::write(&path, toml::to_string(&t).unwrap()).unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_pi0d"))
            .args(["check", "--config"])
            .arg(&path)
            .output()
            .unwrap();
        let e = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            out.status.code(),
            Some(1),
            "{section}.{field} = {value}: {e}"
        );
        assert!(!e.contains("panicked"), "{e}");
        assert!(e.contains(&format!("`{section}.{field}`")), "{e}");
    }
    // `policy.fault.latency_s` used to pass `check` and panic the policy later.
    let mut t = sim_config();
    t["policy"].as_table_mut().unwrap().insert(
        "fault".into(),
        table(&[
            ("kind", Value::String("slow".into())),
            ("latency_s", Value::Float(1e308)),
        ]),
    );
    let (code, text) = common::check_config("config-fuzz-fault", &t);
    assert_eq!(code, Some(1), "{text}");
    assert!(
        text.contains("`policy.fault.latency_s`: expected 0..60 s, found 1e308"),
        "{text}"
    );
}

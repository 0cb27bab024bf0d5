//! Helpers for the edge tests (`tests/edges.rs`, `tests/exit_codes.rs`): scenario
//! configurations with simulator events, exit assertions, `check` runs.

use std::process::ExitStatus;

use super::procs::*;
use super::*;
use serde_json::Value as Json;
use toml::Value;

pub fn sim_events(mut cfg: toml::Table, events: Vec<Value>) -> toml::Table {
    cfg["sim"]
        .as_table_mut()
        .unwrap()
        .insert("events".into(), Value::Array(events));
    cfg
}

pub fn event(at_s: f64, kind: &str, extra: &[(&str, Value)]) -> Value {
    let mut pairs = vec![
        ("at_s", Value::Float(at_s)),
        ("event", Value::String(kind.into())),
    ];
    pairs.extend(extra.iter().cloned());
    table(&pairs)
}

pub fn set(cfg: &mut toml::Table, section: &str, key: &str, v: Value) {
    cfg.entry(section)
        .or_insert_with(|| Value::Table(toml::Table::new()))
        .as_table_mut()
        .unwrap()
        .insert(key.into(), v);
}

/// The exit code is `code` and, where a summary was written, it says the same by name.
pub fn assert_exit(
    status: ExitStatus,
    summary: Option<&Json>,
    code: i32,
    name: &str,
    stderr: &str,
) {
    assert_eq!(status.code(), Some(code), "{status}; stderr:\n{stderr}");
    if let Some(s) = summary {
        assert_eq!(s["exit"], name, "{s}");
        assert_eq!(s["exit_code"], code, "{s}");
    }
}

pub fn no_panic(stderr: &str) {
    assert!(
        !stderr.contains("panicked"),
        "a panic reached stderr:\n{stderr}"
    );
}

/// `pi0d check --config CFG`, as written in a scratch dir.
pub fn check(name: &str, cfg: &toml::Table) -> (ExitStatus, String) {
    let dir = scratch_dir(name);
    let out = pi0d()
        .arg("check")
        .arg("--config")
        .arg(write_config(&dir, cfg))
        .output()
        .unwrap();
    (
        out.status,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A run watched while it goes; starts once SERIAL is held by the caller.
pub fn start_run(name: &str, cfg: &toml::Table, duration_s: f64) -> (Watched, super::TempDir) {
    let dir = scratch_dir(name);
    (Watched::start(run_command(&dir, cfg, duration_s)), dir)
}

pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

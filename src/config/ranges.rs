//! The range of every numeric setting, in one table: its dotted path, the least and the greatest
//! value accepted and the unit. `check` walks the configuration as written (after `--ros-args`
//! parameters) and refuses every number outside its range before anything else reads it, so
//! no value reaches a `Duration`, a deadline or the governor's arithmetic that it cannot take
//! (a 1e308 s timeout, a 1e19 rad/s³ jerk, a subnormal rate). The section validators keep only
//! what depends on other settings (a blend window of two control periods, a horizon below the
//! chunk length, a stop timeout the brakes can meet).
//!
//! Paths: `*` stands for a name (a joint, a camera, a QoS kind), `[]` for an index.
//! `policy.openpi.extra` holds constants sent to the server as they are (finite numbers, no
//! unit); it is not in the table. `pi0d serve`'s numeric options parse through the same
//! ranges (`Range::parse`): those of `[serve]` settings and of `control.rtc.max_guidance_weight`,
//! and `SERVE_BATCH_WINDOW_MS`, an option with no setting.

use super::check::Check;
use super::ConfigError;

/// One numeric setting's accepted range, both ends included.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Range {
    pub field: &'static str,
    pub min: f64,
    pub max: f64,
    /// For people: `s`, `Hz`, `rad/s (m/s)`; empty for a plain count or fraction.
    pub(crate) unit: &'static str,
    /// Written as an integer (counts, ids, priorities).
    pub integer: bool,
}

impl Range {
    pub fn contains(&self, x: f64) -> bool {
        // NaN fails both comparisons.
        x >= self.min && x <= self.max
    }

    /// `expected 0.01..1e6 rad/s³, found 1e19`.
    pub(crate) fn expected(&self, found: &str) -> String {
        let unit = if self.unit.is_empty() {
            String::new()
        } else {
            format!(" {}", self.unit)
        };
        let what = if self.integer { "an integer " } else { "" };
        format!(
            "expected {what}{}..{}{unit}, found {found}",
            number(self.min),
            number(self.max)
        )
    }
}

/// A value outside a setting's range, or not a number (a command-line option's value).
#[derive(Debug, thiserror::Error)]
#[error("{}", range.expected(found))]
pub struct OutOfRange {
    pub(crate) range: Range,
    /// The value as given, quoted.
    pub(crate) found: String,
}

impl Range {
    /// A command-line value of this setting; the error says the range expected.
    pub fn parse(&self, s: &str) -> Result<f64, OutOfRange> {
        match s.trim().parse::<f64>() {
            Ok(x) if self.contains(x) && (!self.integer || x.fract() == 0.0) => Ok(x),
            _ => Err(OutOfRange {
                range: *self,
                found: format!("\"{s}\""),
            }),
        }
    }
}

const fn real(field: &'static str, min: f64, max: f64, unit: &'static str) -> Range {
    Range {
        field,
        min,
        max,
        unit,
        integer: false,
    }
}

const fn int(field: &'static str, min: f64, max: f64, unit: &'static str) -> Range {
    Range {
        field,
        min,
        max,
        unit,
        integer: true,
    }
}

/// Joint positions and position bounds (rad, or m for a prismatic joint): 1000 rad is 159
/// turns, 1000 m no arm's stroke.
pub(crate) const POSITION: f64 = 1e3;
/// Velocity limits: no arm joint or gripper moves 100 rad/s (955 rpm) or 100 m/s.
pub(crate) const VELOCITY: (f64, f64) = (1e-3, 1e2);
pub(crate) const ACCELERATION: (f64, f64) = (1e-3, 1e4);
/// Jerk limits: above 1e6 rad/s³ the limit no longer bounds anything a control tick can see,
/// and the braking arithmetic loses its precision (1e19 crept instead of stopping).
pub(crate) const JERK: (f64, f64) = (1e-2, 1e6);
/// URDF `<limit effort>` (N or N·m); 0 is allowed: pi0d commands positions.
pub(crate) const EFFORT: (f64, f64) = (0.0, 1e6);
/// URDF `<safety_controller k_position>` (1/s) and `k_velocity`.
pub(crate) const K_POSITION: (f64, f64) = (1e-3, 1e4);
pub(crate) const K_VELOCITY: (f64, f64) = (0.0, 1e6);

const POS: &str = "rad (m)";
const VEL: &str = "rad/s (m/s)";
const ACC: &str = "rad/s² (m/s²)";
const JRK: &str = "rad/s³ (m/s³)";

/// Real-time chunking's guidance cap (lerobot's `max_guidance_weight`); also `pi0d serve
/// --rtc-max-guidance`.
pub const RTC_MAX_GUIDANCE: Range = real("control.rtc.max_guidance_weight", 0.01, 1000.0, "");
/// Requests that may wait for `pi0d serve`'s model.
pub const SERVE_QUEUE: Range = int("serve.queue", 1.0, 1024.0, "requests");
pub const SERVE_MAX_REQUEST_MIB: Range = int("serve.max_request_mib", 1.0, 1024.0, "MiB");
/// A `pi0d serve` client must finish its HTTP request or websocket handshake within this.
pub const SERVE_HANDSHAKE_TIMEOUT_S: Range = real("serve.handshake_timeout_s", 0.1, 60.0, "s");
/// A `pi0d serve` session without a request for this long is closed.
pub const SERVE_IDLE_TIMEOUT_S: Range = real("serve.idle_timeout_s", 0.1, 86_400.0, "s");
/// `pi0d serve --batch-window-ms`: how long a request waits for others to batch with. An
/// option only, with no setting: not in `RANGES`.
pub const SERVE_BATCH_WINDOW_MS: Range = real("pi0d serve --batch-window-ms", 0.0, 1000.0, "ms");

/// Every numeric setting but `policy.openpi.extra`'s, section by section.
pub const RANGES: &[Range] = &[
    // [limits]
    real("limits.scale", 0.01, 1.0, ""),
    real("limits.acceleration", ACCELERATION.0, ACCELERATION.1, ACC),
    real("limits.jerk", JERK.0, JERK.1, JRK),
    real("limits.position_margin", 0.0, 100.0, POS),
    real("limits.max_step", 1e-4, POSITION, POS),
    real("limits.joints.*.lower", -POSITION, POSITION, POS),
    real("limits.joints.*.upper", -POSITION, POSITION, POS),
    real("limits.joints.*.velocity", VELOCITY.0, VELOCITY.1, VEL),
    real(
        "limits.joints.*.acceleration",
        ACCELERATION.0,
        ACCELERATION.1,
        ACC,
    ),
    real("limits.joints.*.jerk", JERK.0, JERK.1, JRK),
    real("limits.joints.*.position_margin", 0.0, 100.0, POS),
    real("limits.joints.*.max_step", 1e-4, POSITION, POS),
    // [workspace]
    real("workspace.min[]", -100.0, 100.0, "m"),
    real("workspace.max[]", -100.0, 100.0, "m"),
    // [control]
    real("control.rate_hz", 10.0, 1000.0, "Hz"),
    real("control.blend_window_s", 0.002, 10.0, "s"),
    real("control.weighted_average_old", 0.0, 1.0, ""),
    real("control.request_threshold_s", 0.0, 60.0, "s"),
    int("control.warmup_chunks", 0.0, 1000.0, "chunks"),
    real("control.status_interval_s", 0.05, 3600.0, "s"),
    real("control.stop_timeout_s", 0.01, 600.0, "s"),
    real("control.start_timeout_s", 0.1, 3600.0, "s"),
    RTC_MAX_GUIDANCE,
    int("control.rtc.execution_horizon", 1.0, 999.0, "steps"),
    int("control.rtc.inference_delay_steps", 0.0, 999.0, "steps"),
    // [safety]
    real("safety.joint_state_timeout_s", 0.001, 10.0, "s"),
    real("safety.camera_timeout_s", 0.001, 60.0, "s"),
    int("safety.overrun_streak", 1.0, 100_000.0, "ticks"),
    real("safety.chunk_position_tolerance", 0.0, 100.0, POS),
    real("safety.measured_position_tolerance", 0.0, 100.0, POS),
    real(
        "safety.chunk_step_velocity_factor",
        1.0,
        100.0,
        "x velocity limit",
    ),
    // [policy]
    int("policy.chunk_steps", 2.0, 1000.0, "steps"),
    real("policy.step_period_s", 0.001, 1.0, "s"),
    real("policy.latency_s", 0.0, 60.0, "s"),
    real("policy.amplitude", 0.0, 100.0, POS),
    real("policy.frequency_hz", 0.0, 5.0, "Hz"),
    int("policy.threads", 1.0, 256.0, "threads"),
    int("policy.seed", 0.0, u64::MAX as f64, ""),
    real("policy.state[]", -POSITION, POSITION, POS),
    // openpi's make_bool_mask counts: delta (positive) or absolute (negative) actions.
    int("policy.openpi_delta_actions[]", -64.0, 64.0, "actions"),
    int("policy.onnx.device_id", 0.0, 255.0, ""),
    int(
        "policy.onnx.threads",
        0.0,
        256.0,
        "threads (0: the runtime's default)",
    ),
    int("policy.acl.device_id", 0.0, 255.0, ""),
    real("policy.openpi.connect_timeout_s", 0.05, 60.0, "s"),
    real("policy.openpi.request_timeout_s", 0.05, 60.0, "s"),
    real("policy.openpi.reconnect_initial_s", 0.01, 60.0, "s"),
    real("policy.openpi.reconnect_max_s", 0.01, 600.0, "s"),
    int(
        "policy.openpi.image_size",
        0.0,
        4096.0,
        "px (0: as captured)",
    ),
    int("policy.openpi.action_dim", 1.0, 32.0, "columns"),
    int("policy.openpi.max_reply_mib", 1.0, 1024.0, "MiB"),
    real("policy.zenoh.connect_timeout_s", 0.05, 60.0, "s"),
    real("policy.zenoh.request_timeout_s", 0.05, 60.0, "s"),
    real("policy.zenoh.reconnect_initial_s", 0.01, 60.0, "s"),
    real("policy.zenoh.reconnect_max_s", 0.01, 600.0, "s"),
    int(
        "policy.zenoh.image_size",
        0.0,
        4096.0,
        "px (0: as captured)",
    ),
    int("policy.zenoh.action_dim", 1.0, 32.0, "columns"),
    int("policy.zenoh.max_reply_mib", 1.0, 1024.0, "MiB"),
    int("policy.fault.after_chunks", 0.0, 1e6, "chunks"),
    int("policy.fault.count", 0.0, 1e6, "chunks (0: forever)"),
    real("policy.fault.latency_s", 0.0, 60.0, "s"),
    // [sim]
    real("sim.tau_s", 0.001, 10.0, "s"),
    real("sim.measurement_delay_s", 0.0, 1.0, "s"),
    real("sim.rate_hz", 10.0, 5000.0, "Hz"),
    real("sim.initial_position.*", -POSITION, POSITION, POS),
    int("sim.cameras[].width", 1.0, 4096.0, "px"),
    int("sim.cameras[].height", 1.0, 4096.0, "px"),
    real("sim.cameras[].fps", 0.5, 240.0, "Hz"),
    real("sim.events[].at_s", 0.0, 1e6, "s"),
    real("sim.events[].duration_s", 0.0, 3600.0, "s"),
    int("sim.task.seed", 0.0, u64::MAX as f64, ""),
    real("sim.task.reach.*[]", -POSITION, POSITION, POS),
    real("sim.task.sweep.*[]", -POSITION, POSITION, POS),
    real("sim.task.radius_m", 0.001, 1.0, "m"),
    real("sim.task.hold_s", 0.0, 60.0, "s"),
    real("sim.task.timeout_s", 0.1, 3600.0, "s"),
    real("sim.task.view_min[]", -100.0, 100.0, "m"),
    real("sim.task.view_max[]", -100.0, 100.0, "m"),
    // [ros]
    int("ros.domain_id", 0.0, 232.0, ""),
    real("ros.trajectory_coast_s", 0.01, 1.0, "s"),
    int("ros.max_image_bytes", 1.0, (1u64 << 30) as f64, "bytes"),
    real("ros.commands[].rate_hz", 0.1, 1000.0, "Hz"),
    real("ros.commands[].max_effort", 1e-3, EFFORT.1, "N (N·m)"),
    int("ros.qos.*.depth", 1.0, 1000.0, "messages"),
    // [realtime]
    int("realtime.priority", 0.0, 99.0, "(0: off)"),
    int("realtime.io_priority", 0.0, 99.0, "(0: off)"),
    int("realtime.cpu_affinity[]", 0.0, 1023.0, ""),
    real("realtime.spin_us", 0.0, 25_000.0, "µs"),
    // At most one control period too (realtime.rs); -1: not asked.
    int(
        "realtime.cpu_latency_us",
        -1.0,
        100_000.0,
        "µs (-1: not asked)",
    ),
    // [record]
    real("record.max_megabytes", 0.1, 1e7, "MB"),
    real("record.max_duration_s", 0.1, 1e7, "s"),
    real("record.camera_hz", 0.0, 60.0, "Hz (0: no frames)"),
    // [[drill]]
    real("drill[].at_s", 0.0, 1e6, "s"),
    real("drill[].duration_s", 0.001, 3600.0, "s"),
    // [serve] (`pi0d serve --config`; its options of the same names parse through these)
    SERVE_QUEUE,
    SERVE_MAX_REQUEST_MIB,
    SERVE_HANDSHAKE_TIMEOUT_S,
    SERVE_IDLE_TIMEOUT_S,
];

/// One step of a concrete path: a key, or an index into an array.
#[derive(Clone, Copy, Debug)]
enum Step<'a> {
    Key(&'a str),
    Index(usize),
}

/// Whether `pattern` (`sim.cameras[].fps`) names the setting at `path`.
fn matches(pattern: &str, path: &[Step]) -> bool {
    let mut at = 0;
    for part in pattern.split('.') {
        let (key, indices) = match part.find('[') {
            Some(i) => (&part[..i], part[i..].matches("[]").count()),
            None => (part, 0),
        };
        match path.get(at) {
            Some(Step::Key(k)) if key == "*" || key == *k => at += 1,
            _ => return false,
        }
        for _ in 0..indices {
            match path.get(at) {
                Some(Step::Index(_)) => at += 1,
                _ => return false,
            }
        }
    }
    at == path.len()
}

/// The range of the setting at `path`, if it has one.
fn range_of(path: &[Step]) -> Option<&'static Range> {
    RANGES.iter().find(|r| matches(r.field, path))
}

/// The range of the setting at `field` as messages name it (`sim.cameras[0].fps`,
/// `limits.joints.elbow.jerk`), if it has one.
pub fn lookup(field: &str) -> Option<&'static Range> {
    let mut path = Vec::new();
    for part in field.split('.') {
        let (key, indices) = part.split_at(part.find('[').unwrap_or(part.len()));
        path.push(Step::Key(key));
        for index in indices.split('[').skip(1) {
            path.push(Step::Index(index.strip_suffix(']')?.parse().ok()?));
        }
    }
    range_of(&path)
}

/// The range of `pattern` (a `RANGES` field), for validators that check a value from
/// elsewhere (the URDF) against a setting's range.
pub(crate) fn range(pattern: &str) -> &'static Range {
    RANGES
        .iter()
        .find(|r| r.field == pattern)
        .unwrap_or_else(|| panic!("`{pattern}` is in RANGES"))
}

/// `limits.joints.elbow.velocity`, `sim.cameras[0].fps`.
fn dotted(path: &[Step]) -> String {
    let mut s = String::new();
    for step in path {
        match step {
            Step::Key(k) => {
                if !s.is_empty() {
                    s.push('.');
                }
                s.push_str(k);
            }
            Step::Index(i) => s.push_str(&format!("[{i}]")),
        }
    }
    s
}

/// A number for messages: plain where that is short, else in exponent form (1e19, 5e-324).
/// The range table as Markdown rows (`docs/config-ranges.md` holds exactly these).
#[cfg(test)]
pub(crate) fn markdown_rows() -> String {
    RANGES
        .iter()
        .map(|r| {
            format!(
                "| `{}` | {} | {} | {}{} |\n",
                r.field,
                number(r.min),
                number(r.max),
                r.unit,
                if r.integer { " (integer)" } else { "" }
            )
        })
        .collect()
}

pub(crate) fn number(x: f64) -> String {
    if x != 0.0 && x.is_finite() && !(1e-4..1e6).contains(&x.abs()) {
        format!("{x:e}")
    } else {
        format!("{x}")
    }
}

/// Refuses the first number in `table` outside its setting's range, naming the setting (and
/// the parameter that set it, if one did).
pub(crate) fn check(c: &Check, table: &toml::Table) -> Result<(), ConfigError> {
    let mut path = Vec::new();
    for (k, v) in table {
        path.push(Step::Key(k));
        walk(c, v, &mut path)?;
        path.pop();
    }
    Ok(())
}

fn walk<'a>(c: &Check, v: &'a toml::Value, path: &mut Vec<Step<'a>>) -> Result<(), ConfigError> {
    let (x, shown) = match v {
        toml::Value::Integer(i) => (*i as f64, i.to_string()),
        toml::Value::Float(x) => (*x, number(*x)),
        toml::Value::Table(t) => {
            for (k, v) in t {
                path.push(Step::Key(k));
                walk(c, v, path)?;
                path.pop();
            }
            return Ok(());
        }
        toml::Value::Array(items) => {
            for (i, v) in items.iter().enumerate() {
                path.push(Step::Index(i));
                walk(c, v, path)?;
                path.pop();
            }
            return Ok(());
        }
        _ => return Ok(()),
    };
    match range_of(path) {
        Some(r) if !r.contains(x) => c.fail(&dotted(path), r.expected(&shown)),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    /// The documented table is the one `check` applies: regenerate it with
    /// `PI0D_BLESS=1 cargo test --lib config::ranges` after changing a range.
    #[test]
    fn when_docs_list_the_ranges_expect_exactly_the_table_check_applies() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/config-ranges.md");
        let doc = std::fs::read_to_string(path).unwrap_or_default();
        let rows = markdown_rows();
        let start = doc.find("| `").unwrap_or(doc.len());
        let table = &doc[start..];
        if std::env::var_os("PI0D_BLESS").is_some() {
            let head = if start < doc.len() { &doc[..start] } else { "" };
            std::fs::write(path, format!("{head}{rows}")).unwrap();
            return;
        }
        assert_eq!(
            table, rows,
            "docs/config-ranges.md is stale: PI0D_BLESS=1 rewrites it"
        );
    }

    use super::*;
    use crate::config::Origins;
    use std::path::Path;

    fn refused(text: &str) -> Option<String> {
        let table: toml::Table = text.parse().unwrap();
        let origins = Origins::default();
        let c = Check::new(Path::new("c.toml"), &origins);
        check(&c, &table).err().map(|e| e.to_string())
    }

    #[test]
    fn when_values_outside_their_range_expect_field_range_and_unit_named() {
        assert_eq!(
            refused("[limits]\njerk = 1e19\n").as_deref(),
            Some("c.toml: `limits.jerk`: expected 0.01..1e6 rad/s³ (m/s³), found 1e19")
        );
        assert_eq!(
            refused("[control]\nstop_timeout_s = 5e-324\n").as_deref(),
            Some("c.toml: `control.stop_timeout_s`: expected 0.01..600 s, found 5e-324")
        );
        let e = refused("[limits.joints.elbow]\nvelocity = nan\n").unwrap();
        assert!(e.contains("`limits.joints.elbow.velocity`"), "{e}");
        assert!(e.contains("found NaN"), "{e}");
        let e = refused("[sim]\ncameras = [{ name = \"a\" }, { name = \"b\", fps = 1e308 }]\n");
        assert!(
            e.as_deref().unwrap().contains("`sim.cameras[1].fps`"),
            "{e:?}"
        );
        let e = refused("[ros]\ndomain_id = 9223372036854775807\n").unwrap();
        assert!(
            e.contains("expected an integer 0..232, found 9223372036854775807"),
            "{e}"
        );
        let e = refused("[workspace]\nmin = [0, -1e308, 0]\n").unwrap();
        assert!(e.contains("`workspace.min[1]`"), "{e}");
        let e = refused("[ros.qos.cameras]\ndepth = 0\n").unwrap();
        assert!(e.contains("`ros.qos.cameras.depth`"), "{e}");
        let e = refused("[[drill]]\nat_s = -1\n").unwrap();
        assert!(e.contains("`drill[0].at_s`"), "{e}");
    }

    #[test]
    fn when_serve_settings_are_outside_their_range_expect_them_refused_by_the_table() {
        let e = refused("[serve]\nqueue = 0\n").unwrap();
        assert!(
            e.contains("`serve.queue`: expected an integer 1..1024 requests, found 0"),
            "{e}"
        );
        let e = refused("[serve]\nidle_timeout_s = nan\n").unwrap();
        assert!(e.contains("`serve.idle_timeout_s`"), "{e}");
    }

    #[test]
    fn when_an_option_value_is_parsed_expect_its_range_or_an_error_naming_it() {
        for bad in [
            "nan", "NaN", "inf", "-inf", "0", "0.005", "-1", "1000.5", "x", "",
        ] {
            let e = RTC_MAX_GUIDANCE.parse(bad).unwrap_err().to_string();
            assert_eq!(e, format!("expected 0.01..1000, found \"{bad}\""));
        }
        assert_eq!(RTC_MAX_GUIDANCE.parse("1000").unwrap(), 1000.0);
        assert_eq!(RTC_MAX_GUIDANCE.parse(" 0.5").unwrap(), 0.5);
        for bad in ["nan", "inf", "-0.1", "1001"] {
            let e = SERVE_BATCH_WINDOW_MS.parse(bad).unwrap_err().to_string();
            assert!(e.contains("expected 0..1000 ms"), "{bad}: {e}");
        }
        assert_eq!(SERVE_BATCH_WINDOW_MS.parse("0").unwrap(), 0.0);
        for bad in ["0", "0.05", "nan", "61"] {
            assert!(SERVE_HANDSHAKE_TIMEOUT_S.parse(bad).is_err(), "{bad}");
        }
        for bad in ["0", "inf", "86401"] {
            assert!(SERVE_IDLE_TIMEOUT_S.parse(bad).is_err(), "{bad}");
        }
        assert!(SERVE_QUEUE.parse("1.5").is_err());
        assert!(SERVE_QUEUE.parse("1025").is_err());
        assert_eq!(SERVE_QUEUE.parse("8").unwrap(), 8.0);
        use crate::config::serve::{DEFAULT_HANDSHAKE_TIMEOUT_S, DEFAULT_IDLE_TIMEOUT_S};
        assert!(SERVE_IDLE_TIMEOUT_S.contains(DEFAULT_IDLE_TIMEOUT_S));
        assert!(SERVE_HANDSHAKE_TIMEOUT_S.contains(DEFAULT_HANDSHAKE_TIMEOUT_S));
    }

    #[test]
    fn when_field_looked_up_expect_its_pattern_range() {
        assert_eq!(
            lookup("sim.cameras[3].fps").unwrap().field,
            "sim.cameras[].fps"
        );
        assert_eq!(
            lookup("limits.joints.elbow.jerk").unwrap().field,
            "limits.joints.*.jerk"
        );
        assert_eq!(lookup("limits.jerk").unwrap().max, JERK.1);
        assert!(lookup("policy.openpi.extra.flag").is_none());
        assert!(lookup("sim.cameras.fps").is_none());
    }

    #[test]
    fn when_values_inside_their_range_or_unranged_expect_no_refusal() {
        assert_eq!(
            refused("[limits]\njerk = 1e6\nscale = 0.01\n[control]\nrate_hz = 200\n"),
            None
        );
        // Constants sent to the server.
        assert_eq!(
            refused("[policy.openpi.extra]\nflag = 1e308\n[serve]\nqueue = 8\n"),
            None
        );
        // A string where a number belongs is left to the type check, which names the field.
        assert_eq!(refused("[limits]\njerk = \"NaN\"\n"), None);
    }

    #[test]
    fn when_ranges_listed_expect_sane_bounds_and_one_entry_per_field() {
        for (i, r) in RANGES.iter().enumerate() {
            assert!(
                r.min <= r.max && r.min.is_finite() && r.max.is_finite(),
                "{r:?}"
            );
            assert!(
                RANGES[..i].iter().all(|o| o.field != r.field),
                "{} twice",
                r.field
            );
            // Every timeout and period converts to a Duration and a deadline without overflow.
            if r.unit == "s" {
                let _ = std::time::Duration::from_secs_f64(r.max);
                let now = crate::time::MonoTime::now();
                assert!(now.offset_seconds(r.max) >= now);
            }
        }
    }
}

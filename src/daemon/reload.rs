//! SIGHUP: the configuration file is read again and what can change safely while the arm runs
//! is applied: the prompt, the status line's interval, and limits that are only tighter
//! (applied at rest: a running arm holds first, then resumes with a fresh chunk). Every other
//! field of every section is compared too: a change there is refused with a log line naming
//! the field (a section added or removed: "restart pi0d to apply it"); the running
//! configuration stays.
//!
//! The file, and the URDF it names, are read only when they are regular files (opened without
//! blocking, checked on the open file, size-capped), and on a thread of their own: a file that
//! would block its reader (a FIFO, a hung network mount) cannot stop the supervisor's status
//! lines, signals or watchdogs. The supervisor takes the result when it is there.

use std::path::{Path, PathBuf};
use std::sync::mpsc::{sync_channel, Receiver, TryRecvError};
use std::sync::Arc;

use crate::config::ros_args::RosArgs;
use crate::config::{Config, ConfigError};
use crate::io::Blackboard;
use crate::joints::JointVector;
use crate::robot::urdf::UrdfError;
use crate::robot::{JointLimits, RobotLimits};
use crate::time::MonoTime;

use super::diff::{differences, Difference};
use super::exit::error_chain;

/// The largest configuration file read (they are a few kilobytes).
const MAX_CONFIG_BYTES: u64 = 4 << 20;

/// A configuration file that does not load.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("{file}: cannot read it")]
    Read {
        file: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The URDF the configuration names, with the field that names it.
    #[error("{config}: `robot.urdf`")]
    Urdf {
        config: PathBuf,
        #[source]
        source: UrdfError,
    },
    #[error(transparent)]
    Config(ConfigError),
    #[error("the reload thread ended without a result (it panicked)")]
    Died,
}

impl LoadError {
    /// `e`, from loading the configuration `file`: a URDF's error names the file and field.
    pub fn of_config(file: &Path, e: ConfigError) -> LoadError {
        match e {
            ConfigError::Urdf(source) => LoadError::Urdf {
                config: file.to_path_buf(),
                source,
            },
            e => LoadError::Config(e),
        }
    }

    /// The command line itself is malformed (not a file's content).
    pub fn is_usage(&self) -> bool {
        matches!(self, LoadError::Config(ConfigError::Usage(_)))
    }
}

/// What the reload thread hands the supervisor.
pub(crate) type Loaded = Result<Config, LoadError>;

/// Reads `file` (a regular file only) and validates it as `run` does, URDF included.
pub(crate) fn load_regular(file: &Path, ros: &RosArgs) -> Loaded {
    let text =
        crate::files::read_regular(file, MAX_CONFIG_BYTES).map_err(|source| LoadError::Read {
            file: file.to_path_buf(),
            source,
        })?;
    Config::parse_with(file, &text, ros).map_err(|e| LoadError::of_config(file, e))
}

type LoadFn = Arc<dyn Fn() -> Loaded + Send + Sync>;

/// Runs reloads on their own thread, one at a time; the supervisor polls for the result.
pub(crate) struct Reloader {
    /// The file and how to load it; none: nothing to reload.
    source: Option<(PathBuf, LoadFn)>,
    /// The read in progress: since when, and where its result arrives.
    reading: Option<(MonoTime, Receiver<Loaded>)>,
    /// A SIGHUP arrived during that read: another read follows it (the file may have changed
    /// again).
    again: bool,
}

impl Reloader {
    /// Reloads `file` with the ROS arguments it was started with; `None`: SIGHUP only logs.
    pub(crate) fn new(from: Option<(PathBuf, RosArgs)>) -> Reloader {
        Reloader::with_loader(from.map(|(file, ros)| {
            let load: LoadFn = {
                let file = file.clone();
                Arc::new(move || load_regular(&file, &ros))
            };
            (file, load)
        }))
    }

    fn with_loader(source: Option<(PathBuf, LoadFn)>) -> Reloader {
        Reloader {
            source,
            reading: None,
            again: false,
        }
    }

    /// A SIGHUP: starts a read unless one is under way (then one more follows it).
    pub(crate) fn request(&mut self) {
        let Some((file, _)) = &self.source else {
            tracing::warn!("SIGHUP: no configuration file to reload");
            return;
        };
        if let Some((since, _)) = &self.reading {
            tracing::warn!(
                file = %file.display(),
                "SIGHUP: the previous reload is still reading the files ({:.1} s); this one follows it",
                MonoTime::now().seconds_since(*since)
            );
            self.again = true;
            return;
        }
        self.start();
    }

    fn start(&mut self) {
        let Some((file, load)) = &self.source else {
            return;
        };
        let (tx, rx) = sync_channel(1);
        let load = load.clone();
        let spawned = std::thread::Builder::new()
            .name("pi0d-reload".into())
            .spawn(move || {
                // The supervisor may be gone (the run ended): nobody to tell.
                let _ = tx.send(load());
            });
        match spawned {
            Ok(_) => self.reading = Some((MonoTime::now(), rx)),
            Err(e) => tracing::warn!(
                file = %file.display(),
                "SIGHUP: cannot start the reload thread; nothing changed: {}",
                error_chain(&e)
            ),
        }
    }

    /// The result of the read under way, once it is there; never waits.
    pub(crate) fn poll(&mut self) -> Option<Loaded> {
        let (_, rx) = self.reading.as_ref()?;
        let loaded = match rx.try_recv() {
            Ok(l) => l,
            Err(TryRecvError::Empty) => return None,
            Err(TryRecvError::Disconnected) => Err(LoadError::Died),
        };
        self.reading = None;
        if std::mem::take(&mut self.again) {
            self.start();
        }
        Some(loaded)
    }
}

/// What a reload changes, and what it refuses (field, why).
#[derive(Debug, Default)]
pub(crate) struct Reload {
    pub(crate) prompt: Option<String>,
    pub(crate) status_interval_s: Option<f64>,
    pub(crate) limits: Option<RobotLimits>,
    /// What is applied, one log line each: (field, `was -> now`).
    pub(crate) applied: Vec<(String, String)>,
    pub(crate) refused: Vec<(String, String)>,
}

const RESTART: &str = "changed; restart pi0d to apply it";

/// The name a refusal gives a field: the configuration's own where it differs from the
/// field's in `Config`.
fn config_name(d: &Difference) -> String {
    let (top, rest) = match d.path.find(['.', '[']) {
        Some(i) => d.path.split_at(i),
        None => (d.path.as_str(), ""),
    };
    let top = match top {
        "urdf" => "robot.urdf",
        // The whole of it changed (sim <-> ros): the field that says which.
        "io" if rest.is_empty() => "robot.io",
        "io" => "ros",
        "drills" => "drill",
        t => t,
    };
    format!("{top}{rest}")
}

/// Compares the running configuration with the file's; `measured` is the arm's position now
/// (tighter position limits must still contain it).
pub(crate) fn plan(old: &Config, new: &Config, measured: &JointVector) -> Reload {
    let mut r = Reload::default();
    // Everything but what is applied live and the limits (compared by their own rules below):
    // any other difference, in any section, present or future, is refused by name.
    let mut rest = new.clone();
    rest.file.clone_from(&old.file);
    rest.warnings.clone_from(&old.warnings);
    rest.limits = old.limits.clone();
    rest.policy.prompt.clone_from(&old.policy.prompt);
    rest.control.status_interval_s = old.control.status_interval_s;
    // Derived from `control.rate_hz`, which names the change.
    rest.control.period = old.control.period;
    for d in differences(old, &rest) {
        let restart = if d.path.starts_with("serve") {
            "restart `pi0d serve` to apply it (`pi0d run` does not use it)"
        } else {
            "restart pi0d to apply it"
        };
        let why = match d.what().as_str() {
            w @ ("added" | "removed") => format!("{w}; {restart}"),
            "changed" => format!("changed; {restart}"),
            w => format!("{w}: changed; {restart}"),
        };
        r.refused.push((config_name(&d), why));
    }
    let limits = limits_change(&old.limits, &new.limits, measured);
    let urdf = urdf_values_change(&old.limits, &new.limits);
    match (limits, urdf) {
        (Ok(l), Ok(urdf_changed)) => {
            r.limits = l.or_else(|| urdf_changed.then(|| new.limits.clone()));
            if r.limits.is_some() {
                r.applied
                    .extend(limit_differences(&old.limits, &new.limits));
            }
        }
        (limits, urdf) => {
            r.refused.extend(limits.err().unwrap_or_default());
            r.refused.extend(urdf.err().unwrap_or_default());
        }
    }
    if old.policy.prompt != new.policy.prompt {
        r.applied.push((
            "policy.prompt".into(),
            format!("{:?} -> {:?}", old.policy.prompt, new.policy.prompt),
        ));
        r.prompt = Some(new.policy.prompt.clone());
    }
    if old.control.status_interval_s != new.control.status_interval_s {
        r.applied.push((
            "control.status_interval_s".into(),
            format!(
                "{} -> {} s",
                old.control.status_interval_s, new.control.status_interval_s
            ),
        ));
        r.status_interval_s = Some(new.control.status_interval_s);
    }
    r
}

impl Reload {
    /// One line per applied change and per refusal, then what it came to.
    pub(crate) fn log(&self, file: &Path) {
        for (field, what) in &self.applied {
            tracing::info!(field = %field, "SIGHUP: {field} reloaded: {what}");
        }
        for (field, why) in &self.refused {
            tracing::warn!(field = %field, "SIGHUP: `{field}` not reloaded: {why}");
        }
        let (applied, refused) = (self.applied.len(), self.refused.len());
        let file = file.display();
        match (applied, refused) {
            (0, 0) => tracing::info!(%file, "SIGHUP: nothing changed"),
            (_, 0) => {
                tracing::info!(%file, "SIGHUP: configuration reloaded: {applied} change(s) applied")
            }
            (0, _) => {
                tracing::warn!(%file, "SIGHUP: nothing reloaded: {refused} change(s) refused; the running configuration stays")
            }
            _ => {
                tracing::warn!(%file, "SIGHUP: configuration partly reloaded: {applied} change(s) applied, {refused} refused; what was refused keeps its running value")
            }
        }
    }
}

/// Every limit value that differs, for the log: (field, `was -> now`).
fn limit_differences(old: &RobotLimits, new: &RobotLimits) -> Vec<(String, String)> {
    let show = |v: Option<f64>| v.map_or("none".to_string(), |v| v.to_string());
    let mut out = Vec::new();
    for (a, b) in old.joints.iter().zip(&new.joints) {
        for ((f, was), (_, now)) in values(a).into_iter().zip(values(b)) {
            if was != now {
                out.push((
                    format!("limits.joints.{}.{f}", a.name),
                    format!("{} -> {}", show(was), show(now)),
                ));
            }
        }
    }
    out
}

/// A joint's limit values by name (`None`: a `<safety_controller>` the joint does not have).
fn values(j: &JointLimits) -> [(&'static str, Option<f64>); 11] {
    let soft = |f: fn(&crate::robot::SoftLimit) -> f64| j.soft.as_ref().map(f);
    [
        ("lower", Some(j.lower)),
        ("upper", Some(j.upper)),
        ("velocity", Some(j.velocity)),
        ("acceleration", Some(j.acceleration)),
        ("jerk", Some(j.jerk)),
        ("max_step", Some(j.max_step)),
        ("effort", Some(j.effort)),
        ("safety_controller.soft_lower_limit", soft(|s| s.lower)),
        ("safety_controller.soft_upper_limit", soft(|s| s.upper)),
        ("safety_controller.k_position", soft(|s| s.k_position)),
        ("safety_controller.k_velocity", soft(|s| s.k_velocity)),
    ]
}

/// The URDF-derived values `limits_change` does not compare (the joint's kind, its effort,
/// its `<safety_controller>`): whether any is tighter, or the looser ones refused by name.
fn urdf_values_change(old: &RobotLimits, new: &RobotLimits) -> Result<bool, Vec<(String, String)>> {
    let names = |l: &RobotLimits| l.joints.iter().map(|j| j.name.clone()).collect::<Vec<_>>();
    if names(old) != names(new) {
        // `limits_change` refuses that.
        return Ok(false);
    }
    let mut refused = Vec::new();
    let mut changed = false;
    let looser_text = |was: f64, now: f64| {
        format!("{now} is looser than the running {was}: only tighter limits are reloaded")
    };
    for (a, b) in old.joints.iter().zip(&new.joints) {
        let field = |f: &str| format!("limits.joints.{}.{f}", a.name);
        if a.kind != b.kind {
            refused.push((
                field("kind"),
                format!("{:?} -> {:?}: {RESTART}", a.kind, b.kind).to_lowercase(),
            ));
        }
        if b.effort > a.effort {
            refused.push((field("effort"), looser_text(a.effort, b.effort)));
        } else if b.effort != a.effort {
            changed = true;
        }
        match (a.soft, b.soft) {
            (None, None) => {}
            (None, Some(_)) => changed = true,
            (Some(_), None) => refused.push((
                field("safety_controller"),
                "removed: looser than the running soft limits; only tighter limits are reloaded"
                    .into(),
            )),
            (Some(s), Some(t)) => {
                for (f, was, now, looser) in [
                    ("soft_lower_limit", s.lower, t.lower, t.lower < s.lower),
                    ("soft_upper_limit", s.upper, t.upper, t.upper > s.upper),
                    (
                        "k_position",
                        s.k_position,
                        t.k_position,
                        t.k_position > s.k_position,
                    ),
                    (
                        "k_velocity",
                        s.k_velocity,
                        t.k_velocity,
                        t.k_velocity > s.k_velocity,
                    ),
                ] {
                    if looser {
                        refused.push((
                            field(&format!("safety_controller.{f}")),
                            looser_text(was, now),
                        ));
                    } else if now != was {
                        changed = true;
                    }
                }
            }
        }
    }
    if refused.is_empty() {
        Ok(changed)
    } else {
        Err(refused)
    }
}

/// The new limits if they differ and are nowhere looser (and the arm stands inside them).
fn limits_change(
    old: &RobotLimits,
    new: &RobotLimits,
    measured: &JointVector,
) -> Result<Option<RobotLimits>, Vec<(String, String)>> {
    let names = |l: &RobotLimits| l.joints.iter().map(|j| j.name.clone()).collect::<Vec<_>>();
    if names(old) != names(new) {
        return Err(vec![("robot.joints".into(), RESTART.into())]);
    }
    let mut refused = Vec::new();
    let mut changed = false;
    for (i, (a, b)) in old.joints.iter().zip(&new.joints).enumerate() {
        let field = |f: &str| format!("limits.joints.{}.{f}", a.name);
        for (f, was, now, looser) in [
            ("lower", a.lower, b.lower, b.lower < a.lower),
            ("upper", a.upper, b.upper, b.upper > a.upper),
            ("velocity", a.velocity, b.velocity, b.velocity > a.velocity),
            (
                "acceleration",
                a.acceleration,
                b.acceleration,
                b.acceleration > a.acceleration,
            ),
            ("jerk", a.jerk, b.jerk, b.jerk > a.jerk),
            ("max_step", a.max_step, b.max_step, b.max_step > a.max_step),
        ] {
            if looser {
                refused.push((
                    field(f),
                    format!(
                        "{now} is looser than the running {was}: only tighter limits are reloaded"
                    ),
                ));
            } else if now != was {
                changed = true;
            }
        }
        let p = if i < measured.len() {
            measured[i]
        } else {
            f64::NAN
        };
        if !(p >= b.lower && p <= b.upper) {
            refused.push((
                field("lower"),
                format!(
                    "the arm stands at {p:.4}, outside the new range {} .. {}",
                    b.lower, b.upper
                ),
            ));
        }
    }
    if refused.is_empty() {
        Ok(changed.then(|| new.clone()))
    } else {
        Err(refused)
    }
}

/// A reload's result (the files were read on the reload thread): applies what may change
/// while the arm runs; every change and every refusal is logged naming its field. Returns the
/// limits handed to the control thread (in force once it says so).
pub(crate) fn apply(
    running: &mut Config,
    loaded: Loaded,
    board: &Blackboard,
) -> Option<RobotLimits> {
    let new = match loaded {
        Ok(c) => c,
        Err(e) => {
            let error = error_chain(&e);
            tracing::warn!(%error, "SIGHUP: the configuration does not load; nothing changed");
            return None;
        }
    };
    let plan = plan(running, &new, &board.inputs.joint_state.load().position);
    plan.log(&new.file);
    if let Some(p) = plan.prompt {
        if let Ok(mut slot) = board.inputs.prompt.lock() {
            slot.clone_from(&p);
        }
        running.policy.prompt = p;
    }
    if let Some(s) = plan.status_interval_s {
        running.control.status_interval_s = s;
    }
    let limits = plan.limits.inspect(|l| {
        if let Ok(mut slot) = board.supervisor.reload_limits.lock() {
            *slot = Some(Box::new(l.clone()));
        }
        tracing::info!("SIGHUP: tighter limits reloaded; they apply with the arm at rest inside them (a running arm holds, then resumes), or are refused where it would come to rest outside them");
    });
    limits
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn sim(edit: impl Fn(&mut toml::Table)) -> Config {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let text = std::fs::read_to_string(root.join("config/sim.toml")).unwrap();
        let mut t: toml::Table = text.parse().unwrap();
        edit(&mut t);
        Config::parse(&root.join("config/sim.toml"), &toml::to_string(&t).unwrap()).unwrap()
    }

    fn start(c: &Config) -> JointVector {
        c.sim.initial_position
    }

    #[test]
    fn prompt_and_tighter_limits_are_taken_and_everything_else_refused_by_name() {
        let old = sim(|_| {});
        let new = sim(|t| {
            t["policy"]["prompt"] = "stack the cups".into();
            t["limits"]["acceleration"] = 3.0.into();
            t["control"]["rate_hz"] = 500.into();
        });
        let r = plan(&old, &new, &start(&old));
        assert_eq!(r.prompt.as_deref(), Some("stack the cups"));
        let l = r.limits.expect("tighter acceleration");
        assert!(l
            .joints
            .iter()
            .filter(|j| j.name != "gripper")
            .all(|j| j.acceleration == 3.0));
        assert_eq!(r.refused.len(), 1, "{:?}", r.refused);
        assert_eq!(r.refused[0].0, "control.rate_hz");
    }

    #[test]
    fn looser_limits_are_refused_naming_the_joint_and_field() {
        let old = sim(|_| {});
        let new = sim(|t| t["limits"]["jerk"] = 300.0.into());
        let r = plan(&old, &new, &start(&old));
        assert!(r.limits.is_none());
        assert!(
            r.refused
                .iter()
                .any(|(f, why)| f == "limits.joints.elbow.jerk" && why.contains("looser")),
            "{:?}",
            r.refused
        );
        // Nothing changed: nothing to do.
        let r = plan(&old, &old, &start(&old));
        assert!(r.prompt.is_none() && r.limits.is_none() && r.refused.is_empty());
    }

    #[test]
    fn when_sections_are_added_expect_each_refused_by_name_and_nothing_applied() {
        let old = sim(|_| {});
        let new = sim(|t| {
            let section = |s: &str| s.parse::<toml::Table>().unwrap();
            t.insert(
                "record".into(),
                section("path = \"/tmp/pi0d-rec.mcap\"").into(),
            );
            t.insert(
                "metrics".into(),
                section("listen = \"127.0.0.1:9999\"").into(),
            );
            t.insert(
                "serve".into(),
                section("listen = \"127.0.0.1:8123\"").into(),
            );
            let drill = section("at_s = 100.0\nevent = \"crash_control\"");
            t.insert("drill".into(), toml::Value::Array(vec![drill.into()]));
        });
        let r = plan(&old, &new, &start(&old));
        assert!(r.applied.is_empty() && r.limits.is_none(), "{r:?}");
        for (field, why) in [
            ("record", "added; restart pi0d"),
            ("metrics", "added; restart pi0d"),
            ("drill[0]", "added; restart pi0d"),
            ("serve.listen", "restart `pi0d serve`"),
        ] {
            assert!(
                r.refused.iter().any(|(f, w)| f == field && w.contains(why)),
                "{field}: {:?}",
                r.refused
            );
        }
        assert_eq!(r.refused.len(), 4, "{:?}", r.refused);
    }

    #[test]
    fn when_fields_no_list_named_change_expect_them_refused_by_name() {
        let old = sim(|_| {});
        let new = sim(|t| {
            let policy = t["policy"].as_table_mut().unwrap();
            policy.insert("latency_s".into(), 0.5.into());
            t["sim"]["tau_s"] = 0.05.into();
        });
        let r = plan(&old, &new, &start(&old));
        let fields: Vec<&str> = r.refused.iter().map(|(f, _)| f.as_str()).collect();
        assert_eq!(fields, ["policy.latency_s", "sim.tau_s"], "{:?}", r.refused);
    }

    /// The bundled URDF with every `<safety_controller>`'s gains set so, in `dir`.
    fn urdf_with_gains(dir: &Path, k_position: &str, k_velocity: &str) -> std::path::PathBuf {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let text = std::fs::read_to_string(root.join("urdf/sim_arm.urdf")).unwrap();
        assert!(text.contains(r#"k_position="20" k_velocity="10""#));
        let text = text.replace(
            r#"k_position="20" k_velocity="10""#,
            &format!(r#"k_position="{k_position}" k_velocity="{k_velocity}""#),
        );
        let path = dir.join("arm.urdf");
        std::fs::write(&path, text).unwrap();
        path
    }

    #[test]
    fn when_urdf_soft_limit_gains_are_raised_expect_refused_and_lowered_expect_applied() {
        let dir = crate::test_dirs::TempDir::new("reload-gains");
        let at = |k_position: &str, k_velocity: &str| {
            let urdf = urdf_with_gains(&dir, k_position, k_velocity);
            sim(|t| t["robot"]["urdf"] = urdf.display().to_string().into())
        };
        let old = at("20", "10");
        let r = plan(&old, &at("10000", "10000"), &start(&old));
        assert!(r.limits.is_none(), "looser gains applied");
        for f in ["k_position", "k_velocity"] {
            assert!(
                r.refused.iter().any(|(field, why)| field
                    .ends_with(&format!("safety_controller.{f}"))
                    && why.contains("looser")),
                "{f}: {:?}",
                r.refused
            );
        }
        let r = plan(&old, &at("5", "10"), &start(&old));
        assert!(r.refused.is_empty(), "{:?}", r.refused);
        assert!(r.limits.is_some(), "a tighter gain is taken");
        assert!(
            r.applied
                .iter()
                .any(|(f, what)| f.ends_with("safety_controller.k_position") && what == "20 -> 5"),
            "{:?}",
            r.applied
        );
    }

    /// A loader that waits for the test's word, as a read from a FIFO or a hung mount would.
    fn blocked_loader() -> (Reloader, std::sync::mpsc::Sender<()>) {
        let (go, wait) = std::sync::mpsc::channel::<()>();
        let wait = std::sync::Mutex::new(wait);
        let load: LoadFn = Arc::new(move || {
            let _ = wait.lock().unwrap().recv();
            Err(LoadError::Died)
        });
        (
            Reloader::with_loader(Some(("config.toml".into(), load))),
            go,
        )
    }

    #[test]
    fn when_a_reload_read_blocks_expect_poll_to_return_at_once_and_a_later_sighup_to_follow() {
        let (mut r, go) = blocked_loader();
        r.request();
        assert!(r.poll().is_none(), "no result while the read blocks");
        // A SIGHUP meanwhile: taken after the read under way.
        r.request();
        assert!(r.poll().is_none());
        go.send(()).unwrap();
        let first = loop {
            if let Some(l) = r.poll() {
                break l;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        };
        assert!(first.is_err());
        assert!(r.reading.is_some(), "the second SIGHUP's read started");
        go.send(()).unwrap();
        while r.poll().is_none() {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert!(r.reading.is_none() && !r.again);
    }

    #[test]
    fn when_the_config_or_its_urdf_is_not_a_regular_file_expect_a_load_error_naming_it() {
        let dir = crate::test_dirs::TempDir::new("reload-fifo");
        let mkfifo = |p: &Path| {
            let c = std::ffi::CString::new(p.to_str().unwrap()).unwrap();
            // SAFETY: mkfifo on a NUL-terminated path this test owns.
            assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        };
        let config = dir.join("config.toml");
        mkfifo(&config);
        let e = load_regular(&config, &RosArgs::default()).unwrap_err();
        let text = error_chain(&e);
        assert!(
            text.contains("config.toml: cannot read it: is a FIFO"),
            "{text}"
        );
        // The URDF it names.
        std::fs::remove_file(&config).unwrap();
        let urdf = dir.join("arm.urdf");
        mkfifo(&urdf);
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut t: toml::Table = std::fs::read_to_string(root.join("config/sim.toml"))
            .unwrap()
            .parse()
            .unwrap();
        t["robot"]["urdf"] = urdf.display().to_string().into();
        t["policy"]["checkpoint"] = root.join("models/tiny-pi0").display().to_string().into();
        std::fs::write(&config, toml::to_string(&t).unwrap()).unwrap();
        let e = load_regular(&config, &RosArgs::default()).unwrap_err();
        let text = error_chain(&e);
        assert!(
            text.contains(&format!(
                "{}: `robot.urdf`: {}",
                config.display(),
                urdf.display()
            )) && text.contains("is a FIFO"),
            "{text}"
        );
        // Missing: named once, with the field that names it.
        std::fs::remove_file(&urdf).unwrap();
        let text = error_chain(&load_regular(&config, &RosArgs::default()).unwrap_err());
        assert!(text.contains("`robot.urdf`"), "{text}");
        assert_eq!(
            text.matches("No such file or directory").count(),
            1,
            "{text}"
        );
    }
}

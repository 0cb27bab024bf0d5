//! Field checks shared by the section validators: each failure names where the value came from
//! (the TOML file, or the `--ros-args` parameter that set it), the field and what was expected.
//! Fixed ranges are `ranges::RANGES`; comparisons are written so that NaN fails. Warnings
//! (settings that are valid but ignored or that widen the URDF) are collected for the log and
//! `pi0d check`.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use super::ConfigError;

/// Where a setting came from, for messages.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Origin {
    File(PathBuf),
    /// `-p NAME:=VALUE` after `--ros-args`.
    Param(String),
    /// A `--params-file`.
    ParamsFile {
        file: PathBuf,
        name: String,
    },
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Origin::File(p) => write!(f, "{}", p.display()),
            Origin::Param(name) => write!(f, "--ros-args parameter `{name}`"),
            Origin::ParamsFile { file, name } => {
                write!(f, "{} (ROS parameter `{name}`)", file.display())
            }
        }
    }
}

/// Which settings ROS parameters set (dotted paths); everything else comes from the file.
#[derive(Clone, Debug, Default)]
pub(crate) struct Origins {
    params: BTreeMap<String, Origin>,
}

impl Origins {
    pub(crate) fn set(&mut self, path: &str, origin: Origin) {
        self.params.insert(path.to_string(), origin);
    }

    /// The origin of `field` (or of the nearest enclosing setting a parameter replaced).
    pub(crate) fn of(&self, file: &Path, field: &str) -> Origin {
        let mut f = field.trim_matches('`');
        loop {
            if let Some(o) = self.params.get(f) {
                return o.clone();
            }
            // `limits.joints.elbow.velocity` set by a parameter `limits.joints.elbow`, or an
            // index such as `ros.cameras[1]` set by `ros.cameras`.
            match f.rfind(['.', '[']) {
                Some(i) => f = &f[..i],
                None => return Origin::File(file.to_path_buf()),
            }
        }
    }
}

/// A setting that is valid but probably not what was meant.
#[derive(Clone, Debug, PartialEq)]
pub struct ConfigWarning {
    pub(crate) origin: Origin,
    pub field: String,
    pub message: String,
}

impl fmt::Display for ConfigWarning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: `{}`: {}", self.origin, self.field, self.message)
    }
}

pub(crate) struct Check<'a> {
    pub(crate) file: &'a Path,
    pub(crate) origins: &'a Origins,
    warnings: RefCell<Vec<ConfigWarning>>,
}

impl<'a> Check<'a> {
    pub(crate) fn new(file: &'a Path, origins: &'a Origins) -> Check<'a> {
        Check {
            file,
            origins,
            warnings: RefCell::new(Vec::new()),
        }
    }

    pub(crate) fn error(&self, field: &str, message: impl Into<String>) -> ConfigError {
        ConfigError::Invalid {
            origin: self.origins.of(self.file, field),
            field: field.to_string(),
            message: message.into(),
        }
    }

    pub(crate) fn fail<T>(
        &self,
        field: &str,
        message: impl Into<String>,
    ) -> Result<T, ConfigError> {
        Err(self.error(field, message))
    }

    pub(crate) fn warn(&self, field: &str, message: impl Into<String>) {
        self.warnings.borrow_mut().push(ConfigWarning {
            origin: self.origins.of(self.file, field),
            field: field.to_string(),
            message: message.into(),
        });
    }

    /// Warns that `field` is set but the chosen `kind` does not use it.
    pub(crate) fn unused(&self, field: &str, given: bool, why: &str) {
        if given {
            self.warn(field, format!("ignored: {why}"));
        }
    }

    pub(crate) fn take_warnings(&self) -> Vec<ConfigWarning> {
        std::mem::take(&mut self.warnings.borrow_mut())
    }

    /// `x` within `lo..=hi` (a range that depends on another setting; the fixed ones are
    /// `ranges::RANGES`).
    pub(crate) fn in_range(
        &self,
        field: &str,
        x: f64,
        lo: f64,
        hi: f64,
        unit: &str,
    ) -> Result<f64, ConfigError> {
        if x >= lo && x <= hi {
            Ok(x)
        } else {
            use super::ranges::number;
            self.fail(
                field,
                format!(
                    "expected {}..{} {unit}, found {}",
                    number(lo),
                    number(hi),
                    number(x)
                ),
            )
        }
    }

    /// A relative path is relative to the configuration file's directory.
    pub(crate) fn resolve(&self, p: &Path) -> PathBuf {
        if p.is_absolute() {
            p.to_path_buf()
        } else {
            self.file.parent().unwrap_or(Path::new(".")).join(p)
        }
    }
}

/// The first name listed twice.
pub(crate) fn first_duplicate(names: &[String]) -> Option<&str> {
    names
        .iter()
        .enumerate()
        .find(|(i, n)| names[..*i].contains(n))
        .map(|(_, n)| n.as_str())
}

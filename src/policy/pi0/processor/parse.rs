//! `policy_preprocessor.json` / `policy_postprocessor.json` read as lerobot 0.6.1 reads them:
//! an ordered list of steps, each found by its `registry_name` and built from its `config`
//! (lerobot passes the config as keyword arguments, so a setting a step does not have is an
//! error there too). Every step and setting pi0d honours is read into a typed step here; any
//! other step, and any setting of a known step that pi0d does not compute exactly, is refused
//! naming the file, the step's index and name, and the setting.

use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};

use serde_json::{Map, Value};

use super::normalizer::{self, NormMode, Normalize, Settings as NormalizerSettings};
use super::relative::RelativeStep;
use super::{Context, Padding, PostStep, PreStep, ProcessorError, StepAt, TokenizerStep};
use crate::policy::pi0::checkpoint::read_text;
use crate::policy::pi0::config_json::bounds::PROMPT_TOKENS;
use crate::policy::pi0::config_json::parse_object;

/// Where a step is, for messages: its file, index and registry name.
pub(crate) fn at(path: &Path, index: usize, name: &str) -> StepAt {
    StepAt {
        file: path.to_path_buf(),
        index,
        name: name.to_string(),
    }
}

fn refuse(step: &StepAt, setting: &str, problem: impl Into<String>) -> ProcessorError {
    // The problem quotes the file's values: shown as outside text, cut short.
    ProcessorError::Setting {
        step: step.clone(),
        setting: crate::outside::text(setting).cap(128).to_string(),
        problem: crate::outside::text(&problem.into()).cap(1024).to_string(),
    }
}

/// The settings of one step's `config`, taken one at a time; whatever is left at the end is a
/// setting pi0d does not know for that step.
struct Settings<'a> {
    step: &'a StepAt,
    rest: Map<String, Value>,
}

impl<'a> Settings<'a> {
    fn new(step: &'a StepAt, config: Option<&Value>) -> Result<Settings<'a>, ProcessorError> {
        let rest = match config {
            None | Some(Value::Null) => Map::new(),
            Some(Value::Object(m)) => m.clone(),
            Some(other) => {
                return Err(refuse(
                    step,
                    "config",
                    format!("expected an object of settings, found {other}"),
                ))
            }
        };
        Ok(Settings { step, rest })
    }

    /// Setting `name`, absent or null as `None`.
    fn take(&mut self, name: &str) -> Option<Value> {
        self.rest.remove(name).filter(|v| !v.is_null())
    }

    fn bool(&mut self, name: &str, default: bool) -> Result<bool, ProcessorError> {
        match self.take(name) {
            None => Ok(default),
            Some(Value::Bool(b)) => Ok(b),
            Some(v) => Err(refuse(
                self.step,
                name,
                format!("expected true or false, found {v}"),
            )),
        }
    }

    fn string(&mut self, name: &str) -> Result<Option<String>, ProcessorError> {
        match self.take(name) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(v) => Err(refuse(
                self.step,
                name,
                format!("expected a string, found {v}"),
            )),
        }
    }

    fn strings(&mut self, name: &str) -> Result<Option<Vec<String>>, ProcessorError> {
        let Some(v) = self.take(name) else {
            return Ok(None);
        };
        let Value::Array(items) = v else {
            return Err(refuse(
                self.step,
                name,
                format!("expected a list of strings, found {v}"),
            ));
        };
        items
            .into_iter()
            .enumerate()
            .map(|(i, x)| match x {
                Value::String(s) => Ok(s),
                other => Err(refuse(
                    self.step,
                    &format!("{name}[{i}]"),
                    format!("expected a string, found {other}"),
                )),
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Some)
    }

    /// The task key: pi0d's prompt is lerobot's `task`; any other key names data pi0d does not
    /// have (lerobot would find no task under it at inference).
    fn task_key(&mut self) -> Result<(), ProcessorError> {
        match self.string("task_key")? {
            None => Ok(()),
            Some(k) if k == "task" => Ok(()),
            Some(k) => Err(refuse(
                self.step,
                "task_key",
                format!("`{k}`: pi0d's prompt is the task (`task`); no other key is supported"),
            )),
        }
    }

    /// Refuses whatever setting was not taken.
    fn done(self) -> Result<(), ProcessorError> {
        match self.rest.keys().next() {
            None => Ok(()),
            Some(k) => Err(refuse(
                self.step,
                k,
                "not a setting pi0d knows for this step (lerobot 0.6.1 has no such setting, or pi0d does not compute it)",
            )),
        }
    }
}

/// `device_processor`: where tensors go (irrelevant here) and an optional float type every
/// tensor is cast to, which pi0d honours only when it changes nothing (float32).
fn device(s: &mut Settings) -> Result<(), ProcessorError> {
    s.string("device")?;
    match s.string("float_dtype")?.as_deref() {
        None | Some("float32") | Some("float") => Ok(()),
        Some(other) => Err(refuse(
            s.step,
            "float_dtype",
            format!("`{other}`: pi0d computes observations and actions in float32; a pipeline that casts them to another type is not supported"),
        )),
    }
}

fn tokenizer(s: &mut Settings) -> Result<TokenizerStep, ProcessorError> {
    // The hub name lerobot loads its tokenizer by: pi0d reads the local tokenizer.json instead.
    let hub_name = s.string("tokenizer_name")?;
    if s.take("tokenizer").is_some() {
        return Err(refuse(
            s.step,
            "tokenizer",
            "a tokenizer object cannot be saved in JSON; pi0d reads tokenizer.json",
        ));
    }
    let max_length = match s.take("max_length") {
        None => 512, // lerobot's default
        Some(v) => v
            .as_u64()
            .filter(|n| (1..=PROMPT_TOKENS as u64).contains(n))
            .map(|n| n as usize)
            .ok_or_else(|| {
                refuse(
                    s.step,
                    "max_length",
                    format!(
                        "expected a count from 1 to {PROMPT_TOKENS} (pi0d's bound), found {}",
                        crate::outside::text(&v.to_string())
                    ),
                )
            })?,
    };
    s.task_key()?;
    let left = match s.string("padding_side")?.as_deref() {
        None | Some("right") => false,
        Some("left") => true,
        Some(other) => {
            return Err(refuse(
                s.step,
                "padding_side",
                format!("expected \"right\" or \"left\", found \"{other}\""),
            ))
        }
    };
    // Hugging Face's padding strategies: true is "longest"; false "do_not_pad".
    let padding = match s.take("padding") {
        None => Padding::MaxLength,
        Some(Value::Bool(true)) => Padding::Longest,
        Some(Value::Bool(false)) => Padding::None,
        Some(Value::String(p)) => match p.as_str() {
            "max_length" => Padding::MaxLength,
            "longest" => Padding::Longest,
            "do_not_pad" => Padding::None,
            other => {
                return Err(refuse(
                    s.step,
                    "padding",
                    format!(
                        "expected \"max_length\", \"longest\" or \"do_not_pad\", found \"{other}\""
                    ),
                ))
            }
        },
        Some(v) => {
            return Err(refuse(
                s.step,
                "padding",
                format!("expected a padding strategy, found {v}"),
            ))
        }
    };
    // One text: every truncation strategy but "only_second" cuts it to max_length.
    let truncation = match s.take("truncation") {
        None => true,
        Some(Value::Bool(b)) => b,
        Some(Value::String(t)) => match t.as_str() {
            "longest_first" | "only_first" => true,
            "do_not_truncate" => false,
            other => {
                return Err(refuse(
                    s.step,
                    "truncation",
                    format!("expected true, false, \"longest_first\", \"only_first\" or \"do_not_truncate\", found \"{other}\""),
                ))
            }
        },
        Some(v) => return Err(refuse(s.step, "truncation", format!("expected true or false, found {v}"))),
    };
    Ok(TokenizerStep {
        max_length,
        padding,
        left,
        truncation,
        hub_name,
    })
}

fn relative(s: &mut Settings) -> Result<RelativeStep, ProcessorError> {
    let enabled = s.bool("enabled", false)?;
    let exclude_joints = s.strings("exclude_joints")?.unwrap_or_default();
    let action_names = s.strings("action_names")?;
    Ok(RelativeStep {
        enabled,
        exclude_joints,
        action_names,
        openpi: None,
    })
}

/// lerobot's feature types (`FeatureType`).
const FEATURE_TYPES: [&str; 6] = ["STATE", "VISUAL", "ENV", "ACTION", "REWARD", "LANGUAGE"];

/// A normalizer or unnormalizer step's settings, resolved against its state file.
fn normalizer(
    s: &mut Settings,
    ctx: &Context,
    state_file: Option<&Value>,
    pre: bool,
) -> Result<Normalize, ProcessorError> {
    let dir = ctx.dir;
    let eps = match s.take("eps") {
        None => 1e-8,
        Some(v) => v.as_f64().filter(|e| e.is_finite()).ok_or_else(|| {
            refuse(
                s.step,
                "eps",
                format!("expected a finite number, found {v}"),
            )
        })?,
    } as f32;
    let mut features = BTreeMap::new();
    if let Some(v) = s.take("features") {
        let Value::Object(m) = v else {
            return Err(refuse(
                s.step,
                "features",
                format!("expected an object of features, found {v}"),
            ));
        };
        for (key, f) in m {
            let kind = f
                .get("type")
                .and_then(Value::as_str)
                .filter(|t| FEATURE_TYPES.contains(t))
                .ok_or_else(|| {
                    refuse(
                        s.step,
                        &format!("features.{key}.type"),
                        format!(
                            "expected one of {}, found {}",
                            FEATURE_TYPES.join(", "),
                            f.get("type").unwrap_or(&Value::Null)
                        ),
                    )
                })?;
            features.insert(key, kind.to_string());
        }
    }
    let mut norm_map = BTreeMap::new();
    if let Some(v) = s.take("norm_map") {
        let Value::Object(m) = v else {
            return Err(refuse(
                s.step,
                "norm_map",
                format!("expected an object, found {v}"),
            ));
        };
        for (kind, mode) in m {
            if !FEATURE_TYPES.contains(&kind.as_str()) {
                return Err(refuse(
                    s.step,
                    &format!("norm_map.{kind}"),
                    format!(
                        "not a feature type (expected one of {})",
                        FEATURE_TYPES.join(", ")
                    ),
                ));
            }
            let mode = mode.as_str().and_then(NormMode::parse).ok_or_else(|| {
                refuse(
                    s.step,
                    &format!("norm_map.{kind}"),
                    format!(
                        "expected one of {}, found {mode}",
                        NormMode::NAMES.join(", ")
                    ),
                )
            })?;
            norm_map.insert(kind, mode);
        }
    }
    let observation_keys = s.strings("normalize_observation_keys")?;
    s.string("device")?;
    for unsupported in ["stats", "dtype"] {
        if s.take(unsupported).is_some() {
            return Err(refuse(
                s.step,
                unsupported,
                match unsupported {
                    "stats" => "statistics written into the step's settings (they would replace its state file in lerobot): not supported",
                    _ => "a stats type other than float32: not supported",
                },
            ));
        }
    }
    let state_file = match state_file {
        None | Some(Value::Null) => None,
        Some(Value::String(f)) => Some(state_file_path(s.step, dir, f)?),
        Some(other) => {
            return Err(refuse(
                s.step,
                "state_file",
                format!("expected a file name, found {other}"),
            ))
        }
    };
    let settings = NormalizerSettings {
        eps,
        features,
        norm_map,
        observation_keys,
        state_file,
    };
    normalizer::resolve(s.step, settings, ctx, pre)
}

/// A state file must name a file inside the checkpoint directory.
fn state_file_path(step: &StepAt, dir: &Path, f: &str) -> Result<PathBuf, ProcessorError> {
    let inside = !f.is_empty()
        && Path::new(f)
            .components()
            .all(|c| matches!(c, Component::Normal(_)));
    if !inside {
        return Err(refuse(
            step,
            "state_file",
            format!("`{f}` is not a file name inside {}", dir.display()),
        ));
    }
    Ok(dir.join(f))
}

/// One step entry of a pipeline file.
fn step_name<'v>(path: &Path, index: usize, entry: &'v Value) -> Result<&'v str, ProcessorError> {
    if let Some(name) = entry.get("registry_name").and_then(Value::as_str) {
        return Ok(name);
    }
    let what = match entry.get("class").and_then(Value::as_str) {
        Some(class) => format!(
            "an unregistered step `{}`: pi0d runs only the steps it knows by registry name",
            crate::outside::text(class).cap(128)
        ),
        None => "a step with neither `registry_name` nor `class`".to_string(),
    };
    Err(ProcessorError::Step {
        step: at(path, index, "?"),
        problem: what,
    })
}

/// The steps of one pipeline file, as JSON entries (file checked to be a pipeline).
fn entries(path: &Path) -> Result<Vec<Value>, ProcessorError> {
    let json = parse_object(path, &read_text(path, "a JSON file")?)?;
    match json.get("steps") {
        Some(Value::Array(steps)) => Ok(steps.clone()),
        _ => Err(ProcessorError::Pipeline {
            file: path.to_path_buf(),
            problem: "expected a \"steps\" list".into(),
        }),
    }
}

fn unknown(step: &StepAt, pipeline: &str) -> ProcessorError {
    ProcessorError::Step {
        step: step.clone(),
        problem: format!("not a {pipeline} step pi0d knows: it would run the checkpoint without it, so it refuses it"),
    }
}

/// `policy_preprocessor.json`'s steps, in order.
pub(crate) fn preprocessor(path: &Path, ctx: &Context) -> Result<Vec<PreStep>, ProcessorError> {
    let mut out = Vec::new();
    for (index, entry) in entries(path)?.iter().enumerate() {
        let name = step_name(path, index, entry)?;
        let step = at(path, index, name);
        let mut s = Settings::new(&step, entry.get("config"))?;
        let parsed = match name {
            "rename_observations_processor" => {
                let map = match s.take("rename_map") {
                    None => BTreeMap::new(),
                    Some(v) => serde_json::from_value::<BTreeMap<String, String>>(v.clone())
                        .map_err(|_| {
                            refuse(
                                &step,
                                "rename_map",
                                format!("expected an object of key names to key names, found {v}"),
                            )
                        })?,
                };
                PreStep::Rename(map)
            }
            "to_batch_processor" => PreStep::Batch,
            "pi0_new_line_processor" | "smolvla_new_line_processor" => PreStep::NewLine,
            "tokenizer_processor" => PreStep::Tokenizer(tokenizer(&mut s)?),
            "device_processor" => {
                device(&mut s)?;
                PreStep::Device
            }
            "relative_actions_processor" => PreStep::Relative(relative(&mut s)?),
            "normalizer_processor" => PreStep::Normalizer(Box::new(normalizer(
                &mut s,
                ctx,
                entry.get("state_file"),
                true,
            )?)),
            "pi05_prepare_state_tokenizer_processor_step" => {
                // `max_state_dim` is stored on the step but not used by it.
                if let Some(v) = s.take("max_state_dim") {
                    if v.as_u64().is_none() {
                        return Err(refuse(
                            &step,
                            "max_state_dim",
                            format!("expected a count, found {v}"),
                        ));
                    }
                }
                s.task_key()?;
                PreStep::StateInPrompt
            }
            _ => return Err(unknown(&step, "preprocessor")),
        };
        s.done()?;
        out.push(parsed);
    }
    Ok(out)
}

/// `policy_postprocessor.json`'s steps, in order.
pub(crate) fn postprocessor(path: &Path, ctx: &Context) -> Result<Vec<PostStep>, ProcessorError> {
    let mut out = Vec::new();
    for (index, entry) in entries(path)?.iter().enumerate() {
        let name = step_name(path, index, entry)?;
        let step = at(path, index, name);
        let mut s = Settings::new(&step, entry.get("config"))?;
        let parsed = match name {
            "unnormalizer_processor" => PostStep::Unnormalizer(Box::new(normalizer(
                &mut s,
                ctx,
                entry.get("state_file"),
                false,
            )?)),
            "absolute_actions_processor" => {
                if s.take("relative_step").is_some() {
                    return Err(refuse(&step, "relative_step", "the paired step is the preprocessor's relative_actions_processor; a saved one is not supported"));
                }
                PostStep::Absolute {
                    enabled: s.bool("enabled", false)?,
                    at: step.clone(),
                }
            }
            "device_processor" => {
                device(&mut s)?;
                PostStep::Device
            }
            _ => return Err(unknown(&step, "postprocessor")),
        };
        s.done()?;
        out.push(parsed);
    }
    Ok(out)
}

/// The last tokenizer step's `max_length` in a preprocessor file, read without the rest of the
/// checkpoint (`pi0d export` sizes its graphs by it).
pub(crate) fn tokenizer_length(path: &Path) -> Result<Option<usize>, ProcessorError> {
    let mut length = None;
    for (index, entry) in entries(path)?.iter().enumerate() {
        if step_name(path, index, entry)? == "tokenizer_processor" {
            let step = at(path, index, "tokenizer_processor");
            let mut s = Settings::new(&step, entry.get("config"))?;
            length = Some(tokenizer(&mut s)?.max_length);
        }
    }
    Ok(length)
}

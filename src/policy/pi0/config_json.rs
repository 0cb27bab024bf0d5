//! The JSON files beside the weights: lerobot's `config.json` (the fields pi0d uses) and
//! `arch.json` (head counts). Each field is read on its own so an error names the field, and
//! values are checked before anything is sized from them.

use std::collections::HashMap;
use std::path::Path;

use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::{Map, Value};

use super::checkpoint::CheckpointError;

/// lerobot's `config.json` fields pi0d uses (the rest is ignored).
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct PolicyConfigJson {
    pub(crate) kind: String,
    pub(crate) chunk_size: usize,
    pub(crate) max_state_dim: usize,
    pub(crate) max_action_dim: usize,
    pub(crate) num_inference_steps: usize,
    pub(crate) min_period: f64,
    pub(crate) max_period: f64,
    pub(crate) tokenizer_max_length: Option<usize>,
    pub(crate) image_resolution: [usize; 2],
    pub(crate) input_features: HashMap<String, FeatureJson>,
    pub(crate) output_features: HashMap<String, FeatureJson>,
    /// The model's cameras (`observation.images.<name>`, VISUAL) in the file's order, which is
    /// the order lerobot feeds them to the model in.
    pub(crate) camera_names: Vec<String>,
    /// Whether these came from a `config.json` (a bare `.safetensors` has none: the robot's
    /// state and action widths are then unknown).
    pub(crate) from_file: bool,
    /// lerobot's `use_relative_actions` (absent before lerobot 0.6): checked against the
    /// processor steps, which do the work.
    pub(crate) use_relative_actions: Option<bool>,
    /// lerobot's `rtc_training_max_delay`: a pi0.5 trained for real-time chunking.
    pub(crate) rtc_training_max_delay: Option<u64>,
}

#[derive(Clone, Debug, Deserialize, PartialEq)]
pub(crate) struct FeatureJson {
    #[serde(rename = "type")]
    pub(crate) kind: String,
    pub(crate) shape: Vec<usize>,
}

impl Default for PolicyConfigJson {
    /// lerobot's defaults, used for a bare `.safetensors` file.
    fn default() -> Self {
        PolicyConfigJson {
            kind: "pi0".into(),
            chunk_size: 50,
            max_state_dim: 32,
            max_action_dim: 32,
            num_inference_steps: 10,
            min_period: 4e-3,
            max_period: 4.0,
            tokenizer_max_length: None,
            image_resolution: [224, 224],
            input_features: HashMap::new(),
            output_features: HashMap::new(),
            camera_names: Vec::new(),
            from_file: false,
            use_relative_actions: None,
            rtc_training_max_delay: None,
        }
    }
}

/// The keys of `input_features` in the file's order (a parsed `serde_json::Map` sorts them);
/// empty when there are none (the fields themselves are checked by `PolicyConfigJson::parse`).
fn input_feature_keys(text: &str) -> Vec<String> {
    use serde::de::{IgnoredAny, MapAccess, Visitor};

    #[derive(Default)]
    struct KeysInOrder(Vec<String>);

    impl<'de> Deserialize<'de> for KeysInOrder {
        fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            struct Keys;
            impl<'de> Visitor<'de> for Keys {
                type Value = KeysInOrder;
                fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                    f.write_str("an object")
                }
                fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<KeysInOrder, A::Error> {
                    let mut keys = Vec::new();
                    while let Some(k) = m.next_key::<String>()? {
                        m.next_value::<IgnoredAny>()?;
                        keys.push(k);
                    }
                    Ok(KeysInOrder(keys))
                }
            }
            d.deserialize_map(Keys)
        }
    }

    #[derive(Deserialize)]
    struct Top {
        #[serde(default)]
        input_features: KeysInOrder,
    }
    serde_json::from_str::<Top>(text).map_or_else(|_| Vec::new(), |t| t.input_features.0)
}

/// The JSON object in `text` (`path` for messages).
pub(crate) fn parse_object(path: &Path, text: &str) -> Result<Map<String, Value>, CheckpointError> {
    match serde_json::from_str(text) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(_) => Err(CheckpointError::File {
            path: path.into(),
            message: "expected a JSON object".into(),
        }),
        Err(source) => Err(CheckpointError::Json {
            path: path.into(),
            source,
        }),
    }
}

/// Field `name` of `obj` as a `T`, or `default` when absent.
fn field<T: DeserializeOwned>(
    path: &Path,
    obj: &Map<String, Value>,
    name: &str,
    default: T,
) -> Result<T, CheckpointError> {
    match obj.get(name) {
        None => Ok(default),
        Some(v) => T::deserialize(v).map_err(|source| CheckpointError::Field {
            path: path.into(),
            field: name.into(),
            source,
        }),
    }
}

/// A refused value; what was found is outside text (the file's), shown as such.
fn value_err(path: &Path, field: &str, expected: &str, found: impl ToString) -> CheckpointError {
    CheckpointError::Value {
        path: path.into(),
        field: field.into(),
        expected: expected.into(),
        found: crate::outside::text(&found.to_string()).to_string(),
    }
}

/// What a checkpoint may state, at most: far above any pi0 or pi0.5 (48 or 200 prompt tokens,
/// 50-step chunks of 32-wide actions, 10 denoising steps, 224-pixel images), low enough that
/// nothing is allocated or computed for a size no model has. Checked before anything is.
pub(crate) mod bounds {
    /// `tokenizer_max_length`, and the tokenizer step's `max_length`.
    pub(crate) const PROMPT_TOKENS: usize = 2048;
    /// `chunk_size`.
    pub(crate) const CHUNK_SIZE: usize = 1024;
    /// `max_state_dim`, `max_action_dim`.
    pub(crate) const WIDTH: usize = 1024;
    /// `num_inference_steps`.
    pub(crate) const INFERENCE_STEPS: usize = 1000;
    /// Each of `image_resolution`'s sides.
    pub(crate) const IMAGE_SIDE: usize = 2048;
}

/// `v` within pi0d's `bound` for field `name` of `path`.
pub(crate) fn at_most(
    path: &Path,
    name: &str,
    v: usize,
    bound: usize,
) -> Result<usize, CheckpointError> {
    if v > bound {
        Err(value_err(
            path,
            name,
            &format!("at most {bound} (pi0d's bound: no pi0 or pi0.5 comes near it)"),
            v,
        ))
    } else {
        Ok(v)
    }
}

fn at_least_1(path: &Path, name: &str, v: usize) -> Result<usize, CheckpointError> {
    if v == 0 {
        Err(value_err(path, name, "at least 1", v))
    } else {
        Ok(v)
    }
}

impl PolicyConfigJson {
    /// Reads `config.json`'s text: malformed JSON, a field of the wrong type and a value no
    /// model can have are each refused naming the file and the field.
    pub(crate) fn parse(path: &Path, text: &str) -> Result<PolicyConfigJson, CheckpointError> {
        let obj = parse_object(path, text)?;
        let d = PolicyConfigJson::default();
        let c = PolicyConfigJson {
            kind: field(path, &obj, "type", d.kind)?,
            chunk_size: field(path, &obj, "chunk_size", d.chunk_size)?,
            max_state_dim: field(path, &obj, "max_state_dim", d.max_state_dim)?,
            max_action_dim: field(path, &obj, "max_action_dim", d.max_action_dim)?,
            num_inference_steps: field(path, &obj, "num_inference_steps", d.num_inference_steps)?,
            min_period: field(path, &obj, "min_period", d.min_period)?,
            max_period: field(path, &obj, "max_period", d.max_period)?,
            tokenizer_max_length: field(path, &obj, "tokenizer_max_length", None)?,
            image_resolution: field(path, &obj, "image_resolution", d.image_resolution)?,
            input_features: field(path, &obj, "input_features", d.input_features)?,
            output_features: field(path, &obj, "output_features", d.output_features)?,
            camera_names: Vec::new(),
            from_file: true,
            use_relative_actions: field(path, &obj, "use_relative_actions", None)?,
            rtc_training_max_delay: field(path, &obj, "rtc_training_max_delay", None)?,
        };
        let mut c = c;
        c.camera_names = input_feature_keys(text)
            .into_iter()
            .filter(|k| c.input_features.get(k).is_some_and(|f| f.kind == "VISUAL"))
            .map(|k| match k.strip_prefix("observation.images.") {
                Some(name) => name.to_string(),
                None => k,
            })
            .collect();
        if c.camera_names.len() > crate::config::MAX_CAMERAS {
            return Err(value_err(
                path,
                "input_features",
                &format!(
                    "at most {} VISUAL features (pi0d's bound)",
                    crate::config::MAX_CAMERAS
                ),
                c.camera_names.len(),
            ));
        }
        for (name, v, bound) in [
            ("chunk_size", c.chunk_size, bounds::CHUNK_SIZE),
            ("max_state_dim", c.max_state_dim, bounds::WIDTH),
            ("max_action_dim", c.max_action_dim, bounds::WIDTH),
            (
                "num_inference_steps",
                c.num_inference_steps,
                bounds::INFERENCE_STEPS,
            ),
        ] {
            at_least_1(path, name, v)?;
            at_most(path, name, v, bound)?;
        }
        if let Some(n) = c.tokenizer_max_length {
            at_least_1(path, "tokenizer_max_length", n)?;
            at_most(path, "tokenizer_max_length", n, bounds::PROMPT_TOKENS)?;
        }
        for (name, v) in [("min_period", c.min_period), ("max_period", c.max_period)] {
            if !(v.is_finite() && v > 0.0) {
                return Err(value_err(path, name, "a finite period above 0", v));
            }
        }
        if c.min_period >= c.max_period {
            return Err(value_err(
                path,
                "min_period",
                &format!("less than max_period ({})", c.max_period),
                c.min_period,
            ));
        }
        if c.image_resolution.contains(&0)
            || c.image_resolution.iter().any(|s| *s > bounds::IMAGE_SIDE)
        {
            return Err(value_err(
                path,
                "image_resolution",
                &format!(
                    "two sizes of at least 1 and at most {} (pi0d's bound)",
                    bounds::IMAGE_SIDE
                ),
                format!("{:?}", c.image_resolution),
            ));
        }
        Ok(c)
    }

    /// The largest inference delay a pi0.5 was trained to be conditioned on
    /// (`rtc_training_max_delay`, lerobot after 0.6.1), checked as lerobot checks it: below the
    /// chunk, and pi0.5 only (lerobot trains no pi0 that way).
    pub(crate) fn trained_rtc(
        &self,
        path: &Path,
        pi05: bool,
    ) -> Result<Option<usize>, CheckpointError> {
        let Some(d) = self.rtc_training_max_delay.filter(|d| *d > 0) else {
            return Ok(None);
        };
        let file = path.join("config.json");
        if !pi05 {
            return Err(value_err(
                &file,
                "rtc_training_max_delay",
                "0 or absent for pi0 (lerobot trains only pi0.5 for real-time chunking)",
                d,
            ));
        }
        match usize::try_from(d) {
            Ok(d) if d < self.chunk_size => Ok(Some(d)),
            _ => Err(value_err(
                &file,
                "rtc_training_max_delay",
                &format!("less than chunk_size ({})", self.chunk_size),
                d,
            )),
        }
    }

    /// The robot's width of feature `key` (`observation.state`, `action`) in `features`.
    pub(crate) fn feature_width(
        features: &HashMap<String, FeatureJson>,
        key: &str,
    ) -> Option<usize> {
        features.get(key).and_then(|f| f.shape.first().copied())
    }
}

/// Head counts that tensor shapes cannot tell (`--arch FILE`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ArchOverrides {
    pub(crate) vision_heads: usize,
    pub(crate) heads: usize,
    pub(crate) kv_heads: usize,
    pub(crate) head_dim: usize,
}

const ARCH_FIELDS: [&str; 4] = ["vision_heads", "heads", "kv_heads", "head_dim"];

impl ArchOverrides {
    /// The real pi0 / pi0.5 values.
    pub(crate) const PI0: ArchOverrides = ArchOverrides {
        vision_heads: 16,
        heads: 8,
        kv_heads: 1,
        head_dim: 256,
    };

    pub fn load(path: &Path) -> Result<ArchOverrides, CheckpointError> {
        let text = super::checkpoint::read_text(path, "an arch JSON file")?;
        ArchOverrides::parse(path, &text)
    }

    /// `{"vision_heads", "heads", "kv_heads", "head_dim"}`, each at least 1, nothing else.
    pub(crate) fn parse(path: &Path, text: &str) -> Result<ArchOverrides, CheckpointError> {
        let obj = parse_object(path, text)?;
        if let Some(unknown) = obj.keys().find(|k| !ARCH_FIELDS.contains(&k.as_str())) {
            return Err(value_err(
                path,
                unknown,
                "only vision_heads, heads, kv_heads and head_dim",
                "an unknown field",
            ));
        }
        let mut v = [0usize; 4];
        for (slot, name) in v.iter_mut().zip(ARCH_FIELDS) {
            let n: Option<usize> = field(path, &obj, name, None)?;
            let n = n.ok_or_else(|| value_err(path, name, "a head count", "nothing"))?;
            *slot = at_least_1(path, name, n)?;
        }
        Ok(ArchOverrides {
            vision_heads: v[0],
            heads: v[1],
            kv_heads: v[2],
            head_dim: v[3],
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The error and its sources, as `{:#}` shows them.
    fn full(e: &CheckpointError) -> String {
        let mut s = e.to_string();
        let mut src = std::error::Error::source(e);
        while let Some(c) = src {
            s += &format!(": {c}");
            src = c.source();
        }
        s
    }

    #[test]
    fn when_config_field_has_wrong_type_expect_file_and_field_named() {
        let p = Path::new("ck/config.json");
        let e = PolicyConfigJson::parse(p, r#"{"chunk_size": "fifty"}"#).unwrap_err();
        let m = full(&e);
        assert!(
            m.contains("ck/config.json") && m.contains("`chunk_size`") && m.contains("string"),
            "{m}"
        );
        // Cameras in the file's order (not sorted), VISUAL features only.
        let c = PolicyConfigJson::parse(
            p,
            r#"{"input_features": {"observation.images.wrist": {"type": "VISUAL", "shape": [3, 224, 224]},
                "observation.state": {"type": "STATE", "shape": [7]},
                "observation.images.base": {"type": "VISUAL", "shape": [3, 224, 224]}}}"#,
        )
        .unwrap();
        assert_eq!(c.camera_names, ["wrist", "base"]);
        let e = PolicyConfigJson::parse(p, r#"{"input_features": {"a": {"type": "STATE"}}}"#)
            .unwrap_err();
        assert!(full(&e).contains("`input_features`"), "{}", full(&e));
    }

    #[test]
    fn when_config_is_malformed_json_expect_file_and_position_named() {
        let p = Path::new("ck/config.json");
        let e = PolicyConfigJson::parse(p, "{\"chunk_size\": 50,").unwrap_err();
        let m = full(&e);
        assert!(m.contains("ck/config.json") && m.contains("line 1"), "{m}");
        let e = PolicyConfigJson::parse(p, "[1]").unwrap_err();
        assert!(full(&e).contains("expected a JSON object"), "{}", full(&e));
    }

    #[test]
    fn when_config_value_impossible_expect_field_expected_and_found() {
        let p = Path::new("config.json");
        for (json, field, found) in [
            (
                r#"{"num_inference_steps": 0}"#,
                "num_inference_steps",
                "found 0",
            ),
            (r#"{"chunk_size": 0}"#, "chunk_size", "found 0"),
            (r#"{"min_period": 5.0}"#, "min_period", "found 5"),
            (r#"{"max_period": -1.0}"#, "max_period", "found -1"),
            (
                r#"{"image_resolution": [0, 224]}"#,
                "image_resolution",
                "[0, 224]",
            ),
        ] {
            let m = full(&PolicyConfigJson::parse(p, json).unwrap_err());
            assert!(
                m.contains(&format!("`{field}`")) && m.contains(found),
                "{json}: {m}"
            );
        }
        assert!(PolicyConfigJson::parse(p, "{}").unwrap().from_file);
    }

    #[test]
    fn when_arch_json_wrong_expect_file_and_field_named() {
        let p = Path::new("ck/arch.json");
        let good = r#"{"vision_heads": 4, "heads": 8, "kv_heads": 1, "head_dim": 16}"#;
        assert_eq!(ArchOverrides::parse(p, good).unwrap().head_dim, 16);
        for (json, want) in [
            (good.replace("8", "\"8\""), "`heads`"),
            (
                good.replace("\"kv_heads\": 1", "\"kv_heads\": 0"),
                "`kv_heads`",
            ),
            (good.replace("\"head_dim\": 16", "\"dim\": 16"), "`dim`"),
            (good.replace(", \"head_dim\": 16", ""), "`head_dim`"),
            (good.replace('}', ""), "line 1"),
        ] {
            let m = full(&ArchOverrides::parse(p, &json).unwrap_err());
            assert!(
                m.contains("ck/arch.json") && m.contains(want),
                "{json}: {m}"
            );
        }
    }

    #[test]
    fn when_a_checkpoint_is_trained_for_rtc_expect_its_delay_taken_for_pi05_only_and_below_the_chunk(
    ) {
        let dir = Path::new("ck");
        let c = |json: &str| PolicyConfigJson::parse(&dir.join("config.json"), json).unwrap();
        assert_eq!(c("{}").trained_rtc(dir, true).unwrap(), None);
        assert_eq!(
            c(r#"{"rtc_training_max_delay": 0}"#)
                .trained_rtc(dir, true)
                .unwrap(),
            None
        );
        assert_eq!(
            c(r#"{"rtc_training_max_delay": 8}"#)
                .trained_rtc(dir, true)
                .unwrap(),
            Some(8)
        );
        let e = full(
            &c(r#"{"rtc_training_max_delay": 8}"#)
                .trained_rtc(dir, false)
                .unwrap_err(),
        );
        assert!(
            e.contains("`rtc_training_max_delay`") && e.contains("pi0"),
            "{e}"
        );
        let e = full(
            &c(r#"{"rtc_training_max_delay": 50, "chunk_size": 50}"#)
                .trained_rtc(dir, true)
                .unwrap_err(),
        );
        assert!(
            e.contains("less than chunk_size (50)") && e.contains("found 50"),
            "{e}"
        );
    }
}

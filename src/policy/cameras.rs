//! Which of the inputs' camera slots feeds each of the model's cameras: by name when the
//! configuration names them (`[ros.cameras]` as a table, or the simulator's camera names),
//! else by position. A model camera with no source must be declared optional (it is then fed
//! as lerobot feeds a missing camera: an all -1 image, masked); a source the model has no
//! camera for is refused. Either way both sides are named. A name goes through the
//! checkpoint's `rename_map` first, as lerobot renames the robot's observation keys.

use std::collections::BTreeMap;

use crate::config::CameraSource;

/// What the model's cameras are: their names (in the model's order), or only their count.
pub(crate) struct ModelCameras<'a> {
    pub names: &'a [String],
    pub count: usize,
    /// Where the names come from, for messages (`DIR/config.json`).
    pub source: &'a str,
    /// The checkpoint's renames of camera names (the robot's name -> the model's), from its
    /// preprocessor's `rename_observations_processor`.
    pub renames: &'a BTreeMap<String, String>,
}

impl ModelCameras<'_> {
    fn describe(&self) -> String {
        if self.names.is_empty() {
            format!("{} unnamed camera(s) ({})", self.count, self.source)
        } else {
            let names: Vec<String> = self
                .names
                .iter()
                .map(|n| format!("`{n}` (observation.images.{n})"))
                .collect();
            format!("{} in {}", names.join(", "), self.source)
        }
    }

    fn shown(&self, k: usize) -> String {
        match self.names.get(k) {
            Some(n) => format!("`{n}` (observation.images.{n} in {})", self.source),
            None => format!("camera {k} of {}", self.describe()),
        }
    }
}

/// Why the inputs' cameras cannot feed the model's: both sides named, as the configuration and
/// the checkpoint name them.
#[derive(Debug, thiserror::Error)]
pub enum BindError {
    #[error("policy.optional_cameras: `{name}` is not a camera of the model, which has {model}")]
    NotInModel { name: String, model: String },
    #[error("{input}: the model does not name its cameras ({model}), so cameras are matched by position: list the topics as ros.cameras = [...] in the model's order")]
    ModelUnnamed { input: String, model: String },
    #[error("{input}: the model has no camera `{name}`{renamed}; it has {model}")]
    NoSuchCamera {
        input: String,
        name: String,
        /// How the checkpoint renamed the input's name to `name`, if it did.
        renamed: String,
        model: String,
    },
    #[error("{input}: one camera too many; the model has {model}")]
    TooMany { input: String, model: String },
    #[error("{first} and {second} both feed the model's camera {camera}")]
    Twice {
        first: String,
        second: String,
        camera: String,
    },
    #[error("the model's camera {camera} has no source: {hint}")]
    NoSource { camera: String, hint: String },
}

/// Per model camera, the slot of `sources` that feeds it (`None`: an optional camera with no
/// source). `optional` names model cameras that may go without one.
pub(crate) fn bind(
    model: &ModelCameras,
    sources: &[CameraSource],
    optional: &[String],
) -> Result<Vec<Option<usize>>, BindError> {
    for name in optional {
        if !model.names.contains(name) {
            return Err(BindError::NotInModel {
                name: name.clone(),
                model: model.describe(),
            });
        }
    }
    let mut slots: Vec<Option<usize>> = vec![None; model.count];
    for (i, src) in sources.iter().enumerate() {
        let k = match &src.model_name {
            Some(given) => {
                let name = model.renames.get(given).unwrap_or(given);
                match model.names.iter().position(|n| n == name) {
                    Some(k) => k,
                    None if model.names.is_empty() => {
                        return Err(BindError::ModelUnnamed {
                            input: src.shown.clone(),
                            model: model.source.to_string(),
                        })
                    }
                    None => {
                        return Err(BindError::NoSuchCamera {
                            input: src.shown.clone(),
                            name: name.clone(),
                            renamed: if name == given {
                                String::new()
                            } else {
                                format!(
                                " (observation.images.{given} is renamed to observation.images.{name} by the checkpoint's rename_map)"
                            )
                            },
                            model: model.describe(),
                        })
                    }
                }
            }
            None if i < model.count => i,
            None => {
                return Err(BindError::TooMany {
                    input: src.shown.clone(),
                    model: model.describe(),
                })
            }
        };
        if let Some(j) = slots[k] {
            return Err(BindError::Twice {
                first: sources[j].shown.clone(),
                second: src.shown.clone(),
                camera: model.shown(k),
            });
        }
        slots[k] = Some(i);
    }
    for (k, slot) in slots.iter().enumerate() {
        let optional = model.names.get(k).is_some_and(|n| optional.contains(n));
        if slot.is_none() && !optional {
            let hint = match model.names.get(k) {
                Some(n) => format!(
                    "map it (ros.cameras.{n} = \"/topic\", or a simulated camera named `{n}`) or list it in policy.optional_cameras"
                ),
                None => "add its topic to ros.cameras".to_string(),
            };
            return Err(BindError::NoSource {
                camera: model.shown(k),
                hint,
            });
        }
    }
    Ok(slots)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn named(names: &[&str]) -> Vec<CameraSource> {
        names
            .iter()
            .map(|n| CameraSource {
                model_name: Some(n.to_string()),
                shown: format!("ros.cameras.{n} = \"/{n}\""),
            })
            .collect()
    }

    fn positional(n: usize) -> Vec<CameraSource> {
        (0..n)
            .map(|i| CameraSource {
                model_name: None,
                shown: format!("ros.cameras[{i}] = \"/c{i}\""),
            })
            .collect()
    }

    static NO_RENAMES: BTreeMap<String, String> = BTreeMap::new();

    fn model<'a>(names: &'a [String], count: usize) -> ModelCameras<'a> {
        ModelCameras {
            names,
            count,
            source: "ck/config.json",
            renames: &NO_RENAMES,
        }
    }

    #[test]
    fn when_the_checkpoint_renames_a_camera_expect_the_robots_name_bound_to_the_models() {
        let names = vec!["cam_high".to_string(), "cam_wrist".to_string()];
        let renames: BTreeMap<String, String> = [("top".into(), "cam_high".into())].into();
        let m = ModelCameras {
            renames: &renames,
            ..model(&names, 2)
        };
        // The robot's `top` feeds the model's cam_high; a model name not renamed binds as is.
        let slots = bind(&m, &named(&["cam_wrist", "top"]), &[]).unwrap();
        assert_eq!(slots, [Some(1), Some(0)]);
        // A rename to a camera the model does not have says so.
        let odd: BTreeMap<String, String> = [("top".into(), "cam_left".into())].into();
        let m = ModelCameras {
            renames: &odd,
            ..model(&names, 2)
        };
        let e = bind(&m, &named(&["top"]), &[]).unwrap_err().to_string();
        assert!(
            e.contains("no camera `cam_left` (observation.images.top is renamed to observation.images.cam_left"),
            "{e}"
        );
    }

    #[test]
    fn when_cameras_are_named_expect_them_bound_by_name_whatever_the_order() {
        let names = vec!["base".to_string(), "wrist".to_string()];
        let slots = bind(&model(&names, 2), &named(&["wrist", "base"]), &[]).unwrap();
        assert_eq!(slots, [Some(1), Some(0)]);
    }

    #[test]
    fn when_a_model_camera_has_no_source_expect_refused_unless_optional() {
        let names = vec!["base".to_string(), "wrist".to_string()];
        let e = bind(&model(&names, 2), &named(&["base"]), &[])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("`wrist` (observation.images.wrist in ck/config.json) has no source")
                && e.contains("policy.optional_cameras"),
            "{e}"
        );
        let slots = bind(&model(&names, 2), &named(&["base"]), &["wrist".into()]).unwrap();
        assert_eq!(slots, [Some(0), None]);
    }

    #[test]
    fn when_a_source_is_extra_or_unknown_expect_both_sides_named() {
        let names = vec!["front".to_string()];
        let e = bind(&model(&names, 1), &named(&["front", "top"]), &[])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("ros.cameras.top = \"/top\"")
                && e.contains("`front` (observation.images.front)"),
            "{e}"
        );
        let e = bind(&model(&names, 1), &positional(2), &[])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("ros.cameras[1]") && e.contains("one camera too many"),
            "{e}"
        );
        let e = bind(&model(&names, 1), &positional(0), &[])
            .unwrap_err()
            .to_string();
        assert!(e.contains("`front`") && e.contains("has no source"), "{e}");
        let e = bind(&model(&names, 1), &named(&["front"]), &["wrist".into()])
            .unwrap_err()
            .to_string();
        assert!(e.contains("policy.optional_cameras: `wrist`"), "{e}");
    }

    #[test]
    fn when_the_model_names_no_cameras_expect_positions_and_names_refused() {
        let slots = bind(&model(&[], 2), &positional(2), &[]).unwrap();
        assert_eq!(slots, [Some(0), Some(1)]);
        let e = bind(&model(&[], 1), &named(&["front"]), &[])
            .unwrap_err()
            .to_string();
        assert!(e.contains("matched by position"), "{e}");
    }
}

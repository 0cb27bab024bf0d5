//! Serving the policy to remote robots: `serve` puts pi0d's model behind openpi's websocket
//! policy protocol (frames in `policy::openpi::msgpack_numpy`) for any openpi client. pi0d's own
//! client of that protocol is a policy backend (`policy::openpi`).

pub mod admission;
pub(crate) mod head;
pub(crate) mod refusal;
pub(crate) mod request;
pub mod serve;
mod worker;

use crate::config::serve::ServeKeys;
use crate::policy::pi0::pipeline::Pi0Pipeline;
use request::Layout;

/// The keys a server for `pipeline` takes: by default the checkpoint's own feature names
/// (`observation.images.<camera>`, `observation.state`; the robot's names where the
/// checkpoint's `rename_map` renames them) and `prompt`, each renamed where `keys` says. `optional` names the cameras a request may leave out; an unknown camera name
/// (in either) is refused.
pub fn checkpoint_layout(
    pipeline: &Pi0Pipeline,
    optional: &[String],
    keys: &ServeKeys,
) -> Result<Layout, refusal::LayoutError> {
    let names: Vec<String> = if pipeline.camera_names.len() == pipeline.cameras {
        pipeline.camera_names.clone()
    } else {
        (0..pipeline.cameras)
            .map(|i| format!("camera{i}"))
            .collect()
    };
    if let Some(bad) = optional.iter().find(|o| !names.contains(o)) {
        return Err(refusal::LayoutError::OptionalCamera {
            camera: bad.clone(),
            cameras: names.join(", "),
        });
    }
    if let Some(bad) = keys.images.keys().find(|c| !names.contains(c)) {
        return Err(refusal::LayoutError::ImageKey {
            camera: bad.clone(),
            cameras: names.join(", "),
        });
    }
    Ok(Layout {
        image_keys: names
            .iter()
            .map(|n| {
                keys.images.get(n).cloned().unwrap_or_else(|| {
                    // The key the robot sends: the checkpoint's rename_map undone.
                    pipeline
                        .processor
                        .source_key(&format!("observation.images.{n}"))
                })
            })
            .collect(),
        optional: names.iter().map(|n| optional.contains(n)).collect(),
        state_key: keys
            .state_key
            .clone()
            .unwrap_or_else(|| pipeline.processor.source_key("observation.state")),
        state_dim: pipeline.state_dim,
        prompt_key: keys.prompt_key.clone().unwrap_or_else(|| "prompt".into()),
        ignored: keys.ignore.clone(),
        noise_shape: [pipeline.arch.chunk, pipeline.arch.action_dim],
        actions_shape: [pipeline.arch.chunk, pipeline.action_dim],
    })
}

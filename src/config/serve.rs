//! `[serve]`: how `pi0d serve --config` serves the `[policy]` section: where it listens, the
//! key clients must send, and the request keys when they are not the checkpoint's own
//! (openpi's `observation/image`, `observation/wrist_image`, `observation/state`; LIBERO,
//! ALOHA or DROID layouts), and how long clients may take. Its numeric settings are ranged
//! in `ranges.rs` (checked before this validator runs), whose ranges `pi0d serve`'s options
//! of the same names parse through.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use serde::Deserialize;

use super::check::Check;
use super::ConfigError;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawServe {
    pub(crate) listen: Option<String>,
    pub(crate) api_key_env: Option<String>,
    /// Model camera (config.json's `observation.images.<name>`) -> request key.
    #[serde(default)]
    pub(crate) images: BTreeMap<String, String>,
    pub(crate) state_key: Option<String>,
    pub(crate) prompt_key: Option<String>,
    /// Keys accepted and dropped (a client's extra fields the model does not take).
    #[serde(default)]
    pub(crate) ignore: Vec<String>,
    pub(crate) queue: Option<u32>,
    pub(crate) max_request_mib: Option<u32>,
    pub(crate) handshake_timeout_s: Option<f64>,
    pub(crate) idle_timeout_s: Option<f64>,
}

/// Defaults of `[serve]`'s timeouts (their ranges: `ranges::SERVE_*`).
pub const DEFAULT_HANDSHAKE_TIMEOUT_S: f64 = 5.0;
pub const DEFAULT_IDLE_TIMEOUT_S: f64 = 60.0;

/// Request keys; each `None` or empty is the checkpoint's own name.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ServeKeys {
    pub images: BTreeMap<String, String>,
    pub state_key: Option<String>,
    pub prompt_key: Option<String>,
    pub ignore: Vec<String>,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct ServeConfig {
    pub listen: Option<SocketAddr>,
    pub api_key_env: Option<String>,
    pub keys: ServeKeys,
    pub queue: Option<u32>,
    pub max_request_mib: Option<u32>,
    pub handshake_timeout_s: Option<f64>,
    pub idle_timeout_s: Option<f64>,
}

pub(crate) fn validate(c: &Check, r: &RawServe) -> Result<ServeConfig, ConfigError> {
    let listen = match &r.listen {
        None => None,
        Some(a) => match a.parse::<SocketAddr>() {
            Ok(a) => Some(a),
            Err(_) => {
                return c.fail(
                    "serve.listen",
                    format!("\"{a}\" is not an address and port such as \"127.0.0.1:8000\""),
                )
            }
        },
    };
    let mut seen: Vec<(String, String)> = Vec::new();
    let mut key = |field: String, k: &str| -> Result<(), ConfigError> {
        if k.is_empty() || k.len() > 256 {
            return c.fail(&field, "expected a key of 1 to 256 characters");
        }
        if let Some((_, other)) = seen.iter().find(|(s, _)| *s == k) {
            return c.fail(&field, format!("key \"{k}\" is {other}'s too"));
        }
        seen.push((k.to_string(), field));
        Ok(())
    };
    for (cam, k) in &r.images {
        key(format!("serve.images.{cam}"), k)?;
    }
    if let Some(k) = &r.state_key {
        key("serve.state_key".into(), k)?;
    }
    if let Some(k) = &r.prompt_key {
        key("serve.prompt_key".into(), k)?;
    }
    for (i, k) in r.ignore.iter().enumerate() {
        key(format!("serve.ignore[{i}]"), k)?;
    }
    Ok(ServeConfig {
        listen,
        api_key_env: r.api_key_env.clone(),
        keys: ServeKeys {
            images: r.images.clone(),
            state_key: r.state_key.clone(),
            prompt_key: r.prompt_key.clone(),
            ignore: r.ignore.clone(),
        },
        queue: r.queue,
        max_request_mib: r.max_request_mib,
        handshake_timeout_s: r.handshake_timeout_s,
        idle_timeout_s: r.idle_timeout_s,
    })
}

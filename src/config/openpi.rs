//! `[policy.openpi]`: the policy runs on a remote server speaking openpi's websocket protocol
//! (openpi's own server, `pi0d serve`, or anything compatible). Where it is, how to
//! authenticate, how long to wait, and how the observation is laid out for it.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::Deserialize;

use super::check::Check;
use super::ConfigError;

/// `[policy.openpi]` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawOpenpi {
    /// openpi: the server's address.
    pub(crate) url: Option<String>,
    /// zenoh: the key the servers' queryables answer on.
    pub(crate) key: Option<String>,
    /// zenoh: endpoints to connect to and listen on.
    #[serde(default)]
    pub(crate) connect: Vec<String>,
    #[serde(default)]
    pub(crate) listen: Vec<String>,
    /// zenoh: a session file (JSON5: TLS, access control), the whole configuration.
    pub(crate) session_config: Option<PathBuf>,
    /// zenoh: allow multicast scouting (default false).
    pub(crate) multicast_scouting: Option<bool>,
    /// The key itself (prefer api_key_env or api_key_file: a config file is often shared).
    pub(crate) api_key: Option<String>,
    pub(crate) api_key_env: Option<String>,
    pub(crate) api_key_file: Option<PathBuf>,
    /// wss://: certificates (PEM) trusted besides the public roots (a private CA).
    pub(crate) ca_file: Option<PathBuf>,
    pub(crate) connect_timeout_s: Option<f64>,
    pub(crate) request_timeout_s: Option<f64>,
    pub(crate) reconnect_initial_s: Option<f64>,
    pub(crate) reconnect_max_s: Option<f64>,
    /// Camera name (ros.cameras / sim.cameras) -> request key.
    pub(crate) images: Option<BTreeMap<String, String>>,
    pub(crate) state_key: Option<String>,
    pub(crate) prompt_key: Option<String>,
    /// Keys sent as they are with every request.
    #[serde(default)]
    pub(crate) extra: BTreeMap<String, toml::Value>,
    /// Images are resized with pad to this square before sending (0: as captured).
    pub(crate) image_size: Option<u32>,
    /// Reply columns used (the first ones, in policy.action_joints order); default the
    /// number of action joints.
    pub(crate) action_dim: Option<usize>,
    /// Largest reply accepted, MiB.
    pub(crate) max_reply_mib: Option<u32>,
}

/// A secret: shown as `***` by `Debug`, so `check` and the logs never print it.
#[derive(Clone, PartialEq)]
pub struct Secret(pub String);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("***")
    }
}

/// A constant sent with every request.
#[derive(Clone, Debug, PartialEq)]
pub enum ExtraValue {
    Text(String),
    Number(f64),
    Bool(bool),
}

#[derive(Clone, Debug, PartialEq)]
pub struct OpenpiOptions {
    /// ws://host:port[/path]
    pub url: String,
    pub api_key: Option<Secret>,
    /// wss://: extra trusted certificates (PEM).
    pub ca_file: Option<PathBuf>,
    pub connect_timeout_s: f64,
    pub request_timeout_s: f64,
    pub reconnect_initial_s: f64,
    pub reconnect_max_s: f64,
    /// Camera name -> key; `None`: each camera as `observation.images.<name>` (what
    /// `pi0d serve` takes).
    pub images: Option<BTreeMap<String, String>>,
    pub state_key: String,
    pub prompt_key: String,
    pub extra: Vec<(String, ExtraValue)>,
    pub image_size: u32,
    pub action_dim: Option<usize>,
    pub max_reply_bytes: usize,
    /// `policy.backend = "zenoh"`: requests are Zenoh queries (`url` then shows the key).
    pub zenoh: Option<ZenohLinkOptions>,
}

/// A policy served as a Zenoh queryable (`pi0d serve --zenoh KEY`).
#[derive(Clone, Debug, PartialEq)]
pub struct ZenohLinkOptions {
    pub key: String,
    /// Endpoints to connect to (a zenohd router, or the servers), e.g. `tcp/10.0.0.2:7447`.
    pub connect: Vec<String>,
    pub listen: Vec<String>,
    /// A Zenoh session file (JSON5): the whole configuration (TLS, mTLS, access control).
    pub session_config: Option<PathBuf>,
    /// Whether the session may scout by multicast (off unless set).
    pub multicast_scouting: bool,
}

impl OpenpiOptions {
    /// The key a camera is sent under.
    pub(crate) fn image_key(&self, camera: &str) -> Option<String> {
        match &self.images {
            Some(m) => m.get(camera).cloned(),
            None => Some(format!("observation.images.{camera}")),
        }
    }
}

/// The key from the config, its environment variable or its file.
fn api_key(c: &Check, o: &RawOpenpi) -> Result<Option<Secret>, ConfigError> {
    let given = [
        o.api_key.is_some(),
        o.api_key_env.is_some(),
        o.api_key_file.is_some(),
    ];
    if given.iter().filter(|g| **g).count() > 1 {
        return c.fail(
            "policy.openpi.api_key",
            "give one of api_key, api_key_env and api_key_file",
        );
    }
    let key = if let Some(k) = &o.api_key {
        k.clone()
    } else if let Some(name) = &o.api_key_env {
        match std::env::var(name) {
            Ok(k) => k,
            Err(_) => {
                return c.fail(
                    "policy.openpi.api_key_env",
                    format!("the environment variable {name} is not set"),
                )
            }
        }
    } else if let Some(file) = &o.api_key_file {
        let path = c.resolve(file);
        // Only a regular file: a FIFO would block start-up.
        match super::file::read_text(&path, 64 << 10) {
            Ok(k) => k.trim().to_string(),
            Err(e) => {
                return c.fail(
                    "policy.openpi.api_key_file",
                    format!("cannot read {}: {e}", path.display()),
                )
            }
        }
    } else {
        return Ok(None);
    };
    if key.is_empty() || key.chars().any(|ch| ch.is_control()) {
        return c.fail(
            "policy.openpi.api_key",
            "the key is empty or has control characters (it goes in an HTTP header)",
        );
    }
    Ok(Some(Secret(key)))
}

/// `[policy.openpi]`: openpi's websocket.
pub(crate) fn validate(c: &Check, o: &RawOpenpi) -> Result<OpenpiOptions, ConfigError> {
    let Some(url) = &o.url else {
        return c.fail(
            "policy.openpi.url",
            "required: the policy server, e.g. \"ws://gpu-box:8000\"",
        );
    };
    let tls = url.starts_with("wss://");
    if tls && !cfg!(feature = "tls") {
        return c.fail(
            "policy.openpi.url",
            "wss:// needs pi0d built with the `tls` feature (cargo build --features tls)",
        );
    }
    c.unused(
        "policy.openpi.ca_file",
        o.ca_file.is_some() && !tls,
        "only a wss:// url uses it",
    );
    let host = url
        .strip_prefix("ws://")
        .or_else(|| url.strip_prefix("wss://"))
        .map(|r| r.split('/').next().unwrap_or(""));
    match host {
        Some(h) if !h.is_empty() && !h.contains('@') => {}
        _ => {
            return c.fail(
                "policy.openpi.url",
                format!("\"{url}\" is not a ws:// or wss://host[:port][/path] address"),
            )
        }
    }
    for (field, given) in [
        ("key", o.key.is_some()),
        ("connect", !o.connect.is_empty()),
        ("listen", !o.listen.is_empty()),
        ("session_config", o.session_config.is_some()),
        ("multicast_scouting", o.multicast_scouting.is_some()),
    ] {
        c.unused(
            &format!("policy.openpi.{field}"),
            given,
            "only policy.backend = \"zenoh\" uses it",
        );
    }
    let mut opts = mapping(c, o, "openpi")?;
    opts.url = url.clone();
    opts.api_key = api_key(c, o)?;
    opts.ca_file = o.ca_file.as_deref().map(|p| c.resolve(p));
    Ok(opts)
}

/// `[policy.zenoh]`: a Zenoh query to the servers' queryable (`pi0d serve --zenoh KEY`).
pub(crate) fn validate_zenoh(c: &Check, o: &RawOpenpi) -> Result<OpenpiOptions, ConfigError> {
    let Some(key) = &o.key else {
        return c.fail(
            "policy.zenoh.key",
            "required: the key the servers answer on, e.g. \"pi0d/policy/arm\"",
        );
    };
    if key.is_empty()
        || key.contains(['*', '$', '?', '#'])
        || key.starts_with('/')
        || key.ends_with('/')
    {
        return c.fail(
            "policy.zenoh.key",
            format!("\"{key}\" is not a plain Zenoh key (no wildcards, no leading or trailing /)"),
        );
    }
    for (field, given) in [
        ("url", o.url.is_some()),
        (
            "api_key",
            o.api_key.is_some() || o.api_key_env.is_some() || o.api_key_file.is_some(),
        ),
        ("ca_file", o.ca_file.is_some()),
    ] {
        if given {
            return c.fail(
                &format!("policy.zenoh.{field}"),
                "not used over Zenoh: access is Zenoh's own (its access control and TLS settings)",
            );
        }
    }
    for (i, e) in o.connect.iter().chain(&o.listen).enumerate() {
        if !e.contains('/') {
            return c.fail(
                "policy.zenoh.connect",
                format!(
                    "endpoint {i} \"{e}\" is not a Zenoh locator such as \"tcp/10.0.0.2:7447\""
                ),
            );
        }
    }
    let mut opts = mapping(c, o, "zenoh")?;
    opts.url = format!("zenoh:{key}");
    opts.zenoh = Some(ZenohLinkOptions {
        key: key.clone(),
        connect: o.connect.clone(),
        listen: o.listen.clone(),
        session_config: o.session_config.as_ref().map(|p| c.resolve(p)),
        multicast_scouting: o.multicast_scouting.unwrap_or(false),
    });
    Ok(opts)
}

/// What both links share: timeouts, backoff and the observation's layout.
fn mapping(c: &Check, o: &RawOpenpi, section: &str) -> Result<OpenpiOptions, ConfigError> {
    let fld = |name: &str| format!("policy.{section}.{name}");
    // Each value is within its range (`ranges::RANGES`).
    let reconnect_initial_s = o.reconnect_initial_s.unwrap_or(0.2);
    let reconnect_max_s = o.reconnect_max_s.unwrap_or(5.0);
    if reconnect_max_s < reconnect_initial_s {
        return c.fail(
            &fld("reconnect_max_s"),
            format!("{reconnect_max_s} s is below reconnect_initial_s ({reconnect_initial_s} s)"),
        );
    }
    let key_problem = |k: &str| k.is_empty() || k.len() > 256;
    for (field, k) in [("state_key", &o.state_key), ("prompt_key", &o.prompt_key)] {
        if k.as_deref().is_some_and(key_problem) {
            return c.fail(&fld(field), "expected 1 to 256 characters");
        }
    }
    if let Some(m) = &o.images {
        if let Some((cam, _)) = m.iter().find(|(_, k)| key_problem(k)) {
            return c.fail(
                &fld(&format!("images.{cam}")),
                "expected a key of 1 to 256 characters",
            );
        }
    }
    let mut extra = Vec::with_capacity(o.extra.len());
    for (k, v) in &o.extra {
        let field = fld(&format!("extra.{k}"));
        extra.push((
            k.clone(),
            match v {
                toml::Value::String(s) => ExtraValue::Text(s.clone()),
                toml::Value::Integer(i) => ExtraValue::Number(*i as f64),
                toml::Value::Float(x) if x.is_finite() => ExtraValue::Number(*x),
                toml::Value::Boolean(b) => ExtraValue::Bool(*b),
                other => {
                    return c.fail(
                        &field,
                        format!(
                            "expected a string, a finite number or a boolean, found {}",
                            other.type_str()
                        ),
                    )
                }
            },
        ));
    }
    let image_size = o.image_size.unwrap_or(224);
    Ok(OpenpiOptions {
        url: String::new(),
        api_key: None,
        ca_file: None,
        connect_timeout_s: o.connect_timeout_s.unwrap_or(3.0),
        request_timeout_s: o.request_timeout_s.unwrap_or(2.0),
        reconnect_initial_s,
        reconnect_max_s,
        images: o.images.clone(),
        state_key: o
            .state_key
            .clone()
            .unwrap_or_else(|| "observation.state".into()),
        prompt_key: o.prompt_key.clone().unwrap_or_else(|| "prompt".into()),
        extra,
        image_size,
        action_dim: o.action_dim,
        max_reply_bytes: o.max_reply_mib.unwrap_or(16) as usize * 1024 * 1024,
        zenoh: None,
    })
}

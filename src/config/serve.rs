//! `[serve]`: how `pi0d serve --config` serves the `[policy]` section: where it listens, the
//! key clients must send, and the request keys when they are not the checkpoint's own
//! (openpi's `observation/image`, `observation/wrist_image`, `observation/state`; LIBERO,
//! ALOHA or DROID layouts), and how long clients may take. The ranges of its numeric settings
//! (`Bounds`) are also those of `pi0d serve`'s options.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use serde::Deserialize;

use super::check::Check;
use super::ConfigError;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawServe {
    pub listen: Option<String>,
    pub api_key_env: Option<String>,
    /// Model camera (config.json's `observation.images.<name>`) -> request key.
    #[serde(default)]
    pub images: BTreeMap<String, String>,
    pub state_key: Option<String>,
    pub prompt_key: Option<String>,
    /// Keys accepted and dropped (a client's extra fields the model does not take).
    #[serde(default)]
    pub ignore: Vec<String>,
    pub queue: Option<u32>,
    pub max_request_mib: Option<u32>,
    pub handshake_timeout_s: Option<f64>,
    pub idle_timeout_s: Option<f64>,
}

/// A numeric setting's range: finite, from `lo` (or above it, when `lo_open`) to `hi`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Bounds {
    pub lo: f64,
    pub lo_open: bool,
    pub hi: f64,
    /// Appended to the numbers in messages, e.g. " s".
    pub unit: &'static str,
}

impl Bounds {
    pub fn contains(self, x: f64) -> bool {
        x.is_finite() && (x > self.lo || (!self.lo_open && x == self.lo)) && x <= self.hi
    }

    /// "a number from 0.1 to 60 s", "a number above 0, at most 1000".
    pub fn expected(self) -> String {
        let (lo, hi, u) = (self.lo, self.hi, self.unit);
        if self.lo_open {
            format!("a number above {lo}{u}, at most {hi}{u}")
        } else {
            format!("a number from {lo} to {hi}{u}")
        }
    }

    /// Parses a command-line value: the error says what was expected.
    pub fn parse(self, s: &str) -> Result<f64, String> {
        match s.trim().parse::<f64>() {
            Ok(x) if self.contains(x) => Ok(x),
            _ => Err(format!("expected {}, found \"{s}\"", self.expected())),
        }
    }
}

/// A client must finish its HTTP request or websocket handshake within this.
pub const HANDSHAKE_TIMEOUT_S: Bounds = Bounds {
    lo: 0.1,
    lo_open: false,
    hi: 60.0,
    unit: " s",
};
pub const DEFAULT_HANDSHAKE_TIMEOUT_S: f64 = 5.0;
/// A session without a request for this long is closed.
pub const IDLE_TIMEOUT_S: Bounds = Bounds {
    lo: 0.1,
    lo_open: false,
    hi: 86_400.0,
    unit: " s",
};
pub const DEFAULT_IDLE_TIMEOUT_S: f64 = 60.0;
/// How long a request waits for others to batch with.
pub const BATCH_WINDOW_MS: Bounds = Bounds {
    lo: 0.0,
    lo_open: false,
    hi: 1000.0,
    unit: " ms",
};
/// Real-time chunking's guidance cap (lerobot's `max_guidance_weight`, default 10): a gain, so
/// above 0; beyond 1000 it no longer caps anything the guidance reaches.
pub const RTC_MAX_GUIDANCE: Bounds = Bounds {
    lo: 0.0,
    lo_open: true,
    hi: 1000.0,
    unit: "",
};

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

pub fn validate(c: &Check, r: &RawServe) -> Result<ServeConfig, ConfigError> {
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
    for (field, v, lo, hi) in [
        ("serve.queue", r.queue, 1, 1024),
        ("serve.max_request_mib", r.max_request_mib, 1, 1024),
    ] {
        if let Some(v) = v {
            if !(lo..=hi).contains(&v) {
                return c.fail(field, format!("expected {lo} to {hi}, found {v}"));
            }
        }
    }
    for (field, v, bounds) in [
        (
            "serve.handshake_timeout_s",
            r.handshake_timeout_s,
            HANDSHAKE_TIMEOUT_S,
        ),
        ("serve.idle_timeout_s", r.idle_timeout_s, IDLE_TIMEOUT_S),
    ] {
        if let Some(v) = v {
            if !bounds.contains(v) {
                return c.fail(field, format!("expected {}, found {v}", bounds.expected()));
            }
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn when_a_value_is_not_finite_or_outside_its_bounds_expect_refused_naming_the_range() {
        for bad in ["nan", "NaN", "inf", "-inf", "0", "-1", "1000.5", "x", ""] {
            let e = RTC_MAX_GUIDANCE.parse(bad).unwrap_err();
            assert!(e.contains("above 0, at most 1000"), "{bad}: {e}");
        }
        assert_eq!(RTC_MAX_GUIDANCE.parse("1000"), Ok(1000.0));
        assert_eq!(RTC_MAX_GUIDANCE.parse("0.5"), Ok(0.5));
        for bad in ["nan", "inf", "-0.1", "1001"] {
            let e = BATCH_WINDOW_MS.parse(bad).unwrap_err();
            assert!(e.contains("from 0 to 1000 ms"), "{bad}: {e}");
        }
        assert_eq!(BATCH_WINDOW_MS.parse("0"), Ok(0.0));
        for bad in ["0", "0.05", "nan", "61"] {
            assert!(HANDSHAKE_TIMEOUT_S.parse(bad).is_err(), "{bad}");
        }
        for bad in ["0", "inf", "86401"] {
            assert!(IDLE_TIMEOUT_S.parse(bad).is_err(), "{bad}");
        }
        assert!(IDLE_TIMEOUT_S.contains(DEFAULT_IDLE_TIMEOUT_S));
        assert!(HANDSHAKE_TIMEOUT_S.contains(DEFAULT_HANDSHAKE_TIMEOUT_S));
    }
}

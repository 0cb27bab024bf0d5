//! Every Zenoh session pi0d opens (the ROS link, the policy fleet's client, `pi0d serve`'s
//! queryable) starts closed, as rmw_zenoh's default session does: peer mode, multicast scouting
//! off, listening on this machine only, connecting to what the configuration names. A stranger
//! with Zenoh's own defaults (multicast scouting on) then never finds pi0d. Opening up is
//! explicit: multicast scouting only where a setting allows it (a session file that turns it on
//! is refused without that setting), and listening beyond loopback only on endpoints a setting
//! or a file names; the start log and `pi0d check` say which (`Exposure`).
//!
//! A session file (JSON5, as rmw_zenoh's `ZENOH_SESSION_CONFIG_URI`) is the whole
//! configuration, as rmw_zenoh takes it: TLS, mTLS and access control live there. pi0d's own
//! settings (endpoints, the largest message) go on top of it.
//!
//! The largest message is Zenoh's own receive limit (`transport/link/rx/max_message_size`):
//! a message over it is dropped fragment by fragment as it arrives, so a peer cannot make pi0d
//! buffer more than that, whatever it sends.

use std::fmt;
use std::path::{Path, PathBuf};

use crate::config::openpi::ZenohLinkOptions;
use crate::config::{Config, Io, Middleware, PolicySource, RosConfig};

/// Room for a message's own framing beyond its payload.
const FRAMING_BYTES: usize = 64 * 1024;

/// Where the settings of one session come from, named as the user wrote them.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Names {
    /// The session file's setting, e.g. `ros.zenoh_config`.
    pub(crate) file: &'static str,
    /// The setting that allows multicast scouting, e.g. `ros.zenoh_multicast_scouting`.
    pub(crate) multicast: &'static str,
}

/// One session's settings.
#[derive(Clone, Debug)]
pub(crate) struct Settings<'a> {
    pub(crate) names: Names,
    /// A session file (the whole configuration), if one is given.
    pub(crate) file: Option<&'a Path>,
    /// `key=value` JSON5 assignments over the file or the closed default (rmw_zenoh's
    /// `ZENOH_CONFIG_OVERRIDE`), before pi0d's own settings.
    pub(crate) overrides: &'a [(String, String)],
    pub(crate) connect: &'a [String],
    pub(crate) listen: &'a [String],
    /// Whether multicast scouting may be on (pi0d then turns it on where no file is given).
    pub(crate) multicast_scouting: bool,
    /// The largest message the session takes, payload bytes.
    pub(crate) max_message_bytes: usize,
}

/// Why a session cannot be configured.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error("{setting} ({}): not a Zenoh session configuration", path.display())]
    File {
        setting: &'static str,
        path: PathBuf,
        #[source]
        source: zenoh::Error,
    },
    #[error("{setting}: Zenoh does not take it")]
    Setting {
        setting: String,
        #[source]
        source: zenoh::Error,
    },
    #[error(
        "{origin} turns multicast scouting on (scouting/multicast/enabled, which Zenoh turns on \
         where a file leaves it out): any Zenoh peer on the network would find pi0d. Set it to \
         false there, or set {allow} = true to allow it"
    )]
    Multicast { origin: String, allow: &'static str },
    #[error("ZENOH_CONFIG_OVERRIDE: \"{0}\" is not key=value")]
    Override(String),
}

/// How far a session can be reached, for the start log and `pi0d check`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Exposure {
    pub(crate) listen: Vec<String>,
    pub(crate) connect: Vec<String>,
    pub(crate) multicast_scouting: bool,
    /// The session file, if the configuration is one.
    pub(crate) file: Option<PathBuf>,
}

impl Exposure {
    /// Whether a peer elsewhere on the network can find or reach the session.
    pub fn open(&self) -> bool {
        self.multicast_scouting || self.listen.iter().any(|e| !is_local(e))
    }
}

impl fmt::Display for Exposure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let network: Vec<&str> = self
            .listen
            .iter()
            .filter(|e| !is_local(e))
            .map(String::as_str)
            .collect();
        if self.open() {
            write!(f, "OPEN to the network:")?;
            if !network.is_empty() {
                write!(f, " listens on {}", network.join(", "))?;
            }
            if self.multicast_scouting {
                let sep = if network.is_empty() { "" } else { ";" };
                write!(
                    f,
                    "{sep} multicast scouting on (any Zenoh peer on the network finds it)"
                )?;
            }
        } else {
            write!(f, "closed: listens on this machine only")?;
            if !self.listen.is_empty() {
                write!(f, " ({})", self.listen.join(", "))?;
            }
            write!(f, ", multicast scouting off")?;
        }
        if self.connect.is_empty() {
            write!(f, "; connects to nothing")?;
        } else {
            write!(f, "; connects to {}", self.connect.join(", "))?;
        }
        if let Some(p) = &self.file {
            write!(f, " (session file {})", p.display())?;
        }
        Ok(())
    }
}

/// Whether a locator is reachable from this machine only: loopback addresses and Unix sockets.
fn is_local(locator: &str) -> bool {
    let Some((proto, addr)) = locator.split_once('/') else {
        return false;
    };
    if proto == "unixsock-stream" {
        return true;
    }
    // Drop the locator's metadata and configuration (`?...`, `#...`), then the port.
    let addr = addr.split(['?', '#']).next().unwrap_or(addr);
    let host = match addr.rsplit_once(':') {
        Some((h, _)) => h,
        None => addr,
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if host == "localhost" {
        return true;
    }
    host.parse::<std::net::IpAddr>()
        .is_ok_and(|ip| ip.is_loopback())
}

/// The session's configuration and how far it can be reached.
pub(crate) fn config(s: &Settings<'_>) -> Result<(zenoh::Config, Exposure), SessionError> {
    let mut c = match s.file {
        Some(path) => zenoh::Config::from_file(path).map_err(|source| SessionError::File {
            setting: s.names.file,
            path: path.to_path_buf(),
            source,
        })?,
        None => closed(s.multicast_scouting)?,
    };
    for (key, value) in s.overrides {
        set(&mut c, key, value, &format!("ZENOH_CONFIG_OVERRIDE {key}"))?;
    }
    let json = |v: &[String]| serde_json::to_string(v).unwrap_or_default();
    if !s.connect.is_empty() {
        set(
            &mut c,
            "connect/endpoints",
            &json(s.connect),
            "connect endpoints",
        )?;
    }
    if !s.listen.is_empty() {
        set(
            &mut c,
            "listen/endpoints",
            &json(s.listen),
            "listen endpoints",
        )?;
    }
    let max = s.max_message_bytes.saturating_add(FRAMING_BYTES);
    set(
        &mut c,
        "transport/link/rx/max_message_size",
        &max.to_string(),
        "the largest message",
    )?;
    let exposure = exposure(&c, s.file);
    if exposure.multicast_scouting && !s.multicast_scouting {
        // Only a file or an override can have turned it on.
        let origin = match s.file {
            Some(path) => format!("{} ({})", s.names.file, path.display()),
            None => "ZENOH_CONFIG_OVERRIDE".to_string(),
        };
        return Err(SessionError::Multicast {
            origin,
            allow: s.names.multicast,
        });
    }
    Ok((c, exposure))
}

/// The ROS session's configuration, as rmw_zenoh's: the file `ros.zenoh_config` names, else
/// `ZENOH_SESSION_CONFIG_URI`'s, else a closed session (loopback, no multicast scouting);
/// `ZENOH_CONFIG_OVERRIDE` over it; then `ros.zenoh_*` and the largest message (an image).
pub(crate) fn ros(cfg: &RosConfig) -> Result<(zenoh::Config, Exposure), SessionError> {
    let env_file = std::env::var_os("ZENOH_SESSION_CONFIG_URI")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from);
    let (file, file_name) = match (&cfg.zenoh_config, &env_file) {
        (Some(p), _) => (Some(p.as_path()), "ros.zenoh_config"),
        (None, Some(p)) => (Some(p.as_path()), "ZENOH_SESSION_CONFIG_URI"),
        (None, None) => (None, "ros.zenoh_config"),
    };
    let mut overrides = match std::env::var("ZENOH_CONFIG_OVERRIDE") {
        Ok(text) => overrides(&text)?,
        Err(_) => Vec::new(),
    };
    // ros.loopback_only: no discovery off the machine, whatever a file says, and a listener on
    // loopback unless endpoints are named; peers are reached through the endpoints.
    let loopback = ["tcp/127.0.0.1:0".to_string()];
    let listen = if cfg.loopback_only && cfg.zenoh_listen.is_empty() {
        &loopback[..]
    } else {
        &cfg.zenoh_listen
    };
    if cfg.loopback_only {
        overrides.push(("scouting/multicast/enabled".into(), "false".into()));
    }
    config(&Settings {
        names: Names {
            file: file_name,
            multicast: "ros.zenoh_multicast_scouting",
        },
        file,
        overrides: &overrides,
        connect: &cfg.zenoh_connect,
        listen,
        multicast_scouting: cfg.zenoh_multicast_scouting,
        max_message_bytes: cfg.max_image_bytes,
    })
}

/// The policy client's session (`[policy.zenoh]`), replies up to `max_reply_bytes`.
pub(crate) fn policy(
    opts: &ZenohLinkOptions,
    max_reply_bytes: usize,
) -> Result<(zenoh::Config, Exposure), SessionError> {
    config(&Settings {
        names: Names {
            file: "policy.zenoh.session_config",
            multicast: "policy.zenoh.multicast_scouting",
        },
        file: opts.session_config.as_deref(),
        overrides: &[],
        connect: &opts.connect,
        listen: &opts.listen,
        multicast_scouting: opts.multicast_scouting,
        max_message_bytes: max_reply_bytes,
    })
}

/// What `pi0d check` says of the Zenoh sessions a configuration opens: how far each can be
/// reached, or why it cannot be configured.
pub fn describe(cfg: &Config) -> Vec<String> {
    let line = |what: &str, r: Result<(zenoh::Config, Exposure), SessionError>| match r {
        Ok((_, e)) => format!("{what}: {e}"),
        Err(e) => format!("{what}: cannot be configured: {}", crate::errors::Chain(&e)),
    };
    let mut out = Vec::new();
    if let Io::Ros(r) = &cfg.io {
        if r.middleware == Middleware::Zenoh {
            out.push(line("Zenoh session (ROS 2)", ros(r)));
        }
    }
    if let PolicySource::Openpi(o) = &cfg.policy.source {
        if let Some(z) = &o.zenoh {
            out.push(line(
                "Zenoh session (policy servers)",
                policy(z, o.max_reply_bytes),
            ));
        }
    }
    out
}

/// rmw_zenoh's `ZENOH_CONFIG_OVERRIDE`: `key=value` JSON5 assignments separated by `;`.
pub(crate) fn overrides(text: &str) -> Result<Vec<(String, String)>, SessionError> {
    text.split(';')
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .map(|e| match e.split_once('=') {
            Some((k, v)) => Ok((k.trim().to_string(), v.trim().to_string())),
            None => Err(SessionError::Override(crate::outside::text(e).to_string())),
        })
        .collect()
}

/// rmw_zenoh's default session: a peer on loopback, no multicast scouting (unless allowed).
fn closed(multicast: bool) -> Result<zenoh::Config, SessionError> {
    let mut c = zenoh::Config::default();
    for (key, value) in [
        ("mode", "\"peer\""),
        ("listen/endpoints", r#"["tcp/127.0.0.1:0"]"#),
        (
            "scouting/multicast/enabled",
            if multicast { "true" } else { "false" },
        ),
    ] {
        set(&mut c, key, value, key)?;
    }
    Ok(c)
}

/// `key` = `value` (JSON5) in `c`; `setting` names where it came from if Zenoh refuses it.
fn set(c: &mut zenoh::Config, key: &str, value: &str, setting: &str) -> Result<(), SessionError> {
    c.insert_json5(key, value)
        .map_err(|source| SessionError::Setting {
            setting: setting.to_string(),
            source,
        })
}

/// What a configuration exposes, read back from it (a file's as much as pi0d's own).
fn exposure(c: &zenoh::Config, file: Option<&Path>) -> Exposure {
    let strings = |key: &str| -> Vec<String> {
        let v: serde_json::Value = c
            .get_json(key)
            .ok()
            .and_then(|j| serde_json::from_str(&j).ok())
            .unwrap_or_default();
        // Endpoints are a list, or a list per mode ({"peer": [...], "router": [...]}).
        let list = match &v {
            serde_json::Value::Object(m) => m.get("peer").cloned().unwrap_or_default(),
            other => other.clone(),
        };
        list.as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|e| e.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    };
    let multicast = c
        .get_json("scouting/multicast/enabled")
        .ok()
        .and_then(|j| serde_json::from_str::<Option<bool>>(&j).ok())
        .flatten()
        // Left out, it is Zenoh's default: on.
        .unwrap_or(true);
    Exposure {
        listen: strings("listen/endpoints"),
        connect: strings("connect/endpoints"),
        multicast_scouting: multicast,
        file: file.map(Path::to_path_buf),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NAMES: Names = Names {
        file: "ros.zenoh_config",
        multicast: "ros.zenoh_multicast_scouting",
    };

    fn settings<'a>(connect: &'a [String], listen: &'a [String]) -> Settings<'a> {
        Settings {
            names: NAMES,
            file: None,
            overrides: &[],
            connect,
            listen,
            multicast_scouting: false,
            max_message_bytes: 1 << 20,
        }
    }

    #[test]
    fn when_locators_are_classified_expect_loopback_and_unix_sockets_local() {
        for l in [
            "tcp/127.0.0.1:7447",
            "tcp/localhost:0",
            "tcp/[::1]:7447",
            "udp/127.0.0.2:9",
            "unixsock-stream//tmp/z.sock",
            "tls/127.0.0.1:7447?iface=lo",
        ] {
            assert!(is_local(l), "{l}");
        }
        for l in [
            "tcp/[::]:0",
            "tcp/0.0.0.0:7447",
            "tcp/10.0.0.2:7447",
            "tls/robot.local:7447",
            "nonsense",
        ] {
            assert!(!is_local(l), "{l}");
        }
    }

    #[test]
    fn when_only_endpoints_are_given_expect_a_closed_session_with_the_message_limit() {
        let connect = vec!["tcp/10.0.0.5:7447".to_string()];
        let (c, e) = config(&settings(&connect, &[])).unwrap();
        assert!(!e.open(), "{e}");
        assert_eq!(e.listen, ["tcp/127.0.0.1:0"]);
        assert_eq!(e.connect, connect);
        assert!(e.to_string().starts_with("closed"), "{e}");
        let max: usize = c
            .get_json("transport/link/rx/max_message_size")
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(max, (1 << 20) + FRAMING_BYTES);
        // Zenoh's own default would have been open on both counts.
        let z = exposure(&zenoh::Config::default(), None);
        assert!(z.open(), "{z}");
    }

    #[test]
    fn when_listening_beyond_loopback_or_scouting_expect_it_said_open() {
        let listen = vec!["tcp/0.0.0.0:7447".to_string()];
        let (_, e) = config(&settings(&[], &listen)).unwrap();
        assert!(e.open());
        assert!(e.to_string().contains("listens on tcp/0.0.0.0:7447"), "{e}");
        let mut s = settings(&[], &[]);
        s.multicast_scouting = true;
        let (_, e) = config(&s).unwrap();
        assert!(e.to_string().contains("multicast scouting on"), "{e}");
    }

    #[test]
    fn when_a_file_leaves_multicast_out_expect_it_refused_unless_allowed() {
        let dir = crate::test_dirs::TempDir::new("zenoh-session-file");
        let path = dir.join("session.json5");
        std::fs::write(
            &path,
            r#"{ mode: "peer", listen: { endpoints: ["tcp/127.0.0.1:0"] } }"#,
        )
        .unwrap();
        let mut s = settings(&[], &[]);
        s.file = Some(&path);
        let e = config(&s).unwrap_err().to_string();
        assert!(
            e.contains("ros.zenoh_config") && e.contains("ros.zenoh_multicast_scouting"),
            "{e}"
        );
        s.multicast_scouting = true;
        let (_, x) = config(&s).unwrap();
        assert!(x.open() && x.file.is_some(), "{x}");
        std::fs::write(
            &path,
            r#"{ listen: { endpoints: ["tcp/127.0.0.1:0"] }, scouting: { multicast: { enabled: false } } }"#,
        )
        .unwrap();
        s.multicast_scouting = false;
        let (_, x) = config(&s).unwrap();
        assert!(!x.open(), "{x}");
        let over = overrides(r#" scouting/multicast/enabled=true ; "#).unwrap();
        let mut s = settings(&[], &[]);
        s.overrides = &over;
        let e = config(&s).unwrap_err().to_string();
        assert!(
            e.starts_with("ZENOH_CONFIG_OVERRIDE turns multicast"),
            "{e}"
        );
        assert!(overrides("mode").is_err());
    }
}

//! `[metrics]`: an optional Prometheus text endpoint (`GET /metrics`), on localhost unless
//! `listen` says otherwise.

use std::net::SocketAddr;

use serde::Deserialize;

use super::check::Check;
use super::ConfigError;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawMetrics {
    pub(crate) listen: Option<String>,
}

#[derive(Clone, Debug, PartialEq)]
pub(crate) struct MetricsConfig {
    pub(crate) listen: SocketAddr,
}

/// The default port: Prometheus' own exporters start at 9100; 9464 is OpenTelemetry's.
pub(crate) const DEFAULT_LISTEN: &str = "127.0.0.1:9464";

pub(crate) fn validate(c: &Check, r: &RawMetrics) -> Result<MetricsConfig, ConfigError> {
    let text = r.listen.as_deref().unwrap_or(DEFAULT_LISTEN);
    match text.parse::<SocketAddr>() {
        Ok(listen) => {
            if !listen.ip().is_loopback() {
                c.warn(
                    "metrics.listen",
                    format!("{listen} is reachable from other machines; the endpoint has no authentication"),
                );
            }
            Ok(MetricsConfig { listen })
        }
        Err(_) => c.fail(
            "metrics.listen",
            format!("\"{text}\" is not an address and port such as \"{DEFAULT_LISTEN}\""),
        ),
    }
}

//! `[control.rtc]`: real-time chunking (each new chunk's first steps guided towards what is
//! still to be executed of the running one; `policy::rtc` computes it).

use serde::Deserialize;

use super::check::Check;
use super::policy::PolicySource;
use super::ConfigError;

/// How the prefix weights fade over the chunk (lerobot's `RTCAttentionSchedule`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Schedule {
    /// 1 for the first `delay` steps, 0 after.
    Zeros,
    /// 1 up to the execution horizon, 0 after.
    Ones,
    /// 1 for the first `delay` steps, then a linear ramp down to 0 at the horizon.
    #[default]
    Linear,
    /// As `Linear`, the ramp value `w` mapped to `w (e^w - 1) / (e - 1)`.
    Exp,
}

impl Schedule {
    pub(crate) const ALL: [Schedule; 4] = [
        Schedule::Zeros,
        Schedule::Ones,
        Schedule::Linear,
        Schedule::Exp,
    ];

    pub(crate) fn name(self) -> &'static str {
        match self {
            Schedule::Zeros => "zeros",
            Schedule::Ones => "ones",
            Schedule::Linear => "linear",
            Schedule::Exp => "exp",
        }
    }

    pub fn parse(s: &str) -> Option<Schedule> {
        Schedule::ALL.into_iter().find(|k| k.name() == s)
    }
}

impl std::fmt::Display for Schedule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The guidance settings that do not change from chunk to chunk.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RtcSettings {
    pub schedule: Schedule,
    /// The cap on the guidance weight (lerobot's `max_guidance_weight`, default 10).
    pub max_guidance_weight: f32,
}

impl Default for RtcSettings {
    fn default() -> Self {
        RtcSettings {
            schedule: Schedule::Linear,
            max_guidance_weight: 10.0,
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct RawRtc {
    pub(crate) enabled: bool,
    pub(crate) schedule: Schedule,
    pub(crate) max_guidance_weight: f64,
    pub(crate) execution_horizon: Option<u32>,
    /// A fixed inference delay in steps instead of the measured one.
    pub(crate) inference_delay_steps: Option<u32>,
}

impl Default for RawRtc {
    fn default() -> Self {
        RawRtc {
            enabled: false,
            schedule: Schedule::Linear,
            max_guidance_weight: 10.0,
            execution_horizon: None,
            inference_delay_steps: None,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RtcConfig {
    pub enabled: bool,
    pub settings: RtcSettings,
    /// Steps of a new chunk pulled towards the running one's leftover.
    pub execution_horizon: usize,
    /// `None`: from the measured latencies (the largest of the recent ones, in steps).
    pub inference_delay_steps: Option<usize>,
}

impl Default for RtcConfig {
    fn default() -> Self {
        RtcConfig {
            enabled: false,
            settings: RtcSettings::default(),
            execution_horizon: DEFAULT_EXECUTION_HORIZON,
            inference_delay_steps: None,
        }
    }
}

/// lerobot's default.
const DEFAULT_EXECUTION_HORIZON: usize = 10;

/// Validated against the policy's chunk length `chunk` (H): the horizon within 1..H-1; a
/// fixed delay d with d <= s <= H - d.
pub(crate) fn validate(
    c: &Check,
    r: &RawRtc,
    chunk: usize,
    source: &PolicySource,
) -> Result<RtcConfig, ConfigError> {
    // Within its range (`ranges::RANGES`), so finite as an f32 too.
    let beta = r.max_guidance_weight;
    let horizon = r.execution_horizon.map_or(
        DEFAULT_EXECUTION_HORIZON.min(chunk.saturating_sub(1)),
        |s| s as usize,
    );
    if horizon == 0 || horizon >= chunk {
        return c.fail(
            "control.rtc.execution_horizon",
            format!(
                "expected 1 to {} (below policy.chunk_steps = {chunk}), found {horizon}",
                chunk - 1
            ),
        );
    }
    let delay = r.inference_delay_steps.map(|d| d as usize);
    if let Some(d) = delay {
        if d > horizon {
            return c.fail(
                "control.rtc.inference_delay_steps",
                format!(
                    "{d} steps is beyond control.rtc.execution_horizon = {horizon}: every guided \
                     step would already have run (expected d <= s)"
                ),
            );
        }
        if horizon > chunk - d {
            return c.fail(
                "control.rtc.execution_horizon",
                format!(
                    "{horizon} steps is more than policy.chunk_steps - inference_delay_steps = \
                     {} (expected s <= H - d)",
                    chunk - d
                ),
            );
        }
    }
    if r.enabled {
        let guided = matches!(source, PolicySource::Pi0 { .. } | PolicySource::Openpi(_));
        if !guided {
            return c.fail(
                "control.rtc.enabled",
                "real-time chunking guides a model's denoising: policy.backend must be a model \
                 (cpu, onnx, acl) or a policy server (openpi)",
            );
        }
    } else {
        c.unused(
            "control.rtc",
            r.execution_horizon.is_some() || r.inference_delay_steps.is_some(),
            "control.rtc.enabled is false",
        );
    }
    Ok(RtcConfig {
        enabled: r.enabled,
        settings: RtcSettings {
            schedule: r.schedule,
            max_guidance_weight: beta as f32,
        },
        execution_horizon: horizon,
        inference_delay_steps: delay,
    })
}

//! `pi0d check`: the configuration, URDF and policy validated exactly as `run` does, what would
//! run printed (`pi0d::config::describe`), a remote policy server asked for its metadata, and a
//! last line that says in words whether `run` would start.

use std::fmt;
use std::path::{Path, PathBuf};

use clap::Args;

use pi0d::config::ros_args::{self, RosArgs};
use pi0d::config::{Config, OpenpiOptions, PolicySource};
use pi0d::daemon::exit::{error_chain, ExitReason};
use pi0d::daemon::log::{say, tell};
use pi0d::policy::openpi::{ServerInfo, Websocket};

use crate::{compute_threads, load_config, Failure, Outcome};

#[derive(Args)]
pub(crate) struct CheckArgs {
    /// Configuration file (or the ROS parameter `config` after --ros-args).
    #[arg(long)]
    config: Option<PathBuf>,
}

/// How a policy server's metadata disagrees with the configuration: every reply would be
/// refused, so `run` could never move the arm.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mismatch {
    /// The server's actions have fewer values than the configuration takes.
    ActionDim { server: usize, needed: usize },
    /// The server's chunks are longer than `policy.chunk_steps` (or shorter than 2 steps).
    Horizon { server: usize, max: usize },
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Mismatch::ActionDim { server, needed } => write!(
                f,
                "the server's action_dim is {server}, the configuration takes {needed} values per step (policy.action_joints, policy.openpi.action_dim)"
            ),
            Mismatch::Horizon { server, max } => write!(
                f,
                "the server's action_horizon is {server} steps, the configuration takes 2 to {max} (policy.chunk_steps)"
            ),
        }
    }
}

/// What the server says against what the client would accept (the same bounds the client
/// applies to each reply).
pub(crate) fn mismatches(
    info: &ServerInfo,
    action_dim: usize,
    chunk_steps: usize,
) -> Vec<Mismatch> {
    let mut out = Vec::new();
    if let Some(d) = info.action_dim.filter(|d| *d < action_dim) {
        out.push(Mismatch::ActionDim {
            server: d,
            needed: action_dim,
        });
    }
    if let Some(h) = info.action_horizon.filter(|h| *h < 2 || *h > chunk_steps) {
        out.push(Mismatch::Horizon {
            server: h,
            max: chunk_steps,
        });
    }
    out
}

/// What the check found besides the configuration's own warnings.
#[derive(Default)]
struct Findings {
    warnings: usize,
    errors: Vec<Mismatch>,
}

/// Connects to the openpi server as `run` would (the same client, its connect timeout) and
/// compares its metadata with the configuration. Down is a warning: the server may be started
/// after pi0d; a mismatch is an error.
fn probe(o: &OpenpiOptions, cfg: &Config, found: &mut Findings) -> Result<(), Failure> {
    let link = Websocket::new(o).map_err(|e| Failure::new(ExitReason::InvalidInput, e))?;
    match link.probe() {
        Ok(info) => {
            let needed = o
                .action_dim
                .unwrap_or(cfg.policy.action_map.action_names.len());
            let show = |x: Option<usize>| x.map_or("not given".to_string(), |x| x.to_string());
            say(&format!(
                "policy server: {} reachable; action_dim {} (configuration takes {needed}), action_horizon {} (configuration takes up to {}); metadata: {}",
                o.url,
                show(info.action_dim),
                show(info.action_horizon),
                cfg.policy.chunk_steps,
                info.summary
            ));
            for m in mismatches(&info, needed, cfg.policy.chunk_steps) {
                tell(&format!("error: policy server {}: {m}", o.url));
                found.errors.push(m);
            }
        }
        Err(e) => {
            found.warnings += 1;
            tell(&format!(
                "warning: policy server {} is not reachable (within policy.openpi.connect_timeout_s = {} s): {}; `run` starts anyway, keeps connecting, and the arm does not move until the server answers",
                o.url,
                o.connect_timeout_s,
                error_chain(&e)
            ));
        }
    }
    Ok(())
}

/// The last line: whether `run` would start with `file`.
pub(crate) fn verdict(file: Option<&Path>, warnings: usize, errors: usize) -> String {
    let (name, run) = match file {
        Some(f) => (
            f.display().to_string(),
            format!("pi0d run --config {}", f.display()),
        ),
        None => ("the configuration".to_string(), "pi0d run".to_string()),
    };
    let warned = match warnings {
        0 => String::new(),
        1 => " with 1 warning (above)".to_string(),
        n => format!(" with {n} warnings (above)"),
    };
    match errors {
        0 => format!("check: {name} is valid{warned}; {run} would start"),
        n => format!(
            "check: {name} is NOT valid: {n} error{} (above){}; {run} would not run it",
            if n == 1 { "" } else { "s" },
            if warnings > 0 {
                format!(", {warnings} warning(s)")
            } else {
                String::new()
            }
        ),
    }
}

fn check_inner(a: CheckArgs, ros: &RosArgs, found: &mut Findings) -> Result<(), Failure> {
    let cfg = load_config(a.config, ros)?;
    for line in pi0d::config::describe::describe(&cfg) {
        say(&line);
    }
    #[cfg(feature = "zenoh")]
    for line in pi0d::zenoh_session::describe(&cfg) {
        say(&line);
    }
    found.warnings += cfg.warnings.len();
    compute_threads(cfg.policy.threads())?;
    // The policy too, as `run` builds it: a pi0 checkpoint is loaded and checked tensor by
    // tensor, its processor files against the model's widths.
    let p =
        pi0d::policy::from_config(&cfg).map_err(|e| Failure::new(ExitReason::InvalidInput, e))?;
    match &cfg.policy.source {
        PolicySource::Openpi(o) if o.zenoh.is_none() => {
            say(&format!("policy: openpi client for {} set up", o.url));
            probe(o, &cfg, found)?;
        }
        PolicySource::Openpi(o) => say(&format!(
            "policy: openpi client over Zenoh set up ({}; servers are found at run time, not probed)",
            o.zenoh.as_ref().map_or("", |z| z.key.as_str())
        )),
        PolicySource::Pi0 { checkpoint, .. } => {
            say(&format!("policy: {} loaded", p.name()));
            for line in p.describe() {
                say(&line);
            }
            say(&weights_line(checkpoint, p.weight_bytes()));
        }
        _ => say(&format!("policy: {} loaded", p.name())),
    }
    let peak = pi0d::daemon::load::peak_resident_bytes();
    if peak > 0 {
        say(&format!(
            "memory: peak {} MB resident so far (the load included)",
            peak >> 20
        ));
    }
    Ok(())
}

/// How a pi0 checkpoint stores its weights (its `quantization.json`), what they take in memory
/// once loaded, and whether that fits the memory this machine has available now.
fn weights_line(checkpoint: &std::path::Path, bytes: Option<u64>) -> String {
    use pi0d::policy::pi0::quant::{Manifest, Rounding, Scheme, MANIFEST};
    let manifest = std::fs::read_to_string(checkpoint.join(MANIFEST))
        .ok()
        .and_then(|t| serde_json::from_str::<Manifest>(&t).ok());
    let stored = match manifest {
        Some(m) => format!(
            "{}{}{} (quantized: {}; as the checkpoint had them: {})",
            m.scheme,
            m.block.map(|b| format!(" in blocks of {b}")).unwrap_or_default(),
            match (m.scheme, m.rounding) {
                (Scheme::Bf16, _) => String::new(),
                (_, Rounding::Gptq) => format!(
                    ", calibrated on {} file(s) (GPTQ rounding)",
                    m.calibration.len()
                ),
                (_, Rounding::Nearest) => ", rounded to nearest (not calibrated)".into(),
            },
            list(m.quantized_groups.iter().map(|g| g.name())),
            list(m.float_groups.iter().map(|g| g.name())),
        ),
        None => "as the checkpoint stores them (not quantized: `pi0d quantize` makes w8, w8a8, w4 or bf16 copies)".into(),
    };
    let Some(bytes) = bytes else {
        return format!("weights: {stored}; held by the graph runtime");
    };
    let mb = |b: u64| b as f64 / 1e6;
    let fits = match available_memory() {
        Some(avail) if bytes <= avail => {
            format!("{:.0} MB available here: fits", mb(avail))
        }
        Some(avail) => format!(
            "{:.0} MB available here: DOES NOT FIT (try `pi0d quantize`, or a remote policy)",
            mb(avail)
        ),
        None => "available memory unknown (no /proc/meminfo)".into(),
    };
    format!("weights: {stored}; {:.1} MB resident; {fits}", mb(bytes))
}

fn list<'a>(names: impl Iterator<Item = &'a str>) -> String {
    let v: Vec<&str> = names.collect();
    if v.is_empty() {
        "none".into()
    } else {
        v.join(", ")
    }
}

/// MemAvailable from /proc/meminfo, in bytes.
fn available_memory() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

pub(crate) fn check(a: CheckArgs, ros: &RosArgs) -> Outcome {
    // The file as given, for the verdict (it is named even when it does not load).
    let file = ros_args::config_file(a.config.clone(), ros)
        .ok()
        .flatten()
        .map(|(p, _)| p);
    let mut found = Findings::default();
    match check_inner(a, ros, &mut found) {
        Ok(()) if found.errors.is_empty() => {
            say(&verdict(file.as_deref(), found.warnings, 0));
            Ok(ExitReason::Clean)
        }
        Ok(()) => {
            say(&verdict(
                file.as_deref(),
                found.warnings,
                found.errors.len(),
            ));
            Ok(ExitReason::InvalidInput)
        }
        Err(f) => {
            tell(&format!("error: {}", error_chain(f.error.as_ref())));
            say(&verdict(file.as_deref(), found.warnings, 1));
            Ok(f.reason)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(action_dim: Option<usize>, action_horizon: Option<usize>) -> ServerInfo {
        ServerInfo {
            action_dim,
            action_horizon,
            summary: String::new(),
        }
    }

    #[test]
    fn when_the_config_is_valid_expect_a_verdict_that_run_would_start() {
        let p = Path::new("config/sim.toml");
        assert_eq!(
            verdict(Some(p), 0, 0),
            "check: config/sim.toml is valid; pi0d run --config config/sim.toml would start"
        );
        assert_eq!(
            verdict(Some(p), 2, 0),
            "check: config/sim.toml is valid with 2 warnings (above); pi0d run --config config/sim.toml would start"
        );
    }

    #[test]
    fn when_the_config_has_errors_expect_a_verdict_that_run_would_refuse() {
        let v = verdict(Some(Path::new("x.toml")), 1, 1);
        assert_eq!(
            v,
            "check: x.toml is NOT valid: 1 error (above), 1 warning(s); pi0d run --config x.toml would not run it"
        );
        assert!(verdict(None, 0, 2).starts_with("check: the configuration is NOT valid: 2 errors"));
    }

    #[test]
    fn when_the_server_metadata_fits_the_config_expect_no_mismatch() {
        assert!(mismatches(&info(Some(32), Some(50)), 7, 50).is_empty());
        // A server that says nothing of them is not faulted.
        assert!(mismatches(&info(None, None), 7, 50).is_empty());
    }

    #[test]
    fn when_the_server_metadata_disagrees_expect_each_mismatch_named() {
        assert_eq!(
            mismatches(&info(Some(6), Some(51)), 7, 50),
            [
                Mismatch::ActionDim {
                    server: 6,
                    needed: 7
                },
                Mismatch::Horizon {
                    server: 51,
                    max: 50
                }
            ]
        );
        assert_eq!(
            mismatches(&info(Some(7), Some(1)), 7, 50),
            [Mismatch::Horizon { server: 1, max: 50 }]
        );
        let text = Mismatch::ActionDim {
            server: 6,
            needed: 7,
        }
        .to_string();
        assert!(
            text.contains("action_dim is 6") && text.contains("takes 7"),
            "{text}"
        );
    }
}

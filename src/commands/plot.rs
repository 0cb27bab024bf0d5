//! `pi0d plot`: a recording (`[record]`, MCAP) drawn as one PNG.

use std::path::PathBuf;

use clap::Args;

use pi0d::daemon::exit::ExitReason;
use pi0d::daemon::log::say;
use pi0d::record::{plot, read};

use crate::{check_parent_writable, Failure, Outcome};

#[derive(Args)]
pub(crate) struct PlotArgs {
    /// A recording made by `[record]` (MCAP).
    recording: PathBuf,
    /// The PNG to write [default: the recording's path with .png].
    #[arg(long)]
    out: Option<PathBuf>,
}

pub(crate) fn plot(a: PlotArgs) -> Outcome {
    let out = a.out.unwrap_or_else(|| a.recording.with_extension("png"));
    check_parent_writable(&out, "--out")?;
    let trace = read::read(&a.recording).map_err(|e| Failure::new(ExitReason::InvalidInput, e))?;
    if let Some(why) = &trace.truncated {
        tracing::warn!(
            file = %a.recording.display(),
            "the recording ends early ({why}); plotting what it holds"
        );
    }
    let name = a
        .recording
        .file_name()
        .map(|n| n.to_string_lossy().to_string())
        .unwrap_or_default();
    let (w, h) =
        plot::plot(&trace, &name, &out).map_err(|e| Failure::new(ExitReason::RuntimeFailure, e))?;
    say(&format!(
        "plotted {} joints over {:.1} s ({} chunks, {} spans not running) to {} ({w}x{h})",
        trace.joints.len(),
        trace.duration_s(),
        trace.chunk_arrivals_s.len(),
        trace.spans.len(),
        out.display()
    ));
    Ok(ExitReason::Clean)
}

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
    if let Some(why) = &trace.partial {
        tracing::warn!(
            file = %a.recording.display(),
            "{why}; plotting what it holds up to there"
        );
    }
    let (w, h) = plot::plot(&trace, &out).map_err(|e| {
        let reason = match e {
            plot::PlotError::Empty { .. } | plot::PlotError::TooManyJoints { .. } => {
                ExitReason::InvalidInput
            }
            plot::PlotError::Draw { .. } | plot::PlotError::Write { .. } => {
                ExitReason::RuntimeFailure
            }
        };
        Failure::new(reason, e)
    })?;
    say(&format!(
        "plotted {} joints over {:.1} s ({} chunks, {} spans not running) from {} to {} ({w}x{h})",
        trace.joints.len(),
        trace.duration_s(),
        trace.chunks,
        trace.spans.len(),
        a.recording.display(),
        out.display()
    ));
    Ok(ExitReason::Clean)
}

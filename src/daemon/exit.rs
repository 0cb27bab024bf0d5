//! Why pi0d ended, and the process exit code for it: one table, here and in docs/safety.md, so
//! systemd (`RestartPreventExitStatus=`, `SuccessExitStatus=`) and people can tell failures apart.

use serde::Serialize;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ExitReason {
    /// `--duration` elapsed or SIGINT/SIGTERM: the arm was brought to rest.
    #[default]
    Clean,
    /// A configuration, URDF, checkpoint, manifest or other input file is invalid (the message
    /// names the file and field), or an output path cannot be written.
    InvalidInput,
    /// The command line is malformed.
    Usage,
    /// The measured position is outside the limits: refusing to start.
    StartRefused,
    /// No joint state arrived at start-up.
    NoJointState,
    /// Stopping did not reach rest within `control.stop_timeout_s`.
    StopTimeout,
    /// The control thread panicked or stopped ticking: no controlled stop was possible.
    ControlFault,
    /// Another daemon thread (inference, ROS, simulator) died or stalled: the e-stop was latched
    /// and the arm decelerated to rest.
    ThreadFault,
    /// The arm could not start (no chunk ran) within `control.start_timeout_s`, or the policy
    /// gave no chunk before the run's `--duration` ended.
    StartTimeout,
    /// The system refused a resource (threads, sockets, files) or a computation failed
    /// (`infer` produced non-finite actions, an output could not be written).
    RuntimeFailure,
    /// A second SIGINT/SIGTERM during the controlled stop.
    Interrupted,
    /// The independent monitor found a command outside the limits (a governor fault): the
    /// command was refused, the arm braked to rest from the last one that kept them.
    LimitViolation,
}

impl ExitReason {
    #[cfg(test)]
    pub(crate) const ALL: [ExitReason; 12] = [
        ExitReason::Clean,
        ExitReason::InvalidInput,
        ExitReason::Usage,
        ExitReason::StartRefused,
        ExitReason::NoJointState,
        ExitReason::StopTimeout,
        ExitReason::ControlFault,
        ExitReason::ThreadFault,
        ExitReason::StartTimeout,
        ExitReason::RuntimeFailure,
        ExitReason::Interrupted,
        ExitReason::LimitViolation,
    ];

    pub const fn code(self) -> u8 {
        match self {
            ExitReason::Clean => 0,
            ExitReason::InvalidInput => 1,
            ExitReason::Usage => 2,
            ExitReason::StartRefused => 3,
            ExitReason::NoJointState => 4,
            ExitReason::StopTimeout => 5,
            ExitReason::ControlFault => 6,
            ExitReason::ThreadFault => 7,
            ExitReason::StartTimeout => 8,
            ExitReason::RuntimeFailure => 9,
            ExitReason::Interrupted => 130,
            ExitReason::LimitViolation => 10,
        }
    }

    pub(crate) const fn name(self) -> &'static str {
        match self {
            ExitReason::Clean => "clean",
            ExitReason::InvalidInput => "invalid_input",
            ExitReason::Usage => "usage",
            ExitReason::StartRefused => "start_refused",
            ExitReason::NoJointState => "no_joint_state",
            ExitReason::StopTimeout => "stop_timeout",
            ExitReason::ControlFault => "control_fault",
            ExitReason::ThreadFault => "thread_fault",
            ExitReason::StartTimeout => "start_timeout",
            ExitReason::RuntimeFailure => "runtime_failure",
            ExitReason::Interrupted => "interrupted",
            ExitReason::LimitViolation => "limit_violation",
        }
    }
}

impl std::fmt::Display for ExitReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// An error and its sources on one line, `what: why: os error`, as the binary edge and the
/// daemon's log show them. A source whose text the line already ends with is not repeated
/// (an error that prints its source in its own message too would otherwise show it twice:
/// `... (os error 98): ... (os error 98)`).
pub fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut line = e.to_string();
    let mut next = e.source();
    while let Some(s) = next {
        let text = s.to_string();
        if !line.ends_with(&text) {
            line.push_str(": ");
            line.push_str(&text);
        }
        next = s.source();
    }
    line
}

impl From<ExitReason> for std::process::ExitCode {
    fn from(r: ExitReason) -> Self {
        std::process::ExitCode::from(r.code())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn when_exit_reasons_listed_expect_distinct_codes_and_names() {
        for (i, a) in ExitReason::ALL.iter().enumerate() {
            for b in &ExitReason::ALL[..i] {
                assert_ne!(a.code(), b.code(), "{a} and {b}");
                assert_ne!(a.name(), b.name());
            }
        }
    }

    #[derive(Debug, thiserror::Error)]
    enum Outer {
        /// Prints its source and chains it too.
        #[error("bind: {0}")]
        Doubled(#[source] std::io::Error),
        #[error("metrics.listen: cannot serve")]
        Chained(#[source] std::io::Error),
    }

    #[test]
    fn when_an_error_chain_is_rendered_expect_each_cause_once() {
        let os = || std::io::Error::from_raw_os_error(libc::EADDRINUSE);
        let once = os().to_string();
        for e in [Outer::Doubled(os()), Outer::Chained(os())] {
            let e = anyhow::Error::new(e).context("running x.toml");
            let line = error_chain(e.as_ref());
            assert_eq!(line.matches(&once).count(), 1, "{line}");
            assert!(line.starts_with("running x.toml: "), "{line}");
        }
    }

    #[test]
    fn when_docs_document_exit_codes_expect_every_code_in_their_table() {
        let page = include_str!("../../docs/safety.md");
        for r in ExitReason::ALL {
            let row = format!("| {} | `{}` |", r.code(), r.name());
            assert!(page.contains(&row), "docs/safety.md lacks the row {row:?}");
        }
    }
}

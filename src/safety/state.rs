//! The safety state machine's states and the events it counts.

use std::fmt;

/// Why the arm is holding still.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum HoldReason {
    /// The executing chunk ran out before a usable new one arrived.
    ChunkStarved,
    StaleJointState,
    StaleCamera(u8),
    /// Too many control ticks overran their deadline in a row.
    Overruns,
    /// The tool point would leave the configured workspace box.
    Workspace,
    /// The target would have carried a joint into its position limit: all joints braked.
    PositionLimit,
    /// The executor produced a non-finite target (defence in depth: chunks are checked on arrival).
    NonFiniteTarget,
    /// After an e-stop reset: waiting for a chunk computed from an observation after the reset.
    AfterReset,
    /// Tighter limits from a configuration reload (SIGHUP) are applied at rest.
    Reconfigure,
    /// The independent monitor saw a command break a limit the governor should have kept:
    /// latched, the daemon stops (a governor bug must never drive the arm on).
    LimitViolation,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    /// At rest at the measured position, waiting for the first chunk.
    Starting,
    Running,
    Holding(HoldReason),
    /// Latched until an explicit reset.
    EStopped,
    /// Shutting down: decelerating to rest, then exit.
    Stopping,
}

impl Mode {
    pub(crate) fn kind(&self) -> ModeKind {
        match self {
            Mode::Starting => ModeKind::Starting,
            Mode::Running => ModeKind::Running,
            Mode::Holding(_) => ModeKind::Holding,
            Mode::EStopped => ModeKind::EStopped,
            Mode::Stopping => ModeKind::Stopping,
        }
    }

    pub(crate) fn name(&self) -> &'static str {
        self.kind().name()
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Mode::Holding(r) => write!(f, "holding({})", r.name()),
            other => f.write_str(other.name()),
        }
    }
}

impl HoldReason {
    pub(crate) fn name(&self) -> &'static str {
        match self {
            HoldReason::ChunkStarved => "chunk_starved",
            HoldReason::StaleJointState => "stale_joint_state",
            HoldReason::StaleCamera(_) => "stale_camera",
            HoldReason::Overruns => "overrun_streak",
            HoldReason::Workspace => "workspace",
            HoldReason::PositionLimit => "position_limit",
            HoldReason::NonFiniteTarget => "non_finite_target",
            HoldReason::AfterReset => "after_reset",
            HoldReason::Reconfigure => "reconfigure",
            HoldReason::LimitViolation => "limit_violation",
        }
    }
}

/// A payload-free `Copy` enum with its snake-case names, `ALL` and `COUNT` from one list, so a
/// new variant is added in one place.
macro_rules! named_enum {
    ($(#[$meta:meta])* $vis:vis enum $name:ident { $($variant:ident => $text:literal,)+ }) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        $vis enum $name { $($variant,)+ }

        impl $name {
            pub(crate) const ALL: [$name; [$($name::$variant),+].len()] = [$($name::$variant),+];

            pub(crate) fn name(self) -> &'static str {
                match self { $($name::$variant => $text,)+ }
            }
        }
    };
}

named_enum! {
    /// Counted safety events. The numeric value indexes a fixed counter array.
    pub(crate) enum SafetyEvent {
        EStop => "estop",
        Reset => "reset",
        StaleJointState => "stale_joint_state",
        StaleCamera => "stale_camera",
        ChunkStarved => "chunk_starved",
        OverrunStreak => "overrun_streak",
        Workspace => "workspace",
        PositionLimit => "position_limit",
        NonFiniteTarget => "non_finite_target",
        PositionClamped => "position_clamped",
        MaxStepClamped => "max_step_clamped",
        JerkOverride => "jerk_override",
        LimitViolation => "limit_violation",
    }
}

impl SafetyEvent {
    /// The length of a per-event counter array.
    pub(crate) const COUNT: usize = Self::ALL.len();
}

named_enum! {
    /// A mode without its hold reason: the one name table for logs, the status line, the
    /// metrics and the live counter (`LiveStats::mode` holds its index in `ALL`).
    pub(crate) enum ModeKind {
        Starting => "starting",
        Running => "running",
        Holding => "holding",
        EStopped => "estopped",
        Stopping => "stopping",
    }
}

impl ModeKind {
    /// The index in `ALL`, for a lock-free counter.
    pub(crate) fn code(self) -> u64 {
        self as u64
    }

    pub(crate) fn from_code(code: u64) -> Option<ModeKind> {
        ModeKind::ALL.get(code as usize).copied()
    }
}

impl SafetyEvent {
    pub(crate) fn for_hold(reason: HoldReason) -> Option<SafetyEvent> {
        Some(match reason {
            HoldReason::ChunkStarved => SafetyEvent::ChunkStarved,
            HoldReason::StaleJointState => SafetyEvent::StaleJointState,
            HoldReason::StaleCamera(_) => SafetyEvent::StaleCamera,
            HoldReason::Overruns => SafetyEvent::OverrunStreak,
            HoldReason::Workspace => SafetyEvent::Workspace,
            HoldReason::PositionLimit => SafetyEvent::PositionLimit,
            HoldReason::NonFiniteTarget => SafetyEvent::NonFiniteTarget,
            HoldReason::LimitViolation => SafetyEvent::LimitViolation,
            HoldReason::AfterReset | HoldReason::Reconfigure => return None,
        })
    }
}

/// What keeps the arm from running while it is starting or holding, for the status line, the
/// diagnostics and the start timeout's message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Waiting {
    /// Running (or stopping): nothing.
    Nothing,
    /// The joint state is older than its timeout (or never came).
    JointState,
    /// This camera's frames are older than their timeout (or never came).
    Camera(u8),
    /// Inputs are fresh; no chunk from a fresh observation has been accepted yet.
    Chunk,
    /// The e-stop is latched until a reset.
    Reset,
}

impl Waiting {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Waiting::Nothing => "nothing",
            Waiting::JointState => "fresh_joint_state",
            Waiting::Camera(_) => "fresh_camera",
            Waiting::Chunk => "chunk",
            Waiting::Reset => "reset",
        }
    }

    /// A code for a lock-free counter (`LiveStats::waiting`).
    pub(crate) fn code(self) -> u64 {
        match self {
            Waiting::Nothing => 0,
            Waiting::JointState => 1,
            Waiting::Camera(k) => 0x100 | k as u64,
            Waiting::Chunk => 2,
            Waiting::Reset => 3,
        }
    }

    pub(crate) fn from_code(code: u64) -> Waiting {
        match code {
            1 => Waiting::JointState,
            2 => Waiting::Chunk,
            3 => Waiting::Reset,
            c if c & 0x100 != 0 => Waiting::Camera((c & 0xff) as u8),
            _ => Waiting::Nothing,
        }
    }
}

impl fmt::Display for Waiting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Waiting::Camera(k) => write!(f, "fresh frames from camera {k}"),
            Waiting::JointState => f.write_str("a fresh joint state"),
            Waiting::Chunk => f.write_str("a chunk from a fresh observation"),
            Waiting::Reset => f.write_str("an e-stop reset"),
            Waiting::Nothing => f.write_str("nothing"),
        }
    }
}

//! Building the messages pi0d sends: the command (of the configured type), the status and the
//! diagnostics. Kept apart from the decoders: nothing here reads a sender's data.

use ros2_client::{ActionTypeName, MessageTypeName, Name, QosProfile};

use super::msgs;
use super::timing::SkewEstimator;
use super::transport::{Middleware, SendGoal, TransportError};
use super::RosError;
use crate::config::{CommandGroup, CommandType};
use crate::joints::MotionState;
use crate::robot::lookahead::{self, Lookahead, TimedState};
use crate::time::MonoTime;

/// Why a command did not reach its controller.
#[derive(Debug)]
pub(crate) enum CommandError {
    /// The middleware did not send it.
    Failed(TransportError),
    /// Sent, but the receiver refused it (or never answered).
    Refused(String),
}

/// Builds one command message from the newest motion state (made `age_s` ago) and sends it;
/// a trajectory's braking tail as the look-ahead (for every robot joint) in force plans it.
type SendCommand = Box<
    dyn FnMut(msgs::Header, &[String], &MotionState, f64, &Lookahead) -> Result<(), CommandError>
        + Send,
>;

/// One command output's publisher: its joints taken from the governed command, at its rate,
/// as the message type its controller takes.
pub(crate) struct CommandPublisher {
    /// The message type (a trajectory's look-ahead is followed by the control thread while
    /// none goes out).
    kind: CommandType,
    names: Vec<String>,
    indices: Vec<usize>,
    /// Ticks closer together than this are not all sent (an output slower than the loop).
    min_interval_s: f64,
    last_tick: Option<MonoTime>,
    send: SendCommand,
}

impl CommandPublisher {
    /// Advertises `topic` for `group`. A trajectory's points follow the command, due one
    /// control period (`period_s`) after its tick: the time the message waited in pi0d is
    /// taken off, so the controller's timeline follows the ticks, not the moments of sending
    /// (a late wake-up or a busy ROS thread shifts no point while the first is still ahead).
    /// `answers_expected`: whether an action
    /// server should answer (not in a dry run, whose shadow actions have none).
    pub(crate) fn advertise(
        mw: &mut impl Middleware,
        topic: &Name,
        group: &CommandGroup,
        qos: &QosProfile,
        period_s: f64,
        answers_expected: bool,
    ) -> Result<CommandPublisher, RosError> {
        let ty = MessageTypeName::new;
        let send: SendCommand = match group.kind {
            CommandType::JointTrajectory => {
                let p = mw.advertise(topic, ty("trajectory_msgs", "JointTrajectory"), qos)?;
                let indices = group.indices.clone();
                let mut plan = Vec::with_capacity(lookahead::POINTS);
                Box::new(move |_, names, cmd, age_s, lookahead| {
                    let lookahead = lookahead.select(&indices);
                    lookahead.plan(cmd, period_s - age_s.max(0.0), &mut plan);
                    p.put(trajectory(names, &plan))
                        .map_err(CommandError::Failed)
                })
            }
            CommandType::Float64MultiArray => {
                let p = mw.advertise(topic, ty("std_msgs", "Float64MultiArray"), qos)?;
                Box::new(move |_, _, cmd, _, _| {
                    p.put(multi_array(cmd)).map_err(CommandError::Failed)
                })
            }
            CommandType::JointState => {
                let p = mw.advertise(topic, ty("sensor_msgs", "JointState"), qos)?;
                Box::new(move |header, names, cmd, _, _| {
                    p.put(joint_command(header, names, cmd))
                        .map_err(CommandError::Failed)
                })
            }
            CommandType::GripperCommand => {
                let client = mw.action_client::<
                    msgs::GripperCommandGoal,
                    msgs::GripperCommandResult,
                    msgs::GripperCommandResult,
                >(
                    topic,
                    ActionTypeName::new("control_msgs", "GripperCommand"),
                    qos,
                )?;
                let mut goals = GripperGoals::new(client, group.max_effort, answers_expected);
                Box::new(move |_, _, cmd, _, _| goals.step(cmd.position[0], MonoTime::now()))
            }
        };
        Ok(CommandPublisher {
            kind: group.kind,
            names: group.joints.clone(),
            indices: group.indices.clone(),
            // Half a period of slack, so that a 100 Hz output of a 200 Hz loop sends every
            // second tick despite jitter.
            min_interval_s: 1.0 / group.rate_hz - 0.5 * period_s,
            last_tick: None,
            send,
        })
    }

    pub(crate) fn kind(&self) -> CommandType {
        self.kind
    }

    /// Sends this output's joints of `cmd`, made by the tick at `tick` (`stamp` on the ROS
    /// clock, the header's stamp where the message has one), `age_s` ago, a trajectory's tail
    /// planned by `lookahead` (the controller's, for every joint); `Ok(false)` when the
    /// output's rate skips this tick.
    pub(crate) fn publish(
        &mut self,
        tick: MonoTime,
        stamp: msgs::Time,
        cmd: &MotionState,
        age_s: f64,
        lookahead: &Lookahead,
    ) -> Result<bool, CommandError> {
        if let Some(last) = self.last_tick {
            if tick.seconds_since(last) < self.min_interval_s {
                return Ok(false);
            }
        }
        self.last_tick = Some(tick);
        let header = msgs::Header {
            stamp,
            frame_id: String::new(),
        };
        let ours = select(cmd, &self.indices);
        (self.send)(header, &self.names, &ours, age_s, lookahead).map(|()| true)
    }
}

/// A gripper_command target that moved less than this (m or rad) is not sent again.
const GOAL_DEADBAND: f64 = 1e-6;
/// An unanswered goal is sent again (and reported) after this long.
const GOAL_RESEND_S: f64 = 1.0;

/// gripper_command goals for one joint: sent when its target moves (at most at the output's
/// rate; a still target sends nothing, so a holding arm does not churn the controller's goal
/// handles), again when unanswered, with the server's replies counted and refusals reported.
pub(crate) struct GripperGoals {
    client: Box<dyn SendGoal<msgs::GripperCommandGoal>>,
    max_effort: f64,
    answers_expected: bool,
    /// The last goal's position and when it was sent.
    last: Option<(f64, MonoTime)>,
    /// When the oldest goal sent since the last acceptance went out.
    unanswered_since: Option<MonoTime>,
    pub(crate) accepted: u64,
    pub(crate) refused: u64,
}

impl GripperGoals {
    pub(crate) fn new(
        client: Box<dyn SendGoal<msgs::GripperCommandGoal>>,
        max_effort: f64,
        answers_expected: bool,
    ) -> GripperGoals {
        GripperGoals {
            client,
            max_effort,
            answers_expected,
            last: None,
            unanswered_since: None,
            accepted: 0,
            refused: 0,
        }
    }

    /// Takes the replies so far and sends `position` if it is due; an error says what the
    /// server did wrong (refused goals, or none accepted for a while).
    pub(crate) fn step(&mut self, position: f64, now: MonoTime) -> Result<(), CommandError> {
        let (accepted, refused) = self.client.replies().map_err(CommandError::Failed)?;
        self.accepted += accepted;
        self.refused += refused;
        if accepted > 0 {
            self.unanswered_since = None;
        }
        let due = match self.last {
            None => true,
            Some((p, at)) => {
                (position - p).abs() > GOAL_DEADBAND
                    || (self.unanswered_since.is_some() && now.seconds_since(at) >= GOAL_RESEND_S)
            }
        };
        if due {
            let goal = msgs::GripperCommandGoal {
                command: msgs::GripperCommand {
                    position,
                    max_effort: self.max_effort,
                },
            };
            self.client.send(goal).map_err(CommandError::Failed)?;
            self.last = Some((position, now));
            self.unanswered_since.get_or_insert(now);
        }
        if refused > 0 {
            return Err(CommandError::Refused(format!(
                "the action server refused {refused} goal(s) ({} refused, {} accepted in all): the gripper does not follow",
                self.refused, self.accepted
            )));
        }
        match self.unanswered_since {
            Some(t) if self.answers_expected && now.seconds_since(t) >= GOAL_RESEND_S => {
                Err(CommandError::Refused(format!(
                    "no goal accepted for {:.1} s ({} accepted in all): is the gripper controller loaded and active (`ros2 control list_controllers`)?",
                    now.seconds_since(t),
                    self.accepted
                )))
            }
            _ => Ok(()),
        }
    }
}

/// The joints `indices` of `cmd`, in that order.
fn select(cmd: &MotionState, indices: &[usize]) -> MotionState {
    MotionState {
        position: cmd.position.select(indices),
        velocity: cmd.velocity.select(indices),
        acceleration: cmd.acceleration.select(indices),
    }
}

/// A trajectory joint_trajectory_controller accepts with its default parameters: stamp zero
/// ("start when received", so it never lies in the past whatever the clocks), the planned
/// points with strictly increasing times, the last one at rest. (The tick's own stamp, with
/// the controller following pi0d's timeline, measured no smoother at the controller model:
/// its update quantization matters less than how the command's future is extrapolated.)
pub(crate) fn trajectory(names: &[String], plan: &[TimedState]) -> msgs::JointTrajectory {
    msgs::JointTrajectory {
        header: msgs::Header::default(),
        joint_names: names.to_vec(),
        points: plan
            .iter()
            .map(|p| msgs::JointTrajectoryPoint {
                positions: p.state.position.as_slice().to_vec(),
                velocities: p.state.velocity.as_slice().to_vec(),
                accelerations: p.state.acceleration.as_slice().to_vec(),
                effort: Vec::new(),
                time_from_start: msgs::Duration::from_seconds(p.t_s),
            })
            .collect(),
    }
}

pub(crate) fn multi_array(cmd: &MotionState) -> msgs::Float64MultiArray {
    msgs::Float64MultiArray {
        layout: msgs::MultiArrayLayout::default(),
        data: cmd.position.as_slice().to_vec(),
    }
}

pub(crate) fn joint_command(
    header: msgs::Header,
    names: &[String],
    cmd: &MotionState,
) -> msgs::JointState {
    msgs::JointState {
        header,
        name: names.to_vec(),
        position: cmd.position.as_slice().to_vec(),
        velocity: cmd.velocity.as_slice().to_vec(),
        effort: Vec::new(),
    }
}

/// How the inputs look from the ROS thread, for the diagnostics.
pub(crate) struct InputHealth<'a> {
    pub(crate) joint_state_age_s: f64,
    pub(crate) camera_ages_s: &'a [f64],
    /// Per camera: capture-to-decoded latency `(p50, p99, max)` in ms, once frames arrived.
    pub(crate) camera_latency_ms: &'a [Option<(f64, f64, f64)>],
    pub(crate) joint_state_clock_offset_s: Option<f64>,
    /// Per camera: its sender's clock offset estimate, as for the joint states.
    pub(crate) camera_clock_offsets_s: &'a [Option<f64>],
    /// Samples refused since start (malformed, inconsistent, or their decoder faulted).
    pub(crate) inputs_rejected: u64,
    /// Of those, the ones whose decoder panicked.
    pub(crate) decoder_faults: u64,
    /// Others on pi0d's names: publishers on its command topics, nodes with its name.
    pub(crate) others: super::others::Others,
}

/// The daemon's health as one DiagnosticStatus: OK while running, WARN while holding or
/// starting, ERROR while e-stopped; values carry rates, timing and input ages.
pub(crate) fn diagnostics(
    stamp: msgs::Time,
    node: &str,
    live: &crate::telemetry::LiveStats,
    rate_hz: f64,
    inputs: &InputHealth,
) -> msgs::DiagnosticArray {
    let InputHealth {
        joint_state_age_s,
        camera_ages_s,
        camera_latency_ms,
        joint_state_clock_offset_s,
        camera_clock_offsets_s,
        inputs_rejected,
        decoder_faults,
        others,
    } = *inputs;
    use crate::telemetry::{mode_name, LiveStats};
    let mode = mode_name(LiveStats::get(&live.mode));
    let mut level = match mode {
        "running" | "stopping" => 0,
        "estopped" => 2,
        _ => 1,
    };
    // A decoder that panicked is a bug pi0d survived, not a state to call OK; nor is another
    // source of commands, or a second node by pi0d's name.
    if (decoder_faults > 0 || others != Default::default()) && level == 0 {
        level = 1;
    }
    let kv = |k: &str, v: String| msgs::KeyValue {
        key: k.into(),
        value: v,
    };
    let mut values = vec![
        kv("state", mode.into()),
        kv(
            "waiting for",
            crate::safety::Waiting::from_code(LiveStats::get(&live.waiting))
                .name()
                .into(),
        ),
        kv("control rate (Hz)", format!("{rate_hz:.1}")),
        kv("ticks", LiveStats::get(&live.ticks).to_string()),
        kv("overruns", LiveStats::get(&live.overruns).to_string()),
        kv(
            "jitter last (us)",
            (LiveStats::get(&live.last_jitter_ns) / 1000).to_string(),
        ),
        kv(
            "jitter max (us)",
            (LiveStats::get(&live.max_jitter_ns) / 1000).to_string(),
        ),
        kv(
            "chunk latency (ms)",
            format!("{:.1}", LiveStats::get(&live.last_latency_us) as f64 / 1e3),
        ),
        kv(
            "chunks received",
            LiveStats::get(&live.chunks_received).to_string(),
        ),
        kv(
            "chunks rejected",
            LiveStats::get(&live.chunks_rejected).to_string(),
        ),
        kv(
            "safety events",
            LiveStats::get(&live.safety_events).to_string(),
        ),
        kv("joint state age (s)", format!("{joint_state_age_s:.3}")),
        kv("inputs rejected", inputs_rejected.to_string()),
        kv("decoder faults", decoder_faults.to_string()),
        kv(
            "other publishers on command topics",
            others.command_publishers.to_string(),
        ),
        kv("other nodes with this name", others.namesakes.to_string()),
    ];
    for (i, a) in camera_ages_s.iter().enumerate() {
        values.push(kv(&format!("camera {i} age (s)"), format!("{a:.3}")));
    }
    // Capture stamp to decoded frame ready: transport, deserialization and decoding.
    for (i, l) in camera_latency_ms.iter().enumerate() {
        if let Some((p50, p99, max)) = l {
            values.push(kv(
                &format!("camera {i} latency p50 (ms)"),
                format!("{p50:.2}"),
            ));
            values.push(kv(
                &format!("camera {i} latency p99 (ms)"),
                format!("{p99:.2}"),
            ));
            values.push(kv(
                &format!("camera {i} latency max (ms)"),
                format!("{max:.2}"),
            ));
        }
    }
    if let Some(o) = joint_state_clock_offset_s {
        values.push(kv("joint state clock offset (s)", format!("{o:.3}")));
        if SkewEstimator::skewed(o) && level == 0 {
            level = 1;
        }
    }
    for (i, o) in camera_clock_offsets_s.iter().enumerate() {
        if let Some(o) = o {
            values.push(kv(
                &format!("camera {i} clock offset (s)"),
                format!("{o:.3}"),
            ));
            if SkewEstimator::skewed(*o) && level == 0 {
                level = 1;
            }
        }
    }
    for (name, c) in [
        ("inference queue (ms)", &live.stage_queue_us),
        ("inference preprocess (ms)", &live.stage_preprocess_us),
        ("inference prefix (ms)", &live.stage_prefix_us),
        ("inference steps (ms)", &live.stage_steps_us),
        ("inference postprocess (ms)", &live.stage_postprocess_us),
    ] {
        values.push(kv(name, format!("{:.2}", LiveStats::get(c) as f64 / 1e3)));
    }
    if LiveStats::get(&live.fault_latched) == 1 {
        values.push(kv(
            "fault latch",
            "the previous run ended with a fault: e-stopped until a reset".into(),
        ));
        level = level.max(1);
    }
    if LiveStats::get(&live.remote_active) == 1 {
        let ms =
            |c: &std::sync::atomic::AtomicU64| format!("{:.1}", LiveStats::get(c) as f64 / 1e3);
        let connected = LiveStats::get(&live.remote_connected) == 1;
        values.push(kv("policy server connected", connected.to_string()));
        values.push(kv(
            "policy server rtt p50 (ms)",
            ms(&live.remote_rtt_p50_us),
        ));
        values.push(kv(
            "policy server rtt p99 (ms)",
            ms(&live.remote_rtt_p99_us),
        ));
        values.push(kv(
            "policy server infer p50 (ms)",
            ms(&live.remote_server_infer_us),
        ));
        values.push(kv(
            "policy server reconnects",
            LiveStats::get(&live.remote_reconnects).to_string(),
        ));
        values.push(kv(
            "policy server errors",
            LiveStats::get(&live.remote_errors).to_string(),
        ));
        if !connected && level == 0 {
            level = 1;
        }
    }
    msgs::DiagnosticArray {
        header: msgs::Header {
            stamp,
            frame_id: String::new(),
        },
        status: vec![msgs::DiagnosticStatus {
            level,
            name: format!("{node}: control"),
            message: mode.into(),
            hardware_id: node.into(),
            values,
        }],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::LiveStats;
    use std::sync::{Arc, Mutex};

    /// An action server seen through `SendGoal`: the goals it got, the replies it will give.
    #[derive(Clone, Default)]
    struct Server {
        goals: Arc<Mutex<Vec<msgs::GripperCommandGoal>>>,
        replies: Arc<Mutex<(u64, u64)>>,
    }

    impl SendGoal<msgs::GripperCommandGoal> for Server {
        fn send(&mut self, goal: msgs::GripperCommandGoal) -> Result<(), TransportError> {
            self.goals.lock().unwrap().push(goal);
            Ok(())
        }
        fn replies(&mut self) -> Result<(u64, u64), TransportError> {
            Ok(std::mem::take(&mut *self.replies.lock().unwrap()))
        }
    }

    #[test]
    fn when_the_gripper_target_moves_expect_a_goal_each_time_and_none_while_it_stays() {
        let server = Server::default();
        let mut g = GripperGoals::new(Box::new(server.clone()), 40.0, true);
        let t0 = MonoTime::now();
        let at = |s: f64| t0.offset_seconds(s);
        for (k, p) in [0.01, 0.02, 0.03].into_iter().enumerate() {
            g.step(p, at(0.05 * k as f64)).unwrap();
            *server.replies.lock().unwrap() = (1, 0);
        }
        // Still: nothing more, though accepted goals are counted.
        for k in 3..30 {
            g.step(0.03, at(0.05 * k as f64)).unwrap();
        }
        let goals = server.goals.lock().unwrap().clone();
        let positions: Vec<f64> = goals.iter().map(|g| g.command.position).collect();
        assert_eq!(positions, [0.01, 0.02, 0.03]);
        assert!(goals.iter().all(|g| g.command.max_effort == 40.0));
        assert_eq!(g.accepted, 3);
    }

    #[test]
    fn when_no_server_answers_expect_the_goal_sent_again_each_second_and_reported() {
        let server = Server::default();
        let mut g = GripperGoals::new(Box::new(server.clone()), 10.0, true);
        let t0 = MonoTime::now();
        g.step(0.02, t0).unwrap();
        g.step(0.02, t0.offset_seconds(0.5)).unwrap();
        let Err(CommandError::Refused(e)) = g.step(0.02, t0.offset_seconds(1.0)) else {
            panic!("silence not reported")
        };
        assert!(e.contains("no goal accepted for 1.0 s"), "{e}");
        assert!(e.contains("list_controllers"), "{e}");
        assert_eq!(
            server.goals.lock().unwrap().len(),
            2,
            "sent again after 1 s"
        );
        // A moving target does not hide the silence.
        for k in 1..10 {
            let r = g.step(
                0.02 + 0.001 * k as f64,
                t0.offset_seconds(1.0 + 0.05 * k as f64),
            );
            assert!(r.is_err());
        }
        // Once accepted, quiet again.
        *server.replies.lock().unwrap() = (1, 0);
        g.step(0.05, t0.offset_seconds(2.0)).unwrap();
        // In a dry run (no server by design) the same silence is not an error.
        let mut dry = GripperGoals::new(Box::new(Server::default()), 10.0, false);
        dry.step(0.02, t0).unwrap();
        dry.step(0.02, t0.offset_seconds(3.0)).unwrap();
    }

    #[test]
    fn when_the_server_refuses_goals_expect_it_reported_with_the_counts() {
        let server = Server::default();
        let mut g = GripperGoals::new(Box::new(server.clone()), 10.0, true);
        let t0 = MonoTime::now();
        g.step(0.02, t0).unwrap();
        *server.replies.lock().unwrap() = (1, 2);
        let Err(CommandError::Refused(e)) = g.step(0.03, t0.offset_seconds(0.05)) else {
            panic!("refusal not reported")
        };
        assert!(
            e.contains("refused 2 goal(s) (2 refused, 1 accepted in all)"),
            "{e}"
        );
    }

    /// Fresh inputs from one camera, nothing refused.
    fn healthy() -> InputHealth<'static> {
        InputHealth {
            joint_state_age_s: 0.01,
            camera_ages_s: &[0.02],
            camera_latency_ms: &[None],
            joint_state_clock_offset_s: None,
            camera_clock_offsets_s: &[None],
            inputs_rejected: 0,
            decoder_faults: 0,
            others: Default::default(),
        }
    }

    /// The value under `key` in the daemon's status, if there is one.
    fn value(d: &msgs::DiagnosticArray, key: &str) -> Option<String> {
        d.status[0]
            .values
            .iter()
            .find(|kv| kv.key == key)
            .map(|kv| kv.value.clone())
    }

    #[test]
    fn when_inputs_refused_or_decoder_faulted_expect_counts_in_diagnostics() {
        let live = LiveStats::default();
        LiveStats::set(&live.mode, 1);
        let health = |rejected, faults| InputHealth {
            inputs_rejected: rejected,
            decoder_faults: faults,
            ..healthy()
        };
        let d = diagnostics(msgs::Time::default(), "pi0d", &live, 200.0, &health(3, 0));
        assert_eq!(value(&d, "inputs rejected").as_deref(), Some("3"));
        assert_eq!(d.status[0].level, 0);
        let d = diagnostics(msgs::Time::default(), "pi0d", &live, 200.0, &health(5, 2));
        assert_eq!(value(&d, "decoder faults").as_deref(), Some("2"));
        assert_eq!(d.status[0].level, 1, "a decoder fault is not OK");
        let impostor = InputHealth {
            others: crate::io::ros::others::Others {
                command_publishers: 1,
                namesakes: 0,
            },
            ..healthy()
        };
        let d = diagnostics(msgs::Time::default(), "pi0d", &live, 200.0, &impostor);
        assert_eq!(
            value(&d, "other publishers on command topics").as_deref(),
            Some("1")
        );
        assert_eq!(d.status[0].level, 1, "another source of commands is not OK");
        assert_eq!(
            value(&d, "policy server connected"),
            None,
            "no remote policy"
        );
    }

    #[test]
    fn when_the_policy_is_remote_expect_its_link_in_diagnostics_and_warn_when_down() {
        let live = LiveStats::default();
        LiveStats::set(&live.mode, 1);
        LiveStats::set(&live.remote_active, 1);
        LiveStats::set(&live.remote_connected, 1);
        LiveStats::set(&live.remote_rtt_p50_us, 41_200);
        LiveStats::set(&live.remote_reconnects, 2);
        let health = healthy();
        let d = diagnostics(msgs::Time::default(), "pi0d", &live, 200.0, &health);
        assert_eq!(
            value(&d, "policy server rtt p50 (ms)").as_deref(),
            Some("41.2")
        );
        assert_eq!(value(&d, "policy server reconnects").as_deref(), Some("2"));
        assert_eq!(d.status[0].level, 0);
        LiveStats::set(&live.remote_connected, 0);
        let d = diagnostics(msgs::Time::default(), "pi0d", &live, 200.0, &health);
        assert_eq!(
            value(&d, "policy server connected").as_deref(),
            Some("false")
        );
        assert_eq!(d.status[0].level, 1, "a lost server is a warning");
    }
}

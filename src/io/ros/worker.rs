//! The ROS thread's loop: the newest command out as soon as the control loop made it, then the
//! subscriptions drained into the blackboard, then (once a second) status and diagnostics.
//!
//! No sample can end the loop: taking (deserializing) and decoding each one runs under
//! `log::guarded`, so a decoder that panics refuses that sample, is reported and counted, and
//! commands keep flowing.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::decode::{self, ClockMap, JointStateDecoder, SkewEstimator};
use super::frames::{Cameras, FrameStats};
use super::intake::{drain, Report, MAX_TAKES_PER_POLL};
use super::log::{guarded, RateLimitedLog, TopicId, WarnKind};
use super::others::Others;
use super::{encode, msgs, Endpoints};
use crate::config::{CommandType, RosConfig};
use crate::errors::Chain;
use crate::io::Blackboard;
use crate::telemetry::LiveStats;
use crate::time::MonoTime;

struct Topics {
    joint_states: TopicId,
    prompt: TopicId,
    estop: TopicId,
    reset: TopicId,
    reset_service: TopicId,
    commands: Vec<TopicId>,
    status: TopicId,
    diagnostics: TopicId,
    /// The node itself (what its namesakes are warned about under).
    node: TopicId,
}

pub(super) struct Worker<'a> {
    cfg: RosConfig,
    names: Vec<String>,
    /// Per joint: the measured positions taken (beyond: a sensor fault).
    plausible: Vec<(f64, f64)>,
    period_s: f64,
    ep: Endpoints,
    board: &'a Blackboard,
    live: &'a LiveStats,
    clock: ClockMap,
    report: Report,
    topics: Topics,
    joints: JointStateDecoder,
    skew: SkewEstimator,
    /// What the camera thread measured.
    frames: Arc<Mutex<FrameStats>>,
    /// Joint-state messages taken before the first measurement (for the start-up note).
    joint_states_seen: u64,
    last_sent: MonoTime,
    next_status: MonoTime,
}

impl<'a> Worker<'a> {
    pub(super) fn new(
        cfg: RosConfig,
        names: Vec<String>,
        plausible: Vec<(f64, f64)>,
        period: Duration,
        ep: Endpoints,
        board: &'a Blackboard,
        live: &'a LiveStats,
    ) -> Worker<'a> {
        let mut log = RateLimitedLog::new(Duration::from_secs(5));
        let topics = Topics {
            joint_states: log.topic(&cfg.joint_states),
            prompt: log.topic(&cfg.prompt),
            estop: log.topic(&cfg.estop),
            reset: log.topic(&cfg.reset),
            reset_service: log.topic(&cfg.reset_service),
            commands: cfg
                .commands
                .iter()
                .map(|g| log.topic(&cfg.command_out(g)))
                .collect(),
            status: log.topic(&cfg.status_topic),
            diagnostics: log.topic(&cfg.diagnostics_topic),
            node: log.topic(&format!(
                "node {}/{}",
                cfg.namespace.trim_end_matches('/'),
                cfg.node
            )),
        };
        Worker {
            joints: JointStateDecoder::with_bounds(&names, &plausible),
            // One estimate per ~2 s at a 100 Hz joint-state rate.
            skew: SkewEstimator::new(200),
            clock: ClockMap::now(),
            report: Report::new(log),
            topics,
            frames: Arc::new(Mutex::new(FrameStats::new(cfg.cameras.len()))),
            joint_states_seen: 0,
            last_sent: MonoTime::ZERO,
            next_status: MonoTime::now(),
            period_s: period.as_secs_f64(),
            cfg,
            names,
            plausible,
            ep,
            board,
            live,
        }
    }

    pub(super) fn run(
        mut self,
        stop: &AtomicBool,
        beat: &dyn Fn(),
        on_camera_thread: &(dyn Fn() + Sync),
    ) {
        // Handed to the camera thread through a slot, so that they stay here if no thread
        // can be started for them.
        let cameras = Mutex::new(Some(Cameras::new(
            std::mem::take(&mut self.ep.cameras),
            &self.cfg.cameras,
            self.board,
            self.cfg.max_image_bytes,
            self.frames.clone(),
        )));
        let cameras_stop = AtomicBool::new(false);
        std::thread::scope(|s| {
            let (slot, cameras_stop) = (&cameras, &cameras_stop);
            let spawned = std::thread::Builder::new()
                .name("pi0d-cameras".into())
                .spawn_scoped(s, move || {
                    on_camera_thread();
                    if let Some(c) = slot.lock().ok().and_then(|mut c| c.take()) {
                        c.run(cameras_stop)
                    }
                });
            // Without a thread of their own, the cameras are polled here between commands.
            let mut inline = None;
            if let Err(e) = spawned {
                tracing::error!(error = %e, "cannot start the camera thread: cameras are taken and decoded on the ROS thread");
                inline = cameras.lock().ok().and_then(|mut c| c.take());
            }
            // The camera thread stops when this loop ends, a panic included (the scope joins
            // it before the panic goes on to the supervisor).
            let _cameras_stop = StopOnDrop(cameras_stop);
            while !stop.load(Ordering::Relaxed) {
                if self.board.supervisor.io_drill_due() {
                    panic!("fault drill `crash_io`: the ROS thread panics");
                }
                beat();
                let now = MonoTime::now();
                // A new command goes out as soon as the control loop has made it (polled
                // every half millisecond), before the inputs are drained.
                self.send_command();
                self.joint_states(now);
                if let Some(c) = &mut inline {
                    c.poll();
                }
                self.prompt();
                self.estop_and_reset();
                self.reset_service();
                if now >= self.next_status {
                    self.next_status = now.offset_seconds(1.0);
                    if let Some(step) = crate::time::remeasure_wall_offset() {
                        tracing::warn!(
                            "the wall clock was stepped by {step:.3} s: ROS stamps are taken on the new time from now on"
                        );
                    }
                    self.status(now);
                }
                std::thread::sleep(Duration::from_micros(500));
            }
        });
        // The last word, once the camera thread has finished: what was refused until the end.
        self.status(MonoTime::now());
        // The endpoints are dropped next.
        super::teardown::begin();
    }

    fn send_command(&mut self) {
        let (stamp, cmd) = self.board.command.load();
        if stamp == self.last_sent || cmd.position.len() != self.names.len() {
            return;
        }
        // The control thread says what the braking tails keep before its first command.
        let Some(lookahead) = self.board.command.lookahead() else {
            return;
        };
        self.last_sent = stamp;
        let age_s = MonoTime::now().seconds_since(stamp);
        let ros_stamp = self.clock.to_ros(stamp);
        let mut trajectories_out = true;
        for (k, out) in self.ep.command.iter_mut().enumerate() {
            let topic = self.topics.commands[k];
            let result = out.publish(stamp, ros_stamp, &cmd, age_s, &lookahead);
            trajectories_out &= result.is_ok() || out.kind() != CommandType::JointTrajectory;
            match result {
                Ok(_) => {}
                Err(encode::CommandError::Failed(e)) => {
                    self.report.warn(topic, WarnKind::PublishFailed, &Chain(&e))
                }
                Err(encode::CommandError::Refused(e)) => {
                    self.report.warn(topic, WarnKind::CommandRefused, &e)
                }
            }
        }
        // The control thread follows the controllers' look-ahead while none goes out.
        if trajectories_out {
            self.board.command.mark_sent(stamp);
        }
    }

    fn joint_states(&mut self, now: MonoTime) {
        let Worker {
            ep,
            report,
            topics,
            joints,
            skew,
            clock,
            board,
            names,
            plausible,
            cfg,
            joint_states_seen,
            ..
        } = self;
        let topic = topics.joint_states;
        let shown_topic = &cfg.joint_states;
        let starting = board.inputs.joint_state.load().stamp == MonoTime::ZERO;
        drain(ep.joint_states.as_ref(), topic, report, |msg, report| {
            *joint_states_seen += 1;
            // Every well-stamped sample counts for the skew, refused or not: a sender ahead of
            // pi0d has all its samples refused, and the estimate says why.
            if let Ok(stamp) = clock.to_mono(&msg.header.stamp) {
                if let Some(o) = skew.observe(now, stamp) {
                    if SkewEstimator::skewed(o) {
                        report.warn(topic, WarnKind::ClockSkew, &format_args!("stamps are {o:.3} s behind arrival at best: clock skew between sender and pi0d (check NTP/PTP, or use_sim_time)"));
                    }
                }
            }
            match guarded(|| joints.decode(&msg, clock, now)) {
                Ok(Ok(Some(m))) => board.inputs.joint_state.store(m),
                Ok(Ok(None)) => {
                    if let Some(m) = joints.missing_report(now) {
                        tracing::warn!(topic = %shown_topic, "{m}");
                        board
                            .inputs
                            .note_startup(format!("{} message(s) arrived; {m}", joint_states_seen));
                    }
                }
                Ok(Err(e)) => {
                    if starting {
                        board.inputs.note_startup(format!(
                            "{} message(s) arrived, none usable; the last refused: {e}",
                            joint_states_seen
                        ));
                    }
                    report.refuse(topic, &e)
                }
                Err(f) => {
                    report.fault(topic, &f);
                    // Nothing half-merged from the faulted sample is used: every joint must be
                    // heard of again.
                    *joints = JointStateDecoder::with_bounds(names, plausible);
                }
            }
        });
    }

    fn prompt(&mut self) {
        let (topic, board) = (self.topics.prompt, self.board);
        drain(
            self.ep.prompt.as_ref(),
            topic,
            &mut self.report,
            |msg, report| match guarded(|| decode::prompt(&msg.data).map(|_| ())) {
                Ok(Ok(())) => {
                    if let Ok(mut p) = board.inputs.prompt.lock() {
                        report.warn(topic, WarnKind::PromptSet, &crate::outside::text(&msg.data));
                        *p = msg.data;
                    }
                }
                Ok(Err(e)) => report.refuse(topic, &e),
                Err(f) => report.fault(topic, &f),
            },
        );
    }

    fn estop_and_reset(&mut self) {
        let board = self.board;
        let (estop, reset) = (self.topics.estop, self.topics.reset);
        drain(
            self.ep.estop.as_ref(),
            estop,
            &mut self.report,
            |msg, report| {
                if msg.data {
                    report.warn(estop, WarnKind::EstopPressed, &"");
                }
                board.inputs.set_estop(msg.data);
            },
        );
        drain(
            self.ep.reset.as_ref(),
            reset,
            &mut self.report,
            |msg, report| {
                if msg.data {
                    report.warn(reset, WarnKind::ResetRequested, &"");
                    board.inputs.request_reset();
                }
            },
        );
    }

    fn reset_service(&mut self) {
        let topic = self.topics.reset_service;
        for _ in 0..MAX_TAKES_PER_POLL {
            let id = match guarded(|| self.ep.reset_service.next_request()) {
                Ok(Ok(Some(id))) => id,
                Ok(Ok(None)) => break,
                Ok(Err(e)) => {
                    self.report.rejected += 1;
                    self.report.warn(
                        topic,
                        WarnKind::BadRequest,
                        &format_args!("bad request: {}", Chain(&e)),
                    );
                    continue;
                }
                Err(f) => {
                    self.report.fault(topic, &f);
                    continue;
                }
            };
            let response = if self.board.supervisor.fault() {
                msgs::TriggerResponse {
                    success: false,
                    message: "a daemon thread failed and latched the e-stop: no reset clears it; pi0d is stopping (see its log)".into(),
                }
            } else if self.board.inputs.estop() {
                msgs::TriggerResponse {
                    success: false,
                    message: "e-stop still pressed: release it first".into(),
                }
            } else {
                self.board.inputs.request_reset();
                self.report.warn(topic, WarnKind::ResetRequested, &"");
                msgs::TriggerResponse {
                    success: true,
                    message:
                        "reset requested; motion resumes with a chunk from a fresh observation"
                            .into(),
                }
            };
            if let Err(e) = self.ep.reset_service.reply(id, response) {
                self.report
                    .warn(topic, WarnKind::ReplyFailed, &format_args!("{}", Chain(&e)));
            }
        }
    }

    /// Others on pi0d's names, as discovery shows them now; each kind warned about (rate-limited).
    fn others(&mut self) -> Others {
        let Some(probe) = &self.ep.others else {
            return Others::default();
        };
        let o = probe();
        if o.command_publishers > 0 {
            let topic = self
                .topics
                .commands
                .first()
                .copied()
                .unwrap_or(self.topics.status);
            self.report.warn(
                topic,
                WarnKind::Others,
                &format_args!(
                    "{} other publisher(s) on pi0d's command topic(s): a second source of commands for the controller; find and stop it",
                    o.command_publishers
                ),
            );
        }
        if o.namesakes > 0 {
            self.report.warn(
                self.topics.node,
                WarnKind::Others,
                &format_args!(
                    "{} other node(s) named {}/{}: a second pi0d, or a peer posing as it",
                    o.namesakes,
                    self.cfg.namespace.trim_end_matches('/'),
                    self.cfg.node
                ),
            );
        }
        o
    }

    /// Before the first joint state: what the graph holds instead, when nothing came at all.
    /// Once joint states flow, the probe is dropped (over Zenoh it is a subscription).
    fn startup_note(&mut self) {
        if self.board.inputs.joint_state.load().stamp != MonoTime::ZERO {
            self.ep.graph = None;
            return;
        }
        if self.joint_states_seen > 0 {
            return;
        }
        let note = match &self.ep.graph {
            None => "nothing arrived (this middleware does not list the graph)".to_string(),
            Some(probe) => {
                let topics = probe();
                let (states, others): (Vec<_>, Vec<_>) = topics
                    .iter()
                    .partition(|(_, ty)| ty.starts_with("sensor_msgs/msg/JointState,"));
                let list = |v: &[&(String, String)]| {
                    v.iter()
                        .take(10)
                        .map(|(n, t)| format!("{n} ({t})"))
                        .collect::<Vec<_>>()
                        .join(", ")
                };
                if !states.is_empty() {
                    format!(
                        "nothing arrived; JointState published on the graph: {}",
                        list(&states)
                    )
                } else if others.is_empty() {
                    "nothing arrived, and no JointState is published on the graph (another domain, or no network between the two?)".to_string()
                } else {
                    format!(
                        "nothing arrived, and no JointState is published on the graph; it has: {}",
                        list(&others)
                    )
                }
            }
        };
        self.board.inputs.note_startup(note);
    }

    fn status(&mut self, now: MonoTime) {
        self.startup_note();
        let board = self.board;
        let js_age = now.seconds_since(board.inputs.joint_state.load().stamp);
        let mut stamps = vec![MonoTime::ZERO; board.inputs.camera_stamps.len()];
        board.inputs.read_camera_stamps(&mut stamps);
        let cam_ages: Vec<f64> = stamps.iter().map(|s| now.seconds_since(*s)).collect();
        let frames = self.frames.lock().map(|f| f.clone()).unwrap_or_default();
        let (rejected, faults) = (
            self.report.rejected + frames.rejected,
            self.report.faults + frames.faults,
        );
        let others = self.others();
        let d = encode::diagnostics(
            self.clock.to_ros(now),
            &self.cfg.node,
            self.live,
            1.0 / self.period_s,
            &encode::InputHealth {
                joint_state_age_s: js_age,
                camera_ages_s: &cam_ages,
                camera_latency_ms: &frames.latency_ms,
                joint_state_clock_offset_s: self.skew.offset_s,
                camera_clock_offsets_s: &frames.clock_offsets_s,
                inputs_rejected: rejected,
                decoder_faults: faults,
                others,
            },
        );
        LiveStats::set(&self.live.inputs_rejected, rejected);
        LiveStats::set(&self.live.input_decoder_faults, faults);
        LiveStats::set(
            &self.live.others_command_publishers,
            others.command_publishers,
        );
        LiveStats::set(&self.live.others_namesakes, others.namesakes);
        if let Err(e) = self.ep.diagnostics.put(d) {
            let topic = self.topics.diagnostics;
            self.report.warn(topic, WarnKind::PublishFailed, &Chain(&e));
        }
        let status = msgs::StringMsg {
            data: format!(
                "estop={} resets={}",
                board.inputs.estop(),
                board.inputs.resets()
            ),
        };
        if let Err(e) = self.ep.status.put(status) {
            let topic = self.topics.status;
            self.report.warn(topic, WarnKind::PublishFailed, &Chain(&e));
        }
        // Warnings suppressed over the last interval, that no newer one has reported yet.
        self.report.log.flush();
    }
}

/// Sets its flag when dropped, on unwinding too.
struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use std::any::Any;
    use std::collections::{HashMap, VecDeque};
    use std::sync::{Arc, Mutex};

    use ros2_client::{
        ActionTypeName, MessageTypeName, Name, QosProfile, RmwRequestId, ServiceTypeName,
    };

    use super::*;
    use crate::config::{Config, Io};
    use crate::io::ros::transport::{
        Middleware, Msg, Op, Put, SendGoal, Serve, SrvMsg, Take, TransportError,
    };
    use crate::io::ros::RosError;
    use crate::joints::{JointVector, MotionState};

    /// What a fake subscription yields, in order.
    enum Step<M> {
        Sample(M),
        /// The middleware's deserializer panics on this sample.
        Panic,
        Undecodable,
        /// Nothing more waiting in this poll.
        Gap,
    }

    type Queue<M> = Arc<Mutex<VecDeque<Step<M>>>>;
    type Sent<M> = Arc<Mutex<Vec<M>>>;

    /// A middleware whose subscriptions yield scripted samples and whose publishers keep what
    /// they are given, per topic.
    #[derive(Default)]
    struct Fake {
        queues: HashMap<String, Box<dyn Any + Send>>,
        sent: HashMap<String, Box<dyn Any + Send>>,
    }

    impl Fake {
        fn script<M: Msg>(&mut self, topic: &str, steps: Vec<Step<M>>) {
            let q: Queue<M> = Arc::new(Mutex::new(steps.into()));
            self.queues.insert(topic.into(), Box::new(q));
        }

        fn sent<M: Msg>(&self, topic: &str) -> Vec<M> {
            let s = self.sent[topic].downcast_ref::<Sent<M>>().unwrap();
            s.lock().unwrap().clone()
        }
    }

    struct FakeTake<M>(Queue<M>);

    impl<M: Msg> Take<M> for FakeTake<M> {
        fn take_next(&self) -> Result<Option<M>, TransportError> {
            let step = self.0.lock().unwrap().pop_front();
            match step {
                Some(Step::Sample(m)) => Ok(Some(m)),
                Some(Step::Panic) => panic!("index out of bounds in the deserializer"),
                Some(Step::Undecodable) => {
                    Err(TransportError::new(Op::Take, "CDR: unexpected end"))
                }
                Some(Step::Gap) | None => Ok(None),
            }
        }
    }

    struct FakePut<M>(Sent<M>);

    impl<M: Msg> Put<M> for FakePut<M> {
        fn put(&self, msg: M) -> Result<(), TransportError> {
            self.0.lock().unwrap().push(msg);
            Ok(())
        }
    }

    struct NoRequests;

    impl<Req, Resp> Serve<Req, Resp> for NoRequests {
        fn next_request(&self) -> Result<Option<RmwRequestId>, TransportError> {
            Ok(None)
        }
        fn reply(&self, _: RmwRequestId, _: Resp) -> Result<(), TransportError> {
            Err(TransportError::new(Op::Reply, "no requests"))
        }
    }

    impl Middleware for Fake {
        fn subscribe<M: Msg>(
            &mut self,
            topic: &Name,
            _: MessageTypeName,
            _: &QosProfile,
        ) -> Result<Box<dyn Take<M>>, RosError> {
            let q = self
                .queues
                .remove(&topic.to_string())
                .and_then(|q| q.downcast::<Queue<M>>().ok())
                .map_or_else(Queue::default, |q| *q);
            Ok(Box::new(FakeTake(q)))
        }

        fn advertise<M: Msg>(
            &mut self,
            topic: &Name,
            _: MessageTypeName,
            _: &QosProfile,
        ) -> Result<Box<dyn Put<M>>, RosError> {
            let sent: Sent<M> = Sent::default();
            self.sent.insert(topic.to_string(), Box::new(sent.clone()));
            Ok(Box::new(FakePut(sent)))
        }

        fn serve<Req: SrvMsg, Resp: SrvMsg>(
            &mut self,
            _: &Name,
            _: ServiceTypeName,
            _: &QosProfile,
        ) -> Result<Box<dyn Serve<Req, Resp>>, RosError> {
            Ok(Box::new(NoRequests))
        }

        fn action_client<G: SrvMsg, R: SrvMsg, F: SrvMsg>(
            &mut self,
            action: &Name,
            _: ActionTypeName,
            _: &QosProfile,
        ) -> Result<Box<dyn SendGoal<G>>, RosError> {
            let sent: Sent<G> = Sent::default();
            self.sent.insert(action.to_string(), Box::new(sent.clone()));
            Ok(Box::new(FakePut(sent)))
        }
    }

    impl<G: Msg> SendGoal<G> for FakePut<G> {
        fn send(&mut self, goal: G) -> Result<(), TransportError> {
            self.put(goal)
        }
        fn replies(&mut self) -> Result<(u64, u64), TransportError> {
            Ok((0, 0))
        }
    }

    fn cfg_file() -> std::path::PathBuf {
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("config/sim.toml")
    }

    fn cfg_text() -> String {
        std::fs::read_to_string(cfg_file())
            .unwrap()
            .replace("io = \"sim\"", "io = \"ros\"")
            + "\n[ros]\ncameras = [\"/camera/image_raw\"]\n"
    }

    fn ros_config() -> (RosConfig, Vec<String>) {
        let cfg = Config::parse(&cfg_file(), &cfg_text()).unwrap();
        let names = cfg.limits.names().map(str::to_string).collect();
        match cfg.io {
            Io::Ros(r) => (*r, names),
            Io::Sim => unreachable!(),
        }
    }

    fn image(clock: &ClockMap, width: u32, step: u32, data: Vec<u8>) -> msgs::Image {
        msgs::Image {
            header: msgs::Header {
                stamp: clock.to_ros(MonoTime::now()),
                frame_id: String::new(),
            },
            height: if width == 0 { 0 } else { 2 },
            width,
            encoding: "rgb8".into(),
            is_bigendian: 0,
            step,
            data,
        }
    }

    #[test]
    fn when_samples_are_malformed_or_their_decoding_panics_expect_the_loop_to_go_on() {
        let (cfg, names) = ros_config();
        let clock = ClockMap::now();
        let mut fake = Fake::default();
        // A deserializer that panics, an undecodable sample, and the frame of a camera not
        // streaming yet, the newest of its poll (it used to end the thread); then a good frame.
        fake.script(
            "/camera/image_raw",
            vec![
                Step::Panic,
                Step::Undecodable,
                Step::Sample(image(&clock, 0, 0, vec![])),
                Step::Gap,
                Step::Sample(image(&clock, 2, 6, vec![5; 12])),
            ],
        );
        let js = msgs::JointState {
            header: msgs::Header {
                stamp: clock.to_ros(MonoTime::now()),
                frame_id: String::new(),
            },
            name: names.clone(),
            position: vec![0.1; names.len()],
            ..Default::default()
        };
        fake.script(&cfg.joint_states, vec![Step::Panic, Step::Sample(js)]);
        let prompts = ["stack\u{1b}[2J", "stack the blocks"];
        let prompts = prompts.map(|p| Step::Sample(msgs::StringMsg { data: p.into() }));
        fake.script(&cfg.prompt, prompts.into());
        let limits = Config::parse(&cfg_file(), &cfg_text()).unwrap().limits;
        let ep = super::super::endpoints(&mut fake, &cfg, 0.005).unwrap();
        let board = Blackboard::new(1, "idle");
        board
            .command
            .set_lookahead(crate::robot::lookahead::Lookahead::new(&limits, 0.05));
        let live = LiveStats::default();
        let stop = AtomicBool::new(false);
        let command_topic = cfg.commands[0].topic.clone();
        std::thread::scope(|s| {
            let worker = Worker::new(
                cfg,
                names.clone(),
                vec![(f64::NEG_INFINITY, f64::INFINITY); names.len()],
                Duration::from_millis(5),
                ep,
                &board,
                &live,
            );
            let ros = s.spawn(|| worker.run(&stop, &|| {}, &|| {}));
            // The control loop's commands, one per millisecond, while the inputs are drained
            // (a panic costs the hook's print, slow with RUST_BACKTRACE set: wait for them).
            let sent = |fake: &Fake| fake.sent::<msgs::JointTrajectory>(&command_topic).len();
            let cmd = MotionState::at_rest(JointVector::from_slice(&vec![0.2; names.len()]));
            for i in 1..=10_000u64 {
                board
                    .command
                    .store((MonoTime::from_nanos(i * 1_000_000), cmd));
                std::thread::sleep(Duration::from_millis(1));
                if sent(&fake) >= 20 {
                    break;
                }
            }
            stop.store(true, Ordering::Relaxed);
            assert!(ros.join().is_ok(), "the ROS thread ended in a panic");
        });
        assert!(board.inputs.joint_state.load().stamp > MonoTime::ZERO);
        let frame = board.inputs.frames[0]
            .lock()
            .unwrap()
            .clone()
            .expect("the good frame");
        assert_eq!((frame.width, frame.height), (2, 2));
        assert_eq!(*board.inputs.prompt.lock().unwrap(), "stack the blocks");
        let commands = fake.sent::<msgs::JointTrajectory>(&command_topic);
        assert!(commands.len() >= 20, "{} commands", commands.len());
        assert_eq!(commands.last().unwrap().points[0].positions[0], 0.2);
        let diagnostics = fake.sent::<msgs::DiagnosticArray>("/diagnostics");
        let value = |key: &str| {
            diagnostics.last().unwrap().status[0]
                .values
                .iter()
                .find(|kv| kv.key == key)
                .map(|kv| kv.value.clone())
        };
        // Refused, as the last diagnostics (sent once the frame decoder finished) say: the two
        // faults, the undecodable sample, the empty frame, the bad prompt.
        assert_eq!(value("decoder faults").as_deref(), Some("2"));
        assert_eq!(value("inputs rejected").as_deref(), Some("5"));
    }
}

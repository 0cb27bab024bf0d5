//! ROS 2 over DDS (ros2-client on RustDDS) or Zenoh (ros2-client's rmw_zenoh-compatible
//! backend, feature `zenoh`): joint states, cameras, prompt, e-stop and reset in;
//! joint commands and status out. One thread owns the node: it drains the subscriptions into the
//! blackboard and publishes the newest command at the control rate, so the control loop never
//! waits on the middleware.

pub mod decode;
pub mod msgs;
pub mod transport;
pub mod type_hash;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use ros2_client::dds::rustdds::DomainParticipantBuilder;
use ros2_client::dds::ServiceMapping;
use ros2_client::qos::{Durability, History, Reliability, WhenFull};
use ros2_client::{MessageTypeName, Name, NodeName, NodeOptions, QosProfile, ServiceTypeName};
use transport::{Middleware, Put, Serve, Take};

use super::Blackboard;
use crate::config::{
    CommandType, Middleware as MiddlewareKind, RosConfig, ServiceMappingKind, TopicQos,
};
use crate::control::stats::LiveStats;
use crate::time::MonoTime;
use decode::{ClockMap, JointStateDecoder, LatencyWindow, RateLimitedLog, SkewEstimator};

#[derive(Debug, thiserror::Error)]
pub enum RosError {
    #[error("ROS 2: cannot create {what}: {message}")]
    Create { what: String, message: String },
}

fn create_err(what: impl Into<String>, e: impl std::fmt::Debug) -> RosError {
    RosError::Create {
        what: what.into(),
        message: format!("{e:?}"),
    }
}

/// The ros2-client profile of a configured topic QoS (volatile, keep last `depth`).
fn profile(q: TopicQos) -> QosProfile {
    let base = if q.reliable {
        QosProfile::publisher_default().reliability(Reliability::Reliable {
            when_full: WhenFull::DEFAULT,
        })
    } else {
        QosProfile::subscription_default().reliability(Reliability::BestEffort)
    };
    base.durability(Durability::Volatile)
        .history(History::KeepLast { depth: q.depth })
}

fn name(topic: &str) -> Result<Name, RosError> {
    let t = topic.trim_start_matches('/');
    let (ns, base) = match t.rfind('/') {
        Some(i) => (format!("/{}", &t[..i]), &t[i + 1..]),
        None => ("/".to_string(), t),
    };
    Name::new(&ns, base).map_err(|e| create_err(format!("topic name `{topic}`"), e))
}

/// A camera topic: raw, or compressed by image_transport's convention (`.../compressed`).
enum CameraSub {
    Raw(Box<dyn Take<msgs::Image>>),
    Compressed(Box<dyn Take<msgs::CompressedImage>>),
}

/// The command publisher of the configured type.
enum CommandPub {
    Trajectory(Box<dyn Put<msgs::JointTrajectory>>),
    MultiArray(Box<dyn Put<msgs::Float64MultiArray>>),
    JointState(Box<dyn Put<msgs::JointState>>),
}

struct Endpoints {
    joint_states: Box<dyn Take<msgs::JointState>>,
    cameras: Vec<CameraSub>,
    prompt: Box<dyn Take<msgs::StringMsg>>,
    estop: Box<dyn Take<msgs::BoolMsg>>,
    reset: Box<dyn Take<msgs::BoolMsg>>,
    command: CommandPub,
    status: Box<dyn Put<msgs::StringMsg>>,
    diagnostics: Box<dyn Put<msgs::DiagnosticArray>>,
    reset_service: Box<dyn Serve<msgs::TriggerRequest, msgs::TriggerResponse>>,
}

fn endpoints(mw: &mut impl Middleware, cfg: &RosConfig) -> Result<Endpoints, RosError> {
    let q = &cfg.qos;
    let (camera_qos, inputs, commands, status_qos) = (
        profile(q.cameras),
        profile(q.inputs),
        profile(q.commands),
        profile(q.status),
    );
    let ty = MessageTypeName::new;
    let joint_states = mw.subscribe(
        &name(&cfg.joint_states)?,
        ty("sensor_msgs", "JointState"),
        &profile(q.joint_states),
    )?;
    let mut cameras = Vec::new();
    for cam in &cfg.cameras {
        cameras.push(if cam.ends_with("/compressed") {
            CameraSub::Compressed(mw.subscribe(
                &name(cam)?,
                ty("sensor_msgs", "CompressedImage"),
                &camera_qos,
            )?)
        } else {
            CameraSub::Raw(mw.subscribe(&name(cam)?, ty("sensor_msgs", "Image"), &camera_qos)?)
        });
    }
    let prompt = mw.subscribe(&name(&cfg.prompt)?, ty("std_msgs", "String"), &inputs)?;
    let estop = mw.subscribe(&name(&cfg.estop)?, ty("std_msgs", "Bool"), &inputs)?;
    let reset = mw.subscribe(&name(&cfg.reset)?, ty("std_msgs", "Bool"), &inputs)?;
    let topic = name(&cfg.command_topic)?;
    let command = match cfg.command_type {
        CommandType::JointTrajectory => CommandPub::Trajectory(mw.advertise(
            &topic,
            ty("trajectory_msgs", "JointTrajectory"),
            &commands,
        )?),
        CommandType::Float64MultiArray => CommandPub::MultiArray(mw.advertise(
            &topic,
            ty("std_msgs", "Float64MultiArray"),
            &commands,
        )?),
        CommandType::JointState => CommandPub::JointState(mw.advertise(
            &topic,
            ty("sensor_msgs", "JointState"),
            &commands,
        )?),
    };
    let status = mw.advertise(
        &name(&cfg.status_topic)?,
        ty("std_msgs", "String"),
        &status_qos,
    )?;
    let diagnostics = mw.advertise(
        &name(&cfg.diagnostics_topic)?,
        ty("diagnostic_msgs", "DiagnosticArray"),
        &status_qos,
    )?;
    let reset_service = mw.serve(
        &name(&cfg.reset_service)?,
        ServiceTypeName::new("std_srvs", "Trigger"),
        &inputs,
    )?;
    Ok(Endpoints {
        joint_states,
        cameras,
        prompt,
        estop,
        reset,
        command,
        status,
        diagnostics,
        reset_service,
    })
}

/// The newest sample waiting on `sub` (older ones are dropped); undecodable ones are reported.
fn newest<M>(sub: &dyn Take<M>, topic: &str, log: &mut RateLimitedLog) -> Option<M> {
    let mut newest = None;
    for _ in 0..MAX_TAKES_PER_POLL {
        match sub.take_next() {
            Ok(Some(msg)) => newest = Some(msg),
            Ok(None) => break,
            Err(e) => log.warn(topic, &format!("undecodable sample: {e}")),
        }
    }
    newest
}

/// The Zenoh session configuration from `ros.zenoh_*`, or `None` for rmw_zenoh's defaults.
#[cfg(feature = "zenoh")]
fn zenoh_config(cfg: &RosConfig) -> Result<Option<zenoh::Config>, RosError> {
    let bad = |what: &str, e: &dyn std::fmt::Display| RosError::Create {
        what: format!("Zenoh configuration ({what})"),
        message: e.to_string(),
    };
    let mut config = match &cfg.zenoh_config {
        Some(path) => {
            zenoh::Config::from_file(path).map_err(|e| bad(&path.display().to_string(), &e))?
        }
        None if cfg.zenoh_connect.is_empty()
            && cfg.zenoh_listen.is_empty()
            && !cfg.loopback_only =>
        {
            return Ok(None)
        }
        None => zenoh::Config::default(),
    };
    let json = |v: &[String]| serde_json::to_string(v).unwrap_or_default();
    if !cfg.zenoh_connect.is_empty() {
        config
            .insert_json5("connect/endpoints", &json(&cfg.zenoh_connect))
            .map_err(|e| bad("ros.zenoh_connect", &e))?;
    }
    if !cfg.zenoh_listen.is_empty() {
        config
            .insert_json5("listen/endpoints", &json(&cfg.zenoh_listen))
            .map_err(|e| bad("ros.zenoh_listen", &e))?;
    }
    if cfg.loopback_only {
        // No multicast discovery off the machine; peers are reached through the endpoints.
        config
            .insert_json5("scouting/multicast/enabled", "false")
            .map_err(|e| bad("ros.loopback_only", &e))?;
        if cfg.zenoh_listen.is_empty() {
            config
                .insert_json5("listen/endpoints", r#"["tcp/127.0.0.1:0"]"#)
                .map_err(|e| bad("ros.loopback_only", &e))?;
        }
    }
    Ok(Some(config))
}

/// Samples taken from one reader per poll at most.
const MAX_TAKES_PER_POLL: usize = 256;

/// The ROS 2 side of the daemon, running on its own thread.
pub struct RosIo {
    cfg: RosConfig,
    joint_names: Vec<String>,
    period: Duration,
}

impl RosIo {
    pub fn new(cfg: RosConfig, joint_names: Vec<String>, control_period: Duration) -> RosIo {
        RosIo {
            cfg,
            joint_names,
            period: control_period,
        }
    }

    /// Creates the node (so errors surface at start-up) and starts its thread.
    pub fn spawn(
        self,
        board: Arc<Blackboard>,
        live: Arc<LiveStats>,
        stop: Arc<AtomicBool>,
    ) -> Result<JoinHandle<()>, RosError> {
        let node_name = NodeName::new(&self.cfg.namespace, &self.cfg.node)
            .map_err(|e| create_err("node name", e))?;
        let options = NodeOptions::new().enable_rosout(false);
        // The middleware (and its node) lives as long as the thread.
        let (ep, keep): (Endpoints, Box<dyn Send>) = match self.cfg.middleware {
            MiddlewareKind::Dds => {
                let mut builder = DomainParticipantBuilder::new(self.cfg.domain_id);
                if self.cfg.loopback_only {
                    builder = builder.with_only_networks(vec![std::net::IpAddr::V4(
                        std::net::Ipv4Addr::LOCALHOST,
                    )]);
                }
                let dp = builder
                    .build()
                    .map_err(|e| create_err("DDS participant", e))?;
                let context = ros2_client::dds::Context::from_domain_participant(dp)
                    .map_err(|e| create_err("ROS 2 context", e))?;
                let node = context
                    .new_node(node_name, options)
                    .map_err(|e| create_err("node", e))?;
                let mut mw = transport::dds::Dds {
                    node,
                    mapping: match self.cfg.service_mapping {
                        ServiceMappingKind::Basic => ServiceMapping::Basic,
                        ServiceMappingKind::Enhanced => ServiceMapping::Enhanced,
                        ServiceMappingKind::Cyclone => ServiceMapping::Cyclone,
                    },
                };
                (endpoints(&mut mw, &self.cfg)?, Box::new(mw))
            }
            MiddlewareKind::Zenoh => self.zenoh(node_name, options)?,
        };
        tracing::info!(
            middleware = ?self.cfg.middleware,
            domain = self.cfg.domain_id,
            node = %self.cfg.node,
            loopback_only = self.cfg.loopback_only,
            "ROS 2 node up"
        );
        std::thread::Builder::new()
            .name("pi0d-ros".into())
            .spawn(move || self.run(keep, ep, &board, &live, &stop))
            .map_err(|e| create_err("ROS thread", e))
    }

    #[cfg(feature = "zenoh")]
    fn zenoh(
        &self,
        node_name: NodeName,
        options: NodeOptions,
    ) -> Result<(Endpoints, Box<dyn Send>), RosError> {
        let mut opts = ros2_client::zenoh::ContextOptions::new().domain_id(self.cfg.domain_id);
        // Without settings, the session is configured as rmw_zenoh's is: from
        // ZENOH_SESSION_CONFIG_URI / ZENOH_CONFIG_OVERRIDE, else a peer that connects to the
        // router on localhost:7447.
        if let Some(config) = zenoh_config(&self.cfg)? {
            opts = opts.zenoh_config(config);
        }
        let context = ros2_client::zenoh::Context::with_options(opts)
            .map_err(|e| create_err("Zenoh session", e))?;
        let node = context
            .new_node(node_name, options)
            .map_err(|e| create_err("node", e))?;
        let mut mw = transport::zenoh::Zenoh {
            node,
            context: context.clone(),
            node_name: NodeName::new(&self.cfg.namespace, &self.cfg.node)
                .map_err(|e| create_err("node name", e))?,
            next_entity: 1 << 20,
        };
        Ok((endpoints(&mut mw, &self.cfg)?, Box::new((mw, context))))
    }

    #[cfg(not(feature = "zenoh"))]
    fn zenoh(
        &self,
        _node_name: NodeName,
        _options: NodeOptions,
    ) -> Result<(Endpoints, Box<dyn Send>), RosError> {
        Err(RosError::Create {
            what: "Zenoh session".into(),
            message:
                "this pi0d was built without the `zenoh` feature (cargo build --features zenoh)"
                    .into(),
        })
    }

    fn run(
        self,
        _middleware: Box<dyn Send>,
        ep: Endpoints,
        board: &Blackboard,
        live: &LiveStats,
        stop: &AtomicBool,
    ) {
        let mut joints = JointStateDecoder::new(&self.joint_names);
        // One estimate per ~2 s at a 100 Hz joint-state rate.
        let mut skew = SkewEstimator::new(200);
        let mut log = RateLimitedLog::new(Duration::from_secs(5));
        let clock = ClockMap::now();
        let mut last_sent = MonoTime::ZERO;
        let mut next_status = MonoTime::now();
        let period_s = self.period.as_secs_f64();
        let mut latency: Vec<LatencyWindow> = self
            .cfg
            .cameras
            .iter()
            .map(|_| LatencyWindow::default())
            .collect();
        let mut latency_ms = vec![None; self.cfg.cameras.len()];
        // Per camera: its sender's clock against ours (a few seconds of frames per estimate).
        let mut camera_skew: Vec<SkewEstimator> = self
            .cfg
            .cameras
            .iter()
            .map(|_| SkewEstimator::new(30))
            .collect();
        while !stop.load(Ordering::Relaxed) {
            let now = MonoTime::now();
            // A new command goes out as soon as the control loop has made it (polled every
            // half millisecond), before the inputs are drained and decoded.
            let (stamp, cmd) = board.command.load();
            if stamp != last_sent && cmd.position.len() == self.joint_names.len() {
                last_sent = stamp;
                let header = msgs::Header {
                    stamp: clock.to_ros(stamp),
                    frame_id: String::new(),
                };
                let result = match &ep.command {
                    CommandPub::Trajectory(p) => p.put(decode::trajectory(
                        header,
                        &self.joint_names,
                        &cmd,
                        period_s,
                    )),
                    CommandPub::MultiArray(p) => p.put(decode::multi_array(&cmd)),
                    CommandPub::JointState(p) => {
                        p.put(decode::joint_command(header, &self.joint_names, &cmd))
                    }
                };
                if let Err(e) = result {
                    log.warn(&self.cfg.command_topic, &e);
                }
            }
            // Bounded drains: a reader that kept failing on one sample must not spin forever.
            for _ in 0..MAX_TAKES_PER_POLL {
                match ep.joint_states.take_next() {
                    Ok(Some(msg)) => {
                        if let Some(o) = skew.observe(now, clock.to_mono(&msg.header.stamp)) {
                            if SkewEstimator::skewed(o) {
                                log.warn(
                                    &self.cfg.joint_states,
                                    &format!("stamps are {o:.3} s behind arrival at best: clock skew between sender and pi0d (check NTP/PTP, or use_sim_time)"),
                                );
                            }
                        }
                        match joints.decode(&msg, &clock, now) {
                            Ok(Some(m)) => board.joint_state.store(m),
                            Ok(None) => {}
                            Err(e) => log.warn(&self.cfg.joint_states, &e.to_string()),
                        }
                    }
                    Ok(None) => break,
                    // A sample that does not decode (malformed CDR) is dropped and reported.
                    Err(e) => log.warn(&self.cfg.joint_states, &format!("undecodable sample: {e}")),
                }
            }
            for (k, cam) in ep.cameras.iter().enumerate() {
                let topic = &self.cfg.cameras[k];
                let cap = self.cfg.max_image_bytes;
                // Only the newest frame matters; older ones are dropped undecoded.
                let decoded = match cam {
                    CameraSub::Raw(sub) => newest(sub.as_ref(), topic, &mut log)
                        .map(|m| decode::image(&m, &clock, now, cap)),
                    CameraSub::Compressed(sub) => newest(sub.as_ref(), topic, &mut log)
                        .map(|m| decode::compressed_image(&m, &clock, now, cap)),
                };
                match decoded {
                    Some(Ok(frame)) => {
                        latency[k].record(MonoTime::now().seconds_since(frame.stamp));
                        if let Some(o) = camera_skew[k].observe(now, frame.stamp) {
                            if SkewEstimator::skewed(o) {
                                log.warn(
                                    topic,
                                    &format!("stamps are {o:.3} s behind arrival at best: clock skew between the camera's sender and pi0d (check NTP/PTP)"),
                                );
                            }
                        }
                        board.publish_frame(k, frame)
                    }
                    Some(Err(e)) => log.warn(topic, &e.to_string()),
                    None => {}
                }
            }
            while let Ok(Some(msg)) = ep.prompt.take_next() {
                if let Ok(mut p) = board.prompt.lock() {
                    tracing::info!(prompt = %msg.data, "task prompt");
                    *p = msg.data;
                }
            }
            while let Ok(Some(msg)) = ep.estop.take_next() {
                if msg.data {
                    tracing::warn!("e-stop pressed (topic {})", self.cfg.estop);
                }
                board.estop.store(msg.data, Ordering::SeqCst);
            }
            while let Ok(Some(msg)) = ep.reset.take_next() {
                if msg.data {
                    tracing::info!("reset requested (topic {})", self.cfg.reset);
                    board.resets.fetch_add(1, Ordering::SeqCst);
                }
            }
            for _ in 0..MAX_TAKES_PER_POLL {
                match ep.reset_service.next_request() {
                    Ok(Some(id)) => {
                        let response = if board.estop.load(Ordering::SeqCst) {
                            msgs::TriggerResponse {
                                success: false,
                                message: "e-stop still pressed: release it first".into(),
                            }
                        } else {
                            board.resets.fetch_add(1, Ordering::SeqCst);
                            tracing::info!("reset requested (service {})", self.cfg.reset_service);
                            msgs::TriggerResponse {
                                success: true,
                                message: "reset requested; motion resumes with a chunk from a fresh observation".into(),
                            }
                        };
                        if let Err(e) = ep.reset_service.reply(id, response) {
                            log.warn(&self.cfg.reset_service, &format!("reply failed: {e}"));
                        }
                    }
                    Ok(None) => break,
                    Err(e) => log.warn(&self.cfg.reset_service, &format!("bad request: {e}")),
                }
            }
            if now >= next_status {
                next_status = now.offset_seconds(1.0);
                let js_age = now.seconds_since(board.joint_state.load().stamp);
                let mut stamps = vec![MonoTime::ZERO; board.camera_stamps.len()];
                board.read_camera_stamps(&mut stamps);
                let cam_ages: Vec<f64> = stamps.iter().map(|s| now.seconds_since(*s)).collect();
                for (l, w) in latency_ms.iter_mut().zip(&mut latency) {
                    *l = w.summary_ms();
                }
                let camera_offsets: Vec<Option<f64>> =
                    camera_skew.iter().map(|s| s.offset_s).collect();
                let d = decode::diagnostics(
                    clock.to_ros(now),
                    &self.cfg.node,
                    live,
                    1.0 / period_s,
                    &decode::InputHealth {
                        joint_state_age_s: js_age,
                        camera_ages_s: &cam_ages,
                        camera_latency_ms: &latency_ms,
                        joint_state_clock_offset_s: skew.offset_s,
                        camera_clock_offsets_s: &camera_offsets,
                    },
                );
                if let Err(e) = ep.diagnostics.put(d) {
                    log.warn(&self.cfg.diagnostics_topic, &e);
                }
                let _ = ep.status.put(msgs::StringMsg {
                    data: format!(
                        "estop={} resets={}",
                        board.estop.load(Ordering::Relaxed),
                        board.resets.load(Ordering::Relaxed)
                    ),
                });
            }
            std::thread::sleep(Duration::from_micros(500));
        }
    }
}

//! ROS 2 over DDS (ros2-client on RustDDS): joint states, cameras, prompt, e-stop and reset in;
//! joint commands and status out. One thread owns the node: it drains the subscriptions into the
//! blackboard and publishes the newest command at the control rate, so the control loop never
//! waits on the middleware.

pub mod decode;
pub mod msgs;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use ros2_client::dds::rustdds::DomainParticipantBuilder;
use ros2_client::dds::{Server, ServiceMapping};
use ros2_client::qos::{Durability, History, Reliability, WhenFull};
use ros2_client::{
    Context, MessageTypeName, Name, Node, NodeName, NodeOptions, Publisher, QosProfile,
    ServiceTypeName, Subscription,
};

use super::Blackboard;
use crate::config::{CommandType, RosConfig, ServiceMappingKind};
use crate::control::stats::LiveStats;
use crate::time::MonoTime;
use decode::{ClockMap, JointStateDecoder, RateLimitedLog, SkewEstimator};

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

fn qos_reliable() -> QosProfile {
    QosProfile::publisher_default()
        .reliability(Reliability::Reliable {
            when_full: WhenFull::DEFAULT,
        })
        .durability(Durability::Volatile)
        .history(History::KeepLast { depth: 10 })
}

fn qos_sensor() -> QosProfile {
    QosProfile::subscription_default()
        .reliability(Reliability::BestEffort)
        .durability(Durability::Volatile)
        .history(History::KeepLast { depth: 1 })
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
    Raw(Subscription<msgs::Image>),
    Compressed(Subscription<msgs::CompressedImage>),
}

struct Endpoints {
    joint_states: Subscription<msgs::JointState>,
    cameras: Vec<CameraSub>,
    prompt: Subscription<msgs::StringMsg>,
    estop: Subscription<msgs::BoolMsg>,
    reset: Subscription<msgs::BoolMsg>,
    trajectory: Option<Publisher<msgs::JointTrajectory>>,
    multi_array: Option<Publisher<msgs::Float64MultiArray>>,
    joint_command: Option<Publisher<msgs::JointState>>,
    status: Publisher<msgs::StringMsg>,
    diagnostics: Publisher<msgs::DiagnosticArray>,
    reset_service: Server<msgs::TriggerRequest, msgs::TriggerResponse>,
}

fn endpoints(node: &mut Node, cfg: &RosConfig) -> Result<Endpoints, RosError> {
    let topic = |node: &mut Node, t: &str, pkg: &str, ty: &str, qos: &QosProfile| {
        node.create_topic(&name(t)?, MessageTypeName::new(pkg, ty), qos)
            .map_err(|e| create_err(format!("topic `{t}`"), e))
    };
    let sensor = qos_sensor();
    let reliable = qos_reliable();
    let t = topic(
        node,
        &cfg.joint_states,
        "sensor_msgs",
        "JointState",
        &sensor,
    )?;
    let joint_states = node
        .create_subscription(&t, Some(sensor.clone()))
        .map_err(|e| create_err("joint state subscription", e))?;
    let mut cameras = Vec::new();
    for cam in &cfg.cameras {
        let sub_err = |e| create_err(format!("camera `{cam}`"), e);
        if cam.ends_with("/compressed") {
            let t = topic(node, cam, "sensor_msgs", "CompressedImage", &sensor)?;
            cameras.push(CameraSub::Compressed(
                node.create_subscription(&t, Some(sensor.clone()))
                    .map_err(sub_err)?,
            ));
        } else {
            let t = topic(node, cam, "sensor_msgs", "Image", &sensor)?;
            cameras.push(CameraSub::Raw(
                node.create_subscription(&t, Some(sensor.clone()))
                    .map_err(sub_err)?,
            ));
        }
    }
    let t = topic(node, &cfg.prompt, "std_msgs", "String", &reliable)?;
    let prompt = node
        .create_subscription(&t, Some(reliable.clone()))
        .map_err(|e| create_err("prompt subscription", e))?;
    let t = topic(node, &cfg.estop, "std_msgs", "Bool", &reliable)?;
    let estop = node
        .create_subscription(&t, Some(reliable.clone()))
        .map_err(|e| create_err("e-stop subscription", e))?;
    let t = topic(node, &cfg.reset, "std_msgs", "Bool", &reliable)?;
    let reset = node
        .create_subscription(&t, Some(reliable.clone()))
        .map_err(|e| create_err("reset subscription", e))?;
    let (mut trajectory, mut multi_array, mut joint_command) = (None, None, None);
    match cfg.command_type {
        CommandType::JointTrajectory => {
            let t = topic(
                node,
                &cfg.command_topic,
                "trajectory_msgs",
                "JointTrajectory",
                &reliable,
            )?;
            trajectory = Some(
                node.create_publisher(&t, None)
                    .map_err(|e| create_err("command publisher", e))?,
            );
        }
        CommandType::Float64MultiArray => {
            let t = topic(
                node,
                &cfg.command_topic,
                "std_msgs",
                "Float64MultiArray",
                &reliable,
            )?;
            multi_array = Some(
                node.create_publisher(&t, None)
                    .map_err(|e| create_err("command publisher", e))?,
            );
        }
        CommandType::JointState => {
            let t = topic(
                node,
                &cfg.command_topic,
                "sensor_msgs",
                "JointState",
                &reliable,
            )?;
            joint_command = Some(
                node.create_publisher(&t, None)
                    .map_err(|e| create_err("command publisher", e))?,
            );
        }
    }
    let t = topic(node, &cfg.status_topic, "std_msgs", "String", &reliable)?;
    let status = node
        .create_publisher(&t, None)
        .map_err(|e| create_err("status publisher", e))?;
    let t = topic(
        node,
        &cfg.diagnostics_topic,
        "diagnostic_msgs",
        "DiagnosticArray",
        &reliable,
    )?;
    let diagnostics = node
        .create_publisher(&t, None)
        .map_err(|e| create_err("diagnostics publisher", e))?;
    let mapping = match cfg.service_mapping {
        ServiceMappingKind::Basic => ServiceMapping::Basic,
        ServiceMappingKind::Enhanced => ServiceMapping::Enhanced,
        ServiceMappingKind::Cyclone => ServiceMapping::Cyclone,
    };
    let reset_service = node
        .create_server::<msgs::TriggerRequest, msgs::TriggerResponse>(
            mapping,
            &name(&cfg.reset_service)?,
            &ServiceTypeName::new("std_srvs", "Trigger"),
            reliable.clone(),
            reliable.clone(),
        )
        .map_err(|e| create_err("reset service", e))?;
    Ok(Endpoints {
        reset_service,
        joint_states,
        cameras,
        prompt,
        estop,
        reset,
        trajectory,
        multi_array,
        joint_command,
        status,
        diagnostics,
    })
}

/// The newest sample waiting on `sub` (older ones are dropped); undecodable ones are reported.
fn newest<M: 'static + serde::de::DeserializeOwned>(
    sub: &Subscription<M>,
    topic: &str,
    log: &mut RateLimitedLog,
) -> Option<M> {
    let mut newest = None;
    for _ in 0..MAX_TAKES_PER_POLL {
        match sub.take() {
            Ok(Some((msg, _))) => newest = Some(msg),
            Ok(None) => break,
            Err(e) => log.warn(topic, &format!("undecodable sample: {e:?}")),
        }
    }
    newest
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
        let context = if self.cfg.loopback_only {
            let dp = DomainParticipantBuilder::new(self.cfg.domain_id)
                .with_only_networks(vec![std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST)])
                .build()
                .map_err(|e| create_err("DDS participant", e))?;
            Context::from_domain_participant(dp).map_err(|e| create_err("ROS 2 context", e))?
        } else {
            let dp = DomainParticipantBuilder::new(self.cfg.domain_id)
                .build()
                .map_err(|e| create_err("DDS participant", e))?;
            Context::from_domain_participant(dp).map_err(|e| create_err("ROS 2 context", e))?
        };
        let node_name = NodeName::new(&self.cfg.namespace, &self.cfg.node)
            .map_err(|e| create_err("node name", e))?;
        let mut node = context
            .new_node(node_name, NodeOptions::new().enable_rosout(false))
            .map_err(|e| create_err("node", e))?;
        let ep = endpoints(&mut node, &self.cfg)?;
        tracing::info!(domain = self.cfg.domain_id, node = %self.cfg.node, loopback_only = self.cfg.loopback_only, "ROS 2 node up");
        std::thread::Builder::new()
            .name("pi0d-ros".into())
            .spawn(move || self.run(node, ep, &board, &live, &stop))
            .map_err(|e| create_err("ROS thread", e))
    }

    fn run(
        self,
        _node: Node,
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
        let mut next_publish = MonoTime::now();
        let mut last_sent = MonoTime::ZERO;
        let mut next_status = MonoTime::now();
        let period_s = self.period.as_secs_f64();
        while !stop.load(Ordering::Relaxed) {
            let now = MonoTime::now();
            // Bounded drains: a reader that kept failing on one sample must not spin forever.
            for _ in 0..MAX_TAKES_PER_POLL {
                match ep.joint_states.take() {
                    Ok(Some((msg, _))) => {
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
                    Err(e) => log.warn(
                        &self.cfg.joint_states,
                        &format!("undecodable sample: {e:?}"),
                    ),
                }
            }
            for (k, cam) in ep.cameras.iter().enumerate() {
                let topic = &self.cfg.cameras[k];
                let cap = self.cfg.max_image_bytes;
                // Only the newest frame matters; older ones are dropped undecoded.
                let decoded = match cam {
                    CameraSub::Raw(sub) => {
                        newest(sub, topic, &mut log).map(|m| decode::image(&m, &clock, now, cap))
                    }
                    CameraSub::Compressed(sub) => newest(sub, topic, &mut log)
                        .map(|m| decode::compressed_image(&m, &clock, now, cap)),
                };
                match decoded {
                    Some(Ok(frame)) => board.publish_frame(k, frame),
                    Some(Err(e)) => log.warn(topic, &e.to_string()),
                    None => {}
                }
            }
            while let Ok(Some((msg, _))) = ep.prompt.take() {
                if let Ok(mut p) = board.prompt.lock() {
                    tracing::info!(prompt = %msg.data, "task prompt");
                    *p = msg.data;
                }
            }
            while let Ok(Some((msg, _))) = ep.estop.take() {
                if msg.data {
                    tracing::warn!("e-stop pressed (topic {})", self.cfg.estop);
                }
                board.estop.store(msg.data, Ordering::SeqCst);
            }
            while let Ok(Some((msg, _))) = ep.reset.take() {
                if msg.data {
                    tracing::info!("reset requested (topic {})", self.cfg.reset);
                    board.resets.fetch_add(1, Ordering::SeqCst);
                }
            }
            for _ in 0..MAX_TAKES_PER_POLL {
                match ep.reset_service.receive_request() {
                    Ok(Some((id, _))) => {
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
                        if let Err(e) = ep.reset_service.send_response(id, response) {
                            log.warn(&self.cfg.reset_service, &format!("reply failed: {e:?}"));
                        }
                    }
                    Ok(None) => break,
                    Err(e) => log.warn(&self.cfg.reset_service, &format!("bad request: {e:?}")),
                }
            }
            if now >= next_publish {
                next_publish = next_publish.offset_seconds(period_s).max(now);
                let (stamp, cmd) = board.command.load();
                if stamp != last_sent && cmd.position.len() == self.joint_names.len() {
                    last_sent = stamp;
                    let header = msgs::Header {
                        stamp: clock.to_ros(stamp),
                        frame_id: String::new(),
                    };
                    let result = if let Some(p) = &ep.trajectory {
                        p.publish(decode::trajectory(
                            header,
                            &self.joint_names,
                            &cmd,
                            period_s,
                        ))
                        .map_err(|e| format!("{e:?}"))
                    } else if let Some(p) = &ep.multi_array {
                        p.publish(decode::multi_array(&cmd))
                            .map_err(|e| format!("{e:?}"))
                    } else if let Some(p) = &ep.joint_command {
                        p.publish(decode::joint_command(header, &self.joint_names, &cmd))
                            .map_err(|e| format!("{e:?}"))
                    } else {
                        Ok(())
                    };
                    if let Err(e) = result {
                        log.warn(&self.cfg.command_topic, &e);
                    }
                }
            }
            if now >= next_status {
                next_status = now.offset_seconds(1.0);
                let js_age = now.seconds_since(board.joint_state.load().stamp);
                let mut stamps = vec![MonoTime::ZERO; board.camera_stamps.len()];
                board.read_camera_stamps(&mut stamps);
                let cam_ages: Vec<f64> = stamps.iter().map(|s| now.seconds_since(*s)).collect();
                let d = decode::diagnostics(
                    clock.to_ros(now),
                    &self.cfg.node,
                    live,
                    1.0 / period_s,
                    js_age,
                    &cam_ages,
                    skew.offset_s,
                );
                if let Err(e) = ep.diagnostics.publish(d) {
                    log.warn(&self.cfg.diagnostics_topic, &format!("{e:?}"));
                }
                let _ = ep.status.publish(msgs::StringMsg {
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

//! ROS 2 over DDS (ros2-client on RustDDS) or Zenoh (ros2-client's rmw_zenoh-compatible
//! backend, feature `zenoh`): joint states, cameras, prompt, e-stop and reset in;
//! joint commands and status out. One thread owns the node: it drains the subscriptions into the
//! blackboard and publishes the newest command at the control rate, so the control loop never
//! waits on the middleware.

pub(crate) mod decode;
pub(crate) mod encode;
mod frames;
mod intake;
pub(crate) mod log;
pub(crate) mod msgs;
pub(crate) mod others;
pub(crate) mod teardown;
pub(crate) mod timing;
pub(crate) mod transport;
pub(crate) mod type_hash;
mod worker;

use std::sync::atomic::AtomicBool;
use std::time::Duration;

use ros2_client::dds::rustdds::DomainParticipantBuilder;
use ros2_client::dds::ServiceMapping;
use ros2_client::qos::{Durability, History, Reliability, WhenFull};
use ros2_client::{MessageTypeName, Name, NodeName, NodeOptions, QosProfile, ServiceTypeName};
use transport::{Middleware, Put, Serve, Take};

use super::Blackboard;
use crate::config::{Middleware as MiddlewareKind, RosConfig, ServiceMappingKind, TopicQos};
use crate::robot::RobotLimits;
use crate::telemetry::LiveStats;
use encode::CommandPublisher;

/// A middleware error, kept as the source (ros2-client's and Zenoh's errors differ in type).
pub(crate) type MiddlewareError = Box<dyn std::error::Error + Send + Sync + 'static>;

#[derive(Debug, thiserror::Error)]
pub enum RosError {
    #[error("ROS 2: cannot create {what}")]
    Create {
        what: String,
        #[source]
        source: MiddlewareError,
    },
    #[error(
        "ROS 2: ros.middleware = \"zenoh\" needs pi0d built with the `zenoh` feature (cargo build --features zenoh)"
    )]
    NoZenoh,
}

fn create_err(what: impl Into<String>, e: impl Into<MiddlewareError>) -> RosError {
    RosError::Create {
        what: what.into(),
        source: e.into(),
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

/// What other nodes publish, as the middleware discovered it: `(topic, "type, reliability")`.
type GraphProbe = Box<dyn Fn() -> Vec<(String, String)> + Send>;

struct Endpoints {
    joint_states: Box<dyn Take<msgs::JointState>>,
    cameras: Vec<CameraSub>,
    prompt: Box<dyn Take<msgs::StringMsg>>,
    estop: Box<dyn Take<msgs::BoolMsg>>,
    reset: Box<dyn Take<msgs::BoolMsg>>,
    /// One publisher per command output.
    command: Vec<CommandPublisher>,
    status: Box<dyn Put<msgs::StringMsg>>,
    diagnostics: Box<dyn Put<msgs::DiagnosticArray>>,
    reset_service: Box<dyn Serve<msgs::TriggerRequest, msgs::TriggerResponse>>,
    /// What the middleware saw published instead of our joint states (DDS discovery, or a
    /// Zenoh probe); dropped once they flow.
    graph: Option<GraphProbe>,
    /// Others on pi0d's own names (a second publisher on a command topic, a namesake node).
    others: Option<others::OthersProbe>,
}

fn endpoints(
    mw: &mut impl Middleware,
    cfg: &RosConfig,
    control_period_s: f64,
) -> Result<Endpoints, RosError> {
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
    let mut command = Vec::with_capacity(cfg.commands.len());
    for group in &cfg.commands {
        command.push(CommandPublisher::advertise(
            mw,
            &name(&cfg.command_out(group))?,
            group,
            &commands,
            control_period_s,
            !cfg.dry_run,
        )?);
    }
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
        graph: None,
        others: None,
    })
}

/// A DDS topic as ROS names it: `rt/joint_states` and `sensor_msgs::msg::dds_::JointState_`
/// are `/joint_states` and `sensor_msgs/msg/JointState`; other DDS topics are left out.
fn ros_topic(name: &str, ty: &str) -> Option<(String, String)> {
    let topic = name.strip_prefix("rt")?;
    let ty = ty.replace("::dds_::", "::").replace("::", "/");
    Some((
        topic.to_string(),
        ty.strip_suffix('_').unwrap_or(&ty).to_string(),
    ))
}

/// A connected node: its endpoints, and the middleware that must live as long as they do.
pub(crate) struct RosNode {
    _teardown: teardown::Guard,
    io: RosIo,
    ep: Endpoints,
    _keep: Box<dyn Send>,
}

impl RosNode {
    /// Drains the inputs into the blackboard and publishes commands and status until `stop`;
    /// `beat` is called on every pass (the supervisor's liveness check); `on_camera_thread`
    /// first thing on the camera (decoding) thread (the daemon lowers its priority there).
    pub(crate) fn run(
        self,
        board: &Blackboard,
        live: &LiveStats,
        stop: &AtomicBool,
        beat: &dyn Fn(),
        on_camera_thread: &(dyn Fn() + Sync),
    ) {
        let RosNode {
            _teardown,
            io,
            ep,
            _keep,
        } = self;
        let names = io.limits.names().map(str::to_string).collect();
        let tolerance = io.measured_tolerance;
        let plausible = io
            .limits
            .joints
            .iter()
            .map(|j| (j.lower - tolerance, j.upper + tolerance))
            .collect();
        worker::Worker::new(io.cfg, names, plausible, io.period, ep, board, live).run(
            stop,
            beat,
            on_camera_thread,
        )
    }
}

/// The ROS 2 side of the daemon, running on its own thread.
pub(crate) struct RosIo {
    cfg: RosConfig,
    /// The commanded joints (their names).
    limits: RobotLimits,
    /// `safety.measured_position_tolerance`: how far outside its limits a measured position
    /// may be before it is a sensor fault.
    measured_tolerance: f64,
    period: Duration,
}

impl RosIo {
    pub(crate) fn new(
        cfg: RosConfig,
        limits: RobotLimits,
        measured_tolerance: f64,
        control_period: Duration,
    ) -> RosIo {
        RosIo {
            cfg,
            limits,
            measured_tolerance,
            period: control_period,
        }
    }

    /// The topics pi0d's commands go out on (a dry run's shadow topics in a dry run).
    fn command_topics(&self) -> Vec<String> {
        self.cfg
            .commands
            .iter()
            .map(|g| self.cfg.command_out(g))
            .collect()
    }

    /// The node's endpoints on `mw`, as configured.
    fn endpoints(&self, mw: &mut impl Middleware) -> Result<Endpoints, RosError> {
        endpoints(mw, &self.cfg, self.period.as_secs_f64())
    }

    /// Creates the node and its endpoints (so errors surface at start-up); `RosNode::run` then
    /// serves them on the daemon's ROS thread.
    pub(crate) fn connect(self) -> Result<RosNode, RosError> {
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
                let probe = context.clone();
                let others_probe = context.clone();
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
                let mut ep = self.endpoints(&mut mw)?;
                ep.graph = Some(Box::new(move || {
                    use ros2_client::dds::rustdds::{policy, RTPSEntity};
                    // Other participants' writers: what is published, and how.
                    let dp = probe.domain_participant();
                    let own = dp.guid().prefix;
                    dp.discovered_writers()
                        .iter()
                        .map(|w| &w.publication_topic_data)
                        .filter(|t| t.key.prefix != own)
                        .filter_map(|t| {
                            let (name, ty) = ros_topic(&t.topic_name, &t.type_name)?;
                            let best_effort =
                                matches!(t.reliability, Some(policy::Reliability::BestEffort));
                            let qos = if best_effort {
                                "best effort"
                            } else {
                                "reliable"
                            };
                            Some((name, format!("{ty}, {qos}")))
                        })
                        .collect()
                }));
                ep.others = Some(others::dds(others_probe, self.command_topics()));
                (ep, Box::new(mw))
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
        Ok(RosNode {
            io: self,
            ep,
            _teardown: teardown::Guard,
            _keep: keep,
        })
    }

    #[cfg(feature = "zenoh")]
    fn zenoh(
        &self,
        node_name: NodeName,
        options: NodeOptions,
    ) -> Result<(Endpoints, Box<dyn Send>), RosError> {
        let (config, exposure) = crate::zenoh_session::ros(&self.cfg)
            .map_err(|e| create_err("Zenoh configuration", e))?;
        let opts = ros2_client::zenoh::ContextOptions::new()
            .domain_id(self.cfg.domain_id)
            .zenoh_config(config);
        let context = ros2_client::zenoh::Context::with_options(opts)
            .map_err(|e| create_err("Zenoh session", e))?;
        let zid = context.session().zid();
        if exposure.open() {
            tracing::warn!(session = %exposure, %zid, "Zenoh session for ROS 2");
        } else {
            tracing::info!(session = %exposure, %zid, "Zenoh session for ROS 2");
        }
        let node = context
            .new_node(node_name, options)
            .map_err(|e| create_err("node", e))?;
        let mut mw = transport::zenoh::Zenoh {
            node,
            context: context.clone(),
            node_name: NodeName::new(&self.cfg.namespace, &self.cfg.node)
                .map_err(|e| create_err("node name", e))?,
            next_entity: 1 << 20,
            type_hashes: self.cfg.zenoh_type_hashes,
        };
        let mut ep = self.endpoints(&mut mw)?;
        ep.graph = Some(self.zenoh_joint_state_probe(&context)?);
        ep.others = Some(
            others::zenoh(
                &context,
                self.cfg.domain_id,
                self.cfg.namespace.clone(),
                self.cfg.node.clone(),
                self.command_topics(),
            )
            .map_err(|e| create_err("Zenoh liveliness subscriber", e))?,
        );
        Ok((ep, Box::new((mw, context))))
    }

    /// Which topics JointState samples arrive on, whatever their name (Zenoh has no graph
    /// listing of types here): `(topic, "sensor_msgs/msg/JointState, samples arriving")` per
    /// topic, for the start-up error. Our own outputs are left out. The probe owns its
    /// subscription: dropping it (once joint states flow) ends it.
    #[cfg(feature = "zenoh")]
    fn zenoh_joint_state_probe(
        &self,
        context: &ros2_client::zenoh::Context,
    ) -> Result<GraphProbe, RosError> {
        use ::zenoh::Wait;
        use std::collections::BTreeSet;
        use std::sync::{Arc, Mutex};
        let seen = Arc::new(Mutex::new(BTreeSet::<(String, String)>::new()));
        let ours = self.command_topics();
        let sink = seen.clone();
        let key = format!(
            "{}/**/sensor_msgs::msg::dds_::JointState_/*",
            self.cfg.domain_id
        );
        let sub = context
            .session()
            .declare_subscriber(key)
            .callback(move |sample| {
                // <domain>/<topic chunks>/<type>/<hash>
                let key = sample.key_expr().as_str();
                let mut parts: Vec<&str> = key.split('/').collect();
                if parts.len() < 4 {
                    return;
                }
                parts.truncate(parts.len() - 2);
                let topic = format!("/{}", parts[1..].join("/"));
                if ours.contains(&topic) {
                    return;
                }
                if let Ok(mut s) = sink.lock() {
                    if s.len() < 32 {
                        s.insert((topic, "sensor_msgs/msg/JointState, samples arriving".into()));
                    }
                }
            })
            .wait()
            .map_err(|e| create_err("Zenoh JointState probe", e))?;
        Ok(Box::new(move || {
            let _subscription = &sub;
            seen.lock()
                .map(|s| s.iter().cloned().collect())
                .unwrap_or_default()
        }))
    }

    #[cfg(not(feature = "zenoh"))]
    fn zenoh(
        &self,
        _node_name: NodeName,
        _options: NodeOptions,
    ) -> Result<(Endpoints, Box<dyn Send>), RosError> {
        Err(RosError::NoZenoh)
    }
}

#[cfg(test)]
mod cdr_tests;
#[cfg(test)]
mod fuzz_tests;

#[cfg(test)]
mod tests {
    #[test]
    fn when_dds_topics_listed_expect_ros_names_and_types() {
        assert_eq!(
            super::ros_topic(
                "rt/robot/joint_states",
                "sensor_msgs::msg::dds_::JointState_"
            ),
            Some((
                "/robot/joint_states".to_string(),
                "sensor_msgs/msg/JointState".to_string()
            ))
        );
        assert_eq!(super::ros_topic("DCPSParticipant", "x"), None);
    }
}

//! The middleware under the ROS thread: DDS (always) or Zenoh as rmw_zenoh does (feature
//! `zenoh`). Both come from ros2-client with different entity types; the thread sees them through
//! three small traits, so its logic (draining, decoding, publishing at the control rate) is one.

use ros2_client::{
    ActionTypeName, MessageTypeName, Name, QosProfile, RmwRequestId, ServiceTypeName,
};
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::{create_err, RosError};

/// What a middleware entity failed to do (the caller's log names the topic or service).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Op {
    Take,
    Publish,
    ReceiveRequest,
    Reply,
    SendGoal,
    ReceiveGoalReply,
    /// Serializing a message (CDR), before it is published: the Zenoh publisher's own step.
    #[cfg(any(test, feature = "zenoh"))]
    Encode,
}

impl Op {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Op::Take => "take a sample",
            Op::Publish => "publish",
            Op::ReceiveRequest => "receive a request",
            Op::Reply => "reply",
            Op::SendGoal => "send a goal",
            Op::ReceiveGoalReply => "receive a goal reply",
            #[cfg(any(test, feature = "zenoh"))]
            Op::Encode => "encode a message (CDR)",
        }
    }
}

/// A middleware call that failed, with the middleware's own error as its source.
#[derive(Debug, thiserror::Error)]
#[error("cannot {}", op.name())]
pub(crate) struct TransportError {
    pub(crate) op: Op,
    #[source]
    pub(crate) source: Box<dyn std::error::Error + Send + Sync + 'static>,
}

impl TransportError {
    pub(crate) fn new(
        op: Op,
        source: impl Into<Box<dyn std::error::Error + Send + Sync + 'static>>,
    ) -> Self {
        TransportError {
            op,
            source: source.into(),
        }
    }

    /// For `map_err`: the middleware error `e` of `op`.
    pub(crate) fn of<E: std::error::Error + Send + Sync + 'static>(
        op: Op,
    ) -> impl FnOnce(E) -> Self {
        move |e| TransportError::new(op, e)
    }
}

/// What every message type is (all of `msgs` are).
pub(crate) trait Msg:
    Serialize + DeserializeOwned + Clone + std::fmt::Debug + Send + Sync + 'static
{
}
impl<T: Serialize + DeserializeOwned + Clone + std::fmt::Debug + Send + Sync + 'static> Msg for T {}

/// A service's request or response type.
pub(crate) trait SrvMsg: Msg + ros2_client::Message {}
impl<T: Msg + ros2_client::Message> SrvMsg for T {}

/// A subscription: the next waiting sample, if any.
pub(crate) trait Take<M>: Send {
    fn take_next(&self) -> Result<Option<M>, TransportError>;
}

/// A publisher.
pub(crate) trait Put<M>: Send {
    fn put(&self, msg: M) -> Result<(), TransportError>;
}

/// A service server: the next waiting request's id, and the reply to it.
pub(crate) trait Serve<Req, Resp>: Send {
    fn next_request(&self) -> Result<Option<RmwRequestId>, TransportError>;
    fn reply(&self, id: RmwRequestId, resp: Resp) -> Result<(), TransportError>;
}

/// An action client that only sends goals: the newest goal is the target (each preempts the
/// one before at servers such as gripper_action_controller), so results are not awaited.
pub(crate) trait SendGoal<G>: Send {
    /// Sends `goal` with a fresh goal id.
    fn send(&mut self, goal: G) -> Result<(), TransportError>;
    /// The replies to sent goals that arrived since the last call: (accepted, refused).
    fn replies(&mut self) -> Result<(u64, u64), TransportError>;
}

/// Makes entities on one node.
pub(crate) trait Middleware {
    fn subscribe<M: Msg>(
        &mut self,
        topic: &Name,
        ty: MessageTypeName,
        qos: &QosProfile,
    ) -> Result<Box<dyn Take<M>>, RosError>;

    fn advertise<M: Msg>(
        &mut self,
        topic: &Name,
        ty: MessageTypeName,
        qos: &QosProfile,
    ) -> Result<Box<dyn Put<M>>, RosError>;

    fn serve<Req: SrvMsg, Resp: SrvMsg>(
        &mut self,
        service: &Name,
        ty: ServiceTypeName,
        qos: &QosProfile,
    ) -> Result<Box<dyn Serve<Req, Resp>>, RosError>;

    /// A client of `action`, whose goal is `G`, result `R` and feedback `F`.
    fn action_client<G: SrvMsg, R: SrvMsg, F: SrvMsg>(
        &mut self,
        action: &Name,
        ty: ActionTypeName,
        qos: &QosProfile,
    ) -> Result<Box<dyn SendGoal<G>>, RosError>;
}

pub(crate) mod dds {
    use super::*;
    use ros2_client::action::ActionClientQosPolicies;
    use ros2_client::dds::{ActionClient, Node, Publisher, Server, ServiceMapping, Subscription};

    impl<M: Msg> Take<M> for Subscription<M> {
        fn take_next(&self) -> Result<Option<M>, TransportError> {
            self.take()
                .map(|o| o.map(|(m, _)| m))
                .map_err(TransportError::of(Op::Take))
        }
    }

    impl<M: Msg> Put<M> for Publisher<M> {
        fn put(&self, msg: M) -> Result<(), TransportError> {
            self.publish(msg).map_err(TransportError::of(Op::Publish))
        }
    }

    /// A DDS node and how its services lay requests on the wire.
    pub(crate) struct Dds {
        pub(crate) node: Node,
        pub(crate) mapping: ServiceMapping,
    }

    impl Middleware for Dds {
        fn subscribe<M: Msg>(
            &mut self,
            topic: &Name,
            ty: MessageTypeName,
            qos: &QosProfile,
        ) -> Result<Box<dyn Take<M>>, RosError> {
            let t = self
                .node
                .create_topic(topic, ty, qos)
                .map_err(|e| create_err(format!("topic `{topic}`"), e))?;
            let s = self
                .node
                .create_subscription::<M>(&t, Some(qos.clone()))
                .map_err(|e| create_err(format!("subscription `{topic}`"), e))?;
            Ok(Box::new(s))
        }

        fn advertise<M: Msg>(
            &mut self,
            topic: &Name,
            ty: MessageTypeName,
            qos: &QosProfile,
        ) -> Result<Box<dyn Put<M>>, RosError> {
            let t = self
                .node
                .create_topic(topic, ty, qos)
                .map_err(|e| create_err(format!("topic `{topic}`"), e))?;
            let p = self
                .node
                .create_publisher::<M>(&t, None)
                .map_err(|e| create_err(format!("publisher `{topic}`"), e))?;
            Ok(Box::new(p))
        }

        fn serve<Req: SrvMsg, Resp: SrvMsg>(
            &mut self,
            service: &Name,
            ty: ServiceTypeName,
            qos: &QosProfile,
        ) -> Result<Box<dyn Serve<Req, Resp>>, RosError> {
            let s = self
                .node
                .create_server::<Req, Resp>(self.mapping, service, &ty, qos.clone(), qos.clone())
                .map_err(|e| create_err(format!("service `{service}`"), e))?;
            Ok(Box::new(s))
        }

        fn action_client<G: SrvMsg, R: SrvMsg, F: SrvMsg>(
            &mut self,
            action: &Name,
            ty: ActionTypeName,
            qos: &QosProfile,
        ) -> Result<Box<dyn SendGoal<G>>, RosError> {
            self.goals::<G, R, F>(action, ty, qos)
        }
    }

    impl<Req: SrvMsg, Resp: SrvMsg> Serve<Req, Resp> for Server<Req, Resp> {
        fn next_request(&self) -> Result<Option<RmwRequestId>, TransportError> {
            self.receive_request()
                .map(|o| o.map(|(id, _)| id))
                .map_err(TransportError::of(Op::ReceiveRequest))
        }

        fn reply(&self, id: RmwRequestId, resp: Resp) -> Result<(), TransportError> {
            self.send_response(id, resp)
                .map_err(TransportError::of(Op::Reply))
        }
    }

    /// A goal sender on ros2-client's DDS action client (its send_goal service, non-blocking).
    struct Goals<G: SrvMsg, R: SrvMsg, F: SrvMsg> {
        client: ActionClient<G, R, F>,
        /// Requests not answered yet (a few at most: goals go out at 20 Hz or less).
        pending: Vec<RmwRequestId>,
    }

    /// Pending goals beyond this many are forgotten (a server that never answers).
    const MAX_PENDING: usize = 64;

    impl<G: SrvMsg, R: SrvMsg, F: SrvMsg> SendGoal<G> for Goals<G, R, F> {
        fn send(&mut self, goal: G) -> Result<(), TransportError> {
            let (id, _) = self
                .client
                .send_goal(goal)
                .map_err(TransportError::of(Op::SendGoal))?;
            if self.pending.len() == MAX_PENDING {
                self.pending.remove(0);
            }
            self.pending.push(id);
            Ok(())
        }

        fn replies(&mut self) -> Result<(u64, u64), TransportError> {
            let (mut accepted, mut refused) = (0, 0);
            while let Some((id, resp)) = self
                .client
                .goal_client()
                .receive_response()
                .map_err(TransportError::of(Op::ReceiveGoalReply))?
            {
                if let Some(i) = self.pending.iter().position(|p| *p == id) {
                    self.pending.swap_remove(i);
                    if resp.accepted {
                        accepted += 1;
                    } else {
                        refused += 1;
                    }
                }
            }
            Ok((accepted, refused))
        }
    }

    impl Dds {
        pub(super) fn goals<G: SrvMsg, R: SrvMsg, F: SrvMsg>(
            &mut self,
            action: &Name,
            ty: ActionTypeName,
            qos: &QosProfile,
        ) -> Result<Box<dyn SendGoal<G>>, RosError> {
            let q = ActionClientQosPolicies {
                goal_service: qos.clone(),
                result_service: qos.clone(),
                cancel_service: qos.clone(),
                feedback_subscription: qos.clone(),
                status_subscription: qos.clone(),
            };
            let client = self
                .node
                .create_action_client::<G, R, F>(self.mapping, action, &ty, q)
                .map_err(|e| create_err(format!("action client `{action}`"), e))?;
            Ok(Box::new(Goals {
                client,
                pending: Vec::new(),
            }))
        }
    }
}

#[cfg(feature = "zenoh")]
pub(crate) mod zenoh {
    use super::*;
    use ros2_client::zenoh::{Node, Publisher, Server, Subscription};

    impl<M: Msg> Take<M> for Subscription<M> {
        fn take_next(&self) -> Result<Option<M>, TransportError> {
            self.try_take()
                .map(|o| o.map(|(m, _)| m))
                .map_err(TransportError::of(Op::Take))
        }
    }

    impl<M: Msg> Put<M> for Publisher<M> {
        fn put(&self, msg: M) -> Result<(), TransportError> {
            self.publish(msg).map_err(TransportError::of(Op::Publish))
        }
    }

    impl<Req: SrvMsg, Resp: SrvMsg> Serve<Req, Resp> for Server<Req, Resp> {
        fn next_request(&self) -> Result<Option<RmwRequestId>, TransportError> {
            self.try_receive_request()
                .map(|o| o.map(|(id, _)| id))
                .map_err(TransportError::of(Op::ReceiveRequest))
        }

        fn reply(&self, id: RmwRequestId, resp: Resp) -> Result<(), TransportError> {
            self.send_response(id, resp)
                .map_err(TransportError::of(Op::Reply))
        }
    }

    pub(crate) struct Zenoh {
        pub(crate) node: Node,
        pub(crate) context: ros2_client::zenoh::Context,
        pub(crate) node_name: ros2_client::NodeName,
        /// Entity ids for pi0d's own publishers, far above the node's own counter.
        pub(crate) next_entity: u64,
    }

    /// CDR little-endian encapsulation header, as rmw_zenoh prefixes every payload.
    const CDR_LE: [u8; 4] = [0x00, 0x01, 0x00, 0x00];

    /// A publisher whose key and liveliness token carry the type's real REP-2016 hash, so
    /// rmw_zenoh subscribers (which match the hash exactly) receive it. ros2-client's own
    /// publishers put a placeholder there for types it does not know.
    struct HashedPublisher {
        publisher: ::zenoh::pubsub::Publisher<'static>,
        gid: [u8; 16],
        seq: std::sync::atomic::AtomicI64,
        _token: ::zenoh::liveliness::LivelinessToken,
    }

    impl<M: Msg> Put<M> for HashedPublisher {
        fn put(&self, msg: M) -> Result<(), TransportError> {
            use ::zenoh::Wait;
            let mut payload = CDR_LE.to_vec();
            payload.extend(
                cdr_encoding::to_vec::<M, byteorder::LittleEndian>(&msg)
                    .map_err(TransportError::of(Op::Encode))?,
            );
            let seq = self.seq.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as i64);
            // rmw_zenoh's attachment: sequence number, source timestamp, GID (length-prefixed).
            let mut attachment = Vec::with_capacity(33);
            attachment.extend(seq.to_le_bytes());
            attachment.extend(now.to_le_bytes());
            attachment.push(16);
            attachment.extend(self.gid);
            self.publisher
                .put(payload)
                .attachment(attachment)
                .wait()
                .map_err(|e| TransportError::new(Op::Publish, e))
        }
    }

    /// rmw_zenoh's compact QoS string of a volatile keep-last publisher without deadline,
    /// lifespan or liveliness settings (the profiles pi0d uses): reliability (empty when
    /// reliable, the default; `2` for best effort), then the history depth.
    pub(crate) fn qos_code(q: &QosProfile) -> String {
        use ros2_client::qos::{History, Reliability};
        let rel = match q.reliability {
            Reliability::Reliable { .. } => "",
            Reliability::BestEffort => "2",
        };
        let (hist, depth) = match q.history {
            History::KeepLast { depth } => ("", depth),
            History::KeepAll => ("2", 0),
        };
        format!("{rel}::{hist},{depth}:,:,:,,")
    }

    /// `/a/b` -> `%a%b`, empty -> `%` (rmw_zenoh's name mangling in liveliness tokens).
    pub(crate) fn mangle(name: &str) -> String {
        if name.is_empty() {
            "%".into()
        } else {
            name.replace('/', "%")
        }
    }

    impl Zenoh {
        fn hashed_publisher(
            &mut self,
            topic: &Name,
            ty: &MessageTypeName,
            hash: &str,
            qos: &QosProfile,
        ) -> Result<HashedPublisher, RosError> {
            use ::zenoh::Wait;
            let session = self.context.session().clone();
            let domain = self.context.domain_id();
            let fqn = topic.to_string();
            let dds_type = ty.dds_msg_type();
            let key = format!("{domain}/{}/{dds_type}/{hash}", fqn.trim_matches('/'));
            let publisher = session
                .declare_publisher(key)
                .wait()
                .map_err(|e| create_err(format!("publisher `{topic}`"), e))?;
            self.next_entity += 1;
            // The node is the context's first (id 0): its own token says so.
            let token_key = format!(
                "@ros2_lv/{domain}/{zid}/0/{eid}/MP/%/{ns}/{node}/{name}/{dds_type}/{hash}/{qos}",
                zid = session.zid(),
                eid = self.next_entity,
                ns = mangle(self.node_name.namespace()),
                node = mangle(self.node_name.base_name()),
                name = mangle(&fqn),
                qos = qos_code(qos),
            );
            let token = session
                .liveliness()
                .declare_token(token_key)
                .wait()
                .map_err(|e| create_err(format!("liveliness of `{topic}`"), e))?;
            let mut gid = [0u8; 16];
            let digest = {
                use sha2::Digest;
                sha2::Sha256::digest(format!("{}/{}", session.zid(), self.next_entity))
            };
            gid.copy_from_slice(&digest[..16]);
            Ok(HashedPublisher {
                publisher,
                gid,
                seq: std::sync::atomic::AtomicI64::new(0),
                _token: token,
            })
        }
    }

    impl Middleware for Zenoh {
        fn subscribe<M: Msg>(
            &mut self,
            topic: &Name,
            ty: MessageTypeName,
            qos: &QosProfile,
        ) -> Result<Box<dyn Take<M>>, RosError> {
            let t = self.node.create_topic(topic, ty, qos);
            let s = self
                .node
                .create_subscription::<M>(&t, Some(qos.clone()))
                .map_err(|e| create_err(format!("subscription `{topic}`"), e))?;
            Ok(Box::new(s))
        }

        fn advertise<M: Msg>(
            &mut self,
            topic: &Name,
            ty: MessageTypeName,
            qos: &QosProfile,
        ) -> Result<Box<dyn Put<M>>, RosError> {
            let ros_type = format!("{}/msg/{}", ty.package_name(), ty.type_name());
            if let Some(hash) = crate::io::ros::type_hash::type_hash(&ros_type) {
                return Ok(Box::new(self.hashed_publisher(topic, &ty, hash, qos)?));
            }
            let t = self.node.create_topic(topic, ty, qos);
            let p = self
                .node
                .create_publisher::<M>(&t, None)
                .map_err(|e| create_err(format!("publisher `{topic}`"), e))?;
            Ok(Box::new(p))
        }

        fn serve<Req: SrvMsg, Resp: SrvMsg>(
            &mut self,
            service: &Name,
            ty: ServiceTypeName,
            _qos: &QosProfile,
        ) -> Result<Box<dyn Serve<Req, Resp>>, RosError> {
            let s = self
                .node
                .create_server::<Req, Resp>(service, &ty)
                .map_err(|e| create_err(format!("service `{service}`"), e))?;
            Ok(Box::new(s))
        }

        /// Not over Zenoh: rmw_zenoh matches a service's type hash exactly, and ros2-client's
        /// Zenoh client only calls blocking (the configuration refuses it first).
        fn action_client<G: SrvMsg, R: SrvMsg, F: SrvMsg>(
            &mut self,
            action: &Name,
            _ty: ActionTypeName,
            _qos: &QosProfile,
        ) -> Result<Box<dyn SendGoal<G>>, RosError> {
            Err(RosError::ActionOverZenoh {
                action: action.to_string(),
            })
        }
    }
}

//! The middleware under the ROS thread: DDS (always) or Zenoh as rmw_zenoh does (feature
//! `zenoh`, `transport/zenoh.rs`). Both build on ros2-client with different entity types; the
//! thread sees them through four small traits (take, put, serve, send goals), so its logic
//! (draining, decoding, publishing at the control rate) is one.

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
pub(crate) mod zenoh;

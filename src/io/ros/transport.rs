//! The middleware under the ROS thread: DDS (always) or Zenoh as rmw_zenoh does (feature
//! `zenoh`). Both come from ros2-client with different entity types; the thread sees them through
//! three small traits, so its logic (draining, decoding, publishing at the control rate) is one.

use ros2_client::{MessageTypeName, Name, QosProfile, RmwRequestId, ServiceTypeName};
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::{create_err, RosError};

/// What every message type is (all of `msgs` are).
pub trait Msg:
    Serialize + DeserializeOwned + Clone + std::fmt::Debug + Send + Sync + 'static
{
}
impl<T: Serialize + DeserializeOwned + Clone + std::fmt::Debug + Send + Sync + 'static> Msg for T {}

/// A service's request or response type.
pub trait SrvMsg: Msg + ros2_client::Message {}
impl<T: Msg + ros2_client::Message> SrvMsg for T {}

/// A subscription: the next waiting sample, if any.
pub trait Take<M>: Send {
    fn take_next(&self) -> Result<Option<M>, String>;
}

/// A publisher.
pub trait Put<M>: Send {
    fn put(&self, msg: M) -> Result<(), String>;
}

/// A service server: the next waiting request's id, and the reply to it.
pub trait Serve<Req, Resp>: Send {
    fn next_request(&self) -> Result<Option<RmwRequestId>, String>;
    fn reply(&self, id: RmwRequestId, resp: Resp) -> Result<(), String>;
}

/// Makes entities on one node.
pub trait Middleware {
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
}

pub mod dds {
    use super::*;
    use ros2_client::dds::{Node, Publisher, Server, ServiceMapping, Subscription};

    impl<M: Msg> Take<M> for Subscription<M> {
        fn take_next(&self) -> Result<Option<M>, String> {
            self.take()
                .map(|o| o.map(|(m, _)| m))
                .map_err(|e| format!("{e:?}"))
        }
    }

    impl<M: Msg> Put<M> for Publisher<M> {
        fn put(&self, msg: M) -> Result<(), String> {
            self.publish(msg).map_err(|e| format!("{e:?}"))
        }
    }

    /// A DDS node and how its services lay requests on the wire.
    pub struct Dds {
        pub node: Node,
        pub mapping: ServiceMapping,
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
    }

    impl<Req: SrvMsg, Resp: SrvMsg> Serve<Req, Resp> for Server<Req, Resp> {
        fn next_request(&self) -> Result<Option<RmwRequestId>, String> {
            self.receive_request()
                .map(|o| o.map(|(id, _)| id))
                .map_err(|e| format!("{e:?}"))
        }

        fn reply(&self, id: RmwRequestId, resp: Resp) -> Result<(), String> {
            self.send_response(id, resp).map_err(|e| format!("{e:?}"))
        }
    }
}

#[cfg(feature = "zenoh")]
pub mod zenoh {
    use super::*;
    use ros2_client::zenoh::{Node, Publisher, Server, Subscription};

    impl<M: Msg> Take<M> for Subscription<M> {
        fn take_next(&self) -> Result<Option<M>, String> {
            self.try_take()
                .map(|o| o.map(|(m, _)| m))
                .map_err(|e| format!("{e:?}"))
        }
    }

    impl<M: Msg> Put<M> for Publisher<M> {
        fn put(&self, msg: M) -> Result<(), String> {
            self.publish(msg).map_err(|e| format!("{e:?}"))
        }
    }

    impl<Req: SrvMsg, Resp: SrvMsg> Serve<Req, Resp> for Server<Req, Resp> {
        fn next_request(&self) -> Result<Option<RmwRequestId>, String> {
            self.try_receive_request()
                .map(|o| o.map(|(id, _)| id))
                .map_err(|e| format!("{e:?}"))
        }

        fn reply(&self, id: RmwRequestId, resp: Resp) -> Result<(), String> {
            self.send_response(id, resp).map_err(|e| format!("{e:?}"))
        }
    }

    pub struct Zenoh {
        pub node: Node,
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
    }
}

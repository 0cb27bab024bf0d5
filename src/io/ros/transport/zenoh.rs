//! rmw_zenoh's wire format on ros2-client's Zenoh session: subscriptions and the reset service
//! through ros2-client; publishers and action goals written here, their keys and liveliness
//! tokens carrying the types' real REP-2016 hashes (rmw_zenoh matches them exactly).

use std::sync::{Arc, Mutex};

use ros2_client::action::{GoalId, SendGoalRequest, SendGoalResponse};

use super::*;
use ros2_client::zenoh::{Node, Publisher, Subscription};

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

pub(crate) struct Zenoh {
    pub(crate) node: Node,
    pub(crate) context: ros2_client::zenoh::Context,
    pub(crate) node_name: ros2_client::NodeName,
    /// Entity ids for pi0d's own publishers, far above the node's own counter.
    pub(crate) next_entity: u64,
    /// REP-2016 hashes in keys and tokens (rmw_zenoh on Jazzy and newer), or
    /// `TypeHashNotSupported` (rmw_zenoh on Humble).
    pub(crate) type_hashes: bool,
}

/// What rmw_zenoh on Humble writes where later releases put a type's hash.
const NO_TYPE_HASH: &str = "TypeHashNotSupported";

/// CDR little-endian encapsulation header, as rmw_zenoh prefixes every payload.
const CDR_LE: [u8; 4] = [0x00, 0x01, 0x00, 0x00];

/// A publisher whose key and liveliness token carry the type's real REP-2016 hash (or Humble's
/// `TypeHashNotSupported`), so rmw_zenoh subscribers (which match it exactly) receive it.
/// ros2-client's own publishers put a placeholder there for types it does not know.
struct HashedPublisher {
    publisher: ::zenoh::pubsub::Publisher<'static>,
    gid: [u8; 16],
    seq: std::sync::atomic::AtomicI64,
    _token: ::zenoh::liveliness::LivelinessToken,
}

impl<M: Msg> Put<M> for HashedPublisher {
    fn put(&self, msg: M) -> Result<(), TransportError> {
        use ::zenoh::Wait;
        let payload = cdr_payload(&msg)?;
        let seq = self.seq.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
        self.publisher
            .put(payload)
            .attachment(attachment(seq, &self.gid))
            .wait()
            .map_err(|e| TransportError::new(Op::Publish, e))
    }
}

/// rmw_zenoh's attachment of a sample or a request: sequence number, source timestamp (ns),
/// the sender's GID (length-prefixed).
fn attachment(seq: i64, gid: &[u8; 16]) -> Vec<u8> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i64);
    let mut a = Vec::with_capacity(33);
    a.extend(seq.to_le_bytes());
    a.extend(now.to_le_bytes());
    a.push(16);
    a.extend(gid);
    a
}

/// `msg` in CDR (little endian) behind its encapsulation header, as rmw_zenoh's payloads.
fn cdr_payload<T: serde::Serialize>(msg: &T) -> Result<Vec<u8>, TransportError> {
    let mut payload = CDR_LE.to_vec();
    payload.extend(
        cdr_encoding::to_vec::<T, byteorder::LittleEndian>(msg)
            .map_err(TransportError::of(Op::Encode))?,
    );
    Ok(payload)
}

/// The message in an rmw_zenoh payload (`cdr_payload`'s layout), if it is one.
fn from_cdr_payload<T: serde::de::DeserializeOwned>(payload: &[u8]) -> Option<T> {
    let body = payload.get(CDR_LE.len()..)?;
    cdr_encoding::from_bytes::<T, byteorder::LittleEndian>(body)
        .ok()
        .map(|(m, _)| m)
}

/// The sequence number and GID of an rmw_zenoh attachment (`attachment`'s layout).
fn parse_attachment(a: &[u8]) -> Option<(i64, [u8; 16])> {
    if a.len() != 33 || a[16] != 16 {
        return None;
    }
    let seq = i64::from_le_bytes(a[..8].try_into().ok()?);
    Some((seq, a[17..].try_into().ok()?))
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

/// The kinds of entity pi0d declares itself (ros2-client declares its subscriptions and
/// services).
#[derive(Clone, Copy)]
enum Entity {
    Publisher,
    Client,
    Server,
}

impl Entity {
    /// rmw_zenoh's code for the kind in liveliness tokens.
    fn code(self) -> &'static str {
        match self {
            Entity::Publisher => "MP",
            Entity::Client => "SC",
            Entity::Server => "SS",
        }
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
        let fqn = topic.to_string();
        let dds_type = ty.dds_msg_type();
        let publisher = self
            .context
            .session()
            .declare_publisher(self.data_key(&fqn, &dds_type, hash))
            .wait()
            .map_err(|e| create_err(format!("publisher `{topic}`"), e))?;
        let (token, gid) = self.entity(Entity::Publisher, &fqn, &dds_type, hash, qos)?;
        Ok(HashedPublisher {
            publisher,
            gid,
            seq: std::sync::atomic::AtomicI64::new(0),
            _token: token,
        })
    }

    /// A liveliness token for one of pi0d's entities named `name`, of `dds_type` with `hash`,
    /// as rmw_zenoh's graph cache reads them; and the entity's GID, for its attachments.
    fn entity(
        &mut self,
        kind: Entity,
        name: &str,
        dds_type: &str,
        hash: &str,
        qos: &QosProfile,
    ) -> Result<(::zenoh::liveliness::LivelinessToken, [u8; 16]), RosError> {
        use ::zenoh::Wait;
        let session = self.context.session();
        self.next_entity += 1;
        // The node is the context's first (id 0): its own token says so.
        let token_key = format!(
            "@ros2_lv/{domain}/{zid}/0/{eid}/{kind}/%/{ns}/{node}/{name}/{dds_type}/{hash}/{qos}",
            kind = kind.code(),
            domain = self.context.domain_id(),
            zid = session.zid(),
            eid = self.next_entity,
            ns = mangle(self.node_name.namespace()),
            node = mangle(self.node_name.base_name()),
            name = mangle(name),
            qos = qos_code(qos),
        );
        let token = session
            .liveliness()
            .declare_token(token_key)
            .wait()
            .map_err(|e| create_err(format!("liveliness of `{name}`"), e))?;
        let mut gid = [0u8; 16];
        let digest = {
            use sha2::Digest;
            sha2::Sha256::digest(format!("{}/{}", session.zid(), self.next_entity))
        };
        gid.copy_from_slice(&digest[..16]);
        Ok((token, gid))
    }

    /// rmw_zenoh's key of a topic or service `name` (fully qualified) of `dds_type`:
    /// `<domain>/<name>/<dds_type>/<hash>`.
    fn data_key(&self, name: &str, dds_type: &str, hash: &str) -> String {
        let domain = self.context.domain_id();
        format!("{domain}/{}/{dds_type}/{hash}", name.trim_matches('/'))
    }

    /// What goes in the hash slot of `ros_type`'s keys: its REP-2016 hash, or Humble's
    /// placeholder.
    fn hash_of(&self, ros_type: &str) -> Result<&'static str, String> {
        if !self.type_hashes {
            return Ok(NO_TYPE_HASH);
        }
        crate::io::ros::type_hash::type_hash(ros_type)
            .ok_or_else(|| format!("no REP-2016 hash known for {ros_type}"))
    }

    /// Goals for `action` sent as an rmw_zenoh action client sends them: a query on its
    /// send_goal service's key (`<domain>/<action>/_action/send_goal/<pkg>::action::dds_::
    /// <Name>_SendGoal_/<hash>`; every complete queryable, no consolidation) with the request
    /// in CDR and a client request's attachment.
    fn goals(
        &mut self,
        action: &Name,
        ty: &ActionTypeName,
        qos: &QosProfile,
    ) -> Result<ZenohGoals, RosError> {
        use ::zenoh::Wait;
        let what = || format!("action client `{action}`");
        let ros_type = format!("{}/action/{}_SendGoal", ty.package_name(), ty.type_name());
        let hash = self.hash_of(&ros_type).map_err(|e| create_err(what(), e))?;
        let service = format!("{action}/_action/send_goal");
        let dds_type = format!(
            "{}::action::dds_::{}_SendGoal_",
            ty.package_name(),
            ty.type_name()
        );
        let querier = self
            .context
            .session()
            .declare_querier(self.data_key(&service, &dds_type, hash))
            .target(::zenoh::query::QueryTarget::AllComplete)
            .consolidation(::zenoh::query::ConsolidationMode::None)
            .timeout(GOAL_REPLY_TIMEOUT)
            .wait()
            .map_err(|e| create_err(what(), e))?;
        let (token, gid) = self.entity(Entity::Client, &service, &dds_type, hash, qos)?;
        Ok(ZenohGoals {
            querier,
            gid,
            seq: 0,
            answers: Arc::default(),
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
        if let Ok(hash) = self.hash_of(&ros_type) {
            return Ok(Box::new(self.hashed_publisher(topic, &ty, hash, qos)?));
        }
        // A type without a known hash: ros2-client's publisher, with its placeholder.
        let t = self.node.create_topic(topic, ty, qos);
        let p = self
            .node
            .create_publisher::<M>(&t, None)
            .map_err(|e| create_err(format!("publisher `{topic}`"), e))?;
        Ok(Box::new(p))
    }

    /// A complete queryable on the service's key with its real type hash (rmw_zenoh's
    /// clients query that key exactly; ros2-client's own server puts a placeholder there for
    /// types it does not know, std_srvs/Trigger among them), as rmw_zenoh's ServiceData.
    fn serve<Req: SrvMsg, Resp: SrvMsg>(
        &mut self,
        service: &Name,
        ty: ServiceTypeName,
        qos: &QosProfile,
    ) -> Result<Box<dyn Serve<Req, Resp>>, RosError> {
        use ::zenoh::Wait;
        let what = || format!("service `{service}`");
        let ros_type = format!("{}/srv/{}", ty.package_name(), ty.type_name());
        let hash = self.hash_of(&ros_type).map_err(|e| create_err(what(), e))?;
        let fqn = service.to_string();
        let dds_type = format!("{}::srv::dds_::{}_", ty.package_name(), ty.type_name());
        let key = self.data_key(&fqn, &dds_type, hash);
        let queryable = self
            .context
            .session()
            .declare_queryable(key.clone())
            .complete(true)
            .wait()
            .map_err(|e| create_err(what(), e))?;
        let (token, _) = self.entity(Entity::Server, &fqn, &dds_type, hash, qos)?;
        Ok(Box::new(HashedServer::<Req> {
            queryable,
            key,
            pending: Mutex::default(),
            _token: token,
            _request: std::marker::PhantomData,
        }))
    }

    fn action_client<G: SrvMsg, R: SrvMsg, F: SrvMsg>(
        &mut self,
        action: &Name,
        ty: ActionTypeName,
        qos: &QosProfile,
    ) -> Result<Box<dyn SendGoal<G>>, RosError> {
        Ok(Box::new(self.goals(action, &ty, qos)?))
    }
}

/// How long a goal's query waits for the server's reply. An unanswered goal is sent again by
/// its sender (`GripperGoals`), so queries do not pile up behind a silent server.
const GOAL_REPLY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// The send_goal replies, counted as they arrive (on Zenoh's threads).
#[derive(Default)]
struct Answers {
    accepted: u64,
    refused: u64,
    /// The size of a reply that is not a send_goal response, said by the next `replies`.
    undecodable: Option<usize>,
}

/// Goals sent as queries; the queries' callbacks count the replies.
struct ZenohGoals {
    querier: ::zenoh::query::Querier<'static>,
    gid: [u8; 16],
    seq: i64,
    answers: Arc<Mutex<Answers>>,
    _token: ::zenoh::liveliness::LivelinessToken,
}

impl ZenohGoals {
    fn answer(answers: &Mutex<Answers>, reply: &::zenoh::query::Reply) {
        // An error reply (the query's timeout: rmw_zenoh's servers send no other) leaves the
        // goal unanswered, which its sender handles.
        let Ok(sample) = reply.result() else {
            return;
        };
        let bytes = sample.payload().to_bytes();
        let response = from_cdr_payload::<SendGoalResponse>(&bytes);
        let mut a = answers.lock().unwrap_or_else(|e| e.into_inner());
        match response {
            Some(r) if r.accepted => a.accepted += 1,
            Some(_) => a.refused += 1,
            None => a.undecodable = Some(bytes.len()),
        }
    }
}

impl<G: SrvMsg> SendGoal<G> for ZenohGoals {
    fn send(&mut self, goal: G) -> Result<(), TransportError> {
        use ::zenoh::Wait;
        let request = SendGoalRequest {
            goal_id: GoalId::new_random(),
            goal,
        };
        let payload = cdr_payload(&request)?;
        self.seq += 1;
        let answers = self.answers.clone();
        self.querier
            .get()
            .payload(payload)
            .attachment(attachment(self.seq, &self.gid))
            .callback(move |reply| ZenohGoals::answer(&answers, &reply))
            .wait()
            .map_err(|e| TransportError::new(Op::SendGoal, e))
    }

    fn replies(&mut self) -> Result<(u64, u64), TransportError> {
        let mut a = self.answers.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(len) = a.undecodable.take() {
            return Err(TransportError::new(
                Op::ReceiveGoalReply,
                format!(
                    "a reply of {len} bytes is not a send_goal response (CDR: bool accepted, builtin_interfaces/Time stamp)"
                ),
            ));
        }
        Ok((
            std::mem::take(&mut a.accepted),
            std::mem::take(&mut a.refused),
        ))
    }
}

/// A service server: requests are the queryable's queries, answered by `reply` with the
/// response in CDR and rmw_zenoh's reply attachment (the request's sequence number, the
/// client's GID).
struct HashedServer<Req> {
    queryable:
        ::zenoh::query::Queryable<::zenoh::handlers::FifoChannelHandler<::zenoh::query::Query>>,
    key: String,
    /// Requests taken and not answered yet, by the id `next_request` gave them.
    pending: Mutex<Vec<(RmwRequestId, ::zenoh::query::Query)>>,
    _token: ::zenoh::liveliness::LivelinessToken,
    _request: std::marker::PhantomData<fn() -> Req>,
}

/// Requests taken and never answered beyond this many are forgotten (their clients time out).
const MAX_PENDING_REQUESTS: usize = 64;

impl<Req: SrvMsg, Resp: SrvMsg> Serve<Req, Resp> for HashedServer<Req> {
    /// The next request, checked as rmw_zenoh's take_request checks it: an attachment with a
    /// sequence number and the client's GID, a payload that decodes as `Req`.
    fn next_request(&self) -> Result<Option<RmwRequestId>, TransportError> {
        let Ok(Some(query)) = self.queryable.try_recv() else {
            return Ok(None);
        };
        let bad = |what: String| Err(TransportError::new(Op::ReceiveRequest, what));
        let attachment = query.attachment().map(|a| a.to_bytes().to_vec());
        let id = match attachment.as_deref().map(parse_attachment) {
            Some(Some((sequence_number, gid))) => RmwRequestId {
                writer_gid: gid.into(),
                sequence_number,
            },
            Some(None) => {
                return bad(format!(
                    "an attachment of {} bytes, not rmw_zenoh's 33 (sequence number, timestamp, client GID)",
                    attachment.map_or(0, |a| a.len())
                ))
            }
            None => {
                return bad(
                    "no attachment (rmw_zenoh's clients send their sequence number and GID in it)"
                        .into(),
                )
            }
        };
        let payload = query
            .payload()
            .map(|p| p.to_bytes().to_vec())
            .unwrap_or_default();
        if from_cdr_payload::<Req>(&payload).is_none() {
            return bad(format!(
                "a payload of {} bytes that is not the service's request (CDR)",
                payload.len()
            ));
        }
        let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        if pending.len() == MAX_PENDING_REQUESTS {
            pending.remove(0);
        }
        pending.push((id, query));
        Ok(Some(id))
    }

    fn reply(&self, id: RmwRequestId, resp: Resp) -> Result<(), TransportError> {
        use ::zenoh::Wait;
        let query = {
            let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
            match pending.iter().position(|(p, _)| *p == id) {
                Some(i) => pending.swap_remove(i).1,
                None => {
                    return Err(TransportError::new(
                        Op::Reply,
                        "no request with this id is waiting",
                    ))
                }
            }
        };
        let payload = cdr_payload(&resp)?;
        query
            .reply(self.key.as_str(), payload)
            .attachment(attachment(id.sequence_number, &id.writer_gid.to_bytes16()))
            .wait()
            .map_err(|e| TransportError::new(Op::Reply, e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn when_an_attachment_is_written_expect_it_read_back_and_other_layouts_refused() {
        let gid: [u8; 16] = std::array::from_fn(|i| i as u8 + 1);
        let a = attachment(42, &gid);
        assert_eq!(a.len(), 33);
        assert_eq!(parse_attachment(&a), Some((42, gid)));
        assert_eq!(parse_attachment(&a[..32]), None);
        let mut wrong_prefix = a.clone();
        wrong_prefix[16] = 15;
        assert_eq!(parse_attachment(&wrong_prefix), None);
    }

    #[test]
    fn when_a_payload_is_written_expect_it_read_back_and_a_cut_one_refused() {
        let resp = SendGoalResponse {
            accepted: true,
            stamp: ros2_client::builtin_interfaces::Time::new(7, 9),
        };
        let p = cdr_payload(&resp).unwrap();
        assert_eq!(p[..4], CDR_LE);
        let back = from_cdr_payload::<SendGoalResponse>(&p).unwrap();
        assert!(back.accepted);
        assert_eq!(back.stamp.to_nanos(), 7_000_000_009);
        assert!(from_cdr_payload::<SendGoalResponse>(&p[..3]).is_none());
        assert!(from_cdr_payload::<SendGoalResponse>(&p[..6]).is_none());
    }
}

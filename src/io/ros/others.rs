//! Someone else on pi0d's own names: another publisher on a command topic pi0d publishes (a
//! second source of commands the controller would mix with pi0d's), and, over Zenoh, another
//! node with pi0d's fully-qualified name (a second pi0d, or a peer posing as it). Found in the
//! middleware's discovery; the ROS thread warns about them (rate-limited) and counts them in
//! the diagnostics.

/// What discovery shows of others on pi0d's names.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Others {
    /// Publishers of other participants (sessions) on pi0d's command topics.
    pub(crate) command_publishers: u64,
    /// Other nodes with pi0d's fully-qualified name (Zenoh; DDS: not looked for).
    pub(crate) namesakes: u64,
}

pub(crate) type OthersProbe = Box<dyn Fn() -> Others + Send>;

/// DDS: other participants' writers on `rt<topic>` for each of pi0d's command topics.
pub(super) fn dds(context: ros2_client::dds::Context, commands: Vec<String>) -> OthersProbe {
    let wanted: Vec<String> = commands.iter().map(|t| format!("rt{t}")).collect();
    Box::new(move || {
        use ros2_client::dds::rustdds::RTPSEntity;
        let dp = context.domain_participant();
        let own = dp.guid().prefix;
        let command_publishers = dp
            .discovered_writers()
            .iter()
            .map(|w| &w.publication_topic_data)
            .filter(|t| t.key.prefix != own && wanted.contains(&t.topic_name))
            .count() as u64;
        Others {
            command_publishers,
            namesakes: 0,
        }
    })
}

/// rmw_zenoh's name mangling in liveliness tokens: `/` becomes `%`.
#[cfg(any(test, feature = "zenoh"))]
fn mangle(name: &str) -> String {
    name.replace('/', "%")
}

/// Liveliness tokens kept at most (a peer declaring thousands must not grow pi0d's memory).
#[cfg(feature = "zenoh")]
const MAX_TOKENS: usize = 4096;

/// What `tokens` (rmw_zenoh liveliness keys, `@ros2_lv/<domain>/<zid>/<nid>/<eid>/<kind>/
/// <enclave>/<namespace>/<node>[/<topic>/...]`) show of others: tokens of sessions other than
/// `own_zid`, naming pi0d's node (`namespace`, `node`) or publishing (`MP`) on a command topic.
#[cfg(any(test, feature = "zenoh"))]
pub(crate) fn judge<'a>(
    tokens: impl Iterator<Item = &'a str>,
    own_zid: &str,
    namespace: &str,
    node: &str,
    commands: &[String],
) -> Others {
    let (ns, node) = (mangle(namespace), mangle(node));
    let topics: Vec<String> = commands.iter().map(|t| mangle(t)).collect();
    let mut others = Others::default();
    for key in tokens {
        let parts: Vec<&str> = key.split('/').collect();
        if parts.len() < 9 || parts[0] != "@ros2_lv" || parts[2] == own_zid {
            continue;
        }
        match parts[5] {
            "NN" if parts[7] == ns && parts[8] == node => others.namesakes += 1,
            "MP" if parts.len() > 9 && topics.iter().any(|t| t == parts[9]) => {
                others.command_publishers += 1
            }
            _ => {}
        }
    }
    others
}

/// Zenoh: the liveliness tokens of the domain, as rmw_zenoh nodes declare them, judged by
/// `judge`.
#[cfg(feature = "zenoh")]
pub(super) fn zenoh(
    context: &ros2_client::zenoh::Context,
    domain: u16,
    namespace: String,
    node: String,
    commands: Vec<String>,
) -> Result<OthersProbe, ::zenoh::Error> {
    use ::zenoh::sample::SampleKind;
    use ::zenoh::Wait;
    use std::collections::BTreeSet;
    use std::sync::{Arc, Mutex};
    let session = context.session();
    let own = session.zid().to_string();
    let tokens = Arc::new(Mutex::new(BTreeSet::<String>::new()));
    let sink = tokens.clone();
    let subscriber = session
        .liveliness()
        .declare_subscriber(format!("@ros2_lv/{domain}/**"))
        .history(true)
        .callback(move |sample| {
            let key = sample.key_expr().as_str().to_string();
            if let Ok(mut t) = sink.lock() {
                match sample.kind() {
                    SampleKind::Put if t.len() < MAX_TOKENS => {
                        t.insert(key);
                    }
                    SampleKind::Put => {}
                    SampleKind::Delete => {
                        t.remove(&key);
                    }
                }
            }
        })
        .wait()?;
    Ok(Box::new(move || {
        let _subscription = &subscriber;
        tokens
            .lock()
            .map(|t| {
                judge(
                    t.iter().map(String::as_str),
                    &own,
                    &namespace,
                    &node,
                    &commands,
                )
            })
            .unwrap_or_default()
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn when_tokens_name_pi0d_or_publish_on_its_commands_expect_others_counted_but_never_itself() {
        let commands = vec!["/arm_controller/joint_trajectory".to_string()];
        let tokens = [
            // pi0d's own node and command publisher (its own session).
            "@ros2_lv/0/aaa/0/0/NN/%/%/pi0d",
            "@ros2_lv/0/aaa/0/9/MP/%/%/pi0d/%arm_controller%joint_trajectory/trajectory_msgs::msg::dds_::JointTrajectory_/RIHS01_x/qos",
            // A namesake and an impostor publisher in another session.
            "@ros2_lv/0/bbb/0/0/NN/%/%/pi0d",
            "@ros2_lv/0/bbb/0/3/MP/%/%/teleop/%arm_controller%joint_trajectory/trajectory_msgs::msg::dds_::JointTrajectory_/RIHS01_x/qos",
            // A subscriber on the command topic (the controller) and other nodes: fine.
            "@ros2_lv/0/ccc/0/4/MS/%/%/controller/%arm_controller%joint_trajectory/t/h/q",
            "@ros2_lv/0/ccc/0/0/NN/%/%/controller",
            "@ros2_lv/0/ddd/0/0/NN/%/%robot/pi0d",
            "garbage",
        ];
        let o = judge(tokens.into_iter(), "aaa", "/", "pi0d", &commands);
        assert_eq!(
            o,
            Others {
                command_publishers: 1,
                namesakes: 1
            }
        );
        let o = judge(tokens.into_iter(), "aaa", "/robot", "pi0d", &commands);
        assert_eq!(o.namesakes, 1, "the node in /robot");
    }
}

//! A Redis Cluster's topology as the store routes by it: which node serves each of the 16 384
//! slots, read from `CLUSTER SLOTS`, and one [`Node`] (connection and breaker) per server.
//!
//! Calls read the topology from one pointer, never waiting on its upkeep; the store's upkeep
//! task replaces it whole when the cluster's answer changes. A node that fails affects only the
//! slots it serves: the others' calls go to their own nodes, through their own breakers.

use alloc::string::String;
use alloc::sync::Arc;
use alloc::vec::Vec;
use std::collections::HashMap;

use redis::AsyncConnectionConfig;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{ConnectionInfo, RedisResult, Value};

use super::RedisOptions;
use super::access;
use super::node::Node;

/// Slots in a cluster.
pub(crate) const SLOTS: usize = 16_384;

/// The slot of `key`: CRC16 of its hash tag (the text between the first `{` and the next `}`,
/// when not empty), or of the whole key without one.
pub(crate) fn slot_of(key: &str) -> usize {
    let key = key.as_bytes();
    let tag = key.iter().position(|&b| b == b'{').and_then(|open| {
        let rest = &key[open + 1..];
        let close = rest.iter().position(|&b| b == b'}')?;
        (close > 0).then(|| &rest[..close])
    });
    usize::from(crc16::State::<crc16::XMODEM>::calculate(tag.unwrap_or(key))) % SLOTS
}

/// Which node serves each slot, and every node the cluster named (masters and replicas).
pub(crate) struct Topology {
    /// Per slot, an index into `masters`; `NONE` where no node serves it.
    owner: Vec<u16>,
    masters: Vec<Arc<Node>>,
    /// Every node named, by `host:port`.
    pub(crate) nodes: HashMap<String, Arc<Node>>,
    /// The answer it was built from, to tell a change.
    ranges: Vec<Range>,
}

const NONE: u16 = u16::MAX;

/// A range of slots and the `host:port` of the master that serves it.
pub(crate) type Range = (u16, u16, String);

/// A `CLUSTER SLOTS` answer, read: its ranges, and every node it names.
pub(crate) type Slots = (Vec<Range>, Vec<String>);

impl Topology {
    /// The node that serves `slot`, if one does.
    pub(crate) fn owner(&self, slot: usize) -> Option<&Arc<Node>> {
        let i = *self.owner.get(slot)?;
        self.masters.get(usize::from(i))
    }

    /// Whether `ranges` (a `CLUSTER SLOTS` answer, read) is what this topology was built from.
    pub(crate) fn is(&self, ranges: &[Range]) -> bool {
        self.ranges == ranges
    }

    /// Whether every slot is served.
    pub(crate) fn covers_all(&self) -> bool {
        self.owner.iter().all(|&i| i != NONE)
    }
}

/// The topology of `ranges` (slot ranges and their masters), every node of `named` (masters
/// and replicas), each node reused from `known` where it is there already, made otherwise. A
/// node that cannot be made is left out, and so are the slots it would serve (calls to them
/// fail, and the upkeep, finding slots unserved, tries again soon).
pub(crate) async fn build(
    ranges: Vec<Range>,
    named: &[String],
    known: &HashMap<String, Arc<Node>>,
    seed: &ConnectionInfo,
    options: &RedisOptions,
) -> Topology {
    let mut nodes: HashMap<String, Arc<Node>> = HashMap::new();
    for addr in named.iter().chain(ranges.iter().map(|r| &r.2)) {
        if nodes.contains_key(addr) {
            continue;
        }
        let node = match known.get(addr) {
            Some(node) => node.clone(),
            None => match node_at(addr, seed, options).await {
                Ok(node) => Arc::new(node),
                Err(_) => continue,
            },
        };
        nodes.insert(addr.clone(), node);
    }
    let mut masters: Vec<Arc<Node>> = Vec::new();
    let mut owner = alloc::vec![NONE; SLOTS];
    for (start, end, addr) in &ranges {
        let i = match masters.iter().position(|m| &m.addr == addr) {
            Some(i) => i,
            None => {
                let Some(node) = nodes.get(addr) else {
                    continue;
                };
                masters.push(node.clone());
                masters.len() - 1
            }
        };
        let end = usize::from(*end).min(SLOTS - 1);
        if let Some(range) = owner.get_mut(usize::from(*start)..=end) {
            range.fill(i as u16);
        }
    }
    Topology {
        owner,
        masters,
        nodes,
        ranges,
    }
}

/// A client for the node at `addr` (`host:port`), reached as the seed is (TLS or not) with the
/// store's credentials and TLS options.
fn client_at(
    addr: &str,
    seed: &ConnectionInfo,
    options: &RedisOptions,
) -> RedisResult<redis::Client> {
    let (host, port) = split(addr);
    options.access.client(
        seed.clone()
            .set_addr(access::same_kind(seed.addr(), host, port)),
    )
}

/// A node at `addr`, connected now within the connection timeout, or connecting on first use.
pub(crate) async fn node_at(
    addr: &str,
    seed: &ConnectionInfo,
    options: &RedisOptions,
) -> RedisResult<Node> {
    let connection = connection(client_at(addr, seed, options)?, options).await?;
    Ok(Node::new(addr.into(), connection, options))
}

/// A node made now without I/O (it connects on first use): for a redirection to a node the
/// topology does not know yet.
pub(crate) fn lazy_node_at(
    addr: &str,
    seed: &ConnectionInfo,
    options: &RedisOptions,
) -> RedisResult<Node> {
    let connection = lazy(client_at(addr, seed, options)?, options)?;
    Ok(Node::new(addr.into(), connection, options))
}

fn split(addr: &str) -> (&str, u16) {
    match addr.rsplit_once(':') {
        Some((host, port)) => (host, port.parse().unwrap_or(0)),
        None => (addr, 0),
    }
}

/// Small requests, each waited on: send them at once rather than coalescing them (Nagle).
pub(crate) fn tcp() -> redis::io::tcp::TcpSettings {
    redis::io::tcp::TcpSettings::default().set_nodelay(true)
}

/// How each node's connection is kept: remade in the background after an error, never a
/// command sent twice.
pub(crate) fn manager_config(options: &RedisOptions) -> ConnectionManagerConfig {
    ConnectionManagerConfig::new()
        .set_connection_timeout(Some(options.connect_timeout))
        .set_response_timeout(Some(options.deadline))
        // Reconnection attempts, not command retries (the manager never resends a command).
        .set_number_of_retries(2)
        .set_min_delay(core::time::Duration::from_millis(20))
        .set_max_delay(options.cooldown)
}

/// A connection through `client`: made now within the connection timeout, or lazily (on first
/// use, the failure policy deciding meanwhile) if the server cannot be reached now. A refusal no
/// retry can mend (a wrong password, a certificate that does not verify) is the answer.
///
/// The first attempt is one connection, unretried: the manager retries whatever fails, so a
/// refusal would cost three attempts and 60–120 ms of backoff, and on a loaded host could run
/// past the timeout and be taken for a server still coming up. The probe is then dropped: the
/// manager makes its own connection, within what is left of the timeout.
pub(crate) async fn connection(
    client: redis::Client,
    options: &RedisOptions,
) -> RedisResult<ConnectionManager> {
    let started = tokio::time::Instant::now();
    let probe_config = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(options.connect_timeout))
        .set_response_timeout(Some(options.deadline));
    let probe = client.get_multiplexed_async_connection_with_config(&probe_config);
    match tokio::time::timeout(options.connect_timeout, probe).await {
        Ok(Ok(_)) => {}
        Ok(Err(e)) if !access::may_come_up(&e) => return Err(e),
        _ => return lazy(client, options),
    }
    let left = options.connect_timeout.saturating_sub(started.elapsed());
    let eager = ConnectionManager::new_with_config(client.clone(), manager_config(options));
    match tokio::time::timeout(left, eager).await {
        Ok(Ok(manager)) => Ok(manager),
        Ok(Err(e)) if !access::may_come_up(&e) => Err(e),
        _ => lazy(client, options),
    }
}

/// A connection through `client` that connects on first use.
fn lazy(client: redis::Client, options: &RedisOptions) -> RedisResult<ConnectionManager> {
    ConnectionManager::new_lazy_with_config(client, manager_config(options))
}

/// Reads a `CLUSTER SLOTS` answer: each range with its master's `host:port`, and every node it
/// names. A node whose host is empty is on the host that answered (`asked`). `None` for a reply
/// of another shape.
pub(crate) fn parse_slots(reply: &Value, asked: &str) -> Option<Slots> {
    let Value::Array(entries) = reply else {
        return None;
    };
    let asked_host = split(asked).0;
    let mut ranges = Vec::with_capacity(entries.len());
    let mut named = Vec::new();
    for entry in entries {
        let Value::Array(fields) = entry else {
            return None;
        };
        let (Some(Value::Int(start)), Some(Value::Int(end))) = (fields.first(), fields.get(1))
        else {
            return None;
        };
        let start = u16::try_from(*start).ok()?;
        let end = u16::try_from(*end).ok()?;
        let mut addrs = fields[2..]
            .iter()
            .filter_map(|node| address(node, asked_host));
        let master = addrs.next()?;
        named.extend(addrs);
        named.push(master.clone());
        ranges.push((start, end, master));
    }
    ranges.sort();
    named.sort();
    named.dedup();
    Some((ranges, named))
}

/// `host:port` of one node of a `CLUSTER SLOTS` range (`[host, port, id, ...]`).
fn address(node: &Value, asked_host: &str) -> Option<String> {
    let Value::Array(parts) = node else {
        return None;
    };
    let host = match parts.first()? {
        Value::BulkString(b) => core::str::from_utf8(b).ok()?.to_owned(),
        Value::SimpleString(s) => s.clone(),
        _ => return None,
    };
    let Value::Int(port) = parts.get(1)? else {
        return None;
    };
    // `?` is a node whose address is unknown; empty, the node that answered.
    if host == "?" {
        return None;
    }
    let host = if host.is_empty() {
        asked_host.to_owned()
    } else {
        host
    };
    Some(format!("{host}:{port}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(host: &str, port: i64) -> Value {
        Value::Array(alloc::vec![
            Value::BulkString(host.as_bytes().to_vec()),
            Value::Int(port),
            Value::BulkString(b"id".to_vec()),
        ])
    }

    #[test]
    fn a_slots_answer_is_read_with_its_replicas() {
        let reply = Value::Array(alloc::vec![
            Value::Array(alloc::vec![
                Value::Int(5461),
                Value::Int(16383),
                node("10.0.0.2", 7001),
                node("", 7004),
            ]),
            Value::Array(alloc::vec![
                Value::Int(0),
                Value::Int(5460),
                node("10.0.0.1", 7000)
            ]),
        ]);
        let (ranges, named) = parse_slots(&reply, "127.0.0.1:7000").unwrap();
        assert_eq!(
            ranges,
            [
                (0, 5460, "10.0.0.1:7000".to_owned()),
                (5461, 16383, "10.0.0.2:7001".to_owned())
            ]
        );
        assert_eq!(named, ["10.0.0.1:7000", "10.0.0.2:7001", "127.0.0.1:7004"]);
        assert!(parse_slots(&Value::Int(3), "x:1").is_none());
        let bad = Value::Array(alloc::vec![Value::Array(alloc::vec![
            Value::Int(-1),
            Value::Int(3)
        ])]);
        assert!(parse_slots(&bad, "x:1").is_none());
    }

    #[test]
    fn a_key_s_slot_follows_its_hash_tag() {
        assert_eq!(slot_of("t:{=alice}:second"), slot_of("t:{=alice}:minute"));
        assert_eq!(slot_of("foo"), 12182);
        assert!(slot_of("") < SLOTS);
    }
}

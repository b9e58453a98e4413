//! The connection to the store: one server, or a Redis Cluster routed by this crate, one node
//! at a time. Cheap to clone (clones share every connection), so one store serves every limiter
//! of a process.
//!
//! Each server is a [`Node`] with its own multiplexed connection and its own circuit breaker: a
//! node that fails affects only the calls it would answer. A cluster's slot map is read from
//! `CLUSTER SLOTS` by the store's upkeep task, in the background, never on a call's path: every
//! second, every 100 ms while a node is failing, and at once after a failure or a `MOVED`. A
//! `MOVED` answer (the slot has a new master: a failover) proves the script did not run, so the
//! call is sent once to the node it names, within the same deadline; nothing else is ever sent
//! twice. The same task reads each server's `run_id`: a change is a restart, counted
//! ([`RedisStore::restarts`]), since a server that restarted without its data admits every
//! subject's burst again.

use alloc::boxed::Box;
use alloc::string::String;
use alloc::sync::{Arc, Weak};
use alloc::vec::Vec;
use core::time::Duration;
use std::collections::HashMap;
use std::sync::{PoisonError, RwLock};

use redis::{ConnectionInfo, IntoConnectionInfo, Value};
use tokio::sync::Notify;
use tokio::time::Instant;

use super::breaker::{Permit, ProbeGuard};
use super::cluster::{self, Topology};
use super::node::{self, Lua, Node, Outcome};
use super::sentinel::Watched;
use super::{RedisOptions, StoreError};
use crate::clock::{Clock, DefaultClock};
use crate::sync::{AtomicU64, Ordering};

/// A connection to one Redis server or to a Redis Cluster.
#[derive(Clone)]
pub struct RedisStore {
    shared: Arc<Shared>,
}

struct Shared {
    backend: Backend,
    options: RedisOptions,
    clock: DefaultClock,
    /// Wakes the upkeep task: a call failed or was redirected, or the store is gone.
    wake: Arc<Notify>,
    /// Restarts seen: a server's `run_id` changed.
    restarts: AtomicU64,
}

enum Backend {
    Single(Arc<Node>),
    /// One master at a time, as the sentinels name it.
    Sentinel(Box<Watched>),
    Cluster {
        /// The topology in force; replaced whole by the upkeep task.
        topology: RwLock<Arc<Topology>>,
        /// What a new node connects with (the first seed's credentials and settings).
        seed: Box<ConnectionInfo>,
        /// The nodes given to `connect_cluster`, asked when no known node answers.
        seeds: Vec<String>,
    },
}

impl Drop for Shared {
    fn drop(&mut self) {
        // The upkeep task holds only a weak reference: woken, it finds the store gone and ends.
        self.wake.notify_one();
    }
}

impl core::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let kind = match self.shared.backend {
            Backend::Single(_) => "single",
            Backend::Sentinel(_) => "sentinel",
            Backend::Cluster { .. } => "cluster",
        };
        f.debug_struct("RedisStore").field("kind", &kind).finish()
    }
}

/// The upkeep's pace: while every node answers, and while one is failing.
const STEADY: Duration = Duration::from_secs(1);
const TROUBLED: Duration = Duration::from_millis(100);
/// The least time between two rounds of upkeep, however often calls fail.
const SPACING: Duration = Duration::from_millis(10);

impl RedisStore {
    /// A store on one server (`redis://host:port/db`). The connection is made now, within the
    /// connection timeout; if the server cannot be reached, the store is still built and connects
    /// on first use (the limiters' failure policy decides meanwhile). After an error it is remade
    /// in the background. The breaker's settings are those of `options`: each server has its
    /// own. Must be called within a tokio runtime.
    pub async fn connect(url: &str, options: &RedisOptions) -> Result<RedisStore, StoreError> {
        let info = url.into_connection_info()?.set_tcp_settings(cluster::tcp());
        let addr = info.addr().to_string();
        let connection = cluster::connection(options.access.client(info)?, options).await?;
        let node = Arc::new(Node::new(addr, connection, options));
        Ok(RedisStore::start(Backend::Single(node), options))
    }

    /// A store on the master that Redis Sentinel names `master` (the sentinels at `sentinels`,
    /// `redis://host:port`, each URL with the sentinel's own credentials). The store connects to
    /// that master with `options`' credentials and TLS, and asks the sentinels again at every
    /// round of its upkeep (every 100 ms while the master fails), so that after a failover its
    /// calls go to the promoted replica as soon as the sentinels announce it; meanwhile the
    /// failure policy decides. Fails if no sentinel names a master that answers within the
    /// connection timeout.
    pub async fn connect_sentinel(
        sentinels: &[&str],
        master: &str,
        options: &RedisOptions,
    ) -> Result<RedisStore, StoreError> {
        let watched = Watched::find(sentinels, master, options).await?;
        Ok(RedisStore::start(
            Backend::Sentinel(Box::new(watched)),
            options,
        ))
    }

    /// A store on a Redis Cluster, found from any of its nodes (`redis://host:port`): fails if
    /// none of them answers `CLUSTER SLOTS` within the connection timeout. Each call goes to the
    /// master that serves its keys' slot, through that node's own breaker.
    pub async fn connect_cluster(
        nodes: &[&str],
        options: &RedisOptions,
    ) -> Result<RedisStore, StoreError> {
        let mut infos = Vec::with_capacity(nodes.len());
        for url in nodes {
            infos.push(url.into_connection_info()?.set_tcp_settings(cluster::tcp()));
        }
        let Some(seed) = infos.first().cloned() else {
            return Err(StoreError::Redis(no_node("no cluster node was given")));
        };
        let seeds: Vec<String> = infos.iter().map(|i| i.addr().to_string()).collect();
        let mut last = no_node("no cluster node answered CLUSTER SLOTS");
        for addr in &seeds {
            let node = match cluster::node_at(addr, &seed, options).await {
                Ok(node) => Arc::new(node),
                Err(e) => {
                    last = e;
                    continue;
                }
            };
            match ask_slots(&node, options).await {
                Ok((ranges, named)) => {
                    // The seed's connection serves on: it is not made twice.
                    let known = HashMap::from([(addr.clone(), node)]);
                    let topology = cluster::build(ranges, &named, &known, &seed, options).await;
                    let backend = Backend::Cluster {
                        topology: RwLock::new(Arc::new(topology)),
                        seed: Box::new(seed),
                        seeds,
                    };
                    return Ok(RedisStore::start(backend, options));
                }
                Err(e) => last = e,
            }
        }
        Err(StoreError::Redis(last))
    }

    fn start(backend: Backend, options: &RedisOptions) -> RedisStore {
        let shared = Arc::new(Shared {
            backend,
            options: options.clone(),
            clock: DefaultClock::default(),
            wake: Arc::new(Notify::new()),
            restarts: AtomicU64::new(0),
        });
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(upkeep(Arc::downgrade(&shared), shared.wake.clone()));
        }
        RedisStore { shared }
    }

    /// Whether this is a Redis Cluster, where keys of different subjects lie in different slots.
    #[cfg(any(feature = "tower", feature = "rls"))]
    pub(crate) fn is_cluster(&self) -> bool {
        matches!(self.shared.backend, Backend::Cluster { .. })
    }

    /// Restarts seen so far: times a server answered with another `run_id` than before. A
    /// server that restarted without persistence lost every subject's state, so each subject
    /// may be admitted its burst once more (see `docs/design.md`). Also counted in
    /// `atomic_limiter_store_restarts_total` where the options carry counters.
    pub fn restarts(&self) -> u64 {
        // Relaxed: a statistic.
        self.shared.restarts.load(Ordering::Relaxed)
    }

    /// Runs `lua` on `keys` (all in one slot) with `args`, on the node that serves them, through
    /// its breaker, until `deadline`.
    pub(crate) async fn invoke(
        &self,
        lua: &Lua,
        keys: &[String],
        args: &[u64],
        deadline: Instant,
    ) -> Result<Vec<i64>, StoreError> {
        let s = &*self.shared;
        let node = match &s.backend {
            Backend::Single(node) => node.clone(),
            Backend::Sentinel(watched) => watched.master(),
            Backend::Cluster { topology, .. } => {
                let slot = keys.first().map_or(0, |k| cluster::slot_of(k));
                let owner = read(topology).owner(slot).cloned();
                match owner {
                    Some(node) => node,
                    None => {
                        s.wake.notify_one();
                        return Err(StoreError::Redis(no_node("no node serves the slot")));
                    }
                }
            }
        };
        match self.call(&node, lua, keys, args, deadline).await? {
            Outcome::Reply(values) => Ok(values),
            Outcome::Moved(addr) => {
                // A failover moved the slot: the script did not run; once more, where it went.
                s.wake.notify_one();
                let target = self.node_for_redirect(&addr);
                let Some(target) = target else {
                    return Err(StoreError::Redis(no_node(
                        "a redirection to an unknown node",
                    )));
                };
                match self.call(&target, lua, keys, args, deadline).await? {
                    Outcome::Reply(values) => Ok(values),
                    Outcome::Moved(_) => Err(StoreError::Redis(no_node("redirected twice"))),
                    Outcome::Failed(e) => Err(StoreError::Redis(e)),
                }
            }
            Outcome::Failed(e) => Err(StoreError::Redis(e)),
        }
    }

    /// One call on `node`, through its breaker, cut at `deadline`.
    async fn call(
        &self,
        node: &Node,
        lua: &Lua,
        keys: &[String],
        args: &[u64],
        deadline: Instant,
    ) -> Result<Outcome, StoreError> {
        let s = &*self.shared;
        let start = s.clock.now();
        let permit = node.breaker.admit(start);
        if let Permit::Refuse { wait_ns } = permit {
            return Err(StoreError::CircuitOpen {
                retry_after: Duration::from_nanos(wait_ns),
            });
        }
        // Reports a probe cancelled mid-call as a failure.
        let guard = ProbeGuard::new(&node.breaker, permit, start);
        let answer = tokio::time::timeout_at(deadline, node.eval(lua, keys, args)).await;
        let answered = answer.as_ref().is_ok_and(Outcome::node_answered);
        guard.settle(answered, s.clock.now());
        node.mark(answered);
        if !matches!(answer, Ok(Outcome::Reply(_))) {
            // A failure, a redirection, or the cluster refusing: the topology may have moved.
            s.wake.notify_one();
        }
        match answer {
            Ok(outcome) => Ok(outcome),
            Err(_) => Err(StoreError::Timeout(s.options.deadline)),
        }
    }

    /// The node at `addr` for a `MOVED` answer: the topology's, or one made for it now (the
    /// upkeep adopts the cluster's own view at its next round).
    fn node_for_redirect(&self, addr: &str) -> Option<Arc<Node>> {
        let Backend::Cluster { topology, seed, .. } = &self.shared.backend else {
            return None;
        };
        if let Some(node) = read(topology).nodes.get(addr) {
            return Some(node.clone());
        }
        cluster::lazy_node_at(addr, seed, &self.shared.options)
            .ok()
            .map(Arc::new)
    }
}

fn read(topology: &RwLock<Arc<Topology>>) -> Arc<Topology> {
    topology
        .read()
        .unwrap_or_else(PoisonError::into_inner)
        .clone()
}

fn no_node(why: &'static str) -> redis::RedisError {
    redis::RedisError::from((redis::ErrorKind::ClusterConnectionNotFound, why))
}

/// `CLUSTER SLOTS` asked of `node`, within the connection timeout.
async fn ask_slots(node: &Node, options: &RedisOptions) -> redis::RedisResult<cluster::Slots> {
    let mut cmd = redis::cmd("CLUSTER");
    cmd.arg("SLOTS");
    let ask = node.query(&cmd);
    let reply = match tokio::time::timeout(options.connect_timeout, ask).await {
        Ok(reply) => reply?,
        Err(_) => return Err(no_node("CLUSTER SLOTS timed out")),
    };
    cluster::parse_slots(&reply, &node.addr)
        .ok_or_else(|| no_node("a CLUSTER SLOTS reply of another shape"))
}

/// The store's upkeep, until the store is dropped: the cluster's slot map, and each server's
/// `run_id`.
async fn upkeep(shared: Weak<Shared>, wake: Arc<Notify>) {
    loop {
        let Some(s) = shared.upgrade() else {
            return;
        };
        let troubled = s.round().await;
        drop(s);
        tokio::time::sleep(SPACING).await;
        let pace = if troubled { TROUBLED } else { STEADY };
        let _ = tokio::time::timeout(pace - SPACING, wake.notified()).await;
    }
}

impl Shared {
    /// One round of upkeep; whether a node is failing (the next round comes sooner).
    async fn round(&self) -> bool {
        let nodes: Vec<Arc<Node>> = match &self.backend {
            Backend::Single(node) => alloc::vec![node.clone()],
            Backend::Sentinel(watched) => {
                // Every round, not only after a failure: a failover the sentinels started by
                // themselves (or by hand) moves the master while the old one still answers.
                watched.follow(&self.options).await;
                alloc::vec![watched.master()]
            }
            Backend::Cluster {
                topology,
                seed,
                seeds,
            } => {
                self.refresh(topology, seed, seeds).await;
                read(topology).nodes.values().cloned().collect()
            }
        };
        let mut troubled = false;
        for node in &nodes {
            if !node.breaker.is_closed() {
                troubled = true;
                continue;
            }
            // An answer here clears a failure no call has cleared (a node no call goes to now).
            let answered = self.read_run_id(node).await;
            node.mark(answered);
            troubled |= !answered;
        }
        troubled
            || matches!(&self.backend, Backend::Cluster { topology, .. } if !read(topology).covers_all())
    }

    /// Reads the cluster's slot map from a node that answers (healthy ones first) and puts it
    /// in force if it changed.
    async fn refresh(
        &self,
        topology: &RwLock<Arc<Topology>>,
        seed: &ConnectionInfo,
        seeds: &[String],
    ) {
        let current = read(topology);
        let mut asked: Vec<Arc<Node>> = current.nodes.values().cloned().collect();
        asked.sort_by_key(|n| n.is_failing());
        let mut answer = None;
        for node in &asked {
            if let Ok(slots) = ask_slots(node, &self.options).await {
                answer = Some(slots);
                break;
            }
        }
        if answer.is_none() {
            for addr in seeds.iter().filter(|a| !current.nodes.contains_key(*a)) {
                let Ok(node) = cluster::node_at(addr, seed, &self.options).await else {
                    continue;
                };
                if let Ok(slots) = ask_slots(&node, &self.options).await {
                    answer = Some(slots);
                    break;
                }
            }
        }
        let Some((ranges, named)) = answer else {
            return;
        };
        if current.is(&ranges) {
            return;
        }
        let next = cluster::build(ranges, &named, &current.nodes, seed, &self.options).await;
        *topology.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(next);
    }

    /// Asks `node` its `run_id`, and counts a restart when it changed; whether it answered.
    async fn read_run_id(&self, node: &Node) -> bool {
        let mut cmd = redis::cmd("INFO");
        cmd.arg("server");
        let ask = node.query(&cmd);
        let Ok(Ok(reply)) = tokio::time::timeout(self.options.connect_timeout, ask).await else {
            return false;
        };
        let info = match &reply {
            Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
            Value::VerbatimString { text, .. } => text.clone(),
            Value::SimpleString(s) => s.clone(),
            _ => return true,
        };
        if node::run_id_of(&info).is_some_and(|id| node.saw_run_id(id)) {
            // Relaxed: a statistic.
            self.restarts.fetch_add(1, Ordering::Relaxed);
            self.options.count_restart();
        }
        true
    }
}

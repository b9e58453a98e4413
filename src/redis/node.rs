//! One server of the store: its multiplexed connection (redis-rs's `ConnectionManager`, remade in
//! the background after an error), its own circuit breaker, and the identity it last answered
//! with (`run_id`), which tells a restart.
//!
//! A call runs the script by its digest (`EVALSHA`); a `NOSCRIPT` answer proves that the script
//! did not run (the server restarted, failed over or had its cache flushed), so the same call is
//! sent once more with the body (`EVAL`), which runs it and caches it again: one more round trip,
//! not a failure. No other answer is ever sent twice: a consuming script sent twice would charge
//! twice.

use alloc::string::String;
use std::sync::{Mutex, PoisonError};

use redis::aio::ConnectionManager;
use redis::{Cmd, ErrorKind, RedisResult, ServerErrorKind, Value};

use super::RedisOptions;
use super::breaker::Breaker;
use crate::sync::{AtomicBool, Ordering};

/// The script as the store runs it: its body, and its SHA-1 digest for `EVALSHA`.
#[derive(Debug)]
pub(crate) struct Lua {
    body: &'static str,
    sha: String,
}

impl Lua {
    pub(crate) fn new(body: &'static str) -> Lua {
        Lua {
            body,
            sha: redis::Script::new(body).get_hash().into(),
        }
    }
}

/// One server: where it is, the connection to it, and what its breaker and identity say.
pub(crate) struct Node {
    /// `host:port`, as the cluster names it.
    pub(crate) addr: String,
    connection: ConnectionManager,
    pub(crate) breaker: Breaker,
    /// Its last call failed (a timeout, a broken connection, a cluster error): the topology may
    /// have changed. Cleared by the next call that succeeds.
    failing: AtomicBool,
    /// The `run_id` it last reported; `None` until it first answered.
    run_id: Mutex<Option<String>>,
}

impl core::fmt::Debug for Node {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Node").field("addr", &self.addr).finish()
    }
}

/// How the node's call ended, for the breaker and the topology.
pub(crate) enum Outcome {
    /// The script's reply.
    Reply(Vec<i64>),
    /// `MOVED`: another node serves the slot (`host:port`); the script did not run.
    Moved(String),
    /// Any other error: a failure.
    Failed(redis::RedisError),
}

impl Outcome {
    /// Whether the node itself answered in time, whatever it answered: a `MOVED`, or a refusal
    /// that speaks for the cluster, not for this node (`CLUSTERDOWN`, `TRYAGAIN`, `MASTERDOWN`,
    /// `LOADING`). Its breaker stays closed on those, so that it decides again the moment the
    /// cluster does.
    pub(crate) fn node_answered(&self) -> bool {
        match self {
            Outcome::Reply(_) | Outcome::Moved(_) => true,
            Outcome::Failed(e) => matches!(
                e.kind(),
                ErrorKind::Server(
                    ServerErrorKind::ClusterDown
                        | ServerErrorKind::TryAgain
                        | ServerErrorKind::MasterDown
                        | ServerErrorKind::BusyLoading
                )
            ),
        }
    }
}

impl Node {
    /// A node at `addr` on `connection`, with a breaker of `options`.
    pub(crate) fn new(addr: String, connection: ConnectionManager, options: &RedisOptions) -> Node {
        Node {
            addr,
            connection,
            breaker: Breaker::new(options.failures_to_open, options.cooldown_ns()),
            failing: AtomicBool::new(false),
            run_id: Mutex::new(None),
        }
    }

    /// Runs `lua` on `keys` and `args`: `EVALSHA`, then `EVAL` once on `NOSCRIPT`. Cut by the
    /// caller's deadline (dropping this future drops the call).
    pub(crate) async fn eval(&self, lua: &Lua, keys: &[String], args: &[u64]) -> Outcome {
        let mut connection = self.connection.clone();
        let by_digest = script_call("EVALSHA", &lua.sha, keys, args);
        let answer = match by_digest.query_async::<Vec<i64>>(&mut connection).await {
            Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                let with_body = script_call("EVAL", lua.body, keys, args);
                with_body.query_async::<Vec<i64>>(&mut connection).await
            }
            other => other,
        };
        match answer {
            Ok(values) => Outcome::Reply(values),
            Err(e) => match e.redirect_node() {
                Some((addr, _)) if e.kind() == ErrorKind::Server(ServerErrorKind::Moved) => {
                    Outcome::Moved(addr.into())
                }
                _ => Outcome::Failed(e),
            },
        }
    }

    /// Sends a command of the store's own upkeep (`CLUSTER SLOTS`, `INFO`).
    pub(crate) async fn query(&self, cmd: &Cmd) -> RedisResult<Value> {
        cmd.query_async(&mut self.connection.clone()).await
    }

    /// Records how a call ended.
    pub(crate) fn mark(&self, ok: bool) {
        // Relaxed: a hint for the topology's upkeep, which reads it on its own.
        if self.failing.load(Ordering::Relaxed) == ok {
            self.failing.store(!ok, Ordering::Relaxed);
        }
    }

    /// Whether its last call failed.
    pub(crate) fn is_failing(&self) -> bool {
        // Relaxed: as in `mark`.
        self.failing.load(Ordering::Relaxed)
    }

    /// Records the `run_id` the node reports now: `true` if it differs from the one it reported
    /// before (the server restarted, with whatever it kept of its data).
    pub(crate) fn saw_run_id(&self, run_id: &str) -> bool {
        let mut last = self.run_id.lock().unwrap_or_else(PoisonError::into_inner);
        let restarted = last.as_deref().is_some_and(|old| old != run_id);
        if last.as_deref() != Some(run_id) {
            *last = Some(run_id.into());
        }
        restarted
    }
}

fn script_call(verb: &str, script: &str, keys: &[String], args: &[u64]) -> Cmd {
    let mut cmd = redis::cmd(verb);
    cmd.arg(script).arg(keys.len()).arg(keys).arg(args);
    cmd
}

/// The `run_id` line of an `INFO server` reply.
pub(crate) fn run_id_of(info: &str) -> Option<&str> {
    info.lines()
        .find_map(|line| line.strip_prefix("run_id:"))
        .map(str::trim)
        .filter(|id| !id.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_id_is_read_from_the_info_reply() {
        let info = "# Server\r\nredis_version:7.0.15\r\nrun_id:8f3a\r\ntcp_port:6379\r\n";
        assert_eq!(run_id_of(info), Some("8f3a"));
        assert_eq!(run_id_of("# Server\r\nrun_id:\r\n"), None);
        assert_eq!(run_id_of(""), None);
    }
}

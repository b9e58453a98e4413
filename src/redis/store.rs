//! The connection to the store: one server through redis-rs's multiplexed `ConnectionManager`, or
//! a cluster through its async cluster client. Both are cheap to clone and share one socket per
//! server, so one store serves every limiter of a process.

use redis::aio::ConnectionManager;
use redis::cluster_async::ClusterConnection;
use redis::io::tcp::TcpSettings;
use redis::{IntoConnectionInfo, RedisResult, ScriptInvocation};

use super::{RedisOptions, StoreError};

/// A connection to one Redis server or to a Redis Cluster.
#[derive(Clone)]
pub struct RedisStore {
    backend: Backend,
}

#[derive(Clone)]
enum Backend {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl core::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let kind = match self.backend {
            Backend::Single(_) => "single",
            Backend::Cluster(_) => "cluster",
        };
        f.debug_struct("RedisStore").field("kind", &kind).finish()
    }
}

/// Small requests, each waited on: send them at once rather than coalescing them (Nagle).
fn tcp() -> TcpSettings {
    TcpSettings::default().set_nodelay(true)
}

impl RedisStore {
    /// A store on one server (`redis://host:port/db`). The connection is made now, within the
    /// connection timeout; if the server cannot be reached, the store is still built and connects
    /// on first use (the limiters' failure policy decides meanwhile). After an error it is remade
    /// in the background. Must be called within a tokio runtime.
    pub async fn connect(url: &str, options: &RedisOptions) -> Result<RedisStore, StoreError> {
        let info = url.into_connection_info()?.set_tcp_settings(tcp());
        let client = redis::Client::open(info)?;
        let config = redis::aio::ConnectionManagerConfig::new()
            .set_connection_timeout(Some(options.connect_timeout))
            .set_response_timeout(Some(options.deadline))
            // Reconnection attempts, not command retries (the manager never resends a command).
            .set_number_of_retries(2)
            .set_min_delay(core::time::Duration::from_millis(20))
            .set_max_delay(options.cooldown);
        let eager = ConnectionManager::new_with_config(client.clone(), config.clone());
        let manager = match tokio::time::timeout(options.connect_timeout, eager).await {
            Ok(Ok(manager)) => manager,
            _ => ConnectionManager::new_lazy_with_config(client, config)?,
        };
        Ok(RedisStore {
            backend: Backend::Single(manager),
        })
    }

    /// A store on a Redis Cluster, found from any of its nodes (`redis://host:port`). The client
    /// retries nothing, not even a `MOVED` redirection: a call that meets one fails (the policy
    /// decides it) and the slot map is refreshed for the next.
    pub async fn connect_cluster(
        nodes: &[&str],
        options: &RedisOptions,
    ) -> Result<RedisStore, StoreError> {
        let client = redis::cluster::ClusterClientBuilder::new(nodes.iter().copied())
            .retries(0)
            .connection_timeout(options.connect_timeout)
            .response_timeout(options.deadline)
            .tcp_settings(tcp())
            .build()?;
        let connection = client.get_async_connection().await?;
        Ok(RedisStore {
            backend: Backend::Cluster(connection),
        })
    }

    /// Runs a script (EVALSHA, loading it on `NOSCRIPT`).
    pub(crate) async fn invoke(&self, call: &ScriptInvocation<'_>) -> RedisResult<Vec<i64>> {
        match &self.backend {
            Backend::Single(c) => call.invoke_async(&mut c.clone()).await,
            Backend::Cluster(c) => call.invoke_async(&mut c.clone()).await,
        }
    }
}

//! A master found through Redis Sentinel: the sentinels are asked which server is the master of
//! a name (redis-rs's Sentinel client, which also checks that server's `ROLE`), and the store's
//! upkeep asks again every round, so that after a failover the calls move to the promoted
//! replica as soon as the sentinels announce it.
//!
//! Sentinels announce a promotion only once they have read it back from the promoted replica's
//! `INFO`, which they poll once a second: up to a second after the replica took writes. So while
//! the master the sentinels name does not answer and they hold it down (`s_down`, `o_down`, or a
//! failover in progress), the store also asks the replicas they list for their `ROLE`, and moves
//! to one that already calls itself master: the one the failover promoted.

use alloc::string::String;
use alloc::sync::Arc;
use alloc::vec::Vec;
use std::sync::{PoisonError, RwLock};

use std::collections::HashMap;

use redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType};
use redis::{ConnectionAddr, ConnectionInfo, IntoConnectionInfo, RedisResult, Value};
use tokio::sync::Mutex;

use super::RedisOptions;
use super::access;
use super::cluster;
use super::node::Node;

/// The sentinels, and the master they named last.
pub(crate) struct Watched {
    sentinels: Mutex<SentinelClient>,
    /// The master's name, as the sentinels know it.
    name: String,
    /// How the first master was reached (credentials, TLS): a replica is reached the same way.
    template: ConnectionInfo,
    /// The master in force; replaced whole by the upkeep after a failover.
    master: RwLock<Arc<Node>>,
}

impl Watched {
    /// Finds the master of `name` through the sentinels at `urls` and connects to it.
    pub(crate) async fn find(
        urls: &[&str],
        name: &str,
        options: &RedisOptions,
    ) -> RedisResult<Watched> {
        let mut sentinels = client(urls, name, options)?;
        let (node, template) = master(&mut sentinels, options).await?;
        Ok(Watched {
            sentinels: Mutex::new(sentinels),
            name: name.into(),
            template,
            master: RwLock::new(Arc::new(node)),
        })
    }

    /// The master in force.
    pub(crate) fn master(&self) -> Arc<Node> {
        self.master
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Asks the sentinels for the master again and moves to it if it changed; whether they
    /// answered.
    pub(crate) async fn follow(&self, options: &RedisOptions) -> bool {
        let mut sentinels = self.sentinels.lock().await;
        let ask = sentinels.async_get_client();
        let client = match tokio::time::timeout(options.connect_timeout, ask).await {
            Ok(Ok(client)) => client,
            // No master the sentinels name answers: a failover may be under way.
            _ => match self.promoted(&mut sentinels, options).await {
                Some(client) => client,
                None => return false,
            },
        };
        if client.get_connection_info().addr().to_string() == self.master().addr {
            return true;
        }
        let Ok(node) = node_of(client, options).await else {
            return false;
        };
        *self.master.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(node);
        true
    }

    /// A replica that already calls itself master while the sentinels hold the master down: the
    /// one a failover promoted, before they announce it.
    async fn promoted(
        &self,
        sentinels: &mut SentinelClient,
        options: &RedisOptions,
    ) -> Option<redis::Client> {
        let within = options.connect_timeout;
        let sentinel = tokio::time::timeout(within, sentinels.async_get_sentinel_client())
            .await
            .ok()?
            .ok()?;
        let mut c = tokio::time::timeout(within, sentinel.get_multiplexed_async_connection())
            .await
            .ok()?
            .ok()?;
        let mut ask = redis::cmd("SENTINEL");
        ask.arg("MASTER").arg(&self.name);
        let master: HashMap<String, String> = tokio::time::timeout(within, ask.query_async(&mut c))
            .await
            .ok()?
            .ok()?;
        let flags = master.get("flags").map_or("", String::as_str);
        let held_down = ["s_down", "o_down", "failover_in_progress"]
            .iter()
            .any(|f| flags.split(',').any(|g| g == *f));
        if !held_down {
            return None;
        }
        let mut ask = redis::cmd("SENTINEL");
        ask.arg("REPLICAS").arg(&self.name);
        let replicas: Vec<HashMap<String, String>> =
            tokio::time::timeout(within, ask.query_async(&mut c))
                .await
                .ok()?
                .ok()?;
        for replica in replicas {
            let (Some(ip), Some(port)) = (replica.get("ip"), replica.get("port")) else {
                continue;
            };
            let Ok(port) = port.parse::<u16>() else {
                continue;
            };
            let addr = access::same_kind(self.template.addr(), ip, port);
            let Ok(client) = redis::Client::open(self.template.clone().set_addr(addr)) else {
                continue;
            };
            if calls_itself_master(&client, within).await {
                return Some(client);
            }
        }
        None
    }
}

/// Whether the server of `client` answers `ROLE` with `master`.
async fn calls_itself_master(client: &redis::Client, within: core::time::Duration) -> bool {
    let ask = async {
        let mut c = client.get_multiplexed_async_connection().await?;
        redis::cmd("ROLE").query_async::<Value>(&mut c).await
    };
    match tokio::time::timeout(within, ask).await {
        Ok(Ok(Value::Array(role))) => matches!(
            role.first(),
            Some(Value::BulkString(b)) if b.as_slice() == b"master"
        ),
        _ => false,
    }
}

/// The master the sentinels name now, connected, and how it was reached.
async fn master(
    sentinels: &mut SentinelClient,
    options: &RedisOptions,
) -> RedisResult<(Node, ConnectionInfo)> {
    let client =
        match tokio::time::timeout(options.connect_timeout, sentinels.async_get_client()).await {
            Ok(client) => client?,
            Err(_) => {
                return Err(redis::RedisError::from((
                    redis::ErrorKind::Io,
                    "no sentinel named the master within the connection timeout",
                )));
            }
        };
    let template = client.get_connection_info().clone();
    Ok((node_of(client, options).await?, template))
}

/// The server `client` reaches, connected, named `host:port` as the store names its nodes.
async fn node_of(client: redis::Client, options: &RedisOptions) -> RedisResult<Node> {
    let addr = client.get_connection_info().addr().to_string();
    let connection = cluster::connection(client, options).await?;
    Ok(Node::new(addr, connection, options))
}

/// The Sentinel client: the sentinels reached as their URLs say (their own credentials and TLS),
/// the master with the store's credentials and TLS options.
fn client(urls: &[&str], name: &str, options: &RedisOptions) -> RedisResult<SentinelClient> {
    let mut addrs = Vec::with_capacity(urls.len());
    let mut sentinel_login = None;
    for url in urls {
        let info = url.into_connection_info()?;
        let settings = info.redis_settings();
        if sentinel_login.is_none() {
            if let Some(password) = settings.password() {
                sentinel_login = Some((settings.username().map(String::from), password.to_owned()));
            }
        }
        addrs.push(info.addr().clone());
    }
    // The sentinels are reached as their URLs say; the master over TLS where they are, or where
    // the options carry TLS settings.
    let sentinels_tls = addrs
        .first()
        .is_some_and(|a| matches!(a, ConnectionAddr::TcpTls { .. }));
    #[cfg(feature = "redis-tls")]
    let certificates = options.access.tls_certificates();
    #[cfg(feature = "redis-tls")]
    let master_tls = sentinels_tls || certificates.is_some();
    #[cfg(not(feature = "redis-tls"))]
    let master_tls = sentinels_tls;
    let mut builder = SentinelClientBuilder::new(addrs, name, SentinelServerType::Master)?
        .set_client_to_redis_tcp_settings(cluster::tcp());
    if let Some((user, password)) = sentinel_login {
        if let Some(user) = user {
            builder = builder.set_client_to_sentinel_username(user);
        }
        builder = builder.set_client_to_sentinel_password(password);
    }
    if let Some(c) = &options.access.credentials {
        builder = builder
            .set_client_to_redis_username(c.user())
            .set_client_to_redis_password(c.password());
    }
    if master_tls {
        builder = builder.set_client_to_redis_tls_mode(redis::TlsMode::Secure);
    }
    #[cfg(feature = "redis-tls")]
    if let Some(certificates) = certificates {
        builder = builder.set_client_to_redis_certificates(certificates.clone());
        if sentinels_tls {
            builder = builder.set_client_to_sentinel_certificates(certificates);
        }
    }
    builder.build()
}

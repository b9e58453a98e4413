//! The engine's limits as leases (features `rls` and `redis`; the binary's `--redis-mode
//! leased`): each key of each limit spends a local [`Leased`] lease, refilled from the store in
//! batches, so that a request below the quota is decided without a round trip. A fleet's
//! replicas together admit at most `burst + rate × (W + ttl)` in any window `W` (see
//! [`Leased`]); figures are the lease's, not the fleet's.

use alloc::string::String;
use alloc::sync::Arc;
use alloc::vec::Vec;
use std::collections::HashMap;
use std::sync::{PoisonError, RwLock};

use super::config::ConfigError;
use super::engine::{Answer, Part, RequestError};
use super::store::{Remote, conclude};
use crate::quota::{InsufficientCapacity, Quota};
use crate::redis::{LeaseOptions, Leased, RedisGcra, Taken};

/// How an engine on a store leases: the leases' options, and how many keys of one limit hold a
/// lease at once.
#[derive(Debug, Clone, Copy)]
pub struct Leasing {
    /// Each lease's TTL and largest size.
    pub options: LeaseOptions,
    /// The most keys of one limit that hold a lease at once. Past it, a new key takes the place
    /// of another, whose unspent tokens are dropped: it then asks the store, which still decides
    /// exactly.
    pub max_keys: usize,
}

/// One limit's leases, a bounded table of them by key.
#[derive(Debug)]
pub(super) struct Leases {
    limiter: RedisGcra,
    quota: Quota,
    leasing: Leasing,
    table: RwLock<HashMap<String, Leased>>,
}

impl Leases {
    /// The leases of the limit `name`, on the same key on the store as the one-script mode's
    /// (`<prefix>:{=<values>}:<name>`), so replicas in either mode share the limit.
    pub(super) fn new(
        remote: &Remote,
        leasing: Leasing,
        name: &str,
        quota: Quota,
    ) -> Result<Leases, ConfigError> {
        let limiter = RedisGcra::with_limits(
            remote.store.clone(),
            &remote.prefix,
            [(name, quota)],
            remote.options.clone(),
        )
        .map_err(|e| ConfigError::Unreadable {
            at: alloc::format!("the limit {name}"),
            why: e.to_string(),
        })?;
        Ok(Leases {
            limiter,
            quota,
            leasing,
            table: RwLock::new(HashMap::new()),
        })
    }

    /// The quota the leases are taken under (a reload keeps the table only while it holds).
    pub(super) fn quota(&self) -> Quota {
        self.quota
    }

    /// Keys holding a lease now, and the leases they have asked the store for.
    pub(super) fn figures(&self) -> (usize, u64) {
        let table = self.table.read().unwrap_or_else(PoisonError::into_inner);
        (
            table.len(),
            table.values().map(Leased::lease_requests).sum(),
        )
    }

    /// The lease of `key`, made on its first request.
    fn lease(&self, key: &str) -> Leased {
        if let Some(l) = self
            .table
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(key)
        {
            return l.clone();
        }
        let mut table = self.table.write().unwrap_or_else(PoisonError::into_inner);
        if let Some(l) = table.get(key) {
            return l.clone();
        }
        if table.len() >= self.leasing.max_keys.max(1) {
            // Any key makes room: what it drops is unspent tokens, never a debt (the store keeps
            // those).
            if let Some(victim) = table.keys().next().cloned() {
                table.remove(&victim);
            }
        }
        let l = Leased::new(self.limiter.clone(), key, self.leasing.options);
        table.insert(key.into(), l.clone());
        l
    }
}

/// Decides `parts` on their limits' leases: each takes its hits from its key's lease (waiting
/// for the store only when the lease cannot cover them); if any is refused, what the others took
/// goes back into their leases.
pub(super) async fn decide(
    leases: &HashMap<String, Arc<Leases>>,
    unavailable: bool,
    mut parts: Vec<Part<'_>>,
) -> Result<Answer, RequestError> {
    let mut taken: Vec<(usize, Taken)> = Vec::new();
    let mut waited = false;
    for (i, p) in parts.iter_mut().enumerate() {
        let Some(rule) = p.rule else { continue };
        let Some(limit) = leases.get(&rule.name) else {
            continue;
        };
        let answer = match u32::try_from(p.hits) {
            Ok(n) => limit.lease(&p.key).take_n(n).await,
            // More than any burst holds.
            Err(_) => Err(InsufficientCapacity {
                requested: u32::MAX,
                burst: limit.quota.burst(),
            }),
        };
        p.answer = Some(match answer {
            Ok(took) => {
                waited |= took.waited;
                taken.extend(took.taken.map(|t| (i, t)));
                Ok(took.decision)
            }
            Err(e) => Err(e),
        });
    }
    if parts.iter().any(|p| p.refused() && !p.shadow()) {
        for (i, t) in taken {
            if let (_, Some(now)) = t.give_back() {
                parts[i].answer = Some(Ok(now));
            }
        }
    }
    conclude(unavailable, &parts, waited)
}

/// The leases of `limits` (name and quota each), keeping `old`'s table of a limit whose quota
/// is unchanged. A changed limit starts with no leases: the store carries its keys over to the
/// new quota, and the old leases' unspent tokens are dropped.
pub(super) fn build(
    remote: &Remote,
    leasing: Leasing,
    limits: &[(String, Quota)],
    old: &HashMap<String, Arc<Leases>>,
) -> Result<HashMap<String, Arc<Leases>>, ConfigError> {
    limits
        .iter()
        .map(|(name, quota)| {
            let leases = match old.get(name) {
                Some(kept) if kept.quota() == *quota => kept.clone(),
                _ => Arc::new(Leases::new(remote, leasing, name, *quota)?),
            };
            Ok((name.clone(), leases))
        })
        .collect()
}

//! [`RedisGcra`]: GCRA decided by one atomic script on the server's clock.

use alloc::string::String;
use alloc::sync::Arc;
use alloc::vec::Vec;
use std::sync::{PoisonError, RwLock};

use super::node::Lua;
use super::script::{Mode, Reply, ScriptQuota};
use super::store::RedisStore;
use super::{FailurePolicy, RedisConfigError, RedisOptions, StoreError, failure_decision, script};
use crate::decision::{DecidedBy, Decision};
use crate::gcra::Gcra;
use crate::keyed::table::Keyed;
use crate::limiter::algorithm::Carry;
use crate::quota::InsufficientCapacity;
use crate::quota::Quota;

mod admin;
#[cfg(any(feature = "tower", feature = "rls"))]
pub(crate) mod each;

pub use self::admin::RedisCharge;

/// A GCRA limiter shared by every node that uses the same store and prefix: each decision is one
/// atomic script on the server, on the server's clock, so nodes' clocks never matter.
///
/// Cheap to clone (the clones share one limiter). Every call is bounded by the deadline of its
/// [`RedisOptions`]; past it, or while the circuit breaker is open, the [`FailurePolicy`] decides.
///
/// A subject's keys are `<prefix>:{=<subject>}:<limit>`: the braces make the part between them
/// the cluster hash tag, so every limit of one subject sits in one slot (the `=` keeps the tag
/// non-empty for an empty subject). The prefix should not contain braces.
#[derive(Clone, Debug)]
pub struct RedisGcra {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    store: RedisStore,
    script: Lua,
    /// The settlement's and the operator's script (`admin.lua`).
    admin: Lua,
    prefix: String,
    /// The limits in force: each call reads them once and decides on that one set, so a change
    /// ([`RedisGcra::set_quota`]) applies from the next call on. The lock is held only to clone
    /// or replace the `Arc`, beside a round trip to the store.
    limits: RwLock<Arc<[Limit]>>,
    options: RedisOptions,
    /// [`FailurePolicy::Local`]'s limiters, one per subject, made on the first failure.
    local: Option<Keyed<String, Gcra>>,
}

#[derive(Debug, Clone)]
struct Limit {
    name: String,
    quota: Quota,
    script: ScriptQuota,
}

/// What the grant-up-to mode gives.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Grant {
    pub(crate) granted: u32,
    pub(crate) remaining: u32,
    pub(crate) retry_ns: u64,
    pub(crate) reset_ns: u64,
}

impl RedisGcra {
    /// One limit, `quota`, for every subject, under `prefix`, with the default options.
    pub fn new(
        store: RedisStore,
        prefix: &str,
        quota: Quota,
    ) -> Result<RedisGcra, RedisConfigError> {
        RedisGcra::with_limits(store, prefix, [("q", quota)], RedisOptions::default())
    }

    /// Several limits for every subject, checked together in one call: a request passes only if
    /// every limit has room, and is charged to all of them.
    pub fn with_limits<'a>(
        store: RedisStore,
        prefix: &str,
        limits: impl IntoIterator<Item = (&'a str, Quota)>,
        options: RedisOptions,
    ) -> Result<RedisGcra, RedisConfigError> {
        let limits = limits
            .into_iter()
            .map(|(name, quota)| {
                ScriptQuota::new(&quota)
                    .map(|script| Limit {
                        name: name.into(),
                        quota,
                        script,
                    })
                    .ok_or_else(|| RedisConfigError::WindowTooLong { limit: name.into() })
            })
            .collect::<Result<Vec<_>, _>>()?;
        if limits.is_empty() {
            return Err(RedisConfigError::NoLimits);
        }
        // Two limits under one name would be one key, charged twice by one call.
        for (i, l) in limits.iter().enumerate() {
            if limits[..i].iter().any(|other| other.name == l.name) {
                return Err(RedisConfigError::DuplicateLimit {
                    limit: l.name.clone(),
                });
            }
        }
        let local = match options.policy {
            FailurePolicy::Local { share } => {
                Some(Keyed::new(share, options.max_local_keys, Gcra::new))
            }
            _ => None,
        };
        Ok(RedisGcra {
            inner: Arc::new(Inner {
                store,
                script: Lua::new(script::SOURCE),
                admin: Lua::new(script::ADMIN_SOURCE),
                prefix: prefix.into(),
                limits: RwLock::new(limits.into()),
                options,
                local,
            }),
        })
    }

    /// Checks one request for `subject`.
    pub async fn check(&self, subject: &str) -> Decision {
        // The smallest burst is at least 1: one token always fits.
        self.check_n(subject, 1).await.unwrap_or_else(|e| {
            // Unreachable (bursts are at least 1), but a refusal is the safe answer.
            script::decision(false, 0, 0, 0, e.burst, DecidedBy::Local)
        })
    }

    /// Checks a request for `n` tokens for `subject`, all or nothing; `n = 0` peeks and writes
    /// nothing. More than a limit's burst is an error, answered without a round trip.
    pub async fn check_n(&self, subject: &str, n: u32) -> Result<Decision, InsufficientCapacity> {
        let answer = self.decide_n(subject, n).await;
        self.inner.options.count(n, &answer);
        answer
    }

    /// [`RedisGcra::check_n`], before it is counted.
    async fn decide_n(&self, subject: &str, n: u32) -> Result<Decision, InsufficientCapacity> {
        let limits = self.limits();
        for l in limits.iter() {
            InsufficientCapacity::check(n, l.quota.burst())?;
        }
        match self.call(subject, n, Mode::AllOrNothing, &limits).await {
            Ok(reply) => decided(reply, n, &limits),
            Err(e) => Ok(self.on_failure(subject, n, &e, smallest_burst(&limits))),
        }
    }

    /// Changes the quota of the limit named `limit` from the next call on (calls under way
    /// decide on the quota they started with), each subject's state carried over as `carry`
    /// says:
    ///
    /// * [`Carry::Debt`]: the state on the server is the instant each subject's limit is full
    ///   again, so what was spent carries over as time: a subject that spent its burst waits as
    ///   long as it would have; a debt past a smaller new burst is kept.
    /// * [`Carry::Proportional`]: the share of the old burst in use, of the new burst, rounded up;
    ///   a debt past the whole old burst counts as an empty limit.
    ///
    /// The script carries a subject over when it next sees it (a pass over every subject could
    /// not keep up with live calls): a subject idle since the change has paid its debt down at the
    /// old rate until then, so a share is taken of what is left of it at that call, not at the
    /// change. Either way no subject is ever fuller than it was, and the carried state is written
    /// once, so a share is never taken twice. A [`Leased`](crate::redis::Leased) node takes the new
    /// quota up at its next refill. Every node changes its own limiter: nodes that disagree decide
    /// each call on the quota they hold, on the one shared state.
    ///
    /// # Errors
    ///
    /// [`RedisConfigError::UnknownLimit`] if no limit has that name;
    /// [`RedisConfigError::WindowTooLong`] if the script cannot keep `quota` exact. The limits in
    /// force are then left as they were.
    pub fn set_quota(
        &self,
        limit: &str,
        quota: Quota,
        carry: Carry,
    ) -> Result<(), RedisConfigError> {
        let script = ScriptQuota::new(&quota)
            .ok_or_else(|| RedisConfigError::WindowTooLong {
                limit: limit.into(),
            })?
            .carrying(carry);
        let mut limits = self
            .inner
            .limits
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        let mut next: Vec<Limit> = limits.to_vec();
        let Some(changed) = next.iter_mut().find(|l| l.name == limit) else {
            return Err(RedisConfigError::UnknownLimit {
                limit: limit.into(),
            });
        };
        (changed.quota, changed.script) = (quota, script);
        *limits = next.into();
        Ok(())
    }

    /// The limits in force, as one call decides on them.
    fn limits(&self) -> Arc<[Limit]> {
        self.inner
            .limits
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Like [`RedisGcra::check_n`], without the failure policy: the store's decision, or why
    /// there is none.
    pub async fn try_check_n(&self, subject: &str, n: u32) -> Result<Decision, StoreError> {
        let limits = self.limits();
        let reply = self.call(subject, n, Mode::AllOrNothing, &limits).await?;
        decided(reply, n, &limits).map_err(|_| StoreError::BadReply)
    }

    /// The key that holds `subject`'s state for the limit named `limit`.
    pub fn key(&self, subject: &str, limit: &str) -> String {
        let mut key =
            String::with_capacity(self.inner.prefix.len() + subject.len() + limit.len() + 5);
        key.push_str(&self.inner.prefix);
        key.push_str(":{=");
        key.push_str(subject);
        key.push_str("}:");
        key.push_str(limit);
        key
    }

    /// The options this limiter runs with.
    pub fn options(&self) -> &RedisOptions {
        &self.inner.options
    }

    /// The quota, when there is just one limit.
    #[cfg(feature = "tower")]
    pub(crate) fn single_quota(&self) -> Option<Quota> {
        match &*self.limits() {
            [one] => Some(one.quota),
            _ => None,
        }
    }

    /// The smallest burst of the limits in force: the most one request may take.
    pub(crate) fn burst(&self) -> u32 {
        smallest_burst(&self.limits())
    }

    /// The longest period of the limits, in ns: the time one token takes to return.
    pub(crate) fn period_ns(&self) -> u64 {
        self.limits()
            .iter()
            .map(|l| u64::try_from(l.quota.period().as_nanos()).unwrap_or(u64::MAX))
            .max()
            .unwrap_or(0)
    }

    /// Takes up to `n` tokens for `subject` (the lease's refill), the call ending at `until`.
    pub(crate) async fn grant(
        &self,
        subject: &str,
        n: u32,
        until: tokio::time::Instant,
    ) -> Result<Grant, StoreError> {
        let limits = self.limits();
        match self
            .call_until(subject, n, Mode::UpTo, &limits, until)
            .await?
        {
            Reply::Decided {
                granted,
                remaining,
                retry_us,
                reset_us,
                ..
            } => Ok(Grant {
                granted: granted.min(n),
                remaining,
                retry_ns: retry_us.saturating_mul(1000),
                reset_ns: reset_us.saturating_mul(1000),
            }),
            Reply::OverBurst { .. } => Err(StoreError::BadReply),
        }
    }

    /// The decision of a blind policy, or of this node's share, for a request the store could not
    /// decide; `burst` is the smallest of the limits the call was made on.
    fn on_failure(&self, subject: &str, n: u32, e: &StoreError, burst: u32) -> Decision {
        failure_decision(
            self.inner.options.policy,
            burst,
            self.inner.options.failure_retry_ns(e),
            || self.inner.local.as_ref().map(|l| l.check_key_n(subject, n)),
        )
    }

    /// The failure policy's local decision for a lease's node, on its own share limiter.
    pub(crate) fn policy(&self) -> FailurePolicy {
        self.inner.options.policy
    }

    /// One call to the store, through the node's breaker, within one deadline from now, on
    /// `limits`.
    async fn call(
        &self,
        subject: &str,
        n: u32,
        mode: Mode,
        limits: &[Limit],
    ) -> Result<Reply, StoreError> {
        let until = self.inner.options.until();
        self.call_until(subject, n, mode, limits, until).await
    }

    /// [`RedisGcra::call`], ending at `until` however the time was spent before it.
    async fn call_until(
        &self,
        subject: &str,
        n: u32,
        mode: Mode,
        limits: &[Limit],
        until: tokio::time::Instant,
    ) -> Result<Reply, StoreError> {
        let values = self.invoke(subject, n, mode, limits, until).await?;
        let reply = Reply::parse(&values, limits.len()).ok_or(StoreError::BadReply);
        if let Err(e) = &reply {
            self.inner.options.count_failure(e);
        }
        reply
    }

    /// The script's raw reply to one call (failures counted), ending at `until`.
    async fn invoke(
        &self,
        subject: &str,
        n: u32,
        mode: Mode,
        limits: &[Limit],
        until: tokio::time::Instant,
    ) -> Result<Vec<i64>, StoreError> {
        let inner = &*self.inner;
        let keys: Vec<String> = limits.iter().map(|l| self.key(subject, &l.name)).collect();
        let mut args: Vec<u64> = Vec::with_capacity(2 + 4 * limits.len());
        args.extend([mode as u64, u64::from(n)]);
        for l in limits {
            args.extend(l.script.args());
        }
        let result = inner.store.invoke(&inner.script, &keys, &args, until).await;
        if let Err(e) = &result {
            inner.options.count_failure(e);
        }
        result
    }
}

/// The smallest burst of `limits`: the most one request may take.
fn smallest_burst(limits: &[Limit]) -> u32 {
    limits.iter().map(|l| l.quota.burst()).min().unwrap_or(0)
}

/// The decision of the store's reply to a call for `n` tokens made on `limits`.
fn decided(reply: Reply, n: u32, limits: &[Limit]) -> Result<Decision, InsufficientCapacity> {
    match reply {
        Reply::Decided {
            allowed,
            remaining,
            retry_us,
            reset_us,
            binding,
            ..
        } => Ok(script::decision(
            allowed,
            remaining,
            retry_us,
            reset_us,
            limits[binding].quota.burst(),
            DecidedBy::Store,
        )),
        Reply::OverBurst { limit } => Err(InsufficientCapacity {
            requested: n,
            burst: limits[limit].quota.burst(),
        }),
    }
}

//! The engine's limits on Redis or Valkey (features `rls` and `redis`): one [`RedisGcra`] with a
//! limit per configured limit, every descriptor of a request decided in one atomic script.

use alloc::string::String;
use alloc::vec::Vec;

use super::config::ConfigError;
use super::engine::{Answer, Part, RequestError};
use super::leases::Leasing;
use crate::decision::DecidedBy;
use crate::quota::InsufficientCapacity;
use crate::redis::remote::each;
use crate::redis::{RedisGcra, RedisOptions, RedisStore};

/// Where an engine keeps its limits when a fleet shares them: a store, the prefix of its keys,
/// and the options of each call (its deadline, breaker and failure policy).
#[derive(Debug, Clone)]
pub struct Remote {
    /// The store.
    pub store: RedisStore,
    /// The prefix of every key (`<prefix>:{=<values>}:<limit name>`).
    pub prefix: String,
    /// The calls' options. Their [`FailurePolicy`](crate::redis::FailurePolicy) decides while the
    /// store cannot answer, unless `unavailable` is set.
    pub options: RedisOptions,
    /// While the store cannot answer, refuse to decide ([`RequestError::Unavailable`]: Envoy then
    /// applies its `failure_mode_deny`) instead of applying the failure policy.
    pub unavailable: bool,
    /// Spend leases locally, refilled from the store in batches, instead of one script a
    /// request: `None` decides every request on the store, exactly.
    pub leasing: Option<Leasing>,
}

/// The limiter for `limits` (name and quota each) on `remote`; `None` when there is none to
/// hold. Its state on the store is kept by name across reloads: a key written under another
/// quota is carried over as time when next seen.
pub(super) fn limiter(
    remote: &Remote,
    limits: &[(String, crate::quota::Quota)],
) -> Result<Option<RedisGcra>, ConfigError> {
    if remote.store.is_cluster() {
        // A request's descriptors are keys of different values, in different slots.
        return Err(ConfigError::Unreadable {
            at: "the store".into(),
            why: "a Redis Cluster cannot decide a request's descriptors in one script; use one server or Sentinel".into(),
        });
    }
    if limits.is_empty() {
        return Ok(None);
    }
    let named = limits.iter().map(|(name, quota)| (name.as_str(), *quota));
    RedisGcra::with_limits(
        remote.store.clone(),
        &remote.prefix,
        named,
        remote.options.clone(),
    )
    .map(Some)
    .map_err(|e| ConfigError::Unreadable {
        at: "the store's limits".into(),
        why: e.to_string(),
    })
}

/// Decides `parts` on the store in one call: every part with a limit, each with its hits; a part
/// in shadow mode decides only for itself.
pub(super) async fn decide(
    limiter: &RedisGcra,
    unavailable: bool,
    mut parts: Vec<Part<'_>>,
) -> Result<Answer, RequestError> {
    let mut calls = Vec::new();
    let mut asked = Vec::new();
    for (i, p) in parts.iter_mut().enumerate() {
        let Some(rule) = p.rule else { continue };
        match u32::try_from(p.hits) {
            Ok(n) => {
                calls.push(each::Part {
                    subject: p.key.clone(),
                    limit: rule.name.clone(),
                    n,
                    shadow: rule.shadow,
                });
                asked.push(i);
            }
            // More than any burst holds: refused without asking.
            Err(_) => {
                let burst = rule.limit.quota().map_or(0, |q| q.burst());
                p.answer = Some(Err(InsufficientCapacity {
                    requested: u32::MAX,
                    burst,
                }));
            }
        }
    }
    // Refused already: nothing is asked, so nothing is spent.
    let doomed = parts.iter().any(|p| p.refused() && !p.shadow());
    let ask = !calls.is_empty() && !doomed;
    if ask {
        let answers = limiter.check_each(&calls).await;
        for (i, (answer, _)) in asked.into_iter().zip(answers) {
            parts[i].answer = answer;
        }
    }
    conclude(unavailable, &parts, ask)
}

/// The answer to decided `parts`: [`RequestError::Unavailable`] if the engine says so while any
/// part was decided by the failure policy, otherwise every part's status.
pub(super) fn conclude(
    unavailable: bool,
    parts: &[Part<'_>],
    waited_for_store: bool,
) -> Result<Answer, RequestError> {
    let failed = |p: &Part<'_>| {
        matches!(&p.answer, Some(Ok(d)) if matches!(
            d.decided_by(),
            DecidedBy::FailClosed | DecidedBy::FailOpen | DecidedBy::FailLocal
        ))
    };
    if unavailable && parts.iter().any(failed) {
        return Err(RequestError::Unavailable(
            "the rate-limit store did not answer in time".into(),
        ));
    }
    let over_limit = parts.iter().any(|p| p.refused() && !p.shadow());
    Ok(Answer {
        over_limit,
        statuses: parts.iter().map(Part::status).collect(),
        waited_for_store,
    })
}

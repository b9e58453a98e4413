//! [`Engine`]: Envoy's rate-limit semantics over this crate's GCRA, one [`Keyed`] table per
//! configured limit, reloaded in place.

use alloc::string::String;
use alloc::sync::Arc;
use alloc::vec::Vec;
use core::time::Duration;
use std::collections::HashMap;
use std::sync::{PoisonError, RwLock};

use super::config::{self, ConfigError, Descriptor, DomainConfig, RateLimit};
use crate::decision::Decision;
use crate::gcra::Gcra;
use crate::keyed::table::Keyed;
use crate::limiter::algorithm::Carry;
use crate::quota::{InsufficientCapacity, Quota};
use crate::sync::{AtomicU64, Ordering};

/// The most a request may carry: descriptors, entries in one, and bytes in a key or a value.
/// Past them a request is refused as invalid, before any lookup.
pub const MAX_DESCRIPTORS: usize = 64;
/// See [`MAX_DESCRIPTORS`].
pub const MAX_ENTRIES: usize = 32;
/// See [`MAX_DESCRIPTORS`].
pub const MAX_ENTRY_BYTES: usize = 4096;

/// One entry of a request's descriptor.
#[derive(Debug, Clone, Copy)]
pub struct Entry<'a> {
    /// The entry's key.
    pub key: &'a str,
    /// Its value.
    pub value: &'a str,
}

/// One descriptor of a request: its entries, and its own hits (`None`: the request's).
#[derive(Debug, Clone)]
pub struct Item<'a> {
    /// The entries, in order.
    pub entries: Vec<Entry<'a>>,
    /// The descriptor's own `hits_addend`, overriding the request's.
    pub hits: Option<u64>,
}

/// A `ShouldRateLimit` request, as the engine reads it.
#[derive(Debug, Clone)]
pub struct Request<'a> {
    /// The domain.
    pub domain: &'a str,
    /// The descriptors, each decided; all or nothing.
    pub items: Vec<Item<'a>>,
    /// Hits for each descriptor without its own; 0 means 1.
    pub hits_addend: u32,
}

/// Why a request gets no decision.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum RequestError {
    /// The request is malformed (empty domain, no descriptors, an empty key, past a bound): the
    /// message says which.
    Invalid(String),
    /// The store could not answer, and the engine was told to say so rather than apply a
    /// failure policy.
    Unavailable(String),
}

impl core::fmt::Display for RequestError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            RequestError::Invalid(why) | RequestError::Unavailable(why) => f.write_str(why),
        }
    }
}

impl std::error::Error for RequestError {}

/// What a descriptor's decision says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Status {
    /// Refused: the request is over this descriptor's limit.
    pub over_limit: bool,
    /// Over the limit in shadow mode: answered OK, counted as refused.
    pub shadowed: bool,
    /// The configured limit that decided it, with its name (`domain.key_value…`); `None` for a
    /// descriptor no limit matches, or one matched `unlimited`.
    pub limit: Option<(String, RateLimit)>,
    /// Requests left on that limit after this decision (`u32::MAX` when unlimited).
    pub remaining: u32,
    /// When the limit is full again (zero when it is, or when there is none).
    pub until_reset: Duration,
}

/// A request's decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    /// Any descriptor over its limit (shadowed ones not): `OVER_LIMIT`.
    pub over_limit: bool,
    /// One status per descriptor, in the request's order.
    pub statuses: Vec<Status>,
    /// The decision waited for a call to the store (never on the engine's own tables; on
    /// leases, only when a lease could not cover the request).
    pub waited_for_store: bool,
}

/// A configured limit in force: its name, limit, quota and table, shared by reloads that keep
/// it.
#[derive(Debug)]
pub(super) struct Rule {
    pub(super) name: String,
    pub(super) limit: RateLimit,
    pub(super) shadow: bool,
    table: Arc<Keyed<String, Gcra>>,
}

#[derive(Debug)]
enum Target {
    None,
    Unlimited,
    Rule(Arc<Rule>),
}

#[derive(Debug)]
struct Node {
    key: String,
    value: Option<String>,
    target: Target,
    children: Vec<Node>,
}

#[derive(Debug, Default)]
struct Rules {
    domains: HashMap<String, Vec<Node>>,
    /// Every rule by name, for the next reload to find.
    by_name: HashMap<String, Arc<Rule>>,
    /// The limits on the store, when the engine has one and decides each request there.
    #[cfg(feature = "redis")]
    limiter: Option<crate::redis::RedisGcra>,
    /// Each limit's leases by name, when the engine leases from a store.
    #[cfg(feature = "redis")]
    leases: HashMap<String, Arc<super::leases::Leases>>,
}

/// What a reload changed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Reloaded {
    /// Limits that are new.
    pub added: usize,
    /// Limits whose quota changed (their keys carried over, debts kept as time).
    pub changed: usize,
    /// Limits that are gone (no longer counted).
    pub removed: usize,
    /// Limits kept as they were, state and all.
    pub kept: usize,
}

/// Decides Envoy's `ShouldRateLimit` requests against a configuration of domains, each limit a
/// [`Keyed`] GCRA table of at most `max_keys` keys.
///
/// A descriptor's entries walk the domain's tree: at each, a node with that key and value, or
/// else one with that key and no value (each value then limited apart); a descriptor that runs
/// out of nodes, or ends at one without a limit, is not limited. Every descriptor of a request
/// is decided all or nothing: if any is over its limit, what the others took is given back.
#[derive(Debug)]
pub struct Engine {
    rules: RwLock<Arc<Rules>>,
    max_keys: usize,
    /// Decisions that waited for a call to the store.
    waited: AtomicU64,
    #[cfg(feature = "redis")]
    remote: Option<super::store::Remote>,
}

impl Engine {
    /// An engine on `domains`, each limit's table holding at most `max_keys` keys.
    pub fn new(domains: &[DomainConfig], max_keys: usize) -> Result<Engine, ConfigError> {
        let engine = Engine {
            rules: RwLock::new(Arc::default()),
            max_keys: max_keys.max(1),
            waited: AtomicU64::new(0),
            #[cfg(feature = "redis")]
            remote: None,
        };
        engine.reload(domains)?;
        Ok(engine)
    }

    /// An engine whose limits are on a store (features `rls` and `redis`), shared by every
    /// replica that uses the same store and prefix: each request is one atomic script, every
    /// descriptor all or nothing.
    #[cfg(feature = "redis")]
    pub fn with_remote(
        domains: &[DomainConfig],
        remote: super::store::Remote,
    ) -> Result<Engine, ConfigError> {
        let engine = Engine {
            rules: RwLock::new(Arc::default()),
            max_keys: 1,
            waited: AtomicU64::new(0),
            remote: Some(remote),
        };
        engine.reload(domains)?;
        Ok(engine)
    }

    /// Puts `domains` in force, or refuses them and keeps the configuration in force. A limit
    /// kept under its name keeps its keys' state; one whose quota changed carries each key over
    /// as time ([`Carry::Debt`]); a removed one stops counting. Requests under way finish on the
    /// configuration they started with.
    pub fn reload(&self, domains: &[DomainConfig]) -> Result<Reloaded, ConfigError> {
        config::check(domains)?;
        let old = self.current();
        // The store's limiters first: they are the last thing that can fail.
        #[cfg(feature = "redis")]
        let (limiter, leases) = match &self.remote {
            Some(remote) => {
                let limits = limits_of(domains);
                match remote.leasing {
                    Some(leasing) => (
                        None,
                        super::leases::build(remote, leasing, &limits, &old.leases)?,
                    ),
                    None => (super::store::limiter(remote, &limits)?, HashMap::new()),
                }
            }
            None => (None, HashMap::new()),
        };
        let mut reloaded = Reloaded::default();
        #[cfg_attr(not(feature = "redis"), allow(unused_mut))]
        let mut rules = build(domains, &old, self.max_keys, &mut reloaded);
        #[cfg(feature = "redis")]
        {
            rules.limiter = limiter;
            rules.leases = leases;
        }
        reloaded.removed = old
            .by_name
            .keys()
            .filter(|name| !rules.by_name.contains_key(*name))
            .count();
        *self.rules.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(rules);
        Ok(reloaded)
    }

    /// The names of the limits in force, sorted.
    pub fn limits(&self) -> Vec<String> {
        let mut names: Vec<String> = self.current().by_name.keys().cloned().collect();
        names.sort();
        names
    }

    /// On leases: how many keys hold one now, and how many leases they have asked the store for
    /// (background refills included; a key whose lease made room for another takes its count
    /// along). `None` when the engine does not lease.
    #[cfg(feature = "redis")]
    pub fn lease_figures(&self) -> Option<(usize, u64)> {
        self.remote.as_ref()?.leasing?;
        let rules = self.current();
        Some(
            rules
                .leases
                .values()
                .map(|l| l.figures())
                .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1)),
        )
    }

    /// Decisions so far that waited for a call to the store: every one in one-script mode (but
    /// those no limit applies to), on leases only those a lease could not cover.
    pub fn store_round_trips(&self) -> u64 {
        // Relaxed: a statistic.
        self.waited.load(Ordering::Relaxed)
    }

    /// Whether `domain` is configured (for a metric's label: a request's own domain is not
    /// bounded, a configured one is).
    pub fn has_domain(&self, domain: &str) -> bool {
        self.current().domains.contains_key(domain)
    }

    fn current(&self) -> Arc<Rules> {
        self.rules
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Decides `request` on the engine's own tables: every descriptor's status, all or nothing.
    /// An engine on a store decides with [`Engine::check`].
    pub fn decide(&self, request: &Request<'_>) -> Result<Answer, RequestError> {
        validate(request)?;
        let rules = self.current();
        decide_local(request, &rules)
    }

    /// Decides `request` where the engine keeps its limits: on the store, in one call, or on its
    /// own tables at once.
    pub async fn check(&self, request: &Request<'_>) -> Result<Answer, RequestError> {
        validate(request)?;
        let rules = self.current();
        #[cfg(feature = "redis")]
        if let Some(remote) = &self.remote {
            let parts = parts(request, &rules);
            let answer = if remote.leasing.is_some() {
                super::leases::decide(&rules.leases, remote.unavailable, parts).await
            } else {
                match &rules.limiter {
                    Some(limiter) => super::store::decide(limiter, remote.unavailable, parts).await,
                    // No limit configured: nothing to ask.
                    None => super::store::conclude(remote.unavailable, &parts, false),
                }
            };
            if answer.as_ref().is_ok_and(|a| a.waited_for_store) {
                // Relaxed: a statistic.
                self.waited.fetch_add(1, Ordering::Relaxed);
            }
            return answer;
        }
        decide_local(request, &rules)
    }
}

/// Decides `request` on the rules' own tables: every descriptor takes its hits; if any is over,
/// what the others took is given back.
fn decide_local(request: &Request<'_>, rules: &Rules) -> Result<Answer, RequestError> {
    let mut parts = parts(request, rules);
    for part in &mut parts {
        part.take();
    }
    let over_limit = parts.iter().any(|p| p.refused() && !p.shadow());
    if over_limit {
        for part in &mut parts {
            part.give_back();
        }
    }
    Ok(Answer {
        over_limit,
        statuses: parts.iter().map(Part::status).collect(),
        waited_for_store: false,
    })
}

/// Each descriptor's part in the decision of `request`, undecided.
fn parts<'r>(request: &Request<'_>, rules: &'r Rules) -> Vec<Part<'r>> {
    let nodes = rules.domains.get(request.domain).map(Vec::as_slice);
    request
        .items
        .iter()
        .map(|item| {
            let hits = item.hits.unwrap_or(u64::from(request.hits_addend)).max(1);
            Part::of(
                nodes.and_then(|nodes| lookup(nodes, &item.entries)),
                item,
                hits,
            )
        })
        .collect()
}

/// The limits `domains` configure, by name.
#[cfg(feature = "redis")]
fn limits_of(domains: &[DomainConfig]) -> Vec<(String, Quota)> {
    fn walk(nodes: &[Descriptor], at: &str, out: &mut Vec<(String, Quota)>) {
        for d in nodes {
            let name = config::path(at, &d.key, d.value.as_deref());
            if let Some(quota) = d.rate_limit.as_ref().and_then(RateLimit::quota) {
                out.push((name.clone(), quota));
            }
            walk(&d.descriptors, &name, out);
        }
    }
    let mut out = Vec::new();
    for d in domains {
        walk(&d.descriptors, &d.domain, &mut out);
    }
    out
}

/// One descriptor's part in a decision.
pub(super) struct Part<'r> {
    pub(super) rule: Option<&'r Rule>,
    unlimited: bool,
    pub(super) key: String,
    pub(super) hits: u64,
    pub(super) answer: Option<Result<Decision, InsufficientCapacity>>,
}

impl<'r> Part<'r> {
    fn of(target: Option<&'r Target>, item: &Item<'_>, hits: u64) -> Part<'r> {
        let (rule, unlimited) = match target {
            Some(Target::Rule(rule)) => (Some(&**rule), false),
            Some(Target::Unlimited) => (None, true),
            Some(Target::None) | None => (None, false),
        };
        let key = if rule.is_some() {
            subject(&item.entries)
        } else {
            String::new()
        };
        Part {
            rule,
            unlimited,
            key,
            hits,
            answer: None,
        }
    }

    fn take(&mut self) {
        let Some(rule) = self.rule else { return };
        let answer = match u32::try_from(self.hits) {
            Ok(n) => rule.table.check_key_n(self.key.as_str(), n),
            // More than any burst holds.
            Err(_) => Err(InsufficientCapacity {
                requested: u32::MAX,
                burst: rule.table.quota_of(&self.key).burst(),
            }),
        };
        self.answer = Some(answer);
    }

    pub(super) fn refused(&self) -> bool {
        matches!(&self.answer, Some(a) if !a.as_ref().is_ok_and(Decision::is_allowed))
    }

    pub(super) fn shadow(&self) -> bool {
        self.rule.is_some_and(|r| r.shadow)
    }

    /// Gives back what an admission took, and reads the key's figures after it.
    fn give_back(&mut self) {
        let (Some(rule), Some(Ok(d))) = (self.rule, &self.answer) else {
            return;
        };
        if !d.is_allowed() {
            return;
        }
        // Admitted, so the hits fit in a u32.
        let n = u32::try_from(self.hits).unwrap_or(0);
        rule.table.give_back_key(self.key.as_str(), n);
        if let Ok(now) = rule.table.check_key_n(self.key.as_str(), 0) {
            self.answer = Some(Ok(now));
        }
    }

    pub(super) fn status(&self) -> Status {
        let Some(rule) = self.rule else {
            return Status {
                over_limit: false,
                shadowed: false,
                limit: None,
                remaining: if self.unlimited { u32::MAX } else { 0 },
                until_reset: Duration::ZERO,
            };
        };
        let refused = self.refused();
        let (remaining, until_reset) = match &self.answer {
            Some(Ok(d)) => (
                u32::try_from(d.remaining()).unwrap_or(u32::MAX),
                d.reset_after(),
            ),
            // Costlier than the burst: empty for this request, full again whenever it is.
            _ => (0, Duration::ZERO),
        };
        Status {
            over_limit: refused && !rule.shadow,
            shadowed: refused && rule.shadow,
            limit: Some((rule.name.clone(), rule.limit)),
            remaining,
            until_reset,
        }
    }
}

/// A descriptor's key within its limit: each entry's value, length first, so that no two
/// value lists meet in one key.
fn subject(entries: &[Entry<'_>]) -> String {
    let mut key = String::with_capacity(entries.iter().map(|e| e.value.len() + 6).sum());
    for e in entries {
        key.push_str(&e.value.len().to_string());
        key.push(':');
        key.push_str(e.value);
    }
    key
}

/// The target the entries reach in `nodes`: a value's own node first, else the key's.
fn lookup<'n>(mut nodes: &'n [Node], entries: &[Entry<'_>]) -> Option<&'n Target> {
    let mut reached = None;
    for e in entries {
        let node = nodes
            .iter()
            .find(|n| n.key == e.key && n.value.as_deref() == Some(e.value))
            .or_else(|| nodes.iter().find(|n| n.key == e.key && n.value.is_none()))?;
        reached = Some(&node.target);
        nodes = &node.children;
    }
    reached
}

fn validate(request: &Request<'_>) -> Result<(), RequestError> {
    let invalid = |why: String| Err(RequestError::Invalid(why));
    if request.domain.is_empty() {
        return invalid("the domain is empty".into());
    }
    if request.items.is_empty() {
        return invalid("the request has no descriptors".into());
    }
    if request.items.len() > MAX_DESCRIPTORS {
        return invalid(alloc::format!("more than {MAX_DESCRIPTORS} descriptors"));
    }
    for (i, item) in request.items.iter().enumerate() {
        if item.entries.is_empty() {
            return invalid(alloc::format!("descriptor {i} has no entries"));
        }
        if item.entries.len() > MAX_ENTRIES {
            return invalid(alloc::format!(
                "descriptor {i} has more than {MAX_ENTRIES} entries"
            ));
        }
        for e in &item.entries {
            if e.key.is_empty() {
                return invalid(alloc::format!(
                    "descriptor {i} has an entry with an empty key"
                ));
            }
            if e.key.len() > MAX_ENTRY_BYTES || e.value.len() > MAX_ENTRY_BYTES {
                return invalid(alloc::format!(
                    "descriptor {i} has a key or value over {MAX_ENTRY_BYTES} bytes"
                ));
            }
        }
    }
    Ok(())
}

/// The rules of `domains`, reusing `old`'s tables by name.
fn build(domains: &[DomainConfig], old: &Rules, max_keys: usize, out: &mut Reloaded) -> Rules {
    let mut rules = Rules::default();
    for d in domains {
        let nodes = nodes(
            &d.descriptors,
            &d.domain,
            old,
            max_keys,
            &mut rules.by_name,
            out,
        );
        rules.domains.insert(d.domain.clone(), nodes);
    }
    rules
}

fn nodes(
    descriptors: &[Descriptor],
    at: &str,
    old: &Rules,
    max_keys: usize,
    by_name: &mut HashMap<String, Arc<Rule>>,
    out: &mut Reloaded,
) -> Vec<Node> {
    descriptors
        .iter()
        .map(|d| {
            let name = config::path(at, &d.key, d.value.as_deref());
            let target = match d.rate_limit {
                None => Target::None,
                Some(RateLimit::Unlimited) => Target::Unlimited,
                Some(limit) => {
                    let rule = rule(&name, limit, d.shadow_mode, old, max_keys, out);
                    by_name.insert(name.clone(), rule.clone());
                    Target::Rule(rule)
                }
            };
            Node {
                key: d.key.clone(),
                value: d.value.clone(),
                target,
                children: nodes(&d.descriptors, &name, old, max_keys, by_name, out),
            }
        })
        .collect()
}

fn rule(
    name: &str,
    limit: RateLimit,
    shadow: bool,
    old: &Rules,
    max_keys: usize,
    out: &mut Reloaded,
) -> Arc<Rule> {
    // Checked before: a limited node has a quota.
    let quota = limit.quota().unwrap_or(Quota::per_second(1));
    let table = match old.by_name.get(name) {
        Some(kept) if kept.limit == limit => {
            out.kept += 1;
            kept.table.clone()
        }
        Some(changed) => {
            out.changed += 1;
            changed.table.set_quota(quota, Carry::Debt);
            changed.table.clone()
        }
        None => {
            out.added += 1;
            Arc::new(Keyed::gcra(quota, max_keys))
        }
    };
    Arc::new(Rule {
        name: name.into(),
        limit,
        shadow,
        table,
    })
}

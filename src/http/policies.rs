//! [`PolicyLayer`]: several policies on one request (per client, per API key, global), decided
//! all or nothing and told in one set of fields.
//!
//! Each policy has its own key source and its own [`Keyed`] table. A request is checked against
//! every policy in order; if any refuses, the tokens the others took are given back before the
//! answer is written, so a refusal by one policy spends nothing from the others. Between the take
//! and the give-back a concurrent request may find those tokens taken: that errs towards refusing,
//! never towards admitting.

use alloc::boxed::Box;
use alloc::sync::Arc;
use alloc::vec::Vec;
use core::hash::Hash;
use core::task::{Context, Poll};

use ::http::{HeaderMap, Request, Response, StatusCode};
use bytes::Bytes;
use tower_layer::Layer;
use tower_service::Service;

use super::fields::{self, Headers, PolicyName, Problem};
use super::future::ResponseFuture;
use super::key::{KeyError, KeyExtractor, MissingKey, RequestHead};
use super::layer::{CostFn, ExemptFn};
use super::policy::{Fields, key_error, written};
use crate::decision::{DecidedBy, Decision};
use crate::keyed::table::Keyed;
use crate::keyed::{KeyEntry, KeyedStore};
use crate::limiter::shared::KeyedLimiter;
use crate::quota::{InsufficientCapacity, Quota};

#[cfg(feature = "redis")]
mod remote;

/// One policy of a [`PolicyLayer`]: a name, a key source and the [`Keyed`] table that holds its
/// quota per key.
///
/// ```
/// use atomic_limiter::http::{GlobalKey, HeaderKey, MissingKey, PeerIp, Policy};
/// use atomic_limiter::{Keyed, Quota};
/// use http::HeaderName;
///
/// let per_client = Policy::new("per-client", PeerIp::new(), Keyed::gcra(Quota::per_second(5), 100_000));
/// let per_key = Policy::new(
///     "per-key",
///     HeaderKey::new(HeaderName::from_static("x-api-key")),
///     Keyed::gcra(Quota::per_minute(600), 100_000),
/// )
/// .missing_key(MissingKey::Skip);
/// let global = Policy::new("global", GlobalKey, Keyed::gcra(Quota::per_second(1000), 1));
/// # let _ = (per_client, per_key, global);
/// ```
pub struct Policy {
    name: Arc<PolicyName>,
    missing: MissingKey,
    check: Check,
    #[cfg(feature = "metrics")]
    metrics: Option<crate::instrument::LimiterMetrics>,
}

impl core::fmt::Debug for Policy {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Policy")
            .field("name", &self.name)
            .field("missing", &self.missing)
            .finish_non_exhaustive()
    }
}

impl Policy {
    /// The policy `name` (as the fields and the problem body name it; characters outside
    /// printable ASCII dropped): each request's key taken by `key`, and held to `table`.
    ///
    /// A global policy is [`GlobalKey`](super::GlobalKey) on a table of one key.
    pub fn new<X, L, M>(name: &str, key: X, table: Keyed<X::Key, L, M>) -> Policy
    where
        X: KeyExtractor,
        L: KeyedLimiter + 'static,
        M: KeyedStore<X::Key, KeyEntry<L>> + Send + Sync + 'static,
    {
        Policy::shared(name, key, Arc::new(table))
    }

    /// [`Policy::new`] on a table shared with other code (to inspect it, or to check it by hand
    /// elsewhere as well).
    pub fn shared<X, L, M>(name: &str, key: X, table: Arc<Keyed<X::Key, L, M>>) -> Policy
    where
        X: KeyExtractor,
        L: KeyedLimiter + 'static,
        M: KeyedStore<X::Key, KeyEntry<L>> + Send + Sync + 'static,
    {
        Policy {
            name: Arc::new(PolicyName::new(name)),
            missing: MissingKey::Reject,
            check: Check::Local(Box::new(Table { key, table })),
            #[cfg(feature = "metrics")]
            metrics: None,
        }
    }

    /// Counts this policy's decisions in `metrics` (feature `metrics`): admitted, near the limit,
    /// refused, a full table, shadowed. A request refused by another policy counts only where it
    /// was refused: what this policy took for it was given back.
    #[cfg(feature = "metrics")]
    pub fn metrics(mut self, metrics: crate::instrument::LimiterMetrics) -> Policy {
        self.metrics = Some(metrics);
        self
    }

    /// What this policy's quota counts, written as `qu` in `RateLimit-Policy` (requests by
    /// default, and then no `qu`).
    pub fn quota_unit(mut self, unit: super::fields::QuotaUnit) -> Policy {
        self.name = Arc::new((*self.name).clone().counting(&unit));
        self
    }

    /// What to do with a request whose key header is absent: answer `400`
    /// ([`MissingKey::Reject`], the default) or leave this policy out of the request's decision
    /// ([`MissingKey::Skip`]). A shared key for such requests is the extractor's to give
    /// ([`HeaderKey::shared_when_missing`](super::HeaderKey::shared_when_missing)).
    pub fn missing_key(mut self, missing: MissingKey) -> Policy {
        self.missing = missing;
        self
    }
}

/// Where a policy is decided.
enum Check {
    /// On the spot, from a local table.
    Local(Box<dyn PolicyCheck>),
    /// By the store, in one call with the request's other policies on the same limiter.
    #[cfg(feature = "redis")]
    Remote(Box<dyn remote::RemoteCheck>),
}

/// A policy's check with its key type erased, so that one layer holds policies keyed apart.
trait PolicyCheck: Send + Sync + 'static {
    /// Takes `cost` for the request's key: the answer and the quota the key is held to.
    fn check(&self, head: &RequestHead<'_>, cost: u32) -> Result<Checked, KeyError>;

    /// Gives back `cost` taken by [`PolicyCheck::check`] for the same request; then the key's
    /// figures, read without taking.
    fn give_back(&self, head: &RequestHead<'_>, cost: u32) -> Option<Decision>;
}

struct Checked {
    answer: Result<Decision, InsufficientCapacity>,
    quota: Quota,
}

struct Table<X: KeyExtractor, L, M> {
    key: X,
    table: Arc<Keyed<X::Key, L, M>>,
}

impl<X, L, M> PolicyCheck for Table<X, L, M>
where
    X: KeyExtractor,
    X::Key: Hash + Eq + Clone,
    L: KeyedLimiter + 'static,
    M: KeyedStore<X::Key, KeyEntry<L>> + Send + Sync + 'static,
{
    fn check(&self, head: &RequestHead<'_>, cost: u32) -> Result<Checked, KeyError> {
        let key = self.key.extract(head)?;
        let answer = self.table.check_key_n(&key, cost);
        Ok(Checked {
            answer,
            quota: self.table.quota_of(&key),
        })
    }

    fn give_back(&self, head: &RequestHead<'_>, cost: u32) -> Option<Decision> {
        // The extractors are pure functions of the head: the same key as the check's.
        let key = self.key.extract(head).ok()?;
        self.table.give_back_key(&key, cost);
        self.table.check_key_n(&key, 0).ok()
    }
}

/// What every clone of a [`PolicyLayer`] and its services shares.
struct Config {
    policies: Vec<Policy>,
    headers: Headers,
    on_allowed: bool,
    problem: bool,
    shadow: bool,
    #[cfg(feature = "grpc")]
    grpc: bool,
    exempt: Option<ExemptFn>,
    cost: Option<CostFn>,
}

/// A [`Layer`] that checks each request against several [`Policy`]s, all or nothing: admitted
/// only if every policy admits, and then spent from each; refused if any refuses, and then
/// nothing is spent from any.
///
/// A refusal is answered `429` (`503` when the refusing policies are all out of table room);
/// it carries every policy checked in `RateLimit-Policy` and `RateLimit` as the draft's lists
/// (draft-ietf-httpapi-ratelimit-headers), the `Retry-After` of the refusing policy that waits
/// longest, and with [`problem_json`](PolicyLayerBuilder::problem_json) a body whose
/// `violated-policies` names every policy that refused.
///
/// ```
/// use atomic_limiter::http::{GlobalKey, HeaderKey, MissingKey, PeerIp, Policy, PolicyLayer};
/// use atomic_limiter::{Keyed, Quota};
/// use http::HeaderName;
///
/// let api_key = HeaderKey::new(HeaderName::from_static("x-api-key"));
/// let limits = PolicyLayer::builder()
///     .policy(Policy::new("per-client", PeerIp::new(), Keyed::gcra(Quota::per_second(5), 100_000)))
///     .policy(Policy::new("per-key", api_key, Keyed::gcra(Quota::per_minute(600), 100_000)).missing_key(MissingKey::Skip))
///     .policy(Policy::new("global", GlobalKey, Keyed::gcra(Quota::per_second(1000), 1)))
///     .build();
/// # let _ = limits;
/// ```
#[derive(Clone)]
pub struct PolicyLayer {
    config: Arc<Config>,
}

impl core::fmt::Debug for PolicyLayer {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("PolicyLayer")
            .field("policies", &self.config.policies)
            .finish_non_exhaustive()
    }
}

impl PolicyLayer {
    /// A builder with no policy yet, IETF fields on refusals, empty bodies and a cost of 1.
    pub fn builder() -> PolicyLayerBuilder {
        PolicyLayerBuilder {
            config: Config {
                policies: Vec::new(),
                headers: Headers::Ietf,
                on_allowed: false,
                problem: false,
                shadow: false,
                #[cfg(feature = "grpc")]
                grpc: false,
                exempt: None,
                cost: None,
            },
        }
    }
}

/// Builds a [`PolicyLayer`].
pub struct PolicyLayerBuilder {
    config: Config,
}

impl core::fmt::Debug for PolicyLayerBuilder {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("PolicyLayerBuilder")
            .field("policies", &self.config.policies)
            .finish_non_exhaustive()
    }
}

impl PolicyLayerBuilder {
    /// Adds a policy; policies are checked, and listed in the fields, in the order added.
    pub fn policy(mut self, policy: Policy) -> Self {
        self.config.policies.push(policy);
        self
    }

    /// Which rate-limit fields responses carry ([`Headers::Ietf`] by default).
    pub fn headers(mut self, headers: Headers) -> Self {
        self.config.headers = headers;
        self
    }

    /// Whether admitted responses carry the fields too (refusals always do); off by default.
    pub fn headers_on_allowed(mut self, on: bool) -> Self {
        self.config.on_allowed = on;
        self
    }

    /// Whether refusals carry an `application/problem+json` body; off by default.
    pub fn problem_json(mut self, on: bool) -> Self {
        self.config.problem = on;
        self
    }

    /// Shadow mode (off by default): every request is decided, given back and counted as when
    /// enforced, and then let through; with
    /// [`headers_on_allowed`](Self::headers_on_allowed) its response carries the fields the
    /// policies would give. A missing key is let through too.
    pub fn shadow(mut self, on: bool) -> Self {
        self.config.shadow = on;
        self
    }

    /// Answers as gRPC statuses (feature `grpc`), as
    /// [`RateLimitLayerBuilder::grpc`](super::RateLimitLayerBuilder::grpc).
    #[cfg(feature = "grpc")]
    pub fn grpc(mut self, on: bool) -> Self {
        self.config.grpc = on;
        self
    }

    /// Requests for which `exempt` is true go through unchecked (none by default), as
    /// [`RateLimitLayerBuilder::exempt`](super::RateLimitLayerBuilder::exempt).
    pub fn exempt(
        mut self,
        exempt: impl Fn(&RequestHead<'_>) -> bool + Send + Sync + 'static,
    ) -> Self {
        self.config.exempt = Some(Box::new(exempt));
        self
    }

    /// The tokens a request costs in every policy (1 by default; 0 only looks).
    pub fn cost(mut self, cost: impl Fn(&RequestHead<'_>) -> u32 + Send + Sync + 'static) -> Self {
        self.config.cost = Some(Box::new(cost));
        self
    }

    /// The layer.
    pub fn build(self) -> PolicyLayer {
        PolicyLayer {
            config: Arc::new(self.config),
        }
    }
}

impl<S> Layer<S> for PolicyLayer {
    type Service = PolicyService<S>;

    fn layer(&self, inner: S) -> PolicyService<S> {
        PolicyService {
            inner,
            config: self.config.clone(),
        }
    }
}

/// The service a [`PolicyLayer`] makes.
#[derive(Clone)]
pub struct PolicyService<S> {
    inner: S,
    config: Arc<Config>,
}

impl<S> core::fmt::Debug for PolicyService<S> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("PolicyService").finish_non_exhaustive()
    }
}

impl<S, ReqB, ResB> Service<Request<ReqB>> for PolicyService<S>
where
    S: Service<Request<ReqB>, Response = Response<ResB>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ReqB: Send + 'static,
    ResB: From<Bytes> + Send + 'static,
{
    type Response = Response<ResB>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future, ResB, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // Never pending on a quota: a refusal is an answer, not back-pressure.
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqB>) -> Self::Future {
        let config = &*self.config;
        let head = RequestHead::of(&request);
        if config.exempt.as_ref().is_some_and(|exempt| exempt(&head)) {
            return ResponseFuture::inner(self.inner.call(request), None);
        }
        let cost = config.cost.as_ref().map_or(1, |cost| cost(&head));
        let mut wanted = Vec::new();
        let decided = match config.take(&head, cost, &mut wanted) {
            // Every local policy admitted and some are the store's: decided after its answer.
            #[cfg(feature = "redis")]
            Ok(parts) if !wanted.is_empty() && !parts.iter().any(Part::refused) => {
                return self.remote(request, cost, parts, wanted);
            }
            Ok(parts) => config.conclude(&head, cost, parts),
            Err(answer) => Err(answer),
        };
        let _ = &mut wanted;
        match decided {
            Ok(fields) => ResponseFuture::inner(self.inner.call(request), fields),
            Err(answer) => ResponseFuture::answer(answer),
        }
    }
}

/// One policy's part in a request's decision: the policy's index in the layer, its answer and
/// the quota the key is held to.
struct Part {
    index: usize,
    answer: Result<Decision, InsufficientCapacity>,
    quota: Quota,
}

impl Part {
    fn refused(&self) -> bool {
        !self.answer.as_ref().is_ok_and(Decision::is_allowed)
    }
}

/// A policy the store decides, for one request: its index, and the request's subject.
type Wanted = (usize, alloc::string::String);

impl Config {
    /// Takes the request's cost from every local policy, in order, and notes the subjects of the
    /// store's policies in `wanted`: the parts decided so far, or the layer's answer for a key
    /// that is missing (what was taken given back).
    fn take<B: From<Bytes>>(
        &self,
        head: &RequestHead<'_>,
        cost: u32,
        wanted: &mut Vec<Wanted>,
    ) -> Result<Vec<Part>, Box<Response<B>>> {
        let mut parts: Vec<Part> = Vec::with_capacity(self.policies.len());
        for (index, policy) in self.policies.iter().enumerate() {
            let checked = match &policy.check {
                Check::Local(check) => check.check(head, cost).map(|Checked { answer, quota }| {
                    parts.push(Part {
                        index,
                        answer,
                        quota,
                    });
                }),
                #[cfg(feature = "redis")]
                Check::Remote(check) => check.subject(head).map(|s| wanted.push((index, s))),
            };
            match checked {
                Ok(()) => {}
                Err(KeyError::MissingHeader(_)) if policy.missing == MissingKey::Skip => {}
                Err(_) if self.shadow => {}
                Err(error) => {
                    self.give_back(head, cost, &mut parts);
                    #[cfg(feature = "grpc")]
                    if self.grpc {
                        return Err(super::grpc::key_error(&error));
                    }
                    return Err(key_error(&error));
                }
            }
        }
        let _ = wanted;
        Ok(parts)
    }

    /// The request's decision over the policies' `parts` (in the layer's order): `Ok` with the
    /// fields for its response, or the layer's answer, what was taken then given back.
    fn conclude<B: From<Bytes>>(
        &self,
        head: &RequestHead<'_>,
        cost: u32,
        mut parts: Vec<Part>,
    ) -> Result<Option<Box<Fields>>, Box<Response<B>>> {
        let refused_any = parts.iter().any(Part::refused);
        self.count(&parts, refused_any);
        if self.shadow && refused_any {
            // Given back as an enforced refusal would, then let through with what it would say.
            self.give_back(head, cost, &mut parts);
            for part in &mut parts {
                let answer = core::mem::replace(&mut part.answer, Ok(Decision::never(0)));
                part.answer = Ok(crate::shadow::shadowed(answer));
            }
        }
        if self.shadow || !refused_any {
            if !self.on_allowed || self.headers == Headers::None {
                return Ok(None);
            }
            return Ok(Some(Box::new(self.fields(&parts))));
        }
        // Refused by some: every refusal is named, and nothing is spent from the others.
        let violated: Vec<&PolicyName> = parts
            .iter()
            .filter(|p| p.refused())
            .map(|p| &*self.policies[p.index].name)
            .collect();
        let too_costly = parts.iter().find_map(|p| p.answer.as_ref().err().copied());
        let refusals = || {
            parts
                .iter()
                .filter_map(|p| p.answer.as_ref().ok())
                .filter(|d| !d.is_allowed())
        };
        let unavailable =
            |d: &Decision| d.is_table_full() || d.decided_by() == DecidedBy::FailClosed;
        let status = if too_costly.is_none() && refusals().all(unavailable) {
            StatusCode::SERVICE_UNAVAILABLE
        } else {
            StatusCode::TOO_MANY_REQUESTS
        };
        let retry = refusals()
            .map(Decision::retry_after)
            .max()
            .unwrap_or_default();
        let retry_secs = refusals()
            .map(Decision::retry_after_secs)
            .max()
            .unwrap_or(0)
            .max(1);
        self.give_back(head, cost, &mut parts);
        let mut out = HeaderMap::new();
        let problem = match too_costly {
            // No `Retry-After`: no wait makes this request pass.
            Some(e) => Problem::TooCostly {
                cost: e.requested,
                burst: e.burst,
            },
            None => {
                fields::retry_after_secs(&mut out, retry_secs);
                if status == StatusCode::SERVICE_UNAVAILABLE {
                    Problem::ReducedCapacity { retry_secs, retry }
                } else {
                    Problem::QuotaExceeded { retry_secs, retry }
                }
            }
        };
        if too_costly.is_none() && status == StatusCode::TOO_MANY_REQUESTS {
            if let Fields::Many { headers, items } = self.fields(&parts) {
                fields::write_many(&mut out, headers, &items);
            }
        }
        Err(self.answer(status, problem, &violated, out))
    }

    /// Counts each policy's decision in its metrics, if it has any: a refusal where it refused
    /// (shadowed in shadow mode), an admission only where the request goes through (one given
    /// back is not an admission).
    fn count(&self, parts: &[Part], refused_any: bool) {
        #[cfg(feature = "metrics")]
        for part in parts {
            let Some(metrics) = &self.policies[part.index].metrics else {
                continue;
            };
            match &part.answer {
                Ok(d) if d.is_allowed() => {
                    if self.shadow || !refused_any {
                        metrics.record(d);
                    }
                }
                Ok(d) if self.shadow => metrics.record(&d.shadow()),
                Err(e) if self.shadow => metrics.record(&Decision::never(e.burst).shadow()),
                answer => metrics.record_answer(answer),
            }
        }
        let _ = (parts, refused_any);
    }

    /// Gives back what the admitting local policies took, and puts their figures after it in
    /// place of the admissions. The store's policies took nothing when any of them refused (one
    /// script decides them all or nothing); they are decided only after every local one admits.
    fn give_back(&self, head: &RequestHead<'_>, cost: u32, parts: &mut [Part]) {
        for part in parts.iter_mut() {
            #[cfg_attr(not(feature = "redis"), allow(irrefutable_let_patterns))]
            let Check::Local(check) = &self.policies[part.index].check else {
                continue;
            };
            if part.answer.as_ref().is_ok_and(Decision::is_allowed) {
                if let Some(now) = check.give_back(head, cost) {
                    part.answer = Ok(now);
                }
            }
        }
    }

    fn fields(&self, parts: &[Part]) -> Fields {
        Fields::Many {
            headers: self.headers,
            items: parts
                .iter()
                .filter_map(|p| {
                    let decision = *p.answer.as_ref().ok()?;
                    Some((self.policies[p.index].name.clone(), decision, Some(p.quota)))
                })
                .collect(),
        }
    }

    fn answer<B: From<Bytes>>(
        &self,
        status: StatusCode,
        problem: Problem,
        violated: &[&PolicyName],
        headers: HeaderMap,
    ) -> Box<Response<B>> {
        #[cfg(feature = "grpc")]
        let grpc = self.grpc;
        #[cfg(not(feature = "grpc"))]
        let grpc = false;
        written(status, problem, violated, headers, self.problem, grpc)
    }
}

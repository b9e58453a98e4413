//! [`RateLimitLayer`] and its builder: what every clone of the layer and its services shares.

use super::service::*;
use alloc::boxed::Box;
use alloc::sync::Arc;
use core::time::Duration;

use tower_layer::Layer;

use super::backend::Backend;
use super::fields::{Headers, PolicyName};
use super::key::{KeyExtractor, MissingKey, RequestHead};
use crate::sync::AtomicUsize;

pub(super) type CostFn = Box<dyn Fn(&RequestHead<'_>) -> u32 + Send + Sync>;
pub(super) type ActualFn = Box<dyn Fn(&mut ::http::response::Parts) -> Option<u32> + Send + Sync>;

/// A settlement's two halves: the backend's charge, and where the actual cost is read.
pub(super) struct Settling<K, Be> {
    pub(super) charge: for<'a> fn(&'a Be, &K, u32) -> super::backend::ChargeFuture<'a>,
    pub(super) actual: ActualFn,
}
pub(super) type ExemptFn = Box<dyn Fn(&RequestHead<'_>) -> bool + Send + Sync>;

/// What every clone of the layer and its services shares.
pub(super) struct Config<X: KeyExtractor, Be> {
    pub(super) extractor: X,
    pub(super) backend: Be,
    pub(super) cost: Option<CostFn>,
    /// Charged on the cost, settled from the response.
    pub(super) settle: Option<Settling<X::Key, Be>>,
    pub(super) exempt: Option<ExemptFn>,
    pub(super) missing: MissingKey,
    pub(super) headers: Headers,
    pub(super) on_allowed: bool,
    pub(super) problem: bool,
    #[cfg(feature = "grpc")]
    pub(super) grpc: bool,
    pub(super) shadow: bool,
    #[cfg(feature = "metrics")]
    pub(super) metrics: Option<crate::instrument::LimiterMetrics>,
    pub(super) policy: Arc<PolicyName>,
    pub(super) delay: Option<Duration>,
    pub(super) max_waiting: usize,
    /// Requests asleep in the delay mode now.
    pub(super) waiting: AtomicUsize,
}

impl<X: KeyExtractor, Be> Config<X, Be> {
    /// Whether the exemption picks `request`: out of line, so that a layer without one pays a
    /// load and a branch on its admitted path, and builds no head for it.
    #[inline(never)]
    pub(super) fn is_exempt<B>(&self, request: &::http::Request<B>) -> bool {
        let head = RequestHead::of(request);
        self.exempt.as_ref().is_some_and(|exempt| exempt(&head))
    }
}

/// Builds a [`RateLimitLayer`]: the key, the backend, and how answers are written.
pub struct RateLimitLayerBuilder<X: KeyExtractor, Be> {
    pub(super) config: Config<X, Be>,
}

impl<X: KeyExtractor, Be> core::fmt::Debug for RateLimitLayerBuilder<X, Be> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("RateLimitLayerBuilder")
            .finish_non_exhaustive()
    }
}

impl<X: KeyExtractor, Be: Backend<X::Key>> RateLimitLayerBuilder<X, Be> {
    /// Which rate-limit fields responses carry ([`Headers::Ietf`] by default).
    pub fn headers(mut self, headers: Headers) -> Self {
        self.config.headers = headers;
        self
    }

    /// Whether admitted responses carry the rate-limit fields too (refusals always do); off by
    /// default.
    pub fn headers_on_allowed(mut self, on: bool) -> Self {
        self.config.on_allowed = on;
        self
    }

    /// Whether refusals carry an `application/problem+json` body (RFC 9457, with the draft's
    /// `quota-exceeded` and `temporary-reduced-capacity` types); off by default (empty body).
    pub fn problem_json(mut self, on: bool) -> Self {
        self.config.problem = on;
        self
    }

    /// Answers as gRPC statuses (feature `grpc`; off by default), for a tonic service: a refusal
    /// is `RESOURCE_EXHAUSTED` with the wait as `google.rpc.RetryInfo` in the status details, a
    /// full key table or a store down under a fail-closed policy `UNAVAILABLE`, a missing key
    /// `INVALID_ARGUMENT`; the rate-limit fields ride along as metadata. A tonic client reads the
    /// wait back with `tonic_types::StatusExt::get_details_retry_info`.
    #[cfg(feature = "grpc")]
    pub fn grpc(mut self, on: bool) -> Self {
        self.config.grpc = on;
        self
    }

    /// Shadow mode (off by default): every request is decided and counted as usual, and then let
    /// through, refusals included (as are requests whose key cannot be read, and those above the
    /// burst); nothing waits in the delay mode. With [`headers_on_allowed`](Self::headers_on_allowed)
    /// the responses carry the fields the limit would give, so a new limit can be watched from
    /// the client side before it is enforced.
    pub fn shadow(mut self, on: bool) -> Self {
        self.config.shadow = on;
        self
    }

    /// Counts every decision the layer acts on in `metrics` (feature `metrics`): admitted,
    /// near the limit, refused, a full table, shadowed. A Redis backend counts its own decisions
    /// when its options have counters: give them to one of the two, not both.
    #[cfg(feature = "metrics")]
    pub fn metrics(mut self, metrics: crate::instrument::LimiterMetrics) -> Self {
        self.config.metrics = Some(metrics);
        self
    }

    /// The policy's name in the `RateLimit` fields (`"default"` by default). Characters outside
    /// printable ASCII are dropped, so the fields always parse.
    pub fn policy_name(mut self, name: &str) -> Self {
        self.config.policy = Arc::new(PolicyName::new(name));
        self
    }

    /// The tokens a request costs (1 by default; 0 lets it through without spending).
    pub fn cost(mut self, cost: impl Fn(&RequestHead<'_>) -> u32 + Send + Sync + 'static) -> Self {
        self.config.cost = Some(Box::new(cost));
        self
    }

    /// Charges each request its [`cost`](Self::cost) as an estimate, and settles its actual cost
    /// from the response: `actual` reads it from the response's head (and may remove what it
    /// read, a header meant for the layer only); `None`, or an error from the inner service,
    /// leaves the charge at its estimate. More than the estimate is owed as debt that later
    /// requests of the key wait out; less comes back (see [`Charge`](crate::Charge)). The backend
    /// must keep what a settlement needs ([`Settle`](super::Settle): a GCRA [`Keyed`](crate::Keyed)
    /// table, or `RedisGcra`). A settled request is never delayed: the delay mode refuses it at
    /// once. A body streamed after the head is not read: a cost known only at its end is
    /// settled by the handler itself (`Keyed::charge_key`).
    ///
    /// # Examples
    ///
    /// An LLM gateway: 10 000 tokens a minute per API key, each request charged the `max_tokens`
    /// it asks for and settled at the count its handler reports in `x-usage-tokens`:
    ///
    /// ```
    /// use atomic_limiter::http::{HeaderKey, QuotaUnit, RateLimitLayer};
    /// use atomic_limiter::{Keyed, Quota};
    /// use http::HeaderName;
    ///
    /// let tokens = Keyed::gcra(Quota::per_minute(10_000), 100_000);
    /// let layer = RateLimitLayer::builder(HeaderKey::new(HeaderName::from_static("x-api-key")), tokens)
    ///     .cost(|head| {
    ///         head.headers()
    ///             .get("x-max-tokens")
    ///             .and_then(|v| v.to_str().ok()?.parse().ok())
    ///             .unwrap_or(1_000)
    ///     })
    ///     .settle_from_header(HeaderName::from_static("x-usage-tokens"))
    ///     .quota_unit(QuotaUnit::Other("tokens".into()))
    ///     .build();
    /// # let _ = layer;
    /// ```
    pub fn settle_from(
        mut self,
        actual: impl Fn(&mut ::http::response::Parts) -> Option<u32> + Send + Sync + 'static,
    ) -> Self
    where
        Be: super::backend::Settle<X::Key>,
    {
        self.config.settle = Some(Settling {
            charge: <Be as super::backend::Settle<X::Key>>::charge,
            actual: Box::new(actual),
        });
        self
    }

    /// [`settle_from`](Self::settle_from) a header of the response holding the actual cost as a
    /// whole number, removed before the response goes on (it is the layer's, not the client's).
    /// A header that is absent or not a number leaves the charge at its estimate.
    pub fn settle_from_header(self, name: ::http::HeaderName) -> Self
    where
        Be: super::backend::Settle<X::Key>,
    {
        self.settle_from(move |parts| {
            let value = parts.headers.remove(&name)?;
            value.to_str().ok()?.trim().parse().ok()
        })
    }

    /// What the quota counts, written as `qu` in `RateLimit-Policy` (requests by default, and
    /// then no `qu`).
    pub fn quota_unit(mut self, unit: super::fields::QuotaUnit) -> Self {
        let named = (*self.config.policy).clone().counting(&unit);
        self.config.policy = Arc::new(named);
        self
    }

    /// Requests for which `exempt` is true go through unchecked and uncounted, with no fields;
    /// none is exempt by default. A CORS preflight, which browsers send without the credentials a
    /// key may be read from, is the usual case:
    ///
    /// ```
    /// # #[cfg(feature = "tower")] {
    /// use atomic_limiter::http::{PeerIp, RateLimitLayer};
    /// use atomic_limiter::{Keyed, Quota};
    ///
    /// let layer = RateLimitLayer::builder(PeerIp::new(), Keyed::gcra(Quota::per_second(5), 10_000))
    ///     .exempt(|head| head.method() == http::Method::OPTIONS || head.uri().path() == "/healthz")
    ///     .build();
    /// # let _ = layer; }
    /// ```
    pub fn exempt(
        mut self,
        exempt: impl Fn(&RequestHead<'_>) -> bool + Send + Sync + 'static,
    ) -> Self {
        self.config.exempt = Some(Box::new(exempt));
        self
    }

    /// What to do with a request whose key header is absent ([`MissingKey::Reject`], `400`, by
    /// default).
    pub fn missing_key(mut self, missing: MissingKey) -> Self {
        self.config.missing = missing;
        self
    }

    /// Waits up to `max_wait` for the quota instead of refusing at once: a refused request sleeps
    /// its retry-after and asks again, and is refused only when the next sleep would pass the
    /// bound. Nothing is taken while it waits, so a request dropped meanwhile (the client went
    /// away) leaves the quota as it was. Needs a tokio runtime (outside one, it refuses at once).
    pub fn delay_up_to(mut self, max_wait: Duration) -> Self {
        self.config.delay = Some(max_wait);
        self
    }

    /// At most this many requests wait at once in the delay mode (1 024 by default); past it, a
    /// request is refused at once, so that a flood of them cannot pile up asleep.
    pub fn max_waiting(mut self, requests: usize) -> Self {
        self.config.max_waiting = requests;
        self
    }

    /// The layer.
    pub fn build(self) -> RateLimitLayer<X, Be> {
        RateLimitLayer {
            config: Arc::new(self.config),
        }
    }
}

/// A [`Layer`] that rate-limits each request by its key: admitted requests go through untouched,
/// refused ones get `429 Too Many Requests` with `Retry-After` and the rate-limit fields; a full
/// key table, or a store that is down under a fail-closed policy, gets `503`.
///
/// Cheap to clone (the state is shared); its services are always ready when the inner one is.
pub struct RateLimitLayer<X: KeyExtractor, Be> {
    pub(super) config: Arc<Config<X, Be>>,
}

impl<X: KeyExtractor, Be> Clone for RateLimitLayer<X, Be> {
    fn clone(&self) -> Self {
        RateLimitLayer {
            config: self.config.clone(),
        }
    }
}

impl<X: KeyExtractor, Be> core::fmt::Debug for RateLimitLayer<X, Be> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("RateLimitLayer").finish_non_exhaustive()
    }
}

impl<X: KeyExtractor, Be: Backend<X::Key>> RateLimitLayer<X, Be> {
    /// A layer with the defaults: IETF fields on refusals, empty bodies, no delay, cost 1.
    pub fn new(extractor: X, backend: Be) -> RateLimitLayer<X, Be> {
        RateLimitLayer::builder(extractor, backend).build()
    }

    /// A builder, for the settings.
    pub fn builder(extractor: X, backend: Be) -> RateLimitLayerBuilder<X, Be> {
        RateLimitLayerBuilder {
            config: Config {
                extractor,
                backend,
                cost: None,
                settle: None,
                exempt: None,
                missing: MissingKey::Reject,
                headers: Headers::Ietf,
                on_allowed: false,
                problem: false,
                #[cfg(feature = "grpc")]
                grpc: false,
                shadow: false,
                #[cfg(feature = "metrics")]
                metrics: None,
                policy: Arc::new(PolicyName::new("default")),
                delay: None,
                max_waiting: 1024,
                waiting: AtomicUsize::new(0),
            },
        }
    }

    /// The backend, to inspect (a [`Keyed`](crate::Keyed) table's size, say).
    pub fn backend(&self) -> &Be {
        &self.config.backend
    }
}

impl<S, X: KeyExtractor, Be> Layer<S> for RateLimitLayer<X, Be> {
    type Service = RateLimitService<S, X, Be>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimitService {
            inner,
            config: self.config.clone(),
        }
    }
}

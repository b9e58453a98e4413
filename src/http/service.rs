//! The layer, the service it wraps around another, and the future of a response.

use alloc::boxed::Box;
use alloc::sync::Arc;
use core::future::Future;
use core::pin::Pin;
use core::task::{Context, Poll};
use core::time::Duration;

use ::http::header::CONTENT_TYPE;
use ::http::{HeaderMap, HeaderValue, Request, Response, StatusCode};
use bytes::Bytes;
use pin_project::pin_project;
use tower_layer::Layer;
use tower_service::Service;

use super::backend::{Backend, Checked};
use super::fields::{self, Headers, PolicyName, Problem};
use super::key::{KeyError, KeyExtractor, RequestHead};
use crate::decision::{DecidedBy, Decision};
use crate::quota::InsufficientCapacity;
use crate::quota::Quota;
use crate::sync::{AtomicUsize, Ordering};

type CostFn = Box<dyn Fn(&RequestHead<'_>) -> u32 + Send + Sync>;

/// What every clone of the layer and its services shares.
struct Config<X, Be> {
    extractor: X,
    backend: Be,
    cost: Option<CostFn>,
    headers: Headers,
    on_allowed: bool,
    problem: bool,
    shadow: bool,
    #[cfg(feature = "metrics")]
    metrics: Option<crate::instrument::LimiterMetrics>,
    policy: Arc<PolicyName>,
    delay: Option<Duration>,
    max_waiting: usize,
    /// Requests asleep in the delay mode now.
    waiting: AtomicUsize,
}

/// Builds a [`RateLimitLayer`]: the key, the backend, and how answers are written.
pub struct RateLimitLayerBuilder<X, Be> {
    config: Config<X, Be>,
}

impl<X, Be> core::fmt::Debug for RateLimitLayerBuilder<X, Be> {
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
pub struct RateLimitLayer<X, Be> {
    config: Arc<Config<X, Be>>,
}

impl<X, Be> Clone for RateLimitLayer<X, Be> {
    fn clone(&self) -> Self {
        RateLimitLayer {
            config: self.config.clone(),
        }
    }
}

impl<X, Be> core::fmt::Debug for RateLimitLayer<X, Be> {
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
                headers: Headers::Ietf,
                on_allowed: false,
                problem: false,
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

impl<S, X, Be> Layer<S> for RateLimitLayer<X, Be> {
    type Service = RateLimitService<S, X, Be>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimitService {
            inner,
            config: self.config.clone(),
        }
    }
}

/// The service a [`RateLimitLayer`] makes.
pub struct RateLimitService<S, X, Be> {
    inner: S,
    config: Arc<Config<X, Be>>,
}

impl<S: Clone, X, Be> Clone for RateLimitService<S, X, Be> {
    fn clone(&self) -> Self {
        RateLimitService {
            inner: self.inner.clone(),
            config: self.config.clone(),
        }
    }
}

impl<S, X, Be> core::fmt::Debug for RateLimitService<S, X, Be> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("RateLimitService").finish_non_exhaustive()
    }
}

/// What a decision leads to: the request goes on (with the fields for its response, if any), or
/// the layer answers it.
///
/// Both boxed, so that a verdict, and the response future it becomes, stay a few words on the
/// admitted path instead of carrying a whole response by value.
enum Verdict<B: From<Bytes>> {
    Pass(Option<Box<Fields>>),
    Answer(Box<Response<B>>),
}

impl<X: KeyExtractor, Be: Backend<X::Key>> Config<X, Be> {
    /// Counts a decision, if the layer has counters.
    #[inline(always)]
    fn count(&self, decision: &Decision) {
        #[cfg(feature = "metrics")]
        if let Some(m) = &self.metrics {
            m.record(decision);
        }
        let _ = decision;
    }

    /// Whether the layer counts its decisions.
    #[inline(always)]
    fn counts(&self) -> bool {
        #[cfg(feature = "metrics")]
        return self.metrics.is_some();
        #[cfg(not(feature = "metrics"))]
        false
    }

    /// Counts a request refused for costing more than the burst, if the layer has counters.
    fn count_too_costly(&self) {
        #[cfg(feature = "metrics")]
        if let Some(m) = &self.metrics {
            m.record_too_costly();
        }
    }

    /// Whether admitted responses get the fields.
    #[inline]
    fn fields_on_allowed(&self) -> bool {
        self.on_allowed && self.headers != Headers::None
    }

    #[inline(never)]
    fn verdict<B: From<Bytes>>(
        &self,
        key: &X::Key,
        answer: Result<Decision, InsufficientCapacity>,
    ) -> Verdict<B> {
        let decision = match answer {
            // As `Shadow` does: a request above the burst becomes a shadowed refusal.
            answer if self.shadow => crate::shadow::shadowed(answer),
            Ok(d) => d,
            Err(e) => {
                self.count_too_costly();
                let problem = Problem::TooCostly {
                    cost: e.requested,
                    burst: e.burst,
                };
                // No `Retry-After`: no wait makes this request pass.
                return Verdict::Answer(self.answer(
                    StatusCode::TOO_MANY_REQUESTS,
                    problem,
                    HeaderMap::new(),
                ));
            }
        };
        self.count(&decision);
        if decision.is_allowed() {
            if !self.fields_on_allowed() {
                return Verdict::Pass(None);
            }
            // Written into the response's own map when it comes.
            return Verdict::Pass(Some(Box::new(Fields {
                decision,
                quota: self.backend.quota(key),
                headers: self.headers,
                policy: self.policy.clone(),
            })));
        }
        let mut out = HeaderMap::new();
        fields::retry_after(&mut out, &decision);
        let retry_secs = decision.retry_after_secs().max(1);
        // A full table and a store refused by policy are the server's limits, not the client's.
        let unavailable =
            decision.is_table_full() || decision.decided_by() == DecidedBy::FailClosed;
        if unavailable {
            let problem = Problem::ReducedCapacity { retry_secs };
            return Verdict::Answer(self.answer(StatusCode::SERVICE_UNAVAILABLE, problem, out));
        }
        let quota = self.backend.quota(key);
        fields::write(
            &mut out,
            self.headers,
            &self.policy,
            &decision,
            quota.as_ref(),
        );
        let problem = Problem::QuotaExceeded { retry_secs };
        Verdict::Answer(self.answer(StatusCode::TOO_MANY_REQUESTS, problem, out))
    }

    /// A response the layer writes itself.
    fn answer<B: From<Bytes>>(
        &self,
        status: StatusCode,
        problem: Problem,
        headers: HeaderMap,
    ) -> Box<Response<B>> {
        let body = if self.problem {
            Bytes::from(fields::problem_json(problem, &self.policy))
        } else {
            Bytes::new()
        };
        let mut response = Response::new(B::from(body));
        *response.status_mut() = status;
        *response.headers_mut() = headers;
        if self.problem {
            response.headers_mut().insert(
                CONTENT_TYPE,
                HeaderValue::from_static("application/problem+json"),
            );
        }
        Box::new(response)
    }

    /// A request with no key: a setup mistake (no peer address) is the server's, a missing
    /// header the client's.
    fn key_error<B: From<Bytes>>(&self, error: &KeyError) -> Box<Response<B>> {
        let status = match error {
            KeyError::NoPeerAddress => StatusCode::INTERNAL_SERVER_ERROR,
            KeyError::MissingHeader(_) | KeyError::HeaderTooLong(_) => StatusCode::BAD_REQUEST,
        };
        let body = Bytes::from(alloc::format!("{error}\n"));
        let mut response = Response::new(B::from(body));
        *response.status_mut() = status;
        response.headers_mut().insert(
            CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        Box::new(response)
    }

    /// How long a refused request sleeps before asking again, if the delay mode lets it.
    fn nap(&self, decision: &Decision, waited: Duration) -> Option<Duration> {
        let max_wait = self.delay?;
        if self.shadow || decision.is_table_full() || decision.decided_by() == DecidedBy::FailClosed
        {
            return None;
        }
        // Sleeping needs tokio's timer; without a runtime there is nothing to sleep on.
        tokio::runtime::Handle::try_current().ok()?;
        let nap = decision.retry_after().max(Duration::from_nanos(1));
        (waited.saturating_add(nap) <= max_wait).then_some(nap)
    }
}

/// A place among the requests asleep in the delay mode, given back when dropped (woken, or the
/// request dropped while asleep).
struct WaitSlot<'a> {
    waiting: &'a AtomicUsize,
}

impl<'a> WaitSlot<'a> {
    fn take<X, Be>(config: &'a Config<X, Be>) -> Option<WaitSlot<'a>> {
        // Relaxed: a count; the bound is all it guards.
        config
            .waiting
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                (n < config.max_waiting).then_some(n + 1)
            })
            .ok()
            .map(|_| WaitSlot {
                waiting: &config.waiting,
            })
    }
}

impl Drop for WaitSlot<'_> {
    fn drop(&mut self) {
        // Relaxed: as in `take`.
        self.waiting.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The rate-limit fields of an admitted request, kept until its response comes.
struct Fields {
    decision: Decision,
    quota: Option<Quota>,
    headers: Headers,
    policy: Arc<PolicyName>,
}

fn with_fields<B>(mut response: Response<B>, fields: Option<Box<Fields>>) -> Response<B> {
    if let Some(f) = fields {
        fields::write(
            response.headers_mut(),
            f.headers,
            &f.policy,
            &f.decision,
            f.quota.as_ref(),
        );
    }
    response
}

impl<S, X, Be, ReqB, ResB> Service<Request<ReqB>> for RateLimitService<S, X, Be>
where
    S: Service<Request<ReqB>, Response = Response<ResB>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ReqB: Send + 'static,
    ResB: From<Bytes> + Send + 'static,
    X: KeyExtractor,
    Be: Backend<X::Key>,
{
    type Response = Response<ResB>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future, ResB, S::Error>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // Never pending on the quota: a refusal is an answer, not back-pressure.
        self.inner.poll_ready(cx)
    }

    #[inline]
    fn call(&mut self, request: Request<ReqB>) -> Self::Future {
        let config = &*self.config;
        let head = RequestHead::of(&request);
        let key = match config.extractor.extract(&head) {
            Ok(key) => key,
            // In shadow mode the request goes on: only a limit is being watched.
            Err(_) if config.shadow => {
                return ResponseFuture::inner(self.inner.call(request), None);
            }
            Err(e) => return ResponseFuture::answer(config.key_error(&e)),
        };
        let cost = config.cost.as_ref().map_or(1, |cost| cost(&head));
        // Admitted on the spot with nothing to add or count: the common path, all inline, and
        // no decision built for it.
        let answer = if config.fields_on_allowed() || config.counts() {
            Some(config.backend.check(&key, cost))
        } else {
            config.backend.admit(&key, cost)
        };
        let Some(answer) = answer else {
            return ResponseFuture::inner(self.inner.call(request), None);
        };
        let checked = match answer {
            // Admitted on the spot with nothing to add.
            Checked::Ready(Ok(ref d)) if d.is_allowed() && !config.fields_on_allowed() => {
                config.count(d);
                return ResponseFuture::inner(self.inner.call(request), None);
            }
            // Decided on the spot, with no delay to wait out: nothing boxed but a refusal's
            // response.
            Checked::Ready(answer)
                if config.delay.is_none() || answer.as_ref().is_ok_and(Decision::is_allowed) =>
            {
                return match config.verdict::<ResB>(&key, answer) {
                    Verdict::Pass(fields) => {
                        ResponseFuture::inner(self.inner.call(request), fields)
                    }
                    Verdict::Answer(response) => ResponseFuture::answer(response),
                };
            }
            checked => checked,
        };
        self.slow(request, key, cost, checked)
    }
}

impl<S, X, Be> RateLimitService<S, X, Be> {
    /// The path through an awaited backend or a delay, out of line: its future holds the request
    /// and the inner service by value, and built in `call` it made the common path copy them.
    #[inline(never)]
    fn slow<ReqB, ResB>(
        &mut self,
        request: Request<ReqB>,
        key: X::Key,
        cost: u32,
        checked: Checked<Be::Future>,
    ) -> ResponseFuture<S::Future, ResB, S::Error>
    where
        S: Service<Request<ReqB>, Response = Response<ResB>> + Clone + Send + 'static,
        S::Future: Send + 'static,
        S::Error: Send + 'static,
        ReqB: Send + 'static,
        ResB: From<Bytes> + Send + 'static,
        X: KeyExtractor,
        Be: Backend<X::Key>,
    {
        // Awaited or delayed: the service made ready is taken along, a clone left in its place.
        let clone = self.inner.clone();
        let mut inner = core::mem::replace(&mut self.inner, clone);
        let config = self.config.clone();
        let mut first = Some(checked);
        let future = async move {
            let mut waited = Duration::ZERO;
            loop {
                let checked = match first.take() {
                    Some(checked) => checked,
                    None => config.backend.check(&key, cost),
                };
                let answer = match checked {
                    Checked::Ready(answer) => answer,
                    Checked::Pending(future) => future.await,
                };
                let nap = match &answer {
                    Ok(decision) if !decision.is_allowed() => config.nap(decision, waited),
                    _ => None,
                };
                let slot = nap.and_then(|nap| Some((nap, WaitSlot::take(&config)?)));
                if let Some((nap, slot)) = slot {
                    tokio::time::sleep(nap).await;
                    // Given back here, or on drop if the request is dropped asleep.
                    drop(slot);
                    waited += nap;
                    continue;
                }
                return match config.verdict::<ResB>(&key, answer) {
                    Verdict::Pass(fields) => {
                        let response = inner.call(request).await?;
                        Ok(with_fields(response, fields))
                    }
                    Verdict::Answer(response) => Ok(*response),
                };
            }
        };
        ResponseFuture {
            state: State::Slow {
                future: Box::pin(future),
            },
        }
    }
}

type SlowFuture<B, E> = Pin<Box<dyn Future<Output = Result<Response<B>, E>> + Send>>;

/// The response future of a [`RateLimitService`].
#[pin_project]
pub struct ResponseFuture<F, B: From<Bytes>, E> {
    #[pin]
    state: State<F, B, E>,
}

#[pin_project(project = StateProj)]
enum State<F, B: From<Bytes>, E> {
    /// The layer's own answer.
    Answer { response: Option<Box<Response<B>>> },
    /// Admitted on the spot: the inner service's response, with the fields added.
    Inner {
        #[pin]
        future: F,
        fields: Option<Box<Fields>>,
    },
    /// Decided by an awaited backend, or after a delay.
    Slow { future: SlowFuture<B, E> },
}

impl<F, B: From<Bytes>, E> ResponseFuture<F, B, E> {
    /// The inner service's response, with `fields` added when it comes.
    #[inline(always)]
    fn inner(future: F, fields: Option<Box<Fields>>) -> Self {
        ResponseFuture {
            state: State::Inner { future, fields },
        }
    }

    fn answer(response: Box<Response<B>>) -> Self {
        ResponseFuture {
            state: State::Answer {
                response: Some(response),
            },
        }
    }
}

impl<F, B: From<Bytes>, E> core::fmt::Debug for ResponseFuture<F, B, E> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}

impl<F, B, E> Future for ResponseFuture<F, B, E>
where
    F: Future<Output = Result<Response<B>, E>>,
    B: From<Bytes>,
{
    type Output = Result<Response<B>, E>;

    #[inline(always)]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().state.project() {
            StateProj::Answer { response } => match response.take() {
                Some(response) => Poll::Ready(Ok(*response)),
                // Polled after it finished: a contract breach by the caller, told plainly.
                None => panic!("ResponseFuture polled after completion"),
            },
            StateProj::Inner { future, fields } => {
                // Untouched unless there are fields to add: the inner poll's answer is returned
                // as it is, not moved through a match (a response is some 100 bytes).
                if fields.is_none() {
                    return future.poll(cx);
                }
                match future.poll(cx) {
                    Poll::Ready(result) => {
                        let fields = fields.take();
                        Poll::Ready(result.map(|response| with_fields(response, fields)))
                    }
                    Poll::Pending => Poll::Pending,
                }
            }
            StateProj::Slow { future } => future.as_mut().poll(cx),
        }
    }
}

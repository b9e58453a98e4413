//! [`RateLimitService`]: the service a layer makes, and its check of each request.

use super::future::*;
use super::layer::*;
use super::policy::*;
use alloc::boxed::Box;
use alloc::sync::Arc;
use core::task::{Context, Poll};
use core::time::Duration;

use ::http::{Request, Response};
use bytes::Bytes;
use tower_service::Service;

use super::backend::{Backend, Checked};
use super::key::{KeyError, KeyExtractor, MissingKey, RequestHead};
use crate::decision::Decision;

/// The service a [`RateLimitLayer`] makes.
pub struct RateLimitService<S, X: KeyExtractor, Be> {
    pub(super) inner: S,
    pub(super) config: Arc<Config<X, Be>>,
}

impl<S: Clone, X: KeyExtractor, Be> Clone for RateLimitService<S, X, Be> {
    fn clone(&self) -> Self {
        RateLimitService {
            inner: self.inner.clone(),
            config: self.config.clone(),
        }
    }
}

impl<S, X: KeyExtractor, Be> core::fmt::Debug for RateLimitService<S, X, Be> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("RateLimitService").finish_non_exhaustive()
    }
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
        if config.exempt.is_some() && config.is_exempt(&request) {
            return self.unchecked(request, None);
        }
        let head = RequestHead::of(&request);
        let key = match config.extractor.extract(&head) {
            Ok(key) => key,
            Err(e) => return self.unchecked(request, Some(e)),
        };
        let cost = config.cost.as_ref().map_or(1, |cost| cost(&head));
        if config.settle.is_some() {
            return self.settled(request, key, cost);
        }
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

impl<S, X: KeyExtractor, Be> RateLimitService<S, X, Be> {
    /// A request let through unchecked (exempt, or its key missing where that is skipped or in
    /// shadow mode), or answered for its missing key. Out of line, as [`Self::slow`]: every
    /// call of the inner service inlined into `call` makes the common path's code larger.
    #[inline(never)]
    fn unchecked<ReqB, ResB>(
        &mut self,
        request: Request<ReqB>,
        error: Option<KeyError>,
    ) -> ResponseFuture<S::Future, ResB, S::Error>
    where
        S: Service<Request<ReqB>, Response = Response<ResB>>,
        ResB: From<Bytes>,
        X: KeyExtractor,
        Be: Backend<X::Key>,
    {
        let config = &*self.config;
        match error {
            // In shadow mode the request goes on: only a limit is being watched.
            Some(_) if config.shadow => {}
            Some(KeyError::MissingHeader(_)) if config.missing == MissingKey::Skip => {}
            Some(e) => return ResponseFuture::answer(config.key_error(&e)),
            None => {}
        }
        ResponseFuture::inner(self.inner.call(request), None)
    }

    /// The path of a request charged on its cost and settled from its response, out of line as
    /// [`Self::slow`].
    #[inline(never)]
    fn settled<ReqB, ResB>(
        &mut self,
        request: Request<ReqB>,
        key: X::Key,
        cost: u32,
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
        let clone = self.inner.clone();
        let mut inner = core::mem::replace(&mut self.inner, clone);
        let config = self.config.clone();
        let future = async move {
            let Some(settling) = &config.settle else {
                return inner.call(request).await;
            };
            let (answer, settlement) = (settling.charge)(&config.backend, &key, cost).await;
            match config.verdict::<ResB>(&key, answer) {
                Verdict::Pass(fields) => {
                    // An error of the inner service drops the settlement: the estimate stands.
                    let response = inner.call(request).await?;
                    let (mut parts, body) = response.into_parts();
                    let actual = (settling.actual)(&mut parts);
                    if let (Some(settle), Some(actual)) = (settlement, actual) {
                        settle(actual).await;
                    }
                    Ok(with_fields(Response::from_parts(parts, body), fields))
                }
                Verdict::Answer(response) => Ok(*response),
            }
        };
        ResponseFuture {
            state: State::Slow {
                future: Box::pin(future),
            },
        }
    }

    /// The path through an awaited backend or a delay, out of line: its future holds the request
    /// and the inner service by value, and built in `call` it made the common path copy them.
    #[inline(never)]
    pub(super) fn slow<ReqB, ResB>(
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

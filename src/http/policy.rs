//! What a decision leads to: the verdict, the layer's own answers, the counts and the delay mode.

use super::layer::*;
use alloc::boxed::Box;
use alloc::sync::Arc;
use alloc::vec::Vec;
use core::time::Duration;

use ::http::header::CONTENT_TYPE;
use ::http::{HeaderMap, HeaderValue, Response, StatusCode};
use bytes::Bytes;

use super::backend::Backend;
use super::fields::{self, Headers, PolicyName, Problem};
use super::key::{KeyError, KeyExtractor};
use crate::decision::{DecidedBy, Decision};
use crate::quota::InsufficientCapacity;
use crate::quota::Quota;
use crate::sync::{AtomicUsize, Ordering};

/// What a decision leads to: the request goes on (with the fields for its response, if any), or
/// the layer answers it.
///
/// Both boxed, so that a verdict, and the response future it becomes, stay a few words on the
/// admitted path instead of carrying a whole response by value.
pub(super) enum Verdict<B: From<Bytes>> {
    Pass(Option<Box<Fields>>),
    Answer(Box<Response<B>>),
}

impl<X: KeyExtractor, Be: Backend<X::Key>> Config<X, Be> {
    /// Counts a decision, if the layer has counters.
    #[inline(always)]
    pub(super) fn count(&self, decision: &Decision) {
        #[cfg(feature = "metrics")]
        if let Some(m) = &self.metrics {
            m.record(decision);
        }
        let _ = decision;
    }

    /// Whether the layer counts its decisions.
    #[inline(always)]
    pub(super) fn counts(&self) -> bool {
        #[cfg(feature = "metrics")]
        return self.metrics.is_some();
        #[cfg(not(feature = "metrics"))]
        false
    }

    /// Counts a request refused for costing more than the burst, if the layer has counters.
    pub(super) fn count_too_costly(&self) {
        #[cfg(feature = "metrics")]
        if let Some(m) = &self.metrics {
            m.record_too_costly();
        }
    }

    /// Whether admitted responses get the fields.
    #[inline]
    pub(super) fn fields_on_allowed(&self) -> bool {
        self.on_allowed && self.headers != Headers::None
    }

    #[inline(never)]
    pub(super) fn verdict<B: From<Bytes>>(
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
            return Verdict::Pass(Some(Box::new(Fields::One {
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
            let retry = decision.retry_after();
            let problem = Problem::ReducedCapacity { retry_secs, retry };
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
        let retry = decision.retry_after();
        let problem = Problem::QuotaExceeded { retry_secs, retry };
        Verdict::Answer(self.answer(StatusCode::TOO_MANY_REQUESTS, problem, out))
    }

    /// A response the layer writes itself.
    pub(super) fn answer<B: From<Bytes>>(
        &self,
        status: StatusCode,
        problem: Problem,
        headers: HeaderMap,
    ) -> Box<Response<B>> {
        #[cfg(feature = "grpc")]
        let grpc = self.grpc;
        #[cfg(not(feature = "grpc"))]
        let grpc = false;
        written(
            status,
            problem,
            &[&self.policy],
            headers,
            self.problem,
            grpc,
        )
    }

    /// A request with no key: a setup mistake (no peer address) is the server's, a missing
    /// header the client's.
    pub(super) fn key_error<B: From<Bytes>>(&self, error: &KeyError) -> Box<Response<B>> {
        #[cfg(feature = "grpc")]
        if self.grpc {
            return super::grpc::key_error(error);
        }
        key_error(error)
    }

    /// How long a refused request sleeps before asking again, if the delay mode lets it.
    pub(super) fn nap(&self, decision: &Decision, waited: Duration) -> Option<Duration> {
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

/// A response a layer writes itself, for a refusal by the policies `violated`: a gRPC status
/// when `grpc`, else `status` with `headers` and, when `problem_body`, the problem details.
pub(super) fn written<B: From<Bytes>>(
    status: StatusCode,
    problem: Problem,
    violated: &[&PolicyName],
    headers: HeaderMap,
    problem_body: bool,
    grpc: bool,
) -> Box<Response<B>> {
    #[cfg(feature = "grpc")]
    if grpc {
        return super::grpc::refusal(problem, headers);
    }
    let _ = grpc;
    let body = if problem_body {
        Bytes::from(fields::problem_json(problem, violated))
    } else {
        Bytes::new()
    };
    let mut response = Response::new(B::from(body));
    *response.status_mut() = status;
    *response.headers_mut() = headers;
    if problem_body {
        response.headers_mut().insert(
            CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
    }
    Box::new(response)
}

/// The answer to a request with no key: a setup mistake (no peer address) is the server's
/// (`500`), a missing or oversized header the client's (`400`).
pub(super) fn key_error<B: From<Bytes>>(error: &KeyError) -> Box<Response<B>> {
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

/// A place among the requests asleep in the delay mode, given back when dropped (woken, or the
/// request dropped while asleep).
pub(super) struct WaitSlot<'a> {
    pub(super) waiting: &'a AtomicUsize,
}

impl<'a> WaitSlot<'a> {
    pub(super) fn take<X: KeyExtractor, Be>(config: &'a Config<X, Be>) -> Option<WaitSlot<'a>> {
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
pub(super) enum Fields {
    /// One layer's one policy.
    One {
        decision: Decision,
        quota: Option<Quota>,
        headers: Headers,
        policy: Arc<PolicyName>,
    },
    /// Every policy of a [`PolicyLayer`](super::PolicyLayer), in order.
    Many {
        headers: Headers,
        items: Vec<(Arc<PolicyName>, Decision, Option<Quota>)>,
    },
}

pub(super) fn with_fields<B>(
    mut response: Response<B>,
    fields: Option<Box<Fields>>,
) -> Response<B> {
    match fields.map(|f| *f) {
        None => {}
        Some(Fields::One {
            decision,
            quota,
            headers,
            policy,
        }) => fields::write(
            response.headers_mut(),
            headers,
            &policy,
            &decision,
            quota.as_ref(),
        ),
        Some(Fields::Many { headers, items }) => {
            fields::write_many(response.headers_mut(), headers, &items);
        }
    }
    response
}

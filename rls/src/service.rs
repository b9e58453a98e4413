//! `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit` over the engine, counted.

use std::sync::Arc;
use std::time::{Duration, Instant};

use atomic_limiter::rls::{
    Answer, Engine, Entry, Item, RateLimit, Request, RequestError, Status, Unit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit as PbUnit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit as PbRateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitService;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::Duration as PbDuration;
use tonic::{Response, Status as GrpcStatus};

/// The gRPC service: the engine, and the counters of its decisions.
pub struct Rls {
    pub engine: Arc<Engine>,
}

#[tonic::async_trait]
impl RateLimitService for Rls {
    async fn should_rate_limit(
        &self,
        request: tonic::Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, GrpcStatus> {
        let started = Instant::now();
        let request = request.into_inner();
        let asked = read(&request)?;
        let domain = if self.engine.has_domain(asked.domain) {
            asked.domain
        } else {
            "unconfigured"
        };
        let answer = match self.engine.check(&asked).await {
            Ok(answer) => answer,
            Err(RequestError::Unavailable(why)) => {
                metrics::counter!("rls_store_errors_total", "domain" => domain.to_owned())
                    .increment(1);
                return Err(GrpcStatus::unavailable(why));
            }
            Err(e) => {
                metrics::counter!("rls_invalid_requests_total").increment(1);
                return Err(GrpcStatus::invalid_argument(e.to_string()));
            }
        };
        count(domain, &answer);
        if answer.waited_for_store {
            metrics::counter!("rls_store_round_trips_total", "domain" => domain.to_owned())
                .increment(1);
        }
        metrics::histogram!("rls_decision_seconds").record(started.elapsed().as_secs_f64());
        Ok(Response::new(written(&answer)))
    }
}

/// The request as the engine reads it, borrowed from the message.
fn read(request: &RateLimitRequest) -> Result<Request<'_>, GrpcStatus> {
    let mut items = Vec::with_capacity(request.descriptors.len());
    for (i, d) in request.descriptors.iter().enumerate() {
        if d.is_negative_hits {
            // A refund from the proxy: not taken (it could give back what another took).
            return Err(GrpcStatus::invalid_argument(format!(
                "descriptor {i}: negative hits are not supported"
            )));
        }
        if d.limit.is_some() {
            // Envoy's per-descriptor override: not applied (the configured limit decides), and
            // counted so that an operator sees that proxies send it.
            metrics::counter!("rls_limit_overrides_ignored_total").increment(1);
        }
        items.push(Item {
            entries: d
                .entries
                .iter()
                .map(|e| Entry {
                    key: &e.key,
                    value: &e.value,
                })
                .collect(),
            hits: d.hits_addend.as_ref().map(|h| h.value),
        });
    }
    Ok(Request {
        domain: &request.domain,
        items,
        hits_addend: request.hits_addend,
    })
}

fn written(answer: &Answer) -> RateLimitResponse {
    RateLimitResponse {
        overall_code: if answer.over_limit {
            Code::OverLimit
        } else {
            Code::Ok
        } as i32,
        statuses: answer.statuses.iter().map(status).collect(),
        ..RateLimitResponse::default()
    }
}

fn status(s: &Status) -> DescriptorStatus {
    DescriptorStatus {
        code: if s.over_limit {
            Code::OverLimit
        } else {
            Code::Ok
        } as i32,
        current_limit: s.limit.as_ref().and_then(|(name, limit)| match *limit {
            RateLimit::Limited {
                unit,
                requests_per_unit,
                ..
            } => Some(PbRateLimit {
                name: name.clone(),
                requests_per_unit,
                unit: unit_of(unit) as i32,
            }),
            _ => None,
        }),
        limit_remaining: s.remaining,
        duration_until_reset: s.limit.as_ref().map(|_| duration(s.until_reset)),
        quota: None,
    }
}

fn unit_of(unit: Unit) -> PbUnit {
    match unit {
        Unit::Second => PbUnit::Second,
        Unit::Minute => PbUnit::Minute,
        Unit::Hour => PbUnit::Hour,
        Unit::Day => PbUnit::Day,
        Unit::Week => PbUnit::Week,
        _ => PbUnit::Unknown,
    }
}

/// Whole nanoseconds as the protocol's duration (a reset is at most a week away).
fn duration(d: Duration) -> PbDuration {
    PbDuration {
        seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        nanos: i32::try_from(d.subsec_nanos()).unwrap_or(0),
    }
}

/// Counts each limited descriptor's outcome, by domain and limit name (both bounded by the
/// configuration, never by a request's values).
fn count(domain: &str, answer: &Answer) {
    for s in &answer.statuses {
        let Some((name, _)) = &s.limit else { continue };
        let outcome = if s.shadowed {
            "shadowed"
        } else if s.over_limit {
            "over_limit"
        } else if answer.over_limit {
            // Had room, and gave it back: another descriptor refused the request.
            "given_back"
        } else {
            "ok"
        };
        metrics::counter!(
            "rls_descriptors_total",
            "domain" => domain.to_owned(),
            "limit" => name.clone(),
            "outcome" => outcome,
        )
        .increment(1);
    }
    let overall = if answer.over_limit {
        "over_limit"
    } else {
        "ok"
    };
    metrics::counter!("rls_requests_total", "domain" => domain.to_owned(), "code" => overall)
        .increment(1);
}

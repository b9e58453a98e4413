//! The layer's own answers as gRPC statuses, for tonic services (feature `grpc`): a gRPC client
//! reads a refusal from `grpc-status`, not from an HTTP `429` inside a response it cannot parse.
//!
//! | the layer's answer | gRPC status | details |
//! |---|---|---|
//! | over the quota | `RESOURCE_EXHAUSTED` | `google.rpc.RetryInfo`: the exact wait |
//! | costs more than the quota ever holds | `RESOURCE_EXHAUSTED` | none: no wait would help |
//! | the key table is full, or the store is down and the policy fails closed | `UNAVAILABLE` | `RetryInfo` |
//! | no peer address (a setup mistake) | `INTERNAL` | |
//! | the key's header (metadata) is missing or too long | `INVALID_ARGUMENT` | |
//!
//! The rate-limit fields and `retry-after` ride along as response metadata, as on HTTP.

use alloc::boxed::Box;
use alloc::format;
use alloc::string::ToString;

use ::http::{HeaderMap, Response};
use bytes::Bytes;
use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt};

use super::fields::Problem;
use super::key::KeyError;

/// A trailers-only gRPC response for `problem`, `headers` (the rate-limit fields) as its metadata.
pub(crate) fn refusal<B: From<Bytes>>(problem: Problem, headers: HeaderMap) -> Box<Response<B>> {
    let status = match problem {
        Problem::QuotaExceeded { retry_secs, retry } => Status::with_error_details(
            Code::ResourceExhausted,
            format!("rate limited: retry in {retry_secs} s"),
            ErrorDetails::with_retry_info(Some(retry)),
        ),
        Problem::TooCostly { cost, burst } => Status::new(
            Code::ResourceExhausted,
            format!("this request costs {cost}; the quota never holds more than {burst} at once"),
        ),
        Problem::ReducedCapacity { retry_secs, retry } => Status::with_error_details(
            Code::Unavailable,
            format!("rate limiter at capacity: retry in {retry_secs} s"),
            ErrorDetails::with_retry_info(Some(retry)),
        ),
    };
    respond(status, headers)
}

/// A request with no key, as a gRPC status.
pub(crate) fn key_error<B: From<Bytes>>(error: &KeyError) -> Box<Response<B>> {
    let code = match error {
        KeyError::NoPeerAddress => Code::Internal,
        KeyError::MissingHeader(_) | KeyError::HeaderTooLong(_) => Code::InvalidArgument,
    };
    respond(Status::new(code, error.to_string()), HeaderMap::new())
}

fn respond<B: From<Bytes>>(status: Status, metadata: HeaderMap) -> Box<Response<B>> {
    let (mut parts, ()) = status.into_http::<()>().into_parts();
    for (name, value) in &metadata {
        parts.headers.append(name, value.clone());
    }
    Box::new(Response::from_parts(parts, B::from(Bytes::new())))
}

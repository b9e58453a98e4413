//! A tower layer for HTTP services (axum, hyper, tonic): each request is checked against its
//! client's quota; admitted requests go through untouched, refused ones are answered
//! `429 Too Many Requests` with an honest `Retry-After` and the IETF `RateLimit` fields. Behind
//! the `tower` feature (tower 0.5, http 1).
//!
//! # The pieces
//!
//! * [`RateLimitLayer`]: the [`Layer`](tower_layer::Layer); [`RateLimitLayer::builder`] sets which
//!   fields responses carry ([`Headers`]), whether admitted responses carry them too, an
//!   `application/problem+json` body, a cost per request, and a delay mode.
//! * A key per request ([`KeyExtractor`]): the peer address, IPv6 grouped by `/64`
//!   ([`PeerIp`]); the client behind trusted reverse proxies, the chain read from its right end
//!   ([`ForwardedIp`]); a header such as an API key ([`HeaderKey`]); one key for all
//!   ([`GlobalKey`]); or any function of the request's head.
//! * A [`Backend`] that decides: a [`Keyed`](crate::Keyed) table of any local limiter (bounded
//!   memory, a quota per key), or with the `redis` feature a
//!   `redis::RedisGcra` (one quota per key across nodes) or a
//!   `redis::Leased` (one global quota across nodes, spent locally).
//!
//! # What a response says
//!
//! | case | status | fields |
//! |---|---|---|
//! | admitted | the service's | the rate-limit fields, when [`headers_on_allowed`](RateLimitLayerBuilder::headers_on_allowed) |
//! | over the quota | `429` | `Retry-After`, `RateLimit-Policy`, `RateLimit` (or the legacy `X-RateLimit-*`) |
//! | costs more than the quota ever holds | `429` | no `Retry-After`: no wait would help |
//! | the key table is full, or the store is down and the policy fails closed | `503` | `Retry-After` |
//! | no key (no peer address: `500`; no such header: `400`) | `500`, `400` | none |
//!
//! `Retry-After` is in whole seconds rounded **up** (400 ms is `1`, never `0`), and a refusal's
//! `RateLimit` names the same instant in its `t`, so that `Retry-After` is never earlier than the
//! reset beside it. A client that waits it out is not refused again unless other requests of its
//! key took the tokens meanwhile.
//!
//! # Example
//!
//! Five requests per second per client address, with axum (the `axum` feature reads the peer
//! address from axum's `ConnectInfo`):
//!
//! ```no_run
//! # #[cfg(feature = "axum")]
//! # async fn run() -> std::io::Result<()> {
//! use atomic_limiter::http::{PeerIp, RateLimitLayer};
//! use atomic_limiter::{Keyed, Quota};
//! use axum::{Router, routing::get};
//! use std::net::SocketAddr;
//!
//! let limit = RateLimitLayer::new(PeerIp::new(), Keyed::gcra(Quota::per_second(5), 100_000));
//! let app = Router::new().route("/", get(|| async { "hello\n" })).layer(limit);
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
//! axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>()).await
//! # }
//! ```
//!
//! A refusal, through `curl -i`:
//!
//! ```text
//! HTTP/1.1 429 Too Many Requests
//! retry-after: 1
//! ratelimit-policy: "default";q=5;w=1
//! ratelimit: "default";r=0;t=1
//! ```

mod backend;
mod fields;
mod future;
#[cfg(feature = "grpc")]
mod grpc;
mod key;
mod layer;
mod policies;
mod policy;
mod service;

pub use self::backend::{Backend, ChargeFuture, Checked, Settle, Settlement};
#[cfg(feature = "redis")]
pub use self::backend::{StoreFuture, Subject};
pub use self::fields::{Headers, QuotaUnit};
pub use self::future::ResponseFuture;
pub use self::key::{
    ForwardedIp, GlobalKey, HeaderKey, InvalidRange, IpKey, KeyError, KeyExtractor, MissingKey,
    PeerIp, ProxyHeader, RequestHead,
};
pub use self::layer::{RateLimitLayer, RateLimitLayerBuilder};
pub use self::policies::{Policy, PolicyLayer, PolicyLayerBuilder, PolicyService};
pub use self::service::RateLimitService;

#[cfg(test)]
mod tests;

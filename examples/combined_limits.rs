//! Three limits on one request, in one layer: per client address (behind a reverse proxy when
//! `TRUSTED_PROXIES` says so), per API key from the `x-api-key` header (requests without one are
//! held by the other two), and globally. All or nothing: a refusal by one spends nothing from the
//! others, and a refusal lists all three in its `RateLimit` fields.
//!
//! ```text
//! cargo run --example combined_limits --features tower,axum
//! curl -i -H 'x-api-key: k1' http://127.0.0.1:3000/
//! ```
//!
//! `PORT` picks another port; `TRUSTED_PROXIES=127.0.0.1/32` behind an nginx on this host.

use std::net::SocketAddr;

use atomic_limiter::http::{ForwardedIp, GlobalKey, HeaderKey, MissingKey, Policy, PolicyLayer};
use atomic_limiter::{Keyed, Quota};
use axum::http::HeaderName;
use axum::{Router, routing::get};

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let proxies = std::env::var("TRUSTED_PROXIES").unwrap_or_default();
    let client = ForwardedIp::parse(&proxies).map_err(std::io::Error::other)?;
    let api_key = HeaderKey::new(HeaderName::from_static("x-api-key"));
    let limits = PolicyLayer::builder()
        .policy(Policy::new(
            "per-client",
            client,
            Keyed::gcra(Quota::per_second(5), 100_000),
        ))
        .policy(
            Policy::new(
                "per-key",
                api_key,
                Keyed::gcra(Quota::per_minute(100), 100_000),
            )
            .missing_key(MissingKey::Skip),
        )
        // A global limit is one key: a table of one.
        .policy(Policy::new(
            "global",
            GlobalKey,
            Keyed::gcra(Quota::per_second(1000), 1),
        ))
        .headers_on_allowed(true)
        .build();
    let app = Router::new()
        .route("/", get(|| async { "hello\n" }))
        .layer(limits);

    let port = std::env::var("PORT")
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(3000);
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    println!(
        "Listening on http://{}/ : 5/s per client, 100/min per API key, 1000/s in all.",
        listener.local_addr()?
    );
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await
}

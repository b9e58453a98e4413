//! A hello-world axum server behind the rate-limiting layer: 5 requests per second per client
//! address, with the IETF `RateLimit` fields on every response and a problem body on refusals.
//!
//! ```text
//! cargo run --example axum_server --features tower,axum
//! curl -i http://127.0.0.1:3000/        # again and again: the sixth in a second gets a 429
//! ```
//!
//! `PORT` picks another port. Behind a reverse proxy, `TRUSTED_PROXIES` names the proxies'
//! addresses (comma-separated CIDRs, `127.0.0.1/32` for an nginx on the same host; empty or
//! absent: trust none), and each client is then keyed by the address its proxy appended to
//! `X-Forwarded-For`. Stop it with Ctrl-C.

use std::net::SocketAddr;

use atomic_limiter::http::{ForwardedIp, Headers, IpKey, RateLimitLayer};
use atomic_limiter::{Gcra, Keyed, Quota};
use axum::Router;
use axum::routing::get;

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let port: u16 = std::env::var("PORT")
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(3000);
    let trusted = std::env::var("TRUSTED_PROXIES").unwrap_or_default();
    let key = ForwardedIp::parse(&trusted)
        .map_err(|e| std::io::Error::other(format!("TRUSTED_PROXIES: {e}")))?;
    let behind = match trusted.trim() {
        "" => "client address".to_owned(),
        list => format!("client behind the proxies at {list}"),
    };
    // One GCRA per client (IPv6 grouped by /64), at most 100 000 held. With no trusted proxy
    // the key is the peer address.
    let per_client: Keyed<IpKey, Gcra> = Keyed::gcra(Quota::per_second(5), 100_000);
    let limit = RateLimitLayer::builder(key, per_client)
        .headers(Headers::Ietf)
        .headers_on_allowed(true)
        .problem_json(true)
        .build();
    let app = Router::new()
        .route("/", get(|| async { "hello\n" }))
        .layer(limit);

    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    println!(
        "Listening on http://{}/ : 5 requests per second per {behind}.",
        listener.local_addr()?
    );
    println!("Try it:  for i in 1 2 3 4 5 6; do curl -si http://127.0.0.1:{port}/ | head -1; done");
    println!("The sixth is refused with 429 and a Retry-After in whole seconds. Ctrl-C stops.");
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown(async {
        let _ = tokio::signal::ctrl_c().await;
    })
    .await
}

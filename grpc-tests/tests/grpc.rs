//! A refusal through tonic is a gRPC status: a real tonic server (tonic's health service, behind
//! the layer in an axum router) and a real tonic client on loopback.

#[path = "../../tests/common/axum_serve.rs"]
mod axum_serve;

use std::net::SocketAddr;
use std::time::Duration;

use atomic_limiter::http::{HeaderKey, RateLimitLayer};
use atomic_limiter::{Keyed, Quota};
use axum::http::HeaderName;
use tonic::Code;
use tonic::transport::Channel;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;
use tonic_types::StatusExt;

/// The health service behind a layer keyed by the `x-tenant` metadata: `QUOTA` an hour per
/// tenant, at most `max_keys` tenants held.
async fn serve(max_keys: usize) -> SocketAddr {
    let (_reporter, health) = tonic_health::server::health_reporter();
    let key = HeaderKey::new(HeaderName::from_static("x-tenant"));
    let layer = RateLimitLayer::builder(key, Keyed::gcra(Quota::per_hour(QUOTA), max_keys))
        .grpc(true)
        .build();
    let app = tonic::service::Routes::new(health)
        .into_axum_router()
        .layer(layer);
    axum_serve::serve(app).await
}

const QUOTA: u64 = 3;

async fn client(addr: SocketAddr) -> HealthClient<Channel> {
    let channel = Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    HealthClient::new(channel)
}

async fn check(
    client: &mut HealthClient<Channel>,
    tenant: Option<&str>,
) -> Result<(), tonic::Status> {
    let mut request = tonic::Request::new(HealthCheckRequest {
        service: String::new(),
    });
    if let Some(tenant) = tenant {
        request
            .metadata_mut()
            .insert("x-tenant", tenant.parse().unwrap());
    }
    client.check(request).await.map(|_| ())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_is_resource_exhausted_with_the_wait_as_retry_info() {
    let addr = serve(100).await;
    let mut c = client(addr).await;
    for i in 0..QUOTA {
        check(&mut c, Some("acme"))
            .await
            .unwrap_or_else(|e| panic!("request {i}: {e:?}"));
    }
    let refusal = check(&mut c, Some("acme")).await.unwrap_err();
    assert_eq!(refusal.code(), Code::ResourceExhausted, "{refusal:?}");
    let delay = refusal
        .get_details_retry_info()
        .and_then(|info| info.retry_delay)
        .expect("RetryInfo in the status details");
    // A token every 20 minutes: the wait is what is left of it, never more.
    assert!(
        delay > Duration::from_secs(19 * 60) && delay <= Duration::from_secs(20 * 60),
        "{delay:?}"
    );
    // The same figures as metadata.
    let metadata = refusal.metadata();
    let retry_after: u64 = metadata
        .get("retry-after")
        .expect("retry-after metadata")
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(
        retry_after,
        delay.as_secs() + u64::from(delay.subsec_nanos() > 0)
    );
    let limit = metadata.get("ratelimit").unwrap().to_str().unwrap();
    assert!(limit.starts_with("\"default\";r=0;t="), "{limit}");
    // Another tenant is not refused.
    check(&mut c, Some("globex")).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_table_is_unavailable_and_a_missing_key_an_invalid_argument() {
    let addr = serve(1).await;
    let mut c = client(addr).await;
    check(&mut c, Some("acme")).await.unwrap();
    // One tenant held, its bucket not full again for 20 minutes: no room for a second.
    let full = check(&mut c, Some("globex")).await.unwrap_err();
    assert_eq!(full.code(), Code::Unavailable, "{full:?}");
    assert!(full.get_details_retry_info().is_some(), "{full:?}");
    let missing = check(&mut c, None).await.unwrap_err();
    assert_eq!(missing.code(), Code::InvalidArgument, "{missing:?}");
}

//! Several policies on one request, the proxy chain read per entry, missing keys and exemptions.

use super::*;
use ::http::HeaderValue;

/// One request through a fresh service of a policy layer.
async fn send_to(layer: &PolicyLayer, request: Request<()>) -> Response<Bytes> {
    let response = layer
        .layer(service_fn(hello))
        .oneshot(request)
        .await
        .unwrap();
    let (parts, body) = response.into_parts();
    let body = body.collect().await.unwrap().to_bytes();
    Response::from_parts(parts, body)
}

fn key_table(quota: Quota, clock: &ManualClock) -> Arc<Table<Vec<u8>>> {
    Arc::new(Keyed::gcra_with_clock(quota, 1000, clock.clone()))
}

fn global_table(quota: Quota, clock: &ManualClock) -> Arc<Table<()>> {
    Arc::new(Keyed::gcra_with_clock(quota, 1, clock.clone()))
}

fn api_key() -> HeaderKey {
    HeaderKey::new(::http::HeaderName::from_static("x-api-key"))
}

#[tokio::test]
async fn a_refusal_by_one_policy_spends_nothing_from_the_others() {
    let clock = ManualClock::new();
    let per_client = table(Quota::per_second(2), 100, &clock);
    let per_key = key_table(Quota::per_second(10), &clock);
    let global = global_table(Quota::per_second(100), &clock);
    let layer = PolicyLayer::builder()
        .policy(Policy::shared(
            "per-client",
            PeerIp::new(),
            per_client.clone(),
        ))
        .policy(Policy::shared("per-key", api_key(), per_key.clone()))
        .policy(Policy::shared("global", GlobalKey, global.clone()))
        .problem_json(true)
        .build();
    let request = || with_header(from("192.0.2.1:1"), "x-api-key", "k1");
    for _ in 0..2 {
        assert_eq!(send_to(&layer, request()).await.status(), StatusCode::OK);
    }
    // The client is out; its key and the global quota must not pay for its refusals.
    for _ in 0..20 {
        let refusal = send_to(&layer, request()).await;
        assert_eq!(refusal.status(), StatusCode::TOO_MANY_REQUESTS);
    }
    let key_left = per_key.check_key_n(&b"k1".to_vec(), 0).unwrap().remaining();
    let global_left = global.check_key_n(&(), 0).unwrap().remaining();
    assert_eq!((key_left, global_left), (8, 98));

    // A refusal lists every policy, the refusing one with r=0, the others as they are.
    let refusal = send_to(&layer, request()).await;
    let policies = sf_list(refusal.headers(), "ratelimit-policy");
    let names: Vec<&str> = policies.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["per-client", "per-key", "global"]);
    assert_eq!(param(&policies[2].1, "q"), Some(100));
    let limits = sf_list(refusal.headers(), "ratelimit");
    assert_eq!(param(&limits[0].1, "r"), Some(0));
    assert_eq!(param(&limits[1].1, "r"), Some(8));
    assert_eq!(param(&limits[2].1, "r"), Some(98));
    assert_eq!(header_u64(refusal.headers(), "retry-after"), 1);
    let body = std::str::from_utf8(refusal.body()).unwrap();
    assert!(
        body.contains(r#""violated-policies":["per-client"]"#),
        "{body}"
    );
}

#[tokio::test]
async fn every_refusing_policy_is_named_and_the_longest_wait_is_told() {
    let clock = ManualClock::new();
    let layer = PolicyLayer::builder()
        .policy(Policy::shared(
            "per-client",
            PeerIp::new(),
            table(Quota::per_second(1), 100, &clock),
        ))
        .policy(Policy::shared(
            "global",
            GlobalKey,
            global_table(Quota::per_minute(1), &clock),
        ))
        .problem_json(true)
        .build();
    assert_eq!(
        send_to(&layer, from("192.0.2.1:1")).await.status(),
        StatusCode::OK
    );
    let refusal = send_to(&layer, from("192.0.2.1:1")).await;
    assert_eq!(refusal.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header_u64(refusal.headers(), "retry-after"), 60);
    let body = std::str::from_utf8(refusal.body()).unwrap();
    assert!(
        body.contains(r#""violated-policies":["per-client","global"]"#),
        "{body}"
    );
    let limits = sf_list(refusal.headers(), "ratelimit");
    assert_eq!(param(&limits[0].1, "t"), Some(1));
    assert_eq!(param(&limits[1].1, "t"), Some(60));
    // Another client is held by the global policy alone.
    let other = send_to(&layer, from("192.0.2.2:1")).await;
    assert_eq!(other.status(), StatusCode::TOO_MANY_REQUESTS);
    let body = std::str::from_utf8(other.body()).unwrap();
    assert!(body.contains(r#""violated-policies":["global"]"#), "{body}");
    // Its refusal spent nothing of its own quota: after the global minute, it passes at once.
    clock.advance(Duration::from_secs(60));
    assert_eq!(
        send_to(&layer, from("192.0.2.2:1")).await.status(),
        StatusCode::OK
    );
}

#[tokio::test]
async fn a_missing_key_is_skipped_shared_or_refused_as_each_policy_says() {
    let clock = ManualClock::new();
    let per_key = key_table(Quota::per_second(1), &clock);
    let skip = PolicyLayer::builder()
        .policy(Policy::shared("per-key", api_key(), per_key.clone()).missing_key(MissingKey::Skip))
        .policy(Policy::shared(
            "per-client",
            PeerIp::new(),
            table(Quota::per_second(3), 100, &clock),
        ))
        .headers_on_allowed(true)
        .build();
    // Without the header: held by the client's quota alone, and told only that policy.
    for _ in 0..3 {
        let ok = send_to(&skip, from("192.0.2.1:1")).await;
        assert_eq!(ok.status(), StatusCode::OK);
        let names: Vec<String> = sf_list(ok.headers(), "ratelimit")
            .into_iter()
            .map(|(n, _)| n)
            .collect();
        assert_eq!(names, ["per-client"]);
    }
    assert_eq!(
        send_to(&skip, from("192.0.2.1:1")).await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    assert!(per_key.is_empty());

    let reject = PolicyLayer::builder()
        .policy(Policy::shared("per-key", api_key(), per_key.clone()))
        .build();
    assert_eq!(
        send_to(&reject, from("192.0.2.1:1")).await.status(),
        StatusCode::BAD_REQUEST
    );
    let shared = PolicyLayer::builder()
        .policy(Policy::shared(
            "per-key",
            api_key().shared_when_missing(b"anonymous"),
            per_key.clone(),
        ))
        .build();
    assert_eq!(
        send_to(&shared, from("192.0.2.1:1")).await.status(),
        StatusCode::OK
    );
    assert_eq!(
        send_to(&shared, from("192.0.2.9:1")).await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    // An oversized header is refused whatever the policy says of a missing one.
    let long = "x".repeat(300);
    let skip_long = PolicyLayer::builder()
        .policy(Policy::shared("per-key", api_key(), per_key).missing_key(MissingKey::Skip))
        .build();
    let request = with_header(from("192.0.2.1:1"), "x-api-key", &long);
    assert_eq!(
        send_to(&skip_long, request).await.status(),
        StatusCode::BAD_REQUEST
    );
}

#[tokio::test]
async fn a_missing_key_on_the_single_layer_is_skipped_when_asked() {
    let clock = ManualClock::new();
    let layer = RateLimitLayer::builder(api_key(), key_table(Quota::per_second(1), &clock))
        .missing_key(MissingKey::Skip)
        .build();
    for _ in 0..3 {
        assert_eq!(
            send(&layer, from("192.0.2.1:1")).await.status(),
            StatusCode::OK
        );
    }
    let keyed = || with_header(from("192.0.2.1:1"), "x-api-key", "k");
    assert_eq!(send(&layer, keyed()).await.status(), StatusCode::OK);
    assert_eq!(
        send(&layer, keyed()).await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
}

#[tokio::test]
async fn exempt_requests_are_neither_checked_nor_counted() {
    let clock = ManualClock::new();
    let per_client = table(Quota::per_second(1), 100, &clock);
    let layer = RateLimitLayer::builder(PeerIp::new(), per_client.clone())
        .exempt(|head| head.method() == ::http::Method::OPTIONS)
        .build();
    let preflight = || {
        let mut r = from("192.0.2.1:1");
        *r.method_mut() = ::http::Method::OPTIONS;
        r
    };
    for _ in 0..5 {
        assert_eq!(send(&layer, preflight()).await.status(), StatusCode::OK);
    }
    assert!(per_client.is_empty());
    assert_eq!(
        send(&layer, from("192.0.2.1:1")).await.status(),
        StatusCode::OK
    );
    assert_eq!(
        send(&layer, from("192.0.2.1:1")).await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    let policies = PolicyLayer::builder()
        .policy(Policy::shared("per-client", PeerIp::new(), per_client))
        .exempt(|head| head.method() == ::http::Method::OPTIONS)
        .build();
    assert_eq!(
        send_to(&policies, preflight()).await.status(),
        StatusCode::OK
    );
}

#[tokio::test]
async fn stacked_layers_append_their_items() {
    let clock = ManualClock::new();
    let outer = RateLimitLayer::builder(GlobalKey, global_table(Quota::per_second(1000), &clock))
        .policy_name("global")
        .headers_on_allowed(true)
        .build();
    let inner = RateLimitLayer::builder(PeerIp::new(), table(Quota::per_second(1), 100, &clock))
        .policy_name("per-client")
        .build();
    let service = || outer.layer(inner.layer(service_fn(hello)));
    assert_eq!(
        service()
            .oneshot(from("192.0.2.1:1"))
            .await
            .unwrap()
            .status(),
        StatusCode::OK
    );
    let refusal = service().oneshot(from("192.0.2.1:1")).await.unwrap();
    assert_eq!(refusal.status(), StatusCode::TOO_MANY_REQUESTS);
    let names: Vec<String> = sf_list(refusal.headers(), "ratelimit")
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    assert_eq!(names, ["per-client", "global"]);
    let limits = sf_list(refusal.headers(), "ratelimit");
    assert_eq!(param(&limits[0].1, "r"), Some(0));
}

#[test]
fn a_non_text_entry_ends_the_walk_at_itself_and_hides_nothing_to_its_right() {
    let xff = ForwardedIp::new(["127.0.0.1/32".parse().unwrap()]);
    // What nginx forwards for a client at 127.0.0.4 that sent `\xff` itself.
    let mut request = from("127.0.0.1:1");
    request.headers_mut().append(
        "x-forwarded-for",
        HeaderValue::from_bytes(b"\xff, 127.0.0.4").unwrap(),
    );
    assert_eq!(key_of(&xff, &request), Ok(ip("127.0.0.4")));
    // Behind two trusted hops, the garbage between them is where the walk stops: the hop that
    // reported it is the client, never a value the client chose.
    let two = ForwardedIp::new(["127.0.0.0/29".parse().unwrap()]);
    let mut request = from("127.0.0.1:1");
    request.headers_mut().append(
        "x-forwarded-for",
        HeaderValue::from_bytes(b"6.6.6.6, \xfe, 127.0.0.2").unwrap(),
    );
    assert_eq!(key_of(&two, &request), Ok(ip("127.0.0.2")));
    // A non-text line to the left of a good one does not hide the good one.
    let mut request = from("127.0.0.1:1");
    let headers = request.headers_mut();
    headers.append("x-forwarded-for", HeaderValue::from_bytes(b"\xff").unwrap());
    headers.append("x-forwarded-for", HeaderValue::from_static("203.0.113.5"));
    assert_eq!(key_of(&xff, &request), Ok(ip("203.0.113.5")));
}

#[test]
fn an_ipv4_mapped_range_trusts_the_proxy_it_maps() {
    let mapped = ForwardedIp::new(["::ffff:127.0.0.1/128".parse().unwrap()]);
    let plain = ForwardedIp::new(["127.0.0.1/32".parse().unwrap()]);
    for peer in ["127.0.0.1:1", "[::ffff:127.0.0.1]:1"] {
        let request = with_header(from(peer), "x-forwarded-for", "203.0.113.9");
        assert_eq!(key_of(&mapped, &request), Ok(ip("203.0.113.9")), "{peer}");
        assert_eq!(key_of(&plain, &request), Ok(ip("203.0.113.9")), "{peer}");
    }
    let wide = ForwardedIp::new(["::ffff:10.0.0.0/104".parse().unwrap()]);
    let request = with_header(from("10.1.2.3:1"), "x-forwarded-for", "203.0.113.9");
    assert_eq!(key_of(&wide, &request), Ok(ip("203.0.113.9")));
    let request = with_header(from("11.0.0.1:1"), "x-forwarded-for", "203.0.113.9");
    assert_eq!(key_of(&wide, &request), Ok(ip("11.0.0.1")));
}

#[tokio::test]
async fn in_shadow_mode_a_refusal_is_let_through_and_gives_back_as_enforced() {
    let clock = ManualClock::new();
    let per_client = table(Quota::per_second(1), 100, &clock);
    let global = global_table(Quota::per_second(100), &clock);
    let layer = PolicyLayer::builder()
        .policy(Policy::shared("per-client", PeerIp::new(), per_client))
        .policy(Policy::shared("global", GlobalKey, global.clone()))
        .shadow(true)
        .headers_on_allowed(true)
        .build();
    for _ in 0..5 {
        assert_eq!(
            send_to(&layer, from("192.0.2.1:1")).await.status(),
            StatusCode::OK
        );
    }
    // One admitted for real; the four shadowed refusals spent nothing of the global quota.
    assert_eq!(global.check_key_n(&(), 0).unwrap().remaining(), 99);
    let watched = send_to(&layer, from("192.0.2.1:1")).await;
    let limits = sf_list(watched.headers(), "ratelimit");
    assert_eq!(
        param(&limits[0].1, "r"),
        Some(0),
        "what enforcing would say"
    );
}

#[cfg(feature = "metrics")]
use super::modes::counters;

/// Each policy counts what it decided; in shadow mode its refusals count as shadowed.
#[cfg(feature = "metrics")]
#[tokio::test]
async fn each_policy_counts_its_own_decisions() {
    use crate::instrument::LimiterMetrics;
    use metrics_util::debugging::DebuggingRecorder;
    let recorder = DebuggingRecorder::new();
    let clock = ManualClock::new();
    let (layer, watch) = metrics::with_local_recorder(&recorder, || {
        let layer = PolicyLayer::builder()
            .policy(
                Policy::shared(
                    "per-client",
                    PeerIp::new(),
                    table(Quota::per_second(1), 9, &clock),
                )
                .metrics(LimiterMetrics::new("client")),
            )
            .policy(
                Policy::shared(
                    "global",
                    GlobalKey,
                    global_table(Quota::per_second(9), &clock),
                )
                .metrics(LimiterMetrics::new("global")),
            )
            .build();
        let watch = PolicyLayer::builder()
            .policy(
                Policy::shared(
                    "per-client",
                    PeerIp::new(),
                    table(Quota::per_second(1), 9, &clock),
                )
                .metrics(LimiterMetrics::new("watch")),
            )
            .shadow(true)
            .build();
        (layer, watch)
    });
    for _ in 0..3 {
        send_to(&layer, from("192.0.2.1:1")).await;
        send_to(&watch, from("192.0.2.1:1")).await;
    }
    let c = counters::counters(&recorder);
    let get = |name: &str, labels: &str| counters::count(&c, name, labels);
    assert_eq!(get("allowed_total", "limiter=client"), 1);
    assert_eq!(get("denied_total", "limiter=client"), 2);
    // The global policy admitted all three, and two were given back when the client's refused:
    // only the one that went through is an admission.
    assert_eq!(get("allowed_total", "limiter=global"), 1);
    assert_eq!(get("denied_total", "limiter=global"), 0);
    assert_eq!(get("denied_total", "limiter=watch"), 2);
    assert_eq!(get("shadowed_total", "limiter=watch"), 2);
}

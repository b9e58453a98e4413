//! A request charged its cost and settled from its response's head; `qu` in `RateLimit-Policy`.

use super::*;

/// Echoes the request's `x-actual` as the response's `x-used`: what the handler counted.
async fn counting(request: Request<()>) -> Result<Response<Full<Bytes>>, Infallible> {
    let mut response = Response::new(Full::new(Bytes::from_static(b"done")));
    if let Some(v) = request.headers().get("x-actual") {
        response.headers_mut().insert("x-used", v.clone());
    }
    Ok(response)
}

fn charged(estimate: u32, actual: Option<u32>) -> Request<()> {
    let request = with_header(from("192.0.2.1:5000"), "x-estimate", &estimate.to_string());
    match actual {
        Some(a) => with_header(request, "x-actual", &a.to_string()),
        None => request,
    }
}

#[tokio::test]
async fn a_response_settles_the_charge_its_request_made() {
    let clock = ManualClock::new();
    let tokens = table(Quota::per_minute(100), 10, &clock);
    let layer = RateLimitLayer::builder(PeerIp::new(), tokens.clone())
        .cost(|head| {
            head.headers()
                .get("x-estimate")
                .and_then(|v| v.to_str().ok()?.parse().ok())
                .unwrap_or(1)
        })
        .settle_from_header(::http::HeaderName::from_static("x-used"))
        .build();
    let left = || tokens.check_key_n(&ip("192.0.2.1"), 0).unwrap().remaining();
    let send = |request| layer.layer(service_fn(counting)).oneshot(request);

    // 50 charged, 20 used: 30 back; the layer's header does not reach the client.
    let response = send(charged(50, Some(20))).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert!(response.headers().get("x-used").is_none());
    assert_eq!(left(), 80);
    // 10 charged, 40 used: 30 more owed.
    send(charged(10, Some(40))).await.unwrap();
    assert_eq!(left(), 40);
    // No count in the response: the estimate stands.
    send(charged(10, None)).await.unwrap();
    assert_eq!(left(), 30);
    // A refusal took nothing and settles nothing, whatever its response would have said.
    let refused = send(charged(31, Some(0))).await.unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(left(), 30);
    // A debt past the burst: 30 held, 10 charged, 100 used: 70 owed; the next request waits.
    send(charged(10, Some(100))).await.unwrap();
    let refused = send(charged(1, Some(1))).await.unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    // 71 tokens of 0.6 s: 42.6 s, rounded up.
    assert_eq!(header_u64(refused.headers(), "retry-after"), 43);
}

type SettlingLayer = RateLimitLayer<PeerIp, Arc<Table<IpKey>>>;

/// A table of 100 a minute behind a layer that charges 25 and settles every response at 0.
fn charging_25_settling_0() -> (Arc<Table<IpKey>>, SettlingLayer) {
    let tokens = table(Quota::per_minute(100), 10, &ManualClock::new());
    let layer = RateLimitLayer::builder(PeerIp::new(), tokens.clone())
        .cost(|_| 25)
        .settle_from(|_| Some(0))
        .build();
    (tokens, layer)
}

#[tokio::test]
async fn an_inner_error_leaves_the_estimate() {
    let (tokens, layer) = charging_25_settling_0();
    let failing = service_fn(|_: Request<()>| async { Err::<Response<Full<Bytes>>, _>("down") });
    assert!(
        layer
            .layer(failing)
            .oneshot(from("192.0.2.1:5000"))
            .await
            .is_err()
    );
    assert_eq!(
        tokens.check_key_n(&ip("192.0.2.1"), 0).unwrap().remaining(),
        75
    );
    // The same response, had it come, settles at 0: everything back.
    let ok = send(&layer, from("192.0.2.1:5000")).await;
    assert_eq!(ok.status(), StatusCode::OK);
    assert_eq!(
        tokens.check_key_n(&ip("192.0.2.1"), 0).unwrap().remaining(),
        75
    );
}

/// A client gone before the response (its future dropped while the inner service works): the
/// charge stands at the estimate, neither given back nor settled, and the key serves on.
#[tokio::test]
async fn a_request_dropped_before_its_response_leaves_the_estimate() {
    let (tokens, layer) = charging_25_settling_0();
    let left = || tokens.check_key_n(&ip("192.0.2.1"), 0).unwrap().remaining();
    let (started, mut answer) = (Arc::new(tokio::sync::Notify::new()), None);
    let working = {
        let started = started.clone();
        service_fn(move |_: Request<()>| {
            let started = started.clone();
            async move {
                started.notify_one();
                core::future::pending::<Result<Response<Full<Bytes>>, Infallible>>().await
            }
        })
    };
    {
        let mut service = layer.layer(working);
        let call = service.ready().await.unwrap().call(from("192.0.2.1:5000"));
        tokio::select! {
            response = call => answer = Some(response),
            () = started.notified() => {}
        }
        // Leaving the block drops the call mid-request, as a server does for a client gone.
    }
    assert!(answer.is_none(), "the inner service never answers");
    assert_eq!(left(), 75);
    // Had the response come, it would have settled at 0: everything back.
    assert_eq!(
        send(&layer, from("192.0.2.1:5000")).await.status(),
        StatusCode::OK
    );
    assert_eq!(left(), 75);
}

#[tokio::test]
async fn a_quota_of_tokens_names_its_unit() {
    let clock = ManualClock::new();
    let layer = RateLimitLayer::builder(PeerIp::new(), table(Quota::per_minute(600), 10, &clock))
        .headers_on_allowed(true)
        .quota_unit(QuotaUnit::Other("acme\"-tokens\u{e9}".into()))
        .build();
    let response = send(&layer, from("192.0.2.1:5000")).await;
    let policy = response.headers()["ratelimit-policy"].to_str().unwrap();
    assert_eq!(policy, "\"default\";q=600;w=60;qu=\"acme-tokens\"");
    let list: List = Parser::new(policy).parse().expect("a structured field");
    assert_eq!(list.len(), 1);
    // Requests are the default unit: no `qu`.
    let plain = RateLimitLayer::builder(PeerIp::new(), table(Quota::per_minute(600), 10, &clock))
        .headers_on_allowed(true)
        .quota_unit(QuotaUnit::ContentBytes)
        .build();
    let response = send(&plain, from("192.0.2.1:5000")).await;
    assert!(
        response.headers()["ratelimit-policy"]
            .to_str()
            .unwrap()
            .ends_with(";qu=\"content-bytes\"")
    );
}

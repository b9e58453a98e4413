//! The layer's modes: shared services, the delay mode, shadow mode, metrics.

use super::*;

#[tokio::test]
async fn the_service_is_ready_and_clones_share_the_quota() {
    let clock = ManualClock::new();
    let layer = RateLimitLayer::new(GlobalKey, table_unit(Quota::per_second(3), &clock));
    let mut a = layer.layer(service_fn(hello));
    let mut b = a.clone();
    let mut admitted = 0;
    for i in 0..10 {
        let svc = if i % 2 == 0 { &mut a } else { &mut b };
        // Ready even when the quota is spent: the refusal is an answer.
        let response = svc
            .ready()
            .await
            .unwrap()
            .call(from("192.0.2.1:1"))
            .await
            .unwrap();
        admitted += usize::from(response.status() == StatusCode::OK);
    }
    assert_eq!(admitted, 3);
}

fn table_unit(quota: Quota, clock: &ManualClock) -> Arc<Table<()>> {
    Arc::new(Keyed::gcra_with_clock(quota, 1, clock.clone()))
}

#[tokio::test]
async fn the_delay_mode_waits_instead_of_refusing_and_a_dropped_request_takes_nothing() {
    // Real time: the delay sleeps on tokio's timer, the limiter reads the default clock.
    let keyed = Arc::new(Keyed::<IpKey, Gcra>::gcra(
        Quota::with_period(Duration::from_millis(300)),
        10,
    ));
    let layer = RateLimitLayer::builder(PeerIp::new(), keyed.clone())
        .delay_up_to(Duration::from_secs(1))
        .build();
    let start = Instant::now();
    assert_eq!(
        send(&layer, from("192.0.2.1:1")).await.status(),
        StatusCode::OK
    );
    // Waits for the next slot, ~300 ms, instead of a 429.
    assert_eq!(
        send(&layer, from("192.0.2.1:1")).await.status(),
        StatusCode::OK
    );
    assert!(
        start.elapsed() >= Duration::from_millis(250),
        "{:?}",
        start.elapsed()
    );

    // A request waiting for the next slot is dropped (its client went away) before it comes.
    let waiting = tokio::spawn({
        let layer = layer.clone();
        async move { send(&layer, from("192.0.2.1:1")).await.status() }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    waiting.abort();
    assert!(waiting.await.unwrap_err().is_cancelled());
    // When the slot comes, it is still there: the dropped request held nothing.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(keyed.check_key(&ip("192.0.2.1")).is_allowed());

    // A wait past the bound is refused at once.
    let short = RateLimitLayer::builder(PeerIp::new(), keyed.clone())
        .delay_up_to(Duration::from_millis(50))
        .build();
    let refused = send(&short, from("192.0.2.1:1")).await;
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header_u64(refused.headers(), "retry-after"), 1);
}

#[tokio::test]
async fn t_on_an_admission_is_when_the_next_token_is_back() {
    let clock = ManualClock::new();
    let layer = RateLimitLayer::builder(
        PeerIp::new(),
        table(Quota::per_second(1).with_burst(5), 10, &clock),
    )
    .headers(Headers::Both)
    .headers_on_allowed(true)
    .cost(|head| u32::from(head.uri().path() != "/free"))
    .build();
    // A request that spends nothing finds the quota whole: no `t`, nothing to wait for.
    let mut free = Request::get("/free").body(()).unwrap();
    free.extensions_mut()
        .insert("192.0.2.1:1".parse::<SocketAddr>().unwrap());
    let whole = send(&layer, free).await;
    let (_, limit) = sf_item(whole.headers(), "ratelimit");
    assert_eq!((param(&limit, "r"), param(&limit, "t")), (Some(5), None));
    for _ in 0..3 {
        send(&layer, from("192.0.2.1:1")).await;
    }
    clock.advance(Duration::from_millis(300));
    let third = send(&layer, from("192.0.2.1:1")).await;
    let (_, limit) = sf_item(third.headers(), "ratelimit");
    // One token back 0.7 s from now (t = 1), all four in 3.7 s (the legacy reset, 4).
    assert_eq!((param(&limit, "r"), param(&limit, "t")), (Some(1), Some(1)));
    assert_eq!(header_u64(third.headers(), "x-ratelimit-reset"), 4);
}

#[tokio::test]
async fn at_most_max_waiting_requests_sleep_at_once() {
    let keyed = Arc::new(Keyed::<IpKey, Gcra>::gcra(
        Quota::with_period(Duration::from_millis(200)),
        10,
    ));
    let layer = RateLimitLayer::builder(PeerIp::new(), keyed.clone())
        .delay_up_to(Duration::from_secs(2))
        .max_waiting(1)
        .build();
    assert_eq!(
        send(&layer, from("192.0.2.1:1")).await.status(),
        StatusCode::OK
    );
    let asleep = tokio::spawn({
        let layer = layer.clone();
        async move { send(&layer, from("192.0.2.1:1")).await.status() }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    // The one place is taken: refused at once, not queued.
    let start = Instant::now();
    let second = send(&layer, from("192.0.2.1:1")).await;
    assert_eq!(second.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(start.elapsed() < Duration::from_millis(100));
    // Dropped asleep, the request gives its place back.
    asleep.abort();
    assert!(asleep.await.unwrap_err().is_cancelled());
    let third = tokio::spawn({
        let layer = layer.clone();
        async move { send(&layer, from("192.0.2.1:1")).await.status() }
    });
    assert_eq!(third.await.unwrap(), StatusCode::OK);
}

/// Shadow mode lets every request through (over the quota, a full table, no key, above the
/// burst) while the table decides and counts as usual; the fields on the responses say what the
/// limit would have answered.
#[tokio::test]
async fn shadow_mode_lets_everything_through_and_tells_what_the_limit_would_say() {
    let clock = ManualClock::new();
    let keys = table(Quota::per_second(2), 1, &clock);
    let layer = RateLimitLayer::builder(PeerIp::new(), keys.clone())
        .headers_on_allowed(true)
        .cost(|head| if head.uri().path() == "/big" { 5 } else { 1 })
        .shadow(true)
        .build();
    let mut remaining = vec![];
    for _ in 0..4 {
        let response = send(&layer, from("192.0.2.1:1000")).await;
        assert_eq!(response.status(), StatusCode::OK);
        assert!(response.headers().get("retry-after").is_none());
        let (_, limit) = sf_item(response.headers(), "ratelimit");
        remaining.push(param(&limit, "r"));
    }
    // What the limit would have said: two admitted, then nothing left.
    assert_eq!(remaining, [Some(1), Some(0), Some(0), Some(0)]);
    // The table counted: the tokens the limit admitted were taken, the refusals took none.
    assert!(
        keys.check_key(&IpKey::from("192.0.2.1".parse::<IpAddr>().unwrap()))
            .is_denied()
    );
    clock.advance(Duration::from_millis(500));
    assert!(
        keys.check_key(&IpKey::from("192.0.2.1".parse::<IpAddr>().unwrap()))
            .is_allowed()
    );
    // A second client finds the one-key table full: let through.
    assert_eq!(
        send(&layer, from("192.0.2.2:1000")).await.status(),
        StatusCode::OK
    );
    // No peer address (a setup mistake that is a 500 when enforcing): let through.
    let no_peer = Request::get("/").body(()).unwrap();
    assert_eq!(send(&layer, no_peer).await.status(), StatusCode::OK);
    // Above the burst (a 429 with no wait when enforcing): let through.
    let mut big = Request::get("/big").body(()).unwrap();
    big.extensions_mut()
        .insert("192.0.2.1:1000".parse::<SocketAddr>().unwrap());
    assert_eq!(send(&layer, big).await.status(), StatusCode::OK);
    // The same layer enforcing refuses the third request.
    let enforcing = RateLimitLayer::new(PeerIp::new(), table(Quota::per_second(2), 1, &clock));
    for expected in [
        StatusCode::OK,
        StatusCode::OK,
        StatusCode::TOO_MANY_REQUESTS,
    ] {
        assert_eq!(
            send(&enforcing, from("192.0.2.1:1000")).await.status(),
            expected
        );
    }
}

#[cfg(feature = "metrics")]
#[path = "../../../tests/common/counters.rs"]
pub(super) mod counters;

/// The layer counts what it acts on: admitted on the fast path, refused, a full table, a request
/// above the burst, and in shadow mode what it let through.
#[cfg(feature = "metrics")]
#[tokio::test]
async fn the_layer_counts_every_decision() {
    use metrics_util::debugging::DebuggingRecorder;
    let recorder = DebuggingRecorder::new();
    let (enforcing, shadow) = metrics::with_local_recorder(&recorder, || {
        let clock = ManualClock::new();
        let enforcing =
            RateLimitLayer::builder(PeerIp::new(), table(Quota::per_second(2), 1, &clock))
                .cost(|head| if head.uri().path() == "/big" { 9 } else { 1 })
                .metrics(crate::instrument::LimiterMetrics::new("web"))
                .build();
        let shadow = RateLimitLayer::builder(PeerIp::new(), table(Quota::per_second(1), 1, &clock))
            .cost(|head| if head.uri().path() == "/big" { 9 } else { 1 })
            .shadow(true)
            .metrics(crate::instrument::LimiterMetrics::new("watch"))
            .build();
        (enforcing, shadow)
    });
    for _ in 0..3 {
        send(&enforcing, from("192.0.2.1:1")).await;
    }
    send(&enforcing, from("192.0.2.2:1")).await; // the one-key table is full
    let mut big = Request::get("/big").body(()).unwrap();
    big.extensions_mut()
        .insert("192.0.2.1:1".parse::<SocketAddr>().unwrap());
    send(&enforcing, big).await;
    for _ in 0..3 {
        send(&shadow, from("192.0.2.1:1")).await;
    }
    // Above the burst, let through: a shadowed refusal, as `Shadow` counts it.
    let mut big = Request::get("/big").body(()).unwrap();
    big.extensions_mut()
        .insert("192.0.2.1:1".parse::<SocketAddr>().unwrap());
    assert_eq!(send(&shadow, big).await.status(), StatusCode::OK);
    let c = counters::counters(&recorder);
    let get = |name: &str, labels: &str| counters::count(&c, name, labels);
    assert_eq!(get("allowed_total", "limiter=web"), 2);
    assert_eq!(get("denied_total", "limiter=web"), 2); // over the rate, and above the burst
    assert_eq!(get("table_full_total", "limiter=web"), 1);
    assert_eq!(get("allowed_total", "limiter=watch"), 1);
    assert_eq!(get("denied_total", "limiter=watch"), 3);
    assert_eq!(get("shadowed_total", "limiter=watch"), 3);
}

//! What the layer answers: statuses, the fields in every header mode, problem bodies.

use super::*;

/// `Backend::admit` admits exactly what `check` admits, and answers the same decision for all
/// else: new keys, held ones, costs past the burst, and keys moved by a change of quota.
#[test]
fn admit_answers_what_check_answers() {
    let clock = ManualClock::new();
    let quota = Quota::per_second(2).with_burst(3);
    let (by_admit, by_check) = (table(quota, 4, &clock), table(quota, 4, &clock));
    let (mut admitted, mut fast) = (0u32, 0u32);
    for round in 0..12u64 {
        if round == 6 {
            // Every held key moves to the new quota at its next check.
            let changed = Quota::per_second(1).with_burst(2);
            by_admit.set_quota(changed, crate::limiter::algorithm::Carry::Debt);
            by_check.set_quota(changed, crate::limiter::algorithm::Carry::Debt);
        }
        for client in 0..6u8 {
            let key = IpKey::from(IpAddr::from([10, 0, 0, client]));
            let cost = [1, 2, 9][(round as usize + usize::from(client)) % 3];
            let expected = match by_check.check(&key, cost) {
                Checked::Ready(answer) => answer,
                Checked::Pending(_) => unreachable!("a local table answers on the spot"),
            };
            match by_admit.admit(&key, cost) {
                None => {
                    assert!(expected.is_ok_and(|d| d.is_allowed()), "{round} {client}");
                    admitted += 1;
                    fast += 1;
                }
                // A refusal, or an admission off the fast path (a new key, a moved one).
                Some(Checked::Ready(answer)) => {
                    assert_eq!(answer, expected, "{round} {client}");
                    admitted += u32::from(answer.is_ok_and(|d| d.is_allowed()));
                }
                Some(Checked::Pending(_)) => unreachable!("a local table answers on the spot"),
            }
        }
        clock.advance(Duration::from_millis(300));
    }
    // Some admitted on the fast path, some on others, some refused.
    assert!(
        fast > 0 && fast < admitted && admitted < 72,
        "{fast} {admitted}"
    );
}

#[tokio::test]
async fn refusals_are_429_with_the_ietf_fields_and_a_retry_after_rounded_up() {
    let clock = ManualClock::new();
    let layer = RateLimitLayer::new(PeerIp::new(), table(Quota::per_second(2), 10, &clock));
    for _ in 0..2 {
        let ok = send(&layer, from("192.0.2.1:1000")).await;
        assert_eq!(ok.status(), StatusCode::OK);
        assert_eq!(ok.body(), "hello");
        // Not asked for on admitted responses.
        assert!(ok.headers().get("ratelimit").is_none());
    }
    let refused = send(&layer, from("192.0.2.1:1001")).await;
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    // The wait is 500 ms: one second, rounded up (tower_governor's `as_secs` would say 0).
    assert_eq!(header_u64(refused.headers(), "retry-after"), 1);
    let (id, limit) = sf_item(refused.headers(), "ratelimit");
    assert_eq!(id, "default");
    assert_eq!(param(&limit, "r"), Some(0));
    assert_eq!(param(&limit, "t"), Some(1));
    let (id, policy) = sf_item(refused.headers(), "ratelimit-policy");
    assert_eq!(id, "default");
    assert_eq!(param(&policy, "q"), Some(2));
    assert_eq!(param(&policy, "w"), Some(1));
    assert!(refused.body().is_empty());
    // Another client is not affected.
    assert_eq!(
        send(&layer, from("192.0.2.2:1000")).await.status(),
        StatusCode::OK
    );
    // After the wait, the same client passes.
    clock.advance(Duration::from_millis(500));
    assert_eq!(
        send(&layer, from("192.0.2.1:1000")).await.status(),
        StatusCode::OK
    );
}

#[tokio::test]
async fn retry_after_is_never_earlier_than_the_reset_beside_it_and_waiting_it_passes() {
    // Quotas whose waits fall on, just past and well past whole seconds, and costs above 1.
    let quotas = [
        Quota::per_second(3),
        Quota::per_minute(7).with_burst(2),
        Quota::with_period(Duration::from_millis(1500)),
        Quota::with_period(Duration::from_millis(999)).with_burst(4),
        Quota::per_hour(1),
    ];
    for quota in quotas {
        for cost in [1, 2] {
            if cost > quota.burst() {
                continue;
            }
            let clock = ManualClock::new();
            let layer = RateLimitLayer::builder(PeerIp::new(), table(quota, 10, &clock))
                .cost(move |_| cost)
                .headers(Headers::Both)
                .build();
            let mut refused = None;
            for _ in 0..=quota.burst() {
                let r = send(&layer, from("192.0.2.1:1")).await;
                if r.status() == StatusCode::TOO_MANY_REQUESTS {
                    refused = Some(r);
                    break;
                }
                clock.advance(Duration::from_millis(7));
            }
            let refused = refused.expect("a refusal");
            let retry = header_u64(refused.headers(), "retry-after");
            let (_, limit) = sf_item(refused.headers(), "ratelimit");
            let t = param(&limit, "t").unwrap();
            assert!(retry as i64 >= t, "{quota:?}: Retry-After {retry} < t {t}");
            assert!(retry >= 1);
            // Waiting a moment less than Retry-After may still be refused; waiting it passes.
            clock.advance(Duration::from_secs(retry));
            let again = send(&layer, from("192.0.2.1:1")).await;
            assert_eq!(again.status(), StatusCode::OK, "{quota:?} cost {cost}");
        }
    }
}

#[tokio::test]
async fn every_header_mode() {
    let quota = Quota::per_minute(60).with_burst(3);
    let mut seen = Vec::new();
    for mode in [Headers::Ietf, Headers::Legacy, Headers::Both, Headers::None] {
        let clock = ManualClock::new();
        let layer = RateLimitLayer::builder(PeerIp::new(), table(quota, 10, &clock))
            .headers(mode)
            .headers_on_allowed(true)
            .policy_name("per-minute")
            .build();
        let ok = send(&layer, from("192.0.2.1:1")).await;
        assert_eq!(ok.status(), StatusCode::OK);
        let ietf = matches!(mode, Headers::Ietf | Headers::Both);
        let legacy = matches!(mode, Headers::Legacy | Headers::Both);
        assert_eq!(ok.headers().contains_key("ratelimit"), ietf, "{mode:?}");
        assert_eq!(ok.headers().contains_key("ratelimit-policy"), ietf);
        assert_eq!(ok.headers().contains_key("x-ratelimit-remaining"), legacy);
        assert!(!ok.headers().contains_key("retry-after"));
        if ietf {
            let (id, limit) = sf_item(ok.headers(), "ratelimit");
            assert_eq!(id, "per-minute");
            assert_eq!(param(&limit, "r"), Some(2));
            // A second till the token is back, and the quota whole again.
            assert_eq!(param(&limit, "t"), Some(1));
            let (_, policy) = sf_item(ok.headers(), "ratelimit-policy");
            assert_eq!(param(&policy, "q"), Some(60));
            assert_eq!(param(&policy, "w"), Some(60));
        }
        if legacy {
            assert_eq!(header_u64(ok.headers(), "x-ratelimit-limit"), 3);
            assert_eq!(header_u64(ok.headers(), "x-ratelimit-remaining"), 2);
            assert_eq!(header_u64(ok.headers(), "x-ratelimit-reset"), 1);
        }
        send(&layer, from("192.0.2.1:1")).await;
        send(&layer, from("192.0.2.1:1")).await;
        let refused = send(&layer, from("192.0.2.1:1")).await;
        assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
        // Retry-After whatever the mode.
        assert_eq!(header_u64(refused.headers(), "retry-after"), 1);
        assert_eq!(refused.headers().contains_key("ratelimit"), ietf);
        assert_eq!(refused.headers().contains_key("x-ratelimit-limit"), legacy);
        if legacy {
            assert_eq!(header_u64(refused.headers(), "x-ratelimit-remaining"), 0);
            assert_eq!(header_u64(refused.headers(), "x-ratelimit-reset"), 3);
        }
        seen.push(refused.headers().len());
    }
    // None carries Retry-After alone.
    assert_eq!(seen[3], 1);
}

#[tokio::test]
async fn a_problem_body_when_asked() {
    let clock = ManualClock::new();
    let layer = RateLimitLayer::builder(PeerIp::new(), table(Quota::per_second(1), 10, &clock))
        .problem_json(true)
        .policy_name("api \"v2\"")
        .build();
    send(&layer, from("192.0.2.1:1")).await;
    let refused = send(&layer, from("192.0.2.1:1")).await;
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        refused.headers()["content-type"],
        "application/problem+json"
    );
    let problem: serde_json::Value = serde_json::from_slice(refused.body()).unwrap();
    assert_eq!(
        problem["type"],
        "https://iana.org/assignments/http-problem-types#quota-exceeded"
    );
    assert_eq!(problem["status"], 429);
    assert_eq!(problem["violated-policies"][0], "api \"v2\"");
    // The escaped name parses as a String in the field too.
    let (id, _) = sf_item(refused.headers(), "ratelimit");
    assert_eq!(id, "api \"v2\"");
}

#[tokio::test]
async fn a_full_table_answers_503_not_429() {
    let clock = ManualClock::new();
    let layer = RateLimitLayer::builder(PeerIp::new(), table(Quota::per_second(1), 1, &clock))
        .problem_json(true)
        .build();
    assert_eq!(
        send(&layer, from("192.0.2.1:1")).await.status(),
        StatusCode::OK
    );
    let full = send(&layer, from("192.0.2.2:1")).await;
    assert_eq!(full.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(header_u64(full.headers(), "retry-after"), 1);
    assert!(!full.headers().contains_key("ratelimit"));
    let problem: serde_json::Value = serde_json::from_slice(full.body()).unwrap();
    assert_eq!(
        problem["type"],
        "https://iana.org/assignments/http-problem-types#temporary-reduced-capacity"
    );
    clock.advance(Duration::from_secs(1));
    assert_eq!(
        send(&layer, from("192.0.2.2:1")).await.status(),
        StatusCode::OK
    );
}

#[tokio::test]
async fn a_cost_above_the_burst_is_refused_without_a_retry_after() {
    let clock = ManualClock::new();
    let layer = RateLimitLayer::builder(PeerIp::new(), table(Quota::per_second(5), 10, &clock))
        .cost(|head| {
            head.headers()
                .get("x-cost")
                .and_then(|v| v.to_str().ok()?.parse().ok())
                .unwrap_or(1)
        })
        .build();
    let heavy = with_header(from("192.0.2.1:1"), "x-cost", "4");
    assert_eq!(send(&layer, heavy).await.status(), StatusCode::OK);
    let refused = send(&layer, with_header(from("192.0.2.1:1"), "x-cost", "2")).await;
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    let (_, limit) = sf_item(refused.headers(), "ratelimit");
    assert_eq!(param(&limit, "r"), Some(1));
    // One token is there; two are 200 ms away.
    assert_eq!(header_u64(refused.headers(), "retry-after"), 1);
    let never = send(&layer, with_header(from("192.0.2.1:1"), "x-cost", "6")).await;
    assert_eq!(never.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(!never.headers().contains_key("retry-after"));
    // A free request passes and spends nothing.
    let free = send(&layer, with_header(from("192.0.2.1:1"), "x-cost", "0")).await;
    assert_eq!(free.status(), StatusCode::OK);
    assert_eq!(
        send(&layer, from("192.0.2.1:1")).await.status(),
        StatusCode::OK
    );
}

//! The service on Redis (feature `redis`): replicas sharing one quota on a real redis-server
//! started on a free loopback port, all or nothing in one script, shadow mode and hits per
//! descriptor on the store, and an outage answered as configured.

#![cfg(feature = "redis")]

mod common;
#[path = "../../tests/common/redis_server.rs"]
mod redis_server;

use std::time::Duration;

use common::{Rls, ask, client, folder, over, request};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::google::protobuf::UInt64Value;

const CONFIG: &str = r#"
domain: edge
descriptors:
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: 4}
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: tenant
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 1}
"#;

fn descriptor(key: &str, value: &str) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: vec![Entry {
            key: key.into(),
            value: value.into(),
        }],
        ..RateLimitDescriptor::default()
    }
}

#[tokio::test]
async fn two_replicas_share_one_quota_all_or_nothing() {
    let Some(redis) = redis_server::RedisServer::start("rls two replicas") else {
        return;
    };
    let flags = ["--redis", &redis.url()];
    let a = Rls::start(&folder("redis-a"), CONFIG, &flags);
    let b = Rls::start(&folder("redis-b"), CONFIG, &flags);
    let (mut ca, mut cb) = (client(&a).await, client(&b).await);
    // Alternating replicas: the address's 4 are admitted exactly once in all.
    let addr = || request(vec![descriptor("remote_address", "1.1.1.1")]);
    let mut admitted = 0;
    for i in 0..8 {
        let c = if i % 2 == 0 { &mut ca } else { &mut cb };
        admitted += usize::from(!over(&ask(c, addr()).await));
    }
    assert_eq!(admitted, 4);
    // A user's refusal spends nothing from the address beside it, on either replica.
    let both = |user| {
        request(vec![
            descriptor("remote_address", "2.2.2.2"),
            descriptor("user", user),
        ])
    };
    assert!(!over(&ask(&mut ca, both("ada")).await));
    assert!(!over(&ask(&mut cb, both("ada")).await));
    let refused = ask(&mut ca, both("ada")).await;
    assert!(over(&refused));
    assert_eq!(refused.statuses[0].code, Code::Ok as i32);
    assert_eq!(
        refused.statuses[0].limit_remaining, 2,
        "the address kept its 2"
    );
    assert_eq!(refused.statuses[1].code, Code::OverLimit as i32);
    let a2 = || request(vec![descriptor("remote_address", "2.2.2.2")]);
    assert!(!over(&ask(&mut cb, a2()).await));
    assert!(!over(&ask(&mut ca, a2()).await));
    assert!(over(&ask(&mut cb, a2()).await), "exactly 2 were left");
    // Hits per descriptor: 3 from one address, the default 1 from another, in one call.
    let mut mixed = request(vec![
        descriptor("remote_address", "3.3.3.3"),
        descriptor("remote_address", "4.4.4.4"),
    ]);
    mixed.descriptors[0].hits_addend = Some(UInt64Value { value: 3 });
    let m = ask(&mut ca, mixed).await;
    assert_eq!(
        (m.statuses[0].limit_remaining, m.statuses[1].limit_remaining),
        (1, 3)
    );
}

#[tokio::test]
async fn a_shadow_limit_on_the_store_never_refuses_the_request() {
    let Some(redis) = redis_server::RedisServer::start("rls redis shadow") else {
        return;
    };
    let rls = Rls::start(&folder("redis-shadow"), CONFIG, &["--redis", &redis.url()]);
    let mut c = client(&rls).await;
    let r = || {
        request(vec![
            descriptor("tenant", "t"),
            descriptor("remote_address", "5.5.5.5"),
        ])
    };
    assert!(!over(&ask(&mut c, r()).await));
    // The tenant's 1 an hour is spent: in shadow mode the request passes, and the address is
    // charged (3 of 4 spent after this one would be 2 left).
    let second = ask(&mut c, r()).await;
    assert!(!over(&second));
    assert_eq!(second.statuses[0].code, Code::Ok as i32);
    assert_eq!(second.statuses[1].limit_remaining, 2);
    let (_, metrics) = rls.get("/metrics");
    assert!(
        metrics
            .lines()
            .any(|l| l.contains("limit=\"edge.tenant\"") && l.contains("outcome=\"shadowed\"")),
        "{metrics}"
    );
}

#[tokio::test]
async fn an_outage_is_unavailable_or_the_configured_answer_and_recovers() {
    let Some(mut redis) = redis_server::RedisServer::start("rls redis outage") else {
        return;
    };
    let url = redis.url();
    let strict = Rls::start(&folder("redis-outage"), CONFIG, &["--redis", &url]);
    let open = Rls::start(
        &folder("redis-open"),
        CONFIG,
        &["--redis", &url, "--on-store-error", "allow"],
    );
    let (mut cs, mut co) = (client(&strict).await, client(&open).await);
    let r = || request(vec![descriptor("remote_address", "6.6.6.6")]);
    assert!(!over(&ask(&mut cs, r()).await));
    redis.kill();
    let e = cs.should_rate_limit(r()).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unavailable, "{e:?}");
    let allowed = ask(&mut co, r()).await;
    assert!(!over(&allowed));
    let (_, metrics) = strict.get("/metrics");
    assert!(
        metrics.contains("rls_store_errors_total{domain=\"edge\"}"),
        "{metrics}"
    );
    redis.restart();
    // Back once the store answers (the breaker's cooldown at most).
    let until = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        match cs.should_rate_limit(r()).await {
            Ok(answer) => {
                assert!(!over(&answer.into_inner()));
                break;
            }
            Err(e) => {
                assert_eq!(e.code(), tonic::Code::Unavailable);
                assert!(
                    std::time::Instant::now() < until,
                    "no decision after the restart"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

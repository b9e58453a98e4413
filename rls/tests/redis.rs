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
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::google::protobuf::UInt64Value;
use tonic::transport::Channel;

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
    admitted_after_restart(&mut cs, r()).await;
}

/// Asks until the store decides again (the breaker's cooldown at most; 20 s at the very most),
/// each answer until then `UNAVAILABLE`, and the first decision an admission.
async fn admitted_after_restart(
    c: &mut RateLimitServiceClient<Channel>,
    r: envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest,
) {
    let until = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        match c.should_rate_limit(r.clone()).await {
            Ok(answer) => {
                assert!(!over(&answer.into_inner()));
                return;
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

/// The flags of a replica on leases that outlive the test, so that none expires under it.
fn leased(url: &str) -> [&str; 6] {
    [
        "--redis",
        url,
        "--redis-mode",
        "leased",
        "--lease-ttl-ms",
        "60000",
    ]
}

#[tokio::test]
async fn leases_give_back_what_a_refused_request_took() {
    let Some(redis) = redis_server::RedisServer::start("rls leased give-back") else {
        return;
    };
    let url = redis.url();
    let rls = Rls::start(&folder("leased-give-back"), CONFIG, &leased(&url));
    let mut c = client(&rls).await;
    let both = || {
        request(vec![
            descriptor("remote_address", "3.3.3.3"),
            descriptor("user", "ada"),
        ])
    };
    assert!(!over(&ask(&mut c, both()).await));
    assert!(!over(&ask(&mut c, both()).await));
    // The user's 2 an hour are spent: refused, and the address's token goes back.
    let refused = ask(&mut c, both()).await;
    assert!(over(&refused));
    assert_eq!(refused.statuses[1].code, Code::OverLimit as i32);
    // So exactly 4 - 2 are left for the address, wherever they now lie (lease or store).
    let addr = || request(vec![descriptor("remote_address", "3.3.3.3")]);
    let mut admitted = 0;
    for _ in 0..6 {
        admitted += usize::from(!over(&ask(&mut c, addr()).await));
    }
    assert_eq!(admitted, 2, "what the refusal took came back, once");
}

#[tokio::test]
async fn leased_replicas_never_pass_the_shared_quota_and_mostly_skip_the_store() {
    let Some(redis) = redis_server::RedisServer::start("rls leased fleet") else {
        return;
    };
    let url = redis.url();
    let a = Rls::start(&folder("leased-a"), CONFIG, &leased(&url));
    let b = Rls::start(&folder("leased-b"), CONFIG, &leased(&url));
    let script = Rls::start(&folder("leased-script"), CONFIG, &["--redis", &url]);
    let mut clients = [client(&a).await, client(&b).await, client(&script).await];
    // Three replicas, two on leases and one deciding each request on the store, share one key:
    // over 30 requests within the minute, at most its 4 pass in all.
    let addr = || request(vec![descriptor("remote_address", "4.4.4.4")]);
    let mut admitted = 0;
    for i in 0..30 {
        admitted += usize::from(!over(&ask(&mut clients[i % 3], addr()).await));
    }
    assert!((1..=4).contains(&admitted), "{admitted} admitted of 4");
    // Below its quota, a replica on leases decides almost every request without the store: a
    // key's first request waits for a lease, then background refills keep ahead of the demand.
    let config = "domain: edge\ndescriptors:\n  - key: client\n    rate_limit: {unit: second, requests_per_unit: 100000}\n";
    let hot = Rls::start(&folder("leased-hot"), config, &leased(&url));
    let mut c = client(&hot).await;
    let calls = 2000;
    for i in 0..calls {
        let r = request(vec![descriptor("client", ["x", "y"][i % 2])]);
        assert!(!over(&ask(&mut c, r).await));
    }
    let (_, metrics) = hot.get("/metrics");
    let trips: f64 = metrics
        .lines()
        .find(|l| l.starts_with("rls_store_round_trips_total{domain=\"edge\"}"))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .expect("the round trips are counted");
    assert!(
        trips >= 2.0 && trips <= calls as f64 * 0.05,
        "{trips} of {calls} decisions waited for the store"
    );
}

#[tokio::test]
async fn a_key_flood_at_the_lease_cap_admits_nothing_extra() {
    let Some(redis) = redis_server::RedisServer::start("rls leased flood") else {
        return;
    };
    let url = redis.url();
    let mut flags = leased(&url).to_vec();
    flags.extend(["--max-keys", "2"]);
    let rls = Rls::start(&folder("leased-flood"), CONFIG, &flags);
    let mut c = client(&rls).await;
    let user = |i: usize| request(vec![descriptor("user", &format!("u{i}"))]);
    // Ten users through a table of two leases: none gets more than its 2 an hour once its
    // lease has made room for another's (the store still holds what each spent). A lease made
    // room for drops its unspent tokens, so a user may get fewer.
    let mut admitted = [0; 10];
    for _ in 0..3 {
        for (i, a) in admitted.iter_mut().enumerate() {
            *a += usize::from(!over(&ask(&mut c, user(i)).await));
        }
    }
    assert!(admitted.iter().all(|a| (1..=2).contains(a)), "{admitted:?}");
}

#[tokio::test]
async fn a_store_killed_under_leases_spends_them_then_is_unavailable_and_recovers() {
    let Some(mut redis) = redis_server::RedisServer::start("rls leased outage") else {
        return;
    };
    let url = redis.url();
    let rls = Rls::start(&folder("leased-outage"), CONFIG, &leased(&url));
    let mut c = client(&rls).await;
    let addr = |a: &str| request(vec![descriptor("remote_address", a)]);
    // A key with a lease in hand: its first request waits for one, later ones are local.
    assert!(!over(&ask(&mut c, addr("7.7.7.7")).await));
    redis.kill();
    // What the lease holds is still spent with the store gone, never more than the quota's 4;
    // a key without a lease, or one whose lease is spent, gets no decision.
    let mut local = 1;
    for _ in 0..6 {
        match c.should_rate_limit(addr("7.7.7.7")).await {
            Ok(answer) => local += usize::from(!over(&answer.into_inner())),
            Err(e) => assert_eq!(e.code(), tonic::Code::Unavailable, "{e:?}"),
        }
    }
    assert!(local <= 4, "{local} admitted of 4 with the store gone");
    let e = c.should_rate_limit(addr("8.8.8.8")).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unavailable, "{e:?}");
    redis.restart();
    admitted_after_restart(&mut c, addr("8.8.8.8")).await;
}

//! The service over the wire: the binary started on free loopback ports, driven by Envoy's own
//! gRPC client (envoy-types, tonic) for each point of the protocol's semantics, reload and
//! shutdown.

mod common;

use std::time::Duration;

use common::{Rls, ask, client, folder, over, request};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::google::protobuf::UInt64Value;
use tonic::transport::Channel;

const CONFIG: &str = r#"
domain: edge
descriptors:
  - key: remote_address
    rate_limit:
      unit: minute
      requests_per_unit: 3
  - key: remote_address
    value: 10.0.0.1
    rate_limit:
      unlimited: true
  - key: path
    value: /login
    descriptors:
      - key: user
        rate_limit:
          unit: hour
          requests_per_unit: 2
  - key: tenant
    shadow_mode: true
    rate_limit:
      unit: second
      requests_per_unit: 1
"#;

fn descriptor(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|&(key, value)| Entry {
                key: key.into(),
                value: value.into(),
            })
            .collect(),
        ..RateLimitDescriptor::default()
    }
}

#[tokio::test]
async fn each_value_is_limited_apart_with_exact_figures() {
    let rls = Rls::start(&folder("values"), CONFIG, &[]);
    let mut c = client(&rls).await;
    let a = || request(vec![descriptor(&[("remote_address", "1.2.3.4")])]);
    let mut codes = Vec::new();
    for _ in 0..4 {
        codes.push(over(&ask(&mut c, a()).await));
    }
    assert_eq!(codes, [false, false, false, true]);
    let b = ask(
        &mut c,
        request(vec![descriptor(&[("remote_address", "5.6.7.8")])]),
    )
    .await;
    let s = &b.statuses[0];
    assert_eq!(s.code, Code::Ok as i32);
    assert_eq!(s.limit_remaining, 2);
    let limit = s.current_limit.as_ref().unwrap();
    assert_eq!(
        (limit.requests_per_unit, limit.name.as_str()),
        (3, "edge.remote_address")
    );
    // One of three spent: full again in one period, 20 s, within the test's own span.
    let reset = s.duration_until_reset.unwrap();
    assert!((19..=20).contains(&reset.seconds), "{reset:?}");
    // A refused one says when the key is full: three periods at most.
    let refused = ask(&mut c, a()).await;
    let r = &refused.statuses[0];
    assert_eq!((r.code, r.limit_remaining), (Code::OverLimit as i32, 0));
    assert!((59..=60).contains(&r.duration_until_reset.unwrap().seconds));
}

#[tokio::test]
async fn a_refusal_spends_nothing_from_the_other_descriptors() {
    let rls = Rls::start(&folder("all-or-nothing"), CONFIG, &[]);
    let mut c = client(&rls).await;
    let both = |user: &str| {
        request(vec![
            descriptor(&[("remote_address", "9.9.9.9")]),
            descriptor(&[("path", "/login"), ("user", user)]),
        ])
    };
    assert!(!over(&ask(&mut c, both("ada")).await));
    assert!(!over(&ask(&mut c, both("ada")).await));
    let refused = ask(&mut c, both("ada")).await;
    assert!(over(&refused));
    // In request order: the address had room (and kept it), the login limit refused.
    assert_eq!(refused.statuses[0].code, Code::Ok as i32);
    assert_eq!(refused.statuses[0].limit_remaining, 1);
    assert_eq!(refused.statuses[1].code, Code::OverLimit as i32);
    // The address has exactly its 1 left: the refusal took nothing.
    let addr = || request(vec![descriptor(&[("remote_address", "9.9.9.9")])]);
    assert!(!over(&ask(&mut c, addr()).await));
    assert!(over(&ask(&mut c, addr()).await));
}

#[tokio::test]
async fn hits_unlimited_unmatched_and_shadow() {
    let rls = Rls::start(&folder("semantics"), CONFIG, &[]);
    let mut c = client(&rls).await;
    // hits_addend on the request, overridden per descriptor.
    let mut r = request(vec![descriptor(&[("remote_address", "2.2.2.2")])]);
    r.hits_addend = 2;
    assert_eq!(ask(&mut c, r.clone()).await.statuses[0].limit_remaining, 1);
    r.descriptors[0].hits_addend = Some(UInt64Value { value: 5 });
    let costly = ask(&mut c, r).await;
    assert!(over(&costly), "5 hits never fit a burst of 3");
    // Unlimited, and no match at all: OK, no limit.
    for d in [
        descriptor(&[("remote_address", "10.0.0.1")]),
        descriptor(&[("nothing", "here")]),
        descriptor(&[("path", "/login")]),
    ] {
        let answer = ask(&mut c, request(vec![d])).await;
        assert!(!over(&answer));
        assert_eq!(answer.statuses[0].current_limit, None);
    }
    // Shadow mode: over the limit, answered OK, counted as shadowed.
    let t = || request(vec![descriptor(&[("tenant", "t")])]);
    assert!(!over(&ask(&mut c, t()).await));
    assert!(!over(&ask(&mut c, t()).await));
    let (code, metrics) = rls.get("/metrics");
    assert_eq!(code, 200);
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("rls_descriptors_total")
                && l.contains("limit=\"edge.tenant\"")
                && l.contains("outcome=\"shadowed\"")
                && l.ends_with(" 1")),
        "{metrics}"
    );
    assert!(metrics.contains("rls_decision_seconds_bucket"), "{metrics}");
}

#[tokio::test]
async fn bad_requests_get_invalid_argument_and_the_service_stays_up() {
    let rls = Rls::start(&folder("bad"), CONFIG, &[]);
    let mut c = client(&rls).await;
    let big = "x".repeat(1 << 20);
    let negative = RateLimitDescriptor {
        is_negative_hits: true,
        ..descriptor(&[("remote_address", "1")])
    };
    let cases = [
        RateLimitRequest {
            domain: String::new(),
            ..request(vec![descriptor(&[("a", "b")])])
        },
        request(vec![]),
        request(vec![descriptor(&[("", "b")])]),
        request(vec![descriptor(&[("remote_address", &big)])]),
        request(vec![negative]),
    ];
    for r in cases {
        let e = c.should_rate_limit(r).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    }
    let ok = ask(
        &mut c,
        request(vec![descriptor(&[("remote_address", "1")])]),
    )
    .await;
    assert!(!over(&ok));
}

#[tokio::test]
async fn sighup_reloads_keeping_state_and_refuses_a_bad_file() {
    let mut rls = Rls::start(&folder("reload"), CONFIG, &[]);
    let mut c = client(&rls).await;
    let a = || request(vec![descriptor(&[("remote_address", "3.3.3.3")])]);
    for _ in 0..3 {
        assert!(!over(&ask(&mut c, a()).await));
    }
    // A bad file: refused, said so, and the old configuration still decides.
    let file = rls.dir.join("config.yaml");
    std::fs::write(&file, CONFIG.replace("unit: minute", "unit: fortnight")).unwrap();
    rls.signal("HUP");
    let line = rls.wait_for("reload refused", Duration::from_secs(10));
    assert!(line.contains("fortnight"), "{line}");
    assert!(
        over(&ask(&mut c, a()).await),
        "the old limit, with its state"
    );
    // A larger limit: in force at once, the spent debt carried as time (3 of 3 spent is 60 s,
    // the whole of a 6-a-minute window too), so the key is still over, now under 6.
    std::fs::write(
        &file,
        CONFIG.replace("requests_per_unit: 3", "requests_per_unit: 6"),
    )
    .unwrap();
    rls.signal("HUP");
    let line = rls.wait_for("reloaded", Duration::from_secs(10));
    assert!(line.contains("1 changed"), "{line}");
    let after = ask(&mut c, a()).await;
    assert!(over(&after));
    assert_eq!(
        after.statuses[0]
            .current_limit
            .as_ref()
            .unwrap()
            .requests_per_unit,
        6
    );
    let fresh = ask(
        &mut c,
        request(vec![descriptor(&[("remote_address", "3.3.3.4")])]),
    )
    .await;
    assert_eq!(fresh.statuses[0].limit_remaining, 5);
    // Removed: no longer counted.
    std::fs::write(&file, "domain: edge\ndescriptors: []\n").unwrap();
    rls.signal("HUP");
    rls.wait_for("reloaded", Duration::from_secs(10));
    let gone = ask(&mut c, a()).await;
    assert!(!over(&gone));
    assert_eq!(gone.statuses[0].current_limit, None);
    let (_, metrics) = rls.get("/metrics");
    assert!(
        metrics.contains("rls_config_reloads_total{result=\"refused\"} 1"),
        "{metrics}"
    );
}

#[tokio::test]
async fn sigterm_drains_and_exits_cleanly() {
    use tonic_health::pb::HealthCheckRequest;
    use tonic_health::pb::health_client::HealthClient;
    let mut rls = Rls::start(&folder("drain"), CONFIG, &["--drain-secs", "5"]);
    let channel = Channel::from_shared(rls.url())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut health = HealthClient::new(channel);
    let service = "envoy.service.ratelimit.v3.RateLimitService";
    let up = health
        .check(HealthCheckRequest {
            service: service.into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(up.status, 1, "SERVING");
    assert_eq!(rls.get("/healthz").0, 200);
    rls.signal("TERM");
    rls.wait_for("draining", Duration::from_secs(5));
    assert_eq!(rls.exit_within(Duration::from_secs(10)), Some(0));
    rls.wait_for("stopped", Duration::from_secs(2));
}

#[test]
fn a_bad_configuration_at_start_is_an_error_with_its_place() {
    let dir = folder("bad-start");
    let file = dir.join("bad.yaml");
    std::fs::write(&file, "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: month, requests_per_unit: 5}\n").unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_atomic-limiter-rls"))
        .arg("--config")
        .arg(&file)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(
        log.contains("configuration refused")
            && log.contains("bad.yaml: d.k")
            && log.contains("month"),
        "{log}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

//! The layer driven with `oneshot`: statuses, every header mode, each key extractor; the fields
//! read back with a structured-field parser, as the draft requires of clients.

use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ::http::{HeaderMap, Request, Response, StatusCode};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use sfv::{BareItem, List, ListEntry, Parser};
use tower::{Service, ServiceExt, service_fn};

use super::*;
use crate::clock::ManualClock;
use crate::gcra::Gcra;
use crate::keyed::table::Keyed;
use crate::quota::Quota;

type Table<K> = Keyed<K, Gcra<ManualClock>>;

async fn hello(_: Request<()>) -> Result<Response<Full<Bytes>>, Infallible> {
    Ok(Response::new(Full::new(Bytes::from_static(b"hello"))))
}

fn from(peer: &str) -> Request<()> {
    let mut request = Request::get("/").body(()).unwrap();
    request
        .extensions_mut()
        .insert(peer.parse::<SocketAddr>().unwrap());
    request
}

fn with_header(mut request: Request<()>, name: &str, value: &str) -> Request<()> {
    request.headers_mut().append(
        name.parse::<::http::HeaderName>().unwrap(),
        value.parse().unwrap(),
    );
    request
}

/// One request through a fresh service of `layer`.
async fn send<X, Be>(layer: &RateLimitLayer<X, Be>, request: Request<()>) -> Response<Bytes>
where
    X: KeyExtractor,
    Be: Backend<X::Key>,
{
    let response = layer
        .layer(service_fn(hello))
        .oneshot(request)
        .await
        .unwrap();
    let (parts, body) = response.into_parts();
    let body = body.collect().await.unwrap().to_bytes();
    Response::from_parts(parts, body)
}

use tower_layer::Layer;

/// The parameters of the one member of a structured-field List, by name, as integers; and the
/// member's String.
fn sf_item(headers: &HeaderMap, name: &str) -> (String, Vec<(String, i64)>) {
    let text = headers
        .get(name)
        .unwrap_or_else(|| panic!("no {name}"))
        .to_str()
        .unwrap();
    let list: List = Parser::new(text)
        .parse()
        .unwrap_or_else(|e| panic!("{name}: {text:?} is not a structured-field List: {e}"));
    assert_eq!(list.len(), 1, "{name}: {text}");
    let ListEntry::Item(item) = &list[0] else {
        panic!("{name}: {text}: an inner list")
    };
    let BareItem::String(id) = &item.bare_item else {
        panic!("{name}: {text}: the member is not a String")
    };
    let params = item
        .params
        .iter()
        .map(|(k, v)| {
            let BareItem::Integer(i) = v else {
                panic!("{name}: {text}: {} is not an Integer", k.as_str())
            };
            (k.as_str().to_owned(), i64::from(*i))
        })
        .collect();
    (id.as_str().to_owned(), params)
}

fn param(params: &[(String, i64)], name: &str) -> Option<i64> {
    params.iter().find(|(k, _)| k == name).map(|(_, v)| *v)
}

fn header_u64(headers: &HeaderMap, name: &str) -> u64 {
    headers
        .get(name)
        .unwrap_or_else(|| panic!("no {name}"))
        .to_str()
        .unwrap()
        .parse()
        .unwrap()
}

fn table(quota: Quota, max_keys: usize, clock: &ManualClock) -> Arc<Table<IpKey>> {
    Arc::new(Keyed::gcra_with_clock(quota, max_keys, clock.clone()))
}

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

fn ip(s: &str) -> IpKey {
    IpKey::from(s.parse::<IpAddr>().unwrap())
}

fn key_of<X: KeyExtractor>(x: &X, request: &Request<()>) -> Result<X::Key, KeyError> {
    x.extract(&RequestHead::of(request))
}

#[test]
fn the_peer_address_with_ipv6_grouped() {
    let peer = PeerIp::new();
    assert_eq!(key_of(&peer, &from("192.0.2.1:80")), Ok(ip("192.0.2.1")));
    assert_eq!(
        key_of(&peer, &from("[2001:db8:1:2:3:4:5:6]:80")),
        Ok(ip("2001:db8:1:2::"))
    );
    // Two addresses of one /64 are one client; of two /64s, two.
    assert_eq!(
        key_of(&peer, &from("[2001:db8:1:2::9]:80")),
        key_of(&peer, &from("[2001:db8:1:2:ffff::1]:80"))
    );
    assert_ne!(
        key_of(&peer, &from("[2001:db8:1:2::9]:80")),
        key_of(&peer, &from("[2001:db8:1:3::9]:80"))
    );
    assert_eq!(
        key_of(&peer, &from("[::ffff:192.0.2.1]:80")),
        Ok(ip("192.0.2.1"))
    );
    assert_eq!(
        key_of(&peer.ipv6_prefix(128), &from("[2001:db8::1]:80")),
        Ok(ip("2001:db8::1"))
    );
    assert_eq!(
        key_of(&peer.ipv6_prefix(0), &from("[2001:db8::1]:80")),
        Ok(ip("::"))
    );
    assert_eq!(
        key_of(&peer.ipv6_prefix(200), &from("[2001:db8::1]:80")),
        Ok(ip("2001:db8::1"))
    );
    let bare = Request::get("/").body(()).unwrap();
    assert_eq!(key_of(&peer, &bare), Err(KeyError::NoPeerAddress));
}

#[test]
fn the_proxy_chain_is_read_from_the_right_and_only_behind_a_trusted_peer() {
    let xff = ForwardedIp::new([
        "10.0.0.0/8".parse().unwrap(),
        "2001:db8:ff::/48".parse().unwrap(),
    ]);
    let via = |peer: &str, chain: &str| with_header(from(peer), "x-forwarded-for", chain);
    // The client's own entry, on the left, is never what decides.
    assert_eq!(
        key_of(&xff, &via("10.0.0.1:1", "6.6.6.6, 203.0.113.9, 10.0.0.2")),
        Ok(ip("203.0.113.9"))
    );
    // An untrusted peer: its header is ignored, the peer is the client.
    assert_eq!(
        key_of(&xff, &via("198.51.100.7:1", "203.0.113.9")),
        Ok(ip("198.51.100.7"))
    );
    // No header: the trusted peer itself.
    assert_eq!(key_of(&xff, &from("10.0.0.1:1")), Ok(ip("10.0.0.1")));
    // All trusted: the leftmost.
    assert_eq!(
        key_of(&xff, &via("10.0.0.1:1", "10.9.9.9, 10.0.0.2")),
        Ok(ip("10.9.9.9"))
    );
    // Not an address where the client should be: the trusted hop that wrote it.
    assert_eq!(
        key_of(&xff, &via("10.0.0.1:1", "6.6.6.6, garbage, 10.0.0.2")),
        Ok(ip("10.0.0.2"))
    );
    assert_eq!(
        key_of(&xff, &via("10.0.0.1:1", "unknown")),
        Ok(ip("10.0.0.1"))
    );
    // Ports and brackets; IPv6 grouped.
    assert_eq!(
        key_of(&xff, &via("[2001:db8:ff::1]:1", "[2001:db8:1:2::7]:443")),
        Ok(ip("2001:db8:1:2::"))
    );
    assert_eq!(
        key_of(&xff, &via("10.0.0.1:1", "203.0.113.9:5555")),
        Ok(ip("203.0.113.9"))
    );
    // Several field lines are one list, the last line last.
    let mut two = via("10.0.0.1:1", "6.6.6.6");
    two.headers_mut()
        .append("x-forwarded-for", "203.0.113.9, 10.0.0.3".parse().unwrap());
    assert_eq!(key_of(&xff, &two), Ok(ip("203.0.113.9")));

    let fwd = ForwardedIp::new(["10.0.0.0/8".parse().unwrap()]).header(ProxyHeader::Forwarded);
    let via = |chain: &str| with_header(from("10.0.0.1:1"), "forwarded", chain);
    assert_eq!(
        key_of(
            &fwd,
            &via("for=6.6.6.6, for=\"[2001:db8:cafe::17]:4711\";proto=https, For=10.0.0.2")
        ),
        Ok(ip("2001:db8:cafe::"))
    );
    assert_eq!(
        key_of(&fwd, &via("for=203.0.113.9;by=10.0.0.2;proto=http")),
        Ok(ip("203.0.113.9"))
    );
    // An obfuscated node, or an element with no `for`: the proxy that reported it.
    assert_eq!(
        key_of(&fwd, &via("for=_hidden, for=10.0.0.2")),
        Ok(ip("10.0.0.2"))
    );
    assert_eq!(key_of(&fwd, &via("proto=https")), Ok(ip("10.0.0.1")));
}

#[test]
fn a_header_global_and_custom_keys() {
    let api = HeaderKey::new(::http::HeaderName::from_static("x-api-key"));
    let request = with_header(from("192.0.2.1:1"), "x-api-key", "k-123");
    assert_eq!(key_of(&api, &request), Ok(b"k-123".to_vec()));
    assert_eq!(
        key_of(&api, &from("192.0.2.1:1")),
        Err(KeyError::MissingHeader(::http::HeaderName::from_static(
            "x-api-key"
        )))
    );
    // A value past the bound is no key: a flood of long values cannot swell the table.
    let long = with_header(from("192.0.2.1:1"), "x-api-key", &"k".repeat(257));
    assert_eq!(
        key_of(&api, &long),
        Err(KeyError::HeaderTooLong(::http::HeaderName::from_static(
            "x-api-key"
        )))
    );
    assert!(key_of(&api.clone().max_len(300), &long).is_ok());
    assert_eq!(key_of(&GlobalKey, &from("192.0.2.1:1")), Ok(()));
    let by_path =
        |head: &RequestHead<'_>| -> Result<String, KeyError> { Ok(head.uri().path().to_owned()) };
    assert_eq!(key_of(&by_path, &request), Ok("/".to_owned()));
}

#[tokio::test]
async fn key_errors_are_answered_without_a_decision() {
    let clock = ManualClock::new();
    let keyed: Arc<Table<Vec<u8>>> =
        Arc::new(Keyed::gcra_with_clock(Quota::per_second(1), 10, clock));
    let layer = RateLimitLayer::new(
        HeaderKey::new(::http::HeaderName::from_static("x-api-key")),
        keyed.clone(),
    );
    assert_eq!(
        send(&layer, from("192.0.2.1:1")).await.status(),
        StatusCode::BAD_REQUEST
    );
    let peer = RateLimitLayer::new(
        PeerIp::new(),
        table(Quota::per_second(1), 10, &ManualClock::new()),
    );
    let no_peer = Request::get("/").body(()).unwrap();
    assert_eq!(
        send(&peer, no_peer).await.status(),
        StatusCode::INTERNAL_SERVER_ERROR
    );
    assert!(keyed.is_empty());
    // Two API keys, two quotas; the same key from two addresses, one.
    let k = |peer: &str, key: &str| with_header(from(peer), "x-api-key", key);
    assert_eq!(
        send(&layer, k("192.0.2.1:1", "a")).await.status(),
        StatusCode::OK
    );
    assert_eq!(
        send(&layer, k("192.0.2.2:1", "b")).await.status(),
        StatusCode::OK
    );
    assert_eq!(
        send(&layer, k("192.0.2.3:1", "a")).await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
}

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

mod chains {
    //! Whatever a client writes into the proxy chain, the key is the address the first trusted
    //! proxy saw (or, where it hid it, that proxy): random client-written prefixes (addresses,
    //! trusted addresses, garbage, commas, quotes, `for=`), then the real client, then the trusted
    //! proxies that appended themselves.
    use super::*;
    use proptest::prelude::*;

    fn trusted() -> Vec<ipnet::IpNet> {
        ["10.0.0.0/8", "192.168.1.0/24", "2001:db8:ff::/48"]
            .iter()
            .map(|n| n.parse().unwrap())
            .collect()
    }

    fn junk() -> impl Strategy<Value = String> {
        prop_oneof![
            "[0-9]{1,3}\\.[0-9]{1,3}\\.[0-9]{1,3}\\.[0-9]{1,3}",
            Just("10.1.2.3".to_owned()),
            Just("192.168.1.9".to_owned()),
            Just("[2001:db8:ff::1]:80".to_owned()),
            Just("unknown".to_owned()),
            Just("for=6.6.6.6".to_owned()),
            Just("\"for=7.7.7.7, 8.8.8.8\"".to_owned()),
            "[ -~]{0,12}",
        ]
    }

    /// A client address outside every trusted range.
    fn client() -> impl Strategy<Value = IpAddr> {
        prop_oneof![
            (11u8..=191, any::<u8>(), any::<u8>(), 1u8..=254)
                .prop_map(|(a, b, c, d)| IpAddr::from([a, b, c, d])),
            any::<u64>().prop_map(|low| {
                IpAddr::from(std::net::Ipv6Addr::from(
                    (0x2001_0db8_0001_u128 << 80) | u128::from(low),
                ))
            }),
        ]
    }

    fn proxy() -> impl Strategy<Value = IpAddr> {
        prop_oneof![
            (any::<u8>(), any::<u8>(), 1u8..=254).prop_map(|(b, c, d)| IpAddr::from([10, b, c, d])),
            (1u8..=254).prop_map(|d| IpAddr::from([192, 168, 1, d])),
        ]
    }

    fn node(ip: IpAddr, header: ProxyHeader) -> String {
        match (header, ip) {
            (ProxyHeader::Forwarded, IpAddr::V6(v6)) => format!("for=\"[{v6}]:4711\""),
            (ProxyHeader::Forwarded, ip) => format!("for={ip};proto=https"),
            (_, ip) => ip.to_string(),
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn a_client_cannot_choose_its_key(
            written in proptest::collection::vec(junk(), 0..6),
            real in client(),
            hidden in any::<bool>(),
            hops in proptest::collection::vec(proxy(), 0..4),
            peer in proxy(),
            forwarded in any::<bool>(),
            split_lines in any::<bool>(),
        ) {
            let header = if forwarded { ProxyHeader::Forwarded } else { ProxyHeader::XForwardedFor };
            let name = if forwarded { "forwarded" } else { "x-forwarded-for" };
            let key = ForwardedIp::new(trusted()).header(header).ipv6_prefix(128);
            // What the client sent, then what each proxy appended (the first one the real client).
            let client_part = written.join(", ");
            // Or the first proxy hid the client (`unknown`): then the key is the proxy that wrote
            // that, the next hop to the right.
            let first = if hidden { "unknown".to_owned() } else { node(real, header) };
            let first = if hidden && forwarded { format!("for={first}") } else { first };
            let mut appended = vec![first];
            appended.extend(hops.iter().map(|h| node(*h, header)));
            let mut request = from(&SocketAddr::new(peer, 443).to_string());
            let proxies_part = appended.join(", ");
            let lines: Vec<String> = if split_lines {
                vec![client_part, proxies_part]
            } else if client_part.is_empty() {
                vec![proxies_part]
            } else {
                vec![format!("{client_part}, {proxies_part}")]
            };
            for line in lines {
                if let Ok(value) = ::http::HeaderValue::from_str(&line) {
                    request.headers_mut().append(name, value);
                } else {
                    return Ok(());
                }
            }
            let expected = if hidden { hops.first().copied().unwrap_or(peer) } else { real };
            prop_assert_eq!(key_of(&key, &request), Ok(IpKey::from(expected)));
        }
    }
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
#[path = "../../tests/common/counters.rs"]
mod counters;

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

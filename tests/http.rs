//! The tower layer in front of a real axum server on loopback, driven by a real HTTP client.

#![cfg(all(feature = "tower", feature = "axum"))]

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use atomic_limiter::http::{ForwardedIp, IpKey, PeerIp, RateLimitLayer};
use atomic_limiter::{Gcra, Keyed, ManualClock, Quota};
use axum::Router;
use axum::routing::get;
use reqwest::StatusCode;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// An axum server on a free loopback port, stopped when dropped.
struct Server {
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
}

impl Server {
    async fn start(app: Router) -> Server {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let service = app.into_make_service_with_connect_info::<SocketAddr>();
            axum::serve(listener, service)
                .with_graceful_shutdown(async {
                    let _ = stopped.await;
                })
                .await
                .unwrap();
        });
        Server {
            addr,
            stop: Some(stop),
            task,
        }
    }

    fn url(&self) -> String {
        format!("http://{}/", self.addr)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        self.task.abort();
    }
}

fn hello() -> Router {
    Router::new().route("/", get(|| async { "hello\n" }))
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(20))
        .build()
        .unwrap()
}

fn retry_after(response: &reqwest::Response) -> u64 {
    response.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap()
}

/// axum #2634's scenario: 1 500 requests at once against 5 per second. tower's own `RateLimit`
/// let all 1 500 through; this layer admits the quota and refuses the rest with a 429.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifteen_hundred_concurrent_requests_admit_exactly_the_quota() {
    // A clock moved by hand: however long the 1 500 take, exactly the burst is due.
    let clock = ManualClock::new();
    let keyed: Keyed<IpKey, Gcra<ManualClock>> =
        Keyed::gcra_with_clock(Quota::per_second(5), 1000, clock.clone());
    let server = Server::start(hello().layer(RateLimitLayer::new(PeerIp::new(), keyed))).await;
    let client = client();
    for wave in 0..2 {
        let requests: Vec<_> = (0..1500)
            .map(|_| {
                let (client, url) = (client.clone(), server.url());
                tokio::spawn(async move {
                    let response = client.get(url).send().await.unwrap();
                    let status = response.status();
                    let retry =
                        (status == StatusCode::TOO_MANY_REQUESTS).then(|| retry_after(&response));
                    (status, retry)
                })
            })
            .collect();
        let (mut admitted, mut refused) = (0, 0);
        for request in requests {
            match request.await.unwrap() {
                (StatusCode::OK, _) => admitted += 1,
                (StatusCode::TOO_MANY_REQUESTS, Some(retry)) => {
                    assert_eq!(retry, 1);
                    refused += 1;
                }
                other => panic!("unexpected {other:?}"),
            }
        }
        assert_eq!((admitted, refused), (5, 1495), "wave {wave}");
        // A second on: five more, exactly.
        clock.advance(Duration::from_secs(1));
    }
}

/// A client that waits out `Retry-After` is admitted: the value is rounded up, never down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_honouring_retry_after_is_never_refused_again() {
    // Waits of 0.7 s, 1.4 s and so on: the fractions `as_secs()` would floor to 0 or 1.
    for period_ms in [700, 1400] {
        let quota = Quota::with_period(Duration::from_millis(period_ms)).with_burst(2);
        let keyed: Keyed<IpKey, Gcra> = Keyed::gcra(quota, 1000);
        let server = Server::start(hello().layer(RateLimitLayer::new(PeerIp::new(), keyed))).await;
        let client = client();
        let mut rounds = 0;
        // Bounded: three refusals, each waited out.
        for _ in 0..20 {
            let response = client.get(server.url()).send().await.unwrap();
            if response.status() == StatusCode::OK {
                continue;
            }
            assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
            let wait = retry_after(&response);
            // Whole seconds, at least 1, at most the period rounded up.
            assert!((1..=period_ms.div_ceil(1000)).contains(&wait), "{wait}");
            tokio::time::sleep(Duration::from_secs(wait)).await;
            let after = client.get(server.url()).send().await.unwrap();
            assert_eq!(
                after.status(),
                StatusCode::OK,
                "refused after waiting {wait} s"
            );
            rounds += 1;
            if rounds == 3 {
                break;
            }
        }
        assert_eq!(rounds, 3);
    }
}

/// A client that writes its own `X-Forwarded-For` from an untrusted address keeps its own key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spoofed_forwarded_for_does_not_change_the_key() {
    let quota = Quota::per_minute(3);
    let client = client();
    let send = |server: &Server, xff: String| {
        client
            .get(server.url())
            .header("x-forwarded-for", xff)
            .send()
    };

    // Loopback is not a trusted proxy here: every made-up address is still 127.0.0.1.
    let keyed: Keyed<IpKey, Gcra> = Keyed::gcra(quota, 1000);
    let untrusted = ForwardedIp::new(["10.0.0.0/8".parse().unwrap()]);
    let server = Server::start(hello().layer(RateLimitLayer::new(untrusted, keyed))).await;
    let mut admitted = 0;
    for i in 0..20 {
        let response = send(&server, format!("203.0.113.{i}")).await.unwrap();
        admitted += usize::from(response.status() == StatusCode::OK);
    }
    assert_eq!(admitted, 3);
    drop(server);

    // Behind a trusted proxy (loopback, here), the address it appended is the key, and what the
    // client put before it is not.
    let keyed: Keyed<IpKey, Gcra> = Keyed::gcra(quota, 1000);
    let trusted = ForwardedIp::new(["127.0.0.1/32".parse().unwrap()]);
    let server = Server::start(hello().layer(RateLimitLayer::new(trusted, keyed))).await;
    let mut admitted = 0;
    for i in 0..20 {
        // The client rotates its own entry; the proxy appends the real 198.51.100.7.
        let response = send(&server, format!("203.0.113.{i}, 198.51.100.7"))
            .await
            .unwrap();
        admitted += usize::from(response.status() == StatusCode::OK);
    }
    assert_eq!(admitted, 3);
    // Distinct real clients behind the proxy each have their own quota.
    for i in 0..5 {
        let response = send(&server, format!("192.0.2.{i}")).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
    }
}

/// A bounded load on loopback: the admitted rate is the quota's within 1 %.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_load_the_admitted_rate_is_the_quota() {
    const RATE: u64 = 400;
    const BURST: u32 = 10;
    // Room for the one key only: concurrent first checks of it must not be told the table is full.
    let keyed: Keyed<(), Gcra> = Keyed::gcra(Quota::per_second(RATE).with_burst(BURST), 1);
    // When each admitted request reached the handler.
    let admitted = Arc::new(Mutex::new(Vec::<Instant>::with_capacity(4096)));
    let app = Router::new()
        .route(
            "/",
            get({
                let admitted = admitted.clone();
                move || {
                    admitted.lock().unwrap().push(Instant::now());
                    async { "ok" }
                }
            }),
        )
        .layer(RateLimitLayer::new(atomic_limiter::http::GlobalKey, keyed));
    let server = Server::start(app).await;
    let client = client();
    let deadline = Instant::now() + Duration::from_secs(3);
    let workers: Vec<_> = (0..8)
        .map(|_| {
            let (client, url) = (client.clone(), server.url());
            tokio::spawn(async move {
                let (mut ok, mut refused) = (0u64, 0u64);
                // Bounded in time and in count.
                for _ in 0..200_000 {
                    if Instant::now() >= deadline {
                        break;
                    }
                    match client.get(&url).send().await.unwrap().status() {
                        StatusCode::OK => ok += 1,
                        StatusCode::TOO_MANY_REQUESTS => refused += 1,
                        other => panic!("unexpected {other}"),
                    }
                }
                (ok, refused)
            })
        })
        .collect();
    let (mut ok, mut refused) = (0, 0);
    for worker in workers {
        let (o, r) = worker.await.unwrap();
        ok += o;
        refused += r;
    }
    let times = admitted.lock().unwrap().clone();
    assert_eq!(times.len() as u64, ok);
    // The demand was well over the quota, or the test says nothing.
    assert!(
        refused > ok,
        "admitted {ok}, refused {refused}: the load did not saturate"
    );
    let span = times.last().unwrap().duration_since(times[0]).as_secs_f64();
    let expected = f64::from(BURST) + RATE as f64 * span;
    let error = (ok as f64 - expected).abs() / expected;
    println!(
        "admitted {ok} in {span:.3} s (quota allows {expected:.1}), refused {refused}: error {:.3} %",
        error * 100.0
    );
    assert!(
        error < 0.01,
        "admitted {ok}, the quota allows {expected:.1} over {span:.3} s"
    );
}

#[cfg(feature = "redis")]
#[path = "common/redis_server.rs"]
mod redis_server;

/// The Redis limiters behind the same layer: one quota per client address across nodes
/// (`RedisGcra`), and one quota for the whole service spent from a local lease (`Leased`).
#[cfg(feature = "redis")]
mod redis_backend {
    use super::redis_server;
    use super::*;
    use atomic_limiter::http::GlobalKey;
    use atomic_limiter::redis::{LeaseOptions, Leased, RedisGcra, RedisOptions, RedisStore};

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn two_nodes_share_one_quota_per_client_in_redis() {
        let Some(redis) = redis_server::RedisServer::start("http redis backend") else {
            return;
        };
        let options = RedisOptions::default();
        let quota = Quota::per_minute(4);
        // Two servers, as two nodes, with a limiter each on one Redis.
        let mut nodes = Vec::new();
        for _ in 0..2 {
            let store = RedisStore::connect(&redis.url(), &options).await.unwrap();
            let limiter = RedisGcra::new(store, "http-test", quota).unwrap();
            let layer = RateLimitLayer::new(PeerIp::new(), limiter);
            nodes.push(Server::start(hello().layer(layer)).await);
        }
        let client = client();
        let (mut admitted, mut refused) = (0, 0);
        for i in 0..12 {
            let response = client.get(nodes[i % 2].url()).send().await.unwrap();
            match response.status() {
                StatusCode::OK => admitted += 1,
                StatusCode::TOO_MANY_REQUESTS => {
                    // A token every 15 s: whole seconds, never 0.
                    assert!((1..=15).contains(&retry_after(&response)));
                    let field = response.headers()["ratelimit"].to_str().unwrap();
                    assert!(field.starts_with("\"default\";r=0;t="), "{field}");
                    refused += 1;
                }
                other => panic!("unexpected {other}"),
            }
        }
        assert_eq!((admitted, refused), (4, 8));
    }

    /// The store killed mid-use: under the default fail-closed policy the layer answers `503`
    /// with a `Retry-After` (the server's trouble, not the client's rate), and admits again once
    /// the store is back.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_store_killed_mid_use_is_a_503_then_recovers() {
        let Some(mut redis) = redis_server::RedisServer::start("http redis outage") else {
            return;
        };
        let options = RedisOptions::default();
        let store = RedisStore::connect(&redis.url(), &options).await.unwrap();
        let limiter = RedisGcra::new(store, "http-outage", Quota::per_second(1000)).unwrap();
        let server =
            Server::start(hello().layer(RateLimitLayer::new(PeerIp::new(), limiter))).await;
        let client = client();
        assert_eq!(
            client.get(server.url()).send().await.unwrap().status(),
            StatusCode::OK
        );
        redis.kill();
        let down = client.get(server.url()).send().await.unwrap();
        assert_eq!(down.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert!(retry_after(&down) >= 1);
        assert!(down.headers().get("ratelimit").is_none());
        redis.restart();
        // Bounded: back within a few seconds (the breaker's cooldown and a reconnect).
        let start = Instant::now();
        loop {
            let status = client.get(server.url()).send().await.unwrap().status();
            if status == StatusCode::OK {
                break;
            }
            assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
            assert!(
                start.elapsed() < Duration::from_secs(5),
                "the store never came back"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_global_quota_from_a_lease() {
        let Some(redis) = redis_server::RedisServer::start("http leased backend") else {
            return;
        };
        let options = RedisOptions::default();
        let store = RedisStore::connect(&redis.url(), &options).await.unwrap();
        let remote = RedisGcra::new(store, "http-lease", Quota::per_minute(10)).unwrap();
        let leased = Leased::new(remote, "service", LeaseOptions::default());
        let server = Server::start(hello().layer(RateLimitLayer::new(GlobalKey, leased))).await;
        let client = client();
        let mut admitted = 0;
        for _ in 0..30 {
            let status = client.get(server.url()).send().await.unwrap().status();
            assert!(matches!(
                status,
                StatusCode::OK | StatusCode::TOO_MANY_REQUESTS
            ));
            admitted += usize::from(status == StatusCode::OK);
        }
        // The burst of 10, and at most a token more in the second the test takes.
        assert!((10..=11).contains(&admitted), "{admitted}");
    }

    /// Redis policies in one layer, on two nodes: a per-key and a global limit on one limiter,
    /// decided in one script all or nothing, after a local per-client policy. A refusal by the
    /// per-key limit spends nothing from the global one (the other key then gets exactly what
    /// is left of it), names only the policy that refused, and lists every policy in the
    /// fields; a local refusal spends nothing on the store.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn redis_policies_decide_all_or_nothing_in_one_call() {
        use atomic_limiter::http::{HeaderKey, Policy, PolicyLayer};
        use axum::http::HeaderName;
        let Some(redis) = redis_server::RedisServer::start("http redis policies") else {
            return;
        };
        let options = RedisOptions::default();
        let limits = [
            ("per-key", Quota::per_minute(3)),
            ("global", Quota::per_minute(5)),
        ];
        let api_key = || HeaderKey::new(HeaderName::from_static("x-api-key"));
        let mut nodes = Vec::new();
        let mut limiters = Vec::new();
        for _ in 0..2 {
            let store = RedisStore::connect(&redis.url(), &options).await.unwrap();
            let limiter =
                RedisGcra::with_limits(store, "http-policies", limits, options.clone()).unwrap();
            let layer = PolicyLayer::builder()
                .policy(Policy::new(
                    "per-client",
                    PeerIp::new(),
                    Keyed::gcra(Quota::per_minute(6), 10),
                ))
                .policy(Policy::redis("per-key", api_key(), &limiter, "per-key").unwrap())
                .policy(Policy::redis("global", GlobalKey, &limiter, "global").unwrap())
                .problem_json(true)
                .build();
            nodes.push(Server::start(hello().layer(layer)).await);
            limiters.push(limiter);
        }
        let client = client();
        let mut i = 0;
        let mut send = |key: &'static str| {
            i += 1;
            client
                .get(nodes[i % 2].url())
                .header("x-api-key", key)
                .send()
        };
        for _ in 0..3 {
            assert_eq!(send("a").await.unwrap().status(), StatusCode::OK);
        }
        let refused = send("a").await.unwrap();
        assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
        let policy = refused.headers()["ratelimit-policy"]
            .to_str()
            .unwrap()
            .to_owned();
        let field = refused.headers()["ratelimit"].to_str().unwrap().to_owned();
        // Every policy listed; the per-key one empty, the global one with 2 left.
        assert!(
            policy
                .starts_with("\"per-client\";q=6;w=60, \"per-key\";q=3;w=60, \"global\";q=5;w=60"),
            "{policy}"
        );
        assert!(field.contains("\"per-key\";r=0;t="), "{field}");
        assert!(field.contains("\"global\";r=2;t="), "{field}");
        let retry = retry_after(&refused);
        assert!((1..=20).contains(&retry), "{retry}");
        let body = refused.text().await.unwrap();
        assert!(
            body.contains(r#""violated-policies":["per-key"]"#),
            "{body}"
        );
        // The refusal took nothing from the global limit: key b gets exactly its last 2.
        assert_eq!(send("b").await.unwrap().status(), StatusCode::OK);
        assert_eq!(send("b").await.unwrap().status(), StatusCode::OK);
        let refused = send("b").await.unwrap();
        assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
        let body = refused.text().await.unwrap();
        assert!(body.contains(r#""violated-policies":["global"]"#), "{body}");
        // The local policy gave back what it took for both refusals: 5 of its 6 are spent, so
        // key c passes it, and is refused by the empty global limit, spending nothing.
        let refused = send("c").await.unwrap();
        assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
        let body = refused.text().await.unwrap();
        assert!(body.contains(r#""violated-policies":["global"]"#), "{body}");
        // Peeks on the store: c's per-key limit untouched (3 left), the global subject empty.
        let c = limiters[0].check_n("c", 0).await.unwrap();
        let global = limiters[1].check_n("*", 0).await.unwrap();
        assert_eq!(global.remaining(), 0);
        assert_eq!(
            c.remaining(),
            3,
            "key c's limits on the store are untouched"
        );
    }

    /// A local refusal costs no round trip and spends nothing on the store.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_local_refusal_spends_nothing_on_the_store() {
        use atomic_limiter::http::{HeaderKey, Policy, PolicyLayer};
        use axum::http::HeaderName;
        let Some(redis) = redis_server::RedisServer::start("http redis local refusal") else {
            return;
        };
        let options = RedisOptions::default();
        let store = RedisStore::connect(&redis.url(), &options).await.unwrap();
        let limiter = RedisGcra::new(store, "http-local-first", Quota::per_minute(10)).unwrap();
        let api_key = HeaderKey::new(HeaderName::from_static("x-api-key"));
        let layer = PolicyLayer::builder()
            .policy(Policy::new(
                "per-client",
                PeerIp::new(),
                Keyed::gcra(Quota::per_minute(1), 10),
            ))
            .policy(Policy::redis("per-key", api_key, &limiter, "q").unwrap())
            .build();
        let server = Server::start(hello().layer(layer)).await;
        let client = client();
        let mut statuses = Vec::new();
        for _ in 0..4 {
            let response = client
                .get(server.url())
                .header("x-api-key", "k")
                .send()
                .await;
            statuses.push(response.unwrap().status());
        }
        assert_eq!(
            statuses,
            [
                StatusCode::OK,
                StatusCode::TOO_MANY_REQUESTS,
                StatusCode::TOO_MANY_REQUESTS,
                StatusCode::TOO_MANY_REQUESTS
            ]
        );
        let k = limiter.check_n("k", 0).await.unwrap();
        assert_eq!(
            k.remaining(),
            9,
            "only the admitted request was spent on the store"
        );
        assert!(matches!(
            Policy::redis("x", GlobalKey, &limiter, "no-such-limit"),
            Err(atomic_limiter::redis::RedisConfigError::UnknownLimit { .. })
        ));
    }

    /// Charge and settle end to end: a real client, two servers as two nodes with a layer each on
    /// one Redis, a handler that reports what it used. Each settlement is seen from both nodes,
    /// with the figures the local table gives in `src/http/tests/settle.rs`.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn responses_settle_their_charges_in_redis() {
        use atomic_limiter::http::HeaderKey;
        use axum::http::{HeaderMap, HeaderName};
        let Some(redis) = redis_server::RedisServer::start("http redis settle") else {
            return;
        };
        // A token every 36 s: a stall of the host during the test cannot refill one.
        let quota = Quota::per_hour(100);
        let options = RedisOptions::default();
        let echo = |headers: HeaderMap| async move {
            let mut answer = HeaderMap::new();
            if let Some(used) = headers.get("x-actual") {
                answer.insert("x-used", used.clone());
            }
            (answer, "done")
        };
        let mut nodes = Vec::new();
        let mut peek = None;
        for _ in 0..2 {
            let store = RedisStore::connect(&redis.url(), &options).await.unwrap();
            let limiter = Arc::new(RedisGcra::new(store, "http-settle", quota).unwrap());
            peek = Some(limiter.clone());
            let layer = RateLimitLayer::builder(
                HeaderKey::new(HeaderName::from_static("x-api-key")),
                limiter,
            )
            .cost(|head| {
                head.headers()
                    .get("x-estimate")
                    .and_then(|v| v.to_str().ok()?.parse().ok())
                    .unwrap_or(1)
            })
            .settle_from_header(HeaderName::from_static("x-used"))
            .build();
            let app = Router::new().route("/", get(echo)).layer(layer);
            nodes.push(Server::start(app).await);
        }
        let peek = peek.unwrap();
        let left = || async { peek.check_n("k", 0).await.unwrap().remaining() };
        let client = client();
        let send = |node: usize, estimate: u32, actual: Option<u32>| {
            let mut request = client
                .get(nodes[node].url())
                .header("x-api-key", "k")
                .header("x-estimate", estimate.to_string());
            if let Some(actual) = actual {
                request = request.header("x-actual", actual.to_string());
            }
            request.send()
        };
        // 50 charged on one node, 20 used: 30 back, and the layer's header kept from the client.
        let response = send(0, 50, Some(20)).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        assert!(response.headers().get("x-used").is_none());
        assert_eq!(left().await, 80);
        // 10 charged on the other, 40 used: 30 more owed.
        send(1, 10, Some(40)).await.unwrap();
        assert_eq!(left().await, 40);
        // No count in the response: the estimate stands.
        send(0, 10, None).await.unwrap();
        assert_eq!(left().await, 30);
        // A refusal took nothing and settles nothing.
        let refused = send(1, 31, Some(0)).await.unwrap();
        assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(left().await, 30);
        // A debt past the burst: 10 charged, 100 used, 70 owed; the next request, on the other
        // node, waits for 71 tokens of 36 s.
        send(0, 10, Some(100)).await.unwrap();
        let refused = send(1, 1, Some(1)).await.unwrap();
        assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
        let wait = retry_after(&refused);
        assert!((71 * 36 - 2..=71 * 36).contains(&wait), "{wait}");
    }

    /// On a Redis Cluster one request's subjects lie in different slots: a policy is refused at
    /// construction, not left to fail every call.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_policy_on_a_cluster_is_refused() {
        use atomic_limiter::http::Policy;
        let Some(cluster) = redis_server::RedisCluster::start("http redis policy cluster") else {
            return;
        };
        let urls = cluster.urls();
        let nodes: Vec<&str> = urls.iter().map(String::as_str).collect();
        let options = RedisOptions::default();
        let store = RedisStore::connect_cluster(&nodes, &options).await.unwrap();
        let limiter = RedisGcra::new(store, "http-cluster", Quota::per_minute(10)).unwrap();
        assert!(matches!(
            Policy::redis("global", GlobalKey, &limiter, "q"),
            Err(atomic_limiter::redis::RedisConfigError::PoliciesOnCluster { .. })
        ));
    }
}

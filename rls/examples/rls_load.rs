//! The service's cost, side by side in one run: a tonic client on loopback at 1, 16 and 64
//! calls in flight against the service in this process, next to a bare tonic unary call (the
//! standard health check on the same server) and the engine called directly.
//!
//! ```text
//! cargo run --release -p atomic-limiter-rls --example rls_load [-- --quick]
//! cargo run --release -p atomic-limiter-rls --features redis --example rls_load -- --redis redis://127.0.0.1:6379/
//! ```
//!
//! Every level runs for a bounded time (3 s, or 0.5 s with `--quick`) and a bounded count.
//! Latency is what the client saw for each call, from send to answer; requests per second is
//! the calls completed over the level's span. The quota is far above the load, so every
//! decision is an admission on one of 10 000 keys.

use std::sync::Arc;
use std::time::{Duration, Instant};

use atomic_limiter::rls::{DomainConfig, Engine, Entry, Item, Request};
use atomic_limiter_rls::{config, service};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry as PbEntry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitServiceServer;
use tonic::transport::Channel;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;

const CONFIG: &str = "domain: load\ndescriptors:\n  - key: client\n    rate_limit: {unit: second, requests_per_unit: 1000000}\n";
const KEYS: u64 = 10_000;
/// The leased backend's hot keys.
#[cfg(feature = "redis")]
const HOT_KEYS: u64 = 10;
const MAX_CALLS: usize = 2_000_000;

fn domains() -> Vec<DomainConfig> {
    vec![config::parse(CONFIG, "load.yaml", &mut Vec::new()).expect("the load's configuration")]
}

fn request(i: u64, keys: u64) -> RateLimitRequest {
    RateLimitRequest {
        domain: "load".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![PbEntry {
                key: "client".into(),
                value: format!("10.0.{}.{}", (i % keys) / 256, (i % keys) % 256),
            }],
            ..RateLimitDescriptor::default()
        }],
        hits_addend: 0,
    }
}

/// One level's figures.
struct Level {
    rps: f64,
    span: Duration,
    p50: Duration,
    p99: Duration,
    p999: Duration,
    errors: usize,
}

fn figures(mut lat: Vec<Duration>, span: Duration, errors: usize) -> Level {
    lat.sort_unstable();
    let at = |q: f64| {
        lat.get(((lat.len() as f64 - 1.0) * q).round() as usize)
            .copied()
            .unwrap_or_default()
    };
    Level {
        rps: lat.len() as f64 / span.as_secs_f64(),
        span,
        p50: at(0.50),
        p99: at(0.99),
        p999: at(0.999),
        errors,
    }
}

#[derive(Clone, Copy)]
enum Call {
    Health,
    /// On this many keys.
    Rls(u64),
}

async fn level(channel: &Channel, call: Call, inflight: usize, secs: Duration) -> Level {
    let until = Instant::now() + secs;
    let started = Instant::now();
    let per_task = MAX_CALLS / inflight;
    let mut tasks = Vec::new();
    for t in 0..inflight {
        let channel = channel.clone();
        tasks.push(tokio::spawn(async move {
            let mut rls = RateLimitServiceClient::new(channel.clone());
            let mut health = HealthClient::new(channel);
            let mut lat = Vec::with_capacity(4096);
            let mut errors = 0;
            let mut i = t as u64 * 7919;
            while Instant::now() < until && lat.len() < per_task {
                i += 1;
                let sent = Instant::now();
                let ok = match call {
                    Call::Health => health
                        .check(HealthCheckRequest {
                            service: String::new(),
                        })
                        .await
                        .is_ok(),
                    Call::Rls(keys) => rls
                        .should_rate_limit(request(i, keys))
                        .await
                        .is_ok_and(|r| r.get_ref().overall_code == 1),
                };
                if ok {
                    lat.push(sent.elapsed());
                } else {
                    errors += 1;
                }
            }
            (lat, errors)
        }));
    }
    let mut lat = Vec::new();
    let mut errors = 0;
    for task in tasks {
        let (l, e) = task.await.expect("a load task");
        lat.extend(l);
        errors += e;
    }
    figures(lat, started.elapsed(), errors)
}

fn direct(engine: &Engine, secs: Duration) -> Duration {
    let values: Vec<String> = (0..KEYS)
        .map(|i| format!("10.0.{}.{}", i / 256, i % 256))
        .collect();
    let until = Instant::now() + secs;
    let started = Instant::now();
    let mut n = 0u64;
    while Instant::now() < until {
        for _ in 0..1000 {
            let r = Request {
                domain: "load",
                items: vec![Item {
                    entries: vec![Entry {
                        key: "client",
                        value: &values[(n % KEYS) as usize],
                    }],
                    hits: None,
                }],
                hits_addend: 0,
            };
            assert!(!engine.decide(&r).expect("a decision").over_limit);
            n += 1;
        }
    }
    started.elapsed() / u32::try_from(n).unwrap_or(u32::MAX)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let quick = args.iter().any(|a| a == "--quick");
    let redis = args
        .iter()
        .position(|a| a == "--redis")
        .and_then(|i| args.get(i + 1).cloned());
    let secs = if quick {
        Duration::from_millis(500)
    } else {
        Duration::from_secs(3)
    };
    let server_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let client_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!(
        "atomic-limiter-rls under load on loopback: this host has {cores} CPU(s); the server and the client each get one runtime thread."
    );
    println!(
        "Each level: {} s or {MAX_CALLS} calls; latency as the client sees it.\n",
        secs.as_secs_f64()
    );
    #[cfg_attr(not(feature = "redis"), allow(unused_mut))]
    let mut backends: Vec<(String, Engine, u64)> = vec![(
        "local (in process)".into(),
        Engine::new(&domains(), 100_000).unwrap(),
        KEYS,
    )];
    #[cfg(feature = "redis")]
    if let Some(url) = &redis {
        use atomic_limiter::redis::{LeaseOptions, RedisOptions, RedisStore};
        let options = RedisOptions::default().with_deadline(Duration::from_millis(20));
        let store = server_rt
            .block_on(RedisStore::connect(url, &options))
            .expect("the store");
        let remote = |leasing| atomic_limiter::rls::Remote {
            store: store.clone(),
            prefix: "rls-load".into(),
            options: options.clone(),
            unavailable: true,
            leasing,
        };
        backends.push((
            "redis, one script a request".into(),
            Engine::with_remote(&domains(), remote(None)).unwrap(),
            KEYS,
        ));
        let leasing = atomic_limiter::rls::Leasing {
            options: LeaseOptions::default(),
            max_keys: 100_000,
        };
        // Leases have a reason to exist where keys are hot: each is renewed by one wait per
        // lease TTL, so fewer than 100 requests a key per TTL cannot be 99 % without a wait.
        for keys in [HOT_KEYS, KEYS] {
            // Built in the server's runtime, where the leases refill in the background.
            let _in_runtime = server_rt.enter();
            backends.push((
                format!("redis, leased, {keys} keys"),
                Engine::with_remote(&domains(), remote(Some(leasing))).unwrap(),
                keys,
            ));
        }
    }
    #[cfg(not(feature = "redis"))]
    if redis.is_some() {
        eprintln!("--redis needs --features redis; measuring the local backend only");
    }
    let d = direct(&backends[0].1, secs);
    println!(
        "the engine called directly (local, one thread): {:.0} ns a decision\n",
        d.as_nanos() as f64
    );
    println!(
        "{:<34} {:>9} {:>12} {:>10} {:>10} {:>10} {:>7}",
        "what", "in flight", "calls/s", "p50", "p99", "p99.9", "errors"
    );
    let mut p50s = Vec::new();
    let mut waits = Vec::new();
    for (name, engine, keys) in backends {
        let listener = server_rt
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let addr = listener.local_addr().unwrap();
        let (_health, health_service) = tonic_health::server::health_reporter();
        let engine = Arc::new(engine);
        let server = tonic::transport::Server::builder()
            .add_service(health_service)
            .add_service(RateLimitServiceServer::new(service::Rls {
                engine: engine.clone(),
            }))
            .serve_with_incoming(
                tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true)),
            );
        let handle = server_rt.spawn(server);
        let channel = client_rt.block_on(async {
            Channel::from_shared(format!("http://{addr}"))
                .unwrap()
                .connect()
                .await
                .unwrap()
        });
        // One call a key first: a key's first decision always waits for the store.
        client_rt.block_on(async {
            let mut rls = RateLimitServiceClient::new(channel.clone());
            for i in 0..keys {
                let _ = rls.should_rate_limit(request(i, keys)).await;
            }
        });
        for inflight in [1, 16, 64] {
            for (what, call) in [
                ("bare tonic unary (health check)", Call::Health),
                (name.as_str(), Call::Rls(keys)),
            ] {
                let trips = engine.store_round_trips();
                let l = client_rt.block_on(level(&channel, call, inflight, secs));
                if matches!(call, Call::Rls(_)) && name.starts_with("redis") {
                    let waited = engine.store_round_trips() - trips;
                    let calls = (l.rps * l.span.as_secs_f64()).round();
                    waits.push((name.clone(), inflight, waited as f64 / calls.max(1.0)));
                }
                println!(
                    "{:<34} {:>9} {:>12.0} {:>10.1?} {:>10.1?} {:>10.1?} {:>7}",
                    what, inflight, l.rps, l.p50, l.p99, l.p999, l.errors
                );
                p50s.push((name.clone(), what == name, inflight, l.p50, l.p999));
            }
        }
        handle.abort();
        #[cfg(feature = "redis")]
        if let Some((keys, leases)) = engine.lease_figures() {
            println!("{name}: {keys} keys hold a lease; {leases} leases asked of the store in all");
        }
        println!();
    }
    for (name, _, inflight, _, _) in p50s.iter().filter(|p| p.1) {
        let bare = p50s
            .iter()
            .find(|p| !p.1 && &p.0 == name && p.2 == *inflight)
            .map(|p| p.3);
        let ours = p50s
            .iter()
            .find(|p| p.1 && &p.0 == name && p.2 == *inflight)
            .map(|p| (p.3, p.4));
        if let (Some(bare), Some((p50, p999))) = (bare, ours) {
            println!(
                "{name}, {inflight} in flight: p50 {:.2}x a bare tonic call (target <= 2x); p99.9 {:.2?} (target < 2 ms)",
                p50.as_secs_f64() / bare.as_secs_f64().max(1e-9),
                p999
            );
        }
    }
    for (name, inflight, waited) in waits {
        println!(
            "{name}, {inflight} in flight: {:.2} % of decisions waited for a round trip to the store",
            100.0 * waited
        );
    }
}

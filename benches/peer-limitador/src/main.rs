//! limitador 0.14.0's Redis storage (`AsyncRedisStorage`, fixed windows) beside `RedisGcra`, on
//! one redis-server started here on a free loopback port, in one run: calls a second at 1 and 64
//! in flight, and how accurately each admits a quota under the same load.

#[path = "../../../tests/common/redis_server.rs"]
mod redis_server;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use atomic_limiter::Quota;
use atomic_limiter::redis::{RedisGcra, RedisOptions, RedisStore};
use limitador::AsyncRateLimiter;
use limitador::limit::{Context, Limit};
use limitador::storage::redis::AsyncRedisStorage;

/// One decision of either limiter: whether it admitted.
type Decide = Arc<dyn Fn() -> std::pin::Pin<Box<dyn Future<Output = bool> + Send>> + Send + Sync>;

fn ours(l: RedisGcra) -> Decide {
    Arc::new(move || {
        let l = l.clone();
        Box::pin(async move { l.check("subject").await.is_allowed() })
    })
}

fn theirs(l: Arc<AsyncRateLimiter>) -> Decide {
    Arc::new(move || {
        let l = l.clone();
        Box::pin(async move {
            let r = l
                .check_rate_limited_and_update(&"peer".into(), &Context::default(), 1)
                .await
                .expect("limitador's storage answers");
            !r.limited
        })
    })
}

/// `in_flight` tasks deciding until `calls` decisions or `limit` have passed: calls a second, and
/// the instants (since `start`) of the admissions.
async fn load(
    decide: Decide,
    in_flight: usize,
    calls: u64,
    limit: Duration,
) -> (f64, Vec<Duration>) {
    let done = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let tasks: Vec<_> = (0..in_flight)
        .map(|_| {
            let (decide, done) = (decide.clone(), done.clone());
            tokio::spawn(async move {
                let mut admitted = vec![];
                while done.fetch_add(1, Ordering::Relaxed) < calls && start.elapsed() < limit {
                    if decide().await {
                        admitted.push(start.elapsed());
                    }
                }
                admitted
            })
        })
        .collect();
    let mut admitted = vec![];
    for t in tasks {
        admitted.extend(t.await.expect("a load task"));
    }
    let made = done.load(Ordering::Relaxed).min(calls) as f64;
    admitted.sort();
    (made / start.elapsed().as_secs_f64(), admitted)
}

/// The most admissions in any span of `w` (a sliding window over the admission instants).
fn most_in_any(admitted: &[Duration], w: Duration) -> usize {
    let mut most = 0;
    let mut from = 0;
    for (i, t) in admitted.iter().enumerate() {
        while *t - admitted[from] >= w {
            from += 1;
        }
        most = most.max(i + 1 - from);
    }
    most
}

#[tokio::main]
async fn main() {
    let Some(server) = redis_server::RedisServer::start("peer_limitador") else {
        return;
    };
    let url = server.url();
    let options = RedisOptions::default().with_deadline(Duration::from_secs(1));
    let store = RedisStore::connect(&url, &options).await.expect("connect");
    let quick = std::env::args().any(|a| a == "--quick");
    let (calls, limit) = if quick {
        (5_000, Duration::from_secs(2))
    } else {
        (40_000, Duration::from_secs(5))
    };

    println!(
        "limitador 0.14.0 (AsyncRedisStorage, a fixed window) beside RedisGcra, one redis-server {}",
        redis_version()
    );
    println!("\n1. Calls a second, a quota nothing reaches (one subject, one counter)");
    println!(
        "   {:<10} {:>12} {:>12} {:>8}",
        "in flight", "RedisGcra", "limitador", "ours/theirs"
    );
    let open = RedisGcra::with_limits(
        store.clone(),
        "open",
        [("q", Quota::per_second(1_000_000_000))],
        options.clone(),
    )
    .unwrap();
    let wide = Arc::new(AsyncRateLimiter::new_with_storage(Box::new(
        AsyncRedisStorage::new(&url)
            .await
            .expect("limitador connects"),
    )));
    wide.add_limit(Limit::new("peer", u64::MAX / 2, 3600, [], []));
    for in_flight in [1usize, 64] {
        let (a, _) = load(ours(open.clone()), in_flight, calls, limit).await;
        let (b, _) = load(theirs(wide.clone()), in_flight, calls, limit).await;
        println!("   {in_flight:<10} {a:>12.0} {b:>12.0} {:>7.2}x", a / b);
    }

    // 100 a second under 64 in flight for the whole span: what each admits in any second, and in
    // all, against the quota (ours: a burst of 100, then 100 a second; theirs: 100 per window of
    // one second, the window starting at its first hit).
    let span = if quick {
        Duration::from_secs(3)
    } else {
        Duration::from_secs(6)
    };
    println!(
        "\n2. Accuracy: 100 a second, 64 in flight for {} s (in any 1 s, a GCRA with a burst of 100 \
         admits at most 200, once; fixed windows at most 200, at each boundary)",
        span.as_secs()
    );
    let tight =
        RedisGcra::with_limits(store, "tight", [("q", Quota::per_second(100))], options).unwrap();
    let strict = Arc::new(AsyncRateLimiter::new_with_storage(Box::new(
        AsyncRedisStorage::new(&url)
            .await
            .expect("limitador connects"),
    )));
    strict.add_limit(Limit::new("peer", 100, 1, [], []));
    for (name, decide) in [("RedisGcra", ours(tight)), ("limitador", theirs(strict))] {
        let (_, admitted) = load(decide, 64, u64::MAX, span).await;
        // Ours: a burst of 100 and 100 a second after it. Theirs: 100 in each window of 1 s, and
        // the span touches one window more than it has seconds. The same figure either way.
        let allowance = 100 + 100 * span.as_secs();
        println!(
            "   {name:<10} admitted {:>5} in {} s (the quota allows at most {allowance}); most in any 1 s: {}",
            admitted.len(),
            span.as_secs(),
            most_in_any(&admitted, Duration::from_secs(1)),
        );
        if name == "limitador" {
            // Its windows start at the first hit and last a second: count in each.
            let first = admitted.first().copied().unwrap_or_default();
            let mut per = std::collections::BTreeMap::<u64, usize>::new();
            for t in &admitted {
                *per.entry((*t - first).as_secs()).or_default() += 1;
            }
            let over: Vec<String> = per
                .iter()
                .filter(|(_, n)| **n > 100)
                .map(|(w, n)| format!("{n} in window {w}"))
                .collect();
            println!(
                "   {:<10} windows of its own over 100: {}",
                "",
                if over.is_empty() {
                    "none".to_string()
                } else {
                    over.join(", ")
                }
            );
        }
    }
}

fn redis_version() -> String {
    std::process::Command::new("redis-server")
        .arg("--version")
        .output()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .split_whitespace()
                .nth(2)
                .unwrap_or("")
                .to_string()
        })
        .unwrap_or_default()
}

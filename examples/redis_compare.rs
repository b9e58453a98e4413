//! The distributed limiters measured side by side in one run, against one local Redis:
//! `RedisGcra` next to a trivial script, and `Leased` next to `RedisGcra` and the local `Gcra`.
//!
//! `cargo run --release --features redis --example redis_compare [-- --quick]`
//!
//! Uses the server at `REDIS_URL`, or starts a redis-server of its own on a free loopback port
//! (and stops it at the end). Every loop is bounded in count and time.
//!
//! Method: each pair is measured in alternating rounds (A, B, A, B ...) on the same server and
//! connection, and the ratio is taken per round, then the median. The server's own cost per call
//! is `usec_per_call` from `INFO commandstats`, reset before each measurement.

use std::sync::Arc;
use std::time::{Duration, Instant};

use atomic_limiter::redis::{LeaseOptions, Leased, RedisGcra, RedisOptions, RedisStore};
use atomic_limiter::{Gcra, Quota};

#[path = "../tests/common/redis_server.rs"]
mod redis_server;
#[path = "../benches/common/stats.rs"]
mod stats;

use stats::median;

/// A connection of our own for the trivial script and the server's statistics.
type Conn = redis::aio::MultiplexedConnection;

/// `(calls, usec_per_call)` of EVALSHA since the last `CONFIG RESETSTAT`.
async fn evalsha_stats(conn: &mut Conn) -> (u64, f64) {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await
        .unwrap();
    let line = info
        .lines()
        .find(|l| l.starts_with("cmdstat_evalsha:"))
        .unwrap_or("");
    let field = |name: &str| {
        line.split([':', ','])
            .find_map(|kv| kv.strip_prefix(name).and_then(|v| v.strip_prefix('=')))
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (field("calls") as u64, field("usec_per_call"))
}

async fn reset_stats(conn: &mut Conn) {
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(conn)
        .await
        .unwrap();
}

/// Runs `calls` calls of `one` with `in_flight` at a time; returns calls per second.
async fn throughput<F, Fut>(calls: usize, in_flight: usize, one: F) -> f64
where
    F: Fn(usize) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let start = Instant::now();
    let per = calls / in_flight;
    let mut tasks = tokio::task::JoinSet::new();
    for t in 0..in_flight {
        let one = one.clone();
        tasks.spawn(async move {
            for i in 0..per {
                one(t * per + i).await;
            }
        });
    }
    while tasks.join_next().await.is_some() {}
    (per * in_flight) as f64 / start.elapsed().as_secs_f64()
}

struct Row {
    what: String,
    ratio: f64,
    target: &'static str,
    met: bool,
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let (url, _server) = match std::env::var("REDIS_URL") {
        Ok(url) => (url, None),
        Err(_) => {
            let Some(server) = redis_server::RedisServer::start("redis_compare") else {
                eprintln!("redis_compare needs redis-server on PATH, or REDIS_URL");
                std::process::exit(2);
            };
            (server.url(), Some(server))
        }
    };
    println!("Distributed limiters against the Redis at {url}");
    println!(
        "(ratios from alternating rounds in this one run; absolute figures depend on the host)\n"
    );

    let client = redis::Client::open(url.as_str()).unwrap();
    let mut conn: Conn = client.get_multiplexed_async_connection().await.unwrap();
    // Generous deadline: this measures speed, not the failure path.
    let options = RedisOptions::default().with_deadline(Duration::from_secs(2));
    let store = RedisStore::connect(&url, &options).await.unwrap();
    let gcra = RedisGcra::with_limits(
        store.clone(),
        "bench",
        [("q", Quota::per_second(1_000_000_000).with_burst(1_000_000))],
        options.clone(),
    )
    .unwrap();
    let trivial = Arc::new(redis::Script::new("return 1"));
    // The least any script of this design does: read the server's clock, read the state, write it
    // back with an expiry. No arithmetic, no reply but 1.
    let floor = Arc::new(redis::Script::new(
        "local t = redis.call('TIME') redis.call('GET', KEYS[1]) \
         redis.call('SET', KEYS[1], t[2], 'PX', 1000) return 1",
    ));

    let rounds = if quick { 3 } else { 7 };
    let mut rows = Vec::new();
    println!(
        "1. RedisGcra against a trivial script (`return 1` by EVALSHA), same server and client,"
    );
    println!("   and against the floor of this design (TIME, GET, SET with PX, `return 1`)");
    println!(
        "   {:<10} {:>11} {:>11} {:>11} {:>8} {:>8}   server us/call: trivial, floor, gcra",
        "in flight", "trivial/s", "floor/s", "gcra/s", "g/t", "f/t"
    );
    for (in_flight, calls, target) in [
        (1usize, if quick { 2000 } else { 10_000 }, 0.90),
        (64, if quick { 20_000 } else { 100_000 }, 0.60),
    ] {
        let (mut rg, mut rf) = (Vec::new(), Vec::new());
        let (mut tt, mut tf, mut tg) = (Vec::new(), Vec::new(), Vec::new());
        let (mut ut, mut uf, mut ug) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..rounds {
            let shared = conn.clone();
            let script_round = |script: Arc<redis::Script>| {
                let c = shared.clone();
                throughput(calls, in_flight, move |i| {
                    let mut c = c.clone();
                    let s = script.clone();
                    async move {
                        let _: i64 = s
                            .key(format!("f{}", i % 1000))
                            .invoke_async(&mut c)
                            .await
                            .unwrap();
                    }
                })
            };
            reset_stats(&mut conn).await;
            let t = script_round(trivial.clone()).await;
            ut.push(evalsha_stats(&mut conn).await.1);
            reset_stats(&mut conn).await;
            let f = script_round(floor.clone()).await;
            uf.push(evalsha_stats(&mut conn).await.1);
            reset_stats(&mut conn).await;
            let l = gcra.clone();
            let g = throughput(calls, in_flight, move |i| {
                let l = l.clone();
                async move {
                    let d = l.try_check_n(&format!("s{}", i % 1000), 1).await.unwrap();
                    assert!(d.is_allowed());
                }
            })
            .await;
            ug.push(evalsha_stats(&mut conn).await.1);
            rg.push(g / t);
            rf.push(f / t);
            tt.push(t);
            tf.push(f);
            tg.push(g);
        }
        let (ratio, floor_ratio) = (median(&rg), median(&rf));
        println!(
            "   {:<10} {:>11.0} {:>11.0} {:>11.0} {:>8.2} {:>8.2}   {:.2}, {:.2}, {:.2}",
            in_flight,
            median(&tt),
            median(&tf),
            median(&tg),
            ratio,
            floor_ratio,
            median(&ut),
            median(&uf),
            median(&ug)
        );
        rows.push(Row {
            what: format!("RedisGcra / trivial script, {in_flight} in flight"),
            ratio,
            target: if in_flight == 1 { ">= 0.90" } else { ">= 0.60" },
            met: ratio >= target,
        });
        rows.push(Row {
            what: format!("  the floor / trivial script, {in_flight} in flight"),
            ratio: floor_ratio,
            target: "-",
            met: true,
        });
    }

    println!("\n2. Leased against RedisGcra and the local Gcra");
    // The hot path: checks served by the lease, against the local Gcra, interleaved.
    let big = Quota::per_second(1_000_000_000).with_burst(1_000_000);
    let leased = Leased::new(
        gcra.clone(),
        "hot",
        LeaseOptions::default().with_max_lease(1_000_000),
    );
    let local = Gcra::new(big);
    let batch = 100_000;
    let mut hot = Vec::new();
    for _ in 0..rounds {
        let t = Instant::now();
        for _ in 0..batch {
            let _ = std::hint::black_box(local.check());
        }
        let local_ns = t.elapsed().as_nanos() as f64 / batch as f64;
        // Keep the lease stocked outside the timed loop.
        let _ = leased.check_n(1).await;
        let t = Instant::now();
        let mut served = 0u32;
        for _ in 0..batch {
            if let Some(d) = leased.check_local(1) {
                served += u32::from(d.is_allowed());
            }
        }
        let leased_ns = t.elapsed().as_nanos() as f64 / batch as f64;
        if served as usize * 10 >= batch * 9 {
            hot.push(leased_ns / local_ns);
        }
        tokio::task::yield_now().await;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let hot_ratio = if hot.is_empty() {
        f64::NAN
    } else {
        median(&hot)
    };
    println!("   hot path: Leased::check_local / Gcra::check = {hot_ratio:.2} (time per check)");
    rows.push(Row {
        what: "Leased hot path / local Gcra".into(),
        ratio: hot_ratio,
        target: "<= 2.0",
        met: hot_ratio <= 2.0,
    });

    // Steady demand below the quota, paced: the same load through Leased and through RedisGcra.
    let rate = 20_000.0; // checks per second asked, against a quota of 40 000/s
    let run = if quick {
        Duration::from_secs(1)
    } else {
        Duration::from_secs(3)
    };
    let steady = RedisGcra::with_limits(
        store.clone(),
        "steady",
        [("q", Quota::per_second(40_000).with_burst(400))],
        options.clone(),
    )
    .unwrap();
    let node = Leased::new(steady.clone(), "node", LeaseOptions::default());
    let paced = |run: Duration| {
        let start = Instant::now();
        let mut due = 0.0f64;
        move || {
            let elapsed = start.elapsed();
            if elapsed >= run {
                return None;
            }
            let want = (elapsed.as_secs_f64() * rate) as u64;
            let n = want.saturating_sub(due as u64);
            due = want as f64;
            Some(n)
        }
    };
    reset_stats(&mut conn).await;
    let mut next = paced(run);
    let (mut decisions, mut allowed) = (0u64, 0u64);
    while let Some(n) = next() {
        for _ in 0..n {
            let d = node.check().await;
            decisions += 1;
            allowed += u64::from(d.is_allowed());
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let (lease_calls, _) = evalsha_stats(&mut conn).await;
    let local_share = 1.0 - node.waited_checks() as f64 / decisions as f64;
    reset_stats(&mut conn).await;
    // The same paced demand, each millisecond's checks in flight together: one round trip each
    // would not keep up with it one after another.
    let mut next = paced(run);
    let mut remote_decisions = 0u64;
    while let Some(n) = next() {
        let mut batch = tokio::task::JoinSet::new();
        for i in 0..n {
            let l = steady.clone();
            batch.spawn(async move { l.check(&format!("r{}", i % 64)).await });
        }
        while batch.join_next().await.is_some() {
            remote_decisions += 1;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let (remote_calls, _) = evalsha_stats(&mut conn).await;
    let secs = run.as_secs_f64();
    println!(
        "   steady {rate:.0}/s for {secs:.0} s, quota 40 000/s: Leased made {decisions} decisions ({allowed} allowed), {:.2} % without I/O",
        100.0 * local_share
    );
    println!(
        "   Redis operations per second: Leased {:.1}, RedisGcra {:.0} ({remote_decisions} decisions): {:.0}x fewer",
        lease_calls as f64 / secs,
        remote_calls as f64 / secs,
        remote_calls as f64 / lease_calls.max(1) as f64
    );
    // The same demand was asked of both; per decision, so a shortfall on either side shows.
    println!(
        "   Redis operations per decision: Leased {:.4}, RedisGcra {:.2}",
        lease_calls as f64 / decisions.max(1) as f64,
        remote_calls as f64 / remote_decisions.max(1) as f64
    );
    rows.push(Row {
        what: "Leased decisions without network I/O".into(),
        ratio: local_share,
        target: ">= 0.99",
        met: local_share >= 0.99,
    });
    let fewer = remote_calls as f64 / lease_calls.max(1) as f64;
    rows.push(Row {
        what: "RedisGcra ops / Leased ops, same load".into(),
        ratio: fewer,
        target: ">= 50",
        met: fewer >= 50.0,
    });

    println!("\nTargets (issue 13):");
    for r in &rows {
        println!(
            "   {:<44} {:>10.3}  target {:<8} {}",
            r.what,
            r.ratio,
            r.target,
            if r.target == "-" {
                ""
            } else if r.met {
                "met"
            } else {
                "MISSED"
            }
        );
    }
}

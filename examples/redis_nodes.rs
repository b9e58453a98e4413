//! Several simulated nodes sharing one quota through your Redis: each node is a `Leased` (a local
//! lease of the shared quota) on a thread of its own, all asking for more than the quota allows
//! together. It prints what each node admitted and the total against the quota.
//!
//! `REDIS_URL=redis://127.0.0.1:6379/ cargo run --release --features redis --example redis_nodes`
//!
//! (`REDIS_URL` defaults to `redis://127.0.0.1:6379/`.) It writes keys under `redis_nodes:` that
//! expire by themselves within a second.

use std::time::{Duration, Instant};

use atomic_limiter::Quota;
use atomic_limiter::redis::{LeaseOptions, Leased, RedisGcra, RedisOptions, RedisStore};

const NODES: usize = 4;
const RATE: u64 = 500;
const BURST: u32 = 50;
const RUN: Duration = Duration::from_secs(3);
const TTL: Duration = Duration::from_millis(250);

fn main() {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/".into());
    println!("{NODES} nodes share {RATE} requests/s (burst {BURST}) for {RUN:?} through {url}");
    println!(
        "each node asks for about {} requests/s: more than the whole quota\n",
        RATE * 3 / 2
    );
    let start = Instant::now();
    let nodes: Vec<_> = (0..NODES)
        .map(|node| {
            let url = url.clone();
            std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                rt.block_on(async move {
                    let options = RedisOptions::default().with_deadline(Duration::from_millis(50));
                    let store = RedisStore::connect(&url, &options).await?;
                    let quota = Quota::per_second(RATE).with_burst(BURST);
                    let remote =
                        RedisGcra::with_limits(store, "redis_nodes", [("q", quota)], options)
                            .map_err(|e| e.to_string())?;
                    let leased =
                        Leased::new(remote, "shared", LeaseOptions::default().with_ttl(TTL));
                    let (mut admitted, mut refused, mut failed) = (0u64, 0u64, 0u64);
                    while start.elapsed() < RUN {
                        let d = leased.check().await;
                        match d.decided_by() {
                            atomic_limiter::DecidedBy::Lease | atomic_limiter::DecidedBy::Store => {
                            }
                            _ => failed += 1,
                        }
                        if d.is_allowed() {
                            admitted += 1;
                        } else {
                            refused += 1;
                        }
                        tokio::time::sleep(Duration::from_micros(1_000_000 * 2 / (3 * RATE))).await;
                    }
                    Ok::<_, Box<dyn std::error::Error + Send + Sync>>((
                        node,
                        admitted,
                        refused,
                        failed,
                        leased.lease_requests(),
                    ))
                })
            })
        })
        .collect();
    let mut total = 0;
    let mut unreachable = 0;
    for n in nodes {
        match n.join().expect("a node thread") {
            Ok((node, admitted, refused, failed, leases)) => {
                println!(
                    "node {node}: admitted {admitted:>5}, refused {refused:>5}, lease requests {leases:>4}"
                );
                if failed > 0 {
                    println!(
                        "        {failed} decisions by the failure policy: Redis did not answer in time"
                    );
                    unreachable += failed;
                }
                total += admitted;
            }
            Err(e) => {
                eprintln!("a node could not start: {e}");
                std::process::exit(1);
            }
        }
    }
    let elapsed = start.elapsed().as_secs_f64();
    let bound = BURST as f64 + RATE as f64 * (elapsed + TTL.as_secs_f64());
    println!(
        "\ntotal admitted: {total} in {elapsed:.1} s; the quota allows {:.0} (burst + rate x time),",
        BURST as f64 + RATE as f64 * elapsed
    );
    println!("and leases that live {TTL:?} at most {bound:.0} (burst + rate x (time + TTL))");
    println!(
        "(over the quota, leases shrink to a token or two, so a node asks about once per admission;\n\
         a refusal is held locally for the store's retry-after, doubled while refusals repeat)"
    );
    if unreachable > 0 || total as f64 > bound {
        std::process::exit(1);
    }
}

//! The HTTP layer side by side on this machine: what it adds to a request next to tower_governor
//! (no network), and what a hello-world axum server keeps of its loopback throughput with it.
//!
//! `cargo run --release --example http_compare --features tower,axum [-- --quick]`
//!
//! Method: the subjects' repetitions are interleaved (A, B, C, then B, C, A ...) so that drift in
//! the machine hits all alike; each figure is the median over the repetitions, and each ratio the
//! median of the per-repetition ratios of subjects measured back to back.

#[path = "../benches/http/subjects.rs"]
mod subjects;

#[path = "../benches/common/stats.rs"]
mod stats;

use stats::median;
use std::hint::black_box;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use atomic_limiter::http::{IpKey, PeerIp, RateLimitLayer};
use atomic_limiter::{Gcra, Keyed, Quota};
use axum::Router;
use axum::routing::get;
use subjects::{CASES, CLIENTS, Path, request, subjects};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Requests built ahead of the calls that take them, so that the clock times the calls alone:
/// the layer's own cost is then a large share of what is timed, not a tenth of it.
const BATCH: usize = 256;

/// Nanoseconds per request of each subject, per repetition, over `clients` addresses.
fn layer_costs(path: Path, clients: u32, reps: usize, calls: u32) -> Vec<(&'static str, Vec<f64>)> {
    let mut subjects = subjects(path, clients);
    let mut times: Vec<Vec<f64>> = vec![Vec::new(); subjects.len()];
    let mut batch = Vec::with_capacity(BATCH);
    let mut i = 0u32;
    for rep in 0..reps {
        for k in 0..subjects.len() {
            // Rotated, so that no subject always runs first.
            let s = (k + rep) % subjects.len();
            let subject = &mut subjects[s].1;
            let mut took = Duration::ZERO;
            let mut left = calls as usize;
            while left > 0 {
                let n = left.min(BATCH);
                left -= n;
                batch.extend((0..n).map(|_| {
                    i = (i + 1) % clients;
                    request(i)
                }));
                let start = Instant::now();
                for r in batch.drain(..) {
                    black_box(subject(r));
                }
                took += start.elapsed();
            }
            times[s].push(took.as_nanos() as f64 / f64::from(calls));
        }
    }
    subjects.iter().map(|(name, _)| *name).zip(times).collect()
}

/// A hello-world axum server on a free loopback port, with or without the layer.
async fn server(limited: bool) -> SocketAddr {
    let app = Router::new().route("/", get(|| async { "hello\n" }));
    let app = if limited {
        // A quota the load never reaches: every request is checked and admitted.
        let keyed: Keyed<IpKey, Gcra> = Keyed::gcra(
            Quota::with_period(Duration::from_nanos(1)).with_burst(1_000_000),
            100_000,
        );
        app.layer(RateLimitLayer::new(PeerIp::new(), keyed))
    } else {
        app
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
        .unwrap();
    });
    addr
}

/// Requests answered per second over `secs` seconds, by `connections` keep-alive connections
/// each sending one request after another: a lean client, so that the server's cost shows.
async fn load(addr: SocketAddr, connections: usize, secs: f64) -> f64 {
    let done = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let workers: Vec<_> = (0..connections)
        .map(|_| {
            let (done, stop) = (done.clone(), stop.clone());
            tokio::spawn(async move {
                let mut stream = TcpStream::connect(addr).await.unwrap();
                stream.set_nodelay(true).unwrap();
                let mut buf = vec![0u8; 4096];
                // Bounded in count as well as in time.
                for _ in 0..10_000_000 {
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    stream
                        .write_all(b"GET / HTTP/1.1\r\nHost: bench\r\n\r\n")
                        .await
                        .unwrap();
                    read_response(&mut stream, &mut buf).await;
                    done.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    // Warm the connections up, then count.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let (start, before) = (Instant::now(), done.load(Ordering::Relaxed));
    tokio::time::sleep(Duration::from_secs_f64(secs)).await;
    let answered = done.load(Ordering::Relaxed) - before;
    let rate = answered as f64 / start.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.await.unwrap();
    }
    rate
}

/// Reads one response (head, then a `content-length` body) into `buf`.
async fn read_response(stream: &mut TcpStream, buf: &mut [u8]) {
    let mut filled = 0;
    loop {
        let n = stream.read(&mut buf[filled..]).await.unwrap();
        assert!(n > 0, "the server closed the connection");
        filled += n;
        let Some(end) = buf[..filled].windows(4).position(|w| w == b"\r\n\r\n") else {
            continue;
        };
        let head = std::str::from_utf8(&buf[..end])
            .unwrap()
            .to_ascii_lowercase();
        assert!(head.starts_with("http/1.1 200"), "{head}");
        let length: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .map_or(0, |v| v.trim().parse().unwrap());
        if filled >= end + 4 + length {
            return;
        }
    }
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let (reps, calls) = if quick { (5, 20_000) } else { (15, 200_000) };
    let (rounds, secs) = if quick { (2, 0.5) } else { (5, 2.0) };

    println!("The HTTP layer next to tower_governor (lower is better)\n");
    let mut verdicts = Vec::new();
    println!(
        "{:<34} {:>12} {:>16} {:>16} {:>10} {:>14}",
        "path", "no layer", "atomic-limiter", "tower_governor", "ratio", "floor"
    );
    for (path, clients) in CASES {
        let label = if clients == CLIENTS {
            path.name().to_owned()
        } else {
            format!("{}, {}k clients", path.name(), clients / 1000)
        };
        // tower_governor's refusal takes some 15 µs (it formats a message): fewer calls there.
        let calls = if path == Path::Refused {
            calls / 10
        } else {
            calls
        };
        let costs = layer_costs(path, clients, reps, calls);
        let none = &costs[0].1;
        // The layer's own cost: each subject minus the bare service of the same repetition.
        let own = |s: usize| -> Vec<f64> {
            costs[s]
                .1
                .iter()
                .zip(none)
                .map(|(t, n)| (t - n).max(0.1))
                .collect()
        };
        let (ours, theirs, floor) = (own(1), own(2), own(3));
        let ratio_of = |ours: &[f64]| {
            median(
                &ours
                    .iter()
                    .zip(&theirs)
                    .map(|(o, t)| o / t)
                    .collect::<Vec<_>>(),
            )
        };
        let ratio = ratio_of(&ours);
        println!(
            "{:<34} {:>9.1} ns {:>10.1} ns (+{:>3.0}) {:>10.1} ns (+{:>3.0}) {:>9.2}x {:>7.1} ns (+{:>3.0})",
            label,
            median(none),
            median(&costs[1].1),
            median(&ours),
            median(&costs[2].1),
            median(&theirs),
            ratio,
            median(&costs[3].1),
            median(&floor),
        );
        verdicts.push((label.clone(), ratio));
        // The same layer on the other store, and on the other clock.
        for (s, row) in [(4, "lock-free store"), (5, "coarse clock")] {
            let other = own(s);
            let other_ratio = ratio_of(&other);
            println!(
                "{:<34} {:>12} {:>10.1} ns (+{:>3.0}) {:>21} {:>9.2}x",
                format!("  on the {row}"),
                "",
                median(&costs[s].1),
                median(&other),
                "",
                other_ratio,
            );
            verdicts.push((format!("{label}, {row}"), other_ratio));
        }
    }
    println!(
        "\n(+N: the layer's own cost, over building and serving the request with no layer; ratio:\n\
         atomic-limiter's own cost over tower_governor's, below 1 is faster; floor: the peer address,\n\
         one check of the same Keyed and the inner service, by hand, with no layer and no fields)\n"
    );

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let (plain, limited, kept) = runtime.block_on(async {
        let (plain, limited) = (server(false).await, server(true).await);
        let (mut a, mut b, mut kept) = (Vec::new(), Vec::new(), Vec::new());
        for round in 0..rounds {
            // Alternated, so that neither always runs first.
            let (x, y) = if round % 2 == 0 {
                let x = load(plain, 32, secs).await;
                (x, load(limited, 32, secs).await)
            } else {
                let y = load(limited, 32, secs).await;
                (load(plain, 32, secs).await, y)
            };
            a.push(x);
            b.push(y);
            kept.push(y / x);
        }
        (median(&a), median(&b), median(&kept))
    });
    println!("Loopback throughput of a hello-world axum server, 32 keep-alive connections:");
    println!("  without the layer  {plain:>10.0} requests/s");
    println!(
        "  with the layer     {limited:>10.0} requests/s  ({:.1} % kept)",
        kept * 100.0
    );
    println!(
        "  (client and server share this machine's {} cores)\n",
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );
    for (label, ratio) in verdicts {
        // Closer than 5 % is within what repeated runs here move by.
        let word = if ratio < 0.95 {
            "faster"
        } else if ratio > 1.05 {
            "slower"
        } else {
            "about the same, within 5 %"
        };
        println!(
            "Verdict, {label}: atomic-limiter's layer costs {:.2}x tower_governor's ({word}).",
            ratio
        );
    }
    println!(
        "Verdict, loopback: the layer keeps {:.1} % of the server's throughput (target: at least 95 %).",
        kept * 100.0
    );
}

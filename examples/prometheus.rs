//! A rate limiter's counters exported to Prometheus, for a user to curl:
//!
//! ```sh
//! cargo run --example prometheus --features metrics
//! curl -s http://127.0.0.1:9000/metrics     # in another terminal, while it runs
//! ```
//!
//! It runs for 60 s (`--seconds N`) on port 9000 (`--port N`), sending 100 requests a second at
//! a limiter of 50 a second (about half are refused), and a trickle from six clients at a keyed
//! table that holds four (some are refused at the cap).

use std::time::{Duration, Instant};

use atomic_limiter::{Gcra, Instrumented, Keyed, LimiterMetrics, Quota, RateLimiter};
use metrics_exporter_prometheus::PrometheusBuilder;

fn arg(name: &str, default: u64) -> u64 {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    let port = u16::try_from(arg("--port", 9000)).expect("--port: 1 to 65535");
    let seconds = arg("--seconds", 60);
    // The recorder first: the counters are registered with the recorder installed when they are
    // made.
    PrometheusBuilder::new()
        .with_http_listener(([127, 0, 0, 1], port))
        .install()
        .expect("could not start the Prometheus listener (is the port taken? try --port)");
    let api = Instrumented::new(
        Gcra::new(Quota::per_second(50).with_burst(10)),
        LimiterMetrics::new("api"),
    );
    let per_client = Keyed::gcra(Quota::per_second(2).with_burst(2), 4);
    let per_client_counters = LimiterMetrics::new("per_client");

    println!("Serving the counters at http://127.0.0.1:{port}/metrics for {seconds} s. Try:");
    println!("  curl -s http://127.0.0.1:{port}/metrics | grep atomic_limiter");
    println!(
        "Sending 100 requests/s at a limit of 50/s ('api'), and 6 clients at a table of 4 ('per_client')."
    );
    let start = Instant::now();
    let mut tick = 0u64;
    while start.elapsed() < Duration::from_secs(seconds) {
        let _ = api.check();
        if tick % 10 == 0 {
            let client = (tick / 10) % 6;
            per_client_counters.record(&per_client.check_key(&client));
        }
        tick += 1;
        if tick % 500 == 0 {
            println!("{:>3} s: {tick} requests sent", start.elapsed().as_secs());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    println!("Done.");
}

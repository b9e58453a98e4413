//! `RedisGcra` over TLS against plain TCP, side by side in one run, on one local redis-server
//! that listens both ways: calls a second at 1 and at 64 checks in flight.
//!
//! `cargo run --release --features redis-tls --example redis_tls_compare [-- --quick]`
//!
//! Starts its own redis-server (Debian's is built with TLS) on free loopback ports, with a CA and
//! a server certificate made here, and stops it at the end. Method: the two stores are measured
//! in alternating rounds (plain, TLS, plain, TLS ...); each figure and its ratio are the medians
//! over the same rounds, and the ratio is TLS calls a second over plain calls a second.

use std::time::Instant;

use atomic_limiter::Quota;
use atomic_limiter::redis::{RedisGcra, RedisOptions, RedisStore, TlsOptions};
use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};

#[path = "../tests/common/redis_server.rs"]
mod redis_server;
#[path = "../benches/common/stats.rs"]
mod stats;

use stats::median;

/// `calls` checks of `limiter`, `in_flight` at a time; checks a second.
async fn rate(limiter: &RedisGcra, calls: usize, in_flight: usize) -> f64 {
    let start = Instant::now();
    let per = calls / in_flight;
    let mut tasks = tokio::task::JoinSet::new();
    for t in 0..in_flight {
        let l = limiter.clone();
        tasks.spawn(async move {
            for i in 0..per {
                let d = l
                    .try_check_n(&format!("s{}", (t * per + i) % 1000), 1)
                    .await;
                assert!(d.expect("the store answers").is_allowed());
            }
        });
    }
    while tasks.join_next().await.is_some() {}
    (per * in_flight) as f64 / start.elapsed().as_secs_f64()
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    // A CA and a certificate for 127.0.0.1, written where the server reads them.
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_pem = ca_params.self_signed(&ca_key).unwrap().pem();
    let issuer = Issuer::new(ca_params, ca_key);
    let key = KeyPair::generate().unwrap();
    let cert = CertificateParams::new(vec!["127.0.0.1".to_string()])
        .unwrap()
        .signed_by(&key, &issuer)
        .unwrap();
    let dir =
        std::env::temp_dir().join(format!("atomic-limiter-tls-compare-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let put = |name: &str, text: &str| {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        path.to_str().unwrap().to_owned()
    };
    let (cert_file, key_file, ca_file) = (
        put("server.crt", &cert.pem()),
        put("server.key", &key.serialize_pem()),
        put("ca.crt", &ca_pem),
    );
    let tls_port = redis_server::free_port().to_string();
    let Some(server) = redis_server::RedisServer::start_with(
        "redis_tls_compare",
        &[
            "--tls-port",
            &tls_port,
            "--tls-cert-file",
            &cert_file,
            "--tls-key-file",
            &key_file,
            "--tls-ca-cert-file",
            &ca_file,
            "--tls-auth-clients",
            "no",
        ],
    ) else {
        return;
    };
    let options = RedisOptions::default().with_deadline(std::time::Duration::from_secs(1));
    let tls = options
        .clone()
        .with_tls(TlsOptions::new().with_ca(ca_pem.into_bytes()));
    let quota = Quota::per_second(1_000_000_000).with_burst(1_000_000);
    let plain = RedisStore::connect(&server.url(), &options).await.unwrap();
    let tls_port = server.tls_port().expect("the server's TLS port");
    let secure = RedisStore::connect(&format!("rediss://127.0.0.1:{tls_port}/"), &tls)
        .await
        .unwrap();
    let plain = RedisGcra::with_limits(plain, "plain", [("q", quota)], options.clone()).unwrap();
    let secure = RedisGcra::with_limits(secure, "tls", [("q", quota)], tls).unwrap();
    let rounds = if quick { 3 } else { 7 };
    println!("RedisGcra checks a second, plain TCP and TLS, {rounds} alternating rounds (medians)");
    println!(
        "   {:<10} {:>11} {:>11} {:>10}",
        "in flight", "plain/s", "tls/s", "tls/plain"
    );
    for (in_flight, calls) in [
        (1usize, if quick { 2_000 } else { 10_000 }),
        (64, if quick { 20_000 } else { 100_000 }),
    ] {
        rate(&plain, calls / 10, in_flight).await;
        rate(&secure, calls / 10, in_flight).await;
        let (mut p, mut t, mut r) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..rounds {
            let a = rate(&plain, calls, in_flight).await;
            let b = rate(&secure, calls, in_flight).await;
            p.push(a);
            t.push(b);
            r.push(b / a);
        }
        println!(
            "   {:<10} {:>11.0} {:>11.0} {:>10.2}   (ratio per round: {:.2} to {:.2})",
            in_flight,
            median(&p),
            median(&t),
            median(&r),
            r.iter().cloned().fold(f64::INFINITY, f64::min),
            r.iter().cloned().fold(0.0, f64::max),
        );
    }
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

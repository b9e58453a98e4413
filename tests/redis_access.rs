//! The store as production runs it, against real redis-server processes the tests start on free
//! loopback ports: TLS (a private CA made here, mutual TLS, a TLS cluster), a least-privilege ACL
//! user, a master found and followed through Redis Sentinel, and no secret in any text the
//! crate prints.
//!
//! Skipped (with a line saying so) where redis-server is not installed; failing instead under CI.
#![cfg(all(feature = "redis-tls", feature = "metrics"))]

use std::path::PathBuf;
use std::time::{Duration, Instant};

use atomic_limiter::redis::{
    FailurePolicy, LeaseOptions, Leased, RedisGcra, RedisOptions, RedisStore, TlsOptions,
};
use atomic_limiter::{DecidedBy, Quota};
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};

#[path = "common/redis_server.rs"]
mod redis_server;
use redis_server::{RedisCluster, RedisServer, free_port};

#[path = "common/counters.rs"]
mod counters;

#[path = "common/host_stalls.rs"]
mod host_stalls;

#[path = "common/redis_timing.rs"]
mod redis_timing;
use redis_timing::runtime;

/// A CA, and what it signs.
struct Ca {
    pem: String,
    issuer: Issuer<'static, KeyPair>,
}

impl Ca {
    fn new(name: &str) -> Ca {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        let pem = params.self_signed(&key).unwrap().pem();
        Ca {
            pem,
            issuer: Issuer::new(params, key),
        }
    }

    /// A certificate for `names` (host names or IP addresses) and its key, PEM; `expired` makes
    /// one whose validity ended in 2001.
    fn sign(&self, names: &[&str], expired: bool) -> (String, String) {
        let key = KeyPair::generate().unwrap();
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let mut params = CertificateParams::new(names).unwrap();
        params
            .distinguished_name
            .push(DnType::CommonName, "atomic-limiter test");
        if expired {
            params.not_before = rcgen::date_time_ymd(2000, 1, 1);
            params.not_after = rcgen::date_time_ymd(2001, 1, 1);
        }
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        (cert.pem(), key.serialize_pem())
    }
}

/// Files a server reads its certificates from, removed at the end.
struct Files(PathBuf);

impl Files {
    fn new() -> Files {
        let dir = std::env::temp_dir().join(format!(
            "atomic-limiter-tls-{}-{}",
            std::process::id(),
            free_port()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        Files(dir)
    }

    fn put(&self, name: &str, text: &str) -> String {
        let path = self.0.join(name);
        std::fs::write(&path, text).unwrap();
        path.to_str().unwrap().to_owned()
    }
}

impl Drop for Files {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A server's TLS settings: its certificate and key, the CA that clients' certificates must come
/// from, and whether it asks clients for one.
fn tls_settings(
    files: &Files,
    ca: &Ca,
    cert: &(String, String),
    auth_clients: bool,
) -> Vec<String> {
    vec![
        "--tls-cert-file".into(),
        files.put("server.crt", &cert.0),
        "--tls-key-file".into(),
        files.put("server.key", &cert.1),
        "--tls-ca-cert-file".into(),
        files.put("ca.crt", &ca.pem),
        "--tls-auth-clients".into(),
        if auth_clients { "yes" } else { "no" }.into(),
    ]
}

/// A server listening in plain text on its `port` (the tests' own commands) and over TLS on the
/// port returned.
fn tls_server(test: &str, settings: &[String]) -> Option<(RedisServer, u16)> {
    let tls_port = free_port();
    let mut extra: Vec<&str> = vec!["--tls-port"];
    let tls_port_text = tls_port.to_string();
    extra.push(&tls_port_text);
    extra.extend(settings.iter().map(String::as_str));
    RedisServer::start_with(test, &extra).map(|s| {
        let tls_port = s.tls_port().unwrap();
        (s, tls_port)
    })
}

fn patient() -> RedisOptions {
    RedisOptions::default().with_deadline(Duration::from_secs(1))
}

/// Options for a connect that must be refused. The store refuses only an answer it got: a
/// first connect that times out is taken for a server still coming up and retried on first use.
/// A refused TLS attempt takes about 35 ms of the default 250 ms in a debug build on an idle
/// host, several times that on a loaded one, where without this allowance the timeout, not the
/// certificate, could decide.
fn refusing() -> RedisOptions {
    patient().with_connect_timeout(Duration::from_secs(10))
}

/// One limit (named `q`) of `quota` on `store` under `prefix`, with `options`.
fn gcra(store: RedisStore, prefix: &str, quota: Quota, options: RedisOptions) -> RedisGcra {
    RedisGcra::with_limits(store, prefix, [("q", quota)], options).unwrap()
}

/// The first `count` decisions for one subject, as (allowed, remaining).
async fn decisions(limiter: &RedisGcra, subject: &str, count: usize) -> Vec<(bool, u64)> {
    let mut seen = Vec::new();
    for _ in 0..count {
        let d = limiter.check(subject).await;
        assert_eq!(d.decided_by(), DecidedBy::Store, "{d:?}");
        seen.push((d.is_allowed(), d.remaining()));
    }
    seen
}

#[test]
fn decisions_over_tls_equal_those_over_plain_tcp() {
    let ca = Ca::new("test CA");
    let files = Files::new();
    let cert = ca.sign(&["localhost", "127.0.0.1"], false);
    let Some((server, tls_port)) = tls_server("tls", &tls_settings(&files, &ca, &cert, false))
    else {
        return;
    };
    runtime().block_on(async {
        let quota = Quota::per_minute(10).with_burst(10);
        let plain = RedisStore::connect(&server.url(), &patient())
            .await
            .unwrap();
        let tls = patient().with_tls(TlsOptions::new().with_ca(ca.pem.clone().into_bytes()));
        let secure = RedisStore::connect(&format!("rediss://127.0.0.1:{tls_port}/"), &tls)
            .await
            .unwrap();
        // The same server over both: the same subject in two prefixes, the same figures.
        let a = gcra(plain, "plain", quota, patient());
        let b = gcra(secure, "tls", quota, patient());
        let over_plain = decisions(&a, "client", 14).await;
        let over_tls = decisions(&b, "client", 14).await;
        assert_eq!(over_plain, over_tls);
        assert_eq!(over_tls.iter().filter(|d| d.0).count(), 10);
        // And the TLS one under a lease as well.
        let leased = Leased::new(b, "leased", LeaseOptions::default());
        let admitted = {
            let mut n = 0;
            for _ in 0..12 {
                n += usize::from(leased.check().await.is_allowed());
            }
            n
        };
        assert_eq!(admitted, 10);
    });
}

#[test]
fn a_certificate_that_does_not_verify_is_refused_at_connect() {
    let ca = Ca::new("test CA");
    let other = Ca::new("another CA");
    let files = Files::new();
    let good = ca.sign(&["localhost", "127.0.0.1"], false);
    let Some((server, tls_port)) =
        tls_server("tls refusals", &tls_settings(&files, &ca, &good, false))
    else {
        return;
    };
    let url = format!("rediss://127.0.0.1:{tls_port}/");
    let trusting =
        |ca: &Ca| refusing().with_tls(TlsOptions::new().with_ca(ca.pem.clone().into_bytes()));
    runtime().block_on(async {
        // Signed by a CA the client does not trust.
        let e = RedisStore::connect(&url, &trusting(&other))
            .await
            .unwrap_err();
        eprintln!("another CA: {e}");
        assert!(e.to_string().to_lowercase().contains("certificate"), "{e}");
        // The system's roots do not hold the test CA either.
        let e = RedisStore::connect(&url, &refusing()).await.unwrap_err();
        eprintln!("system roots: {e}");
        // TLS options on a plain URL: refused, not ignored.
        let e = RedisStore::connect(&server.url(), &trusting(&ca))
            .await
            .unwrap_err();
        assert!(e.to_string().contains("rediss://"), "{e}");
        // TLS spoken to the plain port: never a plaintext fallback. The server drops the
        // connection, which may be a server still coming up: the store waits, the policy decides.
        let url = format!("rediss://127.0.0.1:{}/", server.port);
        let tls = TlsOptions::new().with_ca(ca.pem.clone().into_bytes());
        match RedisStore::connect(&url, &patient().with_tls(tls)).await {
            Err(e) => eprintln!("TLS to a plain port: {e}"),
            Ok(store) => {
                let limiter = gcra(store, "x", Quota::per_minute(5), patient());
                let e = limiter.try_check_n("client", 1).await.unwrap_err();
                eprintln!("TLS to a plain port, on first use: {e}");
                assert_ne!(limiter.check("client").await.decided_by(), DecidedBy::Store);
            }
        }
    });
    drop(server);
    // A certificate for another host, and an expired one.
    for (what, cert) in [
        ("another host", ca.sign(&["example.invalid"], false)),
        ("expired", ca.sign(&["localhost", "127.0.0.1"], true)),
    ] {
        let files = Files::new();
        let Some((_server, tls_port)) =
            tls_server("tls refusals", &tls_settings(&files, &ca, &cert, false))
        else {
            return;
        };
        runtime().block_on(async {
            let url = format!("rediss://127.0.0.1:{tls_port}/");
            let e = RedisStore::connect(&url, &trusting(&ca)).await.unwrap_err();
            eprintln!("{what}: {e}");
            assert!(
                e.to_string().to_lowercase().contains("certificate"),
                "{what}: {e}"
            );
        });
    }
}

#[test]
fn mutual_tls_admits_only_a_client_with_a_certificate() {
    let ca = Ca::new("test CA");
    let files = Files::new();
    let cert = ca.sign(&["localhost", "127.0.0.1"], false);
    let client = ca.sign(&["limiter"], false);
    let Some((_server, tls_port)) =
        tls_server("mutual tls", &tls_settings(&files, &ca, &cert, true))
    else {
        return;
    };
    let url = format!("rediss://127.0.0.1:{tls_port}/");
    let ca_only = TlsOptions::new().with_ca(ca.pem.clone().into_bytes());
    runtime().block_on(async {
        let e = RedisStore::connect(&url, &refusing().with_tls(ca_only.clone()))
            .await
            .unwrap_err();
        eprintln!("no client certificate: {e}");
        let with_cert =
            ca_only.with_client_certificate(client.0.into_bytes(), client.1.into_bytes());
        let options = patient().with_tls(with_cert);
        let store = RedisStore::connect(&url, &options).await.unwrap();
        let limiter = gcra(store, "mtls", Quota::per_minute(3).with_burst(3), patient());
        let seen = decisions(&limiter, "client", 4).await;
        assert_eq!(seen, vec![(true, 2), (true, 1), (true, 0), (false, 0)]);
    });
}

#[test]
fn a_tls_cluster_under_the_acl_decides_on_every_master() {
    let ca = Ca::new("test CA");
    let files = Files::new();
    let cert = ca.sign(&["localhost", "127.0.0.1"], false);
    let client = ca.sign(&["limiter"], false);
    let settings = tls_settings(&files, &ca, &cert, true);
    let cli = vec![
        "--tls".into(),
        "--cacert".into(),
        files.put("cli-ca.crt", &ca.pem),
        "--cert".into(),
        files.put("cli.crt", &client.0),
        "--key".into(),
        files.put("cli.key", &client.1),
    ];
    let Some((cluster, tls_ports)) = RedisCluster::start_tls("tls cluster", &settings, &cli) else {
        return;
    };
    for node in &cluster.nodes {
        acl(node, &limiter_acl("tls-cluster", "cluster-pw", None));
    }
    runtime().block_on(async {
        let tls = TlsOptions::new()
            .with_ca(ca.pem.clone().into_bytes())
            .with_client_certificate(client.0.clone().into_bytes(), client.1.clone().into_bytes());
        let seeds: Vec<String> = tls_ports
            .iter()
            .map(|p| format!("rediss://127.0.0.1:{p}"))
            .collect();
        let seeds: Vec<&str> = seeds.iter().map(String::as_str).collect();
        let options = patient()
            .with_tls(tls)
            .with_credentials("limiter", "cluster-pw");
        let store = RedisStore::connect_cluster(&seeds, &options).await.unwrap();
        let limiter = gcra(
            store,
            "tls-cluster",
            Quota::per_minute(2).with_burst(2),
            patient(),
        );
        // Subjects until every master has served one.
        let mut masters = std::collections::BTreeSet::new();
        for i in 0..200 {
            let subject = format!("s{i}");
            masters.insert(cluster.master_of(&limiter.key(&subject, "q")));
            let seen = decisions(&limiter, &subject, 3).await;
            assert_eq!(seen, vec![(true, 1), (true, 0), (false, 0)], "{subject}");
            if masters.len() == 3 {
                break;
            }
        }
        assert_eq!(masters.len(), 3);
    });
}

/// The ACL `docs/design.md` §11 gives the limiter, for the key prefix `prefix`.
fn limiter_acl(prefix: &str, password: &str, leave_out: Option<&str>) -> Vec<String> {
    let mut rules = vec![
        "SETUSER".to_string(),
        "limiter".into(),
        "reset".into(),
        "on".into(),
        format!(">{password}"),
        format!("~{prefix}:*"),
        "resetchannels".into(),
        "-@all".into(),
    ];
    for command in [
        "+evalsha",
        "+eval",
        "+time",
        "+get",
        "+set",
        "+info",
        "+cluster|slots",
        "+role",
    ] {
        if Some(command) != leave_out {
            rules.push(command.into());
        }
    }
    rules
}

/// Whether an error says the ACL refused it (`NOPERM` on a command; a script's own refusal of a
/// command it calls).
fn refused_for_permission(text: &str) -> bool {
    text.contains("NOPERM")
        || text.contains("no permissions")
        || text.contains("can't run this command")
}

/// The count of the one entry in a raw `ACL LOG` reply (failures of one kind are counted in
/// one entry); `None` unless there is exactly one.
fn failed_logins(raw_log: &str) -> Option<u64> {
    let mut counts = raw_log.split("$5\r\ncount\r\n:").skip(1);
    let count = counts.next()?.split("\r\n").next()?.parse().ok();
    counts.next().is_none().then_some(count?)
}

fn acl(server: &RedisServer, rules: &[String]) {
    let mut args = vec!["ACL"];
    args.extend(rules.iter().map(String::as_str));
    let reply = server.command(&args).unwrap_or_default();
    assert!(reply.starts_with("+OK"), "ACL {rules:?}: {reply}");
}

#[test]
fn the_documented_acl_runs_every_operation_and_nothing_more() {
    let Some(server) = RedisServer::start("acl") else {
        return;
    };
    acl(&server, &limiter_acl("api", "s3cret-pw", None));
    let url = format!("redis://limiter:s3cret-pw@127.0.0.1:{}/", server.port);
    runtime().block_on(async {
        // From the URL, and from the options.
        let store = RedisStore::connect(&url, &patient()).await.unwrap();
        let by_options = patient().with_credentials("limiter", "s3cret-pw");
        let other = RedisStore::connect(&server.url(), &by_options)
            .await
            .unwrap();
        let quota = Quota::per_minute(4).with_burst(4);
        let limiter = gcra(store.clone(), "api", quota, patient());
        let seen = decisions(&limiter, "client", 5).await;
        assert_eq!(seen.iter().filter(|d| d.0).count(), 4);
        let limiter2 = gcra(other, "api", quota, patient());
        assert!(limiter2.check("client").await.is_denied());
        assert_eq!(
            limiter2.check("another").await.decided_by(),
            DecidedBy::Store
        );
        // A flushed script cache: EVAL with the body.
        assert!(
            server
                .command(&["SCRIPT", "FLUSH"])
                .unwrap()
                .starts_with("+OK")
        );
        assert_eq!(limiter.check("third").await.decided_by(), DecidedBy::Store);
        // A change of quota, several limits, a lease.
        limiter
            .set_quota(
                "q",
                Quota::per_minute(8).with_burst(8),
                atomic_limiter::Carry::Proportional,
            )
            .unwrap();
        assert_eq!(limiter.check("fourth").await.decided_by(), DecidedBy::Store);
        let two = RedisGcra::with_limits(
            store.clone(),
            "api",
            [
                ("second", Quota::per_second(5)),
                ("minute", Quota::per_minute(50)),
            ],
            patient(),
        )
        .unwrap();
        assert_eq!(two.check("client").await.decided_by(), DecidedBy::Store);
        let leased = Leased::new(limiter, "leased", LeaseOptions::default());
        assert_eq!(leased.check().await.decided_by(), DecidedBy::Store);
        // The upkeep's INFO is allowed: it saw the server, and counts no restart.
        tokio::time::sleep(Duration::from_millis(1200)).await;
        assert_eq!(store.restarts(), 0);
        // Keys outside the prefix are not the user's.
        let outside = gcra(store, "other", quota, patient());
        let e = outside.try_check_n("client", 1).await.unwrap_err();
        eprintln!("outside the prefix: {e}");
        assert!(refused_for_permission(&e.to_string()), "{e}");
    });
}

#[test]
fn a_missing_permission_or_a_wrong_password_is_a_clear_error_and_a_policy_decision() {
    let Some(server) = RedisServer::start("acl errors") else {
        return;
    };
    use metrics_util::debugging::DebuggingRecorder;
    let recorder = DebuggingRecorder::new();
    let counted =
        metrics::with_local_recorder(&recorder, || atomic_limiter::LimiterMetrics::new("acl"));
    runtime().block_on(async {
        // Wrong password: refused at connect, and the error says why, not what was tried.
        acl(&server, &limiter_acl("api", "right-pw", None));
        let wrong = refusing().with_credentials("limiter", "wrong-pw");
        assert!(server.command(&["ACL", "LOG", "RESET"]).is_some());
        let e = RedisStore::connect(&server.url(), &wrong)
            .await
            .unwrap_err();
        eprintln!("wrong password: {e}");
        assert!(!format!("{e} {e:?}").contains("wrong-pw"));
        assert!(
            e.to_string().contains("WRONGPASS") || e.to_string().contains("uthentication"),
            "{e}"
        );
        // After one attempt: a refusal is not retried, so it is answered within the
        // connection timeout however busy the host.
        let log = server.command(&["ACL", "LOG"]).unwrap_or_default();
        assert_eq!(failed_logins(&log), Some(1), "{log:?}");
        // One permission left out: every check a policy decision, counted, never a hang.
        for missing in ["+time", "+evalsha", "+set"] {
            acl(&server, &limiter_acl("api", "right-pw", Some(missing)));
            let options = patient()
                .with_credentials("limiter", "right-pw")
                .with_policy(FailurePolicy::Closed)
                .with_metrics(counted.clone());
            let store = RedisStore::connect(&server.url(), &options).await.unwrap();
            let limiter = gcra(store, "api", Quota::per_minute(4), options);
            let e = limiter.try_check_n("client", 1).await.unwrap_err();
            eprintln!("without {missing}: {e}");
            assert!(refused_for_permission(&e.to_string()), "{missing}: {e}");
            let start = Instant::now();
            let d = limiter.check("client").await;
            assert_eq!(d.decided_by(), DecidedBy::FailClosed, "{missing}");
            assert!(start.elapsed() < Duration::from_secs(1));
        }
        // A password changed under a running store: its reconnections are refused, and the
        // policy decides.
        acl(&server, &limiter_acl("api", "right-pw", None));
        let options = patient()
            .with_credentials("limiter", "right-pw")
            .with_metrics(counted.clone());
        let store = RedisStore::connect(&server.url(), &options).await.unwrap();
        let limiter = gcra(store, "api", Quota::per_minute(100), options);
        assert_eq!(
            limiter.check("rotated").await.decided_by(),
            DecidedBy::Store
        );
        acl(&server, &limiter_acl("api", "rotated-pw", None));
        server.command(&["CLIENT", "KILL", "USER", "limiter"]);
        let mut by_policy = 0;
        for _ in 0..20 {
            let start = Instant::now();
            by_policy +=
                usize::from(limiter.check("rotated").await.decided_by() == DecidedBy::FailClosed);
            assert!(start.elapsed() < Duration::from_secs(2));
        }
        assert!(by_policy >= 19, "{by_policy}");
    });
    let c = counters::counters(&recorder);
    let failed = |reason: &str| {
        counters::count(
            &c,
            "backend_errors_total",
            &format!("limiter=acl,reason={reason}"),
        )
    };
    assert!(failed("redis") >= 4, "{c:#?}");
    assert!(
        counters::count(&c, "failure_decisions_total", "limiter=acl,policy=closed") >= 20,
        "{c:#?}"
    );
    // No label or name carries a password.
    for key in c.keys() {
        assert!(!key.contains("pw"), "{key}");
    }
}

#[test]
fn no_text_of_the_crate_shows_a_secret() {
    let key_marker = "PRIVATE KEY";
    let ca = Ca::new("test CA");
    let client = ca.sign(&["limiter"], false);
    let options = RedisOptions::default()
        .with_credentials("limiter", "hunter2-secret")
        .with_tls(
            TlsOptions::new()
                .with_ca(ca.pem.clone().into_bytes())
                .with_client_certificate(client.0.into_bytes(), client.1.into_bytes()),
        );
    let shown = format!("{options:?}");
    assert!(
        !shown.contains("hunter2-secret") && !shown.contains(key_marker),
        "{shown}"
    );
    assert!(shown.contains("<redacted>"), "{shown}");
    let Some(server) = RedisServer::start("secrets") else {
        return;
    };
    acl(&server, &limiter_acl("api", "hunter2-secret", None));
    runtime().block_on(async {
        let url = format!("redis://limiter:hunter2-secret@127.0.0.1:{}/", server.port);
        let store = RedisStore::connect(&url, &patient()).await.unwrap();
        let limiter = gcra(store.clone(), "api", Quota::per_minute(4), patient());
        let leased = Leased::new(limiter.clone(), "s", LeaseOptions::default());
        for text in [
            format!("{store:?}"),
            format!("{limiter:?}"),
            format!("{leased:?}"),
        ] {
            assert!(!text.contains("hunter2"), "{text}");
        }
        // Errors: a wrong password in the URL, a bad URL, a server gone.
        for url in [
            format!("redis://limiter:hunter2-wrong@127.0.0.1:{}/", server.port),
            "redis://limiter:hunter2-x@[::1".to_string(),
            format!("redis://limiter:hunter2-gone@127.0.0.1:{}/", free_port()),
        ] {
            if let Err(e) = RedisStore::connect(&url, &patient()).await {
                let text = format!("{e} {e:?}");
                assert!(!text.contains("hunter2"), "{text}");
            }
        }
        let e = limiter.try_check_n("x", 1000).await;
        let text = format!("{e:?}");
        assert!(!text.contains("hunter2"), "{text}");
    });
}

/// A master, its replica and three sentinels; the master killed while four callers check: how
/// long until the store decides again once the replica is promoted.
#[test]
fn a_sentinel_failover_is_followed_within_a_second_of_the_promotion() {
    let Some(mut master) = RedisServer::start("sentinel") else {
        return;
    };
    let port = master.port.to_string();
    let replica =
        RedisServer::start_with("sentinel", &["--replicaof", "127.0.0.1", &port]).unwrap();
    let synced = Instant::now();
    while !replica
        .command(&["INFO", "replication"])
        .is_some_and(|r| r.contains("master_link_status:up"))
    {
        assert!(
            synced.elapsed() < Duration::from_secs(10),
            "the replica did not sync"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let sentinels: Vec<RedisServer> = (0..3)
        .map(|_| RedisServer::start_sentinel("sentinel", master.port, 500).unwrap())
        .collect();
    let urls: Vec<String> = sentinels
        .iter()
        .map(|s| format!("redis://127.0.0.1:{}", s.port))
        .collect();
    let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
    // The sentinels know the replica and each other before the fault.
    let known = Instant::now();
    while !sentinels.iter().all(|s| {
        s.command(&["SENTINEL", "MASTER", "mymaster"])
            .is_some_and(|r| {
                r.contains("num-slaves\r\n$1\r\n1\r\n")
                    && r.contains("num-other-sentinels\r\n$1\r\n2\r\n")
            })
    }) {
        assert!(
            known.elapsed() < Duration::from_secs(20),
            "the sentinels did not meet"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // The limiter's user on both servers (ACLs are not replicated): ROLE and INFO under it.
    acl(&master, &limiter_acl("sentinel", "sentinel-pw", None));
    acl(&replica, &limiter_acl("sentinel", "sentinel-pw", None));
    runtime().block_on(async {
        let options = RedisOptions::default()
            .with_deadline(Duration::from_millis(50))
            .with_policy(FailurePolicy::Closed)
            .with_credentials("limiter", "sentinel-pw");
        let store = RedisStore::connect_sentinel(&urls, "mymaster", &options)
            .await
            .unwrap();
        let limiter = gcra(store, "sentinel", Quota::per_second(1_000_000), options);
        assert_eq!(limiter.check("warm").await.decided_by(), DecidedBy::Store);
        let started = Instant::now();
        let run = Duration::from_secs(12);
        let callers: Vec<_> = (0..4)
            .map(|c| {
                let limiter = limiter.clone();
                tokio::spawn(async move {
                    let mut seen = Vec::new();
                    let mut i = 0u64;
                    while started.elapsed() < run {
                        let t = Instant::now();
                        let d = limiter.check(&format!("c{c}-{}", i % 50)).await;
                        seen.push((t, t.elapsed(), d.decided_by()));
                        i += 1;
                        tokio::time::sleep(Duration::from_millis(2)).await;
                    }
                    seen
                })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let killed = Instant::now();
        master.kill();
        // The promotion: the replica calls itself master, then the sentinels name it.
        let replica_port = format!("\r\n{}\r\n", replica.port);
        let (mut promoted, mut announced) = (None, None);
        while announced.is_none() {
            if promoted.is_none()
                && replica
                    .command(&["ROLE"])
                    .is_some_and(|r| r.contains("master"))
            {
                promoted = Some(Instant::now());
            }
            let named = sentinels[0]
                .command(&["SENTINEL", "GET-MASTER-ADDR-BY-NAME", "mymaster"])
                .is_some_and(|r| r.contains(&replica_port));
            if named {
                announced = Some(Instant::now());
            }
            assert!(killed.elapsed() < Duration::from_secs(9), "no failover");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let promoted = promoted.unwrap_or(announced.unwrap());
        let announced = announced.unwrap();
        let mut calls = Vec::new();
        for caller in callers {
            calls.extend(caller.await.unwrap());
        }
        calls.sort_by_key(|c| c.0);
        let slowest = calls.iter().map(|c| c.1).max().unwrap();
        let by_store_again = calls
            .iter()
            .find(|c| c.0 > promoted && c.2 == DecidedBy::Store)
            .map(|c| c.0 + c.1 - promoted);
        let during: Vec<_> = calls
            .iter()
            .filter(|c| c.0 > killed && c.0 < promoted)
            .collect();
        let policy = during
            .iter()
            .filter(|c| c.2 == DecidedBy::FailClosed)
            .count();
        eprintln!(
            "promotion {:?} after the kill, announced by the sentinels {:?} after that; the \
             store decided again {by_store_again:?} after the promotion; {policy} of {} checks in \
             between by the policy; slowest check {slowest:?}",
            promoted - killed,
            announced - promoted,
            during.len()
        );
        // Within a second of the promotion, though the sentinels announce it up to a second
        // later (their INFO period to a promoted replica).
        let again = by_store_again.expect("the store never decided again");
        assert!(again <= Duration::from_secs(1), "{again:?}");
        assert!(policy > 0);
        assert!(during.iter().all(|c| c.2 != DecidedBy::FailOpen));
        // Every check after that is the store's.
        let after: Vec<_> = calls
            .iter()
            .filter(|c| c.0 > promoted + again + Duration::from_millis(200))
            .collect();
        let store = after.iter().filter(|c| c.2 == DecidedBy::Store).count();
        assert!(
            store * 100 >= after.len() * 99,
            "{store} of {}",
            after.len()
        );
        assert!(slowest < Duration::from_secs(1), "{slowest:?}");
    });
}

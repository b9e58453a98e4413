//! `atomic-limiter-rls`: Envoy's global rate-limit service on atomic-limiter's GCRA.
//!
//! ```text
//! atomic-limiter-rls --config ratelimit.yaml [--grpc-addr 127.0.0.1:8081] [--http-addr 127.0.0.1:8080]
//! ```
//!
//! SIGHUP reloads the configuration (a bad file is refused and the one in force kept); SIGTERM
//! or Ctrl-C drains: health turns NOT_SERVING, calls under way finish, then the process exits.

use atomic_limiter_rls::{config, service};

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use atomic_limiter::rls::Engine;
use axum::http::StatusCode;
use clap::Parser;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitServiceServer;
use tokio::signal::unix::{SignalKind, signal};

/// Envoy's global rate-limit service (envoy.service.ratelimit.v3), deciding with GCRA.
#[derive(Debug, Parser)]
#[command(version)]
struct Args {
    /// A configuration file in envoyproxy/ratelimit's format, or a folder of them (*.yaml,
    /// *.yml); repeat for several. One file is one domain.
    #[arg(long, required = true)]
    config: Vec<PathBuf>,
    /// Where the gRPC service listens.
    #[arg(long, default_value = "127.0.0.1:8081")]
    grpc_addr: SocketAddr,
    /// Where /healthz and /metrics (Prometheus) are served.
    #[arg(long, default_value = "127.0.0.1:8080")]
    http_addr: SocketAddr,
    /// Keys each limit holds at most (least recently used ones go first past it).
    #[arg(long, default_value_t = 1_000_000)]
    max_keys: usize,
    /// How long a drain waits for calls under way after SIGTERM.
    #[arg(long, default_value = "10", value_name = "SECONDS")]
    drain_secs: u64,
    /// Keep the limits on Redis or Valkey (`redis://host:port`, `rediss://` for TLS), shared by
    /// every replica; absent: in this process. Needs the `redis` feature.
    #[arg(long, value_name = "URL")]
    redis: Option<String>,
    /// How the store decides: `gcra`, one atomic script per request, exact; or `leased`, each
    /// key spending a local lease refilled from the store in batches (no round trip while it
    /// lasts; the fleet admits at most `burst + rate × (window + lease TTL)`).
    #[arg(long, value_enum, default_value = "gcra")]
    redis_mode: RedisMode,
    /// How long a lease may be spent, in milliseconds (`leased` mode).
    #[arg(long, default_value_t = 1000, value_name = "MS")]
    lease_ttl_ms: u64,
    /// The most tokens one lease takes (`leased` mode).
    #[arg(long, default_value_t = 1000)]
    max_lease: u32,
    /// The prefix of the service's keys on the store.
    #[arg(long, default_value = "rls")]
    redis_prefix: String,
    /// How long one call to the store may take, in milliseconds.
    #[arg(long, default_value_t = 20, value_name = "MS")]
    redis_deadline_ms: u64,
    /// What a request gets while the store cannot answer: `unavailable` (gRPC UNAVAILABLE, and
    /// Envoy applies its failure_mode_deny), `allow` (OK) or `deny` (OVER_LIMIT).
    #[arg(long, value_enum, default_value = "unavailable")]
    on_store_error: OnStoreError,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum RedisMode {
    Gcra,
    Leased,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum OnStoreError {
    Unavailable,
    Allow,
    Deny,
}

/// One log line on standard error: the UTC time, the level, the message.
fn log(level: &str, message: &str) {
    let now = humantime::format_rfc3339_millis(std::time::SystemTime::now());
    eprintln!("{now} {level:5} {message}");
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let args = Args::parse();
    match run(args).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            log("ERROR", &e);
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> Result<(), String> {
    let loaded = config::load(&args.config).map_err(|e| format!("configuration refused: {e}"))?;
    for w in &loaded.warnings {
        log("WARN", w);
    }
    let (engine, backend) = engine(&args, &loaded).await?;
    let engine = Arc::new(engine);
    log(
        "INFO",
        &format!(
            "loaded {} domain(s), {} limit(s) from {} file(s); backend: {backend}",
            loaded.domains.len(),
            engine.limits().len(),
            loaded.files.len()
        ),
    );
    let prometheus = metrics_exporter_prometheus::PrometheusBuilder::new()
        .set_buckets_for_metric(
            metrics_exporter_prometheus::Matcher::Full("rls_decision_seconds".into()),
            &[1e-6, 5e-6, 2e-5, 1e-4, 5e-4, 1e-3, 5e-3, 2e-2, 0.1],
        )
        .map_err(|e| e.to_string())?
        .install_recorder()
        .map_err(|e| format!("metrics: {e}"))?;

    let grpc = tokio::net::TcpListener::bind(args.grpc_addr)
        .await
        .map_err(|e| format!("gRPC address {}: {e}", args.grpc_addr))?;
    let http = tokio::net::TcpListener::bind(args.http_addr)
        .await
        .map_err(|e| format!("HTTP address {}: {e}", args.http_addr))?;
    log(
        "INFO",
        &format!(
            "serving gRPC on {}, /healthz and /metrics on {}",
            grpc.local_addr().map_err(|e| e.to_string())?,
            http.local_addr().map_err(|e| e.to_string())?
        ),
    );

    let (health, health_service) = tonic_health::server::health_reporter();
    health
        .set_serving::<RateLimitServiceServer<service::Rls>>()
        .await;
    let serving = Arc::new(AtomicBool::new(true));

    // Reloads on SIGHUP; drains on SIGTERM or SIGINT.
    let mut hangup = signal(SignalKind::hangup()).map_err(|e| e.to_string())?;
    let mut terminate = signal(SignalKind::terminate()).map_err(|e| e.to_string())?;
    let (drain, drained) = tokio::sync::watch::channel(false);
    {
        let engine = engine.clone();
        let paths = args.config.clone();
        tokio::spawn(async move {
            while hangup.recv().await.is_some() {
                reload(&engine, &paths);
            }
        });
    }
    {
        let serving = serving.clone();
        let health = health.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = terminate.recv() => log("INFO", "SIGTERM: draining"),
                _ = tokio::signal::ctrl_c() => log("INFO", "interrupted: draining"),
            }
            // Probes see the drain first, so that new calls go elsewhere.
            serving.store(false, Ordering::Relaxed);
            health
                .set_not_serving::<RateLimitServiceServer<service::Rls>>()
                .await;
            let _ = drain.send(true);
        });
    }

    let app = {
        let serving = serving.clone();
        axum::Router::new()
            .route(
                "/healthz",
                axum::routing::get(move || {
                    let up = serving.load(Ordering::Relaxed);
                    async move {
                        if up {
                            (StatusCode::OK, "OK\n")
                        } else {
                            (StatusCode::SERVICE_UNAVAILABLE, "draining\n")
                        }
                    }
                }),
            )
            .route(
                "/metrics",
                axum::routing::get(move || {
                    let text = prometheus.render();
                    async move { text }
                }),
            )
    };
    let mut http_drained = drained.clone();
    let http_task = tokio::spawn(async move {
        let _ = axum::serve(http, app)
            .with_graceful_shutdown(async move {
                let _ = http_drained.wait_for(|d| *d).await;
            })
            .await;
    });

    let mut grpc_drained = drained.clone();
    let server = tonic::transport::Server::builder()
        .add_service(health_service)
        .add_service(RateLimitServiceServer::new(service::Rls {
            engine: engine.clone(),
        }))
        .serve_with_incoming_shutdown(tokio_stream_of(grpc), async move {
            let _ = grpc_drained.wait_for(|d| *d).await;
        });
    let mut bounded = drained.clone();
    let drain_for = Duration::from_secs(args.drain_secs);
    tokio::select! {
        result = server => result.map_err(|e| format!("gRPC server: {e}"))?,
        () = async move {
            let _ = bounded.wait_for(|d| *d).await;
            tokio::time::sleep(drain_for).await;
        } => log("WARN", "drain took too long: calls under way were cut"),
    }
    let _ = tokio::time::timeout(Duration::from_secs(1), http_task).await;
    log("INFO", "stopped");
    Ok(())
}

/// The engine the flags ask for, and how the log names its backend.
async fn engine(args: &Args, loaded: &config::Loaded) -> Result<(Engine, String), String> {
    let refused = |e: atomic_limiter::rls::ConfigError| format!("configuration refused: {e}");
    let Some(url) = &args.redis else {
        let engine = Engine::new(&loaded.domains, args.max_keys).map_err(refused)?;
        return Ok((engine, "local (this process)".into()));
    };
    #[cfg(feature = "redis")]
    {
        use atomic_limiter::redis::{FailurePolicy, RedisOptions, RedisStore};
        let policy = match args.on_store_error {
            OnStoreError::Allow => FailurePolicy::Open,
            OnStoreError::Unavailable | OnStoreError::Deny => FailurePolicy::Closed,
        };
        let options = RedisOptions::default()
            .with_deadline(Duration::from_millis(args.redis_deadline_ms.max(1)))
            .with_policy(policy);
        let store = RedisStore::connect(url, &options)
            .await
            .map_err(|e| format!("the store at {url}: {e}"))?;
        let leasing = match args.redis_mode {
            RedisMode::Gcra => None,
            RedisMode::Leased => Some(atomic_limiter::rls::Leasing {
                options: atomic_limiter::redis::LeaseOptions::default()
                    .with_ttl(Duration::from_millis(args.lease_ttl_ms.max(1)))
                    .with_max_lease(args.max_lease),
                max_keys: args.max_keys,
            }),
        };
        let remote = atomic_limiter::rls::Remote {
            store,
            prefix: args.redis_prefix.clone(),
            options,
            unavailable: matches!(args.on_store_error, OnStoreError::Unavailable),
            leasing,
        };
        let engine = Engine::with_remote(&loaded.domains, remote).map_err(refused)?;
        let how = match args.redis_mode {
            RedisMode::Gcra => "one script per request".to_owned(),
            RedisMode::Leased => format!(
                "leases of at most {} tokens for {} ms",
                args.max_lease, args.lease_ttl_ms
            ),
        };
        Ok((engine, format!("redis at {url}, {how}")))
    }
    #[cfg(not(feature = "redis"))]
    {
        let _ = (url, refused);
        Err("--redis needs a build with the `redis` feature: cargo build --release -p atomic-limiter-rls --features redis".into())
    }
}

/// The listener as tonic's stream of connections.
fn tokio_stream_of(listener: tokio::net::TcpListener) -> tonic::transport::server::TcpIncoming {
    tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true))
}

fn reload(engine: &Engine, paths: &[PathBuf]) {
    let refused = |e: &dyn std::fmt::Display| {
        metrics::counter!("rls_config_reloads_total", "result" => "refused").increment(1);
        log(
            "ERROR",
            &format!("reload refused, the configuration in force is kept: {e}"),
        );
    };
    let loaded = match config::load(paths) {
        Ok(loaded) => loaded,
        Err(e) => return refused(&e),
    };
    for w in &loaded.warnings {
        log("WARN", w);
    }
    match engine.reload(&loaded.domains) {
        Ok(r) => {
            metrics::counter!("rls_config_reloads_total", "result" => "ok").increment(1);
            log(
                "INFO",
                &format!(
                    "reloaded {} file(s): {} limit(s) added, {} changed (debts carried as time), {} removed, {} kept",
                    loaded.files.len(),
                    r.added,
                    r.changed,
                    r.removed,
                    r.kept
                ),
            );
        }
        Err(e) => refused(&e),
    }
}

//! The tower layer behind a real nginx on loopback: clients from distinct loopback source
//! addresses (127.0.0.2, .3, ...) each get their own quota through the proxy, and nothing a
//! client writes into a forwarding header buys it a fresh one. Skipped where nginx is not
//! installed (failing under CI, where `.ci/http.sh` installs it).

#![cfg(all(feature = "tower", feature = "axum"))]

#[path = "common/nginx.rs"]
mod nginx;

#[path = "common/axum_serve.rs"]
mod axum_serve;

use std::net::{IpAddr, SocketAddr};

use atomic_limiter::http::{ForwardedIp, IpKey, ProxyHeader, RateLimitLayer};
use atomic_limiter::{Gcra, Keyed, Quota};
use axum::Router;
use axum::routing::get;
use reqwest::StatusCode;
use reqwest::header::{HeaderMap, HeaderValue};

/// The quota of each client: three an hour, so that no refill lands during a test.
const QUOTA: u64 = 3;

/// An axum server keyed by the client behind the trusted proxy at 127.0.0.1, on a free port.
async fn server(header: ProxyHeader) -> SocketAddr {
    let trusted = ForwardedIp::new(["127.0.0.1/32".parse().unwrap()]).header(header);
    let table: Keyed<IpKey, Gcra> = Keyed::gcra(Quota::per_hour(QUOTA), 1000);
    let app = Router::new()
        .route("/", get(|| async { "hello\n" }))
        .layer(RateLimitLayer::new(trusted, table));
    axum_serve::serve(app).await
}

/// A client whose connections come from `source`.
fn client(source: &str) -> reqwest::Client {
    reqwest::Client::builder()
        .local_address(source.parse::<IpAddr>().unwrap())
        .no_proxy()
        .build()
        .unwrap()
}

async fn status(client: &reqwest::Client, proxy: SocketAddr, headers: HeaderMap) -> StatusCode {
    client
        .get(format!("http://{proxy}/"))
        .headers(headers)
        .send()
        .await
        .unwrap()
        .status()
}

/// The forged headers a client may try once its quota is spent.
fn forgeries() -> Vec<(&'static str, HeaderMap)> {
    let one = |name: &'static str, value: &'static [u8]| {
        let mut h = HeaderMap::new();
        h.append(name, HeaderValue::from_bytes(value).unwrap());
        h
    };
    let mut two_lines = one("x-forwarded-for", b"198.51.100.1");
    two_lines.append("x-forwarded-for", HeaderValue::from_static("198.51.100.2"));
    vec![
        (
            "a forged X-Forwarded-For",
            one("x-forwarded-for", b"198.51.100.7"),
        ),
        ("a forged Forwarded", one("forwarded", b"for=198.51.100.8")),
        (
            "the proxy's own address",
            one("x-forwarded-for", b"127.0.0.1"),
        ),
        ("two X-Forwarded-For lines", two_lines),
        ("a non-text byte", one("x-forwarded-for", b"\xff")),
        (
            "a non-text byte beside an address",
            one("x-forwarded-for", b"198.51.100.9, \xff"),
        ),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_nginx_each_client_has_its_own_quota_and_forgeries_gain_nothing() {
    let upstream = server(ProxyHeader::XForwardedFor).await;
    let xff = "proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;";
    let Some(nginx) = nginx::Nginx::start("behind_nginx", upstream, xff) else {
        return;
    };
    for source in ["127.0.0.2", "127.0.0.3", "127.0.0.4"] {
        let c = client(source);
        for i in 0..QUOTA {
            let s = status(&c, nginx.addr, HeaderMap::new()).await;
            assert_eq!(s, StatusCode::OK, "{source}, request {i}: its own quota");
        }
        assert_eq!(
            status(&c, nginx.addr, HeaderMap::new()).await,
            StatusCode::TOO_MANY_REQUESTS,
            "{source}: past its quota"
        );
        for (what, headers) in forgeries() {
            assert_eq!(
                status(&c, nginx.addr, headers).await,
                StatusCode::TOO_MANY_REQUESTS,
                "{source} sent {what} and got a fresh quota"
            );
        }
    }
    // The forgeries named no one else's quota either: a fresh client still has all of its own.
    let fresh = client("127.0.0.5");
    for _ in 0..QUOTA {
        assert_eq!(
            status(&fresh, nginx.addr, HeaderMap::new()).await,
            StatusCode::OK
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_nginx_that_appends_forwarded_the_forwarded_chain_decides() {
    let upstream = server(ProxyHeader::Forwarded).await;
    // nginx has no variable for RFC 7239: the lines below append this hop's element by hand,
    // and `X-Forwarded-For` beside it, as `ProxyHeader::Forwarded` asks of every trusted hop.
    let fwd = r#"set $fwd "for=$remote_addr";
            if ($http_forwarded) { set $fwd "$http_forwarded, for=$remote_addr"; }
            proxy_set_header Forwarded $fwd;
            proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;"#;
    let Some(nginx) = nginx::Nginx::start("behind_nginx_forwarded", upstream, fwd) else {
        return;
    };
    for source in ["127.0.0.2", "127.0.0.3"] {
        let c = client(source);
        for _ in 0..QUOTA {
            assert_eq!(
                status(&c, nginx.addr, HeaderMap::new()).await,
                StatusCode::OK
            );
        }
        for (what, headers) in forgeries() {
            assert_eq!(
                status(&c, nginx.addr, headers).await,
                StatusCode::TOO_MANY_REQUESTS,
                "{source} sent {what} and got a fresh quota"
            );
        }
    }
}

/// The operator's mistake: `Forwarded` chosen behind an nginx that appends only
/// `X-Forwarded-For`. A client's forged `Forwarded` ends in an address other than the one nginx
/// appended, so it never decides: every forged value lands on the proxy's own key, one quota
/// shared by every forger, instead of a fresh quota per value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_forwarded_behind_a_proxy_that_does_not_write_it_buys_no_quota_per_value() {
    let upstream = server(ProxyHeader::Forwarded).await;
    let xff = "proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;";
    let Some(nginx) = nginx::Nginx::start("forwarded_mistake", upstream, xff) else {
        return;
    };
    let mut admitted = 0;
    for source in ["127.0.0.2", "127.0.0.3"] {
        let c = client(source);
        for i in 0..20 {
            let mut h = HeaderMap::new();
            let value = format!("for=198.51.100.{i}");
            h.insert("forwarded", HeaderValue::from_str(&value).unwrap());
            admitted += u64::from(status(&c, nginx.addr, h).await == StatusCode::OK);
        }
    }
    // Without the cross-check: 40 forged values, 40 fresh keys, 40 admitted.
    assert_eq!(admitted, QUOTA, "forged values bought fresh quotas");
}

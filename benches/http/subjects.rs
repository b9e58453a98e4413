//! The subjects the HTTP layer is measured on, shared by `benches/http.rs` and
//! `examples/http_compare.rs`: one inner service, the same requests and keys, and the layer of each
//! crate around it.

use std::convert::Infallible;
use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::pin::pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use atomic_limiter::http::{Headers, IpKey, PeerIp, RateLimitLayer};
use atomic_limiter::keyed::{KeyEntry, KeyHasher, KeyedStore, LockFreeStore};
use atomic_limiter::{Clock, CoarseClock, Gcra, KeyQuotas, Keyed, Quota};
use axum::body::Body;
use axum::extract::ConnectInfo;
use http::{Request, Response};
use tower::{Layer, Service, service_fn};
use tower_governor::GovernorLayer;
use tower_governor::governor::GovernorConfigBuilder;
use tower_governor::key_extractor::PeerIpKeyExtractor;

/// Distinct client addresses the requests cycle through, by default.
pub const CLIENTS: u32 = 1024;

/// Request `i`: `GET /` from client address `i` (the caller keeps `i` below its client count), as
/// axum's `ConnectInfo` carries it.
pub fn request(i: u32) -> Request<Body> {
    let ip = IpAddr::V4(Ipv4Addr::from(0x0A00_0000 + i));
    let mut request = Request::get("/").body(Body::empty()).unwrap();
    request
        .extensions_mut()
        .insert(ConnectInfo(SocketAddr::new(ip, 40_000)));
    request
}

fn inner()
-> impl Service<Request<Body>, Response = Response<Body>, Error = Infallible, Future: Send>
+ Clone
+ Send {
    service_fn(|_: Request<Body>| async { Ok::<_, Infallible>(Response::new(Body::empty())) })
}

/// Calls `service` once and drives the response to completion (every future here is ready at
/// once), returning the status.
fn call<S, B>(service: &mut S, request: Request<Body>) -> u16
where
    S: Service<Request<Body>, Response = Response<B>>,
    S::Error: std::fmt::Debug,
{
    let mut cx = Context::from_waker(Waker::noop());
    assert!(service.poll_ready(&mut cx).is_ready());
    let mut future = pin!(service.call(request));
    match future.as_mut().poll(&mut cx) {
        Poll::Ready(response) => response.unwrap().status().as_u16(),
        Poll::Pending => unreachable!("every future here is ready at once"),
    }
}

/// One request through a subject: its status.
pub type Subject = Box<dyn FnMut(Request<Body>) -> u16>;

/// The path measured: admitted (a quota nobody reaches), admitted with the rate-limit fields on the
/// response, or refused (one token an hour per client, spent beforehand).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Path {
    Admitted,
    AdmittedWithHeaders,
    Refused,
}

impl Path {
    pub fn name(self) -> &'static str {
        match self {
            Path::Admitted => "admitted",
            Path::AdmittedWithHeaders => "admitted, with headers",
            Path::Refused => "refused",
        }
    }
}

/// The cases measured, by the benchmark and by `http_compare` alike: each path at [`CLIENTS`]
/// addresses, and the admitted path at 100 000.
pub const CASES: [(Path, u32); 4] = [
    (Path::Admitted, CLIENTS),
    (Path::AdmittedWithHeaders, CLIENTS),
    (Path::Refused, CLIENTS),
    (Path::Admitted, 100_000),
];

/// Our layer on `keyed`, writing the legacy fields (what tower_governor writes, so both write
/// alike), on allowed responses too when `headers`.
fn our_layer<C, M>(keyed: Keyed<IpKey, Gcra<C>, M>, headers: bool) -> Subject
where
    C: Clock + Clone + Send + Sync + 'static,
    M: KeyedStore<IpKey, KeyEntry<Gcra<C>>> + Send + Sync + 'static,
{
    let layer = RateLimitLayer::builder(PeerIp::new(), keyed)
        .headers(Headers::Legacy)
        .headers_on_allowed(headers)
        .build();
    let mut service = layer.layer(inner());
    Box::new(move |r| call(&mut service, r))
}

/// `[no layer, atomic-limiter, tower_governor, floor, atomic-limiter on the lock-free store,
/// atomic-limiter on the coarse clock]` on `path` for `clients` addresses, each already seen (and,
/// when refusing, already out of tokens), every status checked once. The floor is the least a
/// layer on `Keyed` can do: the peer address from the extensions, one keyed check, the inner
/// service or a bare 429, written by hand with no tower layer and no fields.
pub fn subjects(path: Path, clients: u32) -> [(&'static str, Subject); 6] {
    let (per, burst) = match path {
        Path::Refused => (Duration::from_secs(3600), 1),
        _ => (Duration::from_nanos(1), 1_000_000),
    };
    let headers = path == Path::AdmittedWithHeaders;
    let quota = Quota::with_period(per).with_burst(burst);
    let keyed: Keyed<IpKey, Gcra> = Keyed::gcra(quota, 2 * clients as usize);
    let mut ours = our_layer(keyed, headers);
    // The same layer on the keyed store whose lookups take no lock.
    let clock = atomic_limiter::QuantaClock::new();
    let lock_free = Keyed::with_store(
        LockFreeStore::with_hasher(KeyHasher::new()),
        2 * clients as usize,
        KeyQuotas::Every(quota),
        move |q| Gcra::with_clock(q, clock.clone()),
    );
    let mut free = our_layer(lock_free, headers);
    // The same layer on the clock that reads one word on admissions.
    let coarse = Keyed::gcra_with_clock(quota, 2 * clients as usize, CoarseClock::new());
    let mut coarse = our_layer(coarse, headers);

    let mut config = GovernorConfigBuilder::default();
    config
        .period(per)
        .burst_size(burst)
        .key_extractor(PeerIpKeyExtractor);
    // (Boxed alike: the two tower_governor services differ in type.)
    let mut theirs: Subject = if headers {
        let config = config.use_headers().finish().unwrap();
        let mut service = GovernorLayer::new(config).layer(inner());
        Box::new(move |r| call(&mut service, r))
    } else {
        let config = config.finish().unwrap();
        let mut service = GovernorLayer::new(config).layer(inner());
        Box::new(move |r| call(&mut service, r))
    };
    let mut bare = inner();
    let none: Subject = Box::new(move |r| call(&mut bare, r));

    let table: Keyed<IpKey, Gcra> = Keyed::gcra(quota, 2 * clients as usize);
    let mut behind = inner();
    let mut floor: Subject = Box::new(move |r: Request<Body>| {
        let Some(peer) = r.extensions().get::<ConnectInfo<SocketAddr>>() else {
            return 500;
        };
        if table.check_key(&IpKey::from(peer.0.ip())).is_allowed() {
            call(&mut behind, r)
        } else {
            429
        }
    });

    for i in 0..clients {
        let statuses = (
            ours(request(i)),
            theirs(request(i)),
            floor(request(i)),
            free(request(i)),
            coarse(request(i)),
        );
        assert_eq!(statuses, (200, 200, 200, 200, 200));
        if path == Path::Refused {
            let statuses = (
                ours(request(i)),
                theirs(request(i)),
                floor(request(i)),
                free(request(i)),
                coarse(request(i)),
            );
            assert_eq!(statuses, (429, 429, 429, 429, 429));
        }
    }
    [
        ("no layer", none),
        ("atomic-limiter", ours),
        ("tower_governor", theirs),
        ("floor", floor),
        ("atomic-limiter, lock-free store", free),
        ("atomic-limiter, coarse clock", coarse),
    ]
}

//! The layer driven with `oneshot`: statuses, every header mode, each key extractor; the fields
//! read back with a structured-field parser, as the draft requires of clients.

use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ::http::{HeaderMap, Request, Response, StatusCode};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use sfv::{BareItem, List, ListEntry, Parser};
use tower::{Service, ServiceExt, service_fn};

use super::*;
use crate::clock::ManualClock;
use crate::gcra::Gcra;
use crate::keyed::table::Keyed;
use crate::quota::Quota;

type Table<K> = Keyed<K, Gcra<ManualClock>>;

async fn hello(_: Request<()>) -> Result<Response<Full<Bytes>>, Infallible> {
    Ok(Response::new(Full::new(Bytes::from_static(b"hello"))))
}

fn from(peer: &str) -> Request<()> {
    let mut request = Request::get("/").body(()).unwrap();
    request
        .extensions_mut()
        .insert(peer.parse::<SocketAddr>().unwrap());
    request
}

fn with_header(mut request: Request<()>, name: &str, value: &str) -> Request<()> {
    request.headers_mut().append(
        name.parse::<::http::HeaderName>().unwrap(),
        value.parse().unwrap(),
    );
    request
}

/// One request through a fresh service of `layer`.
async fn send<X, Be>(layer: &RateLimitLayer<X, Be>, request: Request<()>) -> Response<Bytes>
where
    X: KeyExtractor,
    Be: Backend<X::Key>,
{
    let response = layer
        .layer(service_fn(hello))
        .oneshot(request)
        .await
        .unwrap();
    let (parts, body) = response.into_parts();
    let body = body.collect().await.unwrap().to_bytes();
    Response::from_parts(parts, body)
}

use tower_layer::Layer;

/// The parameters of the one member of a structured-field List, by name, as integers; and the
/// member's String.
fn sf_item(headers: &HeaderMap, name: &str) -> (String, Vec<(String, i64)>) {
    let mut list = sf_list(headers, name);
    assert_eq!(list.len(), 1, "{name}: {list:?}");
    list.remove(0)
}

/// Every member of a structured-field List: its String and its Integer parameters.
fn sf_list(headers: &HeaderMap, name: &str) -> Vec<(String, Vec<(String, i64)>)> {
    let text: Vec<&str> = headers
        .get_all(name)
        .iter()
        .map(|v| v.to_str().unwrap())
        .collect();
    let text = text.join(", ");
    let list: List = Parser::new(&text)
        .parse()
        .unwrap_or_else(|e| panic!("{name}: {text:?}: {e}"));
    list.iter()
        .map(|entry| {
            let ListEntry::Item(item) = entry else {
                panic!("{name}: an inner list")
            };
            let BareItem::String(id) = &item.bare_item else {
                panic!("{name}: not a String")
            };
            let params = item
                .params
                .iter()
                .map(|(k, v)| {
                    let BareItem::Integer(i) = v else {
                        panic!("{name}: {text}: {} is not an Integer", k.as_str())
                    };
                    (k.as_str().to_owned(), i64::from(*i))
                })
                .collect();
            (id.as_str().to_owned(), params)
        })
        .collect()
}

fn param(params: &[(String, i64)], name: &str) -> Option<i64> {
    params.iter().find(|(k, _)| k == name).map(|(_, v)| *v)
}

fn header_u64(headers: &HeaderMap, name: &str) -> u64 {
    headers
        .get(name)
        .unwrap_or_else(|| panic!("no {name}"))
        .to_str()
        .unwrap()
        .parse()
        .unwrap()
}

fn table(quota: Quota, max_keys: usize, clock: &ManualClock) -> Arc<Table<IpKey>> {
    Arc::new(Keyed::gcra_with_clock(quota, max_keys, clock.clone()))
}

fn ip(s: &str) -> IpKey {
    IpKey::from(s.parse::<IpAddr>().unwrap())
}

fn key_of<X: KeyExtractor>(x: &X, request: &Request<()>) -> Result<X::Key, KeyError> {
    x.extract(&RequestHead::of(request))
}

mod answers;
mod keys;
mod modes;
mod policies;
mod settle;

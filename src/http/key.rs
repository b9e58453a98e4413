//! Which client a request counts against: the key extractors, and the request's head they read.

use alloc::vec::Vec;
use core::fmt;
use core::hash::Hash;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};

use ::http::header::{FORWARDED, HeaderName};
use ::http::{Extensions, HeaderMap, Method, Request, Uri};
use ipnet::IpNet;

/// The parts of a request a key or a cost is taken from: everything but the body.
#[derive(Debug, Clone, Copy)]
pub struct RequestHead<'a> {
    method: &'a Method,
    uri: &'a Uri,
    headers: &'a HeaderMap,
    extensions: &'a Extensions,
}

impl<'a> RequestHead<'a> {
    /// The head of `request`.
    pub fn of<B>(request: &'a Request<B>) -> RequestHead<'a> {
        RequestHead {
            method: request.method(),
            uri: request.uri(),
            headers: request.headers(),
            extensions: request.extensions(),
        }
    }

    /// The request's method.
    pub fn method(&self) -> &'a Method {
        self.method
    }

    /// The request's URI.
    pub fn uri(&self) -> &'a Uri {
        self.uri
    }

    /// The request's headers.
    pub fn headers(&self) -> &'a HeaderMap {
        self.headers
    }

    /// The request's extensions (where servers put the peer address).
    pub fn extensions(&self) -> &'a Extensions {
        self.extensions
    }

    /// The peer's address: a [`SocketAddr`] extension, or with the `axum` feature axum's
    /// `ConnectInfo<SocketAddr>` (what `into_make_service_with_connect_info` puts there).
    #[inline]
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        // axum's first when it is on: each miss is a lookup in the extensions' map.
        #[cfg(feature = "axum")]
        if let Some(info) = self
            .extensions
            .get::<axum::extract::ConnectInfo<SocketAddr>>()
        {
            return Some(info.0);
        }
        self.extensions.get::<SocketAddr>().copied()
    }
}

/// Why no key could be taken from a request; the layer answers it without asking the limiter.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeyError {
    /// The server put no peer address in the request's extensions: a setup mistake (serve with
    /// connect info), answered `500`.
    NoPeerAddress,
    /// The header the key is read from is absent, answered `400`.
    MissingHeader(HeaderName),
    /// The header's value is longer than a key may be ([`HeaderKey::max_len`]), answered `400`.
    HeaderTooLong(HeaderName),
}

impl fmt::Display for KeyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeyError::NoPeerAddress => f.write_str(
                "the request carries no peer address (serve with connect info, or insert a SocketAddr extension)",
            ),
            KeyError::MissingHeader(name) => write!(f, "the request has no {name} header"),
            KeyError::HeaderTooLong(name) => {
                write!(f, "the request's {name} header is too long to be a key")
            }
        }
    }
}

impl core::error::Error for KeyError {}

/// Takes the key a request is counted against.
///
/// Implemented by [`PeerIp`], [`ForwardedIp`], [`HeaderKey`], [`GlobalKey`], and by any
/// `Fn(&RequestHead<'_>) -> Result<K, KeyError>`.
///
/// ```
/// use atomic_limiter::http::{KeyError, KeyExtractor, RequestHead};
///
/// // One key per tenant, from the first path segment.
/// let tenant = |head: &RequestHead<'_>| -> Result<String, KeyError> {
///     Ok(head.uri().path().split('/').nth(1).unwrap_or("").to_owned())
/// };
/// let request = http::Request::get("/acme/orders").body(()).unwrap();
/// assert_eq!(tenant.extract(&RequestHead::of(&request)).unwrap(), "acme");
/// ```
pub trait KeyExtractor: Send + Sync + 'static {
    /// The key: what the limiter's table is indexed by.
    type Key: Hash + Eq + Clone + Send + Sync + 'static;

    /// The key of the request with this head.
    ///
    /// # Errors
    ///
    /// [`KeyError`] when the request lacks what the key is taken from.
    fn extract(&self, head: &RequestHead<'_>) -> Result<Self::Key, KeyError>;
}

impl<F, K> KeyExtractor for F
where
    F: Fn(&RequestHead<'_>) -> Result<K, KeyError> + Send + Sync + 'static,
    K: Hash + Eq + Clone + Send + Sync + 'static,
{
    type Key = K;

    fn extract(&self, head: &RequestHead<'_>) -> Result<K, KeyError> {
        self(head)
    }
}

/// An IP address as a table key: 16 bytes, an IPv4 address held as its IPv4-mapped IPv6 form.
///
/// What [`PeerIp`] and [`ForwardedIp`] key by. An `IpAddr` is 17 bytes with an alignment of 1;
/// this is one `u128`, so a table entry with it packs in 32 bytes (no entry straddles two cache
/// lines), hashes in one write and compares in one (`docs/benchmarks.md` has what it saves).
///
/// ```
/// use atomic_limiter::http::IpKey;
/// use std::net::IpAddr;
///
/// let v4: IpAddr = "192.0.2.7".parse().unwrap();
/// let key = IpKey::from(v4);
/// assert_eq!(key.ip(), v4);
/// assert_eq!(key.to_string(), "192.0.2.7");
/// assert_eq!(IpKey::from("::ffff:192.0.2.7".parse::<IpAddr>().unwrap()), key);
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct IpKey(u128);

impl IpKey {
    /// The address: IPv4 for an IPv4-mapped one.
    pub fn ip(self) -> IpAddr {
        IpAddr::V6(Ipv6Addr::from(self.0)).to_canonical()
    }
}

impl From<IpAddr> for IpKey {
    #[inline]
    fn from(ip: IpAddr) -> IpKey {
        IpKey(match ip {
            IpAddr::V4(v4) => u128::from(v4.to_ipv6_mapped()),
            IpAddr::V6(v6) => u128::from(v6),
        })
    }
}

impl fmt::Display for IpKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.ip().fmt(f)
    }
}

impl fmt::Debug for IpKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "IpKey({})", self.ip())
    }
}

/// The peer's IP address, with IPv6 addresses grouped by a prefix (`/64` by default: one
/// subscriber usually holds a whole `/64`, and would otherwise get 2^64 keys).
///
/// An IPv4-mapped IPv6 address (`::ffff:192.0.2.7`, what a dual-stack socket reports) counts as
/// the IPv4 address it maps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerIp {
    v6_prefix: u8,
}

impl Default for PeerIp {
    fn default() -> PeerIp {
        PeerIp::new()
    }
}

impl PeerIp {
    /// The peer address, IPv6 grouped by `/64`.
    pub const fn new() -> PeerIp {
        PeerIp { v6_prefix: 64 }
    }

    /// Groups IPv6 addresses by their first `bits` bits (at most 128: one key per address).
    pub const fn ipv6_prefix(self, bits: u8) -> PeerIp {
        PeerIp {
            v6_prefix: if bits > 128 { 128 } else { bits },
        }
    }
}

impl KeyExtractor for PeerIp {
    type Key = IpKey;

    #[inline(always)]
    fn extract(&self, head: &RequestHead<'_>) -> Result<IpKey, KeyError> {
        head.peer_addr()
            .map(|addr| group(addr.ip(), self.v6_prefix))
            .ok_or(KeyError::NoPeerAddress)
    }
}

/// An address as a key: IPv4 whole (an IPv4-mapped IPv6 address is its IPv4 address), IPv6 with
/// the bits past `v6_prefix` cleared.
#[inline(always)]
fn group(ip: IpAddr, v6_prefix: u8) -> IpKey {
    match ip.to_canonical() {
        IpAddr::V6(v6) => {
            let mask = u128::MAX
                .checked_shl(128 - u32::from(v6_prefix))
                .unwrap_or(0);
            IpKey(u128::from(v6) & mask)
        }
        v4 => IpKey::from(v4),
    }
}

const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");

/// Which header a proxy chain is read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum ProxyHeader {
    /// `X-Forwarded-For: client, proxy1, proxy2`.
    #[default]
    XForwardedFor,
    /// RFC 7239 `Forwarded: for=client, for=proxy1` (the `for` parameter of each element).
    Forwarded,
}

/// The client's address behind trusted reverse proxies: the proxy chain walked from the right.
///
/// The peer must itself be a trusted proxy, else the header is ignored and the peer is the client
/// (anyone can write `X-Forwarded-For`). Each proxy appends the address it received from, so the
/// chain is read from its right end: trusted proxies are skipped, and the first address that is
/// not one is the client. Whatever the client wrote itself lies further left and is never read.
/// If the entry at that place is not an address (`unknown`, an obfuscated `_name`, garbage), the
/// key is the trusted proxy that reported it: never a value the client chose. If every entry is
/// trusted, the leftmost is the client.
///
/// ```
/// use atomic_limiter::http::{ForwardedIp, KeyExtractor, RequestHead};
/// use std::net::{IpAddr, SocketAddr};
///
/// let key = ForwardedIp::new(["10.0.0.0/8".parse().unwrap()]);
/// let mut request = http::Request::get("/")
///     // The client wrote "6.6.6.6"; the proxy at 10.0.0.2 appended the address it saw.
///     .header("x-forwarded-for", "6.6.6.6, 203.0.113.9, 10.0.0.2")
///     .body(())
///     .unwrap();
/// request.extensions_mut().insert("10.0.0.1:443".parse::<SocketAddr>().unwrap());
/// let client: IpAddr = "203.0.113.9".parse().unwrap();
/// assert_eq!(key.extract(&RequestHead::of(&request)).unwrap().ip(), client);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForwardedIp {
    trusted: Vec<IpNet>,
    header: ProxyHeader,
    v6_prefix: u8,
}

impl ForwardedIp {
    /// The client behind the proxies in `trusted` (their address ranges, as the `ipnet` crate's
    /// `IpNet`: `"10.0.0.0/8".parse()`), from `X-Forwarded-For`, IPv6 grouped by `/64`.
    pub fn new(trusted: impl IntoIterator<Item = IpNet>) -> ForwardedIp {
        ForwardedIp {
            trusted: trusted.into_iter().collect(),
            header: ProxyHeader::XForwardedFor,
            v6_prefix: 64,
        }
    }

    /// Reads the chain from `header` instead.
    pub fn header(mut self, header: ProxyHeader) -> ForwardedIp {
        self.header = header;
        self
    }

    /// Groups IPv6 addresses by their first `bits` bits, as [`PeerIp::ipv6_prefix`].
    pub fn ipv6_prefix(mut self, bits: u8) -> ForwardedIp {
        self.v6_prefix = bits.min(128);
        self
    }

    fn is_trusted(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        self.trusted.iter().any(|net| net.contains(&ip))
    }

    /// The client's address, from the peer and the chain's entries read right to left.
    fn client<'h>(
        &self,
        peer: IpAddr,
        entries_from_right: impl Iterator<Item = &'h str>,
    ) -> IpAddr {
        let mut client = peer;
        if !self.is_trusted(peer) {
            return client;
        }
        for entry in entries_from_right {
            match parse_node(entry, self.header) {
                Some(ip) if self.is_trusted(ip) => client = ip,
                Some(ip) => return ip,
                // Not an address: the trusted hop that wrote it is the best known client.
                None => return client,
            }
        }
        client
    }
}

impl KeyExtractor for ForwardedIp {
    type Key = IpKey;

    fn extract(&self, head: &RequestHead<'_>) -> Result<IpKey, KeyError> {
        let peer = head.peer_addr().ok_or(KeyError::NoPeerAddress)?.ip();
        let name = match self.header {
            ProxyHeader::XForwardedFor => X_FORWARDED_FOR,
            ProxyHeader::Forwarded => FORWARDED,
        };
        // Several field lines are one list, in order; a line that is not text ends the walk
        // there, as an entry that is not an address would.
        let lines = head.headers().get_all(name).iter().rev();
        let entries = lines
            .map(|line| line.to_str().unwrap_or("\u{0}"))
            .flat_map(|line| line.rsplit(','));
        Ok(group(self.client(peer, entries), self.v6_prefix))
    }
}

/// The address in one entry of a chain: `X-Forwarded-For`'s `192.0.2.7`, `2001:db8::1`,
/// `[2001:db8::1]:443` or `192.0.2.7:80`; `Forwarded`'s element `for=...;proto=https`, its value
/// a token or a quoted string. `None` for anything else.
fn parse_node(entry: &str, header: ProxyHeader) -> Option<IpAddr> {
    let node = match header {
        ProxyHeader::XForwardedFor => entry.trim(),
        ProxyHeader::Forwarded => {
            let value = entry.split(';').find_map(|pair| {
                let (name, value) = pair.trim().split_once('=')?;
                name.trim()
                    .eq_ignore_ascii_case("for")
                    .then_some(value.trim())
            })?;
            value
                .strip_prefix('"')
                .and_then(|v| v.strip_suffix('"'))
                .unwrap_or(value)
        }
    };
    if let Ok(ip) = node.parse::<IpAddr>() {
        return Some(ip);
    }
    if let Ok(addr) = node.parse::<SocketAddr>() {
        return Some(addr.ip());
    }
    // `[v6]` without a port.
    node.strip_prefix('[')
        .and_then(|n| n.strip_suffix(']'))
        .and_then(|n| n.parse::<Ipv6Addr>().ok())
        .map(IpAddr::V6)
}

/// The value of a header (an API key, a tenant id), byte for byte; a request without it, or with
/// a value longer than [`HeaderKey::max_len`] (256 bytes by default), is answered `400`. The
/// bound keeps a table of `max_keys` keys within `max_keys × max_len` bytes of keys, whatever
/// clients send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeaderKey {
    name: HeaderName,
    max_len: usize,
}

impl HeaderKey {
    /// Keys by the value of the header `name`.
    pub fn new(name: HeaderName) -> HeaderKey {
        HeaderKey { name, max_len: 256 }
    }

    /// The longest value taken as a key.
    pub fn max_len(mut self, bytes: usize) -> HeaderKey {
        self.max_len = bytes;
        self
    }
}

impl KeyExtractor for HeaderKey {
    /// A copy, so that a held key does not keep the request's buffer alive.
    type Key = Vec<u8>;

    fn extract(&self, head: &RequestHead<'_>) -> Result<Vec<u8>, KeyError> {
        let value = head
            .headers()
            .get(&self.name)
            .ok_or_else(|| KeyError::MissingHeader(self.name.clone()))?;
        if value.len() > self.max_len {
            return Err(KeyError::HeaderTooLong(self.name.clone()));
        }
        Ok(value.as_bytes().to_vec())
    }
}

/// One key for every request: a global limit on the service.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct GlobalKey;

impl KeyExtractor for GlobalKey {
    type Key = ();

    #[inline]
    fn extract(&self, _: &RequestHead<'_>) -> Result<(), KeyError> {
        Ok(())
    }
}

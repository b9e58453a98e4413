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

/// What a layer or a policy does with a request whose key is missing (the header it is read from
/// is absent: [`KeyError::MissingHeader`]).
///
/// A missing peer address is a setup mistake and an oversized header a client's, so those are
/// answered (`500`, `400`) whatever this says. A key shared by every request without one is the
/// extractor's to give ([`HeaderKey::shared_when_missing`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum MissingKey {
    /// Answered `400 Bad Request`, and nothing counted (the default).
    #[default]
    Reject,
    /// The limit is not applied to the request: a client without the header is held only by the
    /// other policies on the request (say, its address and the global one).
    Skip,
}

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
    /// Every trusted hop must append to `X-Forwarded-For` as well ([`ForwardedIp`] says why).
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
/// # Read the header your proxies append, and no other
///
/// The walk is sound only on a header that **every** trusted proxy appends to: nginx with
/// `proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;`, HAProxy with
/// `option forwardfor`, Envoy with `use_remote_address: true`, AWS's ALB as it is: all write
/// `X-Forwarded-For`, the default here. (Google Cloud's Application Load Balancer appends the
/// client's address and then its forwarding rule's: trust that address as well.) Choose
/// [`ProxyHeader::Forwarded`] only when every trusted hop appends to `Forwarded` (HAProxy's
/// `option forwarded`) and to `X-Forwarded-For` beside it. Where the two end in different
/// addresses, one was not written by the hop: neither decides, and the request counts against
/// the trusted peer's own key. So a proxy that writes only `X-Forwarded-For` never lets a
/// client's forged `Forwarded: for=...` buy a quota per forged value.
///
/// Entries are read one by one, as bytes: a non-text byte ends the walk at its own entry and
/// never hides the entries to its right. Trusted ranges in IPv4-mapped form
/// (`::ffff:127.0.0.1/128`) mean the IPv4 range they map.
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
    ///
    /// An IPv4-mapped range (`::ffff:127.0.0.1/128`, the form a dual-stack socket reports) means
    /// the IPv4 range it maps (`127.0.0.1/32`), as peers and entries are read.
    pub fn new(trusted: impl IntoIterator<Item = IpNet>) -> ForwardedIp {
        let mut ranges = Vec::new();
        for net in trusted {
            canonical_ranges(net, &mut ranges);
        }
        ForwardedIp {
            trusted: ranges,
            header: ProxyHeader::XForwardedFor,
            v6_prefix: 64,
        }
    }

    /// [`ForwardedIp::new`] from a list of ranges as a configuration file or the environment
    /// gives it: comma-separated, each an address or a CIDR range (`"10.0.0.0/8, 127.0.0.1"`);
    /// an empty list trusts no one (the key is then the peer address).
    ///
    /// ```
    /// use atomic_limiter::http::ForwardedIp;
    ///
    /// let behind_nginx = ForwardedIp::parse("127.0.0.1/32, ::1").unwrap();
    /// assert!(ForwardedIp::parse("10.0.0.0/33").is_err());
    /// # let _ = behind_nginx;
    /// ```
    ///
    /// # Errors
    ///
    /// [`InvalidRange`] naming the first entry that is neither an address nor a range.
    pub fn parse(list: &str) -> Result<ForwardedIp, InvalidRange> {
        let mut ranges = Vec::new();
        for entry in list.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            let net = match entry.parse::<IpNet>() {
                Ok(net) => net,
                Err(_) => entry
                    .parse::<IpAddr>()
                    .map(IpNet::from)
                    .map_err(|_| InvalidRange(entry.into()))?,
            };
            ranges.push(net);
        }
        Ok(ForwardedIp::new(ranges))
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
        // Several field lines are one list, in order. Each entry is read on its own, as bytes:
        // one that is not text ends the walk at itself, as an entry that is not an address
        // does, and never hides the entries to its right (the ones the trusted hops wrote).
        let entries = entries_from_right(head.headers(), &name);
        if self.header == ProxyHeader::Forwarded && self.is_trusted(peer) {
            // A trusted hop that appends to `Forwarded` and also to `X-Forwarded-For` writes the
            // same address last in both. When both end in addresses that differ, one of them is
            // not the hop's: neither may decide, and the hop is the key.
            let last = |name: &HeaderName, header| {
                let entry = entries_from_right(head.headers(), name).next()?;
                parse_node(entry, header)
            };
            let forwarded = last(&FORWARDED, ProxyHeader::Forwarded);
            let xff = last(&X_FORWARDED_FOR, ProxyHeader::XForwardedFor);
            if let (Some(f), Some(x)) = (forwarded, xff) {
                if f.to_canonical() != x.to_canonical() {
                    return Ok(group(peer, self.v6_prefix));
                }
            }
        }
        Ok(group(self.client(peer, entries), self.v6_prefix))
    }
}

/// The entries of every `name` line, the last line's last entry first, each read on its own.
fn entries_from_right<'h>(
    headers: &'h HeaderMap,
    name: &HeaderName,
) -> impl Iterator<Item = &'h str> {
    headers
        .get_all(name)
        .iter()
        .rev()
        .flat_map(|line| line.as_bytes().rsplit(|&b| b == b','))
        .map(|entry| core::str::from_utf8(entry).unwrap_or("\u{0}"))
}

/// An entry of a list of trusted ranges that is neither an address nor a CIDR range
/// ([`ForwardedIp::parse`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidRange(alloc::string::String);

impl fmt::Display for InvalidRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:?} is neither an IP address nor a CIDR range (such as 10.0.0.0/8)",
            self.0
        )
    }
}

impl core::error::Error for InvalidRange {}

/// `net` as the ranges that match canonical addresses (an IPv4-mapped IPv6 address is read as
/// its IPv4 address): an IPv6 range inside `::ffff:0:0/96` becomes the IPv4 range it maps, and a
/// wider one that holds all of it covers every IPv4 address too.
fn canonical_ranges(net: IpNet, out: &mut Vec<IpNet>) {
    use ipnet::Ipv4Net;
    let IpNet::V6(v6) = net else {
        out.push(net);
        return;
    };
    let mapped_prefix = Ipv6Addr::new(0, 0, 0, 0, 0, 0xffff, 0, 0);
    if v6.prefix_len() >= 96 {
        if let Some(v4) = v6.network().to_ipv4_mapped() {
            if let Ok(v4net) = Ipv4Net::new(v4, v6.prefix_len() - 96) {
                out.push(IpNet::V4(v4net));
                return;
            }
        }
    } else if v6.contains(&mapped_prefix) {
        if let Ok(all) = Ipv4Net::new(core::net::Ipv4Addr::UNSPECIFIED, 0) {
            out.push(IpNet::V4(all));
        }
    }
    out.push(net);
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
    shared: Option<Vec<u8>>,
}

impl HeaderKey {
    /// Keys by the value of the header `name`.
    ///
    /// `name` is an [`http::HeaderName`](::http::HeaderName) (`http` is the crate tower and axum
    /// speak): `HeaderName::from_static("x-api-key")`, lower case.
    pub fn new(name: HeaderName) -> HeaderKey {
        HeaderKey {
            name,
            max_len: 256,
            shared: None,
        }
    }

    /// Requests without the header count against the one key `shared` together, instead of
    /// being answered `400`. A client that sends `shared` as its header's value shares that
    /// key too, and gains nothing by it.
    ///
    /// ```
    /// use atomic_limiter::http::{HeaderKey, KeyExtractor, RequestHead};
    /// use http::HeaderName;
    ///
    /// let key = HeaderKey::new(HeaderName::from_static("x-api-key")).shared_when_missing(b"anonymous");
    /// let request = http::Request::get("/").body(()).unwrap();
    /// assert_eq!(key.extract(&RequestHead::of(&request)).unwrap(), b"anonymous");
    /// ```
    pub fn shared_when_missing(mut self, shared: &[u8]) -> HeaderKey {
        self.shared = Some(shared.to_vec());
        self
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
        let Some(value) = head.headers().get(&self.name) else {
            return match &self.shared {
                Some(shared) => Ok(shared.clone()),
                None => Err(KeyError::MissingHeader(self.name.clone())),
            };
        };
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

//! The key extractors: peer addresses, proxy chains, headers; key errors.

use super::*;

#[test]
fn the_peer_address_with_ipv6_grouped() {
    let peer = PeerIp::new();
    assert_eq!(key_of(&peer, &from("192.0.2.1:80")), Ok(ip("192.0.2.1")));
    assert_eq!(
        key_of(&peer, &from("[2001:db8:1:2:3:4:5:6]:80")),
        Ok(ip("2001:db8:1:2::"))
    );
    // Two addresses of one /64 are one client; of two /64s, two.
    assert_eq!(
        key_of(&peer, &from("[2001:db8:1:2::9]:80")),
        key_of(&peer, &from("[2001:db8:1:2:ffff::1]:80"))
    );
    assert_ne!(
        key_of(&peer, &from("[2001:db8:1:2::9]:80")),
        key_of(&peer, &from("[2001:db8:1:3::9]:80"))
    );
    assert_eq!(
        key_of(&peer, &from("[::ffff:192.0.2.1]:80")),
        Ok(ip("192.0.2.1"))
    );
    assert_eq!(
        key_of(&peer.ipv6_prefix(128), &from("[2001:db8::1]:80")),
        Ok(ip("2001:db8::1"))
    );
    assert_eq!(
        key_of(&peer.ipv6_prefix(0), &from("[2001:db8::1]:80")),
        Ok(ip("::"))
    );
    assert_eq!(
        key_of(&peer.ipv6_prefix(200), &from("[2001:db8::1]:80")),
        Ok(ip("2001:db8::1"))
    );
    let bare = Request::get("/").body(()).unwrap();
    assert_eq!(key_of(&peer, &bare), Err(KeyError::NoPeerAddress));
}

#[test]
fn the_proxy_chain_is_read_from_the_right_and_only_behind_a_trusted_peer() {
    let xff = ForwardedIp::new([
        "10.0.0.0/8".parse().unwrap(),
        "2001:db8:ff::/48".parse().unwrap(),
    ]);
    let via = |peer: &str, chain: &str| with_header(from(peer), "x-forwarded-for", chain);
    // The client's own entry, on the left, is never what decides.
    assert_eq!(
        key_of(&xff, &via("10.0.0.1:1", "6.6.6.6, 203.0.113.9, 10.0.0.2")),
        Ok(ip("203.0.113.9"))
    );
    // An untrusted peer: its header is ignored, the peer is the client.
    assert_eq!(
        key_of(&xff, &via("198.51.100.7:1", "203.0.113.9")),
        Ok(ip("198.51.100.7"))
    );
    // No header: the trusted peer itself.
    assert_eq!(key_of(&xff, &from("10.0.0.1:1")), Ok(ip("10.0.0.1")));
    // All trusted: the leftmost.
    assert_eq!(
        key_of(&xff, &via("10.0.0.1:1", "10.9.9.9, 10.0.0.2")),
        Ok(ip("10.9.9.9"))
    );
    // Not an address where the client should be: the trusted hop that wrote it.
    assert_eq!(
        key_of(&xff, &via("10.0.0.1:1", "6.6.6.6, garbage, 10.0.0.2")),
        Ok(ip("10.0.0.2"))
    );
    assert_eq!(
        key_of(&xff, &via("10.0.0.1:1", "unknown")),
        Ok(ip("10.0.0.1"))
    );
    // Ports and brackets; IPv6 grouped.
    assert_eq!(
        key_of(&xff, &via("[2001:db8:ff::1]:1", "[2001:db8:1:2::7]:443")),
        Ok(ip("2001:db8:1:2::"))
    );
    assert_eq!(
        key_of(&xff, &via("10.0.0.1:1", "203.0.113.9:5555")),
        Ok(ip("203.0.113.9"))
    );
    // Several field lines are one list, the last line last.
    let mut two = via("10.0.0.1:1", "6.6.6.6");
    two.headers_mut()
        .append("x-forwarded-for", "203.0.113.9, 10.0.0.3".parse().unwrap());
    assert_eq!(key_of(&xff, &two), Ok(ip("203.0.113.9")));

    let fwd = ForwardedIp::new(["10.0.0.0/8".parse().unwrap()]).header(ProxyHeader::Forwarded);
    let via = |chain: &str| with_header(from("10.0.0.1:1"), "forwarded", chain);
    assert_eq!(
        key_of(
            &fwd,
            &via("for=6.6.6.6, for=\"[2001:db8:cafe::17]:4711\";proto=https, For=10.0.0.2")
        ),
        Ok(ip("2001:db8:cafe::"))
    );
    assert_eq!(
        key_of(&fwd, &via("for=203.0.113.9;by=10.0.0.2;proto=http")),
        Ok(ip("203.0.113.9"))
    );
    // An obfuscated node, or an element with no `for`: the proxy that reported it.
    assert_eq!(
        key_of(&fwd, &via("for=_hidden, for=10.0.0.2")),
        Ok(ip("10.0.0.2"))
    );
    assert_eq!(key_of(&fwd, &via("proto=https")), Ok(ip("10.0.0.1")));
}

#[test]
fn a_header_global_and_custom_keys() {
    let api = HeaderKey::new(::http::HeaderName::from_static("x-api-key"));
    let request = with_header(from("192.0.2.1:1"), "x-api-key", "k-123");
    assert_eq!(key_of(&api, &request), Ok(b"k-123".to_vec()));
    assert_eq!(
        key_of(&api, &from("192.0.2.1:1")),
        Err(KeyError::MissingHeader(::http::HeaderName::from_static(
            "x-api-key"
        )))
    );
    // A value past the bound is no key: a flood of long values cannot swell the table.
    let long = with_header(from("192.0.2.1:1"), "x-api-key", &"k".repeat(257));
    assert_eq!(
        key_of(&api, &long),
        Err(KeyError::HeaderTooLong(::http::HeaderName::from_static(
            "x-api-key"
        )))
    );
    assert!(key_of(&api.clone().max_len(300), &long).is_ok());
    assert_eq!(key_of(&GlobalKey, &from("192.0.2.1:1")), Ok(()));
    let by_path =
        |head: &RequestHead<'_>| -> Result<String, KeyError> { Ok(head.uri().path().to_owned()) };
    assert_eq!(key_of(&by_path, &request), Ok("/".to_owned()));
}

#[tokio::test]
async fn key_errors_are_answered_without_a_decision() {
    let clock = ManualClock::new();
    let keyed: Arc<Table<Vec<u8>>> =
        Arc::new(Keyed::gcra_with_clock(Quota::per_second(1), 10, clock));
    let layer = RateLimitLayer::new(
        HeaderKey::new(::http::HeaderName::from_static("x-api-key")),
        keyed.clone(),
    );
    assert_eq!(
        send(&layer, from("192.0.2.1:1")).await.status(),
        StatusCode::BAD_REQUEST
    );
    let peer = RateLimitLayer::new(
        PeerIp::new(),
        table(Quota::per_second(1), 10, &ManualClock::new()),
    );
    let no_peer = Request::get("/").body(()).unwrap();
    assert_eq!(
        send(&peer, no_peer).await.status(),
        StatusCode::INTERNAL_SERVER_ERROR
    );
    assert!(keyed.is_empty());
    // Two API keys, two quotas; the same key from two addresses, one.
    let k = |peer: &str, key: &str| with_header(from(peer), "x-api-key", key);
    assert_eq!(
        send(&layer, k("192.0.2.1:1", "a")).await.status(),
        StatusCode::OK
    );
    assert_eq!(
        send(&layer, k("192.0.2.2:1", "b")).await.status(),
        StatusCode::OK
    );
    assert_eq!(
        send(&layer, k("192.0.2.3:1", "a")).await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
}

mod chains {
    //! Whatever a client writes into the proxy chain, the key is the address the first trusted
    //! proxy saw (or, where it hid it, that proxy): random client-written prefixes (addresses,
    //! trusted addresses, garbage, commas, quotes, `for=`), then the real client, then the trusted
    //! proxies that appended themselves.
    use super::*;
    use proptest::prelude::*;

    fn trusted() -> Vec<ipnet::IpNet> {
        ["10.0.0.0/8", "192.168.1.0/24", "2001:db8:ff::/48"]
            .iter()
            .map(|n| n.parse().unwrap())
            .collect()
    }

    fn junk() -> impl Strategy<Value = String> {
        prop_oneof![
            "[0-9]{1,3}\\.[0-9]{1,3}\\.[0-9]{1,3}\\.[0-9]{1,3}",
            Just("10.1.2.3".to_owned()),
            Just("192.168.1.9".to_owned()),
            Just("[2001:db8:ff::1]:80".to_owned()),
            Just("unknown".to_owned()),
            Just("for=6.6.6.6".to_owned()),
            Just("\"for=7.7.7.7, 8.8.8.8\"".to_owned()),
            "[ -~]{0,12}",
        ]
    }

    /// A client address outside every trusted range.
    fn client() -> impl Strategy<Value = IpAddr> {
        prop_oneof![
            (11u8..=191, any::<u8>(), any::<u8>(), 1u8..=254)
                .prop_map(|(a, b, c, d)| IpAddr::from([a, b, c, d])),
            any::<u64>().prop_map(|low| {
                IpAddr::from(std::net::Ipv6Addr::from(
                    (0x2001_0db8_0001_u128 << 80) | u128::from(low),
                ))
            }),
        ]
    }

    fn proxy() -> impl Strategy<Value = IpAddr> {
        prop_oneof![
            (any::<u8>(), any::<u8>(), 1u8..=254).prop_map(|(b, c, d)| IpAddr::from([10, b, c, d])),
            (1u8..=254).prop_map(|d| IpAddr::from([192, 168, 1, d])),
        ]
    }

    fn node(ip: IpAddr, header: ProxyHeader) -> String {
        match (header, ip) {
            (ProxyHeader::Forwarded, IpAddr::V6(v6)) => format!("for=\"[{v6}]:4711\""),
            (ProxyHeader::Forwarded, ip) => format!("for={ip};proto=https"),
            (_, ip) => ip.to_string(),
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn a_client_cannot_choose_its_key(
            written in proptest::collection::vec(junk(), 0..6),
            real in client(),
            hidden in any::<bool>(),
            hops in proptest::collection::vec(proxy(), 0..4),
            peer in proxy(),
            forwarded in any::<bool>(),
            split_lines in any::<bool>(),
        ) {
            let header = if forwarded { ProxyHeader::Forwarded } else { ProxyHeader::XForwardedFor };
            let name = if forwarded { "forwarded" } else { "x-forwarded-for" };
            let key = ForwardedIp::new(trusted()).header(header).ipv6_prefix(128);
            // What the client sent, then what each proxy appended (the first one the real client).
            let client_part = written.join(", ");
            // Or the first proxy hid the client (`unknown`): then the key is the proxy that wrote
            // that, the next hop to the right.
            let first = if hidden { "unknown".to_owned() } else { node(real, header) };
            let first = if hidden && forwarded { format!("for={first}") } else { first };
            let mut appended = vec![first];
            appended.extend(hops.iter().map(|h| node(*h, header)));
            let mut request = from(&SocketAddr::new(peer, 443).to_string());
            let proxies_part = appended.join(", ");
            let lines: Vec<String> = if split_lines {
                vec![client_part, proxies_part]
            } else if client_part.is_empty() {
                vec![proxies_part]
            } else {
                vec![format!("{client_part}, {proxies_part}")]
            };
            for line in lines {
                if let Ok(value) = ::http::HeaderValue::from_str(&line) {
                    request.headers_mut().append(name, value);
                } else {
                    return Ok(());
                }
            }
            let expected = if hidden { hops.first().copied().unwrap_or(peer) } else { real };
            prop_assert_eq!(key_of(&key, &request), Ok(IpKey::from(expected)));
        }
    }
}

use super::*;
use core::time::Duration;

fn limited(unit: Unit, requests_per_unit: u32) -> Option<RateLimit> {
    Some(RateLimit::Limited {
        unit,
        requests_per_unit,
        burst: None,
    })
}

fn node(
    key: &str,
    value: Option<&str>,
    rate_limit: Option<RateLimit>,
    children: Vec<Descriptor>,
) -> Descriptor {
    Descriptor {
        key: key.into(),
        value: value.map(Into::into),
        rate_limit,
        shadow_mode: false,
        descriptors: children,
    }
}

/// envoyproxy/ratelimit's example shape: per remote address; a special value; a nested path.
fn domains(per_minute: u32) -> Vec<DomainConfig> {
    vec![DomainConfig {
        domain: "edge".into(),
        descriptors: vec![
            node(
                "remote_address",
                None,
                limited(Unit::Minute, per_minute),
                vec![],
            ),
            node(
                "remote_address",
                Some("10.0.0.1"),
                Some(RateLimit::Unlimited),
                vec![],
            ),
            node(
                "path",
                Some("/login"),
                None,
                vec![node("user", None, limited(Unit::Hour, 2), vec![])],
            ),
            Descriptor {
                shadow_mode: true,
                ..node("tenant", None, limited(Unit::Second, 1), vec![])
            },
        ],
    }]
}

fn one<'a>(entries: &[(&'a str, &'a str)]) -> Item<'a> {
    Item {
        entries: entries
            .iter()
            .map(|&(key, value)| Entry { key, value })
            .collect(),
        hits: None,
    }
}

fn ask<'a>(items: Vec<Item<'a>>) -> Request<'a> {
    Request {
        domain: "edge",
        items,
        hits_addend: 0,
    }
}

#[test]
fn each_value_of_a_keyed_node_is_limited_apart() {
    let e = Engine::new(&domains(3), 100).unwrap();
    let a = ask(vec![one(&[("remote_address", "1.2.3.4")])]);
    let b = ask(vec![one(&[("remote_address", "5.6.7.8")])]);
    let over: Vec<bool> = (0..4).map(|_| e.decide(&a).unwrap().over_limit).collect();
    assert_eq!(over, [false, false, false, true]);
    let s = &e.decide(&b).unwrap().statuses[0];
    assert!(!s.over_limit);
    assert_eq!(s.remaining, 2);
    assert_eq!(s.limit.as_ref().unwrap().0, "edge.remote_address");
    // One of three spent: full again in one period, 20 s.
    assert!(s.until_reset > Duration::from_secs(19) && s.until_reset <= Duration::from_secs(20));
}

#[test]
fn a_value_node_wins_over_the_keyed_node_and_unlimited_never_limits() {
    let e = Engine::new(&domains(1), 100).unwrap();
    let r = ask(vec![one(&[("remote_address", "10.0.0.1")])]);
    for _ in 0..10 {
        let a = e.decide(&r).unwrap();
        assert!(!a.over_limit);
        assert_eq!(a.statuses[0].limit, None);
        assert_eq!(a.statuses[0].remaining, u32::MAX);
    }
}

#[test]
fn a_descriptor_matching_nothing_is_ok_without_a_limit() {
    let e = Engine::new(&domains(1), 100).unwrap();
    for entries in [
        &[("nope", "x")][..],
        &[("path", "/other")],
        // Ends at a node without a limit.
        &[("path", "/login")],
        // Runs past the tree.
        &[("remote_address", "1.1.1.1"), ("extra", "y")],
    ] {
        let a = e.decide(&ask(vec![one(entries)])).unwrap();
        assert!(!a.over_limit, "{entries:?}");
        assert_eq!(a.statuses[0].limit, None, "{entries:?}");
    }
    let other = Request {
        domain: "unknown",
        ..ask(vec![one(&[("remote_address", "1")])])
    };
    assert!(!e.decide(&other).unwrap().over_limit);
}

#[test]
fn a_refusal_by_one_descriptor_spends_nothing_from_the_others() {
    let e = Engine::new(&domains(5), 100).unwrap();
    let login = |user| one(&[("path", "/login"), ("user", user)]);
    let both = |user| ask(vec![one(&[("remote_address", "9.9.9.9")]), login(user)]);
    assert!(!e.decide(&both("ada")).unwrap().over_limit);
    assert!(!e.decide(&both("ada")).unwrap().over_limit);
    // ada's login limit (2 an hour) refuses: the address's token is given back.
    let a = e.decide(&both("ada")).unwrap();
    assert!(a.over_limit);
    assert!(!a.statuses[0].over_limit && a.statuses[1].over_limit);
    assert_eq!(
        a.statuses[0].remaining, 3,
        "the address keeps what the refusal took"
    );
    assert_eq!(
        a.statuses[1].limit.as_ref().unwrap().0,
        "edge.path_/login.user"
    );
    // So the address has exactly 3 left.
    let addr = ask(vec![one(&[("remote_address", "9.9.9.9")])]);
    let over: Vec<bool> = (0..4)
        .map(|_| e.decide(&addr).unwrap().over_limit)
        .collect();
    assert_eq!(over, [false, false, false, true]);
}

#[test]
fn hits_come_from_the_descriptor_then_the_request_and_zero_is_one() {
    let e = Engine::new(&domains(10), 100).unwrap();
    let mut r = ask(vec![one(&[("remote_address", "2.2.2.2")])]);
    r.hits_addend = 4;
    assert_eq!(e.decide(&r).unwrap().statuses[0].remaining, 6);
    r.items[0].hits = Some(5);
    assert_eq!(e.decide(&r).unwrap().statuses[0].remaining, 1);
    r.items[0].hits = Some(0);
    assert_eq!(e.decide(&r).unwrap().statuses[0].remaining, 0);
    // More than the burst, or than any u32: over the limit, never an error.
    r.items[0].hits = Some(u64::MAX);
    let a = e.decide(&r).unwrap();
    assert!(a.over_limit);
    assert_eq!(a.statuses[0].remaining, 0);
}

#[test]
fn shadow_mode_answers_ok_and_says_it_would_refuse() {
    let e = Engine::new(&domains(10), 100).unwrap();
    let r = ask(vec![one(&[("tenant", "t")])]);
    assert!(!e.decide(&r).unwrap().over_limit);
    let a = e.decide(&r).unwrap();
    assert!(!a.over_limit);
    assert!(a.statuses[0].shadowed && !a.statuses[0].over_limit);
}

#[test]
fn bad_requests_are_errors() {
    let e = Engine::new(&domains(10), 100).unwrap();
    let big = "x".repeat(1 << 20);
    let cases = [
        Request {
            domain: "",
            ..ask(vec![one(&[("a", "b")])])
        },
        ask(vec![]),
        ask(vec![one(&[])]),
        ask(vec![one(&[("", "b")])]),
        ask(vec![one(&[("remote_address", big.as_str())])]),
        ask((0..=MAX_DESCRIPTORS).map(|_| one(&[("a", "b")])).collect()),
    ];
    for r in &cases {
        assert!(matches!(e.decide(r), Err(RequestError::Invalid(_))));
    }
}

#[test]
fn a_reload_keeps_state_carries_a_changed_limit_and_drops_a_removed_one() {
    let e = Engine::new(&domains(3), 100).unwrap();
    let r = ask(vec![one(&[("remote_address", "3.3.3.3")])]);
    for _ in 0..2 {
        assert!(!e.decide(&r).unwrap().over_limit);
    }
    // The same file again: nothing is reset.
    let same = e.reload(&domains(3)).unwrap();
    assert_eq!(
        (same.added, same.changed, same.removed, same.kept),
        (0, 0, 0, 3)
    );
    assert_eq!(e.decide(&r).unwrap().statuses[0].remaining, 0);
    assert!(e.decide(&r).unwrap().over_limit);
    // Twice the limit: the debt is kept as time (three requests of 20 s, 60 s ahead), which is
    // the whole of the new window too: still over, now on the new limit.
    let bigger = e.reload(&domains(6)).unwrap();
    assert_eq!(bigger.changed, 1);
    let a = e.decide(&r).unwrap();
    assert!(a.over_limit);
    let (_, limit) = a.statuses[0].limit.clone().unwrap();
    assert_eq!(limit, limited(Unit::Minute, 6).unwrap());
    // Another key, 2 of 3 spent (40 s ahead): at 6 a minute that is 4 of 6 spent, 2 left.
    let s = ask(vec![one(&[("remote_address", "3.3.3.4")])]);
    e.reload(&domains(3)).unwrap();
    for _ in 0..2 {
        assert!(!e.decide(&s).unwrap().over_limit);
    }
    e.reload(&domains(6)).unwrap();
    assert_eq!(
        e.decide(&s).unwrap().statuses[0].remaining,
        1,
        "2 left before this one"
    );
    // Removed: no longer limited.
    let mut fewer = domains(6);
    fewer[0].descriptors.remove(0);
    assert_eq!(e.reload(&fewer).unwrap().removed, 1);
    assert_eq!(e.decide(&r).unwrap().statuses[0].limit, None);
}

#[test]
fn a_bad_configuration_is_refused_and_the_old_one_kept() {
    let e = Engine::new(&domains(1), 100).unwrap();
    let mut bad = domains(1);
    bad[0]
        .descriptors
        .push(node("remote_address", None, limited(Unit::Hour, 5), vec![]));
    assert!(matches!(
        e.reload(&bad),
        Err(ConfigError::DuplicateDescriptor { .. })
    ));
    let mut zero = domains(1);
    zero[0].descriptors[0].rate_limit = limited(Unit::Second, 0);
    assert!(matches!(e.reload(&zero), Err(ConfigError::BadLimit { .. })));
    let twice = [domains(1), domains(1)].concat();
    assert!(matches!(
        e.reload(&twice),
        Err(ConfigError::DuplicateDomain { .. })
    ));
    assert!(Unit::from_name("month").is_err());
    assert_eq!(Unit::from_name("Week").unwrap(), Unit::Week);
    let r = ask(vec![one(&[("remote_address", "4")])]);
    assert!(!e.decide(&r).unwrap().over_limit);
    assert!(e.decide(&r).unwrap().over_limit, "still one a minute");
}

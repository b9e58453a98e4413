//! Keyed limiters on the lock-free store: every test `tests/keyed.rs` runs on the default store,
//! here with checks that run beside the changes that retire their entries.

use atomic_limiter::keyed::LockFreeStore;

/// The store these tests run on.
type Store<K, V> = LockFreeStore<K, V, KeyHasher>;

fn store<K: std::hash::Hash + Eq + Clone, V>() -> Store<K, V> {
    LockFreeStore::with_hasher(KeyHasher::new())
}

include!("keyed_body/mod.rs");

/// What to do next in a run on two tables, one checked through a held [`Pinned`] handle.
#[derive(Debug, Clone)]
enum PinnedOp {
    /// Check `n` tokens of a key, then advance the clock.
    Check(u8, u32, u64),
    /// Change every key's quota (the table then decides on each entry's own limiter).
    SetQuota(bool),
    /// Change one key's quota through the quota function.
    Requota(u8),
}

fn pinned_ops() -> impl Strategy<Value = Vec<PinnedOp>> {
    // Eight keys through a cap of five (new keys evict full buckets, or are refused), 0 to 5 tokens
    // against a burst of 4, up to 0.4 s between checks at 10/s; runs long enough that the handle
    // renews its pin several times (every 64 checks).
    let op = prop_oneof![
        20 => (0u8..8, 0u32..6, 0u64..400_000_000).prop_map(|(k, n, a)| PinnedOp::Check(k, n, a)),
        1 => any::<bool>().prop_map(PinnedOp::SetQuota),
        1 => (0u8..8).prop_map(PinnedOp::Requota),
    ];
    proptest::collection::vec(op, 1..400)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    /// A handle held across a whole run answers every check exactly as `check_key_n` does on a
    /// twin table given the same run, figures included: through evictions, refusals at the cap,
    /// quota changes for all keys and for one, and the handle's renewals.
    #[test]
    fn a_pinned_handle_answers_what_check_key_answers(ops in pinned_ops()) {
        use atomic_limiter::Carry;
        let small = Quota::per_second(10).with_burst(4);
        let big = Quota::per_second(10).with_burst(5);
        // Shared quotas (set_quota), and a quota function (requota: each key's quota flips).
        for by_fn in [false, true] {
            let clock = ManualClock::new();
            let flipped: Arc<[std::sync::atomic::AtomicBool; 8]> = Arc::new(Default::default());
            let make = |clock: &ManualClock| -> Table<u8, Gcra<ManualClock>> {
                let c = clock.clone();
                if by_fn {
                    let f = flipped.clone();
                    fn_table(5, move |k: &u8| {
                        if f[usize::from(*k)].load(Relaxed) { big } else { small }
                    }, move |q| Gcra::with_clock(q, c.clone()))
                } else {
                    gcra_table(small, 5, c)
                }
            };
            let (pinned_table, plain) = (make(&clock), make(&clock));
            let mut pinned = pinned_table.pinned();
            for (i, op) in ops.iter().enumerate() {
                match *op {
                    PinnedOp::Check(key, n, advance) => {
                        let got = figures(pinned.check_key_n(&key, n));
                        let want = figures(plain.check_key_n(&key, n));
                        prop_assert_eq!(got, want, "op {} (key {}, n {}, by_fn {})", i, key, n, by_fn);
                        if n == 1 {
                            let got = pinned.check_key(&key);
                            let want = plain.check_key(&key);
                            prop_assert_eq!(figures(Ok(got)), figures(Ok(want)), "op {} again", i);
                        }
                        clock.advance(Duration::from_nanos(advance));
                    }
                    PinnedOp::SetQuota(to_big) => {
                        let q = if to_big { big } else { small };
                        prop_assert_eq!(
                            pinned_table.set_quota(q, Carry::Debt),
                            plain.set_quota(q, Carry::Debt)
                        );
                    }
                    PinnedOp::Requota(key) => {
                        let f = &flipped[usize::from(key)];
                        f.store(!f.load(Relaxed), Relaxed);
                        prop_assert_eq!(
                            pinned_table.requota(&key, Carry::Debt),
                            plain.requota(&key, Carry::Debt)
                        );
                    }
                }
            }
            prop_assert_eq!(pinned_table.len(), plain.len());
        }
    }
}

/// `set_quota_racing_checks_loses_no_admission`, each of the two checking threads through a
/// handle of its own held for all its checks.
#[test]
fn pinned_handles_racing_set_quota_lose_no_admission() {
    set_quota_racing(|table, flip| {
        let checker = || {
            let mut pinned = table.pinned();
            move |i: u32| pinned.check_key(&(i % 4)).is_allowed()
        };
        admitted_while_flipping(400, checker, flip)
    });
}

// A caller's key type that panics in `Clone` or `Hash`: the table stays whole.

/// A key whose `Clone` panics for one value and whose `Hash` panics for another, as a caller's
/// key type might on data it did not expect.
#[derive(PartialEq, Eq, Debug)]
struct Touchy(u64);

const CLONE_PANICS: u64 = u64::MAX;
const HASH_PANICS: u64 = u64::MAX - 1;

impl Clone for Touchy {
    fn clone(&self) -> Touchy {
        assert!(self.0 != CLONE_PANICS, "the key's Clone panicked");
        Touchy(self.0)
    }
}

impl std::hash::Hash for Touchy {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        assert!(self.0 != HASH_PANICS, "the key's Hash panicked");
        self.0.hash(state);
    }
}

/// Checks of keys whose `Clone` or `Hash` panics never cost the table a place: after ten such
/// panics, a table of two keys still takes two keys, and refuses a third as full.
#[test]
fn a_key_that_panics_in_clone_or_hash_gives_its_place_back() {
    let keyed = gcra_table::<Touchy>(Quota::per_second(1), 2, ManualClock::new());
    for poisoned in [CLONE_PANICS, HASH_PANICS] {
        for _ in 0..5 {
            let checked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                keyed.check_key(&Touchy(poisoned))
            }));
            let refused = checked.as_ref().is_ok_and(Decision::is_table_full);
            assert!(
                checked.is_err(),
                "key {poisoned} did not panic (refused as the table full: {refused}, so a place was lost)"
            );
        }
    }
    for key in 0..2 {
        let d = keyed.check_key(&Touchy(key));
        assert!(d.is_allowed() && !d.is_table_full(), "key {key}: {d:?}");
    }
    assert!(keyed.check_key(&Touchy(2)).is_table_full());
}

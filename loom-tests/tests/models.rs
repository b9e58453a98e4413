//! Loom model checks of every CAS protocol in atomic-limiter.
//!
//! Run with `bash .ci/loom.sh` (see `loom-tests/README.md`). Every model is written once, generic
//! over the check it calls, and run twice, to show the models have teeth: with the real check,
//! which must hold in every interleaving, and with a deliberately broken twin (load then store
//! instead of CAS), which loom must catch (`#[should_panic]`).
#![cfg(atomic_limiter_loom)]

use atomic_limiter::{Clock, Decision, Gcra, ManualClock, Quota, RateLimiter, TokenBucket};
use loom::sync::Arc;
use loom::thread;
use std::time::Duration;

/// 10 per second: one token every 100 ms.
const PERIOD: Duration = Duration::from_millis(100);

fn quota(burst: u32) -> Quota {
    Quota::per_second(10).with_burst(burst)
}

/// The two lock-free limiters, each with its real and its broken check.
trait Subject: RateLimiter + Send + Sync + 'static {
    fn make(quota: Quota, clock: ManualClock) -> Self;
    fn broken_check_n(&self, n: u32) -> Decision;
    fn state(&self) -> u64;
}

impl Subject for Gcra<ManualClock> {
    fn make(quota: Quota, clock: ManualClock) -> Self {
        Gcra::with_clock(quota, clock)
    }
    fn broken_check_n(&self, n: u32) -> Decision {
        self.loom_broken_check_n(n)
    }
    fn state(&self) -> u64 {
        self.loom_state()
    }
}

impl Subject for TokenBucket<ManualClock> {
    fn make(quota: Quota, clock: ManualClock) -> Self {
        TokenBucket::with_clock(quota, clock)
    }
    fn broken_check_n(&self, n: u32) -> Decision {
        self.loom_broken_check_n(n)
    }
    fn state(&self) -> u64 {
        self.loom_state()
    }
}

type Check<L> = fn(&L, u32) -> Decision;

fn real<L: Subject>(l: &L, n: u32) -> Decision {
    l.check_n(n).unwrap()
}

fn broken<L: Subject>(l: &L, n: u32) -> Decision {
    l.broken_check_n(n)
}

/// Models 1 and 2: burst 2, frozen clock, three threads each asking for one token. Every
/// interleaving admits exactly 2, and the two admissions report 1 and 0 remaining.
fn frozen_clock_admits_exactly_the_burst<L: Subject>(check: Check<L>) {
    loom::model(move || {
        let limiter = Arc::new(L::make(quota(2), ManualClock::new()));
        let handles: Vec<_> = (0..3)
            .map(|_| {
                let limiter = limiter.clone();
                thread::spawn(move || {
                    let d = check(&limiter, 1);
                    d.is_allowed().then(|| d.remaining())
                })
            })
            .collect();
        let mut remaining: Vec<u64> = handles
            .into_iter()
            .filter_map(|h| h.join().unwrap())
            .collect();
        remaining.sort_unstable();
        assert_eq!(remaining, [0, 1], "admissions and their remaining counts");
        assert_eq!(limiter.check_n(0).unwrap().remaining(), 0);
    });
}

/// Model 3: mixed sizes while another thread advances the clock by one period. Burst 2, so in any
/// interleaving at most 2 + 1 tokens are admitted, and tokens are conserved: what is admitted plus
/// what is left at the end never exceeds that either.
fn concurrent_advance_never_exceeds_the_quota<L: Subject>(check: Check<L>) {
    loom::model(move || {
        let clock = ManualClock::new();
        let limiter = Arc::new(L::make(quota(2), clock.clone()));
        let big = {
            let limiter = limiter.clone();
            thread::spawn(move || {
                let d = check(&limiter, 2);
                if d.is_allowed() { 2 } else { 0 }
            })
        };
        let small = {
            let limiter = limiter.clone();
            thread::spawn(move || (0..2).filter(|_| check(&limiter, 1).is_allowed()).count() as u64)
        };
        let ticker = thread::spawn(move || clock.advance(PERIOD));
        let admitted = big.join().unwrap() + small.join().unwrap();
        ticker.join().unwrap();
        assert!(admitted <= 3, "admitted {admitted} > burst 2 + 1 period");
        let left = limiter.check_n(0).unwrap().remaining();
        assert!(
            admitted + left <= 3,
            "admitted {admitted} + left {left} > 3"
        );
    });
}

/// Model 3, second half: a denied call changes nothing. A drained limiter on a frozen clock; two
/// threads are denied while a third watches the state word: it never moves.
fn denials_do_not_write<L: Subject>() {
    loom::model(|| {
        let limiter = Arc::new(L::make(quota(2), ManualClock::new()));
        assert!(limiter.check_n(2).unwrap().is_allowed());
        let before = limiter.state();
        let deniers: Vec<_> = [1, 2]
            .into_iter()
            .map(|n| {
                let limiter = limiter.clone();
                thread::spawn(move || assert!(limiter.check_n(n).unwrap().is_denied()))
            })
            .collect();
        let watcher = {
            let limiter = limiter.clone();
            thread::spawn(move || {
                assert_eq!(limiter.state(), before);
                assert_eq!(limiter.state(), before);
            })
        };
        for h in deniers {
            h.join().unwrap();
        }
        watcher.join().unwrap();
        assert_eq!(limiter.state(), before);
    });
}

/// Model 4: the clock steps back between two readers. Burst 1, drained at the start; one thread
/// moves the clock forward a period then back two, two threads check. At most one token can have
/// returned (the clock never showed more than one period later), so at most one is admitted.
fn clock_stepping_back_admits_nothing_extra<L: Subject>() {
    loom::model(|| {
        let clock = ManualClock::starting_at(1_000_000_000);
        let limiter = Arc::new(L::make(quota(1), clock.clone()));
        assert!(limiter.check().is_allowed());
        let mover = {
            let clock = clock.clone();
            thread::spawn(move || {
                clock.advance(PERIOD);
                clock.rewind(PERIOD * 2);
            })
        };
        let checkers: Vec<_> = (0..2)
            .map(|_| {
                let limiter = limiter.clone();
                thread::spawn(move || limiter.check().is_allowed() as u64)
            })
            .collect();
        mover.join().unwrap();
        let admitted: u64 = checkers.into_iter().map(|h| h.join().unwrap()).sum();
        assert!(
            admitted <= 1,
            "admitted {admitted} with at most one period shown"
        );
        // Back at the start minus a period: nothing more until the clock passes the TAT again.
        assert!(clock.now() < 1_000_000_000);
        assert!(limiter.check().is_denied());
    });
}

/// Models 1 to 4 for one limiter type, with the broken twins of 1 (2 for the token bucket) and 3.
macro_rules! models_for {
    ($module:ident, $limiter:ty) => {
        mod $module {
            use super::*;
            type L = $limiter;

            #[test]
            fn model_1_2_frozen_clock_admits_exactly_the_burst() {
                frozen_clock_admits_exactly_the_burst::<L>(real);
            }

            #[test]
            #[should_panic(expected = "admissions and their remaining counts")]
            fn model_1_2_broken_twin_is_caught() {
                frozen_clock_admits_exactly_the_burst::<L>(broken);
            }

            #[test]
            fn model_3_concurrent_advance_never_exceeds_the_quota() {
                concurrent_advance_never_exceeds_the_quota::<L>(real);
            }

            #[test]
            #[should_panic(expected = "admitted")]
            fn model_3_broken_twin_is_caught() {
                concurrent_advance_never_exceeds_the_quota::<L>(broken);
            }

            #[test]
            fn model_3_denials_do_not_write() {
                denials_do_not_write::<L>();
            }

            #[test]
            fn model_4_clock_stepping_back_admits_nothing_extra() {
                clock_stepping_back_admits_nothing_extra::<L>();
            }
        }
    };
}

models_for!(gcra, Gcra<ManualClock>);
models_for!(token_bucket, TokenBucket<ManualClock>);

/// Model 5: stealing in the sharded limiter. Burst 2 over two shards (one token each); three
/// threads all start on shard 0, so two of them must steal from shard 1. Exactly 2 are admitted in
/// every interleaving. The broken twin takes from the victim shard with a load and a store.
mod sharded {
    use super::*;
    use atomic_limiter::Sharded;

    fn stealing_admits_exactly_the_burst(broken: bool) {
        loom::model(move || {
            let s = Arc::new(Sharded::gcra_with_clock(quota(2), 2, ManualClock::new()));
            assert_eq!(s.shard_count(), 2);
            let handles: Vec<_> = (0..3)
                .map(|_| {
                    let s = s.clone();
                    thread::spawn(move || {
                        let d = if broken {
                            s.loom_check_with(0, 1, |l, n| l.loom_broken_check_n(n))
                        } else {
                            s.check_n_from(0, 1).unwrap()
                        };
                        u32::from(d.is_allowed())
                    })
                })
                .collect();
            let admitted: u32 = handles.into_iter().map(|h| h.join().unwrap()).sum();
            assert_eq!(admitted, 2, "admitted with stealing");
        });
    }

    #[test]
    fn model_5_stealing_admits_exactly_the_burst() {
        stealing_admits_exactly_the_burst(false);
    }

    #[test]
    #[should_panic(expected = "admitted with stealing")]
    fn model_5_broken_twin_is_caught() {
        stealing_admits_exactly_the_burst(true);
    }

    /// Model 10: a gather racing a plain check. Burst 2 over two shards (one token each); one
    /// thread asks for 2 (more than a share: it gathers from both), another for 1 from shard 1.
    /// In every interleaving the tokens taken plus those left add up to 2: a gather that loses the
    /// race gives back what it took. The broken twin keeps what it took.
    fn gather_gives_back_on_failure(broken: bool) {
        loom::model(move || {
            let s = Arc::new(Sharded::gcra_with_clock(quota(2), 2, ManualClock::new()));
            let gatherer = {
                let s = s.clone();
                thread::spawn(move || {
                    let d = if broken {
                        s.loom_gather_keeping_what_it_took(0, 2)
                    } else {
                        Some(s.check_n_from(0, 2).unwrap())
                    };
                    2 * u32::from(d.is_some_and(|d| d.is_allowed()))
                })
            };
            let single = {
                let s = s.clone();
                thread::spawn(move || u32::from(s.check_n_from(1, 1).unwrap().is_allowed()))
            };
            let taken = gatherer.join().unwrap() + single.join().unwrap();
            let left = (0..2)
                .filter(|_| s.check_n_from(0, 1).unwrap().is_allowed())
                .count() as u32;
            assert_eq!(taken + left, 2, "a failed gather gives back what it took");
        });
    }

    #[test]
    fn model_10_a_failed_gather_gives_back() {
        gather_gives_back_on_failure(false);
    }

    #[test]
    #[should_panic(expected = "a failed gather gives back what it took")]
    fn model_10_broken_twin_is_caught() {
        gather_gives_back_on_failure(true);
    }
}

/// Model 6: the keyed limiter's insert-or-get race. Two threads make the first check on the same
/// key at once, burst 1: one bucket must be created, so exactly one is admitted. dashmap's locks
/// are invisible to loom, so the model runs `Keyed` on a map loom can see: a loom mutex around a
/// `HashMap`. Its broken twin looks the key up, unlocks, and inserts afterwards: two threads can
/// both insert, each with a fresh bucket.
mod keyed {
    use super::*;
    use atomic_limiter::{KeyEntry, KeyQuotas, Keyed, KeyedStore};
    use loom::sync::Mutex;
    use std::collections::HashMap;

    struct LoomMap<V> {
        map: Mutex<HashMap<u32, Arc<V>>>,
        broken: bool,
    }

    impl<V> KeyedStore<u32, V> for LoomMap<V> {
        fn with_existing<Q, R>(&self, key: &Q, f: impl FnOnce(&V) -> R) -> Option<R>
        where
            u32: std::borrow::Borrow<Q>,
            Q: std::hash::Hash + Eq + ?Sized,
        {
            let v = self.map.lock().unwrap().get(key).cloned();
            v.map(|v| f(&v))
        }

        fn with_inserted<R>(
            &self,
            key: u32,
            make: impl FnOnce() -> V,
            f: impl FnOnce(&V) -> R,
        ) -> (R, bool) {
            if self.broken {
                let found = self.map.lock().unwrap().get(&key).cloned();
                if let Some(v) = found {
                    return (f(&v), false);
                }
                let v = Arc::new(make());
                self.map.lock().unwrap().insert(key, v.clone());
                return (f(&v), true);
            }
            let mut map = self.map.lock().unwrap();
            let (v, inserted) = match map.get(&key) {
                Some(v) => (v.clone(), false),
                None => {
                    let v = Arc::new(make());
                    map.insert(key, v.clone());
                    (v, true)
                }
            };
            drop(map);
            (f(&v), inserted)
        }

        fn remove_where(&self, mut remove: impl FnMut(&u32, &V) -> bool) {
            self.map.lock().unwrap().retain(|k, v| !remove(k, v));
        }

        fn remove_if(&self, key: &u32, remove: impl FnOnce(&V) -> bool) -> bool {
            let mut map = self.map.lock().unwrap();
            match map.get(key) {
                Some(v) if remove(v) => map.remove(key).is_some(),
                _ => false,
            }
        }
    }

    type L = Gcra<ManualClock>;

    fn first_checks_share_one_bucket(broken: bool) {
        loom::model(move || {
            let clock = ManualClock::new();
            let store = LoomMap::<KeyEntry<L>> {
                map: Mutex::new(HashMap::new()),
                broken,
            };
            let keyed = Arc::new(Keyed::with_store(
                store,
                8,
                KeyQuotas::Every(quota(1)),
                move |q| Gcra::with_clock(q, clock.clone()),
            ));
            let handles: Vec<_> = (0..2)
                .map(|_| {
                    let keyed = keyed.clone();
                    thread::spawn(move || u32::from(keyed.check_key(&7).is_allowed()))
                })
                .collect();
            let admitted: u32 = handles.into_iter().map(|h| h.join().unwrap()).sum();
            assert_eq!(admitted, 1, "admitted for one key of burst 1");
        });
    }

    #[test]
    fn model_6_first_checks_share_one_bucket() {
        first_checks_share_one_bucket(false);
    }

    #[test]
    #[should_panic(expected = "admitted for one key of burst 1")]
    fn model_6_broken_twin_is_caught() {
        first_checks_share_one_bucket(true);
    }
}

/// Model 7: the window limiters' packed counters. Limit 2 per window, frozen clock, three threads
/// asking for one each: exactly 2 are admitted in every interleaving, for the fixed window and the
/// sliding window counter. The broken twins update the word with a load and a store.
mod windows {
    use super::*;
    use atomic_limiter::{FixedWindow, SlidingWindowCounter};

    fn admits_exactly_the_limit<L: RateLimiter + Send + Sync + 'static>(
        make: fn(ManualClock) -> L,
        check: fn(&L) -> Decision,
    ) {
        loom::model(move || {
            let limiter = Arc::new(make(ManualClock::new()));
            let handles: Vec<_> = (0..3)
                .map(|_| {
                    let limiter = limiter.clone();
                    thread::spawn(move || u32::from(check(&limiter).is_allowed()))
                })
                .collect();
            let admitted: u32 = handles.into_iter().map(|h| h.join().unwrap()).sum();
            assert_eq!(admitted, 2, "admitted in one window of limit 2");
        });
    }

    fn fixed(clock: ManualClock) -> FixedWindow<ManualClock> {
        FixedWindow::with_clock(Quota::per_second(2), clock).unwrap()
    }

    fn sliding(clock: ManualClock) -> SlidingWindowCounter<ManualClock> {
        SlidingWindowCounter::with_clock(Quota::per_second(2), clock).unwrap()
    }

    #[test]
    fn model_7_fixed_window_admits_exactly_the_limit() {
        admits_exactly_the_limit(fixed, |l| l.check());
    }

    #[test]
    #[should_panic(expected = "admitted in one window of limit 2")]
    fn model_7_fixed_window_broken_twin_is_caught() {
        admits_exactly_the_limit(fixed, |l| l.loom_broken_check_n(1));
    }

    #[test]
    fn model_7_sliding_counter_admits_exactly_the_limit() {
        admits_exactly_the_limit(sliding, |l| l.check());
    }

    #[test]
    #[should_panic(expected = "admitted in one window of limit 2")]
    fn model_7_sliding_counter_broken_twin_is_caught() {
        admits_exactly_the_limit(sliding, |l| l.loom_broken_check_n(1));
    }
}

/// Model 8: the throttle's slot reservation. Burst 1, frozen clock, two threads reserve at once:
/// they get distinct slots, now and one period later. The broken twin (load, then store) can hand
/// both the same slot.
mod throttle {
    use super::*;
    use atomic_limiter::Throttle;

    fn slots_are_distinct(broken: bool) {
        loom::model(move || {
            let t = Arc::new(Throttle::with_clock(quota(1), ManualClock::new()));
            let handles: Vec<_> = (0..2)
                .map(|_| {
                    let t = t.clone();
                    thread::spawn(move || {
                        let max = Duration::from_secs(10);
                        if broken {
                            t.loom_broken_reserve(max)
                        } else {
                            t.reserve(max)
                        }
                        .unwrap()
                    })
                })
                .collect();
            let mut waits: Vec<Duration> = handles.into_iter().map(|h| h.join().unwrap()).collect();
            waits.sort();
            assert_eq!(waits, [Duration::ZERO, PERIOD], "distinct slots");
        });
    }

    #[test]
    fn model_8_reservations_get_distinct_slots() {
        slots_are_distinct(false);
    }

    #[test]
    #[should_panic(expected = "distinct slots")]
    fn model_8_broken_twin_is_caught() {
        slots_are_distinct(true);
    }
}

/// Model 9: a refund racing a reservation. Burst 1, frozen clock; A is reserved first (now). One
/// thread reserves B and gives it back while another reserves C. If B is still the latest
/// reservation when it is given back, its slot goes back: C and the next reservation D take one
/// period and two. If C came after B, nothing is given back (B's slot is left empty rather than
/// handed out under C): C waits two periods and D three. The broken twin refunds with a load and
/// a store and can move the next free slot back under C: D lands on C's slot.
mod refund {
    use super::*;
    use atomic_limiter::Throttle;

    fn refund_and_reserve_both_land(broken: bool) {
        loom::model(move || {
            let t = Arc::new(Throttle::with_clock(quota(1), ManualClock::new()));
            let max = Duration::from_secs(10);
            assert_eq!(t.reserve(max), Ok(Duration::ZERO));
            let refunder = {
                let t = t.clone();
                thread::spawn(move || {
                    let b = t.reserve_refundable(1, max).unwrap();
                    if broken {
                        b.loom_broken_refund()
                    } else {
                        b.refund()
                    }
                })
            };
            let reserver = {
                let t = t.clone();
                thread::spawn(move || t.reserve(max).unwrap())
            };
            let refunded = refunder.join().unwrap();
            let c = reserver.join().unwrap();
            let d = t.reserve(max).unwrap();
            let expected = if refunded {
                (PERIOD, 2 * PERIOD)
            } else {
                (2 * PERIOD, 3 * PERIOD)
            };
            assert_eq!((c, d), expected, "refund and reservation both land");
        });
    }

    #[test]
    fn model_9_refund_and_reserve_both_land() {
        refund_and_reserve_both_land(false);
    }

    #[test]
    #[should_panic(expected = "refund and reservation both land")]
    fn model_9_broken_twin_is_caught() {
        refund_and_reserve_both_land(true);
    }
}

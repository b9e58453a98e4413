//! What decides a request: the backend trait, for a local [`Keyed`] table and the Redis limiters.

use core::future::{Future, Pending};
use core::hash::Hash;

use crate::decision::Decision;
use crate::keyed::table::Keyed;
use crate::keyed::{KeyEntry, KeyedStore};
use crate::limiter::shared::KeyedLimiter;
use crate::quota::InsufficientCapacity;
use crate::quota::Quota;

/// A backend's answer: decided on the spot (a local table), or a future to await (a store across
/// the network).
#[derive(Debug)]
pub enum Checked<F> {
    /// Decided already: `Err` when the cost exceeds what the key's quota ever holds at once.
    Ready(Result<Decision, InsufficientCapacity>),
    /// To be awaited.
    Pending(F),
}

/// Decides whether the request of `key`, costing `cost` tokens, goes ahead.
///
/// Implemented for [`Keyed`] (any local limiter per key), and with the `redis` feature for
/// `redis::RedisGcra` (keys as subjects) and
/// `redis::Leased` (one global key).
pub trait Backend<K>: Send + Sync + 'static {
    /// The future a [`Checked::Pending`] answer holds.
    type Future: Future<Output = Result<Decision, InsufficientCapacity>> + Send + 'static;

    /// Checks `cost` tokens for `key`; a cost of 0 only looks.
    fn check(&self, key: &K, cost: u32) -> Checked<Self::Future>;

    /// [`Backend::check`] for a caller that needs nothing of an admission but that it happened:
    /// `None` for an admission the backend could make without a decision, else `check`'s answer
    /// (an admission among them). A local table builds no decision for an admission of a held
    /// key on its one quota.
    #[inline(always)]
    fn admit(&self, key: &K, cost: u32) -> Option<Checked<Self::Future>> {
        match self.check(key, cost) {
            Checked::Ready(Ok(d)) if d.is_allowed() => None,
            other => Some(other),
        }
    }

    /// The quota `key` is held to, for the `RateLimit-Policy` field; `None` leaves it out.
    fn quota(&self, key: &K) -> Option<Quota> {
        let _ = key;
        None
    }
}

impl<K, L, M> Backend<K> for Keyed<K, L, M>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    L: KeyedLimiter + 'static,
    M: KeyedStore<K, KeyEntry<L>> + Send + Sync + 'static,
{
    /// Never built: a local table always answers on the spot (`Pending` is empty, so the answer
    /// carries nothing for it).
    type Future = Pending<Result<Decision, InsufficientCapacity>>;

    #[inline(always)]
    fn check(&self, key: &K, cost: u32) -> Checked<Self::Future> {
        // The answer wrapped where it is made, not copied into the wrapper afterwards.
        self.check_key_via(&self.per_lookup(), key, cost, |_, _| None, Checked::Ready)
    }

    #[inline(always)]
    fn admit(&self, key: &K, cost: u32) -> Option<Checked<Self::Future>> {
        // On the one-quota path an admission builds no decision: `Some(None)` answers it.
        let admitted = |first: &L, seen| first.admitted(seen).then_some(None);
        let ready = |answer| Some(Checked::Ready(answer));
        self.check_key_via(&self.per_lookup(), key, cost, admitted, ready)
    }

    fn quota(&self, key: &K) -> Option<Quota> {
        Some(self.quota_of(key))
    }
}

/// What [`Settle::charge`] answers: the decision on the estimate and, for an admission, the
/// settlement to make once the actual cost is known.
pub type ChargeFuture<'a> = core::pin::Pin<
    alloc::boxed::Box<
        dyn Future<
                Output = (
                    Result<Decision, InsufficientCapacity>,
                    Option<Settlement<'a>>,
                ),
            > + Send
            + 'a,
    >,
>;

/// A charge's settlement: called once with the actual cost (it is consumed), its future
/// awaited before the response goes on. Dropped uncalled, the charge stands at its estimate.
pub type Settlement<'a> = alloc::boxed::Box<
    dyn FnOnce(u32) -> core::pin::Pin<alloc::boxed::Box<dyn Future<Output = ()> + Send + 'a>>
        + Send
        + 'a,
>;

/// A backend that charges a request an estimate and settles its actual cost once the response
/// is known ([`RateLimitLayerBuilder::settle_from`](crate::http::RateLimitLayerBuilder::settle_from)):
/// a [`Keyed`] GCRA table (any store, any clock), and with the `redis` feature
/// `redis::RedisGcra`.
///
/// # Examples
///
/// A table of one's own, charged and settled by hand as the layer does:
///
/// ```
/// use atomic_limiter::http::Settle;
/// use atomic_limiter::{Keyed, ManualClock, Quota};
///
/// # async fn run() {
/// let table = Keyed::gcra_with_clock(Quota::per_second(10), 100, ManualClock::new());
/// let (answer, settlement) = table.charge(&"k", 4).await;
/// assert!(answer.unwrap().is_allowed());
/// if let Some(settle) = settlement {
///     settle(1).await; // 3 come back
/// }
/// # }
/// ```
pub trait Settle<K>: Backend<K> {
    /// Charges `cost` tokens for `key`, as [`Backend::check`] checks them, keeping what the
    /// settlement needs.
    fn charge<'a>(&'a self, key: &K, cost: u32) -> ChargeFuture<'a>;
}

impl<K, C, M> Settle<K> for Keyed<K, crate::gcra::Gcra<C>, M>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    C: crate::clock::Clock + Send + Sync + 'static,
    M: KeyedStore<K, KeyEntry<crate::gcra::Gcra<C>>> + Send + Sync + 'static,
{
    fn charge<'a>(&'a self, key: &K, cost: u32) -> ChargeFuture<'a> {
        let answer = match self.charge_key(key, cost) {
            Ok(charge) => {
                let decision = charge.decision();
                let settle: Settlement<'a> = alloc::boxed::Box::new(move |actual| {
                    charge.settle(actual);
                    alloc::boxed::Box::pin(core::future::ready(()))
                });
                (Ok(decision), decision.is_allowed().then_some(settle))
            }
            Err(e) => (Err(e), None),
        };
        alloc::boxed::Box::pin(core::future::ready(answer))
    }
}

impl<K, T: Settle<K>> Settle<K> for alloc::sync::Arc<T> {
    fn charge<'a>(&'a self, key: &K, cost: u32) -> ChargeFuture<'a> {
        (**self).charge(key, cost)
    }
}

/// A shared backend: one table behind several layers, or kept to inspect.
impl<K, T: Backend<K>> Backend<K> for alloc::sync::Arc<T> {
    type Future = T::Future;

    #[inline(always)]
    fn check(&self, key: &K, cost: u32) -> Checked<T::Future> {
        (**self).check(key, cost)
    }

    #[inline(always)]
    fn admit(&self, key: &K, cost: u32) -> Option<Checked<T::Future>> {
        (**self).admit(key, cost)
    }

    fn quota(&self, key: &K) -> Option<Quota> {
        (**self).quota(key)
    }
}

#[cfg(feature = "redis")]
mod remote {
    use alloc::boxed::Box;
    use alloc::string::String;
    use alloc::vec::Vec;
    use core::fmt::Write;
    use core::future::Future;
    use core::pin::Pin;

    use super::{Backend, Checked};
    use crate::decision::Decision;
    use crate::http::key::IpKey;
    use crate::quota::InsufficientCapacity;
    use crate::quota::Quota;
    use crate::redis::{Leased, RedisGcra};

    /// A store's answer, boxed: it crosses the network anyway.
    pub type StoreFuture =
        Pin<Box<dyn Future<Output = Result<Decision, InsufficientCapacity>> + Send>>;

    /// A key as a Redis subject: written so that distinct keys never share a subject.
    pub trait Subject {
        /// Appends the subject to `out`.
        fn write_subject(&self, out: &mut String);
    }

    impl Subject for IpKey {
        fn write_subject(&self, out: &mut String) {
            let _ = write!(out, "{self}");
        }
    }

    impl Subject for String {
        fn write_subject(&self, out: &mut String) {
            out.push_str(self);
        }
    }

    impl Subject for () {
        fn write_subject(&self, out: &mut String) {
            out.push('*');
        }
    }

    /// Printable ASCII but `%` as is, every other byte as `%XX`: one subject per byte string.
    impl Subject for Vec<u8> {
        fn write_subject(&self, out: &mut String) {
            for &b in self {
                if b.is_ascii_graphic() && b != b'%' {
                    out.push(char::from(b));
                } else {
                    let _ = write!(out, "%{b:02X}");
                }
            }
        }
    }

    impl<K: Subject + Send + Sync + 'static> Backend<K> for RedisGcra {
        type Future = StoreFuture;

        fn check(&self, key: &K, cost: u32) -> Checked<StoreFuture> {
            let mut subject = String::new();
            key.write_subject(&mut subject);
            let limiter = self.clone();
            Checked::Pending(Box::pin(
                async move { limiter.check_n(&subject, cost).await },
            ))
        }

        fn quota(&self, _: &K) -> Option<Quota> {
            self.single_quota()
        }
    }

    impl<K: Subject + Send + Sync + 'static> super::Settle<K> for RedisGcra {
        fn charge<'a>(&'a self, key: &K, cost: u32) -> super::ChargeFuture<'a> {
            let mut subject = String::new();
            key.write_subject(&mut subject);
            Box::pin(async move {
                match RedisGcra::charge(self, &subject, cost).await {
                    Ok(charge) => {
                        let decision = charge.decision();
                        let settle: super::Settlement<'a> = Box::new(move |actual| {
                            Box::pin(async move {
                                // A settlement the store cannot take stands at the estimate
                                // (counted as the store's failure).
                                let _ = charge.settle(actual).await;
                            })
                        });
                        (Ok(decision), decision.is_allowed().then_some(settle))
                    }
                    Err(e) => (Err(e), None),
                }
            })
        }
    }

    /// One quota for the whole service across nodes, spent from a local lease.
    impl Backend<()> for Leased {
        type Future = StoreFuture;

        #[inline]
        fn check(&self, _: &(), cost: u32) -> Checked<StoreFuture> {
            if let Err(e) = InsufficientCapacity::check(cost, self.max_cost()) {
                return Checked::Ready(Err(e));
            }
            match self.check_local(cost) {
                Some(decision) => Checked::Ready(Ok(decision)),
                None => {
                    let leased = self.clone();
                    Checked::Pending(Box::pin(async move { leased.check_n(cost).await }))
                }
            }
        }

        fn quota(&self, _: &()) -> Option<Quota> {
            self.remote().single_quota()
        }
    }
}

#[cfg(feature = "redis")]
pub use self::remote::{StoreFuture, Subject};

use core::time::Duration;

use super::throttle::Throttle;
use crate::clock::Clock;

/// A throttle that hands out reservations from outside this family (the reconfiguration wing's),
/// and takes their slots back: the crate-private hook through which a [`Reservation`] refunds
/// without naming its issuer's type.
#[cfg(feature = "std")]
pub(crate) trait Refund: core::fmt::Debug {
    /// Takes back `cost` of the slot ending at `end`, handed out while the quota `generation` was
    /// in force, if that quota still is and the slot is the latest; whether it did.
    fn refund_latest(&self, generation: u64, end: u64, cost: u64) -> bool;
}

/// The throttle a reservation goes back to: a plain one, or another issuer with the generation
/// of the quota in force when it was made (a slot of a quota since replaced cannot go back).
#[derive(Debug)]
enum Issuer<'a, C: Clock> {
    Throttle(&'a Throttle<C>),
    /// Only the reconfiguration wing issues these, and it needs `std`.
    #[cfg(feature = "std")]
    Other {
        owner: &'a (dyn Refund + Sync),
        generation: u64,
    },
}

/// A slot taken by [`Throttle::reserve`] or [`Throttle::reserve_n`]: when to go, and the means
/// to hand the slot back if the work is abandoned before it used it.
///
/// A reservation borrows its throttle, so it can only ever go back to the throttle that made it,
/// and [`Reservation::refund`] consumes it, so it goes back at most once. A reservation from a
/// [`ReconfigurableThrottle`](crate::ReconfigurableThrottle) goes back only while the quota it was
/// made on is in force (after a change its slot is part of the queue the change carried over). Dropping it keeps the
/// slot (the work went ahead); [`Reservation::refund_on_drop`] turns it into a guard that refunds
/// unless told the slot was used, for work that can be cancelled (a dropped future).
///
/// # What a refund gives back
///
/// Only the throttle's latest reservation can be given back: the next free slot moves back by its
/// cost (never behind now, so a throttle is never fuller than full). A reservation with later ones
/// behind it leaves a gap instead: moving the next free slot back would hand its span out again
/// while a later reservation still holds a slot inside it, and two callers would go at once. Later
/// reservations keep their slots either way, so at most `burst` reservations fall in any span of
/// one period, refunds or not.
///
/// # Examples
///
/// The latest reservation goes back; one with another behind it does not:
///
/// ```
/// use atomic_limiter::{ManualClock, Quota, Throttle};
/// use std::time::Duration;
///
/// let t = Throttle::with_clock(Quota::per_second(10).with_burst(1), ManualClock::new());
/// let max = Duration::from_secs(1);
/// let first = t.reserve(max).unwrap();
/// let second = t.reserve(max).unwrap();
/// assert_eq!(second.wait(), Duration::from_millis(100));
/// assert!(!first.refund(), "a later reservation holds the slot after it");
/// assert!(second.refund());
/// assert_eq!(t.reserve(max).unwrap().wait(), Duration::from_millis(100));
/// ```
///
/// A reservation is given back at most once (`refund` consumes it):
///
/// ```compile_fail
/// use atomic_limiter::{ManualClock, Quota, Throttle};
/// use std::time::Duration;
///
/// let t = Throttle::with_clock(Quota::per_second(10), ManualClock::new());
/// let r = t.reserve(Duration::from_secs(1)).unwrap();
/// r.refund();
/// r.refund(); // error[E0382]: use of moved value: `r`
/// ```
#[derive(Debug)]
#[must_use = "a reservation is a slot: wait it out, or refund it"]
pub struct Reservation<'a, C: Clock> {
    throttle: Issuer<'a, C>,
    wait: Duration,
    /// The reservation's cost in the throttle's units.
    cost: u64,
    /// The next free slot the reservation left behind, in the throttle's units.
    end: u64,
}

impl<'a, C: Clock> Reservation<'a, C> {
    pub(crate) fn new(throttle: &'a Throttle<C>, wait: Duration, cost: u64, end: u64) -> Self {
        Reservation {
            throttle: Issuer::Throttle(throttle),
            wait,
            cost,
            end,
        }
    }

    /// A slot `owner` handed out under the quota `generation`.
    #[cfg(feature = "std")]
    pub(crate) fn of_other(
        owner: &'a (dyn Refund + Sync),
        generation: u64,
        (wait, cost, end): (Duration, u64, u64),
    ) -> Self {
        Reservation {
            throttle: Issuer::Other { owner, generation },
            wait,
            cost,
            end,
        }
    }

    /// How long to wait, from the moment of reserving, before using the slot.
    pub fn wait(&self) -> Duration {
        self.wait
    }

    /// Gives the slot back, if it is still the throttle's latest reservation and its time has not
    /// passed (see the type's docs); returns whether anything was given back.
    pub fn refund(self) -> bool {
        match self.throttle {
            Issuer::Throttle(throttle) => throttle.refund_latest(self.end, self.cost),
            #[cfg(feature = "std")]
            Issuer::Other { owner, generation } => {
                owner.refund_latest(generation, self.end, self.cost)
            }
        }
    }

    /// A guard that gives the slot back when dropped, unless [`ReservationGuard::commit`] says it
    /// was used: a cancelled future or an early return cannot leak the slot.
    pub fn refund_on_drop(self) -> ReservationGuard<'a, C> {
        ReservationGuard { slot: Some(self) }
    }

    /// For the loom models' teeth: `refund` with the CAS replaced by a load and a store.
    #[cfg(atomic_limiter_loom)]
    pub(crate) fn loom_broken_refund(self) -> bool {
        match self.throttle {
            Issuer::Throttle(throttle) => throttle.loom_broken_refund_latest(self.end, self.cost),
            #[cfg(feature = "std")]
            Issuer::Other { owner, generation } => {
                owner.refund_latest(generation, self.end, self.cost)
            }
        }
    }
}

/// A [`Reservation`] that gives its slot back when dropped unused; from
/// [`Throttle::reserve_guarded`] or [`Reservation::refund_on_drop`].
///
/// # Examples
///
/// An async task that is cancelled while it waits for its slot leaks nothing:
///
/// ```
/// use atomic_limiter::{ManualClock, Quota, Throttle};
/// use std::time::Duration;
///
/// let t = Throttle::with_clock(Quota::per_second(10).with_burst(1), ManualClock::new());
/// let max = Duration::from_secs(1);
/// let used = t.reserve_guarded(1, max).unwrap();
/// used.commit(); // the work ran: the slot stays taken
/// {
///     let abandoned = t.reserve_guarded(1, max).unwrap();
///     assert_eq!(abandoned.wait(), Duration::from_millis(100));
/// } // dropped before use: given back
/// assert_eq!(t.reserve(max).unwrap().wait(), Duration::from_millis(100));
/// ```
#[derive(Debug)]
#[must_use = "dropping the guard at once gives the slot back"]
pub struct ReservationGuard<'a, C: Clock> {
    slot: Option<Reservation<'a, C>>,
}

impl<C: Clock> ReservationGuard<'_, C> {
    /// How long to wait, from the moment of reserving, before using the slot.
    pub fn wait(&self) -> Duration {
        self.slot.as_ref().map_or(Duration::ZERO, Reservation::wait)
    }

    /// The slot was used: keep it taken.
    pub fn commit(mut self) {
        self.slot = None;
    }
}

impl<C: Clock> Drop for ReservationGuard<'_, C> {
    fn drop(&mut self) {
        if let Some(slot) = self.slot.take() {
            slot.refund();
        }
    }
}

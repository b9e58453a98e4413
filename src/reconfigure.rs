//! [`Reconfigurable`]: a limiter whose quota changes at run time, from any thread, while others
//! check; [`Carry`]: what its state becomes under the new quota.
//!
//! # Implementation details
//!
//! The quota, the algorithm's parameters and the state word live together in one cell, a whole
//! [`Limiter`], reached through one pointer. A check loads the pointer and runs the limiter's
//! own check on that cell. A reconfiguration builds the new cell, then retires the old one:
//!
//! | step | what it does | why |
//! |---|---|---|
//! | 1 | sets the old cell's `retired` flag | a check that reads the word afterwards steps aside |
//! | 2 | changes the old word by a CAS, and keeps the value it replaced | a check that loaded the word before fails its CAS; every admission that landed is in that value |
//! | 3 | writes the carried state into the new cell's word | the new cell is not visible yet: a plain write |
//! | 4 | publishes the new cell's pointer (`Release`) | a check that meets the flag reloads the pointer and runs again on the new cell |
//! | 5 | notes the checks still open (`reclaim`); the old cell is freed once they have ended, by this change or a later one | no check can still be reading it |
//!
//! So every decision is made on one cell's parameters and that cell's word, and every admission
//! is counted in the word that is carried over: none is lost and none is made twice. A check that
//! meets a retired cell before step 4 waits (spins, then yields) for that few-instruction window;
//! reconfigurations are serialised by a mutex, so only one window is ever open; the new cell and
//! the carry's clock reading are made before it is taken, and nothing waits while it is held. The
//! ordering argument is in `docs/design.md`; loom model 12 checks a check racing a
//! reconfiguration.
//!
//! The cell is reached through a raw pointer, the one way to read it without a lock or a
//! reference count on every check: each `unsafe` block below is argued where it stands.
#![allow(unsafe_code)]

#[cfg(feature = "std")]
mod reclaim;

#[cfg(feature = "std")]
pub use self::cell::Reconfigurable;
#[cfg(feature = "std")]
mod log;
#[cfg(feature = "std")]
pub use self::log::ReconfigurableLog;
#[cfg(feature = "std")]
mod sharded;
#[cfg(feature = "std")]
mod throttle;
#[cfg(feature = "std")]
pub use self::sharded::ReconfigurableSharded;
#[cfg(feature = "std")]
pub use self::throttle::ReconfigurableThrottle;

#[cfg(feature = "std")]
mod cell {
    use alloc::boxed::Box;

    use super::reclaim;
    use crate::clock::Clock;
    #[cfg(feature = "quanta")]
    use crate::clock::DefaultClock;
    use crate::clock::DefaultClockOrNone;
    use crate::decision::Decision;
    use crate::limiter::Limiter;
    use crate::limiter::algorithm::Carry;
    use crate::limiter::algorithm::{Continuous, Retunable};
    use crate::quota::InsufficientCapacity;
    use crate::quota::{Quota, QuotaError};
    use crate::rate_limiter::RateLimiter;
    use crate::sync::{AtomicBool, AtomicPtr, Backoff, Mutex, Ordering};
    use core::convert::Infallible;
    use std::sync::PoisonError;

    /// What a cell holds, and how a change moves its state to the next cell's: one limiter, or a
    /// sharded one.
    pub(crate) trait Content: Sized {
        fn quota(&self) -> Quota;

        /// The most tokens one request may take.
        fn capacity(&self) -> u32;

        /// A check of `n <= capacity` tokens, or `None` once `retired` is set (the caller moves
        /// to the cell that replaced this one): every admission it makes lands on a word that no
        /// change has taken yet.
        fn check_live(&self, n: u32, retired: &AtomicBool) -> Option<Decision>;

        /// [`Content::check_live`] for one token, which every quota's burst holds, answering
        /// `again()` once `retired` is set. A content whose decision would be copied out of the
        /// `Option` (one made out of line) makes it in place instead, where it is returned.
        #[inline(always)]
        fn check_one_or(&self, retired: &AtomicBool, again: impl FnOnce() -> Decision) -> Decision {
            match self.check_live(1, retired) {
                Some(d) => d,
                None => again(),
            }
        }

        /// Its clock, read now: the instant a change carries the state at, read before the change
        /// takes its lock (a clock that changes a quota when read must find no lock held).
        fn now(&self) -> u64;

        /// Takes every state word out of use (`retired` set first, then each word changed by a
        /// CAS), and carries what they held into `new`, which no other thread can see yet, as of
        /// the reading `at` (taken just before: admissions after it are in the words, counted).
        /// `retire` is false only in the loom models' twin, which reads the words instead.
        fn retire_into(
            &self,
            retired: &AtomicBool,
            new: &mut Self,
            carry: Carry,
            retire: bool,
            at: u64,
        );
    }

    impl<A: Retunable, C: Clock> Content for Limiter<A, C> {
        fn quota(&self) -> Quota {
            Limiter::quota(self)
        }

        #[inline(always)]
        fn capacity(&self) -> u32 {
            self.algorithm().capacity()
        }

        #[inline(always)]
        fn check_live(&self, n: u32, retired: &AtomicBool) -> Option<Decision> {
            Limiter::check_live(self, n, retired)
        }

        fn now(&self) -> u64 {
            self.clock().now()
        }

        fn retire_into(
            &self,
            retired: &AtomicBool,
            new: &mut Self,
            carry: Carry,
            retire: bool,
            at: u64,
        ) {
            new.algorithm_mut().follow(self.algorithm());
            let word = self.retire_or_read(retired, retire);
            let carried = self.carried_word(word, new, at, carry);
            new.set_word(carried);
        }
    }

    /// One quota's content, and whether a change has replaced it.
    #[derive(Debug)]
    pub(crate) struct Cell<T> {
        content: T,
        retired: AtomicBool,
        /// Which change made it (0: the first cell), for what must go back to the very cell it
        /// came from (a throttle's reservation).
        generation: u64,
    }

    /// The cells of a reconfigurable limiter: the live one, reached through one pointer, and those
    /// that changes replaced and could not free yet.
    pub(crate) struct Cells<T> {
        /// The live cell. Never null; owned by these cells until retired.
        current: AtomicPtr<Cell<T>>,
        /// Taken by changes only; holds the cells they replaced until no check can be reading
        /// them, each with the grace that frees it (`None` until one was taken): freed at the end
        /// of the change that replaced it when no check was open, otherwise by a later change
        /// once those checks have ended, or with the limiter (always under the loom models).
        pub(super) writer: Mutex<Vec<(*mut Cell<T>, Option<reclaim::Grace>)>>,
    }

    // SAFETY: the cells are reached through the pointer only as `&Cell` (shared), and a cell's
    // content is a limiter, whose shared use from several threads is what it is for when it is
    // `Send + Sync`; cells are moved to (and freed on) another thread only when `Send`.
    unsafe impl<T: Send + Sync> Send for Cells<T> {}
    // SAFETY: as above.
    unsafe impl<T: Send + Sync> Sync for Cells<T> {}

    impl<T: Content> Cells<T> {
        pub(crate) fn new(content: T) -> Self {
            let cell = Box::new(Cell {
                content,
                retired: AtomicBool::new(false),
                generation: 0,
            });
            reclaim::prepare();
            Cells {
                current: AtomicPtr::new(Box::into_raw(cell)),
                writer: Mutex::new(Vec::new()),
            }
        }

        /// Builds the new content from the live one (its clock, its shard count) with `build` and
        /// puts it in force, the state carried over as `carry` says; `retire` is false only in
        /// the loom models' twin.
        ///
        /// Nothing that may run the caller's code (a clock read, a build) runs under the lock,
        /// and nothing under it waits: a clock that changes this limiter's quota, or another's
        /// whose change is under way on another thread, never waits on a lock its own thread
        /// holds. A change that lands meanwhile is built on: this one is built again on it.
        pub(crate) fn replace<E>(
            &self,
            build: impl Fn(&T) -> Result<T, E>,
            carry: Carry,
            retire: bool,
        ) -> Result<(), E> {
            loop {
                // The section keeps the live cell alive while it is read outside the lock.
                let section = reclaim::enter();
                // Acquire: as in `load`; the raw pointer itself is kept, with the provenance the
                // box gave it, for the free.
                let old_ptr = self.current.load(Ordering::Acquire);
                // SAFETY: as in `load`: never null, and the section opened above keeps it alive.
                let old = unsafe { &*old_ptr };
                // Built before the old cell is retired, to keep the window that checks wait out
                // short.
                let content = build(&old.content)?;
                let at = old.content.now();
                let mut retired = self.writer.lock().unwrap_or_else(PoisonError::into_inner);
                // Relaxed: changed under `writer` only, which is held.
                if !core::ptr::eq(self.current.load(Ordering::Relaxed), old_ptr) {
                    // Another change landed after the build: build on the cell it put in force.
                    drop(retired);
                    drop(section);
                    continue;
                }
                let mut new = Box::new(Cell {
                    content,
                    retired: AtomicBool::new(false),
                    generation: old.generation.wrapping_add(1),
                });
                old.content
                    .retire_into(&old.retired, &mut new.content, carry, retire, at);
                // Release: the new cell, built above, is seen whole by a check that loads the
                // pointer.
                self.current.store(Box::into_raw(new), Ordering::Release);
                retired.push((old_ptr, None));
                // Closed first, or the grace below would note this very section.
                drop(section);
                if let Some(grace) = reclaim::grace() {
                    // Covers every cell unpublished so far, those an earlier grace missed too.
                    for (_, g) in retired.iter_mut() {
                        if g.is_none() {
                            *g = Some(grace.clone());
                        }
                    }
                }
                free_passed(&mut retired);
                return Ok(());
            }
        }

        /// Frees the replaced cells whose grace has passed; whether none is left (tests: a
        /// change frees what it replaced once the checks open at the time have ended).
        #[cfg(test)]
        pub(crate) fn collect(&self) -> bool {
            let mut retired = self.writer.lock().unwrap_or_else(PoisonError::into_inner);
            free_passed(&mut retired);
            retired.is_empty()
        }

        /// `n` tokens, all or nothing, on the quota in force; `n = 0` peeks.
        #[inline(always)]
        pub(crate) fn check_n(&self, n: u32) -> Result<Decision, InsufficientCapacity> {
            let _section = reclaim::enter();
            let mut cell = self.load();
            loop {
                InsufficientCapacity::check(n, cell.content.capacity())?;
                if let Some(decision) = cell.content.check_live(n, &cell.retired) {
                    return Ok(decision);
                }
                cell = self.replacement_of(cell);
            }
        }

        /// One token on the quota in force.
        #[inline(always)]
        pub(crate) fn check(&self) -> Decision {
            let _section = reclaim::enter();
            let cell = self.load();
            // One token is within every quota's burst (a burst is at least 1).
            cell.content
                .check_one_or(&cell.retired, || self.check_after(cell))
        }

        /// [`Cells::check`] on the cells that replaced `old`, which a change retired under it;
        /// the caller's section is still open.
        #[cold]
        #[inline(never)]
        fn check_after(&self, old: &Cell<T>) -> Decision {
            let mut cell = self.replacement_of(old);
            loop {
                if let Some(decision) = cell.content.check_live(1, &cell.retired) {
                    return decision;
                }
                cell = self.replacement_of(cell);
            }
        }

        /// `run` on the live cell's content, with its `retired` flag and generation, until it
        /// answers (`None` means the cell was retired meanwhile: it runs again on the next).
        #[inline]
        pub(crate) fn run_live<R>(&self, run: impl Fn(&T, &AtomicBool, u64) -> Option<R>) -> R {
            let _section = reclaim::enter();
            let mut cell = self.load();
            loop {
                if let Some(answer) = run(&cell.content, &cell.retired, cell.generation) {
                    return answer;
                }
                cell = self.replacement_of(cell);
            }
        }

        /// `run` on the live cell's content if it is the cell `generation`; `None` if another
        /// has replaced it (before or while `run` ran).
        pub(crate) fn run_on<R>(
            &self,
            generation: u64,
            run: impl FnOnce(&T, &AtomicBool) -> Option<R>,
        ) -> Option<R> {
            let _section = reclaim::enter();
            let cell = self.load();
            if cell.generation != generation {
                return None;
            }
            run(&cell.content, &cell.retired)
        }

        /// The quota in force (by value: it may change right after).
        pub(crate) fn quota(&self) -> Quota {
            let _section = reclaim::enter();
            self.load().content.quota()
        }

        /// The live cell; the caller holds a `reclaim` section.
        #[inline(always)]
        fn load(&self) -> &Cell<T> {
            // Acquire: pairs with the Release store that published the cell.
            let cell = self.current.load(Ordering::Acquire);
            // SAFETY: never null; a cell is freed only after it was unpublished and every check
            // section open then has ended, and the caller is in one (opened before this load).
            unsafe { &*cell }
        }

        /// The cell that replaced `old`: it is published a few instructions after `old` was
        /// retired, so a check that finds `old` still in place waits for it.
        #[cold]
        #[inline(never)]
        fn replacement_of(&self, old: &Cell<T>) -> &Cell<T> {
            let backoff = Backoff::new();
            loop {
                let cell = self.load();
                if !core::ptr::eq(cell, old) {
                    return cell;
                }
                backoff.snooze();
            }
        }
    }

    /// Frees every cell of `retired` whose grace has passed.
    fn free_passed<T>(retired: &mut Vec<(*mut Cell<T>, Option<reclaim::Grace>)>) {
        retired.retain_mut(|(cell, grace)| {
            if !grace.as_mut().is_some_and(reclaim::Grace::passed) {
                return true;
            }
            // SAFETY: made by `Box::into_raw`, unpublished, and freed once (taken out of the
            // list); every check section that could have loaded it has closed.
            drop(unsafe { Box::from_raw(*cell) });
            false
        });
    }

    impl<T> Drop for Cells<T> {
        fn drop(&mut self) {
            let retired = self
                .writer
                .get_mut()
                .unwrap_or_else(PoisonError::into_inner);
            for (cell, _) in retired.drain(..) {
                // SAFETY: made by `Box::into_raw` and unpublished; `&mut self` means no check
                // is running; drained, so freed once.
                drop(unsafe { Box::from_raw(cell) });
            }
            // Relaxed: `&mut self` is exclusive; nothing else can be storing.
            let cell = self.current.load(Ordering::Relaxed);
            // SAFETY: the live cell, made by `Box::into_raw` and owned by these cells; `&mut
            // self` means no check is running on it.
            drop(unsafe { Box::from_raw(cell) });
        }
    }

    /// A limiter whose quota can change at run time, from any thread, while others check.
    ///
    /// It runs the algorithm `A` ([`Gcra`](crate::Gcra)'s, `Reconfigurable<GcraAlgorithm>`,
    /// [`TokenBucket`](crate::TokenBucket)'s, or a window's, built with
    /// [`Reconfigurable::try_with_clock`]) on the clock `C`, and keeps its state across a change
    /// as [`Carry`] says. A check is the plain
    /// limiter's check plus a pointer load and two stores to its thread's slot (no lock, no
    /// read-modify-write; a full fence too where the kernel cannot put the barrier on every
    /// thread, outside Linux; a thread's first check registers its slot, one small allocation). A
    /// change allocates the new quota's cell, takes a mutex that only changes take, and notes the
    /// checks already running without waiting for them (on Linux it asks the kernel for one
    /// barrier on every thread, `membarrier(2)`); the cell they read is freed once they end, by a
    /// later change or with the limiter: 0.5 µs with no check running, about 16 µs (median) with
    /// three threads checking on two cores. A clock that changes a quota when read, this
    /// limiter's or another's, is served: no change waits on anything its own thread holds.
    ///
    /// Exact under races: no check decides on one quota's parameters and another's state, and
    /// every admission made on the old quota is in the state carried over. `docs/design.md` has
    /// the argument and `loom-tests` the model.
    ///
    /// # Examples
    ///
    /// A tenant upgrades from 2 to 10 per second; what it spent stays spent, as time:
    ///
    /// ```
    /// use atomic_limiter::algorithm::GcraAlgorithm;
    /// use atomic_limiter::{Carry, ManualClock, Quota, Reconfigurable};
    /// use std::time::Duration;
    ///
    /// let clock = ManualClock::new();
    /// let tenant: Reconfigurable<GcraAlgorithm, _> =
    ///     Reconfigurable::with_clock(Quota::per_second(2), clock.clone());
    /// assert_eq!((0..5).filter(|_| tenant.check().is_allowed()).count(), 2);
    ///
    /// // Both tokens spent: full again in one second, which the debt carries over.
    /// tenant.set_quota(Quota::per_second(10), Carry::Debt);
    /// assert!(tenant.check().is_denied());
    /// clock.advance(Duration::from_millis(100));
    /// assert!(tenant.check().is_allowed());
    /// assert_eq!(tenant.quota().burst(), 10);
    /// ```
    pub struct Reconfigurable<A, C = DefaultClockOrNone> {
        pub(super) cells: Cells<Limiter<A, C>>,
    }

    impl<A, C> core::fmt::Debug for Reconfigurable<A, C> {
        fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
            f.debug_struct("Reconfigurable").finish_non_exhaustive()
        }
    }

    #[cfg(feature = "quanta")]
    impl<A: Retunable + Continuous + 'static> Reconfigurable<A, DefaultClock> {
        /// A full limiter for `quota` on the default clock.
        pub fn new(quota: Quota) -> Self {
            Reconfigurable::with_clock(quota, DefaultClock::new())
        }
    }

    #[cfg(feature = "quanta")]
    impl<A: Retunable + 'static> Reconfigurable<A, DefaultClock> {
        /// A full limiter for `quota` on the default clock, for any algorithm (a window's limit
        /// can be too large for its packed counts).
        ///
        /// # Errors
        ///
        /// [`QuotaError::LimitTooLarge`] if the algorithm cannot serve `quota`.
        pub fn try_new(quota: Quota) -> Result<Self, QuotaError> {
            Reconfigurable::try_with_clock(quota, DefaultClock::new())
        }
    }

    impl<A, C> Reconfigurable<A, C>
    where
        A: Retunable + Continuous + 'static,
        C: Clock + Clone + Send + Sync + 'static,
    {
        /// A full limiter for `quota` on `clock`.
        pub fn with_clock(quota: Quota, clock: C) -> Self {
            Reconfigurable {
                cells: Cells::new(Limiter::continuous(quota, clock)),
            }
        }

        /// Changes the quota, carrying the state over as `carry` says. Checks racing the change
        /// are decided on the old quota or the new one, each on its own state; none is lost.
        pub fn set_quota(&self, quota: Quota, carry: Carry) {
            let build = |old: &Limiter<A, C>| {
                Ok::<_, Infallible>(Limiter::continuous(quota, old.clock().clone()))
            };
            match self.cells.replace(build, carry, true) {
                Ok(()) => {}
                Err(never) => match never {},
            }
        }

        /// For the loom models' teeth: a change that reads the old word instead of retiring it,
        /// as swapping limiters behind a lock does, so a check racing it can admit on the old
        /// cell after its word was carried over.
        #[cfg(atomic_limiter_loom)]
        #[doc(hidden)]
        pub fn loom_broken_set_quota(&self, quota: Quota, carry: Carry) {
            let build = |old: &Limiter<A, C>| {
                Ok::<_, Infallible>(Limiter::continuous(quota, old.clock().clone()))
            };
            match self.cells.replace(build, carry, false) {
                Ok(()) => {}
                Err(never) => match never {},
            }
        }
    }

    impl<A, C> Reconfigurable<A, C>
    where
        A: Retunable + 'static,
        C: Clock + Clone + Send + Sync + 'static,
    {
        /// A full limiter for `quota` on `clock`, for any algorithm: the windows
        /// ([`FixedWindow`](crate::FixedWindow)'s `Reconfigurable<WindowAlgorithm<Fixed>>`,
        /// [`SlidingWindowCounter`](crate::SlidingWindowCounter)'s) as well as GCRA and the
        /// token bucket.
        ///
        /// # Errors
        ///
        /// [`QuotaError::LimitTooLarge`] if the algorithm cannot serve `quota` (a window's limit
        /// too large for its packed counts).
        pub fn try_with_clock(quota: Quota, clock: C) -> Result<Self, QuotaError> {
            Ok(Reconfigurable {
                cells: Cells::new(Limiter::try_with_clock(quota, clock)?),
            })
        }

        /// [`Reconfigurable::set_quota`] for any algorithm: a window's counts carry over (see
        /// [`Carry`]).
        ///
        /// # Examples
        ///
        /// An incident halves a fixed window's limit; what was admitted in this window stays
        /// counted:
        ///
        /// ```
        /// use atomic_limiter::algorithm::{Fixed, WindowAlgorithm};
        /// use atomic_limiter::{Carry, ManualClock, Quota, Reconfigurable};
        /// use std::time::Duration;
        ///
        /// let clock = ManualClock::new();
        /// let api: Reconfigurable<WindowAlgorithm<Fixed>, _> =
        ///     Reconfigurable::try_with_clock(Quota::per_second(10), clock.clone())?;
        /// assert_eq!((0..6).filter(|_| api.check().is_allowed()).count(), 6);
        /// api.try_set_quota(Quota::per_second(5), Carry::Debt)?;
        /// assert!(api.check().is_denied()); // 6 counted, at least the new limit
        /// clock.advance(Duration::from_secs(1)); // the same grid: the next window is fresh
        /// assert_eq!((0..10).filter(|_| api.check().is_allowed()).count(), 5);
        /// # Ok::<(), atomic_limiter::QuotaError>(())
        /// ```
        ///
        /// # Errors
        ///
        /// [`QuotaError::LimitTooLarge`] if the algorithm cannot serve `quota`; the quota in
        /// force and its state are then left as they were.
        pub fn try_set_quota(&self, quota: Quota, carry: Carry) -> Result<(), QuotaError> {
            self.cells.replace(
                |old| Limiter::try_with_clock(quota, old.clock().clone()),
                carry,
                true,
            )
        }

        /// Asks for `n` tokens, all or nothing, on the quota in force; `n = 0` peeks.
        ///
        /// # Errors
        ///
        /// [`InsufficientCapacity`] if `n` exceeds the burst of the quota in force.
        #[inline(always)]
        pub fn check_n(&self, n: u32) -> Result<Decision, InsufficientCapacity> {
            self.cells.check_n(n)
        }

        /// Asks for one token on the quota in force.
        #[inline(always)]
        pub fn check(&self) -> Decision {
            self.cells.check()
        }

        /// The quota in force (by value: it may change right after).
        pub fn quota(&self) -> Quota {
            self.cells.quota()
        }
    }

    /// The plain limiter's trait on the quota in force: [`Shadow`](crate::shadow::Shadow),
    /// `Instrumented`, [`RateLimiter::wait_n`] and [`RateLimiter::until_n_ready_with`] wrap it
    /// (a change of quota while one waits applies to its next try).
    impl<A, C> RateLimiter for Reconfigurable<A, C>
    where
        A: Retunable + 'static,
        C: Clock + Clone + Send + Sync + 'static,
    {
        #[inline(always)]
        fn check(&self) -> Decision {
            self.cells.check()
        }

        #[inline(always)]
        fn check_n(&self, n: u32) -> Result<Decision, InsufficientCapacity> {
            self.cells.check_n(n)
        }

        fn quota(&self) -> Quota {
            self.cells.quota()
        }
    }
}

#[cfg(all(test, feature = "std", not(atomic_limiter_loom)))]
mod tests {
    use super::*;
    use crate::clock::Clock;
    use crate::clock::ManualClock;
    use crate::gcra::GcraAlgorithm;
    use crate::limiter::algorithm::Carry;
    use crate::quota::Quota;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
    use std::thread;

    /// A clock whose clones count their drops: one clone lives in each cell, so a cell freed is
    /// a drop counted. It can also run a hook inside every reading (a check in progress).
    #[derive(Clone)]
    struct Counted {
        time: ManualClock,
        drops: Arc<AtomicUsize>,
        hook: Arc<dyn Fn() + Send + Sync>,
    }

    impl Drop for Counted {
        fn drop(&mut self) {
            self.drops.fetch_add(1, Relaxed);
        }
    }

    impl Clock for Counted {
        fn now(&self) -> u64 {
            (self.hook)();
            self.time.now()
        }
    }

    fn counted(hook: impl Fn() + Send + Sync + 'static) -> (Counted, Arc<AtomicUsize>) {
        let drops = Arc::new(AtomicUsize::new(0));
        let clock = Counted {
            time: ManualClock::new(),
            drops: drops.clone(),
            hook: Arc::new(hook),
        };
        (clock, drops)
    }

    /// Frees what `cells` replaced, once the checks open at each change have ended: those of
    /// other tests' threads in this process too, so it tries again for up to 10 s.
    fn collected<T: cell::Content>(cells: &cell::Cells<T>) -> bool {
        let start = std::time::Instant::now();
        while !cells.collect() {
            if start.elapsed() > std::time::Duration::from_secs(10) {
                return false;
            }
            thread::sleep(std::time::Duration::from_millis(1));
        }
        true
    }

    /// Each change frees the cell it replaced once the checks open then have ended (at once
    /// where none is), and dropping the limiter frees the live one.
    #[test]
    fn a_change_frees_the_cell_it_replaced() {
        let (clock, drops) = counted(|| ());
        let limiter: Reconfigurable<GcraAlgorithm, Counted> =
            Reconfigurable::with_clock(Quota::per_second(10), clock);
        let before = drops.load(Relaxed);
        for i in 1..=20 {
            limiter.set_quota(Quota::per_second(i), Carry::Debt);
            assert!(collected(&limiter.cells), "after change {i}");
            // The replaced cell's clock (the new cell holds the clone the build took).
            assert_eq!(drops.load(Relaxed) - before, i as usize, "after change {i}");
        }
        drop(limiter);
        assert_eq!(drops.load(Relaxed) - before, 21);
    }

    /// A change made from inside a check (a clock that changes the quota it is read for) cannot
    /// free its cell while that check runs: it keeps the replaced cell, freed by a later change
    /// once the check has ended, or when the limiter is dropped. Checks nested in a check keep the outer one
    /// open.
    #[test]
    fn a_change_from_inside_a_check_keeps_the_cell_until_it_can_free_it() {
        type Tunable = Reconfigurable<GcraAlgorithm, ManualClock>;
        let other: Arc<std::sync::OnceLock<Arc<Tunable>>> = Arc::default();
        let inside = Arc::new(AtomicBool::new(false));
        let (clock, drops) = {
            let (other, inside) = (other.clone(), inside.clone());
            counted(move || {
                if inside.swap(false, Relaxed) {
                    if let Some(other) = other.get() {
                        // A nested check, then a change, both inside the outer check.
                        assert!(other.check().is_allowed());
                        other.set_quota(Quota::per_second(7), Carry::Debt);
                    }
                }
            })
        };
        let outer: Reconfigurable<GcraAlgorithm, Counted> =
            Reconfigurable::with_clock(Quota::per_second(10), clock);
        let inner = Arc::new(Tunable::with_clock(
            Quota::per_second(5),
            ManualClock::new(),
        ));
        let _ = other.set(inner.clone());
        inside.store(true, Relaxed);
        assert!(outer.check().is_allowed());
        assert_eq!(inner.quota(), Quota::per_second(7));
        // Kept: the change ran inside the outer check's section.
        assert_eq!(inner.cells.writer.lock().unwrap().len(), 1);
        inner.set_quota(Quota::per_second(8), Carry::Debt);
        assert!(collected(&inner.cells));
        let before = drops.load(Relaxed);
        drop(outer);
        assert!(
            drops.load(Relaxed) > before,
            "the live cell is freed with the limiter"
        );
    }

    /// A check made while its thread's thread-locals are destroyed, after its slot went (a
    /// straggler, counted apart), is decided and waited out like any other: the change after it
    /// frees the cell it replaced.
    #[test]
    fn a_check_in_a_thread_local_destructor_straggles() {
        type Tunable = Reconfigurable<GcraAlgorithm, ManualClock>;
        struct CheckOnExit(Arc<Tunable>, Arc<AtomicUsize>);
        impl Drop for CheckOnExit {
            fn drop(&mut self) {
                if self.0.check().is_allowed() {
                    self.1.fetch_add(1, Relaxed);
                }
            }
        }
        std::thread_local! {
            static ON_EXIT: std::cell::RefCell<Option<CheckOnExit>> =
                const { std::cell::RefCell::new(None) };
        }
        let limiter = Arc::new(Tunable::with_clock(
            Quota::per_second(1).with_burst(5),
            ManualClock::new(),
        ));
        let admitted = Arc::new(AtomicUsize::new(0));
        let (l, a) = (limiter.clone(), admitted.clone());
        thread::spawn(move || {
            // Set before the thread's first check registers its slot, so destroyed after it
            // (thread-locals go in the reverse order of their first use).
            ON_EXIT.with(|e| *e.borrow_mut() = Some(CheckOnExit(l.clone(), a.clone())));
            assert!(l.check().is_allowed());
            a.fetch_add(1, Relaxed);
        })
        .join()
        .unwrap();
        assert_eq!(admitted.load(Relaxed), 2);
        limiter.set_quota(Quota::per_second(1).with_burst(5), Carry::Debt);
        assert!(collected(&limiter.cells));
        assert_eq!(limiter.check().remaining(), 2);
    }

    /// Threads check while another changes the quota (to the same figures) and frees each
    /// replaced cell: nothing is read after it is freed (Miri checks this run), and exactly the
    /// burst is admitted on a frozen clock.
    #[test]
    fn checks_racing_changes_never_read_a_freed_cell() {
        let (checks, changes) = if cfg!(miri) {
            (60, 10)
        } else {
            (20_000, 2_000)
        };
        let burst = 50;
        let quota = Quota::per_second(1).with_burst(burst);
        let limiter: Reconfigurable<GcraAlgorithm, ManualClock> =
            Reconfigurable::with_clock(quota, ManualClock::new());
        let admitted = AtomicUsize::new(0);
        thread::scope(|s| {
            for _ in 0..2 {
                s.spawn(|| {
                    for _ in 0..checks {
                        if limiter.check().is_allowed() {
                            admitted.fetch_add(1, Relaxed);
                        }
                    }
                });
            }
            // Short-lived threads too: their slots come and go while changes scan them.
            s.spawn(|| {
                for _ in 0..4 {
                    thread::scope(|t| {
                        t.spawn(|| limiter.quota());
                    });
                }
            });
            s.spawn(|| {
                for _ in 0..changes {
                    limiter.set_quota(quota, Carry::Debt);
                }
            });
        });
        assert_eq!(admitted.load(Relaxed), burst as usize);
        assert!(collected(&limiter.cells));
    }
}

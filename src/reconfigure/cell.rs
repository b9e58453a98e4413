//! The engine of every reconfigurable limiter: a content (a limiter, a sharded one, a log, a
//! throttle) in cells reached through one pointer, the change that replaces the live cell, and
//! the frees once no check can be reading a replaced one. The public types wrap it.

use alloc::boxed::Box;

use crate::clock::Clock;
use crate::decision::Decision;
use crate::limiter::Limiter;
use crate::limiter::algorithm::Carry;
use crate::limiter::algorithm::Retunable;
use crate::quota::InsufficientCapacity;
use crate::quota::Quota;
use crate::reclaim;
use crate::sync::{AtomicBool, AtomicPtr, Backoff, Mutex, Ordering};
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

    /// Whether [`Cells::check`] goes through [`Content::check_one_or`] (a content whose decision
    /// is made out of line, and would be copied out of an `Option`) or loops on
    /// [`Content::check_live`]: a decision built at one place stays in registers, where one
    /// merged with `again()`'s is built in memory, and the next check's CAS waits for its stores.
    const ONE_OR_AGAIN: bool = false;

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
        if T::ONE_OR_AGAIN {
            return cell
                .content
                .check_one_or(&cell.retired, || self.check_after(cell));
        }
        self.check_from(cell)
    }

    /// [`Cells::check`] on the cells that replaced `old`, which a change retired under it;
    /// the caller's section is still open.
    #[cold]
    #[inline(never)]
    fn check_after(&self, old: &Cell<T>) -> Decision {
        self.check_from(self.replacement_of(old))
    }

    /// One token on `cell`, or on the cells that replaced it once it is found retired; the
    /// caller's section is open.
    #[inline(always)]
    fn check_from<'a>(&'a self, mut cell: &'a Cell<T>) -> Decision {
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

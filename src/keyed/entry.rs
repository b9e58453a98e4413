//! [`KeyEntry`]: one key's state word and the limiter it is checked with.

use super::store::{Relocate, Retired};
use crate::limiter::shared::KeyedLimiter;
use crate::state_cell::StateCell;

use crate::decision::Decision;
use crate::limiter::algorithm::Carry;
use crate::limiter::retire::retire_word;
use crate::limiter::shared::engine::KeyState;
use crate::quota::InsufficientCapacity;
use crate::state_cell::Step;
use crate::sync::Arc;

/// One key's entry: its state word and the shared limiter (quota and clock) it is checked with.
#[derive(Debug)]
pub struct KeyEntry<L> {
    pub(super) state: KeyState,
    pub(super) limiter: Arc<L>,
}

impl<L: KeyedLimiter> KeyEntry<L> {
    /// The check on this entry, or `None` if it is retired (the caller looks the key up again).
    #[inline]
    pub(super) fn check(
        &self,
        n: u32,
        retired: Option<&Retired>,
    ) -> Option<Result<Decision, InsufficientCapacity>> {
        if let Err(e) = InsufficientCapacity::check(n, self.limiter.quota().burst()) {
            return Some(Err(e));
        }
        match retired {
            None => Some(Ok(self.limiter.check_state(&self.state, n))),
            Some(retired) => self
                .limiter
                .take_state(&self.state, n, Some(retired.flag()))
                .map(|seen| Ok(self.limiter.decision_of(seen))),
        }
    }

    /// Gives back `n` tokens of an admission on this entry that was never used (another policy
    /// of the same request refused), never past full; nothing on a retired entry.
    #[cfg(any(feature = "tower", feature = "rls"))]
    pub(super) fn give_back(&self, n: u32, retired: Option<&Retired>) {
        self.limiter
            .give_back_state(&self.state, n, retired.map(Retired::flag));
    }

    /// The state word, taken out of use: where checks run beside the change, the entry is retired
    /// first, and every admission made on it is in the word returned; where the change holds the
    /// entry exclusively, the word is read.
    pub(super) fn retire(&self, retired: Option<&Retired>) -> u64 {
        match retired {
            Some(retired) => retire_word(&self.state.0, retired.flag()),
            // Nothing else changes the word meanwhile: the load is the last word.
            None => self.state.0.update(Step::Keep),
        }
    }

    /// The entry moved to the limiter `to` (another quota), its state carried over as `carry`
    /// says, this one retired where needed; and the instant to file it at in the eviction index (a
    /// lower bound on when its bucket is full again).
    pub(super) fn moved_to(
        &self,
        to: &Arc<L>,
        carry: Carry,
        retired: Option<&Retired>,
    ) -> (KeyEntry<L>, u64) {
        // Read before the carry reads its own: the instant returned is a lower bound.
        let before = to.now_ns();
        let word = self.retire(retired);
        let entry = KeyEntry {
            state: self.limiter.carried_state(word, to, carry),
            limiter: to.clone(),
        };
        let at = before.saturating_add(entry.reset_ns());
        (entry, at)
    }

    /// The entry as it stands, filed: the instant its bucket is full again, a lower bound.
    pub(super) fn full_at(&self) -> u64 {
        // Read before the peek reads its own.
        let before = self.limiter.now_ns();
        before.saturating_add(self.reset_ns())
    }

    /// Nanoseconds until the bucket is full again, as a peek answers now (nothing is taken).
    pub(super) fn reset_ns(&self) -> u64 {
        duration_ns(self.limiter.check_state(&self.state, 0).reset_after())
    }
}

impl<L: KeyedLimiter> KeyEntry<L> {
    /// An entry on this one's limiter holding `word`.
    fn with_word(&self, word: u64) -> KeyEntry<L> {
        KeyEntry {
            state: KeyState(StateCell::new(word)),
            limiter: self.limiter.clone(),
        }
    }
}

impl<L: KeyedLimiter> Relocate for KeyEntry<L> {
    fn relocate(&self, retired: &Retired) -> Self {
        self.with_word(retire_word(&self.state.0, retired.flag()))
    }

    #[cfg(atomic_limiter_loom)]
    fn loom_copy_in_use(&self) -> Self {
        self.with_word(self.state.0.update(Step::Keep))
    }
}

pub(super) fn duration_ns(d: core::time::Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

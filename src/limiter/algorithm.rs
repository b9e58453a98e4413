//! What an algorithm gives the shell: parameters from a quota, a full word, and one pure step.

use crate::clock::Reading;
use crate::decision::Decision;
use crate::quota::{Quota, QuotaError};
use crate::state_cell::Step;

/// An algorithm a [`Limiter`](crate::Limiter) runs on its one state word: GCRA
/// ([`GcraAlgorithm`](crate::algorithm::GcraAlgorithm)), the packed token bucket
/// ([`TokenBucketAlgorithm`](crate::algorithm::TokenBucketAlgorithm)), or a window
/// ([`WindowAlgorithm`](crate::algorithm::WindowAlgorithm)).
///
/// Sealed: the algorithms are this crate's, each written as pure arithmetic from the current word
/// and a clock reading to the word to store and the decision; the shell runs it through the one
/// compare-and-swap. Name it only in generic code (`fn f<A: Algorithm>(l: &Limiter<A>)`).
pub trait Algorithm: engine::Engine + core::fmt::Debug + Send + Sync + Sized {}

/// An algorithm that refills continuously (a token comes back every period) and accepts every
/// quota, so its limiters are built without a `Result` and can be keyed and sharded: GCRA and
/// the token bucket.
pub trait Continuous: Algorithm + engine::Total + engine::Carried {}

/// An algorithm whose state carries over to a new quota (see [`Carry`]), so its
/// limiter can be [`Reconfigurable`](crate::Reconfigurable): GCRA, the token bucket and the
/// windows.
pub trait Retunable: Algorithm + engine::Carried {}

/// What a limiter's state becomes when its quota changes
/// ([`Reconfigurable::set_quota`](crate::Reconfigurable::set_quota)).
///
/// For a window ([`Reconfigurable::try_set_quota`](crate::Reconfigurable::try_set_quota)) the
/// counts carry over: as they are (`Debt`) or scaled to the new limit, rounded up (`Proportional`), and at most the new limit. A window of
/// the same length keeps its grid; one of another length starts a new grid at the change, its
/// first window holding the counts.
///
/// Whichever is chosen, the new state is never fuller than the old one was, rounded in the
/// limiter's favour: over any stretch of time a reconfigurable limiter admits no more than the
/// old quota allows up to the change plus what the new quota allows after it.
///
/// A token bucket counts in 1/1024ths of a token, so each change may leave it a little behind the
/// exact carry: under two 1/1024ths of the new quota's period, as time (and a tick of its grid
/// when left near empty), plus what it trailed by before. That is time, not tokens: a lag of a
/// slow quota carried into a fast one can be most of a token of the fast one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Carry {
    /// The debt, as time: the limiter is full again at the same instant as before. A client that
    /// spent its burst waits as long as it would have. With GCRA a debt past a smaller new burst
    /// is kept (the client waits until it is paid down); a token bucket holds no less than
    /// nothing, so there it counts as empty.
    #[default]
    Debt,
    /// The share of the burst in use: a limiter three-quarters full stays three-quarters full,
    /// of the new burst. A debt past the whole burst (owed as time after a change to a smaller
    /// quota) counts as an empty limiter.
    Proportional,
}

pub(crate) mod engine {
    use super::*;

    /// The algorithm's side of the shell, out of the public API (the trait cannot be named outside
    /// the crate, so neither implemented nor called there).
    pub trait Engine: Sized {
        /// The parameters for `quota`, windows counted from `now_ns`; an error where the quota
        /// cannot be served (a window's limit too large for its packed counts).
        fn from_quota(quota: &Quota, now_ns: u64) -> Result<Self, QuotaError>;

        /// The most tokens one request may take.
        fn capacity(&self) -> u32;

        /// A clock reading in the units the step takes.
        fn units(&self, now_ns: u64) -> u64;

        /// The word of a limiter that is full at `now` (step units).
        fn full_word(&self, now: u64) -> u64;

        /// What a step answers: a [`Decision`], or for an algorithm that may ask for a fresh
        /// reading, an `Option` of one.
        type Answer: Answer<Self>;

        /// One decision for `n <= capacity` tokens at `now` (step units), with the reading trusted
        /// as `reading` says (waits are rounded to the clock's resolution when the answer becomes
        /// a decision, [`Answer::decide`]). An answer of `None` asks for a fresh reading (the token bucket's possibly stale one). A denial kept on a stale word
        /// must stand for every later word (argued per algorithm on its step).
        fn step(&self, word: u64, now: u64, n: u32, reading: Reading) -> Step<Self::Answer>;

        /// The step's answer on the same word at the reading `later`, taken after that word was
        /// loaded, when `answer`, a denial made at the reading `made` (step units), tells it
        /// cheaply and it is a denial again: then a denial on a coarse clock needs no second
        /// step, its word having been current between the two readings. `None` where the
        /// algorithm cannot tell cheaply.
        #[inline(always)]
        fn answer_at(&self, answer: &Self::Answer, made: u64, later: u64) -> Option<Self::Answer> {
            let _ = (answer, made, later);
            None
        }
    }

    /// A step's answer for the algorithm `A`: what the CAS loop carries out of a step, turned into
    /// a [`Decision`] once the loop is done. Every algorithm answers two words (they come back
    /// out of the CAS loop in registers, and the 48-byte decision is built once, where it is used,
    /// instead of in the loop and copied out). Only the bucket's answer can ask for a fresh
    /// reading; for the others the shell's path for that request compiles away.
    pub trait Answer<A>: Copy {
        /// Whether an answer of this type can ask for a fresh reading at all (known statically,
        /// so that code after the CAS loop can drop that path).
        const MAY_RECHECK: bool = false;

        /// The decision made at `now` (step units), or `None` for "decide again on a fresh
        /// reading".
        fn decide(self, algorithm: &A, now: u64, resolution: u64) -> Option<Decision>;

        /// Whether the request passed.
        fn is_allowed(&self) -> bool;

        /// Whether this answer asks for a fresh reading (only one that [`Answer::MAY_RECHECK`]).
        #[inline(always)]
        fn is_recheck(&self) -> bool {
            false
        }

        /// Whether this is the final decision: not one made on a reading that may be stale, nor
        /// a denial made on a `coarse` clock (those are made again on a fresh reading).
        #[inline(always)]
        fn is_final(&self, coarse: bool) -> bool {
            self.is_allowed() || (!coarse && !self.is_recheck())
        }

        /// The decision of an answer that [`Answer::is_final`].
        #[inline(always)]
        fn into_final(self, algorithm: &A, now: u64, resolution: u64) -> Decision {
            crate::limiter::retire::settle(self.decide(algorithm, now, resolution))
        }
    }

    /// A retunable algorithm's part: its state carried over to new parameters.
    pub trait Carried {
        /// Aligns new parameters with the old ones where the carried state needs it (a window
        /// of the same length keeps the old grid); called before [`Carried::carry`].
        fn follow(&mut self, from: &Self) {
            let _ = from;
        }

        /// The word that carries `word` (at `now`, in this algorithm's units) over to `to`
        /// (`now_to` in its units), as `how` says, never fuller than `word` was.
        fn carry(&self, word: u64, now: u64, to: &Self, now_to: u64, how: Carry) -> u64;
    }

    /// A continuous algorithm's part: parameters, which every quota has, and giving back.
    pub trait Total {
        /// The parameters for `quota`.
        fn continuous(quota: &Quota) -> Self;

        /// The word with `n` tokens taken moments ago given back, never past full; `None` when
        /// nothing changes (a gather across shards, undone half-way).
        fn give_back(&self, word: u64, now: u64, n: u32) -> Option<u64>;

        /// The word with a charge of `taken` tokens that stored `stored` settled at `actual`
        /// tokens, at `now`: an excess taken (into debt where the algorithm holds debt), a surplus
        /// given back only while the word is still `stored` (the charge is the latest change).
        /// `None` when nothing changes.
        fn settle(&self, word: u64, now: u64, stored: u64, taken: u32, actual: u32) -> Option<u64>;
    }
}

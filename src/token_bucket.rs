mod carry;
pub(crate) mod layout;
#[cfg(test)]
mod math_tests;
mod refill;

use self::layout::BucketParams;
use self::refill::Outcome;
use crate::clock::{Clock, DefaultClockOrNone, Reading};
use crate::decision::bucket::BucketFigures;
use crate::decision::{Decision, Detail};
use crate::limiter::Limiter;
use core::num::NonZeroU64;

use crate::limiter::algorithm::engine::{Answer, Carried, Engine, Total};
use crate::limiter::algorithm::{Algorithm, Carry, Continuous, Retunable};
use crate::quota::{Quota, QuotaError};
use crate::state_cell::Step;

/// A lock-free token bucket: fixed-point tokens and the tick of the last refill packed in one
/// `AtomicU64`, refilled lazily on each check.
///
/// It admits what [`Gcra`](crate::Gcra) admits, within its fixed-point resolution: tokens are
/// counted in 1/1024ths and time in ticks of at most 1/1024 of the period. It never admits a
/// request the exact model refuses; it may refuse one while the exact count exceeds the request by
/// less than 2/1024 of a token plus one tick's refill, and its waits are never shorter than exact.
/// Refills below the cap never drift (see `docs/design.md`). Choose it when you want the state to
/// *be* a token count; choose GCRA when you want exact figures and the longest idle horizon.
///
/// # Examples
///
/// A burst, a denial, and the bucket filling back up:
///
/// ```
/// use atomic_limiter::{ManualClock, Quota, RateLimiter, TokenBucket};
/// use std::time::Duration;
///
/// let clock = ManualClock::new();
/// let bucket = TokenBucket::with_clock(Quota::per_second(100).with_burst(10), clock.clone());
/// assert!(bucket.check_n(10).unwrap().is_allowed());
/// let d = bucket.check();
/// assert!(d.is_denied());
/// clock.advance(d.reset_after());
/// assert_eq!(bucket.check_n(0).unwrap().remaining(), 10);
/// ```
///
/// # Layout
///
/// The low `token_bits` bits hold the tokens in fixed point (10 fraction bits), just wide enough for
/// `burst × 1024`; the other `64 - token_bits` bits (33 to 53) hold the tick of the last refill,
/// wrapping. The tick is the largest power of two nanoseconds not above `period / 1024`, coarsened
/// for very large bursts so that sixteen fill times fit in one stamp cycle.
///
/// # Horizons
///
/// An idle of up to [`TokenBucket::idle_horizon`] (three quarters of the stamp cycle) is read
/// exactly; a clock stepping back by up to [`TokenBucket::backward_tolerance`] (a quarter cycle)
/// grants nothing. For `per_second(100).with_burst(10)` these are 219 and 73 years; for a
/// nanosecond tick (periods under 1024 ns) they are `3/4 × 2^(64 - token_bits)` ns, days rather
/// than years. Beyond them see `docs/design.md`; [`Gcra`](crate::Gcra)'s horizon is at least a
/// year for every quota.
///
/// # Methods
///
/// `TokenBucket` is a [`Limiter`] running [`TokenBucketAlgorithm`]: [`new`](Limiter::new),
/// [`with_clock`](Limiter::with_clock), [`check`](Limiter::check),
/// [`check_n`](Limiter::check_n), [`quota`](Limiter::quota) and [`clock`](Limiter::clock) are the
/// shell's; [`TokenBucket::idle_horizon`], [`TokenBucket::backward_tolerance`] and
/// [`TokenBucket::tick`] are the bucket's own.
pub type TokenBucket<C = DefaultClockOrNone> = Limiter<TokenBucketAlgorithm, C>;

/// The token bucket's parameters: the word's layout, the tick and the refill rate in fixed point.
/// The algorithm [`TokenBucket`] runs.
#[derive(Debug, Clone, Copy)]
pub struct TokenBucketAlgorithm(BucketParams);

impl Algorithm for TokenBucketAlgorithm {}
impl Continuous for TokenBucketAlgorithm {}
impl Retunable for TokenBucketAlgorithm {}

impl Carried for TokenBucketAlgorithm {
    /// In nanoseconds: the bucket reads them as its units.
    fn carry(&self, word: u64, now: u64, to: &Self, _now_to: u64, how: Carry) -> u64 {
        let proportional = matches!(how, Carry::Proportional);
        carry::carry(word, now, &self.0, &to.0, proportional)
    }
}

impl Total for TokenBucketAlgorithm {
    fn continuous(quota: &Quota) -> TokenBucketAlgorithm {
        TokenBucketAlgorithm(BucketParams::new(quota))
    }

    /// Never past the cap, re-phased like any bucket that fills.
    fn give_back(&self, word: u64, now: u64, n: u32) -> Option<u64> {
        carry::give_back(
            word,
            now,
            u64::from(n) * crate::decision::bucket::UNIT,
            &self.0,
        )
    }

    /// An excess is taken down to empty, no further: a bucket holds no debt.
    fn settle(&self, word: u64, now: u64, stored: u64, taken: u32, actual: u32) -> Option<u64> {
        carry::settle(word, now, stored, taken, actual, &self.0)
    }
}

/// What the bucket's step carries out of the CAS loop: two words, in registers (three fields
/// would be returned through memory, and read back wider than written); the decision is built
/// from them, the reading and the parameters once the loop is done.
///
/// `meta`, low to high:
///
/// | bits | what |
/// |---|---|
/// | 0 to 31 | units held after the decision, plus one: never 0, so that `meta` is not either (a niche for `Option`, a reconfigurable limiter's step); for a sure refusal, the tokens asked, plus one |
/// | 32 to 63 | units the request lacked: 0 when allowed; all ones ([`BucketAnswer::RECHECK`]) asks for a fresh reading; all ones but the lowest ([`BucketAnswer::REFUSED`]) is a sure refusal (a real lack is at most the cap, below 2^31) |
///
/// A sure refusal ([`refill::surely_refused`]) keeps the word it was told on in `ahead`, and its
/// figures are worked out from it when the decision is built: a check that reads only the
/// verdict drops that work with the rest of the decision it does not read.
#[derive(Debug, Clone, Copy)]
pub struct BucketAnswer {
    /// Ticks from the reading's tick to the one refills count from; the word, for a sure refusal.
    ahead: u64,
    meta: NonZeroU64,
}

impl BucketAnswer {
    const TOKENS: u64 = (1 << 32) - 1;
    const NEED_SHIFT: u32 = 32;
    const RECHECK: u32 = u32::MAX;
    const REFUSED: u32 = u32::MAX - 1;

    /// A sure refusal of `n` tokens on `word`, its figures not worked out yet.
    #[inline(always)]
    fn refused(word: u64, n: u32) -> BucketAnswer {
        BucketAnswer::new(word, n, BucketAnswer::REFUSED)
    }

    /// The answer with its figures, worked out at `now` if it is a sure refusal.
    #[inline(always)]
    fn worked_out(self, p: &BucketParams, now: u64) -> BucketAnswer {
        if self.need() == BucketAnswer::REFUSED {
            BucketAnswer::of(refill::refused(self.ahead, now, self.tokens(), p))
        } else {
            self
        }
    }

    #[inline(always)]
    fn new(ahead: u64, tokens: u32, need: u32) -> BucketAnswer {
        // At most the cap, below 2^31: one more neither wraps nor leaves the low half.
        let low = u64::from(tokens) + 1;
        BucketAnswer {
            ahead,
            meta: NonZeroU64::new((u64::from(need) << Self::NEED_SHIFT) | low)
                .unwrap_or(NonZeroU64::MAX),
        }
    }

    #[inline(always)]
    fn of(figures: BucketFigures) -> BucketAnswer {
        BucketAnswer::new(figures.ahead, figures.tokens, figures.need)
    }

    #[inline(always)]
    fn tokens(&self) -> u32 {
        // The low half, less the one added.
        ((self.meta.get() & Self::TOKENS) - 1) as u32
    }

    #[inline(always)]
    fn need(&self) -> u32 {
        (self.meta.get() >> Self::NEED_SHIFT) as u32
    }
}

impl Answer<TokenBucketAlgorithm> for BucketAnswer {
    const MAY_RECHECK: bool = true;

    #[inline(always)]
    fn decide(self, bucket: &TokenBucketAlgorithm, now: u64, resolution: u64) -> Option<Decision> {
        if self.is_recheck() {
            return None;
        }
        let p = &bucket.0;
        let answer = self.worked_out(p, now);
        let figures = BucketFigures {
            now_ns: now,
            rate: p.rate,
            ahead: answer.ahead,
            tokens: answer.tokens(),
            need: answer.need(),
            burst: p.burst,
            // At most 63.
            shift: p.shift as u8,
        };
        Some(Decision::new(
            self.is_allowed(),
            resolution,
            Detail::Bucket(figures),
        ))
    }

    #[inline(always)]
    fn is_allowed(&self) -> bool {
        self.need() == 0
    }

    #[inline(always)]
    fn is_recheck(&self) -> bool {
        self.need() == BucketAnswer::RECHECK
    }
}

impl Engine for TokenBucketAlgorithm {
    type Answer = BucketAnswer;

    fn from_quota(quota: &Quota, _now_ns: u64) -> Result<TokenBucketAlgorithm, QuotaError> {
        Ok(TokenBucketAlgorithm::continuous(quota))
    }

    #[inline]
    fn capacity(&self) -> u32 {
        self.0.burst
    }

    /// The bucket reads nanoseconds.
    #[inline]
    fn units(&self, now_ns: u64) -> u64 {
        now_ns
    }

    fn full_word(&self, now: u64) -> u64 {
        self.0.full(now)
    }

    /// A denial decided on a stale word stands for any later word too: later words hold no more
    /// tokens at any given time (admissions only take, refills are capped the same way). A reading
    /// far behind the stamp on a monotonic clock may be stale: `Keep(None)` asks for a fresh one.
    #[inline(always)]
    fn step(&self, word: u64, now: u64, n: u32, reading: Reading) -> Step<BucketAnswer> {
        if refill::surely_refused(word, now, n, &self.0) {
            return Step::Keep(BucketAnswer::refused(word, n));
        }
        match refill::decide(word, now, n, &self.0, reading) {
            Outcome::Deny { figures } => Step::Keep(BucketAnswer::of(figures)),
            Outcome::Allow { figures, .. } if n == 0 => Step::Keep(BucketAnswer::of(figures)),
            Outcome::Allow { word, figures } => Step::Store(BucketAnswer::of(figures), word),
            Outcome::Recheck => Step::Keep(BucketAnswer::new(0, 0, BucketAnswer::RECHECK)),
        }
    }

    /// A denial that depends on its reading only through the tick ([`refill::denial_stands`]), or
    /// carried to a later tick ([`refill::denial_carried`]).
    #[inline(always)]
    fn answer_at(&self, answer: &BucketAnswer, made: u64, later: u64) -> Option<BucketAnswer> {
        if answer.is_allowed() || answer.is_recheck() {
            return None;
        }
        // A sure refusal that is sure at the later reading too: the step's answer there.
        if answer.need() == BucketAnswer::REFUSED
            && refill::surely_refused(answer.ahead, later, answer.tokens(), &self.0)
        {
            return Some(*answer);
        }
        let answer = answer.worked_out(&self.0, made);
        let held = u64::from(answer.tokens());
        if refill::denial_stands(held, made, later, &self.0) {
            return Some(answer);
        }
        let denial = (answer.ahead, held, u64::from(answer.need()));
        let (ahead, held, need) = refill::denial_carried(denial, made, later, &self.0)?;
        // Both below the cap, under 2^31 (`MAX_TOKEN_BITS`).
        Some(BucketAnswer::new(ahead, held as u32, need as u32))
    }
}

impl<C: Clock> TokenBucket<C> {
    /// The longest idle after which the bucket is still read exactly (full once the fill time
    /// has passed): the stamp cycle less a millisecond on a monotonic clock
    /// ([`Clock::is_monotonic`]), three quarters of it on others, each less one tick. An idle of
    /// exactly this long is read exactly; longer idles are read modulo the cycle; see
    /// `docs/design.md`.
    pub fn idle_horizon(&self) -> core::time::Duration {
        let monotonic = self.clock().is_monotonic();
        core::time::Duration::from_nanos(self.algorithm().0.idle_horizon_ns(monotonic))
    }

    /// The largest backwards clock step the bucket tells apart from a long idle; up to it, a
    /// backwards step refills nothing and grants nothing. A quarter of the stamp cycle on a clock
    /// that may step back; on a monotonic one, the millisecond its cores may differ by (stale
    /// readings from other threads are settled by a fresh one, whatever their age up to half
    /// the cycle).
    pub fn backward_tolerance(&self) -> core::time::Duration {
        let monotonic = self.clock().is_monotonic();
        core::time::Duration::from_nanos(self.algorithm().0.backward_tolerance_ns(monotonic))
    }

    /// The length of one tick, the bucket's time resolution.
    pub fn tick(&self) -> core::time::Duration {
        core::time::Duration::from_nanos(self.algorithm().0.tick_ns())
    }
}

#[cfg(all(test, not(atomic_limiter_loom)))]
mod tests {
    use super::*;
    use crate::clock::ManualClock;

    /// Four threads on a frozen clock take exactly the burst (through the CAS retry path).
    #[test]
    fn threads_on_a_frozen_clock_take_exactly_the_burst() {
        let burst = if cfg!(miri) { 6 } else { 1000 };
        let bucket =
            TokenBucket::with_clock(Quota::per_second(1).with_burst(burst), ManualClock::new());
        let admitted: u32 = std::thread::scope(|s| {
            let hs: Vec<_> = (0..4)
                .map(|_| s.spawn(|| (0..burst).filter(|_| bucket.check().is_allowed()).count()))
                .collect();
            hs.into_iter().map(|h| h.join().unwrap() as u32).sum()
        });
        assert_eq!(admitted, burst);
    }
}

use core::time::Duration;

pub(crate) mod bucket;
pub(crate) mod time;

use self::bucket::BucketFigures;
use self::time::TimeFigures;

/// The answer to one check: allowed or not, and everything a `429` response needs.
///
/// A decision is a small value computed from the one clock reading and the one state word the
/// check used (48 bytes). The figures are derived lazily: [`Decision::is_allowed`] is a field read, while
/// [`remaining`](Decision::remaining), [`retry_after`](Decision::retry_after) and
/// [`reset_after`](Decision::reset_after) each do the one division they need only when called.
///
/// # Examples
///
/// Filling the headers of a denied HTTP request:
///
/// ```
/// use atomic_limiter::{Gcra, ManualClock, Quota, RateLimiter};
/// use std::time::Duration;
///
/// let clock = ManualClock::new();
/// let limiter = Gcra::with_clock(Quota::per_second(2), clock.clone());
/// assert!(limiter.check().is_allowed());
/// assert!(limiter.check().is_allowed());
/// let d = limiter.check();
/// assert!(!d.is_allowed());
/// assert_eq!(d.remaining(), 0);
/// assert_eq!(d.retry_after(), Duration::from_millis(500)); // Retry-After
/// assert_eq!(d.reset_after(), Duration::from_secs(1));     // RateLimit-Reset
/// ```
#[derive(Clone, Copy, PartialEq, Eq)]
#[must_use = "a decision says whether the request may go ahead and what to tell its caller"]
pub struct Decision {
    /// The figures of a [`Detail`], flat: which words mean what is told by `kind` (see
    /// [`Decision::new`]). Flat, so that the decision is 48 bytes and `allowed` sits at one offset
    /// for every kind (a field read, not a match).
    words: [u64; 3],
    counts: [u32; 3],
    /// Clock resolution in ns; waits are rounded up to it.
    resolution: u64,
    kind: Kind,
    /// Whether the request may proceed (with [`SHADOWED`] in `by`, only because of shadow mode).
    allowed: bool,
    /// GCRA's scale, or the bucket's tick shift.
    small: u8,
    /// Which path decided (a [`DecidedBy`] as its byte), and [`SHADOWED`]: the decision's last
    /// spare byte, shared so that the verdict stays a `bool` (the windows' steps, which then carried
    /// a whole decision through their CAS loop, lost 3 to 5 ns when it became a byte with flags).
    by: u8,
}

/// In a decision's `by` byte: the limiter refused the request and shadow mode let it through
/// ([`Decision::shadow`]). Above every [`DecidedBy`] value.
const SHADOWED: u8 = 0x80;

/// Which path made a decision: this process's own limiter, or, for the distributed limiters, the
/// shared store, a local lease, or a failure policy while the store could not be reached.
///
/// Every limiter of the core answers [`DecidedBy::Local`]; the others come from the `redis`
/// feature's limiters, and a service may count them (how many requests were let through blind
/// while Redis was down, say).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
#[repr(u8)]
pub enum DecidedBy {
    /// A limiter in this process, on its own state.
    #[default]
    Local = 0,
    /// The shared store answered this very request (one round trip).
    Store = 1,
    /// Tokens leased earlier from the shared store, spent locally without a round trip.
    Lease = 2,
    /// The store could not answer in time and the policy admits: fail open.
    FailOpen = 3,
    /// The store could not answer in time and the policy refuses: fail closed.
    FailClosed = 4,
    /// The store could not answer in time and a local limiter with this node's share of the
    /// quota decided: fail local.
    FailLocal = 5,
}

/// Which [`Detail`] a decision holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Time,
    Bucket,
    Eager,
    TableFull,
}

/// The raw figures each algorithm leaves behind, turned into durations on demand.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Detail {
    /// GCRA's figures, in its units.
    Time(TimeFigures),
    /// The packed token bucket's figures.
    Bucket(BucketFigures),
    /// Figures already computed, in whole tokens and nanoseconds (windows, mutex baselines, a
    /// gather across shards).
    Eager {
        retry_ns: u64,
        reset_ns: u64,
        remaining: u32,
        /// The most tokens the limiter holds (its burst, or a window's limit).
        limit: u32,
    },
    /// A keyed limiter's table is full: a new key is refused until a held key's bucket is full
    /// again, `retry_ns` from now.
    #[cfg_attr(not(feature = "std"), allow(dead_code))]
    TableFull { retry_ns: u64, limit: u32 },
}

/// A count as a `u32` field of a decision, saturating (counts here are at most a burst or a
/// window's limit, both below 2^32).
#[inline]
pub(crate) fn count32(n: u64) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

impl Decision {
    /// A decision from the figures (packed flat; [`Decision::detail`] unpacks them).
    #[inline(always)]
    pub(crate) const fn new(allowed: bool, resolution: u64, detail: Detail) -> Decision {
        let (kind, (words, counts, small)) = match detail {
            Detail::Time(figures) => (Kind::Time, figures.flat()),
            Detail::Bucket(figures) => (Kind::Bucket, figures.flat()),
            Detail::Eager {
                retry_ns,
                reset_ns,
                remaining,
                limit,
            } => (
                Kind::Eager,
                ([retry_ns, reset_ns, 0], [remaining, limit, 0], 0),
            ),
            Detail::TableFull { retry_ns, limit } => {
                (Kind::TableFull, ([retry_ns, 0, 0], [limit, 0, 0], 0))
            }
        };
        Decision {
            words,
            counts,
            resolution,
            kind,
            allowed,
            small,
            by: DecidedBy::Local as u8,
        }
    }

    /// This decision as shadow mode gives it: allowed whatever the limiter said, so that a new
    /// limit can be watched before it is enforced. Everything else is the limiter's:
    /// [`would_allow`](Decision::would_allow) tells its own verdict,
    /// [`is_shadowed`](Decision::is_shadowed) whether only shadow mode let the request through,
    /// and the figures (a refusal's [`retry_after`](Decision::retry_after) included) are those
    /// it would have answered. The tokens of a request the limiter admitted were taken as usual;
    /// a refused one took none.
    ///
    /// ```
    /// use atomic_limiter::{Gcra, ManualClock, Quota, RateLimiter};
    /// use std::time::Duration;
    ///
    /// let limiter = Gcra::with_clock(Quota::per_second(1), ManualClock::new());
    /// assert!(limiter.check().shadow().would_allow());
    /// let d = limiter.check().shadow();
    /// assert!(d.is_allowed() && !d.would_allow() && d.is_shadowed());
    /// assert_eq!(d.retry_after(), Duration::from_secs(1)); // what the 429 would have said
    /// ```
    #[inline]
    pub const fn shadow(mut self) -> Decision {
        if !self.allowed {
            self.allowed = true;
            self.by |= SHADOWED;
        }
        self
    }

    /// What the limiter itself decided: [`is_allowed`](Decision::is_allowed) but for a decision
    /// that shadow mode let through ([`Decision::shadow`]).
    #[inline]
    pub const fn would_allow(&self) -> bool {
        self.allowed && !self.is_shadowed()
    }

    /// Whether the limiter refused this request and only shadow mode let it through.
    #[inline]
    pub const fn is_shadowed(&self) -> bool {
        self.by & SHADOWED != 0
    }

    /// The refusal of a request that no wait lets through (more tokens than a burst of `limit`
    /// holds): `retry_after` is forever.
    pub(crate) const fn never(limit: u32) -> Decision {
        Decision::new(
            false,
            1,
            Detail::Eager {
                remaining: 0,
                retry_ns: u64::MAX,
                reset_ns: u64::MAX,
                limit,
            },
        )
    }

    /// The same decision, marked as made by `by`.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    #[inline]
    pub(crate) const fn decided_by_(mut self, by: DecidedBy) -> Decision {
        self.by = (self.by & SHADOWED) | by as u8;
        self
    }

    /// Which path made this decision ([`DecidedBy::Local`] for every limiter of the core).
    #[inline]
    pub const fn decided_by(&self) -> DecidedBy {
        match self.by & !SHADOWED {
            1 => DecidedBy::Store,
            2 => DecidedBy::Lease,
            3 => DecidedBy::FailOpen,
            4 => DecidedBy::FailClosed,
            5 => DecidedBy::FailLocal,
            _ => DecidedBy::Local,
        }
    }

    /// The figures, unpacked.
    #[inline]
    const fn detail(&self) -> Detail {
        let [w0, w1, _] = self.words;
        let [c0, c1, _] = self.counts;
        match self.kind {
            Kind::Time => Detail::Time(TimeFigures::from_flat(self.words, self.counts, self.small)),
            Kind::Bucket => Detail::Bucket(BucketFigures::from_flat(
                self.words,
                self.counts,
                self.small,
            )),
            Kind::Eager => Detail::Eager {
                retry_ns: w0,
                reset_ns: w1,
                remaining: c0,
                limit: c1,
            },
            Kind::TableFull => Detail::TableFull {
                retry_ns: w0,
                limit: c0,
            },
        }
    }

    /// Whether the request may proceed (its tokens were taken).
    #[inline]
    pub const fn is_allowed(&self) -> bool {
        self.allowed
    }

    /// Whether the request was refused (nothing was taken).
    #[inline]
    pub const fn is_denied(&self) -> bool {
        !self.is_allowed()
    }

    /// Whether a [`Keyed`](crate::Keyed) limiter refused a new key because its table holds
    /// `max_keys` keys and none of their buckets is full yet: not the key's rate, but the
    /// service's capacity (answer `503`, not `429`, and count it apart). `retry_after` is when the
    /// first held key can make room.
    #[inline]
    pub const fn is_table_full(&self) -> bool {
        matches!(self.kind, Kind::TableFull)
    }

    /// The bucket's figures, when this is a bucket's decision (only then asked).
    #[inline]
    fn bucket(&self) -> BucketFigures {
        BucketFigures::from_flat(self.words, self.counts, self.small)
    }

    /// GCRA's figures, when this is a GCRA decision (only then asked).
    #[inline(always)]
    fn time(&self) -> TimeFigures {
        TimeFigures::from_flat(self.words, self.counts, self.small)
    }

    /// A bucket's wait, out of line: the bucket's arithmetic needs many registers, and inlined
    /// into `retry_after` it would make every other kind's path save them too.
    #[inline(never)]
    fn bucket_wait_ns(&self) -> u64 {
        self.bucket().wait_ns()
    }

    /// A bucket's time until full, out of line as [`Decision::bucket_wait_ns`].
    #[inline(never)]
    fn bucket_reset_ns(&self) -> u64 {
        self.bucket().reset_ns()
    }

    /// Whole tokens left after this decision.
    pub fn remaining(&self) -> u64 {
        match self.detail() {
            Detail::Time(figures) => figures.remaining(),
            Detail::Bucket(figures) => figures.remaining(),
            Detail::Eager { remaining, .. } => u64::from(remaining),
            Detail::TableFull { .. } => 0,
        }
    }

    /// `Duration::ZERO` when allowed; otherwise the shortest wait after which the same request
    /// passes if nobody else takes tokens in between, rounded up to the clock's resolution. Waiting
    /// exactly this long never earns a second denial. (For a decision shadow mode let through,
    /// the wait the refusal would have given.)
    #[inline]
    pub fn retry_after(&self) -> Duration {
        if self.would_allow() {
            return Duration::ZERO;
        }
        // Read straight from the fields (see `Decision::new`): this is on a refusal's path.
        let ns = match self.kind {
            Kind::Time => self.time().wait_ns(),
            Kind::Bucket => self.bucket_wait_ns(),
            Kind::Eager | Kind::TableFull => self.words[0],
        };
        Duration::from_nanos(round_up(ns, self.resolution))
    }

    /// The most tokens the limiter holds: its burst, or a window limiter's limit per window
    /// (for a `RateLimit-Limit`-style header).
    pub fn limit(&self) -> u64 {
        match self.detail() {
            Detail::Time(figures) => u64::from(figures.burst),
            Detail::Bucket(figures) => u64::from(figures.burst),
            Detail::Eager { limit, .. } | Detail::TableFull { limit, .. } => u64::from(limit),
        }
    }

    /// [`Decision::retry_after`] in whole seconds, rounded **up**, for an HTTP `Retry-After`
    /// header (which takes integer seconds): 0 when allowed, at least 1 when refused, so that a
    /// client waiting it is never early. (`retry_after().as_secs()` would round 400 ms down to 0.)
    ///
    /// ```
    /// use atomic_limiter::{Gcra, ManualClock, Quota};
    ///
    /// let limiter = Gcra::with_clock(Quota::per_second(2).with_burst(1), ManualClock::new());
    /// assert_eq!(limiter.check().retry_after_secs(), 0);
    /// let denied = limiter.check();
    /// assert_eq!(denied.retry_after().as_millis(), 500);
    /// assert_eq!(denied.retry_after_secs(), 1);
    /// ```
    pub fn retry_after_secs(&self) -> u64 {
        let wait = self.retry_after();
        if self.would_allow() {
            0
        } else {
            (wait.as_secs() + u64::from(wait.subsec_nanos() > 0)).max(1)
        }
    }

    /// The time until one more whole token is back (zero when the limiter is full), rounded up to
    /// the clock's resolution: when "additional quota is made available", the `t` of a `RateLimit`
    /// header. Never later than [`reset_after`](Decision::reset_after); for a refused request of
    /// one token, the same as [`retry_after`](Decision::retry_after). A window limiter's tokens
    /// come back when its window ends, so for it this is the reset (or the retry-after, if sooner).
    ///
    /// ```
    /// use atomic_limiter::{Gcra, ManualClock, Quota};
    /// use std::time::Duration;
    ///
    /// let limiter = Gcra::with_clock(Quota::per_second(10), ManualClock::new());
    /// let d = (0..3).map(|_| limiter.check()).last().unwrap();
    /// assert_eq!(d.remaining(), 7);
    /// assert_eq!(d.next_token_after(), Duration::from_millis(100)); // one token back
    /// assert_eq!(d.reset_after(), Duration::from_millis(300)); // all three back
    /// ```
    pub fn next_token_after(&self) -> Duration {
        let ns = match self.detail() {
            Detail::Time(figures) => figures.next_token_ns(),
            Detail::Bucket(figures) => figures.next_token_ns(),
            Detail::Eager {
                retry_ns,
                reset_ns,
                remaining,
                limit,
            } => {
                if remaining >= limit {
                    0
                } else if retry_ns > 0 {
                    retry_ns.min(reset_ns)
                } else {
                    reset_ns
                }
            }
            Detail::TableFull { retry_ns, .. } => retry_ns,
        };
        Duration::from_nanos(round_up(ns, self.resolution))
    }

    /// The time until the limiter is full again (every token back), rounded up to the clock's
    /// resolution.
    pub fn reset_after(&self) -> Duration {
        let ns = match self.kind {
            Kind::Time => self.time().reset_ns(),
            Kind::Bucket => self.bucket_reset_ns(),
            Kind::Eager => self.words[1],
            Kind::TableFull => self.words[0],
        };
        Duration::from_nanos(round_up(ns, self.resolution))
    }
}

/// In user terms: the figures, not the units they are kept in.
impl core::fmt::Debug for Decision {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let mut s = f.debug_struct("Decision");
        s.field("allowed", &self.is_allowed());
        if self.is_shadowed() {
            s.field("shadowed", &true);
        }
        if self.is_table_full() {
            s.field("table_full", &true);
        }
        if self.decided_by() != DecidedBy::Local {
            s.field("decided_by", &self.decided_by());
        }
        s.field("remaining", &self.remaining())
            .field("limit", &self.limit())
            .field("retry_after", &self.retry_after())
            .field("reset_after", &self.reset_after())
            .finish()
    }
}

/// One line for a log: `allowed: 9 of 10 left, full in 100ms`, or
/// `denied: 0 of 10 left, retry after 100ms, full in 1s`, or `denied: table full, retry after 3s`;
/// a refusal shadow mode let through reads `allowed in shadow, would deny: ...`.
impl core::fmt::Display for Decision {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        if self.is_shadowed() {
            f.write_str("allowed in shadow, would deny: ")?;
        }
        if self.is_table_full() {
            if !self.is_shadowed() {
                f.write_str("denied: ")?;
            }
            return write!(f, "table full, retry after {:?}", self.retry_after());
        }
        let verdict = if self.is_shadowed() {
            ""
        } else if self.is_allowed() {
            "allowed: "
        } else {
            "denied: "
        };
        write!(f, "{verdict}{} of {} left", self.remaining(), self.limit())?;
        if !self.would_allow() {
            write!(f, ", retry after {:?}", self.retry_after())?;
        }
        write!(f, ", full in {:?}", self.reset_after())
    }
}

/// Rounds a wait up so that a clock of this resolution has surely moved that far: to the next
/// multiple of the resolution, plus one step because a coarse reading trails real time by up to
/// one step. Exact (unchanged) for nanosecond clocks.
fn round_up(ns: u64, resolution: u64) -> u64 {
    if ns == 0 || resolution <= 1 {
        ns
    } else {
        ns.div_ceil(resolution)
            .saturating_mul(resolution)
            .saturating_add(resolution)
    }
}

#[cfg(all(test, not(atomic_limiter_loom)))]
mod tests {
    use super::*;

    /// A decision is returned on every check: it stays six words (it was fourteen when the bucket's
    /// variant carried its whole parameter block, and the copies showed in the deny path).
    #[test]
    fn a_decision_is_six_words() {
        assert_eq!(core::mem::size_of::<Decision>(), 48);
    }

    /// Who decided and whether shadow mode let it through share a byte: each survives the other.
    #[test]
    fn decided_by_and_shadow_share_a_byte_without_mixing() {
        let all = [
            DecidedBy::Local,
            DecidedBy::Store,
            DecidedBy::Lease,
            DecidedBy::FailOpen,
            DecidedBy::FailClosed,
            DecidedBy::FailLocal,
        ];
        let refusal = Decision::never(3);
        for by in all {
            let d = refusal.decided_by_(by);
            assert_eq!(d.decided_by(), by);
            assert!(!d.is_shadowed() && d.is_denied());
            let s = d.shadow();
            assert_eq!(s.decided_by(), by);
            assert!(s.is_shadowed() && s.is_allowed() && !s.would_allow());
            // Marked after shadowing, as a store's answer can be.
            assert!(refusal.shadow().decided_by_(by).is_shadowed());
            assert_eq!(refusal.shadow().decided_by_(by).decided_by(), by);
        }
        // An admission is not changed by shadow mode.
        let admitted = Decision::new(
            true,
            1,
            Detail::Eager {
                retry_ns: 0,
                reset_ns: 0,
                remaining: 1,
                limit: 2,
            },
        );
        assert_eq!(admitted.shadow(), admitted);
        assert!(admitted.would_allow() && !admitted.is_shadowed());
    }

    /// Packing and unpacking keep every figure of every kind, at their widest.
    #[test]
    fn every_kind_round_trips_through_the_flat_layout() {
        let kinds = [
            Detail::Time(TimeFigures {
                after: u64::MAX - 1,
                wait: u64::MAX,
                token: 3,
                burst: u32::MAX,
                scale: 128,
            }),
            Detail::Bucket(BucketFigures {
                now_ns: u64::MAX,
                rate: 1 << 63,
                ahead: 1 << 53,
                tokens: (1 << 31) - 1,
                need: 1 << 30,
                burst: 1 << 21,
                shift: 63,
            }),
            Detail::Eager {
                retry_ns: 7,
                reset_ns: u64::MAX,
                remaining: u32::MAX,
                limit: u32::MAX - 1,
            },
            Detail::TableFull {
                retry_ns: u64::MAX,
                limit: 9,
            },
        ];
        for detail in kinds {
            for allowed in [false, true] {
                let d = Decision::new(allowed, 1_000_000, detail);
                assert_eq!(d.detail(), detail);
                assert_eq!(d.is_allowed(), allowed);
                assert_eq!(d.resolution, 1_000_000);
                assert_eq!(d.decided_by(), DecidedBy::Local);
                assert_eq!(d.decided_by_(DecidedBy::FailLocal).detail(), detail);
                assert_eq!(
                    d.is_table_full(),
                    matches!(detail, Detail::TableFull { .. })
                );
            }
        }
    }
}

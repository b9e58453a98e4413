//! The exact reference model and helpers shared by the integration tests.
#![allow(dead_code)]

use atomic_limiter::Quota;

/// The quota semantics with exact rational arithmetic, written independently of the crate's maths:
/// tokens are `num / per` (an `i128` numerator), refilled by `elapsed × rate` per ns and capped
/// at `burst × per`, where `per / rate` ns is the period the limiters keep
/// (`Quota::period_fraction`: the quota's own `per / rate` when exact, else rounded up). Time only moves forward in the model: a reading earlier than the last one
/// counts as no time passing.
#[derive(Debug, Clone)]
pub struct Model {
    rate: i128,
    per: i128,
    burst: i128,
    num: i128,
    last: u64,
}

/// What the model says of one check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModelDecision {
    pub allowed: bool,
    pub remaining: u64,
    pub retry_ns: u64,
    pub reset_ns: u64,
}

fn ceil_div(a: i128, b: i128) -> u64 {
    if a <= 0 {
        0
    } else {
        u64::try_from((a + b - 1) / b).unwrap_or(u64::MAX)
    }
}

impl Model {
    pub fn new(q: &Quota, now: u64) -> Model {
        let (per, rate) = q.period_fraction();
        let per = per as i128;
        Model {
            rate: rate as i128,
            per,
            burst: q.burst() as i128,
            num: q.burst() as i128 * per,
            last: now,
        }
    }

    /// The capacity, in units.
    pub fn cap(&self) -> i128 {
        self.burst * self.per
    }

    pub fn refill(&mut self, now: u64) {
        if now > self.last {
            let add = (now - self.last) as i128 * self.rate;
            self.num = (self.num + add).min(self.cap());
            self.last = now;
        }
    }

    /// Exact tokens held at `now` as (numerator, denominator), after refilling.
    pub fn tokens_at(&mut self, now: u64) -> (i128, i128) {
        self.refill(now);
        (self.num, self.per)
    }

    fn figures(&self, allowed: bool, n: u32) -> ModelDecision {
        let want = n as i128 * self.per;
        ModelDecision {
            allowed,
            remaining: if self.num <= 0 {
                0
            } else {
                (self.num / self.per) as u64
            },
            retry_ns: if allowed {
                0
            } else {
                ceil_div(want - self.num, self.rate)
            },
            reset_ns: ceil_div(self.cap() - self.num, self.rate),
        }
    }

    /// The model's own decision for `n <= burst` tokens at `now`.
    pub fn check(&mut self, now: u64, n: u32) -> ModelDecision {
        self.refill(now);
        let want = n as i128 * self.per;
        // A peek always passes, as the limiters' do, even owing more than the capacity (a debt
        // carried over to a smaller quota).
        let allowed = n == 0 || self.num >= want;
        if allowed {
            self.num -= want;
        }
        self.figures(allowed, n)
    }

    /// Owes `units` (of `1/per` token) more at `now`, into debt past empty, at most 2^61 units
    /// past the capacity (the documented debt horizon).
    pub fn owe(&mut self, now: u64, units: i128) {
        self.refill(now);
        self.num = (self.num - units).max(-(1i128 << 61));
    }

    /// Gives `units` back at `now`, never past full; nothing to an already full bucket.
    pub fn give(&mut self, now: u64, units: i128) {
        self.refill(now);
        self.num = (self.num + units.max(0)).min(self.cap());
    }

    /// Empties the debt and the spending: full at `now`.
    pub fn fill(&mut self, now: u64) {
        self.refill(now);
        self.num = self.cap();
    }

    /// The nanoseconds from `now` until the model holds `units`: 0 if it does already, or never
    /// will (past the capacity).
    pub fn ns_until(&mut self, now: u64, units: i128) -> u64 {
        self.refill(now);
        if units > self.cap() {
            return 0;
        }
        ceil_div(units - self.num, self.rate)
    }

    /// What the bucket lacks of full at `now`, in units (`1/per` of a token, as GCRA's).
    pub fn debt_at(&mut self, now: u64) -> i128 {
        self.refill(now);
        self.cap() - self.num
    }

    /// The refill rate, in units a nanosecond.
    pub fn rate(&self) -> i128 {
        self.rate
    }

    /// One token, in units.
    pub fn per(&self) -> i128 {
        self.per
    }

    /// The figures a peek answers now.
    pub fn peek(&mut self, now: u64) -> ModelDecision {
        self.check(now, 0)
    }

    /// Applies a decision someone else made (used to follow the token bucket where it may differ
    /// within its resolution), and returns the model's figures afterwards.
    pub fn apply(&mut self, now: u64, n: u32, allowed: bool) -> ModelDecision {
        self.refill(now);
        if allowed {
            self.num -= n as i128 * self.per;
        }
        self.figures(allowed, n)
    }

    /// The model after its quota changes to `q` at `now`: the debt (what the bucket lacks of
    /// full) kept as time, or as its share of the capacity (at most all of it), rounded up in the
    /// new terms, and never carried past the documented range bound (2^61 units past the new
    /// capacity).
    pub fn reconfigured(&mut self, now: u64, q: &Quota, proportional: bool) -> Model {
        let mut next = Model::new(q, now);
        next.num -= self
            .debt_into(now, &next, proportional, true)
            .min((1 << 61) + next.cap());
        next
    }

    /// The token bucket's reference at a change: as [`Model::reconfigured`] with the debt at most
    /// the new capacity (a bucket holds no less than nothing), in units `k` times finer than the
    /// new quota's and rounded down, so that it is never below the exact carry and above it by
    /// under a `k`-th of a unit.
    pub fn reconfigured_above(
        &mut self,
        now: u64,
        q: &Quota,
        proportional: bool,
        k: i128,
    ) -> Model {
        let mut next = Model::new(q, now).finer(k);
        next.num -= self
            .debt_into(now, &next, proportional, false)
            .min(next.cap());
        next
    }

    /// What the bucket lacks of full at `now` (as a share, at most all of it), in `next`'s units.
    fn debt_into(&mut self, now: u64, next: &Model, proportional: bool, up: bool) -> i128 {
        self.refill(now);
        let debt = self.cap() - self.num;
        let debt = if proportional {
            debt.min(self.cap())
        } else {
            debt
        };
        self.carry_units(next, debt, proportional, up)
    }

    /// `units` of this model's in `next`'s, as a change carries a debt: as time (the ratio of the
    /// rates) or as a share of the capacity; rounded up or down.
    pub fn carry_units(&self, next: &Model, units: i128, proportional: bool, up: bool) -> i128 {
        let (num, den) = if proportional {
            (next.cap(), self.cap())
        } else {
            (next.rate, self.rate)
        };
        let product = units * num;
        if up {
            product.div_euclid(den) + i128::from(product.rem_euclid(den) != 0)
        } else {
            product.div_euclid(den)
        }
    }

    /// The same bucket counted in units `k` times finer.
    pub fn finer(mut self, k: i128) -> Model {
        self.per *= k;
        self.rate *= k;
        self.num *= k;
        self
    }

    /// Most tokens a correct limiter may have admitted by `now` since `start`:
    /// `burst + floor(elapsed × rate / per)`.
    pub fn admission_bound(q: &Quota, start: u64, now: u64) -> u128 {
        let elapsed = now.saturating_sub(start) as u128;
        q.burst() as u128 + elapsed * q.rate() as u128 / q.per().as_nanos()
    }
}

/// The token bucket's documented resolution, as time: it trails the exact model by less than two
/// units (1/1024 of a period each) and one tick, and never leads it.
pub fn bucket_lag_ns(q: &Quota, tick_ns: u64) -> u64 {
    let (p, s) = q.period_fraction();
    tick_ns + (2 * p).div_ceil(1024 * s)
}

/// Whether the bucket may refuse `n` tokens while the exact count is `num/den` (as the model
/// gives it): only when the exact count exceeds `n` by less than its lag.
pub fn bucket_may_refuse(num: i128, den: i128, n: u32, q: &Quota, tick_ns: u64) -> bool {
    let refill_per_ns = q.period_fraction().1 as i128;
    num - n as i128 * den < bucket_lag_ns(q, tick_ns) as i128 * refill_per_ns
}

/// The bucket's slack on waits, in ns: its lag, plus one tick for rounding a wait to a tick
/// boundary.
pub fn bucket_wait_slack(q: &Quota, tick_ns: u64) -> u64 {
    bucket_lag_ns(q, tick_ns) + tick_ns
}

/// Interesting quotas: whole, fractional and extreme periods.
pub fn sample_quotas() -> Vec<Quota> {
    use std::time::Duration;
    let s = Duration::from_secs(1);
    let mut v = vec![
        Quota::per_second(1),
        Quota::per_second(3),
        Quota::per_second(7_000_000).with_burst(20),
        Quota::per_second(1_000_000_000).with_burst(64),
        Quota::per_second(100).with_burst(10),
        Quota::per_minute(7),
        Quota::with_period(Duration::from_millis(10)),
        Quota::try_new(3, s, 1).unwrap(),
        Quota::try_new(128, Duration::from_nanos(1_000_001), 5).unwrap(),
        Quota::try_new(1, Duration::from_secs(100 * 365 * 86_400), 1).unwrap(),
        Quota::try_new(1_000, s, 1 << 20).unwrap(),
    ];
    v.push(Quota::per_hour(3).with_burst(2));
    v
}

/// The fixed window by the book: window `(t - epoch) / W`, a count reset in each new window.
pub struct FixedModel {
    pub limit: u64,
    pub window: u64,
    pub epoch: u64,
    pub index: u64,
    pub count: u64,
}

impl FixedModel {
    pub fn check(&mut self, now: u64, n: u64) -> (bool, u64) {
        let k = (now - self.epoch) / self.window;
        if k != self.index {
            self.index = k;
            self.count = 0;
        }
        let ok = self.count + n <= self.limit;
        if ok {
            self.count += n;
        }
        (ok, self.limit - self.count)
    }

    /// The window after a change to `limit` per `window` at `now` (a limiter built at `now`):
    /// the count as of `now`, scaled to the new limit (rounded up) if `proportional`, at most
    /// the new limit; the grid kept if the window's length is, else a new grid from `now` whose
    /// first window holds the count.
    pub fn reconfigured(&mut self, now: u64, limit: u64, window: u64, proportional: bool) -> Self {
        self.check(now, 0);
        let count = carried_count(self.count, self.limit, limit, proportional);
        if window == self.window {
            FixedModel {
                limit,
                count,
                ..*self
            }
        } else {
            FixedModel {
                limit,
                window,
                epoch: now,
                index: 0,
                count,
            }
        }
    }
}

/// A window's count carried to a new limit: as it is, or scaled and rounded up; at most the limit.
fn carried_count(count: u64, from: u64, to: u64, proportional: bool) -> u64 {
    let count = if proportional {
        (count as u128 * to as u128).div_ceil(from as u128) as u64
    } else {
        count
    };
    count.min(to)
}

/// The two-window counter by the book, in exact rationals: allowed iff
/// `previous × (W - e) / W + current + n <= limit`.
pub struct SlidingModel {
    pub limit: u64,
    pub window: u64,
    pub epoch: u64,
    pub index: u64,
    pub previous: u64,
    pub current: u64,
}

impl SlidingModel {
    pub fn check(&mut self, now: u64, n: u64) -> (bool, u64) {
        let t = now - self.epoch;
        let k = t / self.window;
        if k == self.index + 1 {
            self.previous = self.current;
            self.current = 0;
        } else if k > self.index + 1 {
            self.previous = 0;
            self.current = 0;
        }
        self.index = k;
        let (w, e) = (self.window as u128, (t % self.window) as u128);
        let weighted = self.previous as u128 * (w - e);
        // A peek always passes (after a change the two counts may weigh more than the limit).
        let ok = n == 0 || weighted + (self.current + n) as u128 * w <= self.limit as u128 * w;
        if ok {
            self.current += n;
        }
        let used = self.current as u128 + weighted.div_ceil(w);
        (ok, (self.limit as u128).saturating_sub(used) as u64)
    }

    /// The counter after a change to `limit` per `window` at `now` (a limiter built at `now`):
    /// both counts as of `now`, scaled as [`FixedModel::reconfigured`] scales its count. The grid
    /// is kept if the window's length is; else a new grid starts at `now`, the current count in
    /// its first window and the previous count's weight at `now`, `previous × (W - e) / W`
    /// rounded up, as the previous count (whose weight there is whole).
    pub fn reconfigured(&mut self, now: u64, limit: u64, window: u64, proportional: bool) -> Self {
        self.check(now, 0);
        let carry = |count| carried_count(count, self.limit, limit, proportional);
        if window == self.window {
            SlidingModel {
                limit,
                previous: carry(self.previous),
                current: carry(self.current),
                ..*self
            }
        } else {
            let e = (now - self.epoch) % self.window;
            let weight = (self.previous as u128 * (self.window - e) as u128)
                .div_ceil(self.window as u128) as u64;
            SlidingModel {
                limit,
                window,
                epoch: now,
                index: 0,
                previous: carry(weight),
                current: carry(self.current),
            }
        }
    }
}

//! [`Leased`]: the hot path spends a local lease; the store is asked only for the next lease.

use alloc::string::String;
use alloc::sync::Arc;
use core::time::Duration;

mod charge;

pub use self::charge::LeasedCharge;

use super::remote::RedisGcra;
use super::{FailurePolicy, failure_decision, script};
use crate::clock::{Clock, DefaultClock};
use crate::decision::{DecidedBy, Decision};
use crate::gcra::Gcra;
use crate::limiter::lease::{self, Spend};
use crate::quota::InsufficientCapacity;
use crate::state_cell::{StateCell, Step};
use crate::sync::{AtomicU64, Ordering};

/// How a [`Leased`] sizes and keeps its leases.
#[derive(Debug, Clone, Copy)]
pub struct LeaseOptions {
    ttl: Duration,
    max_lease: u32,
}

impl Default for LeaseOptions {
    /// Leases live 1 s and hold at most 1000 tokens.
    fn default() -> LeaseOptions {
        LeaseOptions {
            ttl: Duration::from_secs(1),
            max_lease: 1000,
        }
    }
}

impl LeaseOptions {
    /// How long a lease may be spent, counted from when it was asked for: the `E` of the bound
    /// `burst + rate × (W + E)`. Shorter wastes fewer unspent tokens and loosens the bound less;
    /// longer asks the store less often.
    pub fn with_ttl(mut self, ttl: Duration) -> LeaseOptions {
        self.ttl = ttl;
        self
    }

    /// The most tokens one lease takes (at most 2^24 - 1).
    pub fn with_max_lease(mut self, max_lease: u32) -> LeaseOptions {
        self.max_lease = max_lease.clamp(1, lease::MAX_TOKENS);
        self
    }
}

/// A node's share of a [`RedisGcra`] quota for one subject, spent locally: a check is one clock
/// read and one compare-and-swap on the lease word, with no I/O; tokens come from the store in
/// batches (the script's grant-up-to mode), fetched in the background when the lease runs low.
///
/// * **Size.** A lease is sized to last about a quarter of its TTL at the demand measured between
///   refills, at least the request's `n`, at most [`LeaseOptions::with_max_lease`]; and at most
///   half of what the store said was left, so it shrinks toward 1 as the global remainder nears
///   zero and one node does not take the last tokens from the others.
/// * **Expiry.** A lease is spent only within its TTL `E` from when it was asked for; a refill
///   merged into a lease that still holds tokens expires with the older one.
/// * **Refusals.** When the store grants nothing, the lease remembers until when, and refuses
///   locally meanwhile: an over-limit node does not hammer the store. Each refusal in a row
///   doubles the hold (up to 8× the store's retry-after, capped at one TTL unless the store's
///   own wait is longer), so that nodes over the limit together do not ask once per token.
/// * **The bound.** Tokens granted at server time `t` are spent within `[t, t + E]`, and the store
///   grants at most `burst + rate × L` over any interval `L`; so over any window `W`, all nodes
///   together admit at most `burst + rate × (W + E)`, however many they are.
///
/// Cheap to clone; build it within a tokio runtime (background refills run on it).
#[derive(Clone, Debug)]
pub struct Leased {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    remote: RedisGcra,
    subject: String,
    clock: DefaultClock,
    /// The lease (see `lease`'s bit table).
    word: StateCell,
    ttl_ns: u64,
    max_lease: u32,
    /// The smallest burst of the remote's limits, as last read (at each refill).
    limit: AtomicU64,
    /// Refill when a spend leaves this many tokens or fewer.
    low_water: AtomicU64,
    /// The store refused a lease: refuse locally until this reading (0: no refusal cached).
    denied_until: AtomicU64,
    /// 1 while the store's last answer was a failure: the policy decides once the lease is spent.
    failing: AtomicU64,
    /// The reading at which the subject was full again, as of the last grant.
    reset_at: AtomicU64,
    /// 1 while a background refill is queued or running.
    queued: AtomicU64,
    /// The single flight: who holds it refills; it keeps the demand measured between refills.
    refill: tokio::sync::Mutex<Demand>,
    handle: Option<tokio::runtime::Handle>,
    /// [`FailurePolicy::Local`]'s limiter, on this node's share.
    share: Option<Gcra>,
    /// Leases asked of the store.
    requests: AtomicU64,
    /// Checks that waited for the store.
    waited: AtomicU64,
}

/// Demand, measured from the lease's own word between refills (nothing is counted on the hot
/// path).
#[derive(Debug, Default)]
struct Demand {
    /// Tokens in the lease just after the last refill.
    total: u32,
    /// When that was (0: never).
    at_ns: u64,
    /// Tokens per second, smoothed.
    rate: f64,
    /// What the store said was left after the last grant.
    remaining: Option<u32>,
    /// Refusals in a row: each doubles how long the next is held locally.
    refusals: u32,
}

impl Demand {
    fn next_size(&mut self, now_ns: u64, tokens_now: u32, n: u32, ttl_ns: u64, max: u32) -> u32 {
        if self.at_ns != 0 && now_ns > self.at_ns {
            let spent = f64::from(self.total.saturating_sub(tokens_now));
            let rate = spent * 1e9 / (now_ns - self.at_ns) as f64;
            self.rate = if self.rate == 0.0 {
                rate
            } else {
                0.5 * self.rate + 0.5 * rate
            };
        }
        // A quarter of the TTL's worth of demand (`as` saturates; NaN is 0).
        let want = (self.rate * ttl_ns as f64 / 4e9).ceil() as u32;
        let mut size = want.clamp(1, max).max(n);
        if let Some(remaining) = self.remaining {
            size = size.min((remaining / 2).max(1)).max(n);
        }
        size
    }
}

impl Leased {
    /// Leases for `subject` from `remote`.
    pub fn new(remote: RedisGcra, subject: &str, options: LeaseOptions) -> Leased {
        let share = match remote.policy() {
            FailurePolicy::Local { share } => Some(Gcra::new(share)),
            _ => None,
        };
        Leased {
            inner: Arc::new(Inner {
                limit: AtomicU64::new(u64::from(remote.burst())),
                subject: subject.into(),
                clock: DefaultClock::default(),
                word: StateCell::new(0),
                ttl_ns: u64::try_from(options.ttl.as_nanos()).unwrap_or(u64::MAX),
                max_lease: options.max_lease.clamp(1, lease::MAX_TOKENS),
                low_water: AtomicU64::new(0),
                denied_until: AtomicU64::new(0),
                failing: AtomicU64::new(0),
                reset_at: AtomicU64::new(0),
                queued: AtomicU64::new(0),
                refill: tokio::sync::Mutex::new(Demand::default()),
                handle: tokio::runtime::Handle::try_current().ok(),
                share,
                requests: AtomicU64::new(0),
                waited: AtomicU64::new(0),
                remote,
            }),
        }
    }

    /// The smallest burst of the remote's limits, as last read.
    fn limit(&self) -> u32 {
        // Relaxed: a figure, stored from a `u32`.
        self.inner.limit.load(Ordering::Relaxed) as u32
    }

    /// Checks one request, waiting for a lease when this node has none.
    pub async fn check(&self) -> Decision {
        match self.check_n(1).await {
            Ok(d) => d,
            Err(e) => script::decision(false, 0, 0, 0, e.burst, DecidedBy::Lease),
        }
    }

    /// Checks a request for `n` tokens: from the lease when it holds them (no I/O), otherwise
    /// after one refill from the store (within the deadline), or by the failure policy.
    pub async fn check_n(&self, n: u32) -> Result<Decision, InsufficientCapacity> {
        let answer = self.decide_n(n).await.map(|a| a.decision);
        self.inner.remote.options().count(n, &answer);
        answer
    }

    /// [`Leased::check_n`], keeping what an admission took from the lease so that an
    /// all-or-nothing decision can give it back ([`Taken::give_back`]). An admission by the
    /// failure policy takes nothing from the lease and returns no `Taken`.
    pub(crate) async fn take_n(&self, n: u32) -> Result<Took, InsufficientCapacity> {
        let answer = self.decide_n(n).await;
        self.inner
            .remote
            .options()
            .count(n, &answer.as_ref().map(|a| a.decision).map_err(|e| *e));
        answer.map(|a| Took {
            decision: a.decision,
            taken: a.spent.map(|expiry| Taken {
                leased: self.clone(),
                n,
                expiry,
            }),
            waited: a.waited,
        })
    }

    /// [`Leased::check_n`], before it is counted; with the expiry of the lease an admission was
    /// spent from.
    async fn decide_n(&self, n: u32) -> Result<Decided, InsufficientCapacity> {
        InsufficientCapacity::check(n, self.max_cost())?;
        // The whole check waits at most one deadline: for the refill's lock and the store alike.
        let until = self.inner.remote.options().until();
        // Relaxed: as in `without_lease`. Built outside a runtime, nothing probes the store in
        // the background while it fails: probe here (the breaker keeps it cheap while open).
        if self.inner.handle.is_none() && self.inner.failing.load(Ordering::Relaxed) == 1 {
            self.refill(n, until).await;
        }
        if let Some((decision, spent)) = self.local(n) {
            return Ok(Decided {
                decision,
                spent,
                waited: false,
            });
        }
        // Relaxed: a statistic.
        self.inner.waited.fetch_add(1, Ordering::Relaxed);
        self.refill(n, until).await;
        let (decision, spent) = match self.local(n) {
            Some((d, spent)) if d.decided_by() == DecidedBy::Lease && d.is_allowed() => {
                (d.decided_by_(DecidedBy::Store), spent)
            }
            Some(d) => d,
            // The store had fewer than `n` tokens to give: refuse for one period a token.
            None => {
                let retry_us = self.inner.remote.period_ns().div_ceil(1000);
                let d =
                    script::decision(false, 0, retry_us.max(1), 0, self.limit(), DecidedBy::Store);
                (d, None)
            }
        };
        Ok(Decided {
            decision,
            spent,
            waited: true,
        })
    }

    /// The hot path alone: a decision from the lease, a cached refusal or the failure policy, or
    /// `None` when only the store can decide (then [`Leased::check_n`] waits for it). Never does
    /// I/O; may queue a background refill.
    pub fn check_local(&self, n: u32) -> Option<Decision> {
        self.local(n).map(|(d, _)| d)
    }

    /// [`Leased::check_local`], with the expiry of the lease an admission was spent from.
    #[inline]
    fn local(&self, n: u32) -> Option<(Decision, Option<u64>)> {
        let inner = &*self.inner;
        let now = inner.clock.now();
        match inner.word.update(|w| lease::spend(w, lease::tick(now), n)) {
            Spend::Spent { left, expiry } => {
                // Relaxed: a hint for when to refill; a stale value refills a little early or late.
                if u64::from(left) <= inner.low_water.load(Ordering::Relaxed) {
                    self.prefetch();
                }
                Some((self.lease_decision(true, left, 0, now), Some(expiry)))
            }
            Spend::Short { .. } => self.without_lease(now, n).map(|d| (d, None)),
        }
    }

    /// The limiter the leases come from.
    #[cfg(feature = "tower")]
    pub(crate) fn remote(&self) -> &RedisGcra {
        &self.inner.remote
    }

    /// The most tokens one check may ask for.
    pub(crate) fn max_cost(&self) -> u32 {
        self.limit().min(lease::MAX_TOKENS)
    }

    /// Leases asked of the store so far.
    pub fn lease_requests(&self) -> u64 {
        // Relaxed: a statistic.
        self.inner.requests.load(Ordering::Relaxed)
    }

    /// Checks so far that waited for the store (the rest were decided without I/O).
    pub fn waited_checks(&self) -> u64 {
        // Relaxed: a statistic.
        self.inner.waited.load(Ordering::Relaxed)
    }

    fn lease_decision(&self, allowed: bool, left: u32, retry_ns: u64, now: u64) -> Decision {
        // Relaxed: a figure for the caller, as of the last grant.
        let reset_ns = self
            .inner
            .reset_at
            .load(Ordering::Relaxed)
            .saturating_sub(now);
        script::decision(
            allowed,
            left,
            retry_ns.div_ceil(1000),
            reset_ns.div_ceil(1000),
            self.limit(),
            DecidedBy::Lease,
        )
    }

    /// No lease covers the request: a cached refusal, the failure policy, or `None`.
    fn without_lease(&self, now: u64, n: u32) -> Option<Decision> {
        let inner = &*self.inner;
        // Relaxed: written by the refill after the store answered; a stale 0 asks the store once
        // more, a stale time refuses as the store did.
        let until = inner.denied_until.load(Ordering::Relaxed);
        if until > now {
            return Some(self.lease_decision(false, 0, until - now, now));
        }
        // Relaxed: as above; the background refill clears it when the store answers again.
        let failing = inner.failing.load(Ordering::Relaxed) == 1;
        // Ask for a lease in the background, so that a caller of `check_local` alone is served
        // again; while failing, this is the probe (the breaker lets one call through when it
        // half-opens).
        self.prefetch();
        if !failing {
            return None;
        }
        Some(failure_decision(
            inner.remote.policy(),
            inner.limit.load(Ordering::Relaxed) as u32,
            inner.remote.options().cooldown_ns(),
            || inner.share.as_ref().map(|share| share.check_n(n)),
        ))
    }

    /// Queues one background refill, unless one is queued already.
    fn prefetch(&self) {
        let Some(handle) = &self.inner.handle else {
            return;
        };
        // Relaxed: the flag only keeps refills from piling up; the refill's own lock is the
        // single flight.
        if self.inner.queued.swap(1, Ordering::Relaxed) == 1 {
            return;
        }
        let this = self.clone();
        handle.spawn(async move {
            let _clear = ClearOnDrop(&this.inner.queued);
            let until = this.inner.remote.options().until();
            this.refill(0, until).await;
        });
    }

    /// Asks the store for a lease that covers `n` (0: the background's top-up), unless another
    /// caller's refill already did; one refill at a time, the wait for it and the call to the
    /// store both ending at `until`.
    async fn refill(&self, n: u32, until: tokio::time::Instant) {
        let inner = &*self.inner;
        let Ok(mut demand) = tokio::time::timeout_at(until, inner.refill.lock()).await else {
            return;
        };
        let now = inner.clock.now();
        let word = inner.word.update(Step::Keep);
        let valid = lease::valid_tokens(word, lease::tick(now));
        // Relaxed: as in `check_local`.
        let low = inner.low_water.load(Ordering::Relaxed);
        let covered = if n == 0 {
            u64::from(valid) > low
        } else {
            valid >= n
        };
        // Relaxed: as in `without_lease`.
        if covered || inner.denied_until.load(Ordering::Relaxed) > now {
            return;
        }
        let size = demand.next_size(now, lease::tokens(word), n, inner.ttl_ns, inner.max_lease);
        // Relaxed: a statistic.
        inner.requests.fetch_add(1, Ordering::Relaxed);
        let sent = inner.clock.now();
        let answer = inner.remote.grant(&inner.subject, size, until).await;
        let now = inner.clock.now();
        let Ok(grant) = answer else {
            // Relaxed: see the field.
            inner.failing.store(1, Ordering::Relaxed);
            return;
        };
        // Relaxed (these four): figures and hints read by the hot path, each on its own. The
        // burst is read again: the remote's quota may have changed (`RedisGcra::set_quota`).
        inner.failing.store(0, Ordering::Relaxed);
        inner
            .limit
            .store(u64::from(inner.remote.burst()), Ordering::Relaxed);
        inner
            .reset_at
            .store(now.saturating_add(grant.reset_ns), Ordering::Relaxed);
        demand.remaining = Some(grant.remaining);
        if grant.granted == 0 {
            // Held for the store's retry-after, doubled for each refusal in a row (up to 8×, and
            // never past one TTL unless the store's own wait is longer): nodes over the limit
            // together then ask about once per their share of the quota, not once per token.
            let hold = grant
                .retry_ns
                .saturating_mul(1 << demand.refusals.min(3))
                .min(inner.ttl_ns)
                .max(grant.retry_ns);
            demand.refusals = demand.refusals.saturating_add(1);
            inner
                .denied_until
                .store(now.saturating_add(hold).max(1), Ordering::Relaxed);
            return;
        }
        demand.refusals = 0;
        inner.remote.options().count_lease();
        // Relaxed: as above.
        inner.denied_until.store(0, Ordering::Relaxed);
        let expiry = lease::expiry(sent, inner.ttl_ns);
        let tick = lease::tick(now);
        inner
            .word
            .update(|w| lease::add(w, tick, expiry, grant.granted));
        let word = inner.word.update(Step::Keep);
        demand.total = lease::tokens(word);
        demand.at_ns = now;
        // Relaxed: as in `check_local`.
        inner
            .low_water
            .store(u64::from(size / 2), Ordering::Relaxed);
    }
}

/// Clears the background refill's flag when the refill ends, or is dropped with its runtime.
struct ClearOnDrop<'a>(&'a AtomicU64);

impl Drop for ClearOnDrop<'_> {
    fn drop(&mut self) {
        // Relaxed: see `Leased::prefetch`.
        self.0.store(0, Ordering::Relaxed);
    }
}

/// A decision, the expiry of the lease an admission was spent from, and whether it waited for
/// the store (the last two read by the rate-limit service alone).
#[cfg_attr(not(feature = "rls"), allow(dead_code))]
struct Decided {
    decision: Decision,
    spent: Option<u64>,
    waited: bool,
}

/// What [`Leased::take_n`] decided.
#[derive(Debug)]
pub(crate) struct Took {
    pub(crate) decision: Decision,
    /// What an admission took from the lease.
    pub(crate) taken: Option<Taken>,
    /// The decision waited for a call to the store.
    #[cfg_attr(not(feature = "rls"), allow(dead_code))]
    pub(crate) waited: bool,
}

/// Tokens an admission took from one [`Leased`]'s lease, which an all-or-nothing decision gives
/// back when another part of it is refused. Consumed by [`Taken::give_back`], so it goes back at
/// most once, and only to the lease it came from; dropped, the tokens stay spent.
#[derive(Debug)]
pub(crate) struct Taken {
    leased: Leased,
    n: u32,
    /// The tick at which the lease they were spent from expires.
    expiry: u64,
}

impl Taken {
    /// Puts the tokens back into the lease while their own lease's TTL holds (the lease in the
    /// word then expires no later than theirs: `lease::give_back`); past it they are dropped, and
    /// the node admits less, never more. Says whether they went back, and the lease's figures
    /// after.
    pub(crate) fn give_back(self) -> (bool, Option<Decision>) {
        let inner = &*self.leased.inner;
        let tick = lease::tick(inner.clock.now());
        let back = inner
            .word
            .update(|w| lease::give_back(w, tick, self.expiry, self.n));
        (back, self.leased.check_local(0))
    }
}

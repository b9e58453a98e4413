//! Counters on the [`metrics`](https://docs.rs/metrics) facade (feature `metrics`):
//! [`LimiterMetrics`], the counters of one named limiter, and [`Instrumented`], any limiter that
//! records every decision in them.
//!
//! | counter | labels | counts |
//! |---|---|---|
//! | `atomic_limiter_allowed_total` | `limiter` | requests the limiter admitted |
//! | `atomic_limiter_near_limit_total` | `limiter` | of those, the ones that left less than the near-limit share of the burst |
//! | `atomic_limiter_denied_total` | `limiter` | requests over the quota (in shadow mode too: what the limit would refuse) |
//! | `atomic_limiter_table_full_total` | `limiter` | new keys refused at a keyed table's cap |
//! | `atomic_limiter_shadowed_total` | `limiter` | refusals that shadow mode let through |
//! | `atomic_limiter_failure_decisions_total` | `limiter`, `policy` (`open`, `closed`, `local`) | decisions a failure policy made while the store could not answer |
//! | `atomic_limiter_backend_errors_total` | `limiter`, `reason` (`redis`, `timeout`, `bad_reply`, `circuit_open`) | calls to the store that got no answer |
//! | `atomic_limiter_lease_refills_total` | `limiter` | leases granted to a `Leased` limiter |
//! | `atomic_limiter_admin_total` | `limiter`, `op` (`settle`, `reset`, `remove`, `penalize`, `block`) | a charge settled and an operator's changes of a key, on a keyed table with [`Keyed::with_metrics`](crate::Keyed::with_metrics) or a `RedisGcra` whose options carry these counters |
//! | `atomic_limiter_store_restarts_total` | `limiter` | times a Redis server answered with a new `run_id` (a restart: without persistence, each subject may get its burst again), counted by the store whose options carry these counters |
//!
//! A peek (`check_n(0)`) is no request: [`Instrumented`] and the Redis limiters count none.
//!
//! The handles are registered when [`LimiterMetrics::new`] runs, with the recorder installed then
//! (install it first); with none installed they are no-ops. A recorded decision costs one
//! counter increment, and for an admission the division that works out what remains (skipped
//! with a near-limit share of 0). Without the feature none of this exists: the limiters do not
//! know about it.

use alloc::borrow::ToOwned;
use alloc::string::String;

use ::metrics::{Counter, counter};

use crate::decision::{DecidedBy, Decision};
use crate::quota::InsufficientCapacity;
use crate::quota::Quota;
use crate::rate_limiter::RateLimiter;

/// The share of the burst below which an admission counts as near the limit, by default: a
/// fifth (Envoy's rate limit service says "near" from 80 % of the limit used).
const DEFAULT_NEAR_LIMIT_PPM: u64 = 200_000;

/// The counters of one limiter, labelled `limiter = name` (see the module's table). Cheap to
/// clone: clones share the counters.
///
/// # Examples
///
/// ```
/// use atomic_limiter::{Gcra, Instrumented, LimiterMetrics, ManualClock, Quota, RateLimiter};
///
/// let recorder = metrics_util::debugging::DebuggingRecorder::new();
/// let snapshot = recorder.snapshotter();
/// metrics::with_local_recorder(&recorder, || {
///     let api = Instrumented::new(
///         Gcra::with_clock(Quota::per_second(2), ManualClock::new()),
///         LimiterMetrics::new("api"),
///     );
///     for _ in 0..3 {
///         let _ = api.check();
///     }
/// });
/// let denied = snapshot.snapshot().into_vec().into_iter().find(|(key, ..)| {
///     key.key().name() == "atomic_limiter_denied_total"
/// });
/// assert!(matches!(denied, Some((_, _, _, metrics_util::debugging::DebugValue::Counter(1)))));
/// ```
#[derive(Debug, Clone)]
pub struct LimiterMetrics {
    allowed: Counter,
    near_limit: Counter,
    denied: Counter,
    table_full: Counter,
    shadowed: Counter,
    fail_open: Counter,
    fail_closed: Counter,
    fail_local: Counter,
    backend_redis: Counter,
    backend_timeout: Counter,
    backend_bad_reply: Counter,
    backend_circuit_open: Counter,
    lease_refills: Counter,
    store_restarts: Counter,
    /// `atomic_limiter_admin_total`, by [`ADMIN_OPS`].
    admin: [Counter; 5],
    /// The near-limit share of the burst, in parts per million.
    near_limit_ppm: u64,
}

/// The `op` labels of `atomic_limiter_admin_total`.
pub(crate) const ADMIN_OPS: [&str; 5] = ["settle", "reset", "remove", "penalize", "block"];

/// Why a call to the store got no answer, as `atomic_limiter_backend_errors_total` labels it.
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BackendError {
    Redis,
    Timeout,
    BadReply,
    CircuitOpen,
}

impl LimiterMetrics {
    /// The counters of the limiter called `name`, registered with the recorder installed now.
    pub fn new(name: &str) -> LimiterMetrics {
        let name: String = name.to_owned();
        let of = |metric: &'static str| counter!(metric, "limiter" => name.clone());
        let failure = |policy: &'static str| {
            counter!(
                "atomic_limiter_failure_decisions_total",
                "limiter" => name.clone(),
                "policy" => policy
            )
        };
        let backend = |reason: &'static str| {
            counter!(
                "atomic_limiter_backend_errors_total",
                "limiter" => name.clone(),
                "reason" => reason
            )
        };
        LimiterMetrics {
            allowed: of("atomic_limiter_allowed_total"),
            near_limit: of("atomic_limiter_near_limit_total"),
            denied: of("atomic_limiter_denied_total"),
            table_full: of("atomic_limiter_table_full_total"),
            shadowed: of("atomic_limiter_shadowed_total"),
            fail_open: failure("open"),
            fail_closed: failure("closed"),
            fail_local: failure("local"),
            backend_redis: backend("redis"),
            backend_timeout: backend("timeout"),
            backend_bad_reply: backend("bad_reply"),
            backend_circuit_open: backend("circuit_open"),
            lease_refills: of("atomic_limiter_lease_refills_total"),
            store_restarts: of("atomic_limiter_store_restarts_total"),
            admin: ADMIN_OPS.map(
                |op| counter!("atomic_limiter_admin_total", "limiter" => name.clone(), "op" => op),
            ),
            near_limit_ppm: DEFAULT_NEAR_LIMIT_PPM,
        }
    }

    /// An admission counts as near the limit when it leaves less than `share` of the burst
    /// (0.2, a fifth, by default). A share of 0 (or below, or not a number) counts none and
    /// skips the division; 1 or more counts every admission but those that leave the burst whole.
    pub fn near_limit_below(mut self, share: f64) -> LimiterMetrics {
        // A share read from a config file: NaN and negatives are 0, anything past 1 is 1.
        let ppm = if share.is_nan() || share <= 0.0 {
            0.0
        } else {
            (share.min(1.0) * 1e6).round()
        };
        self.near_limit_ppm = ppm as u64;
        self
    }

    /// Counts one decision: admitted (and maybe near the limit), over the quota, or refused at
    /// a table's cap; shadowed if shadow mode let it through; and who decided if a failure
    /// policy did.
    #[inline]
    pub fn record(&self, decision: &Decision) {
        match decision.decided_by() {
            DecidedBy::FailOpen => self.fail_open.increment(1),
            DecidedBy::FailClosed => self.fail_closed.increment(1),
            DecidedBy::FailLocal => self.fail_local.increment(1),
            _ => {}
        }
        if decision.is_shadowed() {
            self.shadowed.increment(1);
        }
        if decision.is_table_full() {
            self.table_full.increment(1);
        } else if decision.would_allow() {
            self.allowed.increment(1);
            if self.is_near_limit(decision) {
                self.near_limit.increment(1);
            }
        } else {
            self.denied.increment(1);
        }
    }

    /// Counts a request refused outright for costing more than the burst: a denial.
    pub fn record_too_costly(&self) {
        self.denied.increment(1);
    }

    /// Counts the answer of a `check_n`: its decision, or a request above the burst.
    #[inline]
    pub fn record_answer(&self, answer: &Result<Decision, InsufficientCapacity>) {
        match answer {
            Ok(decision) => self.record(decision),
            Err(_) => self.record_too_costly(),
        }
    }

    fn is_near_limit(&self, decision: &Decision) -> bool {
        if self.near_limit_ppm == 0 {
            return false;
        }
        let limit = u128::from(decision.limit());
        u128::from(decision.remaining()) * 1_000_000 < u128::from(self.near_limit_ppm) * limit
    }

    /// Counts a call to the store that got no answer.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn backend_error(&self, reason: BackendError) {
        match reason {
            BackendError::Redis => self.backend_redis.increment(1),
            BackendError::Timeout => self.backend_timeout.increment(1),
            BackendError::BadReply => self.backend_bad_reply.increment(1),
            BackendError::CircuitOpen => self.backend_circuit_open.increment(1),
        }
    }

    /// Counts a lease granted.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn lease_refill(&self) {
        self.lease_refills.increment(1);
    }

    /// Counts a settlement or an operator's change of a key: `op` is one of [`ADMIN_OPS`]
    /// (anything else counts nothing).
    pub(crate) fn admin(&self, op: &str) {
        if let Some(i) = ADMIN_OPS.iter().position(|o| *o == op) {
            self.admin[i].increment(1);
        }
    }

    /// Counts a restart of a store's server.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn store_restart(&self) {
        self.store_restarts.increment(1);
    }
}

/// Any [`RateLimiter`] that records every decision in its [`LimiterMetrics`]. Every limiter of the crate
/// is one, the reconfigurable ones included; for a keyed table call
/// [`LimiterMetrics::record`] on its decisions; the Redis limiters and the HTTP layer take
/// the counters in their options.
#[derive(Debug)]
pub struct Instrumented<L> {
    limiter: L,
    metrics: LimiterMetrics,
}

impl<L> Instrumented<L> {
    /// `limiter`, counted in `metrics`.
    pub fn new(limiter: L, metrics: LimiterMetrics) -> Instrumented<L> {
        Instrumented { limiter, metrics }
    }

    /// The limiter that decides.
    pub fn limiter(&self) -> &L {
        &self.limiter
    }

    /// The counters.
    pub fn metrics(&self) -> &LimiterMetrics {
        &self.metrics
    }
}

impl<L: RateLimiter> RateLimiter for Instrumented<L> {
    #[inline]
    fn check(&self) -> Decision {
        let decision = self.limiter.check();
        self.metrics.record(&decision);
        decision
    }

    #[inline]
    fn check_n(&self, n: u32) -> Result<Decision, InsufficientCapacity> {
        let answer = self.limiter.check_n(n);
        // A peek (`n = 0`) asks for nothing and admits nothing: not a request to count.
        if n != 0 {
            self.metrics.record_answer(&answer);
        }
        answer
    }

    fn quota(&self) -> Quota {
        self.limiter.quota()
    }
}

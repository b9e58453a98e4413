//! One quota across many nodes, held in Redis (or Valkey): [`RedisGcra`] decides each request by
//! one atomic script on the server's clock; [`Leased`] spends tokens leased from it in batches, so
//! that its hot path stays local and lock-free. Behind the `redis` feature (Rust 1.88, tokio).
//!
//! # The pieces
//!
//! * [`RedisStore`]: the connection, to one server ([`RedisStore::connect`], a multiplexed
//!   `ConnectionManager`) or to a cluster ([`RedisStore::connect_cluster`], one such connection
//!   per server, routed by slot), with a circuit breaker per server. TCP_NODELAY, the connection
//!   timeout and the response timeout are set explicitly, and no call is sent twice: a consuming
//!   script sent twice would charge twice. The exceptions are `NOSCRIPT` (the script cache was
//!   flushed, the server restarted or failed over) and `MOVED` (a failover moved the slot), which
//!   prove the script did not run: the call is sent once more, with the script's body or to the
//!   slot's new master, within the same deadline. [`RedisStore::restarts`] counts the restarts it
//!   sees (a server's `run_id` changed): without persistence, each may admit a burst again.
//! * [`RedisGcra`]: GCRA on the server. One key per subject and limit holds the theoretical arrival
//!   time; the script reads `TIME`, decides, writes with a `PX` expiry at the instant the subject
//!   is full again (idle subjects vanish by themselves), and answers the same figures as the local
//!   [`Gcra`](crate::Gcra). Several limits (per second and per minute) are checked in one call,
//!   all or nothing; their keys share a `{hash tag}`, so they live in one slot of a cluster.
//! * [`Leased`]: a local lease of tokens, granted *up to* a size by the same script, refilled in
//!   the background below a low-water mark, expiring after a TTL `E`. Over any window `W`, all
//!   nodes together admit at most `burst + rate × (W + E)`.
//! * [`RedisOptions`]: each call's deadline, the circuit breaker, and the [`FailurePolicy`] that
//!   decides while the store cannot answer. [`Decision::decided_by`](crate::Decision::decided_by)
//!   tells which path decided.
//!
//! `docs/design.md` has the distributed design, and the argument for the bound.
//!
//! # Without an async runtime
//!
//! The client needs a tokio runtime to drive its connection. Code without an async runtime keeps
//! one beside the limiter and blocks on each check; no separate blocking type is needed:
//!
//! ```no_run
//! use atomic_limiter::Quota;
//! use atomic_limiter::redis::{RedisGcra, RedisOptions, RedisStore};
//!
//! # fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
//! let options = RedisOptions::default();
//! let limiter = runtime.block_on(async {
//!     let store = RedisStore::connect("redis://127.0.0.1:6379/", &options).await?;
//!     Ok::<_, Box<dyn std::error::Error>>(RedisGcra::new(store, "api", Quota::per_second(10))?)
//! })?;
//! // Blocks this thread for at most the deadline.
//! let decision = runtime.block_on(limiter.check("client-42"));
//! # let _ = decision;
//! # Ok(())
//! # }
//! ```
//!
//! # Example
//!
//! ```no_run
//! use atomic_limiter::Quota;
//! use atomic_limiter::redis::{RedisGcra, RedisOptions, RedisStore};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let options = RedisOptions::default();
//! let store = RedisStore::connect("redis://127.0.0.1:6379/", &options).await?;
//! // 10 per second and 300 per minute, for each subject, checked together.
//! let limiter = RedisGcra::with_limits(
//!     store,
//!     "api",
//!     [("second", Quota::per_second(10)), ("minute", Quota::per_minute(300))],
//!     options,
//! )?;
//! let decision = limiter.check("client-42").await;
//! if decision.is_denied() {
//!     // 429, Retry-After: decision.retry_after_secs()
//! }
//! # Ok(())
//! # }
//! ```

use core::fmt;
use core::time::Duration;

use crate::decision::{DecidedBy, Decision};
use crate::quota::InsufficientCapacity;
use crate::quota::Quota;

mod access;
mod breaker;
mod calendar;
mod cluster;
mod leased;
mod node;
pub(crate) mod remote;
mod script;
mod sentinel;
mod store;

#[cfg(feature = "redis-tls")]
pub use access::TlsOptions;
pub use calendar::RedisCalendarWindow;
#[cfg(feature = "rls")]
pub(crate) use leased::Taken;
pub use leased::{LeaseOptions, Leased, LeasedCharge};
pub use remote::{RedisCharge, RedisGcra};
pub use store::RedisStore;

/// What a limiter does while the store cannot answer within its deadline (or its circuit breaker
/// is open).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum FailurePolicy {
    /// Admit every request ([`DecidedBy::FailOpen`]): availability over the quota.
    Open,
    /// Refuse every request ([`DecidedBy::FailClosed`]), with a retry-after of the breaker's
    /// cooldown: the quota over availability. The default.
    Closed,
    /// Decide locally on this node's share of the quota ([`DecidedBy::FailLocal`]): a [`Leased`]
    /// first spends what is left of its lease. With `N` nodes each given `1/N` of the quota, the
    /// total stays within the quota while the store is gone.
    Local {
        /// This node's share, per subject.
        share: Quota,
    },
}

/// How a limiter talks to the store and what it does when the store is slow or gone.
#[derive(Debug, Clone)]
pub struct RedisOptions {
    deadline: Duration,
    connect_timeout: Duration,
    failures_to_open: u32,
    cooldown: Duration,
    policy: FailurePolicy,
    max_local_keys: usize,
    /// Credentials and TLS for every connection the store makes (never printed).
    access: access::Access,
    #[cfg(feature = "metrics")]
    metrics: Option<crate::instrument::LimiterMetrics>,
}

impl Default for RedisOptions {
    /// A 5 ms deadline per call, a 250 ms connection timeout, a breaker that opens after 3
    /// consecutive failures for 250 ms (±50 %), and [`FailurePolicy::Closed`].
    fn default() -> RedisOptions {
        RedisOptions {
            deadline: Duration::from_millis(5),
            connect_timeout: Duration::from_millis(250),
            failures_to_open: 3,
            cooldown: Duration::from_millis(250),
            policy: FailurePolicy::Closed,
            max_local_keys: 100_000,
            access: access::Access::default(),
            #[cfg(feature = "metrics")]
            metrics: None,
        }
    }
}

impl RedisOptions {
    /// The most one call to the store may take, round trip included (also set as the client's
    /// response timeout). A call past it counts as a failure and the policy decides.
    pub fn with_deadline(mut self, deadline: Duration) -> RedisOptions {
        self.deadline = deadline;
        self
    }

    /// The most a (re)connection may take.
    pub fn with_connect_timeout(mut self, timeout: Duration) -> RedisOptions {
        self.connect_timeout = timeout;
        self
    }

    /// Open the circuit after this many consecutive failures (at least 1), for `cooldown` (±50 %
    /// jitter); then one probe call decides whether it closes. The breakers are the store's, one
    /// per server (a cluster's failing node opens its own, the others stay closed): read from the
    /// options given to [`RedisStore::connect`] or [`RedisStore::connect_cluster`]. The cooldown
    /// is also the retry-after a refusal under the failure policy gives.
    pub fn with_breaker(mut self, failures_to_open: u32, cooldown: Duration) -> RedisOptions {
        self.failures_to_open = failures_to_open;
        self.cooldown = cooldown;
        self
    }

    /// What to do while the store cannot answer.
    pub fn with_policy(mut self, policy: FailurePolicy) -> RedisOptions {
        self.policy = policy;
        self
    }

    /// Logs in as the ACL user `user` with `password` (`AUTH user password`; `default` for a
    /// server that has only `requirepass`), in place of any credentials in the URL. Neither is
    /// ever printed: `Debug` shows the user and `<redacted>`. `docs/design.md` §11 lists the
    /// least-privilege ACL the limiters need.
    pub fn with_credentials(
        mut self,
        user: impl Into<String>,
        password: impl Into<String>,
    ) -> RedisOptions {
        self.access.credentials = Some(access::Credentials::new(user.into(), password.into()));
        self
    }

    /// What TLS connections (`rediss://` URLs) trust and present: a private CA, a client
    /// certificate for mutual TLS (feature `redis-tls`). Without it, a `rediss://` URL checks the
    /// server against the system's roots.
    #[cfg(feature = "redis-tls")]
    pub fn with_tls(mut self, tls: TlsOptions) -> RedisOptions {
        self.access.tls = Some(tls);
        self
    }

    /// Under [`FailurePolicy::Local`], the most subjects [`RedisGcra`] tracks locally at once.
    pub fn with_max_local_keys(mut self, max_keys: usize) -> RedisOptions {
        self.max_local_keys = max_keys;
        self
    }

    /// Counts every decision the limiter returns, each call to the store that got no answer (by
    /// reason) and each lease granted, in `metrics` (feature `metrics`).
    #[cfg(feature = "metrics")]
    pub fn with_metrics(mut self, metrics: crate::instrument::LimiterMetrics) -> RedisOptions {
        self.metrics = Some(metrics);
        self
    }

    /// Counts the decision on a request for `n` tokens, if counters were given; a peek
    /// (`n = 0`) is no request and is not counted.
    #[inline]
    pub(crate) fn count(&self, n: u32, answer: &Result<Decision, InsufficientCapacity>) {
        #[cfg(feature = "metrics")]
        if let Some(m) = &self.metrics {
            if n != 0 {
                m.record_answer(answer);
            }
        }
        let _ = (n, answer);
    }

    /// Counts a call to the store that got no answer, if counters were given.
    pub(crate) fn count_failure(&self, error: &StoreError) {
        #[cfg(feature = "metrics")]
        if let Some(m) = &self.metrics {
            use crate::instrument::BackendError;
            m.backend_error(match error {
                StoreError::Timeout(_) => BackendError::Timeout,
                StoreError::CircuitOpen { .. } => BackendError::CircuitOpen,
                StoreError::Redis(_) => BackendError::Redis,
                StoreError::BadReply => BackendError::BadReply,
            });
        }
        let _ = error;
    }

    /// When a client refused after the failure `e` may try again: when the breaker lets a call
    /// through, or one cooldown.
    pub(crate) fn failure_retry_ns(&self, e: &StoreError) -> u64 {
        match e {
            StoreError::CircuitOpen { retry_after } => {
                u64::try_from(retry_after.as_nanos()).unwrap_or(u64::MAX)
            }
            _ => self.cooldown_ns(),
        }
    }

    /// Counts a settlement or an operator's change of a subject, if counters were given.
    pub(crate) fn count_admin(&self, op: &str) {
        #[cfg(feature = "metrics")]
        if let Some(m) = &self.metrics {
            m.admin(op);
        }
        let _ = op;
    }

    /// Counts a lease granted, if counters were given.
    pub(crate) fn count_lease(&self) {
        #[cfg(feature = "metrics")]
        if let Some(m) = &self.metrics {
            m.lease_refill();
        }
    }

    /// Counts a restart of one of the store's servers, if counters were given.
    pub(crate) fn count_restart(&self) {
        #[cfg(feature = "metrics")]
        if let Some(m) = &self.metrics {
            m.store_restart();
        }
    }

    /// The instant a call that starts now must end by: one deadline away, or (for a deadline
    /// too long for the clock, from a config file) about a century.
    pub(crate) fn until(&self) -> tokio::time::Instant {
        let now = tokio::time::Instant::now();
        now.checked_add(self.deadline)
            .unwrap_or_else(|| now + Duration::from_secs(100 * 365 * 86_400))
    }

    /// The deadline of each call.
    pub fn deadline(&self) -> Duration {
        self.deadline
    }

    /// The failure policy.
    pub fn policy(&self) -> FailurePolicy {
        self.policy
    }

    pub(crate) fn cooldown_ns(&self) -> u64 {
        u64::try_from(self.cooldown.as_nanos()).unwrap_or(u64::MAX)
    }
}

/// Why the store gave no decision.
#[derive(Debug)]
#[non_exhaustive]
pub enum StoreError {
    /// No answer within the deadline.
    Timeout(Duration),
    /// The circuit breaker is open: no call was made. It half-opens after `retry_after`.
    CircuitOpen {
        /// Until the breaker lets a probe through.
        retry_after: Duration,
    },
    /// The client or the server reported an error.
    Redis(::redis::RedisError),
    /// The server's reply was not the script's (another script under the same key names?).
    BadReply,
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreError::Timeout(d) => write!(f, "the store did not answer within {d:?}"),
            StoreError::CircuitOpen { retry_after } => {
                write!(
                    f,
                    "circuit open: the store is not called for {retry_after:?}"
                )
            }
            StoreError::Redis(e) => write!(f, "redis: {e}"),
            StoreError::BadReply => f.write_str("the store's reply is not the limiter script's"),
        }
    }
}

impl std::error::Error for StoreError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            StoreError::Redis(e) => Some(e),
            _ => None,
        }
    }
}

impl From<::redis::RedisError> for StoreError {
    fn from(e: ::redis::RedisError) -> StoreError {
        StoreError::Redis(e)
    }
}

/// Why a distributed limiter cannot be built.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum RedisConfigError {
    /// No limit was given.
    NoLimits,
    /// Two limits have this name (they would share one key).
    DuplicateLimit {
        /// The name.
        limit: String,
    },
    /// This limit's window (a full burst's worth of time) is longer than the script can keep:
    /// 2^51 µs, 71 years. (Windows past 2^51 units of the local [`Gcra`](crate::Gcra), 26 days
    /// for a period of whole nanoseconds, are kept in whole microseconds, the period rounded up
    /// to the next one.)
    WindowTooLong {
        /// The limit's name.
        limit: String,
    },
    /// No limit has this name ([`RedisGcra::set_quota`], or an HTTP policy on the limiter).
    UnknownLimit {
        /// The name asked for.
        limit: String,
    },
    /// An HTTP policy on a limiter whose store is a Redis Cluster: one request's policies key
    /// different subjects, whose keys lie in different slots, so no one script can decide them
    /// together.
    PoliciesOnCluster {
        /// The policy's limit.
        limit: String,
    },
}

impl fmt::Display for RedisConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RedisConfigError::NoLimits => f.write_str("a distributed limiter needs a limit"),
            RedisConfigError::DuplicateLimit { limit } => {
                write!(f, "two limits are named `{limit}`")
            }
            RedisConfigError::UnknownLimit { limit } => write!(f, "no limit is named `{limit}`"),
            RedisConfigError::PoliciesOnCluster { limit } => write!(
                f,
                "limit `{limit}`: HTTP policies need one server or Sentinel, not a cluster, to decide a request's subjects in one script"
            ),
            RedisConfigError::WindowTooLong { limit } => write!(
                f,
                "limit `{limit}`: a full burst spans more time than the script can keep (71 years at most)"
            ),
        }
    }
}

impl std::error::Error for RedisConfigError {}

/// The decision while the store cannot answer: the policy's. Under [`FailurePolicy::Local`],
/// `local` decides on this node's share (`None` where there is no share limiter: refused).
fn failure_decision(
    policy: FailurePolicy,
    limit: u32,
    retry_ns: u64,
    local: impl FnOnce() -> Option<Result<Decision, InsufficientCapacity>>,
) -> Decision {
    let retry_us = retry_ns.div_ceil(1000).max(1);
    // Nothing is known of the remainder: 0, so that no client bursts on the strength of it.
    let refused = |by| script::decision(false, 0, retry_us, 0, limit, by);
    match policy {
        FailurePolicy::Open => script::decision(true, 0, 0, 0, limit, DecidedBy::FailOpen),
        FailurePolicy::Local { .. } => match local() {
            Some(Ok(d)) => d.decided_by_(DecidedBy::FailLocal),
            // More than the share's burst.
            Some(Err(_)) => refused(DecidedBy::FailLocal),
            None => refused(DecidedBy::FailClosed),
        },
        FailurePolicy::Closed => refused(DecidedBy::FailClosed),
    }
}

#[cfg(test)]
mod tests;

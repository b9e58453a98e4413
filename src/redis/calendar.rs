//! [`RedisCalendarWindow`]: a fixed window on UTC calendar boundaries, shared by every node, one
//! atomic script (`calendar.lua`) per decision on the server's clock.

use alloc::string::String;
use alloc::sync::Arc;

use super::node::Lua;
use super::store::RedisStore;
use super::{RedisOptions, StoreError, failure_decision, script};
use crate::decision::{DecidedBy, Decision};
use crate::quota::InsufficientCapacity;
use crate::window::civil::Calendar;

/// The script's source, as the server runs it: the helpers every script shares, then its own.
pub(crate) const SOURCE: &str = concat!(include_str!("shared.lua"), include_str!("calendar.lua"));

/// At most `limit` per calendar period in UTC for each subject, across every node that uses the
/// same store and prefix: a plan of 10 000 calls a month, reset at midnight UTC on the first.
///
/// It decides as the local [`CalendarWindow`](crate::CalendarWindow) does, on the server's clock:
/// one script reads `TIME`, finds the period (a UTC minute, hour, day, ISO week, month or year),
/// and counts in it; the key expires when the period ends. A subject's key is
/// `<prefix>:{=<subject>}:<period>`. Every call is bounded by the options' deadline; past it, or
/// while the breaker is open, [`FailurePolicy::Open`](super::FailurePolicy::Open) admits and every
/// other policy refuses (a share of a calendar quota is no rate to decide locally on).
///
/// # Examples
///
/// ```no_run
/// use atomic_limiter::Calendar;
/// use atomic_limiter::redis::{RedisCalendarWindow, RedisOptions, RedisStore};
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let options = RedisOptions::default();
/// let store = RedisStore::connect("redis://127.0.0.1:6379/", &options).await?;
/// let plan = RedisCalendarWindow::new(store, "plan", 10_000, Calendar::Month, options);
/// let decision = plan.check("customer-42").await;
/// if decision.is_denied() {
///     // 429 until the first of next month: decision.retry_after()
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct RedisCalendarWindow {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    store: RedisStore,
    script: Lua,
    prefix: String,
    limit: u32,
    period: Calendar,
    options: RedisOptions,
}

impl RedisCalendarWindow {
    /// `limit` per `period` for every subject, under `prefix`.
    pub fn new(
        store: RedisStore,
        prefix: &str,
        limit: u32,
        period: Calendar,
        options: RedisOptions,
    ) -> RedisCalendarWindow {
        RedisCalendarWindow {
            inner: Arc::new(Inner {
                store,
                script: Lua::new(SOURCE),
                prefix: prefix.into(),
                limit,
                period,
                options,
            }),
        }
    }

    /// Checks one request for `subject`.
    pub async fn check(&self, subject: &str) -> Decision {
        match self.check_n(subject, 1).await {
            Ok(d) => d,
            // A limit of 0: no request ever passes.
            Err(_) => Decision::never(self.inner.limit),
        }
    }

    /// Checks `n` tokens for `subject`, all or nothing; `n = 0` peeks and writes nothing.
    ///
    /// # Errors
    ///
    /// [`InsufficientCapacity`] if `n` exceeds the limit (no round trip).
    pub async fn check_n(&self, subject: &str, n: u32) -> Result<Decision, InsufficientCapacity> {
        InsufficientCapacity::check(n, self.inner.limit)?;
        let answer = match self.try_check_n(subject, n).await {
            Ok(d) => d,
            Err(e) => {
                let retry = self.inner.options.failure_retry_ns(&e);
                failure_decision(self.inner.options.policy, self.inner.limit, retry, || None)
            }
        };
        let answer = Ok(answer);
        self.inner.options.count(n, &answer);
        answer
    }

    /// Like [`RedisCalendarWindow::check_n`], without the failure policy: the store's decision,
    /// or why there is none.
    pub async fn try_check_n(&self, subject: &str, n: u32) -> Result<Decision, StoreError> {
        let inner = &*self.inner;
        let keys = [self.key(subject)];
        let args = [inner.period.code(), u64::from(inner.limit), u64::from(n)];
        let until = inner.options.until();
        let values = inner.store.invoke(&inner.script, &keys, &args, until).await;
        let decision = values.and_then(|v| decided(&v, inner.limit).ok_or(StoreError::BadReply));
        if let Err(e) = &decision {
            inner.options.count_failure(e);
        }
        decision
    }

    /// The key that holds `subject`'s count.
    pub fn key(&self, subject: &str) -> String {
        let period = match self.inner.period {
            Calendar::Minute => "minute",
            Calendar::Hour => "hour",
            Calendar::Day => "day",
            Calendar::Week => "week",
            Calendar::Month => "month",
            Calendar::Year => "year",
        };
        alloc::format!("{}:{{={subject}}}:{period}", self.inner.prefix)
    }
}

/// The decision of the script's four integers; `None` for anything else.
pub(crate) fn decided(values: &[i64], limit: u32) -> Option<Decision> {
    let &[allowed, remaining, retry, reset] = values else {
        return None;
    };
    let allowed = match allowed {
        0 => false,
        1 => true,
        _ => return None,
    };
    Some(script::decision(
        allowed,
        u32::try_from(remaining).ok().filter(|r| *r <= limit)?,
        u64::try_from(retry).ok()?,
        u64::try_from(reset).ok()?,
        limit,
        DecidedBy::Store,
    ))
}

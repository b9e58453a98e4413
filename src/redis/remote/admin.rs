//! A charge settled on the store ([`RedisGcra::charge`], [`RedisCharge`]), and an operator's
//! changes of a subject ([`RedisGcra::reset`], [`RedisGcra::remove`], [`RedisGcra::penalize`],
//! [`RedisGcra::block`]): each one atomic script (`admin.lua`) on the server's clock, on the very
//! state the deciding script keeps.

use alloc::string::String;
use alloc::sync::Arc;
use alloc::vec::Vec;
use core::time::Duration;

use super::{Limit, RedisGcra, decided, smallest_burst};
use crate::decision::Decision;
use crate::quota::InsufficientCapacity;
use crate::redis::StoreError;
use crate::redis::script::{Mode, Reply};

/// The most microseconds a block asks for: past the state's debt bound anyway, and an exact
/// integer in a double.
const MAX_BLOCK_US: u64 = 1 << 50;

/// What a settlement needs: the limits the charge was made on, the TAT each write left (whole
/// µs and remainder), and the tokens taken.
type Marks = (Arc<[Limit]>, Vec<[u64; 2]>, u32);

/// The operations of `admin.lua`.
#[derive(Debug, Clone, Copy)]
enum Op {
    Settle = 1,
    Penalize = 2,
    Block = 3,
    Remove = 4,
}

/// An admission on an estimate in the store, to be settled at the actual cost: from
/// [`RedisGcra::charge`].
///
/// It settles as a local [`Charge`](crate::Charge) does, in one script on the server's clock:
/// more than the estimate is owed as debt (at most 2^50 units past the window: 13 days past it
/// for periods of whole nanoseconds, 35 years for windows kept in whole microseconds); less gives
/// the difference back, never behind now, only while the charge's write is still the subject's
/// state (its latest change), and only to a state still
/// under the quota it was charged under (after [`RedisGcra::set_quota`] nothing comes
/// back, which can only under-admit). The guard owns its limiter and subject, and `settle`
/// consumes it: the settlement goes where the charge was made, once. Dropped, it stands at the
/// estimate. A charge refused, or decided by a failure policy, settles nothing.
#[derive(Debug)]
#[must_use = "a charge is settled at its estimate when dropped: settle it at the actual cost"]
pub struct RedisCharge {
    limiter: RedisGcra,
    subject: String,
    decision: Decision,
    marks: Option<Marks>,
}

impl RedisCharge {
    /// The decision the charge was made with.
    pub fn decision(&self) -> Decision {
        self.decision
    }

    /// Whether the estimate was admitted.
    pub fn is_allowed(&self) -> bool {
        self.decision.is_allowed()
    }

    /// Settles the charge at `actual` tokens, in one call within the limiter's deadline.
    ///
    /// # Errors
    ///
    /// The [`StoreError`] of a call that got no answer: the charge then stands at the estimate
    /// (the surplus is not given back; an excess is not owed).
    pub async fn settle(self, actual: u32) -> Result<(), StoreError> {
        let Some((limits, ends, taken)) = self.marks else {
            return Ok(());
        };
        if actual == taken {
            return Ok(());
        }
        let l = &self.limiter;
        let answer = l
            .admin_call(
                &self.subject,
                Op::Settle,
                &limits,
                |i| ends[i],
                &[u64::from(taken), u64::from(actual)],
            )
            .await;
        l.inner.options.count_admin("settle");
        answer.map(|_| ())
    }
}

impl RedisGcra {
    /// Admits `estimate` tokens for `subject` under every limit, all or nothing, as
    /// [`check_n`](RedisGcra::check_n) does, and returns a [`RedisCharge`] to settle at the
    /// actual cost once it is known.
    ///
    /// # Errors
    ///
    /// [`InsufficientCapacity`] if `estimate` exceeds a limit's burst (no round trip).
    ///
    /// # Examples
    ///
    /// An LLM gateway's tokens per minute, shared by every replica:
    ///
    /// ```no_run
    /// use atomic_limiter::Quota;
    /// use atomic_limiter::redis::{RedisGcra, RedisStore, RedisOptions};
    ///
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// let store = RedisStore::connect("redis://127.0.0.1:6379/", &RedisOptions::default()).await?;
    /// let tokens = RedisGcra::new(store, "llm", Quota::per_minute(100_000))?;
    /// let charge = tokens.charge("team-a", 4_000).await?;
    /// if charge.is_allowed() {
    ///     let used = 1_250; // counted from the response
    ///     charge.settle(used).await?;
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub async fn charge(
        &self,
        subject: &str,
        estimate: u32,
    ) -> Result<RedisCharge, InsufficientCapacity> {
        let limits = self.limits();
        for l in limits.iter() {
            InsufficientCapacity::check(estimate, l.quota.burst())?;
        }
        let until = self.inner.options.until();
        let reply = match self
            .invoke(subject, estimate, Mode::Charge, &limits, until)
            .await
        {
            Ok(values) => charged(&values, limits.len()).ok_or(StoreError::BadReply),
            Err(e) => Err(e),
        };
        let (decision, marks) = match reply {
            Ok((reply, ends)) => {
                let decision = decided(reply, estimate, &limits)?;
                let marks = ends.map(|ends| (limits.clone(), ends, estimate));
                (decision, marks)
            }
            Err(e) => {
                let burst = smallest_burst(&limits);
                (self.on_failure(subject, estimate, &e, burst), None)
            }
        };
        self.inner.options.count(estimate, &Ok(decision));
        Ok(RedisCharge {
            limiter: self.clone(),
            subject: subject.into(),
            decision,
            marks,
        })
    }

    /// Takes `n` more tokens from `subject` under every limit, going into debt past the burst
    /// (at most 2^50 units past the window): a penalty for abuse, in one script.
    ///
    /// # Errors
    ///
    /// The [`StoreError`] of a call that got no answer.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use atomic_limiter::Quota;
    /// use atomic_limiter::redis::{RedisGcra, RedisOptions, RedisStore};
    /// use std::time::Duration;
    ///
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// let store = RedisStore::connect("redis://127.0.0.1:6379/", &RedisOptions::default()).await?;
    /// let api = RedisGcra::new(store, "api", Quota::per_second(10))?;
    /// api.penalize("mallory", 50).await?; // 50 more, into debt
    /// # Ok(())
    /// # }
    /// ```
    pub async fn penalize(&self, subject: &str, n: u32) -> Result<(), StoreError> {
        let limits = self.limits();
        let answer = self
            .admin_call(subject, Op::Penalize, &limits, |_| [0, 0], &[u64::from(n)])
            .await;
        self.inner.options.count_admin("penalize");
        answer.map(|_| ())
    }

    /// Refuses `subject` for `duration` from now on the server's clock, with that retry-after
    /// (rounded up to whole microseconds) for one token; a limit that already owes more is left
    /// as it is. In one script.
    ///
    /// # Errors
    ///
    /// The [`StoreError`] of a call that got no answer.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use atomic_limiter::Quota;
    /// use atomic_limiter::redis::{RedisGcra, RedisOptions, RedisStore};
    /// use std::time::Duration;
    ///
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// let store = RedisStore::connect("redis://127.0.0.1:6379/", &RedisOptions::default()).await?;
    /// let api = RedisGcra::new(store, "api", Quota::per_second(10))?;
    /// api.block("203.0.113.9", Duration::from_secs(3600)).await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn block(&self, subject: &str, duration: Duration) -> Result<(), StoreError> {
        let limits = self.limits();
        let us = u64::try_from(duration.as_nanos().div_ceil(1000))
            .unwrap_or(u64::MAX)
            .min(MAX_BLOCK_US);
        let answer = self
            .admin_call(subject, Op::Block, &limits, |_| [0, 0], &[us])
            .await;
        self.inner.options.count_admin("block");
        answer.map(|_| ())
    }

    /// Forgets `subject` under every limit (its keys are deleted: a missing key is a full
    /// limit); whether any was held. The user needs `+del` for it (the checks do not).
    ///
    /// # Errors
    ///
    /// The [`StoreError`] of a call that got no answer.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use atomic_limiter::Quota;
    /// use atomic_limiter::redis::{RedisGcra, RedisOptions, RedisStore};
    /// use std::time::Duration;
    ///
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// let store = RedisStore::connect("redis://127.0.0.1:6379/", &RedisOptions::default()).await?;
    /// let api = RedisGcra::new(store, "api", Quota::per_second(10))?;
    /// let was_held = api.remove("customer-42").await?;
    /// # let _ = (was_held, Duration::ZERO);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn remove(&self, subject: &str) -> Result<bool, StoreError> {
        let answer = self.forget(subject).await;
        self.inner.options.count_admin("remove");
        answer
    }

    /// Makes `subject` full again under every limit; whether it was held. On the store a full
    /// limit is a missing key, so this is [`RedisGcra::remove`] under the name users look for
    /// (counted as a reset). To read a subject's state without taking anything, peek:
    /// `check_n(subject, 0)`.
    ///
    /// # Errors
    ///
    /// The [`StoreError`] of a call that got no answer.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use atomic_limiter::Quota;
    /// use atomic_limiter::redis::{RedisGcra, RedisOptions, RedisStore};
    /// use std::time::Duration;
    ///
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// let store = RedisStore::connect("redis://127.0.0.1:6379/", &RedisOptions::default()).await?;
    /// let api = RedisGcra::new(store, "api", Quota::per_second(10))?;
    /// api.reset("customer-42").await?; // full again
    /// let peek = api.check_n("customer-42", 0).await?; // its state, nothing taken
    /// # let _ = (peek, Duration::ZERO);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn reset(&self, subject: &str) -> Result<bool, StoreError> {
        let answer = self.forget(subject).await;
        self.inner.options.count_admin("reset");
        answer
    }

    async fn forget(&self, subject: &str) -> Result<bool, StoreError> {
        let limits = self.limits();
        let changed = self
            .admin_call(subject, Op::Remove, &limits, |_| [0, 0], &[])
            .await?;
        Ok(changed > 0)
    }

    /// One call of `admin.lua` for `subject` on `limits`: `op`, each limit's quota and the two
    /// numbers `per_limit` gives it, then `tail`. How many keys it changed.
    async fn admin_call(
        &self,
        subject: &str,
        op: Op,
        limits: &[Limit],
        per_limit: impl Fn(usize) -> [u64; 2],
        tail: &[u64],
    ) -> Result<i64, StoreError> {
        let inner = &*self.inner;
        let keys: Vec<String> = limits.iter().map(|l| self.key(subject, &l.name)).collect();
        let mut args: Vec<u64> = Vec::with_capacity(1 + 5 * limits.len() + tail.len());
        args.push(op as u64);
        for (i, l) in limits.iter().enumerate() {
            args.extend(l.script.quota_args());
            args.extend(per_limit(i));
        }
        args.extend(tail);
        let until = inner.options.until();
        let reply = match inner.store.invoke(&inner.admin, &keys, &args, until).await {
            Ok(values) => match values[..] {
                [changed] if changed >= 0 => Ok(changed),
                _ => Err(StoreError::BadReply),
            },
            Err(e) => Err(e),
        };
        if let Err(e) = &reply {
            inner.options.count_failure(e);
        }
        reply
    }
}

/// A charge's reply: the decision, and for an admission the TAT each of `limits` limits' write
/// left (whole µs and remainder); `None` for anything else.
fn charged(values: &[i64], limits: usize) -> Option<(Reply, Option<Vec<[u64; 2]>>)> {
    let (head, rest) = values.split_at_checked(6)?;
    let reply = Reply::parse(head, limits)?;
    if rest.is_empty() {
        let admitted = matches!(
            reply,
            Reply::Decided {
                allowed: true,
                granted: 1..,
                ..
            }
        );
        return (!admitted).then_some((reply, None));
    }
    if rest.len() != 2 * limits {
        return None;
    }
    let ends = rest
        .chunks_exact(2)
        .map(|e| Some([u64::try_from(e[0]).ok()?, u64::try_from(e[1]).ok()?]))
        .collect::<Option<Vec<_>>>()?;
    Some((reply, Some(ends)))
}

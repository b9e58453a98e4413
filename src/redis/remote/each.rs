//! Several subjects' limits decided in one call: the HTTP layer's Redis policies.

use alloc::string::String;
use alloc::vec::Vec;

use super::{Limit, RedisGcra};
use crate::decision::{DecidedBy, Decision};
use crate::quota::{InsufficientCapacity, Quota};
#[cfg(feature = "tower")]
use crate::redis::RedisConfigError;
use crate::redis::StoreError;
use crate::redis::script::{self, Each, Mode, Reply};

/// One part of a call to [`RedisGcra::check_each`]: a subject held to the limit of that name,
/// asked `n` tokens; a part in shadow mode decides only for itself (it takes its tokens if the
/// call passes and it has room, and never refuses the call).
#[derive(Debug, Clone)]
pub(crate) struct Part {
    pub(crate) subject: String,
    pub(crate) limit: String,
    pub(crate) n: u32,
    pub(crate) shadow: bool,
}

/// What [`RedisGcra::check_each`] says of one part: its decision (`None`: not decided, because
/// another part's burst is smaller than the request) and the quota it is held to.
pub(crate) type EachAnswer = (Option<Result<Decision, InsufficientCapacity>>, Quota);

impl RedisGcra {
    /// Whether a policy may name the limit `limit` of this limiter: it must be one of its limits,
    /// and the store one whose script may touch keys of several subjects (not a cluster, where
    /// they lie in different slots).
    #[cfg(feature = "tower")]
    pub(crate) fn policy_limit(&self, limit: &str) -> Result<(), RedisConfigError> {
        if self.inner.store.is_cluster() {
            return Err(RedisConfigError::PoliciesOnCluster {
                limit: limit.into(),
            });
        }
        if !self.limits().iter().any(|l| l.name == limit) {
            return Err(RedisConfigError::UnknownLimit {
                limit: limit.into(),
            });
        }
        Ok(())
    }

    /// Whether `other` is this limiter (a clone of it): their policies go in one call.
    #[cfg(feature = "tower")]
    pub(crate) fn same(&self, other: &RedisGcra) -> bool {
        alloc::sync::Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// Decides every part at once, all or nothing (but for parts in shadow mode), in one atomic
    /// script: each part's figures as it stands after the decision. Counted once, as one check
    /// of the largest part.
    pub(crate) async fn check_each(&self, parts: &[Part]) -> Vec<EachAnswer> {
        let n = parts.iter().map(|p| p.n).max().unwrap_or(0);
        let limits = self.limits();
        // A limit removed since the policy was made cannot happen (limits are only retuned):
        // such a part is held to none and refused, which errs towards refusing.
        let held: Vec<Option<&Limit>> = parts
            .iter()
            .map(|p| limits.iter().find(|l| l.name == p.limit))
            .collect();
        let quota = |i: usize| held[i].map_or(Quota::per_second(1), |l| l.quota);
        let Some(held) = held.iter().copied().collect::<Option<Vec<&Limit>>>() else {
            let refused = script::decision(false, 0, 0, 0, 0, DecidedBy::Local);
            return (0..parts.len())
                .map(|i| (Some(Ok(refused)), quota(i)))
                .collect();
        };
        let too_costly = |i: usize| {
            let p = &parts[i];
            InsufficientCapacity::check(p.n, held[i].quota.burst())
                .err()
                .filter(|_| !p.shadow)
        };
        if let Some(e) = (0..parts.len()).find_map(too_costly) {
            // Answered without a round trip, as `check_n` answers it.
            self.inner.options.count(n, &Err(e));
            return (0..parts.len())
                .map(|i| (too_costly(i).map(Err), held[i].quota))
                .collect();
        }
        let keys: Vec<String> = parts
            .iter()
            .map(|p| self.key(&p.subject, &p.limit))
            .collect();
        let mut args: Vec<u64> = Vec::with_capacity(2 + 6 * held.len());
        args.extend([Mode::Each as u64, u64::from(n)]);
        for l in &held {
            args.extend(l.script.args());
        }
        for p in parts {
            args.extend([u64::from(p.n), u64::from(p.shadow)]);
        }
        let inner = &*self.inner;
        let until = inner.options.until();
        let reply = match inner.store.invoke(&inner.script, &keys, &args, until).await {
            Ok(values) => Each::parse(&values, held.len()).ok_or(StoreError::BadReply),
            Err(e) => Err(e),
        };
        let answers: Vec<EachAnswer> = match reply {
            Ok((
                Reply::Decided {
                    allowed,
                    remaining,
                    retry_us,
                    reset_us,
                    binding,
                    ..
                },
                each,
            )) => {
                let by = DecidedBy::Store;
                let one = script::decision(allowed, remaining, retry_us, reset_us, 0, by);
                inner.options.count(n, &Ok(one));
                (0..parts.len())
                    .map(|i| {
                        let burst = held[i].quota.burst();
                        let d = match &each {
                            Some(each) => {
                                // Admitted where the call passed (a shadow part only with room of
                                // its own); else, by itself, whether it had room.
                                let e = each[i];
                                let room = if allowed && !parts[i].shadow {
                                    true
                                } else {
                                    e.room
                                };
                                script::decision(
                                    room,
                                    e.remaining,
                                    e.retry_us,
                                    e.reset_us,
                                    burst,
                                    by,
                                )
                            }
                            // Told without each limit's figures (a state ahead past any
                            // write): the limit that binds refused, the others undecided.
                            None if i == binding => {
                                script::decision(false, remaining, retry_us, reset_us, burst, by)
                            }
                            None => return (None, held[i].quota),
                        };
                        (Some(Ok(d)), held[i].quota)
                    })
                    .collect()
            }
            Ok((Reply::OverBurst { limit }, _)) => {
                // Checked before the call; a server that says otherwise is believed.
                let e = InsufficientCapacity {
                    requested: n,
                    burst: held[limit].quota.burst(),
                };
                inner.options.count(n, &Err(e));
                (0..parts.len())
                    .map(|i| ((i == limit).then_some(Err(e)), held[i].quota))
                    .collect()
            }
            Err(e) => {
                // Each part as the failure policy decides it (under `Local`, on this node's
                // share of that part's key): counted once, as the call was.
                inner.options.count_failure(&e);
                let answers: Vec<EachAnswer> = (0..parts.len())
                    .map(|i| {
                        let burst = held[i].quota.burst();
                        let d = self.on_failure(&keys[i], parts[i].n, &e, burst);
                        (Some(Ok(d)), held[i].quota)
                    })
                    .collect();
                if let Some((Some(first), _)) = answers
                    .iter()
                    .find(|(a, _)| {
                        a.as_ref()
                            .is_some_and(|a| !a.as_ref().is_ok_and(Decision::is_allowed))
                    })
                    .or(answers.first())
                {
                    inner.options.count(n, first);
                }
                answers
            }
        };
        answers
    }
}

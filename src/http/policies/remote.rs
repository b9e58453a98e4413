//! Policies on Redis: decided by the store, every one on the same limiter in one atomic script,
//! after the local policies have admitted.

use alloc::boxed::Box;
use alloc::string::String;
use alloc::sync::Arc;
use alloc::vec::Vec;

use ::http::{Request, Response};
use bytes::Bytes;
use tower_service::Service;

use super::{Check, Config, Part, Policy, PolicyService, Wanted};
use crate::http::backend::Subject;
use crate::http::fields::PolicyName;
use crate::http::future::{ResponseFuture, State};
use crate::http::key::{KeyError, KeyExtractor, MissingKey, RequestHead};
use crate::http::policy::with_fields;
use crate::redis::remote::each;
use crate::redis::{RedisConfigError, RedisGcra};

/// A policy's key source and its limit on the store, its key type erased.
pub(super) trait RemoteCheck: Send + Sync + 'static {
    /// The request's subject on the store.
    fn subject(&self, head: &RequestHead<'_>) -> Result<String, KeyError>;

    /// The limiter and the name of the limit the policy holds its keys to.
    fn limit(&self) -> (&RedisGcra, &str);
}

struct OnStore<X> {
    key: X,
    limiter: RedisGcra,
    limit: String,
}

impl<X> RemoteCheck for OnStore<X>
where
    X: KeyExtractor,
    X::Key: Subject,
{
    fn subject(&self, head: &RequestHead<'_>) -> Result<String, KeyError> {
        let mut subject = String::new();
        self.key.extract(head)?.write_subject(&mut subject);
        Ok(subject)
    }

    fn limit(&self) -> (&RedisGcra, &str) {
        (&self.limiter, &self.limit)
    }
}

impl Policy {
    /// The policy `name` with its quota on Redis (feature `redis`): each request's key taken by
    /// `key`, as a subject held to the limit named `limit` of `limiter`.
    ///
    /// A request's policies on one limiter (clones of it included) are decided in one atomic
    /// script, all or nothing: give every Redis policy of a layer its own limit of one limiter
    /// ([`RedisGcra::with_limits`]). They are decided after the local policies have admitted,
    /// so a local refusal costs no round trip and spends nothing on the store; a refusal by the
    /// store gives back what the local ones took. Policies on different limiters are decided one
    /// limiter after another, and a refusal by a later one does not give back what an earlier
    /// one took (it errs towards refusing). While the store cannot answer, its failure policy
    /// decides each of its policies.
    ///
    /// # Errors
    ///
    /// [`RedisConfigError::UnknownLimit`] if `limiter` has no limit named `limit`;
    /// [`RedisConfigError::PoliciesOnCluster`] if its store is a Redis Cluster, where one
    /// request's subjects lie in different slots.
    pub fn redis<X>(
        name: &str,
        key: X,
        limiter: &RedisGcra,
        limit: &str,
    ) -> Result<Policy, RedisConfigError>
    where
        X: KeyExtractor,
        X::Key: Subject,
    {
        limiter.policy_limit(limit)?;
        Ok(Policy {
            name: Arc::new(PolicyName::new(name)),
            missing: MissingKey::Reject,
            check: Check::Remote(Box::new(OnStore {
                key,
                limiter: limiter.clone(),
                limit: limit.into(),
            })),
            #[cfg(feature = "metrics")]
            metrics: None,
        })
    }
}

impl Config {
    /// The store's answers for the `wanted` policies, a limiter at a time, in the layer's order;
    /// after a limiter that refuses, the later ones are not asked.
    async fn ask(&self, cost: u32, wanted: &[Wanted]) -> Vec<Part> {
        let remote = |index: usize| match &self.policies[index].check {
            Check::Remote(check) => Some(check.limit()),
            Check::Local(_) => None,
        };
        let mut asked = alloc::vec![false; wanted.len()];
        let mut parts = Vec::with_capacity(wanted.len());
        for first in 0..wanted.len() {
            let Some((limiter, _)) = remote(wanted[first].0).filter(|_| !asked[first]) else {
                continue;
            };
            let mut group = Vec::new();
            let mut calls = Vec::new();
            for (i, (index, subject)) in wanted.iter().enumerate().skip(first) {
                if let Some((_, limit)) = remote(*index).filter(|(l, _)| l.same(limiter)) {
                    asked[i] = true;
                    group.push(*index);
                    calls.push(each::Part {
                        subject: subject.clone(),
                        limit: limit.into(),
                        n: cost,
                        shadow: false,
                    });
                }
            }
            let mut refused = false;
            for (index, (answer, quota)) in group.into_iter().zip(limiter.check_each(&calls).await)
            {
                if let Some(answer) = answer {
                    let part = Part {
                        index,
                        answer,
                        quota,
                    };
                    refused |= part.refused();
                    parts.push(part);
                }
            }
            if refused {
                break;
            }
        }
        parts
    }
}

impl<S> PolicyService<S> {
    /// The path through the store, out of line: its future holds the request and the inner
    /// service made ready (a clone left in its place), and the local `parts` already taken.
    #[inline(never)]
    pub(super) fn remote<ReqB, ResB>(
        &mut self,
        request: Request<ReqB>,
        cost: u32,
        mut parts: Vec<Part>,
        wanted: Vec<Wanted>,
    ) -> ResponseFuture<S::Future, ResB, S::Error>
    where
        S: Service<Request<ReqB>, Response = Response<ResB>> + Clone + Send + 'static,
        S::Future: Send + 'static,
        S::Error: Send + 'static,
        ReqB: Send + 'static,
        ResB: From<Bytes> + Send + 'static,
    {
        let clone = self.inner.clone();
        let mut inner = core::mem::replace(&mut self.inner, clone);
        let config = self.config.clone();
        let future = async move {
            parts.extend(config.ask(cost, &wanted).await);
            parts.sort_by_key(|p| p.index);
            let decided = config.conclude(&RequestHead::of(&request), cost, parts);
            match decided {
                Ok(fields) => {
                    let response = inner.call(request).await?;
                    Ok(with_fields(response, fields))
                }
                Err(answer) => Ok(*answer),
            }
        };
        ResponseFuture {
            state: State::Slow {
                future: Box::pin(future),
            },
        }
    }
}

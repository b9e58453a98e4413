//! [`ResponseFuture`]: the response of a [`RateLimitService`](super::service::RateLimitService).

use super::policy::*;
use alloc::boxed::Box;
use core::future::Future;
use core::pin::Pin;
use core::task::{Context, Poll};

use ::http::Response;
use bytes::Bytes;
use pin_project::pin_project;

pub(super) type SlowFuture<B, E> = Pin<Box<dyn Future<Output = Result<Response<B>, E>> + Send>>;

/// The response future of a [`RateLimitService`](super::RateLimitService).
#[pin_project]
pub struct ResponseFuture<F, B: From<Bytes>, E> {
    #[pin]
    pub(super) state: State<F, B, E>,
}

#[pin_project(project = StateProj)]
pub(super) enum State<F, B: From<Bytes>, E> {
    /// The layer's own answer.
    Answer { response: Option<Box<Response<B>>> },
    /// Admitted on the spot: the inner service's response, with the fields added.
    Inner {
        #[pin]
        future: F,
        fields: Option<Box<Fields>>,
    },
    /// Decided by an awaited backend, or after a delay.
    Slow { future: SlowFuture<B, E> },
}

impl<F, B: From<Bytes>, E> ResponseFuture<F, B, E> {
    /// The inner service's response, with `fields` added when it comes.
    #[inline(always)]
    pub(super) fn inner(future: F, fields: Option<Box<Fields>>) -> Self {
        ResponseFuture {
            state: State::Inner { future, fields },
        }
    }

    pub(super) fn answer(response: Box<Response<B>>) -> Self {
        ResponseFuture {
            state: State::Answer {
                response: Some(response),
            },
        }
    }
}

impl<F, B: From<Bytes>, E> core::fmt::Debug for ResponseFuture<F, B, E> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}

impl<F, B, E> Future for ResponseFuture<F, B, E>
where
    F: Future<Output = Result<Response<B>, E>>,
    B: From<Bytes>,
{
    type Output = Result<Response<B>, E>;

    #[inline(always)]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().state.project() {
            StateProj::Answer { response } => match response.take() {
                Some(response) => Poll::Ready(Ok(*response)),
                // Polled after it finished: a contract breach by the caller, told plainly.
                None => panic!("ResponseFuture polled after completion"),
            },
            StateProj::Inner { future, fields } => {
                // Untouched unless there are fields to add: the inner poll's answer is returned
                // as it is, not moved through a match (a response is some 100 bytes).
                if fields.is_none() {
                    return future.poll(cx);
                }
                match future.poll(cx) {
                    Poll::Ready(result) => {
                        let fields = fields.take();
                        Poll::Ready(result.map(|response| with_fields(response, fields)))
                    }
                    Poll::Pending => Poll::Pending,
                }
            }
            StateProj::Slow { future } => future.as_mut().poll(cx),
        }
    }
}

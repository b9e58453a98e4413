use core::time::Duration;

/// A slot taken by [`Throttle::reserve_refundable`](crate::Throttle::reserve_refundable): when to
/// go, and what to hand back with [`Throttle::refund`](crate::Throttle::refund) if the work is
/// abandoned before it used the slot.
///
/// Refunding is a promise from the caller that the reserved tokens were not used; the throttle
/// cannot check it. Handing back the reservation consumes it, so it cannot be refunded twice. A
/// reservation belongs to the throttle that made it.
#[derive(Debug, PartialEq, Eq)]
#[must_use = "a reservation is a slot: wait it out, or refund it"]
pub struct Reservation {
    pub(crate) wait: Duration,
    /// The reservation's cost in the throttle's units.
    pub(crate) cost: u64,
}

impl Reservation {
    /// How long to wait, from the moment of reserving, before using the slot.
    pub fn wait(&self) -> Duration {
        self.wait
    }
}

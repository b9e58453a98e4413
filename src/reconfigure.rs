//! The reconfiguration wing: limiters whose quota changes at run time, from any thread, while
//! others check, their state carried over as a `Carry` says.
//!
//! | room | what it holds |
//! |---|---|
//! | `cell` | the engine: the cells, the change that replaces the live one, the checks on it |
//! | `reclaim` | the grace periods after which a replaced cell is freed |
//! | `limiter` | [`Reconfigurable`]: one limiter |
//! | `sharded` | [`ReconfigurableSharded`]: a sharded limiter |
//! | `log` | [`ReconfigurableLog`]: the exact sliding log |
//! | `throttle` | [`ReconfigurableThrottle`]: a throttle and its reservations |
//!
//! # Implementation details
//!
//! The quota, the algorithm's parameters and the state word live together in one cell, a whole
//! [`Limiter`], reached through one pointer. A check loads the pointer and runs the limiter's
//! own check on that cell. A reconfiguration builds the new cell, then retires the old one:
//!
//! | step | what it does | why |
//! |---|---|---|
//! | 1 | sets the old cell's `retired` flag | a check that reads the word afterwards steps aside |
//! | 2 | changes the old word by a CAS, and keeps the value it replaced | a check that loaded the word before fails its CAS; every admission that landed is in that value |
//! | 3 | writes the carried state into the new cell's word | the new cell is not visible yet: a plain write |
//! | 4 | publishes the new cell's pointer (`Release`) | a check that meets the flag reloads the pointer and runs again on the new cell |
//! | 5 | notes the checks still open (`reclaim`); the old cell is freed once they have ended, by this change or a later one | no check can still be reading it |
//!
//! So every decision is made on one cell's parameters and that cell's word, and every admission
//! is counted in the word that is carried over: none is lost and none is made twice. A check that
//! meets a retired cell before step 4 waits (spins, then yields) for that few-instruction window;
//! reconfigurations are serialised by a mutex, so only one window is ever open; the new cell and
//! the carry's clock reading are made before it is taken, and nothing waits while it is held. The
//! ordering argument is in `docs/design.md`; loom model 12 checks a check racing a
//! reconfiguration.
//!
//! The cell is reached through a raw pointer, the one way to read it without a lock or a
//! reference count on every check: each `unsafe` block in `cell` is argued where it stands.
#![allow(unsafe_code)]

mod cell;
mod limiter;
mod log;
mod sharded;
#[cfg(all(test, not(atomic_limiter_loom)))]
mod tests;
mod throttle;

pub use self::limiter::Reconfigurable;
pub use self::log::ReconfigurableLog;
pub use self::sharded::ReconfigurableSharded;
pub use self::throttle::ReconfigurableThrottle;

//! The engine of a rate-limit service for Envoy (feature `rls`): Envoy's `ShouldRateLimit`
//! semantics on this crate's GCRA, configured as envoyproxy/ratelimit's YAML files are. The
//! `atomic-limiter-rls` binary (the workspace member `rls/`) serves it over gRPC; this module
//! holds what does not need gRPC, so that it is tested beside the limiters it runs on.
//!
//! Each configured limit is `requests_per_unit` per unit with a burst of `requests_per_unit`:
//! a key that has been idle for a unit passes that many at once, and after that one every
//! `unit / requests_per_unit`. A fixed window (envoyproxy/ratelimit, limitador) instead passes up
//! to twice its limit across a window's edge (the end of one window and the start of the next);
//! GCRA never passes more than `burst` in any span shorter than a unit.
//!
//! ```
//! use atomic_limiter::rls::{Descriptor, DomainConfig, Engine, Entry, Item, RateLimit, Request, Unit};
//!
//! let per_user = Descriptor {
//!     key: "user".into(),
//!     value: None,
//!     rate_limit: Some(RateLimit::Limited { unit: Unit::Minute, requests_per_unit: 2, burst: None }),
//!     shadow_mode: false,
//!     descriptors: vec![],
//! };
//! let engine = Engine::new(&[DomainConfig { domain: "api".into(), descriptors: vec![per_user] }], 10_000)?;
//! let request = Request {
//!     domain: "api",
//!     items: vec![Item { entries: vec![Entry { key: "user", value: "ada" }], hits: None }],
//!     hits_addend: 0,
//! };
//! let over = (0..3).map(|_| engine.decide(&request).unwrap().over_limit).collect::<Vec<_>>();
//! assert_eq!(over, [false, false, true]);
//! # Ok::<(), atomic_limiter::rls::ConfigError>(())
//! ```

mod config;
mod engine;
#[cfg(feature = "redis")]
mod leases;
#[cfg(feature = "redis")]
mod store;

#[cfg(test)]
mod tests;

pub use self::config::{ConfigError, Descriptor, DomainConfig, RateLimit, Unit};
pub use self::engine::{
    Answer, Engine, Entry, Item, MAX_DESCRIPTORS, MAX_ENTRIES, MAX_ENTRY_BYTES, Reloaded, Request,
    RequestError, Status,
};
#[cfg(feature = "redis")]
pub use self::leases::Leasing;
#[cfg(feature = "redis")]
pub use self::store::Remote;

//! One limiter per key, with bounded memory: [`Keyed`](crate::Keyed) and [`KeyQuotas`](crate::KeyQuotas) (at the crate root), and
//! what a custom store needs: the store trait ([`KeyedStore`]), the entry it holds ([`KeyEntry`])
//! and the default hasher ([`KeyHasher`]).
//!
//! | room | what it holds |
//! |---|---|
//! | `table` | [`Keyed`](crate::Keyed): the table, its constructors and the check path |
//! | `entry` | [`KeyEntry`]: one key's state word and its limiter |
//! | `quotas` | [`KeyQuotas`](crate::KeyQuotas): one quota or a function of the key; changes at run time |
//! | `evict` | bounded memory: places, and the full buckets evicted at the cap |
//! | `due` | the eviction index: held keys by when their bucket is full again |
//! | `admin` | [`KeyCharge`]: a key charged on an estimate and settled; an operator's reset, removal, penalty and block |
//! | `store` | the store contract ([`KeyedStore`]), and dashmap and papaya as stores |
//! | `flat` | [`FlatStore`], the default store: slots probed without a lock |

mod admin;
pub(crate) mod due;
mod entry;
mod evict;
mod flat;
mod insert;
#[cfg(feature = "papaya")]
pub(crate) mod pinned;
pub(crate) mod quotas;
pub(crate) mod store;
pub(crate) mod table;
#[cfg(all(test, not(atomic_limiter_loom)))]
mod tests;

pub use self::admin::KeyCharge;
pub use self::entry::KeyEntry;
pub use self::flat::FlatStore;
#[cfg(feature = "papaya")]
pub use self::pinned::Pinned;
pub use self::quotas::QuotaFn;
#[cfg(feature = "papaya")]
pub use self::store::LockFreeStore;
pub use self::store::{Change, KeyedStore, Relocate, Retired};
pub use self::table::DefaultStore;

/// The hasher `Keyed` uses by default: aHash, keyed randomly per process, fast on short keys and
/// resistant to hash flooding (an attacker who cannot see the keys cannot aim keys at one bucket).
/// A store built with another hasher is given to [`Keyed::with_store`](crate::Keyed::with_store);
/// a faster one that resists flooding less suits only keys no client chooses.
pub type KeyHasher = ahash::RandomState;

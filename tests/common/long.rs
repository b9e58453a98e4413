//! The long form of the tests that take minutes: `ATOMIC_LIMITER_LONG_TESTS=1` (set by
//! `.ci/long.sh`) runs them at full size; `cargo test` runs them smaller, every guarantee still
//! checked, so that the README's test command finishes in minutes on two cores.

/// Whether the tests run at full size.
pub fn long() -> bool {
    std::env::var_os("ATOMIC_LIMITER_LONG_TESTS").is_some_and(|v| v != "0")
}

/// `full` when the tests run at full size, else `quick`.
pub fn sized<T>(full: T, quick: T) -> T {
    if long() { full } else { quick }
}

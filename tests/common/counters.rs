//! The counters a `metrics-util` debugging recorder holds, to assert on: shared by the tests of
//! the `metrics` feature (included by path where needed).

use std::collections::BTreeMap;

use metrics_util::debugging::{DebugValue, DebuggingRecorder};

/// Every counter `recorder` holds, as `name{label=value,...}` (labels in registration order) ->
/// count.
pub fn counters(recorder: &DebuggingRecorder) -> BTreeMap<String, u64> {
    recorder
        .snapshotter()
        .snapshot()
        .into_vec()
        .into_iter()
        .filter_map(|(key, _, _, value)| {
            let DebugValue::Counter(n) = value else {
                return None;
            };
            let labels: Vec<String> = key
                .key()
                .labels()
                .map(|l| format!("{}={}", l.key(), l.value()))
                .collect();
            Some((format!("{}{{{}}}", key.key().name(), labels.join(",")), n))
        })
        .collect()
}

/// The count of `atomic_limiter_{name}{labels}`, 0 if it was never registered.
pub fn count(counters: &BTreeMap<String, u64>, name: &str, labels: &str) -> u64 {
    counters
        .get(&format!("atomic_limiter_{name}{{{labels}}}"))
        .copied()
        .unwrap_or(0)
}

/// The `admin_total` counts of `limiter`'s operator changes, in the order settle, penalize, block,
/// reset, remove.
#[allow(dead_code)] // read only by the tests of an operator's changes
pub fn admin_counts(counters: &BTreeMap<String, u64>, limiter: &str) -> [u64; 5] {
    ["settle", "penalize", "block", "reset", "remove"].map(|op| {
        count(
            counters,
            "admin_total",
            &format!("limiter={limiter},op={op}"),
        )
    })
}

//! The response fields a decision is told by: the IETF `RateLimit-Policy` and `RateLimit`
//! structured fields, the legacy `X-RateLimit-*` trio, `Retry-After`, and the problem details.

use alloc::boxed::Box;
use alloc::string::String;
use core::fmt::Write;
use core::time::Duration;

use ::http::HeaderMap;
use ::http::header::{HeaderName, HeaderValue, RETRY_AFTER};
use bytes::Bytes;

use crate::decision::Decision;
use crate::quota::Quota;

/// Which rate-limit fields a response carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Headers {
    /// `RateLimit-Policy` and `RateLimit`, as draft-ietf-httpapi-ratelimit-headers (revision 10)
    /// defines them: `RateLimit-Policy: "default";q=100;w=60` and `RateLimit: "default";r=42;t=3`.
    #[default]
    Ietf,
    /// `X-RateLimit-Limit`, `X-RateLimit-Remaining` and `X-RateLimit-Reset` (seconds until the
    /// quota is whole again), what many clients still read.
    Legacy,
    /// Both sets.
    Both,
    /// None of them (a refusal still carries `Retry-After`).
    None,
}

impl Headers {
    fn ietf(self) -> bool {
        matches!(self, Headers::Ietf | Headers::Both)
    }

    fn legacy(self) -> bool {
        matches!(self, Headers::Legacy | Headers::Both)
    }
}

const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
const X_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
const X_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
const X_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");

/// What a policy's quota counts, for the `qu` parameter of `RateLimit-Policy`.
///
/// The draft's registry of quota units defines `request` (the default, written as no `qu` at
/// all), `content-bytes` and `concurrent-requests`. A quota of something else (an LLM's tokens,
/// credits) names its own unit, which a client that does not know it reads as an opaque count;
/// the draft asks service-specific names to carry a vendor prefix (`"acme-tokens"`).
///
/// # Examples
///
/// A quota of response bytes, told as such:
///
/// ```
/// use atomic_limiter::http::{PeerIp, QuotaUnit, RateLimitLayer};
/// use atomic_limiter::{Keyed, Quota};
///
/// // 10 MB a minute per client, each response charged its length.
/// let layer = RateLimitLayer::builder(PeerIp::new(), Keyed::gcra(Quota::per_minute(10_000_000), 10_000))
///     .quota_unit(QuotaUnit::ContentBytes) // RateLimit-Policy: "default";q=10000000;w=60;qu="content-bytes"
///     .build();
/// # let _ = layer;
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum QuotaUnit {
    /// Requests: no `qu` is written.
    #[default]
    Requests,
    /// `qu="content-bytes"`: bytes of content.
    ContentBytes,
    /// `qu="concurrent-requests"`: requests in flight.
    ConcurrentRequests,
    /// A unit of the service's own, written as given (characters outside printable ASCII, the
    /// double quote and the backslash dropped, so that the field always parses).
    Other(String),
}

impl QuotaUnit {
    /// The `;qu="…"` parameter, or nothing for requests.
    fn parameter(&self) -> Option<String> {
        let name = match self {
            QuotaUnit::Requests => return None,
            QuotaUnit::ContentBytes => "content-bytes",
            QuotaUnit::ConcurrentRequests => "concurrent-requests",
            QuotaUnit::Other(name) => name,
        };
        let clean: String = name
            .chars()
            .filter(|c| (' '..='~').contains(c) && *c != '"' && *c != '\\')
            .collect();
        Some(alloc::format!(";qu=\"{clean}\""))
    }
}

/// A policy's name, as the structured-field String that identifies it (quoted, escaped), with
/// the unit its quota counts.
#[derive(Debug, Clone)]
pub(crate) struct PolicyName {
    /// `"name"`, ready to write.
    quoted: Box<str>,
    /// The name as a JSON string, for the problem's `violated-policies`.
    json: Box<str>,
    /// `;qu="unit"`, or nothing for requests.
    unit: Option<Box<str>>,
}

impl PolicyName {
    /// `name` with every byte a structured-field String cannot hold (outside printable ASCII)
    /// dropped, so that the field always parses.
    pub(crate) fn new(name: &str) -> PolicyName {
        let printable = || name.chars().filter(|c| (' '..='~').contains(c));
        let mut quoted = String::from("\"");
        let mut json = String::from("\"");
        for c in printable() {
            if c == '"' || c == '\\' {
                quoted.push('\\');
                json.push('\\');
            }
            quoted.push(c);
            json.push(c);
        }
        quoted.push('"');
        json.push('"');
        PolicyName {
            quoted: quoted.into(),
            json: json.into(),
            unit: None,
        }
    }

    /// The same name, its quota counted in `unit`.
    pub(crate) fn counting(mut self, unit: &QuotaUnit) -> PolicyName {
        self.unit = unit.parameter().map(String::into_boxed_str);
        self
    }
}

/// The largest Integer a structured field holds (15 digits); larger figures are capped to it.
const SF_MAX: u64 = 999_999_999_999_999;

/// Whole seconds, rounded up: a client that waits this long is never early.
fn secs_up(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

/// The policy as a quota `q` over a window `w` of whole seconds: the quota's own rate, scaled to
/// the first whole number of seconds that holds its interval (5 per 200 ms is `q=25;w=1`).
fn quota_window(quota: &Quota) -> (u64, u64) {
    let per_ns = quota.per().as_nanos().max(1);
    let w = per_ns.div_ceil(1_000_000_000).max(1);
    let q = u128::from(quota.rate()) * w * 1_000_000_000 / per_ns;
    (
        u64::try_from(q).unwrap_or(u64::MAX),
        u64::try_from(w).unwrap_or(u64::MAX),
    )
}

fn value(text: String) -> HeaderValue {
    // The string's buffer becomes the value's, uncopied. Only ASCII digits, quotes, `;`, `=` and
    // the printable ASCII of `PolicyName` get here.
    HeaderValue::from_maybe_shared(Bytes::from(text))
        .unwrap_or_else(|_| HeaderValue::from_static("0"))
}

/// The numbers below this are written from [`DIGITS`], with no allocation.
const SMALL: u64 = 1000;

/// "0123…9991011…999…": every number below [`SMALL`] in turn, as text.
static DIGITS: &str = match core::str::from_utf8(&digits()) {
    Ok(text) => text,
    Err(_) => panic!("ASCII digits are UTF-8"),
};

const fn digits() -> [u8; 2890] {
    let mut out = [0u8; 2890];
    let (mut n, mut at) = (0, 0);
    while n < SMALL {
        let len = number_len(n);
        let mut k = 0;
        let mut rest = n;
        while k < len {
            out[at + len - 1 - k] = b'0' + (rest % 10) as u8;
            rest /= 10;
            k += 1;
        }
        at += len;
        n += 1;
    }
    out
}

const fn number_len(n: u64) -> usize {
    if n < 10 {
        1
    } else if n < 100 {
        2
    } else {
        3
    }
}

/// `n` as a header value: a slice of a static text when small (no allocation; a response's
/// counts and seconds mostly are), formatted otherwise.
fn number(n: u64) -> HeaderValue {
    if n >= SMALL {
        return HeaderValue::from(n);
    }
    let at = match n {
        0..10 => n,
        10..100 => 10 + (n - 10) * 2,
        _ => 190 + (n - 100) * 3,
    } as usize;
    HeaderValue::from_static(&DIGITS[at..at + number_len(n)])
}

/// One policy's figures in a response: its name, the decision and the quota it was held to.
pub(crate) struct Item<'a> {
    pub(crate) policy: &'a PolicyName,
    pub(crate) decision: &'a Decision,
    pub(crate) quota: Option<&'a Quota>,
}

/// Writes the rate-limit fields of `decision`.
pub(crate) fn write(
    out: &mut HeaderMap,
    mode: Headers,
    policy: &PolicyName,
    decision: &Decision,
    quota: Option<&Quota>,
) {
    write_items(
        out,
        mode,
        &[Item {
            policy,
            decision,
            quota,
        }],
    );
}

/// Writes the rate-limit fields of several policies decided on one request: each policy an item
/// of the IETF lists, in order. The IETF fields are appended, so that layers stacked on one
/// service list every policy instead of overwriting each other's; the legacy trio, which holds
/// one policy only, is written by the first writer (the innermost layer) and tells the item
/// with the fewest remaining.
pub(crate) fn write_items(out: &mut HeaderMap, mode: Headers, items: &[Item<'_>]) {
    if mode.ietf() {
        let mut policies = String::with_capacity(48 * items.len());
        let mut limits = String::with_capacity(32 * items.len());
        for item in items {
            if let Some(quota) = item.quota {
                let (q, w) = quota_window(quota);
                if !policies.is_empty() {
                    policies.push_str(", ");
                }
                let _ = write!(
                    policies,
                    "{};q={};w={}",
                    item.policy.quoted,
                    q.min(SF_MAX),
                    w.min(SF_MAX)
                );
                if let Some(unit) = &item.policy.unit {
                    policies.push_str(unit);
                }
            }
            if !limits.is_empty() {
                limits.push_str(", ");
            }
            let decision = item.decision;
            let _ = write!(
                limits,
                "{};r={}",
                item.policy.quoted,
                decision.remaining().min(SF_MAX)
            );
            if let Some(t) = seconds_to_more(decision) {
                let _ = write!(limits, ";t={}", t.min(SF_MAX));
            }
        }
        if !policies.is_empty() {
            out.append(RATELIMIT_POLICY, value(policies));
        }
        if !limits.is_empty() {
            out.append(RATELIMIT, value(limits));
        }
    }
    let tightest = items.iter().min_by_key(|item| item.decision.remaining());
    if let Some(item) = tightest.filter(|_| mode.legacy() && !out.contains_key(X_LIMIT)) {
        let decision = item.decision;
        out.insert(X_LIMIT, number(decision.limit()));
        out.insert(X_REMAINING, number(decision.remaining()));
        out.insert(X_RESET, number(secs_up(decision.reset_after())));
    }
}

/// [`write_items`] for policies held by name, decision and quota.
pub(crate) fn write_many(
    out: &mut HeaderMap,
    mode: Headers,
    items: &[(alloc::sync::Arc<PolicyName>, Decision, Option<Quota>)],
) {
    let items: alloc::vec::Vec<Item<'_>> = items
        .iter()
        .map(|(policy, decision, quota)| Item {
            policy,
            decision,
            quota: quota.as_ref(),
        })
        .collect();
    write_items(out, mode, &items);
}

/// Seconds until more quota is there, rounded up: for a refusal, until this request passes (the
/// instant `Retry-After` names); for an admission, until the next token is back, and `None` when
/// none is missing.
fn seconds_to_more(decision: &Decision) -> Option<u64> {
    if decision.is_allowed() {
        let next = decision.next_token_after();
        (!next.is_zero()).then(|| secs_up(next))
    } else {
        Some(decision.retry_after_secs())
    }
}

/// `Retry-After` in whole seconds, rounded up (at least 1).
pub(crate) fn retry_after(out: &mut HeaderMap, decision: &Decision) {
    retry_after_secs(out, decision.retry_after_secs());
}

/// `Retry-After: secs` (at least 1).
pub(crate) fn retry_after_secs(out: &mut HeaderMap, secs: u64) {
    out.insert(RETRY_AFTER, number(secs.max(1)));
}

/// The kinds of problem the layer answers with.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Problem {
    /// 429: the key is over its quota; `retry` is the exact wait, `retry_secs` it rounded up.
    QuotaExceeded {
        retry_secs: u64,
        #[cfg_attr(not(feature = "grpc"), allow(dead_code))]
        retry: Duration,
    },
    /// 429: the request costs more than the quota ever holds at once.
    TooCostly { cost: u32, burst: u32 },
    /// 503: the table of keys is full, or the store is down and the policy refuses.
    ReducedCapacity {
        retry_secs: u64,
        #[cfg_attr(not(feature = "grpc"), allow(dead_code))]
        retry: Duration,
    },
}

/// The `application/problem+json` body (RFC 9457), with the draft's problem types.
/// Every policy in `violated` is named in `violated-policies`.
pub(crate) fn problem_json(problem: Problem, violated: &[&PolicyName]) -> String {
    const BASE: &str = "https://iana.org/assignments/http-problem-types#";
    let mut body = String::with_capacity(256);
    let (kind, title, status) = match problem {
        Problem::QuotaExceeded { .. } | Problem::TooCostly { .. } => (
            "quota-exceeded",
            "Request cannot be satisfied as assigned quota has been exceeded",
            429,
        ),
        Problem::ReducedCapacity { .. } => (
            "temporary-reduced-capacity",
            "Request cannot be satisfied due to temporary server capacity constraints",
            503,
        ),
    };
    let _ = write!(
        body,
        "{{\"type\":\"{BASE}{kind}\",\"title\":\"{title}\",\"status\":{status},\"detail\":\""
    );
    let _ = match problem {
        Problem::QuotaExceeded { retry_secs, .. } | Problem::ReducedCapacity { retry_secs, .. } => {
            write!(body, "Retry in {retry_secs} s.")
        }
        Problem::TooCostly { cost, burst } => write!(
            body,
            "This request costs {cost}; the quota never holds more than {burst} at once."
        ),
    };
    body.push_str("\",\"violated-policies\":[");
    for (i, policy) in violated.iter().enumerate() {
        if i > 0 {
            body.push(',');
        }
        body.push_str(&policy.json);
    }
    body.push_str("]}");
    body
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_window_is_the_quotas_interval_in_whole_seconds() {
        assert_eq!(quota_window(&Quota::per_second(5)), (5, 1));
        assert_eq!(quota_window(&Quota::per_minute(50)), (50, 60));
        assert_eq!(
            quota_window(&Quota::with_period(Duration::from_millis(200))),
            (5, 1)
        );
        assert_eq!(
            quota_window(&Quota::with_period(Duration::from_millis(1500))),
            (1, 2)
        );
    }

    #[test]
    fn a_policy_name_is_always_a_valid_string() {
        let name = PolicyName::new("a\"b\\c\u{e9}\n");
        assert_eq!(&*name.quoted, "\"a\\\"b\\\\c\"");
    }

    #[test]
    fn small_numbers_come_from_the_static_text() {
        for n in (0..1200).chain([u64::MAX, 1 << 40]) {
            assert_eq!(number(n).to_str().unwrap(), n.to_string());
        }
    }

    #[test]
    fn seconds_round_up() {
        assert_eq!(secs_up(Duration::from_millis(1)), 1);
        assert_eq!(secs_up(Duration::from_secs(2)), 2);
        assert_eq!(secs_up(Duration::ZERO), 0);
    }
}

//! The GCRA script's arguments and reply, in the integers the script keeps exact.
//!
//! The script (`gcra.lua`, beside this file) reads the clock in whole microseconds since the Unix
//! epoch and counts everything else in units of `1 / denom` µs, where `denom = 1000 × scale` and
//! `token / scale` ns is the quota's period in lowest terms: one token is then exactly `token`
//! units, the very units the local [`Gcra`](crate::Gcra) keeps time in, so the two decide alike
//! at microsecond readings.

use crate::decision::{DecidedBy, Decision, Detail};
use crate::limiter::algorithm::Carry;
use crate::quota::Quota;

/// The script's source, as the server runs it.
pub(crate) const SOURCE: &str = include_str!("gcra.lua");

/// The one line of the script that reads the server's clock.
#[cfg(test)]
const NOW_LINE: &str = "local now = server_now()";

/// The expiry of an admission's write.
#[cfg(test)]
const EXPIRY: &str = "math.floor((units + ms - 1) / ms))";

/// The script with `now` taken from its last argument instead of `TIME`, so that a test can drive
/// the server-side decision from a manual clock. Its writes expire an hour later than the
/// script's: the server's real clock, which the expiry follows, must not wipe a key while the
/// test's clock has barely moved (an idle key's expiry is tested on the script itself).
#[cfg(test)]
pub(crate) fn source_with_now_from_args() -> String {
    SOURCE
        .replace(NOW_LINE, "local now = tonumber(ARGV[#ARGV])")
        .replace(EXPIRY, "math.floor((units + ms - 1) / ms)) + 3600000")
}

/// The largest window (a full burst's worth of time) the script accepts, in units: keeps every
/// debt plus a cost below 2^52, exact in a double. 2^51 units are 26 days for a period of whole
/// nanoseconds, less for periods kept as fractions of one.
pub(crate) const MAX_WINDOW_UNITS: u64 = 1 << 51;

/// What the script decides in: all `n` tokens or none, or up to `n`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    AllOrNothing = 0,
    UpTo = 1,
    /// All or nothing, with each limit's figures after the decision's.
    #[cfg(any(feature = "tower", feature = "rls"))]
    Each = 2,
}

/// One limit's quota as the script's arguments, with what a state written under another quota
/// becomes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ScriptQuota {
    token: u64,
    burst: u32,
    denom: u64,
    carry: Carry,
}

impl ScriptQuota {
    /// The script's form of `quota`, or `None` when its window is longer than
    /// [`MAX_WINDOW_UNITS`].
    pub(crate) fn new(quota: &Quota) -> Option<ScriptQuota> {
        let (token, scale) = quota.period_fraction();
        if quota.window_units() > MAX_WINDOW_UNITS {
            return None;
        }
        Some(ScriptQuota {
            token,
            burst: quota.burst(),
            // scale <= 128: no overflow.
            denom: 1000 * scale,
            carry: Carry::Debt,
        })
    }

    /// This quota, a state written under another one carried over as `carry` says.
    pub(crate) fn carrying(self, carry: Carry) -> ScriptQuota {
        ScriptQuota { carry, ..self }
    }

    /// The four arguments the script reads for this limit.
    pub(crate) fn args(&self) -> [u64; 4] {
        let carry = match self.carry {
            Carry::Debt => 0,
            Carry::Proportional => 1,
        };
        [self.token, u64::from(self.burst), self.denom, carry]
    }
}

/// The script's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reply {
    /// A decision: `granted` tokens taken (0 when refused or a peek), with the figures of the
    /// limit that binds (the one with the fewest tokens left).
    Decided {
        allowed: bool,
        granted: u32,
        remaining: u32,
        retry_us: u64,
        reset_us: u64,
        /// Index of the binding limit.
        binding: usize,
    },
    /// `n` exceeds the burst of the limit at this index.
    OverBurst { limit: usize },
}

impl Reply {
    /// Reads the script's six integers; `None` for anything else (a reply from another script
    /// under the same name, or a server that mangled it).
    pub(crate) fn parse(values: &[i64], limits: usize) -> Option<Reply> {
        let &[status, granted, remaining, retry, reset, index] = values else {
            return None;
        };
        let index = usize::try_from(index).ok()?.checked_sub(1)?;
        if index >= limits {
            return None;
        }
        match status {
            2 => Some(Reply::OverBurst { limit: index }),
            0 | 1 => Some(Reply::Decided {
                allowed: status == 1,
                granted: u32::try_from(granted).ok()?,
                remaining: u32::try_from(remaining).ok()?,
                retry_us: u64::try_from(retry).ok()?,
                reset_us: u64::try_from(reset).ok()?,
                binding: index,
            }),
            _ => None,
        }
    }
}

/// One limit's figures in a [`Mode::Each`] reply.
#[cfg(any(feature = "tower", feature = "rls"))]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Each {
    /// Whether this limit alone had room for the request.
    pub(crate) room: bool,
    pub(crate) remaining: u32,
    pub(crate) retry_us: u64,
    pub(crate) reset_us: u64,
}

#[cfg(any(feature = "tower", feature = "rls"))]
impl Each {
    /// Reads a [`Mode::Each`] reply: the decision, then each of `limits` limits' four figures;
    /// `None` for anything else. A decision told without them (a state ahead past any write, or
    /// a burst exceeded) reads as the decision alone.
    pub(crate) fn parse(values: &[i64], limits: usize) -> Option<(Reply, Option<Vec<Each>>)> {
        let (head, rest) = values.split_at_checked(6)?;
        let reply = Reply::parse(head, limits)?;
        if rest.is_empty() {
            return Some((reply, None));
        }
        if rest.len() != 4 * limits {
            return None;
        }
        let each = rest
            .chunks_exact(4)
            .map(|f| {
                Some(Each {
                    room: match f[0] {
                        0 => false,
                        1 => true,
                        _ => return None,
                    },
                    remaining: u32::try_from(f[1]).ok()?,
                    retry_us: u64::try_from(f[2]).ok()?,
                    reset_us: u64::try_from(f[3]).ok()?,
                })
            })
            .collect::<Option<Vec<Each>>>()?;
        Some((reply, Some(each)))
    }
}

/// A decision from the script's figures. They are whole microseconds already rounded up on the
/// server's clock, whose readings trail real time by under a microsecond, so waiting them is
/// enough as they are (resolution 1: no further rounding).
pub(crate) fn decision(
    allowed: bool,
    remaining: u32,
    retry_us: u64,
    reset_us: u64,
    limit: u32,
    by: DecidedBy,
) -> Decision {
    Decision::new(
        allowed,
        1,
        Detail::Eager {
            retry_ns: retry_us.saturating_mul(1000),
            reset_ns: reset_us.saturating_mul(1000),
            remaining,
            limit,
        },
    )
    .decided_by_(by)
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::time::Duration;

    #[test]
    fn a_token_is_counted_in_the_local_gcra_units() {
        // 3 per second: 333 333 333 1/3 ns, kept as 1 000 000 000 / 3.
        let [token, burst, denom, carry] = ScriptQuota::new(&Quota::per_second(3)).unwrap().args();
        assert_eq!((token, burst, denom, carry), (1_000_000_000, 3, 3000, 0));
    }

    #[test]
    fn a_window_past_the_exact_range_is_refused() {
        let months = Quota::with_period(Duration::from_secs(3600 * 24 * 30));
        assert_eq!(ScriptQuota::new(&months), None);
        assert!(ScriptQuota::new(&Quota::per_hour(1).with_burst(24 * 20)).is_some());
    }

    #[test]
    fn a_reply_is_checked_before_it_is_believed() {
        assert_eq!(
            Reply::parse(&[1, 1, 4, 0, 200, 1], 1),
            Some(Reply::Decided {
                allowed: true,
                granted: 1,
                remaining: 4,
                retry_us: 0,
                reset_us: 200,
                binding: 0
            })
        );
        assert_eq!(
            Reply::parse(&[2, 0, 0, 0, 0, 2], 2),
            Some(Reply::OverBurst { limit: 1 })
        );
        for bad in [
            &[1, 1, 4, 0, 200][..],
            &[1, 1, 4, 0, 200, 2],
            &[1, 1, 4, 0, 200, 0],
            &[3, 1, 4, 0, 200, 1],
            &[1, -1, 4, 0, 200, 1],
            &[0, 0, 4, -5, 200, 1],
        ] {
            assert_eq!(Reply::parse(bad, 1), None, "{bad:?}");
        }
    }

    #[test]
    fn the_test_variant_differs_only_in_its_clock() {
        let test = source_with_now_from_args();
        assert_ne!(test, SOURCE);
        assert_eq!(test.lines().count(), SOURCE.lines().count());
        assert_eq!(SOURCE.matches(NOW_LINE).count(), 1);
        assert_eq!(SOURCE.matches(EXPIRY).count(), 1);
    }
}

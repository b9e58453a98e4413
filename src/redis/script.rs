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

/// The script's source, as the server runs it: the helpers every script shares (`shared.lua`),
/// then its own text.
pub(crate) const SOURCE: &str = concat!(include_str!("shared.lua"), include_str!("gcra.lua"));

/// The settlement's and the operator's script, on the same state.
pub(crate) const ADMIN_SOURCE: &str =
    concat!(include_str!("shared.lua"), include_str!("admin.lua"));

/// The one line of the script that reads the server's clock.
#[cfg(test)]
const NOW_LINE: &str = "local now = server_now()";

/// The expiry of every write, in `shared.lua`.
#[cfg(test)]
const EXPIRY: &str = "math.floor((units + ms - 1) / ms))";

/// `source` (one of the crate's scripts) with `now` taken from its last argument instead of
/// `TIME`, so that a test can drive the server-side decision from a manual clock. Its writes
/// expire an hour later than the script's: the server's real clock, which the expiry follows,
/// must not wipe a key while the test's clock has barely moved (an idle key's expiry is tested on
/// the script itself).
#[cfg(test)]
pub(crate) fn with_now_from_args(source: &str) -> String {
    assert_eq!(source.matches(NOW_LINE).count(), 1);
    assert_eq!(source.matches(EXPIRY).count(), 1);
    source
        .replace(NOW_LINE, "local now = tonumber(ARGV[#ARGV])")
        .replace(EXPIRY, "math.floor((units + ms - 1) / ms)) + 3600000")
}

/// The largest window (a full burst's worth of time) the script keeps in the local units: keeps
/// every debt plus a cost below 2^52, exact in a double. 2^51 units are 26 days for a period of
/// whole nanoseconds, less for periods kept as fractions of one. A longer window is kept in whole
/// microseconds (`denom = 1`), up to 2^51 µs (71 years): see [`ScriptQuota::new`].
pub(crate) const MAX_WINDOW_UNITS: u64 = 1 << 51;

/// What the script decides in: all `n` tokens or none, or up to `n`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    AllOrNothing = 0,
    UpTo = 1,
    /// All or nothing, with each limit's figures after the decision's.
    #[cfg(any(feature = "tower", feature = "rls"))]
    Each = 2,
    /// All or nothing, with the TAT each limit's write left, for a charge's settlement.
    Charge = 3,
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
    /// The script's form of `quota`, or `None` when its window is longer than 2^51 µs.
    ///
    /// A window of up to [`MAX_WINDOW_UNITS`] local units is kept in those units, exactly as the
    /// local [`Gcra`](crate::Gcra) keeps it. A longer one (a plan of 10 000 a month: 2.6 × 10^15
    /// ns) is kept in whole microseconds, the period rounded up to the next one: exact for every
    /// period of whole microseconds, and otherwise slower than asked by less than 1 µs a token
    /// (a relative error below 10^-6 / period in seconds: 4 × 10^-9 for 10 000 a month), so it
    /// never admits more than the quota.
    pub(crate) fn new(quota: &Quota) -> Option<ScriptQuota> {
        let (token, scale) = quota.period_fraction();
        // scale <= 128: no overflow.
        let denom = 1000 * scale;
        if quota.window_units() <= MAX_WINDOW_UNITS {
            return Some(ScriptQuota {
                token,
                burst: quota.burst(),
                denom,
                carry: Carry::Debt,
            });
        }
        let token_us = token.div_ceil(denom);
        if u128::from(token_us) * u128::from(quota.burst()) > u128::from(MAX_WINDOW_UNITS) {
            return None;
        }
        Some(ScriptQuota {
            token: token_us,
            burst: quota.burst(),
            denom: 1,
            carry: Carry::Debt,
        })
    }

    /// This quota, a state written under another one carried over as `carry` says.
    pub(crate) fn carrying(self, carry: Carry) -> ScriptQuota {
        ScriptQuota { carry, ..self }
    }

    /// The three arguments that name the quota to `admin.lua`: token, burst, denom.
    pub(crate) fn quota_args(&self) -> [u64; 3] {
        [self.token, u64::from(self.burst), self.denom]
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
    fn a_long_window_is_kept_in_whole_microseconds() {
        // 10 000 a 30-day month, the whole month's worth at once: 259.2 s a token.
        let month = Duration::from_secs(3600 * 24 * 30);
        let plan = Quota::try_new(10_000, month, 10_000).unwrap();
        let [token, burst, denom, _] = ScriptQuota::new(&plan).unwrap().args();
        assert_eq!((token, burst, denom), (259_200_000, 10_000, 1));
        // Within the local units' range, the local units.
        let [_, _, denom, _] = ScriptQuota::new(&Quota::per_hour(1).with_burst(24 * 20))
            .unwrap()
            .args();
        assert_eq!(denom, 1000);
        // A period that is no whole µs is rounded up: never faster than asked.
        let odd = Quota::try_new(7, Duration::from_secs(3600 * 24 * 365), 7).unwrap();
        let [token_us, _, denom, _] = ScriptQuota::new(&odd).unwrap().args();
        let (token, scale) = odd.period_fraction();
        assert_eq!(denom, 1);
        assert!(u128::from(token_us) * 1000 * u128::from(scale) >= u128::from(token));
        assert!((u128::from(token_us) - 1) * 1000 * u128::from(scale) < u128::from(token));
        // Past 2^51 µs (71 years) it is refused.
        let ages = Quota::try_new(1, Duration::from_secs(3600 * 24 * 365 * 80), 1).unwrap();
        assert_eq!(ScriptQuota::new(&ages), None);
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
        for source in [SOURCE, ADMIN_SOURCE, crate::redis::calendar::SOURCE] {
            let test = with_now_from_args(source);
            assert_ne!(test, source);
            assert_eq!(test.lines().count(), source.lines().count());
        }
    }
}

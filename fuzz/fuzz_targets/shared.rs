//! Input shapes shared by the fuzz targets.
#![allow(dead_code)]

use arbitrary::Arbitrary;
use atomic_limiter::Quota;

/// A quota, either raw (any three numbers, mostly rejected) or shaped so that it is usually
/// accepted: a period of `p/q` ns written as `q·m` tokens per `p·m` ns.
#[derive(Arbitrary, Debug, Clone, Copy)]
pub enum QuotaSpec {
    Raw { rate: u64, per_ns: u64, burst: u32 },
    Shaped { p: u64, q: u8, m: u16, burst: u16 },
    Big { p: u32, burst: u32 },
}

impl QuotaSpec {
    pub fn build(self) -> Option<Quota> {
        match self {
            QuotaSpec::Raw {
                rate,
                per_ns,
                burst,
            } => Quota::try_from_nanos(rate, per_ns, burst).ok(),
            QuotaSpec::Shaped { p, q, m, burst } => {
                let (q, m) = (u64::from(q) + 1, u64::from(m) + 1);
                let burst = u32::from(burst) % 64 + 1;
                Quota::try_from_nanos(q.checked_mul(m)?, p.checked_mul(m)?, burst).ok()
            }
            QuotaSpec::Big { p, burst } => {
                Quota::try_from_nanos(1, u64::from(p) + 1, burst % Quota::MAX_BURST + 1).ok()
            }
        }
    }
}

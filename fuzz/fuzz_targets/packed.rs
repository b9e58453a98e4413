//! The token bucket's packed word round-trips over its whole documented range, for every layout
//! a quota can choose, and its two fields never overlap.
#![no_main]

mod shared;

use arbitrary::Arbitrary;
use atomic_limiter::fuzz_api::{bucket_layout, bucket_pack, bucket_unpack};
use libfuzzer_sys::fuzz_target;
use shared::QuotaSpec;

#[derive(Arbitrary, Debug)]
struct Input {
    quota: QuotaSpec,
    stamp: u64,
    tokens: u64,
}

fuzz_target!(|input: Input| {
    let Some(quota) = input.quota.build() else {
        return;
    };
    let (token_bits, stamp_bits, cap) = bucket_layout(&quota);
    assert_eq!(token_bits + stamp_bits, 64);
    assert!(
        (11..=31).contains(&token_bits),
        "token field of {token_bits} bits"
    );
    assert!(
        cap < 1 << token_bits,
        "cap {cap} does not fit {token_bits} bits"
    );
    assert_eq!(cap, u64::from(quota.burst()) * 1024);

    let stamp = input.stamp & (u64::MAX >> token_bits);
    let tokens = input.tokens % (cap + 1);
    let word = bucket_pack(&quota, stamp, tokens);
    assert_eq!(bucket_unpack(&quota, word), (stamp, tokens));
    // The fields are disjoint: each packs alone into its own bits.
    assert_eq!(
        bucket_pack(&quota, stamp, 0) | bucket_pack(&quota, 0, tokens),
        word
    );
    assert_eq!(
        bucket_pack(&quota, stamp, 0) & bucket_pack(&quota, 0, tokens),
        0
    );
    // A stamp wider than the field wraps modulo 2^stamp_bits, as the bucket's ticks do.
    let wide = input.stamp;
    assert_eq!(
        bucket_unpack(&quota, bucket_pack(&quota, wide, tokens)).0,
        wide & (u64::MAX >> token_bits)
    );
});

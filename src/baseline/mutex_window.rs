//! The window limiters' mutex twins: the same pure step (`window::math`) behind a lock.

/// A window baseline type: the struct, its constructor and `RateLimiter`, with `$step` under the
/// lock.
macro_rules! mutex_window {
    ($(#[$doc:meta])* $name:ident, $step:path, $max:expr) => {
        $(#[$doc])*
        #[derive(Debug)]
        pub struct $name<C, L = std::sync::Mutex<u64>> {
            word: L,
            params: crate::window::math::WindowParams,
            quota: crate::Quota,
            clock: C,
        }

        impl<C: crate::Clock, L: crate::baseline::BaselineLock<u64>> $name<C, L> {
            /// As the lock-free twin's `with_clock`.
            ///
            /// # Errors
            ///
            /// As the lock-free twin's `with_clock`.
            pub fn with_clock(quota: crate::Quota, clock: C) -> Result<Self, crate::QuotaError> {
                let params = crate::window::math::WindowParams::new(&quota, clock.now(), $max)?;
                Ok($name { word: L::new(0), params, quota, clock })
            }
        }

        impl<C: crate::Clock, L: crate::baseline::BaselineLock<u64>> crate::RateLimiter for $name<C, L> {
            fn check(&self) -> crate::Decision {
                match crate::RateLimiter::check_n(self, 1) {
                    Ok(d) => d,
                    Err(_) => crate::Decision::new(false, 1, crate::decision::Detail::Eager {
                        remaining: 0,
                        retry_ns: u64::MAX,
                        reset_ns: u64::MAX,
                        limit: self.params.limit,
                    }),
                }
            }

            fn check_n(&self, n: u32) -> Result<crate::Decision, crate::InsufficientCapacity> {
                crate::InsufficientCapacity::check(n, self.params.limit as u32)?;
                let now = self.clock.now();
                let resolution = self.clock.resolution();
                Ok(self.word.with(|word| {
                    match $step(*word, now, n, &self.params).into_step(resolution, self.params.limit) {
                        crate::state_cell::Step::Store(new, d) => {
                            *word = new;
                            d
                        }
                        crate::state_cell::Step::Keep(d) => d,
                    }
                }))
            }

            fn quota(&self) -> &crate::Quota {
                &self.quota
            }
        }
    };
}

pub(crate) use mutex_window;

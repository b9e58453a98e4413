//! The parts of `atomic-limiter-rls` that its binary, tests and load generator share: reading
//! envoyproxy/ratelimit's files, and the gRPC service over the engine.

pub mod config;
pub mod service;

//! Tests only: see `tests/grpc.rs`.

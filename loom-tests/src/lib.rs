//! Loom models live in `tests/`.

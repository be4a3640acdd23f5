//! End-to-end tests live in tests/tests/*.rs; this crate has no library code.

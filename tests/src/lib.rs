//! Shared helpers for the integration tests, and workloads that `cargo xtask` runs too.
//!
//! - [`stress`]: the bounded server life-cycle stress (`tests/stress.rs`, `cargo xtask stress`).

pub mod stress;

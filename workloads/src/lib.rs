//! Shared helpers for the integration tests, and workloads that `cargo xtask` runs too.
//!
//! - [`stress`]: the bounded server life-cycle stress (`tests/stress.rs`, `cargo xtask stress`);
//! - [`soak`]: two plugin-host runtimes under mixed traffic (`cargo xtask soak`);
//! - [`adversary`]: a client that writes raw mailbox words, for the adversarial tests.

pub mod adversary;
pub mod soak;
pub mod stress;

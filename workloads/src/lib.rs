//! Shared helpers for the integration tests, and workloads that `cargo xtask` runs too.
//!
//! - [`stress`]: the bounded server life-cycle stress (`tests/stress.rs`, `cargo xtask stress`);
//! - [`soak`]: two plugin-host runtimes under mixed traffic (`cargo xtask soak`);
//! - [`adversary`]: a client that writes raw mailbox words, for the adversarial tests;
//! - [`claims`]: a client's stream claims above any bound, for the abandoned-port tests;
//! - [`bounded`]: a command-line program run under an address-space limit and a hang guard,
//!   for the binaries' command-line tests.

pub mod adversary;
pub mod bounded;
pub mod claims;
pub mod soak;
pub mod stress;

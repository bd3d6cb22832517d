//! Shared helpers for the integration tests and for `cargo xtask soak`.

pub mod adversary;
pub mod soak;

//! Shared helpers for the integration tests, and workloads that `cargo xtask` runs too.
//!
//! - [`stress`]: the bounded server life-cycle stress (`tests/stress.rs`, `cargo xtask stress`);
//! - [`soak`]: two plugin-host runtimes under mixed traffic (`cargo xtask soak`);
//! - [`adversary`]: a client that writes raw mailbox words, for the adversarial tests;
//! - [`claims`]: a client's stream claims above any bound, for the abandoned-port tests;
//! - [`bounded`]: a command-line program run under an address-space limit and a hang guard,
//!   for the binaries' command-line tests;
//! - [`settled_stats`]: a server's statistics once a mailbox's requests are all counted.

pub mod adversary;
pub mod bounded;
pub mod claims;
pub mod soak;
pub mod stress;

use std::time::Duration;

use rpc_core::{MailboxId, RpcServer, StatsSnapshot};

/// `server`'s statistics once every request it began on `mailbox` is counted. A script's
/// request is counted after its last hand-over (the reply) lets the client go on, so a count
/// read right after a reply may miss it (docs/reliability.md, bug 11): this waits with
/// [`RpcServer::wait_drained`], as `PluginRuntime::synchronize` does, and panics if the mailbox
/// has not drained within 60 s (a hang guard for a loaded machine, never a measure of speed).
pub fn settled_stats(server: &RpcServer, mailbox: MailboxId) -> StatsSnapshot {
    assert!(
        server.wait_drained(mailbox, Duration::from_secs(60)),
        "{}: mailbox {} did not drain",
        server.name(),
        mailbox.0
    );
    server.stats()
}

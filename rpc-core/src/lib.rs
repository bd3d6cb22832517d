//! `rpc-core`: the host side of LLVM libc's GPU RPC protocol.
//!
//! The crate is built in layers, each depending only on the ones below it:
//!
//! ```text
//!  plugin     the traits a vendor implements, and PluginRuntime, the glue over them
//!    │
//!  services   the standard opcodes (print, files, memory, exit, host calls) and their policies
//!    │
//!  server     RpcServer: attached mailboxes, users, the handler registry, the one worker
//!    │        thread and its dispatch passes, the I/O threads, statistics and limits
//!  protocol   layouts, opcodes, the mailbox, ports, the client and the server's end
//! ```
//! plus the one sync shim (`sync`, std or loom), which every layer uses. The errors ([`Error`])
//! are the protocol layer's, so that every layer can name them.
//!
//! # Front door
//! - An embedder needs the names at the root: [`PluginRuntime`] (or a bare [`RpcServer`] with
//!   its [`ServerConfig`]), handlers of a [`Request`], the policies, the statistics, the errors.
//! - A vendor plugin author implements [`plugin`]'s traits.
//! - A client (a host-side warp, another process) uses [`protocol`].
//!
//! Without the `std` feature only [`protocol`] (and [`Error`]) remains, so the client builds for
//! `no_std` targets.
#![cfg_attr(not(feature = "std"), no_std)]
#![warn(missing_docs, unreachable_pub)]

#[cfg(feature = "std")]
pub mod plugin;
pub mod protocol;
#[cfg(feature = "std")]
mod server;
#[cfg(feature = "std")]
pub mod services;
pub(crate) mod sync;

#[cfg(all(feature = "std", not(loom)))]
pub use plugin::runtime::{ImageId, PluginRuntime, Runtime};
#[cfg(feature = "std")]
pub use protocol::error::VendorError;
pub use protocol::error::{Error, Result};
pub use protocol::Opcode;
#[cfg(feature = "std")]
pub use server::limits::{ExitPolicy, FilePolicy, Limits, ServicesConfig};
#[cfg(feature = "std")]
pub use server::registry::{MailboxInfo, Request};
#[cfg(feature = "std")]
pub use server::stats::StatsSnapshot;
#[cfg(feature = "std")]
pub use server::thread::{Started, Stopped};
#[cfg(feature = "std")]
pub use server::{
    MailboxId, MailboxSource, RpcServer, ServerConfig, ServerContext, ShutdownPolicy, UserGuard,
};

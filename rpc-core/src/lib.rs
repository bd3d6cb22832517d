//! `rpc-core`: the host side of LLVM libc's GPU RPC protocol.
//!
//! - [`layout`]: mailbox layouts of both generations and the device client object;
//! - [`opcode`]: the opcode table;
//! - [`mailbox`], [`port`], [`client`], [`server`]: the port protocol for both sides over memory
//!   handed in from outside;
//! - [`rpc_server`], [`server_thread`], [`dispatch`]: the server of one plugin instance
//!   (attached mailboxes, users, statistics), the state machine of its one worker thread, and
//!   the passes that serve every port with resumable exchanges (blocking calls run on the
//!   server's I/O threads);
//! - [`registry`], [`services`], [`printf`]: the handlers, user ones first, then the standard
//!   services of every libc opcode;
//! - [`plugin`], [`runtime`]: the traits a vendor plugin implements and the glue that gives each
//!   plugin instance its own server.
//!
//! Without the `std` feature only the layout, the opcode table and the client remain (plus
//! `alloc` for `recv_n`), so the client builds for `no_std` targets.
#![cfg_attr(not(feature = "std"), no_std)]

pub mod client;
#[cfg(feature = "std")]
pub mod dispatch;
pub mod error;
#[cfg(feature = "std")]
mod io_pool;
pub mod layout;
#[cfg(feature = "std")]
pub mod limits;
pub mod mailbox;
pub mod opcode;
#[cfg(feature = "std")]
pub mod plugin;
pub mod port;
#[cfg(feature = "std")]
pub mod printf;
#[cfg(feature = "std")]
pub mod registry;
#[cfg(feature = "std")]
pub mod rpc_server;
#[cfg(all(feature = "std", not(loom)))]
pub mod runtime;
#[cfg(feature = "std")]
mod scan;
#[cfg(feature = "std")]
pub mod server;
#[cfg(feature = "std")]
pub mod server_thread;
#[cfg(feature = "std")]
pub mod services;
#[cfg(feature = "std")]
pub mod stats;
pub mod sync;

#[cfg(all(test, loom))]
mod loom_dispatch;
#[cfg(all(test, loom))]
mod loom_protocol;
#[cfg(all(test, loom))]
mod loom_server_thread;

pub use client::{Client, ClientDoorbell};
pub use error::{Error, Result};
pub use layout::{Buffer, Generation, Header, Layout};
#[cfg(feature = "std")]
pub use limits::Limits;
pub use mailbox::Mailbox;
#[cfg(feature = "std")]
pub use mailbox::{LockTable, MailboxMemory};
pub use opcode::Opcode;
pub use port::{ClientPort, Packet, ServerPort, Wait};
#[cfg(feature = "std")]
pub use registry::{Handler, Request};
#[cfg(feature = "std")]
pub use rpc_server::{MailboxId, RpcServer, ServerConfig, ShutdownPolicy, UserGuard, ABSENT_AFTER};
#[cfg(feature = "std")]
pub use server::Server;
#[cfg(feature = "std")]
pub use server_thread::{Started, Stopped};
#[cfg(feature = "std")]
pub use services::{ExitPolicy, FilePolicy, HostAllocator, KernelExit, Services, ServicesConfig};
#[cfg(feature = "std")]
pub use stats::StatsSnapshot;

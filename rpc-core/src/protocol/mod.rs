//! The protocol layer: LLVM libc's GPU RPC protocol over memory handed in from outside, both
//! ends of it, with no server behind it. It builds without the `std` feature (plus `alloc` for
//! `recv_n`), so the client builds for `no_std` targets.
//!
//! - `layout.rs`: mailbox layouts of both generations and the device client object
//!   ([`Layout`], [`Generation`]);
//! - `opcode.rs`: the opcode table ([`Opcode`]), whose printf a mailbox's clients expect
//!   ([`Dialect`]) and the standard streams' handles ([`STDIN`], [`STDOUT`], [`STDERR`]);
//! - [`printf`]: how a printf format reads, so which argument bytes a client sends for it;
//! - `mailbox.rs`: a region viewed as the protocol's atomic arrays ([`Mailbox`],
//!   [`MailboxMemory`]), and the port lock bits ([`LockTable`]);
//! - `port.rs`: the per-port state machine both sides share ([`ClientPort`], [`ServerPort`]),
//!   the ways to wait ([`Wait`]), and a server thread's flips and unlocks published in batches;
//! - `client.rs`: opening ports as a GPU warp does ([`Client`]);
//! - `server_end.rs`: the server's end of one mailbox: finding pending ports and opening them
//!   ([`ServerEnd`]; pending ports found a word at a time);
//! - `typed.rs`: a typed call as LLVM's `rpc::dispatch` makes it ([`dispatch`], [`CallArg`]);
//! - `host_warp.rs`: the C form of a warp of plugin-host's native host images
//!   ([`RpcHostWarp`], [`RpcHostKernelFn`]), for plugin-abi and rpc-device alike.
//!
//! Its failures are [`ProtocolError`]s (`error.rs`). It depends on nothing else in the crate
//! but the `sync` shim.

pub(crate) mod client;
pub(crate) mod error;
pub(crate) mod host_warp;
pub(crate) mod layout;
pub(crate) mod mailbox;
pub(crate) mod opcode;
pub(crate) mod port;
pub mod printf;
// The server's end serves only the server thread, which needs `std`.
#[cfg_attr(not(feature = "std"), allow(dead_code))]
pub(crate) mod server_end;
pub(crate) mod typed;

#[cfg(all(test, loom))]
pub(crate) mod loom;

pub use client::{Client, ClientDoorbell};
pub use error::ProtocolError;
pub use host_warp::{RpcHostKernelFn, RpcHostWarp};
pub use layout::{Buffer, Generation, Header, Layout, BUFFER_SIZE, FIRST_PACKET_BYTES, LANE_SIZES};
pub use mailbox::Mailbox;
#[cfg(feature = "std")]
pub use mailbox::{LockTable, MailboxMemory};
pub use opcode::{Dialect, Numbering, Opcode, STDERR, STDIN, STDOUT};
pub use port::{lanes, ClientPort, Packet, ServerPort, Spin, Wait};
#[cfg(feature = "std")]
pub use port::{Backoff, Deadline, Resumable};
pub use server_end::ServerEnd;
#[cfg(feature = "std")]
pub(crate) use typed::POINTER_BYTES;
pub use typed::{dispatch, CallArg};

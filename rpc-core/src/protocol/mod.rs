//! The protocol layer: LLVM libc's GPU RPC protocol over memory handed in from outside, both
//! ends of it, with no server behind it. It builds without the `std` feature (plus `alloc` for
//! `recv_n`), so the client builds for `no_std` targets.
//!
//! - [`layout`]: mailbox layouts of both generations and the device client object;
//! - [`opcode`]: the opcode table;
//! - [`mailbox`]: a region viewed as the protocol's atomic arrays, and the port lock bits;
//! - [`port`]: the per-port state machine both sides share, and the ways to wait;
//! - [`client`]: opening ports as a GPU warp does;
//! - [`server_end`]: the server's end of one mailbox: finding pending ports and opening them
//!   (`scan` finds them a word at a time).
//!
//! Depends on nothing else in the crate but [`crate::error`] and [`crate::sync`].

pub mod client;
pub mod layout;
pub mod mailbox;
pub mod opcode;
pub mod port;
// Parts of it (the hot-port cache) serve only the server, which needs `std`.
#[cfg_attr(not(feature = "std"), allow(dead_code))]
pub(crate) mod scan;
#[cfg_attr(not(feature = "std"), allow(dead_code))]
pub mod server_end;

#[cfg(all(test, loom))]
mod loom;

pub use client::{Client, ClientDoorbell};
pub use layout::{Buffer, Generation, Header, Layout};
pub use mailbox::Mailbox;
#[cfg(feature = "std")]
pub use mailbox::{LockTable, MailboxMemory};
pub use opcode::Opcode;
#[cfg(feature = "std")]
pub use port::{Backoff, Deadline};
pub use port::{ClientPort, Packet, ServerPort, Spin, Wait};
pub use server_end::ServerEnd;

//! `rpc-core` (the package `gpu-rpc-core`, the library `rpc_core`): the host side of LLVM
//! libc's GPU RPC protocol.
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
//! plus the one sync shim (`sync`, std or loom), which every layer uses. Each layer fails with
//! its own error ([`ProtocolError`], [`ServerError`], [`PluginError`]); the embedder's
//! [`Error`] holds any of them whole, so `?` works across the layers.
//!
//! # Front door
//! - An embedder needs the names at the root: [`PluginRuntime`] (or a bare [`RpcServer`] with
//!   its [`ServerConfig`]), handlers of a [`Request`], the policies, the statistics, the errors.
//! - A vendor plugin author implements [`plugin`]'s traits.
//! - A client (a host-side warp, another process) uses [`protocol`].
//!
//! Without the `std` feature only [`protocol`] (and [`Error`], then only
//! [`Error::Protocol`]) remains, so the client builds for
//! `no_std` targets.
//!
//! # Quick start
//! A runtime of the host plugin (CPU warps that speak the real protocol, so this runs
//! anywhere; `plugin_cuda::CudaPlugin` and `plugin_amdgpu::AmdGpuPlugin` are used the same
//! way with a GPU image), a custom opcode, a kernel that calls it and prints, and the end:
//!
//! ```
//! use plugin_host::{Arg, HostConfig, HostImage, HostPlugin};
//! use rpc_core::plugin::Grid;
//! use rpc_core::{ExitPolicy, Opcode, PluginRuntime, ServerConfig, ServicesConfig};
//!
//! # fn main() -> rpc_core::Result<()> {
//! // Each runtime owns its plugin's server thread. A kernel's exit() is reported, not the end
//! // of this program (the default, `ExitPolicy::Process`, exits as LLVM's loader does).
//! let config = ServerConfig {
//!     services: ServicesConfig { exit: ExitPolicy::Record, ..ServicesConfig::default() },
//!     ..ServerConfig::default()
//! };
//! let mut runtime = PluginRuntime::new(HostPlugin::new(HostConfig::default()), config)?;
//!
//! // A one-packet opcode of our own: the server answers buf[0] + 1000.
//! const PLUS: Opcode = Opcode::user(1);
//! runtime.server().register_packet(PLUS, |_lane, p| p.set_word(0, p.word(0) + 1000));
//!
//! let image = HostImage::new("quick-start")
//!     .kernel("main", |warp| {
//!         let answers = warp.call(PLUS, u64::from).unwrap();
//!         warp.printf("lane %d got %d\n", |lane| {
//!             vec![Arg::Int(lane.into()), Arg::UInt(answers[lane as usize])]
//!         })
//!         .unwrap();
//!     })
//!     .into_bytes();
//! // Loading an image that uses RPC attaches its mailbox and starts the server.
//! let image = runtime.load_image(0, &image)?;
//! runtime.launch(image, "main", &[], Grid::linear(1, 4))?;
//! // The kernel returned: no exit status (an `exit(n)` would be `Some(KernelExit::Exit(n))`).
//! assert_eq!(runtime.synchronize(0)?, None);
//! assert_eq!(runtime.server().stats().served_of(PLUS), 1);
//! // Waits a bounded time for kernels still running, frees what they left, stops the server.
//! runtime.deinit()?;
//! # Ok(())
//! # }
//! ```
//!
//! # Typed calls
//! LLVM 23's GPU libc lets a kernel call a host function by its C signature:
//! `rpc::dispatch<OPCODE, fn>(client, args...)` (`libc/shared/rpc_dispatch.h`) copies the
//! arguments, pointees and spans to the host and the results back. Here the host function is a
//! Rust function or closure with the matching signature, registered with
//! [`RpcServer::register_typed`]; [`services::typed`] says which Rust types stand for which C
//! ones and what is refused. A host-plugin kernel makes the call as LLVM's client does
//! (`Warp::dispatch`, over [`protocol::dispatch`]):
//!
//! ```
//! use std::ffi::CStr;
//! use plugin_host::{HostConfig, HostImage, HostPlugin};
//! use rpc_core::plugin::Grid;
//! use rpc_core::protocol::CallArg;
//! use rpc_core::{Opcode, PluginRuntime, ServerConfig};
//!
//! # fn main() -> rpc_core::Result<()> {
//! let mut runtime = PluginRuntime::new(HostPlugin::new(HostConfig::default()), ServerConfig::default())?;
//! // C: `uint64_t count(const char *text, char c)`.
//! const COUNT: Opcode = Opcode::user(3);
//! runtime.server().register_typed(COUNT, |text: &CStr, c: u8| -> u64 {
//!     text.to_bytes().iter().filter(|&&b| b == c).count() as u64
//! })?;
//! let image = HostImage::new("typed")
//!     .kernel("main", |warp| {
//!         let mut text = *b"banana\0";
//!         let mut args: Vec<Vec<CallArg<'_>>> = Vec::new();
//!         args.resize_with(64, Vec::new);
//!         args[0] = vec![CallArg::Pointer(Some(&mut text[..])), CallArg::value(b'a')];
//!         let counts = warp.dispatch(COUNT, &mut args, 8).unwrap();
//!         assert_eq!(counts[0], 3u64.to_le_bytes());
//!     })
//!     .into_bytes();
//! let image = runtime.load_image(0, &image)?;
//! runtime.launch(image, "main", &[], Grid::linear(1, 1))?;
//! runtime.synchronize(0)?;
//! assert_eq!(runtime.server().stats().served_of(COUNT), 1);
//! runtime.deinit()?;
//! # Ok(())
//! # }
//! ```
#![cfg_attr(not(feature = "std"), no_std)]
#![warn(missing_docs, unreachable_pub)]

mod error;
#[cfg(feature = "std")]
pub mod plugin;
pub mod protocol;
#[cfg(feature = "std")]
mod server;
#[cfg(feature = "std")]
pub mod services;
pub(crate) mod sync;

pub use error::{Error, Result};
#[cfg(feature = "std")]
pub use plugin::error::PluginError;
#[cfg(all(feature = "std", not(loom)))]
pub use plugin::runtime::{ImageId, PacketHandler, PacketRequest, PluginRuntime, Runtime};
pub use protocol::error::ProtocolError;
pub use protocol::Opcode;
#[cfg(feature = "std")]
pub use server::error::{Outcome, ServerError, VendorError};
#[cfg(feature = "std")]
pub use server::exec::Received;
#[cfg(feature = "std")]
pub use server::limits::{ExitPolicy, FilePolicy, Limits, ServicesConfig};
#[cfg(feature = "std")]
pub use server::request::{MailboxInfo, Request};
#[cfg(feature = "std")]
pub use server::stats::StatsSnapshot;
#[cfg(feature = "std")]
pub use server::thread::{Started, Stopped};
#[cfg(feature = "std")]
pub use server::{
    AtomicMailbox, AttachOptions, MailboxId, RpcServer, ServerConfig, ServerContext,
    ShutdownPolicy, UserGuard, ABSENT_AFTER,
};
#[cfg(feature = "std")]
pub use services::process::KernelExit;

//! `rpc-device`: the device side of LLVM libc's GPU RPC protocol in Rust, so that a Rust GPU
//! program prints, allocates, exits and panics through the host's server, as a C program
//! linked with LLVM's GPU libc does, and runs under `rpc-run` (or LLVM's loader).
//!
//! A program (a kernel image, built as a `cdylib`, so not a doctest; `examples/hello.rs` is
//! built and run by the tests):
//!
//! ```ignore
//! #![cfg_attr(any(target_arch = "nvptx64", target_arch = "amdgpu"), no_std)]
//! #![cfg_attr(any(target_arch = "nvptx64", target_arch = "amdgpu"), feature(abi_gpu_kernel))]
//! extern crate alloc;
//!
//! #[global_allocator]
//! static HEAP: rpc_device::Malloc = rpc_device::Malloc;
//!
//! fn main(args: rpc_device::Args) -> i32 {
//!     let squares: alloc::vec::Vec<u32> = (0..4).map(|i| i * i).collect();
//!     rpc_device::println!("thread {}: {:?}", rpc_device::thread_index(), squares);
//!     0
//! }
//! rpc_device::main!(main);
//! ```
//!
//! - `client`: the client object at `__llvm_rpc_client` ([`ClientObject`], v2 by default, v1
//!   with the `v1` feature; sizes from `rpc_core::protocol`), and [`Port`], a port opened by a
//!   warp, with send / recv and the byte strings (`send_n` / `recv_n`);
//! - `arch`: what differs per target, one small module each (NVPTX, AMDGPU, the host);
//! - [`io`]: `print!`, `println!`, `eprint!`, `eprintln!`; [`file`](mod@file): [`File`], a file on the
//!   host;
//! - [`process`]: [`exit`], [`abort`]; [`heap`]: [`Malloc`], a `GlobalAlloc`;
//! - `panic`: the panic handler (GPU targets, `panic-handler` feature) or hook (host);
//! - [`start`]: [`main!`], LLVM's start protocol.
//!
//! - [`typed`]: [`call`], a host function called by its C signature in the format of LLVM's
//!   `rpc::dispatch`, so one host handler serves a C++ and a Rust kernel; [`Port`] serves any
//!   other custom opcode (`Opcode::user(n)`).
//!
//! The crate is `no_std`; on the host (a native image of plugin-host, see
//! `docs/rust-device.md`) it uses the image's std for the lanes' thread-local state.
#![no_std]
#![cfg_attr(target_arch = "nvptx64", feature(asm_experimental_arch, stdarch_nvptx))]
#![cfg_attr(target_arch = "amdgpu", feature(stdarch_amdgpu))]
#![warn(missing_docs)]

#[cfg(not(any(target_arch = "nvptx64", target_arch = "amdgpu")))]
extern crate std;

mod arch;
mod client;
pub mod file;
pub mod heap;
pub mod io;
mod panic;
pub mod process;
pub mod start;
pub mod typed;

pub use client::{ClientObject, Port, GENERATION};
pub use file::{remove, rename, stdin, File, SeekFrom, Stdin};
pub use heap::Malloc;
pub use panic::report_and_abort;
pub use process::{abort, exit};
pub use rpc_core::protocol::Opcode;
pub use start::Args;
pub use typed::{call, Arg};

/// This thread's index along x in its block.
pub fn thread_index() -> u32 {
    arch::thread_index()
}

/// This thread's block's index along x.
pub fn block_index() -> u32 {
    arch::block_index()
}

/// This thread's lane in its warp.
pub fn lane_id() -> u32 {
    arch::lane_id()
}

//! A native host image written in Rust: what a loaded `libplugin_host.so` runs (it cannot run
//! the program's `plugin_host::HostImage` closures, docs/plugins.md). Built as a `cdylib`
//! (`cargo build -p examples --example native_kernel`: `examples/libnative_kernel.so`), its
//! bytes are an image for the host plugin, linked in or loaded, as a `cc -shared` object's
//! are. `plugin-loader/tests/loaded.rs` runs it on the loaded library.
//!
//! - `__llvm_rpc_client`: the client object (v2: 2096 bytes, 16-aligned) the runtime fills
//!   when the image loads, so the kernels use RPC.
//! - `increment`: a kernel of `plugin_abi::RpcHostKernelFn`'s type; each active lane sends
//!   `value + its global lane` with TEST_INCREMENT through the warp's one-packet `call` and
//!   stores the reply's first word at `out[global lane]` (args: `value: u64, out: u64`, the
//!   address of the host's `u64` array). One-packet opcodes only: `call` carries no printf.

use std::cell::UnsafeCell;
use std::ffi::c_void;

use plugin_abi::{RpcHostWarp, RPC_OK};

/// A v2 client object's bytes, written by the runtime at load and then by the warps' locks.
/// Aligned to 16, which 2096 is a multiple of: a Rust type's size is a multiple of its
/// alignment, so `align(64)` would make the symbol 2112 bytes, which the runtime refuses.
#[repr(C, align(16))]
pub struct ClientObject(UnsafeCell<[u8; 2096]>);

// SAFETY: the bytes are only touched through raw pointers, by the runtime and the warps'
// port locks (atomics), never through a Rust reference of this static.
unsafe impl Sync for ClientObject {}

/// Where the runtime writes the mailbox's client object (the name LLVM's images use).
#[allow(non_upper_case_globals)]
#[no_mangle]
pub static __llvm_rpc_client: ClientObject = ClientObject(UnsafeCell::new([0; 2096]));

/// TEST_INCREMENT's opcode: the server replies with each lane's first word plus one.
const TEST_INCREMENT: u32 = rpc_core::Opcode::TEST_INCREMENT.0;

/// The kernel (see the file's notes).
///
/// # Safety
/// Called by the host plugin as an `RpcHostKernelFn`: `warp` is valid for the call, `args`
/// holds `len` bytes, and `out` in them addresses a `u64` per thread of the grid.
#[no_mangle]
pub unsafe extern "C" fn increment(warp: *const RpcHostWarp, args: *const c_void, len: usize) {
    if len != 16 {
        return;
    }
    // SAFETY: the caller's contract: a valid warp, `len` (16) bytes of arguments.
    let (warp, args) = unsafe { (&*warp, std::slice::from_raw_parts(args.cast::<u8>(), len)) };
    let word = |at: usize| u64::from_le_bytes(args[at..at + 8].try_into().unwrap_or_default());
    let (value, out) = (word(0), word(8));
    let first = (warp.block * warp.warps_per_block + warp.warp) * warp.lane_size;
    let mut buffers = vec![[0u64; 8]; warp.lane_size as usize];
    for (lane, buffer) in buffers.iter_mut().enumerate() {
        buffer[0] = value + u64::from(first) + lane as u64;
    }
    // SAFETY: `warp.call`'s contract: this warp, `lane_size` buffers of 64 bytes.
    let code = unsafe { (warp.call)(warp, TEST_INCREMENT, buffers.as_mut_ptr()) };
    let out = std::ptr::with_exposed_provenance_mut::<u64>(out as usize);
    for (lane, buffer) in buffers.iter().enumerate() {
        if warp.mask >> lane & 1 == 1 {
            let reply = if code == RPC_OK { buffer[0] } else { u64::MAX };
            // SAFETY: the caller's contract: `out` holds a u64 per thread of the grid, and
            // `first + lane` is one of this warp's threads, written by this warp alone.
            unsafe { *out.add(first as usize + lane) = reply };
        }
    }
}

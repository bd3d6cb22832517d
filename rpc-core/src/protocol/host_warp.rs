//! The C form of a warp of plugin-host's native host images (`docs/plugins.md`, "Native host
//! images"): what such an image's kernels are called with, and their type. Defined here, in
//! the layer both sides of that call build on, so that the plugin's C ABI (plugin-abi, which
//! re-exports both and generates the C header from this file) and the kernels' Rust side
//! (rpc-device, `no_std`) share one layout.

use core::ffi::c_void;

/// One warp of a running native host kernel (see `docs/plugins.md`). Valid for the kernel's
/// call only, on the thread that runs it.
#[repr(C)]
#[derive(Debug)]
pub struct RpcHostWarp {
    /// `L`: the warp's lanes, and so the buffers of a `call`.
    pub lane_size: u32,
    /// The block this warp is in.
    pub block: u32,
    /// The warp's index in its block.
    pub warp: u32,
    /// Warps per block.
    pub warps_per_block: u32,
    /// The active lanes (bit `i`: lane `i`).
    pub mask: u64,
    /// Opens a port for `opcode`, sends the active lanes' buffers of `buffers` (`lane_size`
    /// of 64 bytes), receives the reply into them and closes the port: one-packet opcodes.
    /// `RPC_OK` (0) or an error code of plugin-abi's (the image uses no RPC, the device was
    /// aborted, ...).
    pub call:
        unsafe extern "C" fn(warp: *const RpcHostWarp, opcode: u32, buffers: *mut [u64; 8]) -> i32,
    /// The plugin's own state for `call` (opaque).
    pub state: *mut c_void,
}

/// A native host image's kernel: an exported C function of this type, called once per warp
/// with the launch's argument block.
pub type RpcHostKernelFn =
    unsafe extern "C" fn(warp: *const RpcHostWarp, args: *const c_void, len: usize);

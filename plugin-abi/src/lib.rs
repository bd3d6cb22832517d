//! `plugin-abi`: the versioned C ABI of a loadable plugin, written once for every plugin.
//!
//! A plugin built as a shared library (`libplugin_host.so`, `libplugin_cuda.so`,
//! `libplugin_amdgpu.so`) exports one symbol, [`ENTRY_SYMBOL`] (`rpc_plugin_entry`), a
//! function of no arguments returning a pointer to its static [`RpcPluginTable`]: the ABI
//! version, then the functions a runtime calls (init, devices, load image, launch,
//! synchronize, handlers, the server's start and shutdown, statistics, deinit). The C header
//! `include/rpc_plugin.h` is generated from this crate by `cbindgen` (`cargo xtask header`;
//! `cargo xtask tidy` fails when it is stale). The rules (versioning, who owns which pointer,
//! the threads callbacks run on, the table's lifetime) are in `docs/plugins.md`.
//!
//! - [`export_plugin!`] exports the table for any plugin type implementing [`Loadable`]: each
//!   plugin's `*-so` crate is that one line. The functions behind it ([`export`]) wrap an
//!   [`rpc_core::PluginRuntime`], catch every panic (none crosses the boundary) and turn
//!   errors into a code and a message ([`RpcPluginTable::last_error`]).
//! - [`RpcHostWarp`] and [`RpcHostKernelFn`] are what a native host image's kernels see (the
//!   host plugin's `HostDevice` runs them): a warp with a one-packet call.

#![warn(missing_docs)]

use std::ffi::{c_char, c_void, CStr};

use rpc_core::plugin::Plugin;
use rpc_core::{Opcode, PacketRequest, StatsSnapshot};

pub mod export;

/// The ABI's version. Any change to a type or a function of this crate's C side bumps it;
/// a loader accepts only its own version (see `docs/plugins.md`).
pub const RPC_PLUGIN_ABI_VERSION: u32 = 2;

/// The name of the one symbol a plugin library exports: an [`RpcPluginEntryFn`].
pub const ENTRY_SYMBOL: &str = "rpc_plugin_entry";

/// Success.
pub const RPC_OK: i32 = 0;
/// `start_server`: the server was running already (nothing changed).
pub const RPC_ALREADY_RUNNING: i32 = 1;
/// `shutdown_server`: the server was stopped already (nothing changed).
pub const RPC_ALREADY_STOPPED: i32 = 2;
/// A null pointer, a bad flag or a string that is not UTF-8.
pub const RPC_ERR_INVALID: i32 = -1;
/// No such device, image, kernel or mailbox.
pub const RPC_ERR_NOT_FOUND: i32 = -2;
/// The plugin was deinitialised: its server cannot start again.
pub const RPC_ERR_DEINITIALISED: i32 = -3;
/// The driver or device failed (or a kernel failed, for `synchronize`).
pub const RPC_ERR_DEVICE: i32 = -4;
/// An image the runtime cannot serve (unknown client object size or generation).
pub const RPC_ERR_BAD_IMAGE: i32 = -5;
/// `deinit` aborted kernels still running after its wait (named in the message).
pub const RPC_ERR_KERNELS_ABORTED: i32 = -6;
/// The plugin panicked; the call had no effect it could report.
pub const RPC_ERR_PANIC: i32 = -7;
/// Any other failure (the message says which).
pub const RPC_ERR_OTHER: i32 = -8;

/// `init` flag: a kernel's `exit`/`abort` is recorded and returned by `synchronize` instead
/// of ending the process (`rpc_core::ExitPolicy::Record`).
pub const RPC_INIT_RECORD_EXIT: u32 = 1;

/// `init` flag: set the devices up as LLVM's GPU loader does before it runs a libc program
/// (CUDA: a 3 KiB stack per thread); see [`Loadable::prepare_for_loader`].
pub const RPC_INIT_LOADER_SETTINGS: u32 = 2;

/// [`RpcKernelExit::kind`]: the kernels returned.
pub const RPC_EXIT_NONE: u32 = 0;
/// [`RpcKernelExit::kind`]: a kernel called `exit(status)`.
pub const RPC_EXIT_EXIT: u32 = 1;
/// [`RpcKernelExit::kind`]: a kernel called `abort()`.
pub const RPC_EXIT_ABORT: u32 = 2;

/// An initialised plugin (opaque): made by `init`, freed by `deinit`.
pub struct RpcPlugin {
    _opaque: [u8; 0],
}

/// Memory a device sees, from `alloc_shared` (opaque): freed by `free_shared`.
pub struct RpcRegion {
    _opaque: [u8; 0],
}

/// Where a region from `alloc_shared` is.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RpcRegionInfo {
    /// The region as this process addresses it (64-byte aligned).
    pub host_ptr: *mut u8,
    /// The region as the device addresses it.
    pub device_addr: u64,
    /// Its bytes.
    pub len: usize,
}

/// Launch dimensions, as [`rpc_core::plugin::Grid`].
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RpcGrid {
    /// Blocks in x, y, z.
    pub blocks: [u32; 3],
    /// Threads per block in x, y, z.
    pub threads: [u32; 3],
}

/// How the kernels of a `synchronize` ended.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RpcKernelExit {
    /// [`RPC_EXIT_NONE`], [`RPC_EXIT_EXIT`] or [`RPC_EXIT_ABORT`].
    pub kind: u32,
    /// `exit`'s status when `kind` is [`RPC_EXIT_EXIT`].
    pub status: i32,
}

/// One request of a one-packet opcode, as a handler sees it.
#[repr(C)]
#[derive(Debug)]
pub struct RpcPacketRequest {
    /// The opcode.
    pub opcode: u32,
    /// `L`: the lanes of the warp, and so the number of `buffers`.
    pub lane_size: u32,
    /// The active lanes (bit `i`: lane `i`).
    pub mask: u64,
    /// `lane_size` buffers of 64 bytes, by lane: the request in, the reply written in place.
    pub buffers: *mut [u64; 8],
}

/// A handler of a one-packet opcode: called on the plugin's server thread with the `ctx` it
/// was registered with, once per request; it rewrites the request's buffers in place. The
/// request and its buffers are valid for the call only.
pub type RpcHandlerFn = unsafe extern "C" fn(ctx: *mut c_void, request: *mut RpcPacketRequest);

/// A server's counters, as [`rpc_core::StatsSnapshot`] (the per-opcode counts come apart,
/// as [`RpcServedCount`]s).
// The fields are rpc-core's list of counters (`stats_counters!`) after `served`, written out
// for cbindgen, which does not expand macros; `conversions` below fails to compile while they
// differ. A new field is a new ABI version.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RpcStats {
    /// Requests served to completion, of every opcode.
    pub served: u64,
    /// Requests that ended in an error.
    pub errors: u64,
    /// Requests refused (bad handle, policy).
    pub refused: u64,
    /// Requests of an opcode no handler accepts.
    pub unknown: u64,
    /// Headers that could not be read.
    pub bad_headers: u64,
    /// Handlers that panicked.
    pub panics: u64,
    /// Exchanges abandoned.
    pub abandoned: u64,
    /// Server passes.
    pub passes: u64,
    /// Parks of the worker.
    pub sleeps: u64,
    /// Wake-ups of the worker.
    pub wakeups: u64,
    /// Sleeps on a doorbell.
    pub doorbell_sleeps: u64,
    /// Doorbell rings seen.
    pub doorbell_rings: u64,
    /// Worker threads started.
    pub workers_started: u64,
    /// Calls run on the I/O threads.
    pub blocking_calls: u64,
    /// I/O threads abandoned at shutdown.
    pub io_threads_abandoned: u64,
    /// Worker threads alive now (0 or 1).
    pub live_workers: u64,
    /// Most worker threads ever alive at once.
    pub max_live_workers: u64,
    /// Bytes of device output (stdout, stderr) not written.
    pub output_lost_bytes: u64,
}

/// Requests of one opcode served to completion.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RpcServedCount {
    /// The opcode.
    pub opcode: u32,
    /// How many.
    pub count: u64,
}

/// What the entry symbol returns: the ABI version first (a loader checks it before touching
/// anything else), the plugin's name, then its functions. The table is static: it lives as
/// long as the library is loaded. A function's `plugin` is the pointer `init` made; every
/// function but `init` and `deinit` may be called from any thread at once. An `i32` result is
/// [`RPC_OK`] or another `RPC_` code; on an error code, `last_error` says why.
#[repr(C)]
pub struct RpcPluginTable {
    /// [`RPC_PLUGIN_ABI_VERSION`] of the library.
    pub abi_version: u32,
    /// The plugin's name (`host`, `cuda`, `amdgpu`), NUL-terminated, static.
    pub name: *const c_char,
    /// The message of the last call that failed on this thread (NUL-terminated, owned by the
    /// plugin, valid until this thread's next call into it); empty if none failed.
    pub last_error: unsafe extern "C" fn() -> *const c_char,
    /// Initialises the plugin (finding its devices) and its server, with `RPC_INIT_` `flags`;
    /// stores the plugin in `*out`. No driver is no error: zero devices and a reason.
    pub init: unsafe extern "C" fn(flags: u32, out: *mut *mut RpcPlugin) -> i32,
    /// How many devices the plugin found.
    pub device_count: unsafe extern "C" fn(plugin: *const RpcPlugin) -> u32,
    /// Writes device `device`'s name into `buf` (at most `len` bytes, NUL-terminated, as
    /// `snprintf`); returns the name's full length, 0 if there is no such device.
    pub device_name: unsafe extern "C" fn(
        plugin: *const RpcPlugin,
        device: u32,
        buf: *mut c_char,
        len: usize,
    ) -> usize,
    /// Writes why the plugin found no device into `buf` (as `device_name`); returns the
    /// reason's full length, 0 if there are devices.
    pub no_device_reason:
        unsafe extern "C" fn(plugin: *const RpcPlugin, buf: *mut c_char, len: usize) -> usize,
    /// Loads the `len` bytes of an image on `device` (copied: the caller keeps `bytes`),
    /// attaching a mailbox and starting the server if it uses RPC; stores its id in `*out`.
    pub load_image: unsafe extern "C" fn(
        plugin: *const RpcPlugin,
        device: u32,
        bytes: *const u8,
        len: usize,
        out: *mut u64,
    ) -> i32,
    /// The mailbox serving `image`, in `*out`; [`RPC_ERR_NOT_FOUND`] if it uses no RPC.
    pub mailbox: unsafe extern "C" fn(plugin: *const RpcPlugin, image: u64, out: *mut u64) -> i32,
    /// Launches `kernel` (NUL-terminated) of `image` with the `args_len` bytes of `args`
    /// (copied) over `grid`; returns once it is launched.
    pub launch: unsafe extern "C" fn(
        plugin: *const RpcPlugin,
        image: u64,
        kernel: *const c_char,
        args: *const u8,
        args_len: usize,
        grid: *const RpcGrid,
    ) -> i32,
    /// Waits for every launch on `device`; stores how they ended in `*out` (a kernel's
    /// `exit`/`abort` under [`RPC_INIT_RECORD_EXIT`]); a failed kernel is [`RPC_ERR_DEVICE`].
    pub synchronize:
        unsafe extern "C" fn(plugin: *const RpcPlugin, device: u32, out: *mut RpcKernelExit) -> i32,
    /// The address and size of the global `name` (NUL-terminated) of `image`, in `*addr` and
    /// `*size`; [`RPC_ERR_NOT_FOUND`] if it has none.
    pub find_symbol: unsafe extern "C" fn(
        plugin: *const RpcPlugin,
        image: u64,
        name: *const c_char,
        addr: *mut u64,
        size: *mut usize,
    ) -> i32,
    /// `len` zeroed bytes device `device` sees; the region in `*out`, where it is in `*info`.
    /// Freed by `free_shared`, before `deinit`.
    pub alloc_shared: unsafe extern "C" fn(
        plugin: *const RpcPlugin,
        device: u32,
        len: usize,
        out: *mut *mut RpcRegion,
        info: *mut RpcRegionInfo,
    ) -> i32,
    /// Frees a region of `alloc_shared`.
    pub free_shared: unsafe extern "C" fn(region: *mut RpcRegion),
    /// Copies the `len` bytes at `src` to address `dst` of device `device`.
    pub copy_to_device: unsafe extern "C" fn(
        plugin: *const RpcPlugin,
        device: u32,
        dst: u64,
        src: *const u8,
        len: usize,
    ) -> i32,
    /// Copies `len` bytes from address `src` of device `device` to `dst`.
    pub copy_from_device: unsafe extern "C" fn(
        plugin: *const RpcPlugin,
        device: u32,
        src: u64,
        dst: *mut u8,
        len: usize,
    ) -> i32,
    /// Registers `handler` with `ctx` for the one-packet opcode `opcode`, ahead of the
    /// standard handlers and of those registered before. `handler` and `ctx` must stay valid
    /// until `deinit` returns; they are called on the server thread.
    pub register_handler: unsafe extern "C" fn(
        plugin: *const RpcPlugin,
        opcode: u32,
        handler: RpcHandlerFn,
        ctx: *mut c_void,
    ) -> i32,
    /// Starts the server: [`RPC_OK`], or [`RPC_ALREADY_RUNNING`].
    pub start_server: unsafe extern "C" fn(plugin: *const RpcPlugin) -> i32,
    /// Shuts the server down: [`RPC_OK`], or [`RPC_ALREADY_STOPPED`]. Loading or launching
    /// an RPC image starts it again.
    pub shutdown_server: unsafe extern "C" fn(plugin: *const RpcPlugin) -> i32,
    /// Stores the server's counters in `*out` and up to `cap` per-opcode counts in `served`
    /// (which may be null when `cap` is 0); returns how many per-opcode counts there are.
    pub stats: unsafe extern "C" fn(
        plugin: *const RpcPlugin,
        out: *mut RpcStats,
        served: *mut RpcServedCount,
        cap: usize,
    ) -> usize,
    /// Waits a bounded time for running kernels (aborting those left), detaches every
    /// mailbox, stops the server for good and frees `plugin`, also when it returns an error.
    pub deinit: unsafe extern "C" fn(plugin: *mut RpcPlugin) -> i32,
}

// SAFETY: the table holds function pointers and a pointer to a static, immutable C string:
// nothing in it is ever written, so sharing it between threads is sound.
unsafe impl Sync for RpcPluginTable {}

/// The type of the entry symbol [`ENTRY_SYMBOL`].
pub type RpcPluginEntryFn = unsafe extern "C" fn() -> *const RpcPluginTable;

/// A plugin that can be built as a loadable library: how the library makes it.
pub trait Loadable: Plugin + Sized + 'static {
    /// The plugin's name, as its table gives it (the same as [`Plugin::name`]).
    const NAME: &'static CStr;
    /// The plugin with the settings a loaded library uses (its defaults).
    fn for_library() -> Self;
    /// Sets the devices up as LLVM's GPU loader does before it runs a libc program (init
    /// flag [`RPC_INIT_LOADER_SETTINGS`], and `rpc-run` for a linked-in plugin). Nothing by
    /// default.
    fn prepare_for_loader(runtime: &rpc_core::PluginRuntime<Self>) -> rpc_core::Result<()> {
        let _ = runtime;
        Ok(())
    }
}

/// Exports `rpc_plugin_entry` for the [`Loadable`] plugin type `$plugin`: the one line of a
/// plugin's `*-so` crate.
#[macro_export]
macro_rules! export_plugin {
    ($plugin:ty) => {
        /// The plugin library's entry: its static table (see the crate `plugin-abi`).
        #[no_mangle]
        pub extern "C" fn rpc_plugin_entry() -> *const $crate::RpcPluginTable {
            static TABLE: $crate::RpcPluginTable = $crate::export::table::<$plugin>();
            &TABLE
        }
    };
}

/// What a native host image's kernels see: rpc-core's protocol layer defines them, so that
/// rpc-device (`no_std`) shares their layout; the C header is generated from there too.
pub use rpc_core::protocol::{RpcHostKernelFn, RpcHostWarp};

/// `RpcStats::of` and `RpcStats::snapshot`, field by field from rpc-core's list of counters:
/// their struct literals name every field, so a counter `RpcStats` lacks (or one it has that
/// the list does not) fails to compile here.
macro_rules! conversions {
    ($($(#[$doc:meta])* $name:ident,)*) => {
        impl RpcStats {
            /// The counters of `stats` (the per-opcode counts go apart).
            pub fn of(stats: &StatsSnapshot) -> Self {
                RpcStats {
                    served: stats.total_served(),
                    $($name: stats.$name,)*
                }
            }

            /// The snapshot these counters and the per-opcode counts `served` make.
            pub fn snapshot(&self, served: &[RpcServedCount]) -> StatsSnapshot {
                StatsSnapshot {
                    served: served.iter().map(|s| (Opcode(s.opcode), s.count)).collect(),
                    $($name: self.$name,)*
                }
            }
        }
    };
}

rpc_core::stats_counters!(conversions);

impl RpcPacketRequest {
    /// The C view of `request`, valid while `request` is borrowed.
    pub fn of(request: &mut PacketRequest<'_>) -> Self {
        RpcPacketRequest {
            opcode: request.opcode.0,
            lane_size: request.lane_size,
            mask: request.mask,
            buffers: request.buffers.as_mut_ptr(),
        }
    }

    /// The Rust view of this request, or None if its buffers are null.
    ///
    /// # Safety
    /// `buffers` must be null or point to `lane_size` buffers, valid and unaliased for `'a`.
    pub unsafe fn as_request<'a>(&self) -> Option<PacketRequest<'a>> {
        if self.buffers.is_null() {
            return None;
        }
        // SAFETY: the caller's contract: `lane_size` valid buffers, unaliased for 'a.
        let buffers =
            unsafe { std::slice::from_raw_parts_mut(self.buffers, self.lane_size as usize) };
        Some(PacketRequest {
            opcode: Opcode(self.opcode),
            lane_size: self.lane_size,
            mask: self.mask,
            buffers,
        })
    }
}

impl From<RpcGrid> for rpc_core::plugin::Grid {
    fn from(grid: RpcGrid) -> Self {
        rpc_core::plugin::Grid {
            blocks: grid.blocks,
            threads: grid.threads,
        }
    }
}

impl From<rpc_core::plugin::Grid> for RpcGrid {
    fn from(grid: rpc_core::plugin::Grid) -> Self {
        RpcGrid {
            blocks: grid.blocks,
            threads: grid.threads,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A snapshot whose counters are 1, 2, 3, ... in the list's order.
    macro_rules! numbered {
        ($($(#[$doc:meta])* $name:ident,)*) => {{
            let mut n = 0;
            StatsSnapshot {
                served: [(Opcode::TEST_INCREMENT, 3)].into(),
                $($name: { n += 1; n },)*
            }
        }};
    }

    /// Every counter crosses the C struct and comes back (one the ABI lacked came back 0).
    #[test]
    fn every_counter_crosses_the_c_struct_both_ways() {
        let stats: StatsSnapshot = rpc_core::stats_counters!(numbered);
        let c = RpcStats::of(&stats);
        assert_eq!(c.served, 3);
        assert_eq!(c.output_lost_bytes, stats.output_lost_bytes);
        let served = [RpcServedCount {
            opcode: Opcode::TEST_INCREMENT.0,
            count: 3,
        }];
        assert_eq!(c.snapshot(&served), stats);
    }
}

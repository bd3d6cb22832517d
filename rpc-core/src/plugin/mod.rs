//! The interface a vendor plugin implements (STYLE 3: the generic glue,
//! [`PluginRuntime`](crate::PluginRuntime), does the bookkeeping, these hooks do the vendor
//! work).
//!
//! A plugin is found, initialised (enumerating its devices), used, and deinitialised. Each
//! device loads images, allocates memory the device sees, copies to device addresses and
//! launches kernels. Whether an image uses RPC, the mailbox, the client object and the user
//! guards of launches are handled by the glue, identically for every vendor.

use std::boxed::Box;
use std::string::String;
use std::sync::Arc;

use crate::protocol::layout::{Generation, Layout};

#[cfg(not(loom))]
pub use crate::server::RegionMailbox;
pub use crate::server::{panic_message, Doorbell, SharedRegion};
pub use crate::services::memory::DeviceAllocator;
pub use crate::VendorError;
pub use error::VendorSource;

pub(crate) mod error;
#[cfg(not(loom))]
pub(crate) mod runtime;
#[cfg(not(loom))]
pub use runtime::{
    libc_rpc_client_names, libc_rpc_client_namespace, CLIENT_SYMBOL, LEGACY_CLIENT_SYMBOL,
};

/// A global variable of a loaded image.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Symbol {
    /// Device address.
    pub addr: u64,
    /// Size in bytes.
    pub size: usize,
}

/// Launch dimensions: blocks (work-groups) and threads per block, as CUDA and HSA count them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Grid {
    /// Blocks in x, y, z.
    pub blocks: [u32; 3],
    /// Threads per block in x, y, z.
    pub threads: [u32; 3],
}

impl Grid {
    /// A one-dimensional grid.
    pub const fn linear(blocks: u32, threads: u32) -> Self {
        Grid {
            blocks: [blocks, 1, 1],
            threads: [threads, 1, 1],
        }
    }
    /// Blocks in the grid.
    pub fn total_blocks(&self) -> u64 {
        self.blocks.iter().map(|&b| u64::from(b)).product()
    }
    /// Threads in one block.
    pub fn threads_per_block(&self) -> u64 {
        self.threads.iter().map(|&t| u64::from(t)).product()
    }
}

/// Called exactly once when a launched kernel has completed (successfully or not). The glue
/// uses it to release the launch's user guard.
pub type Completion = Box<dyn FnOnce() + Send + 'static>;

/// One device of a plugin.
pub trait Device: Send + Sync {
    /// A loaded image (module / executable).
    type Image: Send + Sync;

    /// A human-readable name ("NVIDIA H200", "cpu0", ...).
    fn name(&self) -> String;
    /// What else tells the device apart, for [`describe`] (CUDA: its compute capability,
    /// `sm_90`); by default nothing.
    fn detail(&self) -> Option<String> {
        None
    }
    /// `L`: the warp / wavefront width.
    fn lane_size(&self) -> u32;
    /// `L` for the mailbox of `image`: the wavefront its code was compiled for, where that can
    /// differ from the device's (AMDGPU reads it from the code object); by default
    /// [`Device::lane_size`].
    fn image_lane_size(&self, image: &Self::Image) -> u32 {
        let _ = image;
        self.lane_size()
    }
    /// How many warps the device runs at once (its resident warps or waves), as the hardware
    /// reports it: the glue gives its mailbox that many ports, within the generation's bounds
    /// ([`Generation::ports_for`](crate::protocol::Generation::ports_for)).
    fn parallelism(&self) -> u32;

    /// Zeroed, 64-byte-aligned host memory the device sees coherently.
    fn alloc_shared(&self, len: usize) -> Result<Box<dyn SharedRegion>, VendorError>;
    /// The memory of a mailbox of `layout` (what the glue allocates):
    /// [`Device::alloc_shared`] of its size, unless the plugin must know what the memory holds
    /// (plugin-host does: its copies access each word with the size the server uses).
    fn alloc_mailbox(&self, layout: Layout) -> Result<Box<dyn SharedRegion>, VendorError> {
        self.alloc_shared(layout.total_size())
    }
    /// The allocator behind MALLOC/FREE for kernels of this device.
    fn allocator(&self) -> Arc<dyn DeviceAllocator>;

    /// Loads an image from its bytes (PTX, cubin, code object, ...).
    fn load_image(&self, bytes: &[u8]) -> Result<Self::Image, VendorError>;
    /// A global variable of `image`, if it has one of that name.
    fn find_symbol(&self, image: &Self::Image, name: &str) -> Option<Symbol>;
    /// The size of the global variable of `image` at device address `addr`, if the plugin
    /// can tell: how the glue tells an LLVM 18 image from an LLVM 19 one, both of whose
    /// `__llvm_libc_rpc_client` point to their client object (96 bytes in 18, 552 in 19). By
    /// default `None`, and the glue then refuses such an image rather than guess.
    fn symbol_size_at(&self, image: &Self::Image, addr: u64) -> Option<usize> {
        let _ = (image, addr);
        None
    }
    /// Copies `bytes` to device address `dst`.
    fn copy_to_device(&self, dst: u64, bytes: &[u8]) -> Result<(), VendorError>;
    /// Copies from device address `src` into `out`.
    fn copy_from_device(&self, src: u64, out: &mut [u8]) -> Result<(), VendorError>;

    /// A doorbell for a new mailbox of `generation` (only v2 has one), if the device can raise
    /// interrupts; `None` means pure polling, which is always correct.
    fn create_doorbell(
        &self,
        generation: Generation,
    ) -> Result<Option<Box<dyn Doorbell>>, VendorError> {
        let _ = generation;
        Ok(None)
    }

    /// Launches kernel `kernel` of `image` with the packed argument block `args`; calls `done`
    /// once the kernel has completed (also if it failed). On an error return, `done` has been
    /// called or dropped.
    fn launch(
        &self,
        image: &Self::Image,
        kernel: &str,
        args: &[u8],
        grid: Grid,
        done: Completion,
    ) -> Result<(), VendorError>;
    /// Waits for every launch on this device to complete; reports a kernel's failure.
    fn synchronize(&self) -> Result<(), VendorError>;
    /// Ends the launches still running, as a device reset does: the runtime's `deinit` calls
    /// it when kernels outlive its wait. Afterwards `synchronize` and the plugin's `deinit`
    /// return without waiting for those kernels (which report failure), and their `done`
    /// callbacks may never run.
    fn abort_launches(&self);
}

/// A vendor plugin: one per vendor per process (per runtime instance).
pub trait Plugin: Send + Sync {
    /// The plugin's device type.
    type Device: Device;

    /// `host`, `cuda` or `amdgpu`.
    fn name(&self) -> &'static str;
    /// Finds the devices. No driver is not an error: it is zero devices and [`Plugin::reason`].
    fn init(&mut self) -> Result<(), VendorError>;
    /// The devices found by `init`.
    fn devices(&self) -> &[Self::Device];
    /// Why there are no devices, when there are none.
    fn reason(&self) -> Option<String>;
    /// Releases the devices. The glue has detached every mailbox before calling this.
    fn deinit(&mut self) -> Result<(), VendorError>;
}

/// One line saying what an initialised plugin found, the same for every plugin:
/// `NAME: K device(s) (DEVICE; ...)`, each device `NAME: [DETAIL, ]L=LANES, ports v1=P v2=Q`
/// (the ports its mailbox gets in each generation), or `NAME: 0 devices (REASON)`. What
/// `rpc-run --devices`, `rpc-run` and the demo print.
pub fn describe<P: Plugin + ?Sized>(plugin: &P) -> String {
    let name = plugin.name();
    let devices = plugin.devices();
    if devices.is_empty() {
        let reason = plugin.reason().unwrap_or_else(|| "none found".into());
        return std::format!("{name}: 0 devices ({reason})");
    }
    let list: std::vec::Vec<String> = devices
        .iter()
        .map(|d| {
            let detail = d.detail().map(|d| d + ", ").unwrap_or_default();
            std::format!(
                "{}: {detail}L={}, ports v1={} v2={}",
                d.name(),
                d.lane_size(),
                Generation::V1.ports_for(d.parallelism()),
                Generation::V2.ports_for(d.parallelism())
            )
        })
        .collect();
    let plural = if devices.len() == 1 { "" } else { "s" };
    std::format!(
        "{name}: {} device{plural} ({})",
        devices.len(),
        list.join("; ")
    )
}

/// [`describe`] of a plugin not yet initialised: initialises it (an error becomes the
/// reason of `NAME: 0 devices (...)`), describes it and deinitialises it.
pub fn probe<P: Plugin>(mut plugin: P) -> String {
    let line = match plugin.init() {
        Ok(()) => describe(&plugin),
        Err(error) => std::format!("{}: 0 devices ({error})", plugin.name()),
    };
    if let Err(error) = plugin.deinit() {
        log::warn!("{}: deinit after describing: {error}", plugin.name());
    }
    line
}

//! `plugin-cuda`: NVIDIA GPUs through the CUDA driver API, loaded at run time.
//!
//! Nothing of CUDA is needed to build or test this crate: `libcuda` is opened when the plugin
//! is initialised, and where it is missing the plugin has zero devices and says why
//! ([`rpc_core::plugin::describe`] prints e.g. `cuda: 0 devices (libcuda.so.1 not found)`). It implements the
//! hooks of [`rpc_core::plugin`]; finding `__llvm_rpc_client`, attaching the mailbox and the
//! launches' user guards are the generic glue's.
//!
//! # Internals
//! - [`loader`]: the driver. [`loader::DriverApi`] is one typed table of only the driver
//!   functions used, as Rust methods returning `Result<_, code>`. The real one,
//!   [`loader::LibCuda`], is our own `libloading` table whose entry-point types are cudarc's
//!   `driver::sys` bindings (checked at compile time); it is built once per process
//!   ([`loader::system_driver`], a `OnceLock`) and resolves every symbol up front. We wrap
//!   rather than call cudarc's functions because those panic when the library or a symbol is
//!   missing and return codes as a Rust enum a newer driver could overflow; see the module.
//!   Tests substitute a fake table ([`CudaPlugin::with_driver`]).
//! - [`device`]: a [`CudaDevice`] per GPU with its primary context (bound on every call, since
//!   the server thread and the driver's callback thread call in too), one launch stream, and
//!   launch completions: `done` waits in a table under a ticket and is called exactly once, by
//!   the host function queued after the kernel (`cuLaunchHostFunc`), by `launch` when it fails,
//!   or by `synchronize`/release when the context has failed (the driver then never calls the
//!   host function). Port count = min(SMs x resident warps per SM, MAX_PORT_COUNT).
//! - [`memory`]: the mailbox as pinned host memory mapped for the device
//!   (`cuMemHostAlloc(DEVICEMAP | PORTABLE)`, zeroed, 64-byte aligned, device address from
//!   `cuMemHostGetDevicePointer`), and the MALLOC/FREE allocator: 2 MiB-aligned device blocks
//!   (over-allocate, align up, remember the base), stream-ordered where the device has memory
//!   pools (plain `cuMemFree` can synchronise the device while the kernel waits for the FREE
//!   reply), all freed at release if the kernels forgot.
//! - [`image`]: modules from PTX (NUL-terminated for the driver), cubin or fatbin, checked to
//!   hold every byte the driver will read; globals via `cuModuleGetGlobal`.
//! - `context`: `Core`, what a device, its images, regions and allocator share (the driver,
//!   the device, its primary context, bound on every call).
//! - [`error`]: [`CudaError`]; a driver failure keeps the call, the code and its name
//!   (`cuGetErrorName`, else a built-in table).
//!
//! Streams: the launch stream is a blocking one (ordered with the legacy default stream), so a
//! synchronous `cuMemcpyHtoD` of the client object is complete before a later kernel starts.
//! The allocator's stream is non-blocking, so MALLOC/FREE never wait for a running kernel.

#![warn(missing_docs)]

mod context;
pub mod device;
pub mod error;
pub mod image;
pub mod loader;
pub mod memory;

/// The fake driver table of the tests, for other crates' tests too (feature `fake`).
#[cfg(any(test, feature = "fake"))]
pub mod fake;
#[cfg(test)]
mod tests;

use std::sync::Arc;

use rpc_core::plugin::{Plugin, VendorError};

pub use device::CudaDevice;
pub use error::CudaError;
pub use image::CudaImage;
pub use loader::DriverApi;
pub use memory::{CudaAllocator, PinnedRegion};

/// Where the plugin gets its driver from.
enum Source {
    /// The system's `libcuda`, loaded once per process.
    System,
    /// A library opened from these names (not shared with other plugins).
    Names(Vec<String>),
    /// A given table (a fake in tests).
    Given(Arc<dyn DriverApi>),
}

/// The CUDA plugin: its devices once initialised, or the reason there are none.
pub struct CudaPlugin {
    source: Source,
    devices: Vec<CudaDevice>,
    reason: Option<String>,
}

impl Default for CudaPlugin {
    fn default() -> Self {
        Self::new()
    }
}

impl CudaPlugin {
    /// The plugin over the system's driver (`libcuda.so.1`), not yet initialised.
    pub fn new() -> Self {
        Self::from_source(Source::System)
    }

    /// The plugin over the first of `names` that loads as a CUDA driver.
    pub fn with_library_names(names: &[&str]) -> Self {
        Self::from_source(Source::Names(names.iter().map(|&n| n.to_owned()).collect()))
    }

    /// The plugin over a given driver table.
    pub fn with_driver(driver: Arc<dyn DriverApi>) -> Self {
        Self::from_source(Source::Given(driver))
    }

    fn from_source(source: Source) -> Self {
        CudaPlugin {
            source,
            devices: Vec::new(),
            reason: Some("not initialised".into()),
        }
    }

    fn driver(&self) -> Result<Arc<dyn DriverApi>, String> {
        match &self.source {
            Source::System => loader::system_driver(),
            Source::Names(names) => {
                let names: Vec<&str> = names.iter().map(String::as_str).collect();
                Ok(Arc::new(loader::LibCuda::open(&names)?))
            }
            Source::Given(driver) => Ok(driver.clone()),
        }
    }

    fn init_impl(&mut self) -> Result<(), CudaError> {
        if !self.devices.is_empty() {
            return Ok(());
        }
        let driver = match self.driver() {
            Ok(driver) => driver,
            Err(reason) => {
                log::info!("cuda: no driver: {reason}");
                self.reason = Some(reason);
                return Ok(());
            }
        };
        // A driver without a usable GPU (no device, no kernel module, a stub library) is no
        // devices, not an error.
        let count = match driver.init().and_then(|()| driver.device_count()) {
            Ok(count) => count,
            Err(code) => {
                let error = context::driver_error(&*driver, "cuInit", code);
                self.reason = Some(error.to_string());
                return Ok(());
            }
        };
        let mut devices = Vec::new();
        for ordinal in 0..count {
            // On an error, the devices opened so far are released as `devices` drops.
            devices.push(CudaDevice::open(driver.clone(), ordinal)?);
        }
        self.reason = devices.is_empty().then(|| "no CUDA devices".to_owned());
        self.devices = devices;
        Ok(())
    }

    fn deinit_impl(&mut self) -> Result<(), CudaError> {
        let mut first_error = None;
        for device in self.devices.drain(..) {
            if let Err(error) = device.release() {
                first_error.get_or_insert(error);
            }
        }
        self.reason = Some("deinitialised".into());
        first_error.map_or(Ok(()), Err)
    }
}

impl Plugin for CudaPlugin {
    type Device = CudaDevice;

    fn name(&self) -> &'static str {
        "cuda"
    }

    fn init(&mut self) -> Result<(), VendorError> {
        Ok(self.init_impl()?)
    }

    fn devices(&self) -> &[CudaDevice] {
        &self.devices
    }

    fn reason(&self) -> Option<String> {
        if self.devices.is_empty() {
            self.reason.clone()
        } else {
            None
        }
    }

    fn deinit(&mut self) -> Result<(), VendorError> {
        Ok(self.deinit_impl()?)
    }
}

/// The cuda plugin as its loadable library (`libplugin_cuda.so`, crate `plugin-cuda-so`)
/// makes it: its default settings.
impl plugin_abi::Loadable for CudaPlugin {
    const NAME: &'static std::ffi::CStr = c"cuda";
    fn for_library() -> Self {
        CudaPlugin::new()
    }
    /// What LLVM's loader sets on each device before it loads a libc program: a 3 KiB stack
    /// per thread (`cuCtxSetLimit(CU_LIMIT_STACK_SIZE)`).
    fn prepare_for_loader(runtime: &rpc_core::PluginRuntime<Self>) -> rpc_core::Result<()> {
        for device in runtime.devices() {
            device
                .set_stack_size(device::LOADER_STACK_SIZE)
                .map_err(|e| rpc_core::PluginError::Vendor {
                    plugin: "cuda",
                    what: "set the stack size",
                    source: rpc_core::plugin::VendorError::from(e).into(),
                })?;
        }
        Ok(())
    }
}

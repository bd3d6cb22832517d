//! `plugin-host`: a CPU device for the RPC runtime, so everything is testable with no GPU.
//!
//! # Internals
//! - [`HostPlugin`] (lib.rs): a configurable number of devices, lane width (1, 32 or 64) and
//!   port count.
//! - [`device::HostDevice`]: memory is host memory (its address is its "device" address);
//!   a launch runs a grid of warps, one host thread each, and calls the completion when every
//!   warp has returned (a completion that panics is caught and logged, as on a GPU plugin). A warp that panics fails the launch (reported by `synchronize`); the
//!   server keeps serving: the warp keeps its port's lock as it unwinds (as a trapped GPU warp
//!   keeps its lock bit, so no later warp mixes into the half-done exchange), and the server
//!   abandons the half-done exchange once no kernel that could own it runs.
//! - [`image::HostImage`]: kernels are Rust closures; an image that uses RPC carries a
//!   `__llvm_rpc_client` global of the generation's size, which the generic glue fills as on a
//!   GPU, and each warp reads it to find the mailbox and its lock bits.
//! - [`loader`]: image bytes name an image registered in this process, or are a native shared
//!   object whose exported C functions are the kernels ([`native`]).
//! - [`kernel::Warp`]: what GPU libc offers a kernel (printf, puts, fwrite, fopen, fclose,
//!   fread, fgets, malloc, free, exit, abort, any opcode), each through the real client protocol.
//!
//! `rpc-serve` (tools/rpc-serve), which serves a mailbox in shared memory for clients in other
//! processes, is a crate of its own, so that embedders of this plugin build none of its
//! dependencies.

#![warn(missing_docs)]

pub mod device;
pub mod error;
pub mod image;
pub mod kernel;
pub mod loader;
pub mod memory;
pub mod native;

use rpc_core::plugin::{Plugin, VendorError};

pub use device::HostDevice;
pub use error::HostError;
pub use image::HostImage;
pub use kernel::{Arg, Target, Warp};
pub use memory::HostAllocator;

/// Locks a mutex, ignoring poisoning: a warp that panics (a failed launch) must not take the
/// device's tables down with it, and every critical section here leaves its data consistent
/// before anything that can panic.
pub fn lock<T>(mutex: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The host plugin's settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HostConfig {
    /// How many devices `init` makes (0: the plugin reports none, and says so).
    pub devices: usize,
    /// 1, 32 (like NVIDIA) or 64 (like AMD wave64).
    pub lanes: u32,
    /// Ports per mailbox (capped by the generation's maximum).
    pub ports: u32,
}

impl Default for HostConfig {
    fn default() -> Self {
        HostConfig {
            devices: 1,
            lanes: 32,
            ports: 64,
        }
    }
}

/// The CPU plugin.
pub struct HostPlugin {
    config: HostConfig,
    devices: Vec<HostDevice>,
}

impl HostPlugin {
    /// A plugin with these settings and no devices yet: `init` checks the settings and makes
    /// the devices.
    pub fn new(config: HostConfig) -> Self {
        HostPlugin {
            config,
            devices: Vec::new(),
        }
    }
}

impl Plugin for HostPlugin {
    type Device = HostDevice;

    fn name(&self) -> &'static str {
        "host"
    }

    fn init(&mut self) -> Result<(), VendorError> {
        let HostConfig {
            devices,
            lanes,
            ports,
        } = self.config;
        if !rpc_core::protocol::LANE_SIZES.contains(&lanes) || ports == 0 {
            return Err(HostError::Config(format!(
                "lanes {lanes} (1, 32 or 64) and ports {ports} (>= 1)"
            ))
            .into());
        }
        self.devices = (0..devices)
            .map(|i| HostDevice::new(i, lanes, ports))
            .collect();
        Ok(())
    }

    fn devices(&self) -> &[HostDevice] {
        &self.devices
    }

    fn reason(&self) -> Option<String> {
        self.devices
            .is_empty()
            .then(|| "configured with 0 devices".into())
    }

    fn deinit(&mut self) -> Result<(), VendorError> {
        let failures: Vec<String> = self
            .devices
            .iter()
            .filter_map(|d| {
                rpc_core::plugin::Device::synchronize(d)
                    .err()
                    .map(|e| e.to_string())
            })
            .collect();
        self.devices.clear();
        if failures.is_empty() {
            Ok(())
        } else {
            Err(HostError::KernelFailed(failures.join("; ")).into())
        }
    }
}

/// The host plugin as its loadable library (`libplugin_host.so`, crate `plugin-host-so`)
/// makes it: its default settings.
impl plugin_abi::Loadable for HostPlugin {
    const NAME: &'static std::ffi::CStr = c"host";
    fn for_library() -> Self {
        HostPlugin::new(HostConfig::default())
    }
}

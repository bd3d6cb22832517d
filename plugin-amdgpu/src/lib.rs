//! `plugin-amdgpu`: AMD GPUs through the HSA runtime (`libhsa-runtime64.so.1`), loaded at run
//! time, so the crate builds and tests everywhere and a machine without ROCm or without a GPU
//! simply has zero devices and a reason.
//!
//! # Internals
//! - [`loader`]: the runtime. [`HsaApi`] is one typed trait of only the HSA functions used,
//!   with Rust signatures (slices, `CStr`, typed attributes, `Result<_, AmdGpuError>`): every
//!   `unsafe` call into HSA is behind it, and the rest of the crate calls only its methods.
//!   [`LibHsa`] is the real one, a `libloading` table resolved up front and built once
//!   ([`loader::table`], a `OnceLock`); the HSA types and constants are declared there from
//!   `hsa.h` / `hsa_ext_amd.h` / `amd_hsa_signal.h`. Tests substitute a fake HSA
//!   ([`AmdGpuPlugin::with_api`]; `src/fake.rs`, `src/tests.rs`).
//! - [`AmdGpuPlugin`] ([`rpc_core::plugin::Plugin`]): `init` loads the runtime, calls `hsa_init`,
//!   and makes every GPU agent a device; any failure on that path is zero devices plus
//!   [`Plugin::reason`], never a panic or an error. `deinit` drops the devices and calls
//!   `hsa_shut_down` (HSA reference-counts init/shut-down).
//! - [`device`]: [`AmdGpuDevice`] ([`rpc_core::plugin::Device`]): lane width = the agent's
//!   wavefront size (64 or 32); `N` = min(CUs x max waves per CU, MAX_PORT_COUNT); mailboxes in
//!   the CPU agent's fine-grained pool, made accessible to the GPU with
//!   `hsa_amd_agents_allow_access`; kernel arguments from the kernarg pool; one AQL queue per
//!   device created by the first launch, with one **waiter thread per device** that retires
//!   completions in order (every dispatch has the barrier bit) and calls each `done` once.
//! - [`image`]: code objects (`hsa_code_object_reader_create_from_memory`,
//!   `hsa_executable_create_alt`, `load_agent_code_object`, `freeze`); variables and `<name>.kd`
//!   kernel descriptors looked up with the agent.
//! - [`aql`]: the 64-byte kernel dispatch packet and the kernarg block as bytes (the v5
//!   implicit arguments in the segment's last 256 bytes, at least 16 KiB of scratch for a
//!   dynamic call stack, as LLVM's loader sets); the header goes last with a release store,
//!   then the queue's doorbell signal.
//! - [`code_object`]: a code object read without HSA: its symbols and its metadata note
//!   (target, kernels with kernarg sizes, stack needs, wavefront size), for `rpc-run`.
//! - [`memory`]: [`AmdGpuRegion`], fine-grained shared memory (the mailbox), and
//!   [`AmdGpuAllocator`], MALLOC/FREE (coarse-grained device pool, 2 MiB aligned by
//!   over-allocating; forgotten blocks freed at deinit).
//! - [`doorbell`]: [`AmdGpuDoorbell`], the v2 mailbox doorbell as an HSA interrupt signal: the
//!   record bytes, a host `&AtomicU64` view of the counter, and a timed wait.
//! - [`error`]: [`AmdGpuError`] and the names of HSA status codes.
//!
//! # What was and was not run
//! Built and tested on a machine **without an AMD GPU**. Against the real runtime: the
//! missing-library path, a library without the HSA symbols, and Debian's `libhsa-runtime64-1`
//! (5.2.3) without `/dev/kfd`, where `hsa_init` returns `HSA_STATUS_ERROR_OUT_OF_RESOURCES`
//! (0x1008) and the plugin reports zero devices with that reason (`tests/no_driver.rs`).
//! Against the fake HSA (`src/tests.rs`): everything above the runtime — agent and pool
//! discovery, code object loading and symbol lookup, copies, AQL packets published into a ring
//! and retired by the waiter, done once per launch, a faulting queue, a panicking completion,
//! abort at deinit, and kernels that print, exit and MALLOC through `PluginRuntime` over the
//! image's mailbox. What only hardware shows (ROCr's own behaviour, the packet processor, the
//! interrupt-signal doorbell, real code objects) has **not** been run; the byte-level pieces
//! (packet, header bits, kernarg layout, port count, doorbell record, status names) are
//! unit-tested.

#![warn(missing_docs)]

pub mod aql;
pub mod code_object;
pub mod device;
pub mod doorbell;
pub mod error;
pub mod image;
pub mod loader;
pub mod memory;

use std::sync::Arc;

use rpc_core::plugin::{Plugin, VendorError};

pub use device::AmdGpuDevice;
pub use doorbell::AmdGpuDoorbell;
pub use error::AmdGpuError;
pub use image::AmdGpuImage;
pub use loader::{HsaApi, LibHsa};
pub use memory::{AmdGpuAllocator, AmdGpuRegion};

#[cfg(test)]
mod fake;
#[cfg(test)]
mod tests;

/// Where the plugin's runtime comes from.
enum Source {
    /// `libhsa-runtime64` under this name, loaded at `init`.
    Library(String),
    /// A runtime handed in (the tests' fake HSA).
    Api(Arc<dyn HsaApi>),
}

/// The AMD GPU plugin.
pub struct AmdGpuPlugin {
    source: Source,
    /// The runtime, when `hsa_init` succeeded (and `hsa_shut_down` is owed).
    hsa: Option<Arc<dyn HsaApi>>,
    devices: Vec<AmdGpuDevice>,
    reason: Option<String>,
}

impl Default for AmdGpuPlugin {
    fn default() -> Self {
        Self::new()
    }
}

impl AmdGpuPlugin {
    /// A plugin using [`loader::LIBRARY`]; call [`Plugin::init`] to find devices.
    pub fn new() -> Self {
        Self::with_library(loader::LIBRARY)
    }

    /// A plugin loading the runtime from `soname` instead (tests, unusual installs).
    pub fn with_library(soname: &str) -> Self {
        Self::from_source(Source::Library(soname.to_owned()))
    }

    /// A plugin over the runtime `hsa` (a fake one in tests).
    pub fn with_api(hsa: Arc<dyn HsaApi>) -> Self {
        Self::from_source(Source::Api(hsa))
    }

    fn from_source(source: Source) -> Self {
        AmdGpuPlugin {
            source,
            hsa: None,
            devices: Vec::new(),
            reason: None,
        }
    }

    fn try_init(&mut self) -> Result<(), AmdGpuError> {
        let hsa = match &self.source {
            Source::Library(soname) => loader::table_for(soname)?,
            Source::Api(hsa) => hsa.clone(),
        };
        hsa.init()
            .map_err(|e| AmdGpuError::NoRuntime(e.to_string()))?;
        self.hsa = Some(hsa.clone());
        self.devices = device::discover(&hsa)?;
        if self.devices.is_empty() {
            return Err(AmdGpuError::NoRuntime(
                "the HSA runtime found no GPU agents".into(),
            ));
        }
        Ok(())
    }

    fn shut_down(&mut self) -> Result<(), AmdGpuError> {
        self.devices.clear();
        match self.hsa.take() {
            // SAFETY: balanced with the successful `init` in `try_init`; every object of this
            // plugin (devices, their queues, pools and images held by the devices) was dropped
            // above. Images the caller still holds must be dropped first.
            Some(hsa) => unsafe { hsa.shut_down() },
            None => Ok(()),
        }
    }
}

impl Plugin for AmdGpuPlugin {
    type Device = AmdGpuDevice;

    fn name(&self) -> &'static str {
        "amdgpu"
    }

    fn init(&mut self) -> Result<(), VendorError> {
        if self.hsa.is_some() {
            return Ok(());
        }
        if let Err(e) = self.try_init() {
            let reason = match e {
                AmdGpuError::NoRuntime(reason) => reason,
                other => other.to_string(),
            };
            log::info!("amdgpu: no devices: {reason}");
            self.reason = Some(reason);
            let _ = self.shut_down();
        } else {
            self.reason = None;
        }
        Ok(())
    }

    fn devices(&self) -> &[AmdGpuDevice] {
        &self.devices
    }

    fn reason(&self) -> Option<String> {
        if self.devices.is_empty() {
            Some(
                self.reason
                    .clone()
                    .unwrap_or_else(|| "not initialised".into()),
            )
        } else {
            None
        }
    }

    fn deinit(&mut self) -> Result<(), VendorError> {
        Ok(self.shut_down()?)
    }
}

impl Drop for AmdGpuPlugin {
    fn drop(&mut self) {
        if let Err(e) = self.shut_down() {
            log::warn!("amdgpu: {e}");
        }
    }
}

/// The amdgpu plugin as its loadable library (`libplugin_amdgpu.so`, crate `plugin-amdgpu-so`)
/// makes it: its default settings.
impl plugin_abi::Loadable for AmdGpuPlugin {
    const NAME: &'static std::ffi::CStr = c"amdgpu";
    fn for_library() -> Self {
        AmdGpuPlugin::new()
    }
}

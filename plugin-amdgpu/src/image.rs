//! Code objects loaded into an HSA executable for one agent, and their symbols.

use std::ffi::CString;
use std::sync::Arc;

use rpc_core::plugin::Symbol;

use crate::aql::KernelInfo;
use crate::error::AmdGpuError;
use crate::loader::{
    Agent, CodeObjectReader, Executable, ExecutableSymbol, HsaApi,
    SYMBOL_INFO_KERNEL_DYNAMIC_CALLSTACK, SYMBOL_INFO_KERNEL_GROUP_SEGMENT_SIZE,
    SYMBOL_INFO_KERNEL_KERNARG_SEGMENT_ALIGNMENT, SYMBOL_INFO_KERNEL_KERNARG_SEGMENT_SIZE,
    SYMBOL_INFO_KERNEL_OBJECT, SYMBOL_INFO_KERNEL_PRIVATE_SEGMENT_SIZE, SYMBOL_INFO_TYPE,
    SYMBOL_INFO_VARIABLE_ADDRESS, SYMBOL_INFO_VARIABLE_SIZE, SYMBOL_KIND_KERNEL,
    SYMBOL_KIND_VARIABLE,
};

/// A frozen executable holding one code object, loaded for one agent.
pub struct AmdGpuImage {
    hsa: Arc<dyn HsaApi>,
    agent: Agent,
    executable: Executable,
    /// The widest `.wavefront_size` of its kernels, from the code object's metadata (LLVM's
    /// loader sizes the mailbox's lanes by it: HSA does not say).
    wavefront_size: Option<u32>,
    /// The sizes of the code object's `__llvm_libc*::rpc::client` objects (LLVM 18/19's
    /// client object, which `__llvm_libc_rpc_client` points to), from its symbol table: the
    /// symbol is local, so HSA cannot look it up.
    libc_client_sizes: Vec<u64>,
}

// SAFETY: an executable handle may be used from any thread (the runtime locks internally);
// the image never mutates it after freezing, only destroys it in drop.
unsafe impl Send for AmdGpuImage {}
// SAFETY: as above: `&AmdGpuImage` only queries the frozen executable.
unsafe impl Sync for AmdGpuImage {}

/// The name of a kernel's descriptor symbol: the kernel name plus `.kd`.
pub fn descriptor_name(kernel: &str) -> String {
    if kernel.ends_with(".kd") {
        kernel.to_owned()
    } else {
        format!("{kernel}.kd")
    }
}

impl AmdGpuImage {
    /// Loads the code object `bytes` (an AMDGPU ELF) for `agent` and freezes the executable.
    pub(crate) fn load(
        hsa: Arc<dyn HsaApi>,
        agent: Agent,
        bytes: &[u8],
    ) -> Result<Self, AmdGpuError> {
        if bytes.is_empty() {
            return Err(AmdGpuError::Invalid("empty code object"));
        }
        // SAFETY: `bytes` outlives the reader, which is destroyed before this function returns.
        let reader = unsafe { hsa.code_object_reader_create(bytes) }?;
        let result = Self::load_with(hsa.clone(), agent, reader).map(|mut image| {
            if let Ok(object) = crate::code_object::read(bytes) {
                image.wavefront_size = object
                    .kernels
                    .iter()
                    .map(|k| k.wavefront_size)
                    .max()
                    .filter(|&w| w == 32 || w == 64);
                image.libc_client_sizes = object
                    .globals
                    .iter()
                    .filter(|g| rpc_core::plugin::libc_rpc_client_namespace(&g.name).is_some())
                    .map(|g| g.size)
                    .collect();
            }
            image
        });
        // Executables do not depend on their readers.
        if let Err(e) = hsa.code_object_reader_destroy(reader) {
            log::warn!("amdgpu: {e}");
        }
        result
    }

    fn load_with(
        hsa: Arc<dyn HsaApi>,
        agent: Agent,
        reader: CodeObjectReader,
    ) -> Result<Self, AmdGpuError> {
        let executable = hsa.executable_create()?;
        // From here on, drop destroys the executable on every error path.
        let image = AmdGpuImage {
            hsa,
            agent,
            executable,
            wavefront_size: None,
            libc_client_sizes: Vec::new(),
        };
        image
            .hsa
            .executable_load_agent_code_object(executable, agent, reader)?;
        image.hsa.executable_freeze(executable)?;
        Ok(image)
    }

    fn symbol(&self, name: &str) -> Option<ExecutableSymbol> {
        let cname = CString::new(name).ok()?;
        self.hsa
            .executable_symbol(self.executable, &cname, self.agent)
            .ok()
    }

    fn info<T: Default>(&self, symbol: ExecutableSymbol, attribute: u32) -> Result<T, AmdGpuError> {
        let mut value = T::default();
        // SAFETY: every caller passes a `T` of the size hsa.h documents for `attribute` (u32 or
        // u64, noted beside the constants in loader.rs); the symbol belongs to a live executable.
        unsafe {
            self.hsa
                .executable_symbol_get_info(symbol, attribute, (&raw mut value).cast())
        }?;
        Ok(value)
    }

    /// The size of LLVM 18/19's client object, where the code object has exactly one (HSA
    /// gives no address of a local symbol to compare with; the pointer's target is that
    /// object in every image LLVM builds).
    pub fn libc_client_size(&self) -> Option<usize> {
        match self.libc_client_sizes[..] {
            [size] => usize::try_from(size).ok(),
            _ => None,
        }
    }

    /// A global variable's device address and size, if the image defines `name`.
    pub fn variable(&self, name: &str) -> Option<Symbol> {
        let symbol = self.symbol(name)?;
        if self.info::<u32>(symbol, SYMBOL_INFO_TYPE).ok()? != SYMBOL_KIND_VARIABLE {
            return None;
        }
        let addr = self
            .info::<u64>(symbol, SYMBOL_INFO_VARIABLE_ADDRESS)
            .ok()?;
        let size = self.info::<u32>(symbol, SYMBOL_INFO_VARIABLE_SIZE).ok()?;
        Some(Symbol {
            addr,
            size: size as usize,
        })
    }

    /// The wavefront size its kernels were compiled for, if the metadata says.
    pub fn wavefront_size(&self) -> Option<u32> {
        self.wavefront_size
    }

    /// What a dispatch of kernel `name` needs (looked up as `name.kd`).
    pub fn kernel(&self, name: &str) -> Result<KernelInfo, AmdGpuError> {
        let kd = descriptor_name(name);
        let no_symbol = || AmdGpuError::NoSymbol {
            kind: "kernel",
            name: kd.clone(),
        };
        let symbol = self.symbol(&kd).ok_or_else(no_symbol)?;
        if self.info::<u32>(symbol, SYMBOL_INFO_TYPE)? != SYMBOL_KIND_KERNEL {
            return Err(no_symbol());
        }
        Ok(KernelInfo {
            kernel_object: self.info(symbol, SYMBOL_INFO_KERNEL_OBJECT)?,
            kernarg_segment_size: self.info(symbol, SYMBOL_INFO_KERNEL_KERNARG_SEGMENT_SIZE)?,
            kernarg_segment_align: self
                .info(symbol, SYMBOL_INFO_KERNEL_KERNARG_SEGMENT_ALIGNMENT)?,
            group_segment_size: self.info(symbol, SYMBOL_INFO_KERNEL_GROUP_SEGMENT_SIZE)?,
            private_segment_size: crate::aql::private_segment_size(
                self.info(symbol, SYMBOL_INFO_KERNEL_PRIVATE_SEGMENT_SIZE)?,
                self.info::<u8>(symbol, SYMBOL_INFO_KERNEL_DYNAMIC_CALLSTACK)? != 0,
            ),
        })
    }
}

impl Drop for AmdGpuImage {
    fn drop(&mut self) {
        // SAFETY: created in `load_with`, destroyed once here; the caller drops an image only
        // after its kernels completed (Device::synchronize or the completions).
        if let Err(e) = unsafe { self.hsa.executable_destroy(self.executable) } {
            log::warn!("amdgpu: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernels_are_found_by_their_descriptor_symbol() {
        assert_eq!(descriptor_name("main"), "main.kd");
        assert_eq!(descriptor_name("_start.kd"), "_start.kd");
    }
}

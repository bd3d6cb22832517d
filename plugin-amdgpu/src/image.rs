//! Code objects loaded into an HSA executable for one agent, and their symbols.

use std::ffi::CString;

use rpc_core::plugin::Symbol;

use crate::aql::KernelInfo;
use crate::error::HsaError;
use crate::loader::{
    Agent, CodeObjectReader, Executable, ExecutableSymbol, Hsa, LoadedCodeObject,
    DEFAULT_FLOAT_ROUNDING_MODE_DEFAULT, PROFILE_FULL, SYMBOL_INFO_KERNEL_DYNAMIC_CALLSTACK,
    SYMBOL_INFO_KERNEL_GROUP_SEGMENT_SIZE, SYMBOL_INFO_KERNEL_KERNARG_SEGMENT_ALIGNMENT,
    SYMBOL_INFO_KERNEL_KERNARG_SEGMENT_SIZE, SYMBOL_INFO_KERNEL_OBJECT,
    SYMBOL_INFO_KERNEL_PRIVATE_SEGMENT_SIZE, SYMBOL_INFO_TYPE, SYMBOL_INFO_VARIABLE_ADDRESS,
    SYMBOL_INFO_VARIABLE_SIZE, SYMBOL_KIND_KERNEL, SYMBOL_KIND_VARIABLE,
};

/// A frozen executable holding one code object, loaded for one agent.
pub struct AmdGpuImage {
    hsa: &'static Hsa,
    agent: Agent,
    executable: Executable,
    /// The widest `.wavefront_size` of its kernels, from the code object's metadata (LLVM's
    /// loader sizes the mailbox's lanes by it: HSA does not say).
    wavefront_size: Option<u32>,
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
    pub(crate) fn load(hsa: &'static Hsa, agent: Agent, bytes: &[u8]) -> Result<Self, HsaError> {
        if bytes.is_empty() {
            return Err(HsaError::Invalid("empty code object"));
        }
        let mut reader = CodeObjectReader::default();
        // SAFETY: `bytes` is valid for `bytes.len()` bytes and outlives the reader, which is
        // destroyed before this function returns (hsa.h: the buffer must outlive the reader).
        let rc = unsafe {
            (hsa.hsa_code_object_reader_create_from_memory)(
                bytes.as_ptr().cast(),
                bytes.len(),
                &mut reader,
            )
        };
        hsa.check("hsa_code_object_reader_create_from_memory", rc)?;
        let result = Self::load_with(hsa, agent, reader).map(|mut image| {
            image.wavefront_size = crate::code_object::read(bytes)
                .ok()
                .and_then(|object| object.kernels.iter().map(|k| k.wavefront_size).max())
                .filter(|&w| w == 32 || w == 64);
            image
        });
        // SAFETY: created above, destroyed once; executables do not depend on their readers.
        let rc = unsafe { (hsa.hsa_code_object_reader_destroy)(reader) };
        if let Err(e) = hsa.check("hsa_code_object_reader_destroy", rc) {
            log::warn!("amdgpu: {e}");
        }
        result
    }

    fn load_with(
        hsa: &'static Hsa,
        agent: Agent,
        reader: CodeObjectReader,
    ) -> Result<Self, HsaError> {
        let mut executable = Executable::default();
        // SAFETY: valid enum values, null options allowed, valid out-pointer.
        let rc = unsafe {
            (hsa.hsa_executable_create_alt)(
                PROFILE_FULL,
                DEFAULT_FLOAT_ROUNDING_MODE_DEFAULT,
                core::ptr::null(),
                &mut executable,
            )
        };
        hsa.check("hsa_executable_create_alt", rc)?;
        // From here on, drop destroys the executable on every error path.
        let image = AmdGpuImage {
            hsa,
            agent,
            executable,
            wavefront_size: None,
        };
        let mut loaded = LoadedCodeObject::default();
        // SAFETY: live executable (not frozen), agent from `hsa_iterate_agents`, live reader,
        // null options, valid out-pointer.
        let rc = unsafe {
            (hsa.hsa_executable_load_agent_code_object)(
                executable,
                agent,
                reader,
                core::ptr::null(),
                &mut loaded,
            )
        };
        hsa.check("hsa_executable_load_agent_code_object", rc)?;
        // SAFETY: live executable; null options allowed.
        let rc = unsafe { (hsa.hsa_executable_freeze)(executable, core::ptr::null()) };
        hsa.check("hsa_executable_freeze", rc)?;
        Ok(image)
    }

    fn symbol(&self, name: &str) -> Option<ExecutableSymbol> {
        let cname = CString::new(name).ok()?;
        let mut symbol = ExecutableSymbol::default();
        // SAFETY: frozen live executable; `cname` is NUL-terminated; `agent` is the one the
        // code object was loaded for; valid out-pointer.
        let rc = unsafe {
            (self.hsa.hsa_executable_get_symbol_by_name)(
                self.executable,
                cname.as_ptr(),
                &self.agent,
                &mut symbol,
            )
        };
        (rc == crate::loader::STATUS_SUCCESS).then_some(symbol)
    }

    fn info<T: Default>(&self, symbol: ExecutableSymbol, attribute: u32) -> Result<T, HsaError> {
        let mut value = T::default();
        // SAFETY: every caller passes a `T` of the size hsa.h documents for `attribute` (u32 or
        // u64, noted beside the constants in loader.rs); the symbol belongs to a live executable.
        let rc = unsafe {
            (self.hsa.hsa_executable_symbol_get_info)(symbol, attribute, (&raw mut value).cast())
        };
        self.hsa.check("hsa_executable_symbol_get_info", rc)?;
        Ok(value)
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
    pub fn kernel(&self, name: &str) -> Result<KernelInfo, HsaError> {
        let kd = descriptor_name(name);
        let no_symbol = || HsaError::NoSymbol {
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
        let rc = unsafe { (self.hsa.hsa_executable_destroy)(self.executable) };
        if let Err(e) = self.hsa.check("hsa_executable_destroy", rc) {
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

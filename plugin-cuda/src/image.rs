//! Images: PTX, cubin or fatbin loaded as a module (`cuModuleLoadDataEx`, whose JIT error log
//! a failed load reports), their globals (`cuModuleGetGlobal`) and kernels
//! (`cuModuleGetFunction`).
//!
//! `cuModuleLoadDataEx` takes a bare pointer and reads as far as the image says: PTX up to its
//! NUL, a cubin as far as its ELF tables and sections reach, a fatbin as far as its header's
//! size. `prepare` checks that each of those ends inside the bytes we were given (appending
//! the NUL to PTX), which is what makes the load call sound.

use std::borrow::Cow;
use std::ffi::CString;
use std::sync::Arc;

use elf_read::Elf;
use rpc_core::plugin::Symbol;

use crate::context::Core;
use crate::error::{code_name, CudaError, Result, ERROR_NOT_FOUND};
use crate::loader::{Function, Module};

/// A loaded module; unloaded on drop.
pub struct CudaImage {
    core: Arc<Core>,
    module: Module,
    /// The `__llvm_libc*::rpc::client` names the image's bytes hold (LLVM 18/19's client
    /// object, which `__llvm_libc_rpc_client` points to; usually one, or none).
    libc_clients: Vec<String>,
}

impl std::fmt::Debug for CudaImage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaImage")
            .field("module", &self.module)
            .finish_non_exhaustive()
    }
}

impl CudaImage {
    pub(crate) fn load(core: &Arc<Core>, bytes: &[u8]) -> Result<CudaImage> {
        let image = prepare(bytes)?;
        core.bind()?;
        // SAFETY: `prepare` checked that the driver reads no further than `image` reaches.
        let module = unsafe { core.driver().module_load_data(&image) }.map_err(|(code, log)| {
            let name = core
                .driver()
                .error_name(code)
                .unwrap_or_else(|| code_name(code));
            CudaError::Load { code, name, log }
        })?;
        Ok(CudaImage {
            core: core.clone(),
            module,
            libc_clients: rpc_core::plugin::libc_rpc_client_names(bytes),
        })
    }

    /// The size of the global at device address `addr`, among LLVM libc's client objects
    /// (the only globals a loader asks this of): each is looked up by name, and only one the
    /// driver places at `addr` counts.
    pub(crate) fn size_at(&self, addr: u64) -> Option<usize> {
        self.libc_clients
            .iter()
            .filter_map(|name| self.global(name))
            .find(|symbol| symbol.addr == addr)
            .map(|symbol| symbol.size)
    }

    /// The global `name`: its device address and size. `None` if the module has none.
    pub(crate) fn global(&self, name: &str) -> Option<Symbol> {
        let name = CString::new(name).ok()?;
        self.core.bind().ok()?;
        match self.core.driver().module_get_global(self.module, &name) {
            Ok((addr, size)) => Some(Symbol { addr, size }),
            Err(ERROR_NOT_FOUND) => None,
            Err(code) => {
                log::warn!("cuda: {}", self.core.fail("cuModuleGetGlobal_v2", code));
                None
            }
        }
    }

    /// The kernel `name`. The caller has bound the context.
    pub(crate) fn function(&self, name: &str) -> Result<Function> {
        let c_name = CString::new(name)
            .map_err(|_| CudaError::InvalidArgument(format!("kernel name {name:?}")))?;
        self.core
            .driver()
            .module_get_function(self.module, &c_name)
            .map_err(|code| self.core.fail("cuModuleGetFunction", code))
    }
}

impl Drop for CudaImage {
    fn drop(&mut self) {
        // A released device took its modules with its context.
        if self.core.bind().is_err() {
            return;
        }
        if let Err(code) = self.core.driver().module_unload(self.module) {
            log::warn!("cuda: {}", self.core.fail("cuModuleUnload", code));
        }
    }
}

/// The fatbin header's magic (`fatBinaryHeader.magic`).
const FATBIN_MAGIC: u32 = 0xBA55_ED50;

/// What the driver would read of `bytes`: the whole image, made safe to hand over by pointer.
pub(crate) fn prepare(bytes: &[u8]) -> Result<Cow<'_, [u8]>> {
    if bytes.is_empty() {
        return Err(CudaError::InvalidArgument("an empty image".into()));
    }
    if bytes.starts_with(b"\x7fELF") {
        check_elf(bytes)?;
        Ok(Cow::Borrowed(bytes))
    } else if read_u32(bytes, 0) == Some(FATBIN_MAGIC) {
        let header = u64::from(read_u16(bytes, 6).unwrap_or(0));
        let size = read_u64(bytes, 8).ok_or_else(|| bad("a truncated fatbin header"))?;
        match header.checked_add(size) {
            Some(end) if header >= 16 && end <= bytes.len() as u64 => Ok(Cow::Borrowed(bytes)),
            _ => Err(bad("a fatbin whose header claims more bytes than it has")),
        }
    } else if bytes.last() == Some(&0) {
        Ok(Cow::Borrowed(bytes))
    } else {
        // PTX text: the driver reads up to the first NUL.
        let mut owned = Vec::with_capacity(bytes.len() + 1);
        owned.extend_from_slice(bytes);
        owned.push(0);
        Ok(Cow::Owned(owned))
    }
}

fn bad(what: &str) -> CudaError {
    CudaError::InvalidArgument(what.to_owned())
}

/// Checks that a 64-bit little-endian ELF's header tables, sections and segments all lie
/// inside `bytes` (the driver finds everything through them).
fn check_elf(bytes: &[u8]) -> Result<()> {
    let check = || -> elf_read::Result<()> {
        let elf = Elf::new(bytes)?;
        for section in elf.sections()? {
            elf.data(&section)?;
        }
        for segment in elf.segments()? {
            elf_read::bytes_at(bytes, segment.offset, segment.file_size)?;
        }
        Ok(())
    };
    check().map_err(|e| {
        bad(&format!(
            "an ELF image the driver could not read whole: {e}"
        ))
    })
}

fn read_u16(bytes: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(bytes.get(at..at + 2)?.try_into().ok()?))
}
fn read_u32(bytes: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(bytes.get(at..at + 4)?.try_into().ok()?))
}
fn read_u64(bytes: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(bytes.get(at..at + 8)?.try_into().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use elf_read::SHT_NOBITS;

    #[test]
    fn ptx_gets_its_terminating_nul() {
        assert_eq!(&*prepare(b".version 8.0").unwrap(), b".version 8.0\0");
        assert!(matches!(
            prepare(b".version 8.0\0").unwrap(),
            Cow::Borrowed(_)
        ));
    }

    #[test]
    fn a_fatbin_must_hold_the_bytes_its_header_claims() {
        let mut fatbin = Vec::new();
        fatbin.extend_from_slice(&FATBIN_MAGIC.to_le_bytes());
        fatbin.extend_from_slice(&1u16.to_le_bytes());
        fatbin.extend_from_slice(&16u16.to_le_bytes());
        fatbin.extend_from_slice(&32u64.to_le_bytes());
        assert!(prepare(&fatbin).is_err());
        fatbin.resize(48, 0);
        assert!(prepare(&fatbin).is_ok());
    }

    /// A minimal ELF64 header with one section header table of `count` entries at `shoff`.
    fn elf(shoff: u64, count: u16, total: usize) -> Vec<u8> {
        let mut bytes = vec![0u8; total];
        bytes[..4].copy_from_slice(b"\x7fELF");
        bytes[4] = 2;
        bytes[5] = 1;
        bytes[0x28..0x30].copy_from_slice(&shoff.to_le_bytes());
        bytes[0x3A..0x3C].copy_from_slice(&64u16.to_le_bytes());
        bytes[0x3C..0x3E].copy_from_slice(&count.to_le_bytes());
        bytes
    }

    #[test]
    fn a_cubin_must_hold_its_tables_and_sections() {
        assert!(prepare(&elf(64, 1, 128)).is_ok()); // one empty section at offset 0
        assert!(prepare(&elf(64, 2, 128)).is_err()); // the table runs past the end
        let mut image = elf(64, 1, 128);
        image[64 + 0x18..64 + 0x20].copy_from_slice(&100u64.to_le_bytes());
        image[64 + 0x20..64 + 0x28].copy_from_slice(&100u64.to_le_bytes());
        assert!(prepare(&image).is_err()); // a section at 100..200 of 128 bytes
        image[64 + 4..64 + 8].copy_from_slice(&SHT_NOBITS.to_le_bytes());
        assert!(prepare(&image).is_ok()); // .bss-like: no bytes in the file
    }
}

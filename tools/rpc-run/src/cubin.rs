//! Reading a cubin (an NVIDIA ELF, `EM_CUDA`) without a driver: its SM target, each kernel
//! with its parameter sizes and stack needs, and its variables with their sizes.
//!
//! The fields relied on, and where they are written down:
//! - the ELF64 header, section headers and symbol table: the System V gABI. `e_ident[8]`
//!   (`EI_ABIVERSION`) 7 keeps the SM number in `e_flags & 0xff` (`0x800` marks an `a`
//!   target), 8 keeps it in `(e_flags >> 8) & 0xff` (`0x8` marks it): LLVM's
//!   `llvm/BinaryFormat/ELF.h` (`ELFABIVERSION_CUDA_V1/V2`, `EF_CUDA_SM`, `EF_CUDA_SM_MASK`,
//!   `EF_CUDA_SM_OFFSET`, `EF_CUDA_ACCELERATORS`), read as `getNVPTXCPUName` reads them;
//! - kernels: function symbols marked as entries in `st_other` (`STO_CUDA_ENTRY`, 0x10, as
//!   `cuobjdump -elf` shows `STO_ENTRY`) or having a `.nv.info.NAME` section;
//! - `.nv.info` and `.nv.info.NAME` sections: a run of attributes, each a byte of format and
//!   a byte of attribute, then by format nothing more (`EIFMT_NVAL` 1), one byte and a pad
//!   (`EIFMT_BVAL` 2), a `u16` value (`EIFMT_HVAL` 3), or a `u16` size and that many bytes
//!   (`EIFMT_SVAL` 4). NVIDIA documents only the names (`cuobjdump -elf` prints them); the
//!   numbers and layouts are those public cubin readers agree on:
//!   - `EIATTR_PARAM_CBANK` (0x0a, SVAL 8): `u32` symbol of `.nv.constant0.NAME`, `u16`
//!     offset of the parameters in constant bank 0, `u16` their bytes;
//!   - `EIATTR_CBANK_PARAM_SIZE` (0x19, HVAL): the parameters' bytes;
//!   - `EIATTR_KPARAM_INFO` (0x17, SVAL 12): `u32` index, `u16` ordinal, `u16` offset, `u32`
//!     whose bits 18..32 are the parameter's bytes;
//!   - `EIATTR_FRAME_SIZE` (0x11), `EIATTR_MIN_STACK_SIZE` (0x12), both SVAL 8: `u32`
//!     function symbol, `u32` bytes (the function's own frame; the stack its whole call tree
//!     needs as ptxas computed it).
//!
//! Everything is bounds-checked (the ELF through `elf-read`): a truncated or hostile file is an
//! error or a missing fact, never a panic.

use std::collections::BTreeMap;

use elf_read::{bytes_at, u16_at, u32_at, Elf, ElfError, SHT_SYMTAB, STT_FUNC, STT_OBJECT};

/// `e_machine` of NVIDIA ELF files.
pub const EM_CUDA: u16 = 190;

/// A kernel of a cubin (`None`: the file does not say).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Kernel {
    pub name: String,
    /// Bytes of the parameter block (`EIATTR_CBANK_PARAM_SIZE`, else `EIATTR_PARAM_CBANK`,
    /// else the end of the last `EIATTR_KPARAM_INFO` parameter).
    pub params_size: Option<u32>,
    /// Each parameter's bytes by ordinal (`EIATTR_KPARAM_INFO`).
    pub params: Option<Vec<u32>>,
    /// The stack the kernel's call tree needs (`EIATTR_MIN_STACK_SIZE`, else its own frame,
    /// `EIATTR_FRAME_SIZE`).
    pub stack: Option<u32>,
}

/// What a cubin holds.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Cubin {
    /// `sm_90`, `sm_90a`.
    pub target: String,
    /// `EI_ABIVERSION`: 7 or 8.
    pub abi_version: u8,
    pub kernels: Vec<Kernel>,
    /// Object symbols (variables) with their sizes.
    pub globals: Vec<(String, u64)>,
}

/// Why a file is not a readable cubin.
#[derive(Debug, PartialEq, Eq)]
pub struct BadCubin(pub &'static str);

type Result<T> = std::result::Result<T, BadCubin>;

impl From<ElfError> for BadCubin {
    fn from(error: ElfError) -> Self {
        BadCubin(error.reason())
    }
}

const STO_CUDA_ENTRY: u8 = 0x10;

const EIFMT_NVAL: u8 = 1;
const EIFMT_BVAL: u8 = 2;
const EIFMT_HVAL: u8 = 3;
const EIFMT_SVAL: u8 = 4;
const EIATTR_PARAM_CBANK: u8 = 0x0a;
const EIATTR_FRAME_SIZE: u8 = 0x11;
const EIATTR_MIN_STACK_SIZE: u8 = 0x12;
const EIATTR_KPARAM_INFO: u8 = 0x17;
const EIATTR_CBANK_PARAM_SIZE: u8 = 0x19;

/// One attribute of a `.nv.info` section: its number and its value bytes (HVAL: the two
/// value bytes; NVAL: none).
fn attributes(section: &[u8]) -> Result<Vec<(u8, &[u8])>> {
    let mut found = Vec::new();
    let mut at = 0;
    while at < section.len() {
        let head = bytes_at(section, at as u64, 4)?;
        let (format, attribute) = (head[0], head[1]);
        let value = match format {
            EIFMT_NVAL => &head[2..2],
            EIFMT_BVAL => &head[2..3],
            EIFMT_HVAL => &head[2..4],
            EIFMT_SVAL => {
                let size = u16::from_le_bytes([head[2], head[3]]);
                let value = bytes_at(section, at as u64 + 4, u64::from(size))?;
                at += usize::from(size);
                value
            }
            _ => return Err(BadCubin("unknown .nv.info attribute format")),
        };
        at += 4;
        found.push((attribute, value));
    }
    Ok(found)
}

/// What the `.nv.info.NAME` attributes say of one kernel's parameters.
#[derive(Default)]
struct Params {
    cbank_size: Option<u32>,
    param_cbank: Option<u32>,
    /// (ordinal, offset, bytes) per `EIATTR_KPARAM_INFO`.
    each: Vec<(u16, u16, u32)>,
}

impl Params {
    fn read(section: &[u8]) -> Result<Params> {
        let mut params = Params::default();
        for (attribute, value) in attributes(section)? {
            match attribute {
                EIATTR_CBANK_PARAM_SIZE if value.len() == 2 => {
                    params.cbank_size = Some(u32::from(u16_at(value, 0)?));
                }
                EIATTR_PARAM_CBANK if value.len() == 8 => {
                    params.param_cbank = Some(u32::from(u16_at(value, 6)?));
                }
                EIATTR_KPARAM_INFO if value.len() == 12 => {
                    let ordinal = u16_at(value, 4)?;
                    let offset = u16_at(value, 6)?;
                    let bytes = u32_at(value, 8)? >> 18;
                    params.each.push((ordinal, offset, bytes));
                }
                _ => {}
            }
        }
        params.each.sort_unstable();
        Ok(params)
    }

    fn size(&self) -> Option<u32> {
        self.cbank_size.or(self.param_cbank).or_else(|| {
            self.each
                .iter()
                .map(|&(_, offset, bytes)| u32::from(offset) + bytes)
                .max()
        })
    }

    /// Each parameter's bytes; none at all where the block is empty.
    fn sizes(&self) -> Option<Vec<u32>> {
        (!self.each.is_empty() || self.size() == Some(0))
            .then(|| self.each.iter().map(|&(_, _, b)| b).collect())
    }
}

/// Whether `bytes` start like an NVIDIA ELF.
pub fn is_cubin(bytes: &[u8]) -> bool {
    elf_read::machine(bytes) == Some(EM_CUDA)
}

/// Reads a cubin.
pub fn read(bytes: &[u8]) -> Result<Cubin> {
    if !is_cubin(bytes) {
        return Err(BadCubin("not an NVIDIA ELF (EM_CUDA)"));
    }
    let elf = Elf::new(bytes)?;
    let (abi_version, flags) = (elf.abi_version, elf.flags);
    let (sm, accelerated) = match abi_version {
        7 => (flags & 0xff, flags & 0x800 != 0),
        _ => ((flags >> 8) & 0xff, flags & 0x8 != 0),
    };
    let sections = elf.sections()?;
    let symbols = match sections.iter().find(|s| s.kind == SHT_SYMTAB) {
        Some(table) => elf.symbols(&sections, table)?,
        None => Vec::new(),
    };

    // Stack attributes name functions by symbol index, in any .nv.info section.
    let mut stacks: BTreeMap<(u32, u8), u32> = BTreeMap::new();
    let mut params: BTreeMap<&str, Params> = BTreeMap::new();
    for section in &sections {
        let Some(rest) = section.name.strip_prefix(".nv.info") else {
            continue;
        };
        let data = elf.data(section)?;
        for (attribute, value) in attributes(data)? {
            if matches!(attribute, EIATTR_FRAME_SIZE | EIATTR_MIN_STACK_SIZE) && value.len() == 8 {
                stacks.insert((u32_at(value, 0)?, attribute), u32_at(value, 4)?);
            }
        }
        if let Some(kernel) = rest.strip_prefix('.') {
            params.insert(kernel, Params::read(data)?);
        }
    }

    let mut cubin = Cubin {
        target: format!("sm_{sm}{}", if accelerated { "a" } else { "" }),
        abi_version,
        ..Cubin::default()
    };
    for (index, symbol) in symbols.iter().enumerate() {
        let index = index as u32;
        let is_entry = symbol.other & STO_CUDA_ENTRY != 0 || params.contains_key(&*symbol.name);
        if symbol.kind == STT_FUNC && is_entry {
            if cubin.kernels.iter().any(|k| k.name == symbol.name) {
                continue;
            }
            let stack = |attribute| stacks.get(&(index, attribute)).copied();
            let kernel_params = params.get(&*symbol.name);
            cubin.kernels.push(Kernel {
                name: symbol.name.clone(),
                params_size: kernel_params.and_then(Params::size),
                params: kernel_params.and_then(Params::sizes),
                stack: stack(EIATTR_MIN_STACK_SIZE).or(stack(EIATTR_FRAME_SIZE)),
            });
        } else if symbol.kind == STT_OBJECT
            && !symbol.name.is_empty()
            && !cubin.globals.iter().any(|(n, _)| *n == symbol.name)
        {
            cubin.globals.push((symbol.name.clone(), symbol.size));
        }
    }
    Ok(cubin)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attributes_of_every_format_are_walked_and_a_bad_one_is_an_error() {
        let mut section = vec![EIFMT_NVAL, 0x2b, 0, 0]; // EIATTR_WMMA_USED
        section.extend([EIFMT_HVAL, EIATTR_CBANK_PARAM_SIZE, 0x20, 0]);
        section.extend([EIFMT_BVAL, 0x01, 7, 0]);
        section.extend([EIFMT_SVAL, EIATTR_PARAM_CBANK, 8, 0]);
        section.extend([3, 0, 0, 0, 0x60, 0x01, 0x20, 0x00]);
        let found = attributes(&section).unwrap();
        let numbers: Vec<u8> = found.iter().map(|&(a, _)| a).collect();
        assert_eq!(
            numbers,
            [0x2b, EIATTR_CBANK_PARAM_SIZE, 0x01, EIATTR_PARAM_CBANK]
        );
        let params = Params::read(&section).unwrap();
        assert_eq!(
            (params.cbank_size, params.param_cbank),
            (Some(32), Some(32))
        );

        assert!(attributes(&[9, 1, 0, 0]).is_err());
        // An SVAL whose size runs past the section.
        assert!(attributes(&[EIFMT_SVAL, 0x17, 12, 0, 1, 2]).is_err());
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        let mut elf = b"\x7fELF\x02\x01\x01\x07".to_vec();
        elf.resize(64, 0xff);
        elf[18] = EM_CUDA as u8;
        elf[19] = 0;
        assert!(read(&elf).is_err());
        assert!(read(b"\x7fELF").is_err());
    }
}

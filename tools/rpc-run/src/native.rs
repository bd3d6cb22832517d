//! Native host images: an ELF shared object of this machine (what `cc -shared` or a Rust
//! `cdylib` makes), run on plugin-host's CPU warps (`docs/plugins.md`, "Native host images").
//! Its kernels are its exported functions, its client object its exported `__llvm_rpc_client`;
//! both are read here from the dynamic symbol table, without loading the object.

use elf_read::{Elf, ET_DYN, SHT_DYNSYM, STB_GLOBAL, STB_WEAK, STT_FUNC, STT_OBJECT};

/// This machine's ELF `e_machine`.
#[cfg(target_arch = "x86_64")]
pub const EM_HOST: u16 = 62;
/// This machine's ELF `e_machine`.
#[cfg(target_arch = "aarch64")]
pub const EM_HOST: u16 = 183;
/// This machine's ELF `e_machine` (none known: no native image is recognised).
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
pub const EM_HOST: u16 = u16::MAX;

/// What a native image exports.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Exports {
    /// Exported, defined functions: the kernels.
    pub functions: Vec<String>,
    /// Exported, defined data symbols with their sizes.
    pub objects: Vec<(String, u64)>,
}

/// Whether `head` starts a 64-bit little-endian shared object of this machine.
pub fn is_native(head: &[u8]) -> bool {
    head.len() >= 20
        && head.starts_with(b"\x7fELF")
        && head[4] == 2
        && head[5] == 1
        && u16::from_le_bytes([head[16], head[17]]) == ET_DYN
        && u16::from_le_bytes([head[18], head[19]]) == EM_HOST
}

/// The exported, defined symbols of the shared object `bytes` (its `.dynsym`).
pub fn exports(bytes: &[u8]) -> Result<Exports, String> {
    if !is_native(bytes) {
        return Err("not a 64-bit shared object of this machine".into());
    }
    let elf = Elf::new(bytes).map_err(|e| e.to_string())?;
    let sections = elf.sections().map_err(|e| e.to_string())?;
    let mut exports = Exports::default();
    let Some(table) = sections.iter().find(|s| s.kind == SHT_DYNSYM) else {
        return Ok(exports);
    };
    let symbols = elf.symbols(&sections, table).map_err(|e| e.to_string())?;
    for symbol in symbols {
        let defined = symbol.section != 0;
        if !defined || !matches!(symbol.binding, STB_GLOBAL | STB_WEAK) {
            continue;
        }
        match symbol.kind {
            STT_FUNC => exports.functions.push(symbol.name),
            STT_OBJECT => exports.objects.push((symbol.name, symbol.size)),
            _ => {}
        }
    }
    Ok(exports)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn other_elves_and_truncated_ones_are_refused() {
        let mut elf = vec![0u8; 64];
        elf[..6].copy_from_slice(b"\x7fELF\x02\x01");
        elf[16..18].copy_from_slice(&ET_DYN.to_le_bytes());
        elf[18..20].copy_from_slice(&EM_HOST.to_le_bytes());
        assert!(is_native(&elf));
        // Section headers past the end.
        elf[40..48].copy_from_slice(&1000u64.to_le_bytes());
        elf[58..60].copy_from_slice(&64u16.to_le_bytes());
        elf[60..62].copy_from_slice(&1u16.to_le_bytes());
        assert!(exports(&elf).unwrap_err().contains("past the end"));
        // An executable, not a shared object.
        elf[16] = 2;
        assert!(!is_native(&elf));
    }
}

//! Native host images: an ELF shared object of this machine (what `cc -shared` or a Rust
//! `cdylib` makes), run on plugin-host's CPU warps (`docs/plugins.md`, "Native host images").
//! Its kernels are its exported functions, its client object its exported `__llvm_rpc_client`;
//! both are read here from the dynamic symbol table, without loading the object.

/// This machine's ELF `e_machine`.
#[cfg(target_arch = "x86_64")]
pub const EM_HOST: u16 = 62;
/// This machine's ELF `e_machine`.
#[cfg(target_arch = "aarch64")]
pub const EM_HOST: u16 = 183;
/// This machine's ELF `e_machine` (none known: no native image is recognised).
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
pub const EM_HOST: u16 = u16::MAX;

/// ELF `ET_DYN`: a shared object.
const ET_DYN: u16 = 3;
const SHT_DYNSYM: u32 = 11;
const STT_OBJECT: u8 = 1;
const STT_FUNC: u8 = 2;
const STB_GLOBAL: u8 = 1;
const STB_WEAK: u8 = 2;

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

/// `len` bytes at `at` of `bytes`, or why not.
fn slice(bytes: &[u8], at: u64, len: u64) -> Result<&[u8], String> {
    let end = at.checked_add(len).ok_or("an offset overflows")?;
    usize::try_from(at)
        .ok()
        .zip(usize::try_from(end).ok())
        .and_then(|(at, end)| bytes.get(at..end))
        .ok_or_else(|| format!("{len} bytes at {at} are past the end of the file"))
}

fn u16_at(bytes: &[u8], at: u64) -> Result<u16, String> {
    Ok(u16::from_le_bytes(
        slice(bytes, at, 2)?.try_into().unwrap_or_default(),
    ))
}
fn u32_at(bytes: &[u8], at: u64) -> Result<u32, String> {
    Ok(u32::from_le_bytes(
        slice(bytes, at, 4)?.try_into().unwrap_or_default(),
    ))
}
fn u64_at(bytes: &[u8], at: u64) -> Result<u64, String> {
    Ok(u64::from_le_bytes(
        slice(bytes, at, 8)?.try_into().unwrap_or_default(),
    ))
}

/// The exported, defined symbols of the shared object `bytes` (its `.dynsym`).
pub fn exports(bytes: &[u8]) -> Result<Exports, String> {
    if !is_native(bytes) {
        return Err("not a 64-bit shared object of this machine".into());
    }
    let shoff = u64_at(bytes, 40)?;
    let shentsize = u64::from(u16_at(bytes, 58)?);
    let shnum = u64::from(u16_at(bytes, 60)?);
    if shentsize < 64 {
        return Err("a section header of fewer than 64 bytes".into());
    }
    // (kind, offset, size, link) of each section.
    let mut sections = Vec::new();
    for i in 0..shnum {
        let header = slice(bytes, shoff + i * shentsize, 64)?;
        sections.push((
            u32_at(header, 4)?,
            u64_at(header, 24)?,
            u64_at(header, 32)?,
            u32_at(header, 40)?,
        ));
    }
    let mut exports = Exports::default();
    let Some(&(_, offset, size, link)) = sections.iter().find(|s| s.0 == SHT_DYNSYM) else {
        return Ok(exports);
    };
    let &(_, names_at, names_len, _) = sections
        .get(link as usize)
        .ok_or("the dynamic symbols' string table is missing")?;
    let names = slice(bytes, names_at, names_len)?;
    for entry in slice(bytes, offset, size)?.chunks_exact(24) {
        let (kind, binding) = (entry[4] & 0xf, entry[4] >> 4);
        let defined = u16_at(entry, 6)? != 0;
        if !defined || !matches!(binding, STB_GLOBAL | STB_WEAK) {
            continue;
        }
        let rest = names.get(u32_at(entry, 0)? as usize..).unwrap_or_default();
        let end = rest.iter().position(|&b| b == 0).unwrap_or(rest.len());
        let name = String::from_utf8_lossy(&rest[..end]).into_owned();
        match kind {
            STT_FUNC => exports.functions.push(name),
            STT_OBJECT => exports.objects.push((name, u64_at(entry, 16)?)),
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

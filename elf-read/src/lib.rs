//! `elf-read`: a bounded, checked reader of 64-bit little-endian ELF files (the System V gABI),
//! the one the image readers share: NVIDIA cubins (rpc-run's `cubin`, plugin-cuda's check of
//! what the driver will read), AMDGPU code objects (plugin-amdgpu's `code_object`) and native
//! shared objects (rpc-run's `native`). It reads the file header ([`Elf::new`]), the section
//! headers with their names ([`Elf::sections`]), a symbol table ([`Elf::symbols`]), the notes of
//! a note section ([`notes`]) and the program headers ([`Elf::segments`]); what a format means
//! by them is its reader's.
//!
//! Every offset and size is checked against the file, with checked arithmetic: a truncated or
//! hostile file is an [`ElfError`], never a panic. It depends on nothing, so any crate may
//! use it without an arrow to a vendor's crate.

#![warn(missing_docs)]

use std::fmt;

/// `e_type` of a shared object.
pub const ET_DYN: u16 = 3;
/// `sh_type` of the static symbol table.
pub const SHT_SYMTAB: u32 = 2;
/// `sh_type` of a note section.
pub const SHT_NOTE: u32 = 7;
/// `sh_type` of a section that takes no bytes in the file (`.bss`).
pub const SHT_NOBITS: u32 = 8;
/// `sh_type` of the dynamic symbol table.
pub const SHT_DYNSYM: u32 = 11;
/// A symbol's type (`st_info & 0xf`): a variable.
pub const STT_OBJECT: u8 = 1;
/// A symbol's type: a function.
pub const STT_FUNC: u8 = 2;
/// A symbol's binding (`st_info >> 4`): global.
pub const STB_GLOBAL: u8 = 1;
/// A symbol's binding: weak.
pub const STB_WEAK: u8 = 2;

/// Bytes of the ELF64 file header, of a section header, of a program header, of a symbol.
const HEADER: u64 = 64;
const SECTION: u64 = 64;
const SEGMENT: u64 = 56;
const SYMBOL: usize = 24;

/// Why bytes are not a readable ELF64 little-endian file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ElfError {
    /// The bytes do not start with the ELF magic.
    NotElf,
    /// An ELF, but not `ELFCLASS64` with `ELFDATA2LSB`.
    NotElf64,
    /// A header, table, section or string lies outside the file or is inconsistent (which).
    Malformed(&'static str),
}

impl ElfError {
    /// What is wrong, in a few words (no prefix).
    pub fn reason(&self) -> &'static str {
        match self {
            ElfError::NotElf => "not an ELF file",
            ElfError::NotElf64 => "not a 64-bit little-endian ELF",
            ElfError::Malformed(why) => why,
        }
    }
}

impl fmt::Display for ElfError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ElfError::Malformed(why) => write!(f, "truncated or malformed ELF: {why}"),
            other => f.write_str(other.reason()),
        }
    }
}

impl std::error::Error for ElfError {}

/// The result of a read.
pub type Result<T> = std::result::Result<T, ElfError>;

/// `len` bytes at `at` of `bytes`, or [`ElfError::Malformed`] if any lies outside.
pub fn bytes_at(bytes: &[u8], at: u64, len: u64) -> Result<&[u8]> {
    let start = usize::try_from(at).map_err(|_| ElfError::Malformed("offset out of range"))?;
    let len = usize::try_from(len).map_err(|_| ElfError::Malformed("size out of range"))?;
    let end = start
        .checked_add(len)
        .ok_or(ElfError::Malformed("size out of range"))?;
    bytes
        .get(start..end)
        .ok_or(ElfError::Malformed("past the end of the file"))
}

/// The little-endian `u16` at `at` of `bytes`.
pub fn u16_at(bytes: &[u8], at: u64) -> Result<u16> {
    let b = bytes_at(bytes, at, 2)?;
    Ok(u16::from_le_bytes([b[0], b[1]]))
}

/// The little-endian `u32` at `at` of `bytes`.
pub fn u32_at(bytes: &[u8], at: u64) -> Result<u32> {
    let b = bytes_at(bytes, at, 4)?;
    Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
}

/// The little-endian `u64` at `at` of `bytes`.
pub fn u64_at(bytes: &[u8], at: u64) -> Result<u64> {
    Ok(u64::from(u32_at(bytes, at)?) | u64::from(u32_at(bytes, at + 4)?) << 32)
}

/// The `e_machine` of `bytes` if they start like an ELF file (the magic and 20 bytes), of
/// any class: enough to tell the formats apart before reading one.
pub fn machine(bytes: &[u8]) -> Option<u16> {
    bytes
        .starts_with(b"\x7fELF")
        .then(|| u16_at(bytes, 18).ok())
        .flatten()
}

/// The NUL-terminated string at `at` of a string table (empty where out of range; lossy).
pub fn name_at(table: &[u8], at: u32) -> String {
    let rest = table.get(at as usize..).unwrap_or_default();
    let end = rest.iter().position(|&b| b == 0).unwrap_or(rest.len());
    String::from_utf8_lossy(&rest[..end]).into_owned()
}

/// A section header's fields that readers use.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Section {
    /// Its name from the section name table (empty if the file has none).
    pub name: String,
    /// `sh_type`.
    pub kind: u32,
    /// `sh_offset`: where its bytes start in the file.
    pub offset: u64,
    /// `sh_size`: its bytes (none in the file for [`SHT_NOBITS`]).
    pub size: u64,
    /// `sh_link`: for a symbol table, the index of its string table.
    pub link: u32,
}

/// A symbol of a symbol table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Symbol {
    /// Its name from the table's string table (lossy UTF-8).
    pub name: String,
    /// `st_info & 0xf`: [`STT_OBJECT`], [`STT_FUNC`], ...
    pub kind: u8,
    /// `st_info >> 4`: [`STB_GLOBAL`], [`STB_WEAK`], ...
    pub binding: u8,
    /// `st_other` (visibility, and machine-specific bits).
    pub other: u8,
    /// `st_shndx`: 0 for an undefined symbol.
    pub section: u16,
    /// `st_size` in bytes.
    pub size: u64,
}

/// A program header's fields that readers use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Segment {
    /// `p_type`.
    pub kind: u32,
    /// `p_offset`: where its bytes start in the file.
    pub offset: u64,
    /// `p_filesz`: its bytes in the file.
    pub file_size: u64,
}

/// A note of a note section (`Elf64_Nhdr` and what follows it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Note<'a> {
    /// The owner's name, as stored (with its NUL, e.g. `AMDGPU\0`).
    pub name: &'a [u8],
    /// `n_type`.
    pub kind: u32,
    /// The descriptor.
    pub desc: &'a [u8],
}

/// A 64-bit little-endian ELF file, its header read; tables are read on request.
#[derive(Clone, Copy, Debug)]
pub struct Elf<'a> {
    bytes: &'a [u8],
    /// `e_type` ([`ET_DYN`], ...).
    pub kind: u16,
    /// `e_machine`.
    pub machine: u16,
    /// `e_ident[EI_ABIVERSION]`.
    pub abi_version: u8,
    /// `e_flags`.
    pub flags: u32,
}

impl<'a> Elf<'a> {
    /// Reads the file header of `bytes`: the magic, then the class and byte order, then the
    /// header's 64 bytes.
    pub fn new(bytes: &'a [u8]) -> Result<Elf<'a>> {
        if !bytes.starts_with(b"\x7fELF") {
            return Err(ElfError::NotElf);
        }
        if bytes.get(4) != Some(&2) || bytes.get(5) != Some(&1) {
            return Err(ElfError::NotElf64);
        }
        let header = bytes_at(bytes, 0, HEADER)?;
        Ok(Elf {
            bytes,
            kind: u16_at(header, 16)?,
            machine: u16_at(header, 18)?,
            abi_version: header[8],
            flags: u32_at(header, 48)?,
        })
    }

    /// The whole file.
    pub fn bytes(&self) -> &'a [u8] {
        self.bytes
    }

    /// The entries of the header table at `e_*off` (`offset_at`) of `entry` bytes each,
    /// `e_*num` of them, each entry's bytes.
    fn table(
        &self,
        offset_at: u64,
        size_at: u64,
        count_at: u64,
        entry: u64,
    ) -> Result<Vec<&'a [u8]>> {
        let offset = u64_at(self.bytes, offset_at)?;
        let size = u64::from(u16_at(self.bytes, size_at)?);
        let count = u64::from(u16_at(self.bytes, count_at)?);
        if count > 0 && size < entry {
            return Err(ElfError::Malformed("header table entry size"));
        }
        (0..count)
            .map(|i| {
                let at = i
                    .checked_mul(size)
                    .and_then(|off| off.checked_add(offset))
                    .ok_or(ElfError::Malformed("header table out of range"))?;
                bytes_at(self.bytes, at, entry)
            })
            .collect()
    }

    /// The section headers, in order, each named from the section name table
    /// (`e_shstrndx`), which must lie in the file if there is one.
    pub fn sections(&self) -> Result<Vec<Section>> {
        let mut names = Vec::new();
        let mut sections = Vec::new();
        for h in self.table(40, 58, 60, SECTION)? {
            names.push(u32_at(h, 0)?);
            sections.push(Section {
                name: String::new(),
                kind: u32_at(h, 4)?,
                offset: u64_at(h, 24)?,
                size: u64_at(h, 32)?,
                link: u32_at(h, 40)?,
            });
        }
        let shstrndx = usize::from(u16_at(self.bytes, 62)?);
        if let Some(strings) = sections.get(shstrndx) {
            let strings = self.data(strings)?;
            for (section, name) in sections.iter_mut().zip(names) {
                section.name = name_at(strings, name);
            }
        }
        Ok(sections)
    }

    /// The program headers, in order.
    pub fn segments(&self) -> Result<Vec<Segment>> {
        self.table(32, 54, 56, SEGMENT)?
            .into_iter()
            .map(|h| {
                Ok(Segment {
                    kind: u32_at(h, 0)?,
                    offset: u64_at(h, 8)?,
                    file_size: u64_at(h, 32)?,
                })
            })
            .collect()
    }

    /// The bytes of `section` in the file (none for [`SHT_NOBITS`]).
    pub fn data(&self, section: &Section) -> Result<&'a [u8]> {
        if section.kind == SHT_NOBITS {
            return Ok(&[]);
        }
        bytes_at(self.bytes, section.offset, section.size)
    }

    /// The symbols of `table` (a section of `sections` of type [`SHT_SYMTAB`] or
    /// [`SHT_DYNSYM`]), in order, named from its string table (`sh_link`).
    pub fn symbols(&self, sections: &[Section], table: &Section) -> Result<Vec<Symbol>> {
        let strings = sections
            .get(table.link as usize)
            .ok_or(ElfError::Malformed("symbol string table"))?;
        let strings = self.data(strings)?;
        self.data(table)?
            .chunks_exact(SYMBOL)
            .map(|entry| {
                Ok(Symbol {
                    name: name_at(strings, u32_at(entry, 0)?),
                    kind: entry[4] & 0xf,
                    binding: entry[4] >> 4,
                    other: entry[5],
                    section: u16_at(entry, 6)?,
                    size: u64_at(entry, 16)?,
                })
            })
            .collect()
    }
}

/// The notes of a note section's bytes, in order. A note whose name or descriptor runs past
/// the section is an error; fewer than 12 bytes left (no room for a note's header) end the
/// list, as does a note whose padded end lies past the section.
pub fn notes(section: &[u8]) -> Result<Vec<Note<'_>>> {
    let mut found = Vec::new();
    let mut rest = section;
    while rest.len() >= 12 {
        let name_len = u64::from(u32_at(rest, 0)?);
        let desc_len = u64::from(u32_at(rest, 4)?);
        let kind = u32_at(rest, 8)?;
        let name_end = 12 + name_len.next_multiple_of(4);
        let name = bytes_at(rest, 12, name_len)?;
        let desc = bytes_at(rest, name_end, desc_len)?;
        found.push(Note { name, kind, desc });
        let next = usize::try_from(name_end + desc_len.next_multiple_of(4))
            .map_err(|_| ElfError::Malformed("note size"))?;
        rest = rest.get(next..).unwrap_or_default();
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An ELF64 header, the sections' bytes after it, then their headers (index 0 empty,
    /// the last one the name table), each `(name, kind, bytes, link)`.
    fn elf(sections: &[(&str, u32, &[u8], u32)]) -> Vec<u8> {
        let mut file = vec![0u8; 64];
        file[..6].copy_from_slice(b"\x7fELF\x02\x01");
        file[18..20].copy_from_slice(&190u16.to_le_bytes());
        let mut names = vec![0u8];
        let mut placed = Vec::new();
        for (name, kind, data, link) in sections {
            let at = file.len() as u64;
            file.extend_from_slice(data);
            placed.push((names.len() as u32, *kind, at, data.len() as u64, *link));
            names.extend_from_slice(name.as_bytes());
            names.push(0);
        }
        let names_name = names.len() as u32;
        names.extend_from_slice(b".shstrtab\0");
        let names_at = file.len() as u64;
        file.extend_from_slice(&names);
        placed.push((names_name, 3, names_at, names.len() as u64, 0));
        let shoff = file.len() as u64;
        file.extend([0u8; 64]);
        for (name, kind, offset, size, link) in &placed {
            let mut h = [0u8; 64];
            h[0..4].copy_from_slice(&name.to_le_bytes());
            h[4..8].copy_from_slice(&kind.to_le_bytes());
            h[24..32].copy_from_slice(&offset.to_le_bytes());
            h[32..40].copy_from_slice(&size.to_le_bytes());
            h[40..44].copy_from_slice(&link.to_le_bytes());
            file.extend(h);
        }
        file[40..48].copy_from_slice(&shoff.to_le_bytes());
        file[58..60].copy_from_slice(&64u16.to_le_bytes());
        let count = placed.len() as u16 + 1;
        file[60..62].copy_from_slice(&count.to_le_bytes());
        file[62..64].copy_from_slice(&(count - 1).to_le_bytes());
        file
    }

    fn symbol(name: u32, info: u8, other: u8, section: u16, size: u64) -> [u8; 24] {
        let mut entry = [0u8; 24];
        entry[0..4].copy_from_slice(&name.to_le_bytes());
        entry[4] = info;
        entry[5] = other;
        entry[6..8].copy_from_slice(&section.to_le_bytes());
        entry[16..24].copy_from_slice(&size.to_le_bytes());
        entry
    }

    #[test]
    fn reads_named_sections_symbols_and_notes() {
        let strings = b"\0client\0main\0";
        let mut symtab = vec![0u8; 24];
        symtab.extend(symbol(1, 0x11, 0, 1, 552));
        symtab.extend(symbol(8, 0x22, 0x10, 0, 0));
        let mut note = Vec::new();
        for word in [7u32, 3, 32] {
            note.extend(word.to_le_bytes());
        }
        note.extend(b"AMDGPU\0\0abc\0");
        let file = elf(&[
            (".strtab", 3, strings, 0),
            (".symtab", SHT_SYMTAB, &symtab, 1),
            (".note", SHT_NOTE, &note, 0),
        ]);
        let elf = Elf::new(&file).unwrap();
        assert_eq!((elf.machine, elf.kind, elf.abi_version), (190, 0, 0));
        let sections = elf.sections().unwrap();
        let names: Vec<&str> = sections.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["", ".strtab", ".symtab", ".note", ".shstrtab"]);
        let symbols = elf.symbols(&sections, &sections[2]).unwrap();
        assert_eq!(symbols.len(), 3);
        assert_eq!(
            symbols[1],
            Symbol {
                name: "client".into(),
                kind: STT_OBJECT,
                binding: STB_GLOBAL,
                other: 0,
                section: 1,
                size: 552
            }
        );
        assert_eq!(
            (
                symbols[2].name.as_str(),
                symbols[2].kind,
                symbols[2].binding,
                symbols[2].other
            ),
            ("main", STT_FUNC, STB_WEAK, 0x10)
        );
        let notes = notes(elf.data(&sections[3]).unwrap()).unwrap();
        assert_eq!(
            notes,
            [Note {
                name: b"AMDGPU\0",
                kind: 32,
                desc: b"abc"
            }]
        );
        assert_eq!(machine(&file), Some(190));
        assert!(elf.segments().unwrap().is_empty());
    }

    #[test]
    fn every_truncation_and_bad_table_is_an_error_not_a_panic() {
        let file = elf(&[(".data", 1, b"12345678", 0)]);
        for len in 0..file.len() {
            let cut = &file[..len];
            let read = Elf::new(cut).and_then(|elf| elf.sections());
            assert!(read.is_err(), "length {len}");
        }
        assert_eq!(Elf::new(b"hello").unwrap_err(), ElfError::NotElf);
        assert_eq!(
            Elf::new(b"\x7fELF\x01\x01").unwrap_err(),
            ElfError::NotElf64
        );
        // A section header table whose entries are too small, or far past the end.
        let mut small = file.clone();
        small[58] = 40;
        assert!(Elf::new(&small).unwrap().sections().is_err());
        let mut far = file.clone();
        far[40..48].copy_from_slice(&u64::MAX.to_le_bytes());
        let error = Elf::new(&far).unwrap().sections().unwrap_err();
        assert!(matches!(error, ElfError::Malformed(_)), "{error}");
        // A section whose bytes lie past the end, unless it takes none.
        let mut outside = file.clone();
        let header = outside.len() - 2 * 64;
        outside[header + 24..header + 32].copy_from_slice(&u64::MAX.to_le_bytes());
        let elf = Elf::new(&outside).unwrap();
        let sections = elf.sections().unwrap();
        assert!(elf.data(&sections[1]).is_err());
        outside[header + 4..header + 8].copy_from_slice(&SHT_NOBITS.to_le_bytes());
        let elf = Elf::new(&outside).unwrap();
        assert_eq!(elf.data(&elf.sections().unwrap()[1]), Ok(&[][..]));
        // A note whose descriptor runs past its section.
        let mut note = Vec::new();
        for word in [4u32, 100, 1] {
            note.extend(word.to_le_bytes());
        }
        note.extend(b"abc\0");
        assert!(notes(&note).is_err());
        assert_eq!(notes(&note[..11]), Ok(Vec::new()));
    }
}

//! Reading an AMDGPU code object without a GPU: the ELF's symbols and the `NT_AMDGPU_METADATA`
//! note (a MessagePack map, AMDGPUUsage "Code Object V3+ Metadata"), so a loader can say what an
//! image holds (`rpc-run --inspect`) and launch it as LLVM's loader does (wavefront size, kernarg
//! size, stack needs) before HSA is asked.
//!
//! Everything here is bounds-checked (the ELF through `elf-read`): a truncated or hostile file
//! is a [`CodeObjectError`], never a panic.

use std::collections::BTreeMap;

use elf_read::{Elf, ElfError, SHT_DYNSYM, SHT_NOTE, SHT_SYMTAB, STT_OBJECT};

/// `e_machine` of AMDGPU code objects.
pub const EM_AMDGPU: u16 = 224;
/// The note type of the code object v3+ metadata.
const NT_AMDGPU_METADATA: u32 = 32;

/// What an image says about one kernel (its metadata map in `amdhsa.kernels`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KernelMeta {
    /// `.name`: the kernel's symbol (its descriptor is `.symbol`, the name plus `.kd`).
    pub name: String,
    /// `.kernarg_segment_size`: explicit plus implicit arguments.
    pub kernarg_segment_size: u32,
    /// `.kernarg_segment_align`: the argument block's alignment in bytes.
    pub kernarg_segment_align: u32,
    /// `.private_segment_fixed_size`: scratch bytes per work-item the compiler knows of.
    pub private_segment_fixed_size: u32,
    /// `.group_segment_fixed_size`: LDS (group memory) bytes per work-group.
    pub group_segment_fixed_size: u32,
    /// `.uses_dynamic_stack`: the stack is unbounded (recursion, indirect calls).
    pub uses_dynamic_stack: bool,
    /// `.wavefront_size`: 32 or 64.
    pub wavefront_size: u32,
}

/// A global symbol of the ELF (not a kernel descriptor).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Global {
    /// The symbol's name.
    pub name: String,
    /// Its `st_size` in bytes.
    pub size: u64,
}

/// What a code object holds.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CodeObject {
    /// `amdhsa.target`, e.g. `amdgcn-amd-amdhsa--gfx942`.
    pub target: String,
    /// `amdhsa.version` (`[1, 2]` is code object v5).
    pub version: Vec<u64>,
    /// `amdhsa.kernels`, in the note's order.
    pub kernels: Vec<KernelMeta>,
    /// Object symbols (variables) with their sizes.
    pub globals: Vec<Global>,
}

impl CodeObject {
    /// The kernel named `name` (its `.name`), if the metadata lists it.
    pub fn kernel(&self, name: &str) -> Option<&KernelMeta> {
        self.kernels.iter().find(|k| k.name == name)
    }
    /// The global variable named `name`, if the symbol table has it.
    pub fn global(&self, name: &str) -> Option<&Global> {
        self.globals.iter().find(|g| g.name == name)
    }
}

/// Why a file is not a readable AMDGPU code object.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CodeObjectError {
    /// The bytes do not start with the ELF magic.
    #[error("not an ELF file")]
    NotElf,
    /// An ELF, but not `ELFCLASS64` with `ELFDATA2LSB`.
    #[error("not a 64-bit little-endian ELF")]
    NotElf64,
    /// An ELF for another machine (its `e_machine`).
    #[error("ELF machine {0}, not AMDGPU ({EM_AMDGPU})")]
    NotAmdGpu(u16),
    /// A header, section or symbol lies outside the file or is inconsistent (which one).
    #[error("truncated or malformed ELF: {0}")]
    Malformed(&'static str),
    /// No metadata note: a code object v2 or older, or not a code object.
    #[error("no NT_AMDGPU_METADATA note (code object v2 or older is not supported)")]
    NoMetadata,
    /// The metadata note is not the MessagePack map expected (what is wrong).
    #[error("malformed metadata: {0}")]
    BadMetadata(&'static str),
}

type Result<T> = std::result::Result<T, CodeObjectError>;

impl From<ElfError> for CodeObjectError {
    fn from(error: ElfError) -> Self {
        match error {
            ElfError::NotElf => CodeObjectError::NotElf,
            ElfError::NotElf64 => CodeObjectError::NotElf64,
            ElfError::Malformed(why) => CodeObjectError::Malformed(why),
        }
    }
}

/// Whether `bytes` start like an AMDGPU ELF.
pub fn is_code_object(bytes: &[u8]) -> bool {
    elf_read::machine(bytes) == Some(EM_AMDGPU)
}

/// Reads the symbols and the metadata of a code object.
pub fn read(bytes: &[u8]) -> Result<CodeObject> {
    let elf = Elf::new(bytes)?;
    if elf.machine != EM_AMDGPU {
        return Err(CodeObjectError::NotAmdGpu(elf.machine));
    }
    let sections = elf.sections()?;
    let mut object = CodeObject::default();
    let mut metadata = None;
    for section in sections.iter().filter(|s| s.kind == SHT_NOTE) {
        let found = elf_read::notes(elf.data(section)?)?
            .into_iter()
            .find(|note| note.kind == NT_AMDGPU_METADATA && note.name.starts_with(b"AMDGPU"));
        metadata = metadata.or(found.map(|note| note.desc));
    }
    // The static table if there is one (it has every symbol), else the dynamic one.
    let table = sections
        .iter()
        .find(|s| s.kind == SHT_SYMTAB)
        .or_else(|| sections.iter().find(|s| s.kind == SHT_DYNSYM));
    if let Some(table) = table {
        for symbol in elf.symbols(&sections, table)? {
            let name = symbol.name;
            let variable = symbol.kind == STT_OBJECT && !name.ends_with(".kd") && !name.is_empty();
            if variable && object.global(&name).is_none() {
                object.globals.push(Global {
                    name,
                    size: symbol.size,
                });
            }
        }
    }
    let metadata = metadata.ok_or(CodeObjectError::NoMetadata)?;
    let root = msgpack::parse(metadata)?;
    object.target = root
        .get("amdhsa.target")
        .and_then(Value::str)
        .unwrap_or_default();
    object.version = match root.get("amdhsa.version") {
        Some(Value::Array(items)) => items.iter().filter_map(Value::uint).collect(),
        _ => Vec::new(),
    };
    if let Some(Value::Array(kernels)) = root.get("amdhsa.kernels") {
        for kernel in kernels {
            let uint = |key| kernel.get(key).and_then(Value::uint).unwrap_or(0) as u32;
            object.kernels.push(KernelMeta {
                name: kernel.get(".name").and_then(Value::str).unwrap_or_default(),
                kernarg_segment_size: uint(".kernarg_segment_size"),
                kernarg_segment_align: uint(".kernarg_segment_align"),
                private_segment_fixed_size: uint(".private_segment_fixed_size"),
                group_segment_fixed_size: uint(".group_segment_fixed_size"),
                uses_dynamic_stack: kernel.get(".uses_dynamic_stack") == Some(&Value::Bool(true)),
                wavefront_size: uint(".wavefront_size"),
            });
        }
    }
    Ok(object)
}

/// A MessagePack value (only what metadata uses; binary and extension values are skipped).
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Value {
    Nil,
    Bool(bool),
    Int(i64),
    Uint(u64),
    Float(f64),
    Str(String),
    Array(Vec<Value>),
    Map(BTreeMap<String, Value>),
    Other,
}

impl Value {
    fn get(&self, key: &str) -> Option<&Value> {
        match self {
            Value::Map(map) => map.get(key),
            _ => None,
        }
    }
    fn uint(&self) -> Option<u64> {
        match *self {
            Value::Uint(v) => Some(v),
            Value::Int(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }
    fn str(&self) -> Option<String> {
        match self {
            Value::Str(s) => Some(s.clone()),
            _ => None,
        }
    }
}

mod msgpack {
    //! A bounded MessagePack reader: depth and lengths are checked against the input.
    use super::{CodeObjectError, Result, Value};
    use std::collections::BTreeMap;

    const MAX_DEPTH: usize = 32;

    pub(crate) fn parse(bytes: &[u8]) -> Result<Value> {
        let mut reader = Reader { bytes, at: 0 };
        reader.value(0)
    }

    struct Reader<'a> {
        bytes: &'a [u8],
        at: usize,
    }

    fn bad(why: &'static str) -> CodeObjectError {
        CodeObjectError::BadMetadata(why)
    }

    impl Reader<'_> {
        fn take(&mut self, n: usize) -> Result<&[u8]> {
            let end = self.at.checked_add(n).ok_or(bad("length"))?;
            let out = self.bytes.get(self.at..end).ok_or(bad("truncated"))?;
            self.at = end;
            Ok(out)
        }
        fn be(&mut self, n: usize) -> Result<u64> {
            Ok(self
                .take(n)?
                .iter()
                .fold(0u64, |acc, &b| acc << 8 | u64::from(b)))
        }
        fn string(&mut self, n: usize) -> Result<Value> {
            Ok(Value::Str(
                String::from_utf8_lossy(self.take(n)?).into_owned(),
            ))
        }
        fn array(&mut self, n: usize, depth: usize) -> Result<Value> {
            // Each element takes at least one byte: a claimed length beyond the input is bad.
            if n > self.bytes.len() - self.at {
                return Err(bad("array length"));
            }
            (0..n)
                .map(|_| self.value(depth + 1))
                .collect::<Result<_>>()
                .map(Value::Array)
        }
        fn map(&mut self, n: usize, depth: usize) -> Result<Value> {
            if n > self.bytes.len() - self.at {
                return Err(bad("map length"));
            }
            let mut map = BTreeMap::new();
            for _ in 0..n {
                let key = match self.value(depth + 1)? {
                    Value::Str(s) => s,
                    _ => return Err(bad("a map key that is not a string")),
                };
                let value = self.value(depth + 1)?;
                map.insert(key, value);
            }
            Ok(Value::Map(map))
        }
        fn value(&mut self, depth: usize) -> Result<Value> {
            if depth > MAX_DEPTH {
                return Err(bad("nested too deep"));
            }
            let tag = self.take(1)?[0];
            Ok(match tag {
                0x00..=0x7f => Value::Uint(u64::from(tag)),
                0x80..=0x8f => return self.map(usize::from(tag & 0x0f), depth),
                0x90..=0x9f => return self.array(usize::from(tag & 0x0f), depth),
                0xa0..=0xbf => return self.string(usize::from(tag & 0x1f)),
                0xc0 => Value::Nil,
                0xc2 => Value::Bool(false),
                0xc3 => Value::Bool(true),
                0xc4..=0xc6 => {
                    let n = self.be(1 << (tag - 0xc4))? as usize;
                    self.take(n)?;
                    Value::Other
                }
                0xc7..=0xc9 => {
                    let n = self.be(1 << (tag - 0xc7))? as usize;
                    self.take(n + 1)?;
                    Value::Other
                }
                0xca => Value::Float(f64::from(f32::from_bits(self.be(4)? as u32))),
                0xcb => Value::Float(f64::from_bits(self.be(8)?)),
                0xcc..=0xcf => Value::Uint(self.be(1 << (tag - 0xcc))?),
                0xd0..=0xd3 => {
                    let n = 1usize << (tag - 0xd0);
                    let raw = self.be(n)?;
                    let shift = 64 - 8 * n as u32;
                    Value::Int(((raw << shift) as i64) >> shift)
                }
                0xd4..=0xd8 => {
                    self.take(1 + (1 << (tag - 0xd4)))?;
                    Value::Other
                }
                0xd9..=0xdb => {
                    let n = self.be(1 << (tag - 0xd9))? as usize;
                    return self.string(n);
                }
                0xdc | 0xdd => {
                    let n = self.be(if tag == 0xdc { 2 } else { 4 })? as usize;
                    return self.array(n, depth);
                }
                0xde | 0xdf => {
                    let n = self.be(if tag == 0xde { 2 } else { 4 })? as usize;
                    return self.map(n, depth);
                }
                0xe0..=0xff => Value::Int(i64::from(tag as i8)),
                0xc1 => return Err(bad("reserved tag 0xc1")),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mp_str(s: &str) -> Vec<u8> {
        let mut out = vec![0xa0 | s.len() as u8];
        out.extend_from_slice(s.as_bytes());
        out
    }

    /// A minimal AMDGPU ELF: one note section with `metadata`, one symbol table.
    fn elf(metadata: &[u8], symbols: &[(&str, u8, u64)]) -> Vec<u8> {
        let mut note = Vec::new();
        note.extend_from_slice(&7u32.to_le_bytes());
        note.extend_from_slice(&(metadata.len() as u32).to_le_bytes());
        note.extend_from_slice(&NT_AMDGPU_METADATA.to_le_bytes());
        note.extend_from_slice(b"AMDGPU\0\0");
        note.extend_from_slice(metadata);
        while note.len() % 4 != 0 {
            note.push(0);
        }
        let mut strtab = vec![0u8];
        let mut symtab = vec![0u8; 24];
        for (name, kind, size) in symbols {
            let at = strtab.len() as u32;
            strtab.extend_from_slice(name.as_bytes());
            strtab.push(0);
            let mut entry = vec![0u8; 24];
            entry[0..4].copy_from_slice(&at.to_le_bytes());
            entry[4] = 0x10 | kind;
            entry[16..24].copy_from_slice(&size.to_le_bytes());
            symtab.extend_from_slice(&entry);
        }
        let mut file = vec![0u8; 64];
        file[..4].copy_from_slice(b"\x7fELF");
        file[4] = 2;
        file[5] = 1;
        file[18..20].copy_from_slice(&EM_AMDGPU.to_le_bytes());
        let place = |data: &[u8], file: &mut Vec<u8>| {
            let at = file.len() as u64;
            file.extend_from_slice(data);
            at
        };
        let note_at = place(&note, &mut file);
        let sym_at = place(&symtab, &mut file);
        let str_at = place(&strtab, &mut file);
        let shoff = file.len() as u64;
        let header = |kind: u32, offset: u64, size: u64, link: u32| {
            let mut h = vec![0u8; 64];
            h[4..8].copy_from_slice(&kind.to_le_bytes());
            h[24..32].copy_from_slice(&offset.to_le_bytes());
            h[32..40].copy_from_slice(&size.to_le_bytes());
            h[40..44].copy_from_slice(&link.to_le_bytes());
            h
        };
        file.extend(header(0, 0, 0, 0));
        file.extend(header(SHT_NOTE, note_at, note.len() as u64, 0));
        file.extend(header(SHT_SYMTAB, sym_at, symtab.len() as u64, 3));
        file.extend(header(3, str_at, strtab.len() as u64, 0));
        file[40..48].copy_from_slice(&shoff.to_le_bytes());
        file[58..60].copy_from_slice(&64u16.to_le_bytes());
        file[60..62].copy_from_slice(&4u16.to_le_bytes());
        file
    }

    fn metadata() -> Vec<u8> {
        let mut kernel = vec![0x86];
        kernel.extend(mp_str(".name"));
        kernel.extend(mp_str("_start"));
        kernel.extend(mp_str(".kernarg_segment_size"));
        kernel.extend([0xcd, 0x01, 0x20]); // 288
        kernel.extend(mp_str(".private_segment_fixed_size"));
        kernel.extend([0x10]);
        kernel.extend(mp_str(".uses_dynamic_stack"));
        kernel.push(0xc3);
        kernel.extend(mp_str(".wavefront_size"));
        kernel.push(64);
        kernel.extend(mp_str(".kernarg_segment_align"));
        kernel.push(8);
        let mut root = vec![0x83];
        root.extend(mp_str("amdhsa.target"));
        root.extend(mp_str("amdgcn-amd-amdhsa--gfx942"));
        root.extend(mp_str("amdhsa.version"));
        root.extend([0x92, 1, 2]);
        root.extend(mp_str("amdhsa.kernels"));
        root.push(0x91);
        root.extend(kernel);
        root
    }

    #[test]
    fn reads_kernels_globals_and_target_from_the_metadata_note() {
        let file = elf(
            &metadata(),
            &[
                ("__llvm_rpc_client", 1, 552),
                ("_start.kd", 1, 64),
                ("f", 2, 8),
            ],
        );
        assert!(is_code_object(&file));
        let object = read(&file).unwrap();
        assert_eq!(object.target, "amdgcn-amd-amdhsa--gfx942");
        assert_eq!(object.version, vec![1, 2]);
        assert_eq!(
            object.kernel("_start").unwrap(),
            &KernelMeta {
                name: "_start".into(),
                kernarg_segment_size: 288,
                kernarg_segment_align: 8,
                private_segment_fixed_size: 16,
                group_segment_fixed_size: 0,
                uses_dynamic_stack: true,
                wavefront_size: 64,
            }
        );
        assert_eq!(
            object.globals,
            vec![Global {
                name: "__llvm_rpc_client".into(),
                size: 552
            }]
        );
    }

    #[test]
    fn every_truncation_is_an_error_not_a_panic() {
        let file = elf(&metadata(), &[("__llvm_rpc_client", 1, 552)]);
        for len in 0..file.len() {
            let _ = read(&file[..len]);
        }
        let mut other = file.clone();
        other[18] = 62; // x86-64
        assert_eq!(read(&other), Err(CodeObjectError::NotAmdGpu(62)));
        assert_eq!(read(b"hello"), Err(CodeObjectError::NotElf));
        assert!(matches!(
            read(&elf(&[0x92, 0x01], &[])),
            Err(CodeObjectError::BadMetadata(_))
        ));
    }

    #[test]
    fn msgpack_integers_and_lengths() {
        assert_eq!(msgpack::parse(&[0xff]).unwrap(), Value::Int(-1));
        assert_eq!(
            msgpack::parse(&[0xd1, 0xff, 0x00]).unwrap(),
            Value::Int(-256)
        );
        assert_eq!(
            msgpack::parse(&[0xcf, 0, 0, 0, 1, 0, 0, 0, 0]).unwrap(),
            Value::Uint(1 << 32)
        );
        assert!(msgpack::parse(&[0xdd, 0xff, 0xff, 0xff, 0xff]).is_err());
        assert!(msgpack::parse(&[0x91; 100]).is_err(), "depth bounded");
    }
}

//! What an image is and holds, read from its bytes with no GPU: its format (and so its
//! plugin), its kernels with their argument sizes and stack needs, and its RPC client symbol
//! (and so its generation and opcode numbering). `rpc-run --inspect` prints this. PTX is
//! read by [`ptx`], cubins by [`cubin`], fat binaries by [`fatbin`] (each entry as PTX or a
//! cubin), AMDGPU code objects by `plugin_amdgpu::code_object`.

use std::fmt;

use plugin_amdgpu::code_object;
use rpc_core::plugin::{libc_rpc_client_namespace, CLIENT_SYMBOL, LEGACY_CLIENT_SYMBOL};
use rpc_core::protocol::Generation;
use rpc_core::protocol::Numbering;

use crate::{cubin, fatbin, native, ptx};

/// An image format, and so the plugin that runs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// PTX text (CUDA JIT-compiles it).
    Ptx,
    /// An NVIDIA ELF (`EM_CUDA`).
    Cubin,
    /// A CUDA fat binary (several cubins and PTX).
    Fatbin,
    /// An AMDGPU code object (`EM_AMDGPU`).
    AmdGpu,
    /// A shared object of this machine, run on plugin-host's CPU warps ([`native`]).
    Host,
}

impl Format {
    /// The plugin that runs this format.
    pub fn plugin(self) -> &'static str {
        match self {
            Format::Ptx | Format::Cubin | Format::Fatbin => "cuda",
            Format::AmdGpu => "amdgpu",
            Format::Host => "host",
        }
    }
}

/// The format's proper name, with its article, for messages.
impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Format::Ptx => "PTX text",
            Format::Cubin => "a cubin",
            Format::Fatbin => "a CUDA fat binary",
            Format::AmdGpu => "an AMDGPU code object",
            Format::Host => "a native host shared object",
        })
    }
}

/// The format of an image that starts with `head` (its first bytes: 20 suffice for the ELF
/// formats, PTX's `.version` is looked for in the first 4096), or why it is none.
pub fn format(head: &[u8]) -> Result<Format, BadImage> {
    format_of(head).ok_or_else(|| {
        BadImage(
            "not a GPU image: neither PTX text, a cubin, a CUDA fat binary, an AMDGPU code \
             object nor a shared object of this machine (a native host image)"
                .into(),
        )
    })
}

/// The format of `bytes`, if it is one.
pub fn format_of(bytes: &[u8]) -> Option<Format> {
    if bytes.starts_with(b"\x7fELF") && bytes.len() >= 20 {
        return match u16::from_le_bytes([bytes[18], bytes[19]]) {
            code_object::EM_AMDGPU => Some(Format::AmdGpu),
            cubin::EM_CUDA => Some(Format::Cubin),
            _ => native::is_native(bytes).then_some(Format::Host),
        };
    }
    if fatbin::is_fatbin(bytes) {
        return Some(Format::Fatbin);
    }
    ptx::is_ptx(bytes).then_some(Format::Ptx)
}

/// One kernel as the image describes it (`None`: the format does not say).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Kernel {
    pub name: String,
    /// Bytes of the argument block the launch must fill (AMDGPU: explicit plus implicit).
    pub kernarg_size: Option<u32>,
    /// Each explicit argument's bytes, in order (PTX, cubin).
    pub params: Option<Vec<u32>>,
    /// Stack bytes per thread the compiler knows of (AMDGPU: the private segment; PTX: the
    /// kernel's own frame; cubin: the call tree's, as ptxas computed it).
    pub stack: Option<u32>,
    /// Whether the stack is unbounded (AMDGPU `.uses_dynamic_stack`), or calls add frames the
    /// PTX does not size (PTX: it has calls).
    pub dynamic_stack: Option<bool>,
    /// The wavefront size the kernel was compiled for (AMDGPU).
    pub wavefront_size: Option<u32>,
}

/// The image's RPC client symbol and what it means.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Client {
    /// No client symbol: the image uses no RPC.
    None,
    /// A known generation.
    Known {
        symbol: &'static str,
        size: u64,
        generation: Generation,
        numbering: Numbering,
    },
    /// A client symbol of a size no generation has: refused.
    Unknown { symbol: &'static str, size: u64 },
    /// LLVM 18/19's pointer whose object could not be told apart (none, several, or a size or
    /// libc namespace of no known release): refused, with what was found.
    Unclear(String),
    /// Not read: a fat binary whose every entry is compressed.
    Unread,
}

/// The LLVM major release a libc namespace names, where it follows LLVM's default
/// `__llvm_libc_MAJOR_MINOR_PATCH_SUFFIX`.
fn namespace_major(namespace: &str) -> Option<u32> {
    let rest = namespace.strip_prefix("__llvm_libc_")?;
    let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
    rest[..digits].parse().ok()
}

impl Client {
    fn of(globals: &[(String, u64)]) -> Client {
        let symbol_size = |name: &str| globals.iter().find(|(n, _)| n == name).map(|&(_, s)| s);
        if let Some(size) = symbol_size(CLIENT_SYMBOL) {
            return match Generation::from_client_object_size(size as usize) {
                Ok(generation) => Client::Known {
                    symbol: CLIENT_SYMBOL,
                    size,
                    generation,
                    numbering: Numbering::Current,
                },
                Err(_) => Client::Unknown {
                    symbol: CLIENT_SYMBOL,
                    size,
                },
            };
        }
        match symbol_size(LEGACY_CLIENT_SYMBOL) {
            None => Client::None,
            Some(8) => Client::legacy(globals),
            Some(size) => Client::Unknown {
                symbol: LEGACY_CLIENT_SYMBOL,
                size,
            },
        }
    }

    /// LLVM 18 or 19: the size of the `rpc::client` object the pointer points to says which
    /// (96 bytes: v0, 552: v1), and LLVM's default libc namespace, where the image has it,
    /// must agree. Anything else is refused, never guessed.
    fn legacy(globals: &[(String, u64)]) -> Client {
        let objects: Vec<(&str, &str, u64)> = globals
            .iter()
            .filter_map(|(name, size)| {
                libc_rpc_client_namespace(name).map(|ns| (name.as_str(), ns, *size))
            })
            .collect();
        let [(name, namespace, size)] = objects[..] else {
            let names: Vec<&str> = objects.iter().map(|o| o.0).collect();
            return Client::Unclear(format!(
                "`{LEGACY_CLIENT_SYMBOL}` (LLVM 18 or 19) should point to one                  `NAMESPACE::rpc::client` object; the image has {} ({})",
                objects.len(),
                names.join(", ")
            ));
        };
        let generation = match Generation::from_client_object_size(size as usize) {
            Ok(g @ (Generation::V0 | Generation::V1)) => g,
            _ => {
                return Client::Unclear(format!(
                    "`{LEGACY_CLIENT_SYMBOL}` points to `{name}` of {size} bytes: neither LLVM \
                     18's 96-byte client nor LLVM 19's 552-byte one"
                ))
            }
        };
        let release = if generation == Generation::V0 { 18 } else { 19 };
        if let Some(major) = namespace_major(namespace).filter(|&m| m != release) {
            return Client::Unclear(format!(
                "`{name}` is {size} bytes, LLVM {release}'s client, but its namespace names LLVM \
                 {major}"
            ));
        }
        Client::Known {
            symbol: LEGACY_CLIENT_SYMBOL,
            size: 8,
            generation,
            numbering: Numbering::Llvm19,
        }
    }

    /// Which LLVM releases build images with this client.
    pub fn llvm(&self) -> &'static str {
        match self {
            Client::Known {
                generation: Generation::V0,
                ..
            } => "LLVM 18",
            Client::Known {
                numbering: Numbering::Llvm19,
                ..
            } => "LLVM 19",
            Client::Known {
                generation: Generation::V1,
                ..
            } => "LLVM 20-22",
            Client::Known {
                generation: Generation::V2,
                ..
            } => "LLVM 23+",
            _ => "unknown",
        }
    }
}

/// What an image holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Inspection {
    pub format: Format,
    /// The target (`sm_90`, `amdgcn-amd-amdhsa--gfx942`), where the format says.
    pub target: String,
    /// The format version where it says (PTX `7.8`, code object `1.2`, cubin: its ELF ABI
    /// version, `7` or `8`).
    pub version: String,
    /// Every kernel; empty where the image was not read that far (a fat binary whose every
    /// entry is compressed).
    pub kernels: Vec<Kernel>,
    /// Whether `kernels` is the whole list (false: the format was not read that far).
    pub kernels_known: bool,
    pub client: Client,
    /// `__init_array_object_*` / `__fini_array_object_*` globals (NVPTX constructors, which
    /// LLVM's loader gathers into `__init_array_start..end` itself).
    pub init_fini: Vec<String>,
    /// A fat binary's entries (empty for other formats). The kernels and client above are
    /// those of the first entry read.
    pub entries: Vec<FatbinEntry>,
}

/// One entry of a fat binary, as `--inspect` reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FatbinEntry {
    /// `ptx`, `cubin`, or `kind-N` for a kind not known here.
    pub kind: String,
    /// `sm_90`.
    pub arch: String,
    /// `major.minor`.
    pub version: String,
    /// Payload bytes as stored.
    pub size: usize,
    /// `lz4` or `zstd` where compressed (then not read).
    pub compression: Option<&'static str>,
    /// Why the entry could not be read, where it could not (compressed, malformed).
    pub unread: Option<String>,
}

impl Inspection {
    /// A PTX module's or a cubin's (every kernel known), the client and the constructors read
    /// from its globals (name, bytes).
    fn nvidia(
        format: Format,
        target: String,
        version: String,
        kernels: Vec<Kernel>,
        globals: &[(String, u64)],
    ) -> Inspection {
        Inspection {
            format,
            target,
            version,
            kernels,
            kernels_known: true,
            client: Client::of(globals),
            init_fini: init_fini(globals.iter().map(|(n, _)| n.as_str())),
            entries: Vec::new(),
        }
    }

    pub fn kernel(&self, name: &str) -> Option<&Kernel> {
        self.kernels.iter().find(|k| k.name == name)
    }
}

/// Why an image cannot be inspected.
#[derive(Debug, PartialEq, Eq)]
pub struct BadImage(pub String);

impl fmt::Display for BadImage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Reads an image.
pub fn inspect(bytes: &[u8]) -> Result<Inspection, BadImage> {
    let format = format(bytes)?;
    match format {
        Format::Ptx => {
            let end = bytes.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
            let text = String::from_utf8_lossy(&bytes[..end]);
            let module = ptx::read(&text);
            if let Some(why) = &module.unfinished {
                return Err(BadImage(format!("PTX text: {why}")));
            }
            let kernels = module
                .entries
                .iter()
                .map(|e| Kernel {
                    name: e.name.clone(),
                    kernarg_size: Some(e.params_size),
                    params: Some(e.params.clone()),
                    stack: Some(e.frame),
                    dynamic_stack: Some(e.calls),
                    wavefront_size: Some(32),
                })
                .collect();
            Ok(Inspection::nvidia(
                format,
                module.target.clone(),
                module.version.clone(),
                kernels,
                &module.globals,
            ))
        }
        Format::AmdGpu => {
            let object = code_object::read(bytes)
                .map_err(|e| BadImage(format!("AMDGPU code object: {e}")))?;
            Ok(Inspection {
                format,
                target: object.target.clone(),
                version: object
                    .version
                    .iter()
                    .map(u64::to_string)
                    .collect::<Vec<_>>()
                    .join("."),
                kernels: object
                    .kernels
                    .iter()
                    .map(|k| Kernel {
                        name: k.name.clone(),
                        kernarg_size: Some(k.kernarg_segment_size),
                        params: None,
                        stack: Some(k.private_segment_fixed_size),
                        dynamic_stack: Some(k.uses_dynamic_stack),
                        wavefront_size: Some(k.wavefront_size),
                    })
                    .collect(),
                kernels_known: true,
                client: Client::of(
                    &object
                        .globals
                        .iter()
                        .map(|g| (g.name.clone(), g.size))
                        .collect::<Vec<_>>(),
                ),
                init_fini: Vec::new(),
                entries: Vec::new(),
            })
        }
        Format::Cubin => {
            let cubin = cubin::read(bytes).map_err(|e| BadImage(format!("cubin: {}", e.0)))?;
            let kernels = cubin
                .kernels
                .iter()
                .map(|k| Kernel {
                    name: k.name.clone(),
                    kernarg_size: k.params_size,
                    params: k.params.clone(),
                    stack: k.stack,
                    dynamic_stack: None,
                    wavefront_size: Some(32),
                })
                .collect();
            Ok(Inspection::nvidia(
                format,
                cubin.target.clone(),
                cubin.abi_version.to_string(),
                kernels,
                &cubin.globals,
            ))
        }
        Format::Fatbin => inspect_fatbin(bytes),
        Format::Host => {
            let exports =
                native::exports(bytes).map_err(|e| BadImage(format!("native host image: {e}")))?;
            Ok(Inspection {
                format,
                target: std::env::consts::ARCH.into(),
                version: String::new(),
                kernels: exports
                    .functions
                    .iter()
                    .map(|name| Kernel {
                        name: name.clone(),
                        kernarg_size: None,
                        params: None,
                        stack: None,
                        dynamic_stack: None,
                        wavefront_size: None,
                    })
                    .collect(),
                kernels_known: true,
                client: Client::of(&exports.objects),
                init_fini: Vec::new(),
                entries: Vec::new(),
            })
        }
    }
}

/// Reads a fat binary: every entry, and the first that can be read (an uncompressed PTX or
/// cubin) in full; the driver picks the entry for its device, and all come from one source.
fn inspect_fatbin(bytes: &[u8]) -> Result<Inspection, BadImage> {
    let entries = fatbin::read(bytes).map_err(|e| BadImage(format!("fat binary: {}", e.0)))?;
    let mut first: Option<Inspection> = None;
    let mut listed = Vec::new();
    for entry in &entries {
        let (kind, inner) = match entry.kind {
            fatbin::Kind::Ptx => ("ptx".to_owned(), Some(Format::Ptx)),
            fatbin::Kind::Elf => ("cubin".to_owned(), Some(Format::Cubin)),
            fatbin::Kind::Other(n) => (format!("kind-{n}"), None),
        };
        let unread = match (entry.compression, inner) {
            (Some(how), _) => Some(format!("compressed ({how})")),
            (None, None) => Some("a kind not known here".to_owned()),
            // Checked first, so that a fat binary nested in an entry is not read (a hostile
            // file could nest them deep enough to overflow the stack).
            (None, Some(expected)) if format_of(entry.payload) != Some(expected) => {
                Some(format!("the payload is not the {kind} its header says"))
            }
            (None, Some(_)) => match inspect(entry.payload) {
                Ok(inner) => {
                    first.get_or_insert(inner);
                    None
                }
                Err(e) => Some(e.0),
            },
        };
        listed.push(FatbinEntry {
            kind,
            arch: format!("sm_{}", entry.arch),
            version: format!("{}.{}", entry.version.0, entry.version.1),
            size: entry.payload.len(),
            compression: entry.compression,
            unread,
        });
    }
    let inspection = match first {
        Some(inner) => Inspection {
            format: Format::Fatbin,
            entries: listed,
            ..inner
        },
        None => Inspection {
            format: Format::Fatbin,
            target: listed[0].arch.clone(),
            version: String::new(),
            kernels: Vec::new(),
            kernels_known: false,
            client: Client::Unread,
            init_fini: Vec::new(),
            entries: listed,
        },
    };
    Ok(inspection)
}

/// The constructor and destructor globals among `names`.
fn init_fini<'n>(names: impl Iterator<Item = &'n str>) -> Vec<String> {
    names
        .filter(|n| n.starts_with("__init_array_object_") || n.starts_with("__fini_array_object_"))
        .map(str::to_owned)
        .collect()
}

fn or_unknown<T: fmt::Display>(value: &Option<T>) -> String {
    value
        .as_ref()
        .map_or_else(|| "?".to_owned(), ToString::to_string)
}

/// The `--inspect` report: one `key=value` line per fact, stable for scripts.
impl fmt::Display for Inspection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let format = match self.format {
            Format::Ptx => "ptx",
            Format::Cubin => "cubin",
            Format::Fatbin => "fatbin",
            Format::AmdGpu => "amdgpu",
            Format::Host => "host",
        };
        writeln!(
            f,
            "image format={format} plugin={} target={} version={}",
            self.format.plugin(),
            if self.target.is_empty() {
                "?"
            } else {
                &self.target
            },
            if self.version.is_empty() {
                "?"
            } else {
                &self.version
            },
        )?;
        match &self.client {
            Client::None => writeln!(f, "client none (the image uses no RPC)")?,
            Client::Unread => writeln!(f, "client ? (not read: no entry could be read)")?,
            Client::Unknown { symbol, size } => {
                writeln!(f, "client symbol={symbol} size={size} generation=unknown")?
            }
            Client::Unclear(why) => writeln!(
                f,
                "client symbol={LEGACY_CLIENT_SYMBOL} size=8 generation=unknown why=\"{why}\""
            )?,
            known @ Client::Known {
                symbol,
                size,
                generation,
                numbering,
            } => writeln!(
                f,
                "client symbol={symbol} size={size} generation={generation} opcodes={} llvm=\"{}\"",
                match numbering {
                    Numbering::Current => "class<<24|n",
                    Numbering::Llvm19 => "16-bit",
                },
                known.llvm()
            )?,
        }
        for (index, e) in self.entries.iter().enumerate() {
            writeln!(
                f,
                "entry index={index} kind={} arch={} version={} size={} compressed={}{}",
                e.kind,
                e.arch,
                e.version,
                e.size,
                e.compression.unwrap_or("no"),
                e.unread
                    .as_ref()
                    .map_or_else(String::new, |why| format!(" unread=\"{why}\"")),
            )?;
        }
        if !self.kernels_known {
            writeln!(f, "kernels ? (not read: no entry could be read)")?;
        }
        for k in &self.kernels {
            let params = k.params.as_ref().map_or_else(
                || "?".to_owned(),
                |p| p.iter().map(u32::to_string).collect::<Vec<_>>().join(","),
            );
            writeln!(
                f,
                "kernel name={} kernarg={} stack={} dynamic_stack={} wavefront={} params={}",
                k.name,
                or_unknown(&k.kernarg_size),
                or_unknown(&k.stack),
                or_unknown(&k.dynamic_stack),
                or_unknown(&k.wavefront_size),
                if params.is_empty() { "none" } else { &params },
            )?;
        }
        for name in &self.init_fini {
            writeln!(f, "init_fini {name}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ptx_with_client(decl: &str) -> String {
        format!(
            ".version 7.8\n.target sm_90\n{decl}\n.visible .entry _start(.param .u32 a, .param \
             .u64 b, .param .u64 c, .param .u64 d)\n{{\nret;\n}}\n"
        )
    }

    #[test]
    fn the_client_symbol_names_the_generation() {
        let cases = [
            (
                ".visible .global .align 8 .b8 __llvm_rpc_client[552];",
                "generation=v1",
                "LLVM 20-22",
            ),
            (
                ".visible .global .align 8 .b8 __llvm_rpc_client[2096];",
                "generation=v2",
                "LLVM 23+",
            ),
            (
                ".global .align 8 .b8 _ZN19__llvm_libc_19_1_7_3rpc6clientE[552];\n.visible \
                 .global .align 8 .u64 __llvm_libc_rpc_client = \
                 generic(_ZN19__llvm_libc_19_1_7_3rpc6clientE);",
                "generation=v1 opcodes=16-bit",
                "LLVM 19",
            ),
            (
                ".global .align 8 .b8 _ZN19__llvm_libc_18_1_8_3rpc6clientE[96];\n.visible \
                 .global .align 8 .u64 __llvm_libc_rpc_client = \
                 generic(_ZN19__llvm_libc_18_1_8_3rpc6clientE);",
                "generation=v0 opcodes=16-bit",
                "LLVM 18",
            ),
            (
                // A namespace of the builder's own (LLVM wants `__llvm_libc` first): the size
                // alone decides.
                ".global .align 8 .b8 _ZN16__llvm_libc_mine3rpc6clientE[96];\n.visible .global \
                 .align 8 .u64 __llvm_libc_rpc_client;",
                "generation=v0",
                "LLVM 18",
            ),
        ];
        for (decl, generation, llvm) in cases {
            let report = inspect(ptx_with_client(decl).as_bytes()).unwrap();
            let text = report.to_string();
            assert!(text.contains(generation), "{text}");
            assert_eq!(report.client.llvm(), llvm);
            assert!(
                text.contains("kernel name=_start kernarg=32 stack=0"),
                "{text}"
            );
        }
        let unknown = inspect(ptx_with_client(".global .b8 __llvm_rpc_client[100];").as_bytes());
        assert_eq!(
            unknown.unwrap().client,
            Client::Unknown {
                symbol: CLIENT_SYMBOL,
                size: 100
            }
        );
        let none = inspect(ptx_with_client("").as_bytes()).unwrap();
        assert_eq!(none.client, Client::None);
    }

    #[test]
    fn an_llvm18_or_19_pointer_whose_object_is_unclear_is_refused_naming_what_was_found() {
        let pointer = ".visible .global .align 8 .u64 __llvm_libc_rpc_client;";
        let cases = [
            ("", "the image has 0"),
            (
                ".global .b8 _ZN19__llvm_libc_18_1_8_3rpc6clientE[96];\n.global .b8 \
                 _ZN13__llvm_libc_x3rpc6clientE[552];",
                "the image has 2 (_ZN19__llvm_libc_18_1_8_3rpc6clientE, \
                 _ZN13__llvm_libc_x3rpc6clientE)",
            ),
            (
                ".global .b8 _ZN13__llvm_libc_x3rpc6clientE[100];",
                "`_ZN13__llvm_libc_x3rpc6clientE` of 100 bytes",
            ),
            (
                ".global .b8 _ZN19__llvm_libc_19_1_7_3rpc6clientE[96];",
                "LLVM 18's client, but its namespace names LLVM 19",
            ),
        ];
        for (objects, why) in cases {
            let report = inspect(ptx_with_client(&format!("{objects}\n{pointer}")).as_bytes());
            let report = report.unwrap();
            let Client::Unclear(text) = &report.client else {
                panic!("{objects}: {:?}", report.client);
            };
            assert!(text.contains(why), "{text}");
            assert!(
                report.to_string().contains("generation=unknown why="),
                "{report}"
            );
        }
        assert_eq!(namespace_major("__llvm_libc_18_1_8_"), Some(18));
        assert_eq!(namespace_major("mylib"), None);
    }

    #[test]
    fn formats_are_told_apart_by_their_first_bytes() {
        assert_eq!(format_of(b".version 8.0\n"), Some(Format::Ptx));
        assert_eq!(
            format_of(&0xBA55_ED50u32.to_le_bytes()),
            Some(Format::Fatbin)
        );
        let mut elf = b"\x7fELF".to_vec();
        elf.resize(20, 0);
        elf[18] = 190;
        assert_eq!(format_of(&elf), Some(Format::Cubin));
        elf[18] = 224;
        assert_eq!(format_of(&elf), Some(Format::AmdGpu));
        elf[18] = 62;
        assert_eq!(format_of(&elf), None);
        assert!(inspect(b"hello").is_err());
    }
}

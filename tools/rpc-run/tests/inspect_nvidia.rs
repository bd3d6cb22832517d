//! `rpc-run --inspect` of NVIDIA's binary formats, with no nvcc or ptxas: cubins built here
//! byte by byte from the documented layout (the System V ELF64 gABI, LLVM's `ELF.h` for
//! `e_flags`, and the `.nv.info` attribute encoding `cuobjdump -elf` names, as listed in
//! `src/cubin.rs`), and fat binaries wrapping them, a PTX module, and the real PTX images
//! `cargo xtask gpu-images` built. The fixtures are written from that layout, not from the
//! reader's code, so a misreading of either shows.

mod common;

use std::path::PathBuf;
use std::process::Command;

use rpc_run::image::{inspect, Client, Format};

/// One ELF section of a fixture.
struct Section {
    name: String,
    kind: u32,
    data: Vec<u8>,
    link: u32,
}

/// One symbol: name, `st_info` type, `st_other`, section index, size.
struct Sym {
    name: &'static str,
    kind: u8,
    other: u8,
    section: u16,
    size: u64,
}

const SHT_PROGBITS: u32 = 1;
const SHT_SYMTAB: u32 = 2;
const SHT_STRTAB: u32 = 3;
const SHT_NOBITS: u32 = 8;
/// `SHT_LOPROC + 0`: NVIDIA's type for `.nv.info` sections.
const SHT_CUDA_INFO: u32 = 0x7000_0000;
const STT_OBJECT: u8 = 1;
const STT_FUNC: u8 = 2;
const STB_GLOBAL: u8 = 1 << 4;
const STO_CUDA_ENTRY: u8 = 0x10;

/// An `EIFMT_SVAL` attribute: format 4, attribute, `u16` size, the value.
fn sval(attribute: u8, value: &[u8]) -> Vec<u8> {
    let mut out = vec![4, attribute];
    out.extend((value.len() as u16).to_le_bytes());
    out.extend(value);
    out
}

/// An `EIFMT_HVAL` attribute: format 3, attribute, the `u16` value.
fn hval(attribute: u8, value: u16) -> Vec<u8> {
    let mut out = vec![3, attribute];
    out.extend(value.to_le_bytes());
    out
}

fn words(values: &[u32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// `EIATTR_KPARAM_INFO` (0x17): index, ordinal and offset, then the size in bits 18..32
/// (with `cbank` 0x1f in bits 12..17, as ptxas writes it).
fn kparam(ordinal: u16, offset: u16, size: u32) -> Vec<u8> {
    let mut value = 0u32.to_le_bytes().to_vec();
    value.extend(ordinal.to_le_bytes());
    value.extend(offset.to_le_bytes());
    value.extend((size << 18 | 0x1f << 12).to_le_bytes());
    sval(0x17, &value)
}

/// An ELF64 little-endian `ET_EXEC` for `EM_CUDA` with these sections (after the null one,
/// `.shstrtab` last) at 8-byte aligned offsets.
fn elf(abi_version: u8, flags: u32, sections: Vec<Section>) -> Vec<u8> {
    let mut shstrtab = vec![0u8];
    let mut names = Vec::new();
    for s in sections
        .iter()
        .map(|s| s.name.as_str())
        .chain([".shstrtab"])
    {
        names.push(shstrtab.len() as u32);
        shstrtab.extend(s.as_bytes());
        shstrtab.push(0);
    }
    let mut all: Vec<Section> = sections;
    all.push(Section {
        name: ".shstrtab".into(),
        kind: SHT_STRTAB,
        data: shstrtab,
        link: 0,
    });
    let mut out = vec![0u8; 64];
    let mut placed = Vec::new();
    for s in &all {
        while out.len() % 8 != 0 {
            out.push(0);
        }
        placed.push(out.len() as u64);
        if s.kind != SHT_NOBITS {
            out.extend(&s.data);
        }
    }
    while out.len() % 8 != 0 {
        out.push(0);
    }
    let shoff = out.len() as u64;
    out.extend([0u8; 64]); // the null section
    for ((s, &offset), &name) in all.iter().zip(&placed).zip(&names) {
        let mut h = Vec::new();
        h.extend(name.to_le_bytes());
        h.extend(s.kind.to_le_bytes());
        h.extend(0u64.to_le_bytes()); // flags
        h.extend(0u64.to_le_bytes()); // addr
        h.extend(offset.to_le_bytes());
        h.extend((s.data.len() as u64).to_le_bytes());
        h.extend(s.link.to_le_bytes());
        h.extend(0u32.to_le_bytes()); // info
        h.extend(8u64.to_le_bytes()); // addralign
        h.extend(if s.kind == SHT_SYMTAB { 24u64 } else { 0 }.to_le_bytes());
        out.extend(h);
    }
    let header = &mut out[..64];
    header[..4].copy_from_slice(b"\x7fELF");
    header[4] = 2; // ELFCLASS64
    header[5] = 1; // little-endian
    header[6] = 1; // EV_CURRENT
    header[7] = 0x33; // ELFOSABI_CUDA
    header[8] = abi_version;
    header[16..18].copy_from_slice(&2u16.to_le_bytes()); // ET_EXEC
    header[18..20].copy_from_slice(&190u16.to_le_bytes()); // EM_CUDA
    header[20..24].copy_from_slice(&1u32.to_le_bytes());
    header[40..48].copy_from_slice(&shoff.to_le_bytes());
    header[48..52].copy_from_slice(&flags.to_le_bytes());
    header[52..54].copy_from_slice(&64u16.to_le_bytes()); // e_ehsize
    header[58..60].copy_from_slice(&64u16.to_le_bytes()); // e_shentsize
    header[60..62].copy_from_slice(&(all.len() as u16 + 1).to_le_bytes());
    header[62..64].copy_from_slice(&(all.len() as u16).to_le_bytes()); // .shstrtab
    out
}

/// A cubin of LLVM's start kernels as ptxas lays one out: `_begin(int, char **, char **)`,
/// `_start(int, char **, char **, int *)`, `_end()`, a device function `main`, the v1 client
/// object and an NVPTX constructor pointer.
fn start_cubin(abi_version: u8, flags: u32) -> Vec<u8> {
    // Section indices (1-based: the null section is 0).
    let (symtab, strtab, text_begin, text_start, text_end, text_main, global, constant) =
        (1u16, 2u16, 3u16, 4u16, 5u16, 6u16, 7u16, 8u16);
    let symbols = [
        Sym {
            name: "",
            kind: 0,
            other: 0,
            section: 0,
            size: 0,
        },
        Sym {
            name: "_begin",
            kind: STT_FUNC,
            other: STO_CUDA_ENTRY,
            section: text_begin,
            size: 256,
        },
        Sym {
            name: "_start",
            kind: STT_FUNC,
            other: STO_CUDA_ENTRY,
            section: text_start,
            size: 512,
        },
        // No STO_CUDA_ENTRY: found as a kernel by its .nv.info._end section.
        Sym {
            name: "_end",
            kind: STT_FUNC,
            other: 0,
            section: text_end,
            size: 128,
        },
        Sym {
            name: "main",
            kind: STT_FUNC,
            other: 0,
            section: text_main,
            size: 1024,
        },
        Sym {
            name: "__llvm_rpc_client",
            kind: STT_OBJECT,
            other: 0,
            section: global,
            size: 552,
        },
        Sym {
            name: "__init_array_object_main_101",
            kind: STT_OBJECT,
            other: 0,
            section: constant,
            size: 8,
        },
    ];
    let (begin, start, main) = (1u32, 2u32, 4u32);
    let mut strings = vec![0u8];
    let mut table = Vec::new();
    for s in &symbols {
        let name = if s.name.is_empty() {
            0
        } else {
            let at = strings.len() as u32;
            strings.extend(s.name.as_bytes());
            strings.push(0);
            at
        };
        table.extend(name.to_le_bytes());
        table.push(if s.name.is_empty() {
            0
        } else {
            STB_GLOBAL | s.kind
        });
        table.push(s.other);
        table.extend(s.section.to_le_bytes());
        table.extend(0u64.to_le_bytes());
        table.extend(s.size.to_le_bytes());
    }
    // The global .nv.info: register counts (0x2f), frames (0x11) and the call trees' stack
    // (0x12) per function symbol, an EIATTR_CUDA_API_VERSION (0x37) with a 4-byte value.
    let mut info = Vec::new();
    for (function, regs, frame, min_stack) in
        [(begin, 16, 0, 0), (start, 40, 24, 24), (main, 30, 8, 8)]
    {
        info.extend(sval(0x2f, &words(&[function, regs])));
        info.extend(sval(0x11, &words(&[function, frame])));
        info.extend(sval(0x12, &words(&[function, min_stack])));
    }
    info.extend(sval(0x37, &words(&[0x82])));
    // _start: ptxas lists the parameters last to first; an NVAL (EIATTR_WMMA_USED, 0x2b) and
    // EIATTR_MAXREG_COUNT (0x1b, HVAL) to skip.
    let mut info_start = vec![1, 0x2b, 0, 0];
    info_start.extend(sval(0x0a, &words(&[constant as u32, 32 << 16 | 0x210])));
    info_start.extend(hval(0x19, 32));
    for (ordinal, offset, size) in [(3, 24, 8), (2, 16, 8), (1, 8, 8), (0, 0, 4)] {
        info_start.extend(kparam(ordinal, offset, size));
    }
    info_start.extend(hval(0x1b, 0xff));
    // _begin: only EIATTR_PARAM_CBANK gives the block's size.
    let mut info_begin = sval(0x0a, &words(&[constant as u32, 24 << 16 | 0x210]));
    for (ordinal, offset, size) in [(2, 16, 8), (1, 8, 8), (0, 0, 4)] {
        info_begin.extend(kparam(ordinal, offset, size));
    }
    // _end: no parameters.
    let info_end = hval(0x19, 0);
    let section = |name: &str, kind, data: Vec<u8>, link| Section {
        name: name.into(),
        kind,
        data,
        link,
    };
    let _ = symtab;
    elf(
        abi_version,
        flags,
        vec![
            section(".symtab", SHT_SYMTAB, table, strtab as u32),
            section(".strtab", SHT_STRTAB, strings, 0),
            section(".text._begin", SHT_PROGBITS, vec![0; 256], 0),
            section(".text._start", SHT_PROGBITS, vec![0; 512], 0),
            section(".text._end", SHT_PROGBITS, vec![0; 128], 0),
            section(".text.main", SHT_PROGBITS, vec![0; 1024], 0),
            section(".nv.global", SHT_NOBITS, vec![0; 552], 0),
            section(".nv.constant0._start", SHT_PROGBITS, vec![0; 0x230], 0),
            section(".nv.info", SHT_CUDA_INFO, info, symtab as u32),
            section(".nv.info._start", SHT_CUDA_INFO, info_start, symtab as u32),
            section(".nv.info._begin", SHT_CUDA_INFO, info_begin, symtab as u32),
            section(".nv.info._end", SHT_CUDA_INFO, info_end, symtab as u32),
        ],
    )
}

/// One fat binary entry: kind (1 PTX, 2 ELF), `major.minor`, architecture, flags, payload;
/// `name` is stored after the 64-byte header (its offset and length in the header), so the
/// header size the reader must honour is more than 64.
fn fat_entry(kind: u16, version: (u16, u16), arch: u32, flags: u64, payload: &[u8]) -> Vec<u8> {
    let name = b"image.name\0\0\0\0\0\0";
    let mut padded = payload.to_vec();
    while padded.len() % 8 != 0 {
        padded.push(0);
    }
    let mut e = Vec::new();
    e.extend(kind.to_le_bytes());
    e.extend(0x0101u16.to_le_bytes());
    e.extend((64 + name.len() as u32).to_le_bytes());
    e.extend((padded.len() as u64).to_le_bytes());
    e.extend(0u32.to_le_bytes()); // compressed size
    e.extend(0u32.to_le_bytes());
    e.extend(version.1.to_le_bytes());
    e.extend(version.0.to_le_bytes());
    e.extend(arch.to_le_bytes());
    e.extend(64u32.to_le_bytes()); // name offset
    e.extend((name.len() as u32).to_le_bytes());
    e.extend(flags.to_le_bytes());
    e.extend(0u64.to_le_bytes());
    e.extend((payload.len() as u64).to_le_bytes()); // uncompressed size
    assert_eq!(e.len(), 64);
    e.extend(name);
    e.extend(padded);
    e
}

/// A fat binary container: magic, version 1, header size 16, the entries' size.
fn fatbin(entries: &[Vec<u8>]) -> Vec<u8> {
    let body: Vec<u8> = entries.concat();
    let mut out = 0xBA55_ED50u32.to_le_bytes().to_vec();
    out.extend(1u16.to_le_bytes());
    out.extend(16u16.to_le_bytes());
    out.extend((body.len() as u64).to_le_bytes());
    out.extend(body);
    out
}

const FLAGS_64BIT_LINUX: u64 = 0x11;

fn rpc_run_inspect(name: &str, bytes: &[u8]) -> String {
    let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(name);
    std::fs::write(&path, bytes).unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_rpc-run"))
        .args(["--inspect", path.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(output.status.success(), "{name}: {output:?}");
    String::from_utf8(output.stdout).unwrap()
}

const START_KERNELS: [&str; 3] = [
    "kernel name=_begin kernarg=24 stack=0 dynamic_stack=? wavefront=32 params=4,8,8",
    "kernel name=_start kernarg=32 stack=24 dynamic_stack=? wavefront=32 params=4,8,8,8",
    "kernel name=_end kernarg=0 stack=? dynamic_stack=? wavefront=32 params=none",
];

#[test]
fn a_cubin_shows_its_kernels_parameters_stack_and_client_in_both_elf_abis() {
    // ABI 7 (CUDA up to 12.8): sm_90 in the low byte, with 64-bit addressing (0x400) and
    // unified textures (0x100), virtual sm_90 in bits 16..24. ABI 8: sm_90 in bits 8..16.
    for (abi, flags, target) in [
        (7, 0x5a_055a, "sm_90"),
        (7, 0x5a_0d5a, "sm_90a"),
        (8, 0x0600_5a04, "sm_90"),
        (8, 0x0600_5a0c, "sm_90a"),
    ] {
        let text = rpc_run_inspect(
            &format!("start-abi{abi}-{target}.cubin"),
            &start_cubin(abi, flags),
        );
        let mut lines = text.lines();
        assert_eq!(
            lines.next(),
            Some(format!("image format=cubin plugin=cuda target={target} version={abi}").as_str()),
            "{text}"
        );
        assert_eq!(
            lines.next(),
            Some(
                "client symbol=__llvm_rpc_client size=552 generation=v1 opcodes=class<<24|n \
                 llvm=\"LLVM 20-22\""
            ),
            "{text}"
        );
        // Symbol-table order; `main` is no kernel.
        for expected in START_KERNELS {
            assert_eq!(lines.next(), Some(expected), "{text}");
        }
        assert_eq!(lines.next(), Some("init_fini __init_array_object_main_101"));
        assert_eq!(lines.next(), None, "{text}");
    }
}

#[test]
fn a_truncated_cubin_is_a_bad_image_at_every_length() {
    let cubin = start_cubin(7, 0x5a_055a);
    // The section headers come last, so every cut loses part of one: refused, never a panic.
    for len in 0..cubin.len() {
        let read = std::panic::catch_unwind(|| inspect(&cubin[..len]));
        let read = read.unwrap_or_else(|_| panic!("a panic at length {len}"));
        assert!(read.is_err(), "length {len} read as {read:?}");
    }
}

#[test]
fn a_fatbin_lists_its_entries_and_reads_the_first_it_can() {
    let ptx = ".version 7.8\n.target sm_90\n.address_size 64\n\
               .visible .global .align 8 .b8 __llvm_rpc_client[2096];\n\
               .visible .entry _begin(.param .u32 a, .param .u64 b, .param .u64 c)\n{\nret;\n}\n\
               .visible .entry _start(.param .u32 a, .param .u64 b, .param .u64 c, .param .u64 d)\n{\nret;\n}\n\
               .visible .entry _end()\n{\nret;\n}\n";
    let cubin = start_cubin(8, 0x0600_5a04);
    // A compressed cubin first (not inflated here), then a cubin, then PTX: the cubin is read.
    let image = fatbin(&[
        fat_entry(2, (1, 8), 90, FLAGS_64BIT_LINUX | 0x2000, &[0xAB; 100]),
        fat_entry(2, (1, 8), 90, FLAGS_64BIT_LINUX, &cubin),
        fat_entry(1, (7, 8), 90, FLAGS_64BIT_LINUX, ptx.as_bytes()),
    ]);
    let text = rpc_run_inspect("three.fatbin", &image);
    let mut lines = text.lines();
    assert_eq!(
        lines.next(),
        Some("image format=fatbin plugin=cuda target=sm_90 version=8")
    );
    assert!(lines
        .next()
        .unwrap()
        .starts_with("client symbol=__llvm_rpc_client size=552 generation=v1"));
    assert_eq!(
        lines.next(),
        Some("entry index=0 kind=cubin arch=sm_90 version=1.8 size=104 compressed=lz4 unread=\"compressed (lz4)\"")
    );
    assert_eq!(
        lines.next(),
        Some(
            format!(
                "entry index=1 kind=cubin arch=sm_90 version=1.8 size={} compressed=no",
                cubin.len().next_multiple_of(8)
            )
            .as_str()
        )
    );
    assert!(lines
        .next()
        .unwrap()
        .starts_with("entry index=2 kind=ptx arch=sm_90 version=7.8 size="));
    for expected in START_KERNELS {
        assert_eq!(lines.next(), Some(expected), "{text}");
    }

    // PTX first: its client (v2 here) and its kernels are the ones shown; zstd is named.
    let image = fatbin(&[
        fat_entry(1, (7, 8), 90, FLAGS_64BIT_LINUX, ptx.as_bytes()),
        fat_entry(2, (1, 8), 90, FLAGS_64BIT_LINUX | 0x8000, &[0xCD; 64]),
    ]);
    let report = inspect(&image).unwrap();
    assert_eq!(report.format, Format::Fatbin);
    assert_eq!(
        (report.target.as_str(), report.version.as_str()),
        ("sm_90", "7.8")
    );
    assert!(
        matches!(report.client, Client::Known { size: 2096, .. }),
        "{report:?}"
    );
    assert_eq!(report.kernel("_start").unwrap().kernarg_size, Some(32));
    assert_eq!(report.entries[1].compression, Some("zstd"));

    // Every entry compressed: the entries are listed, and the report says nothing was read.
    let image = fatbin(&[fat_entry(2, (1, 8), 90, 0x2000, &[1; 32])]);
    let text = rpc_run_inspect("compressed.fatbin", &image);
    assert!(text.contains("compressed=lz4"), "{text}");
    assert!(
        text.contains("client ? (not read: no entry could be read)"),
        "{text}"
    );
    assert!(
        text.contains("kernels ? (not read: no entry could be read)"),
        "{text}"
    );
    assert_eq!(inspect(&image).unwrap().client, Client::Unread);

    // An entry whose payload is not what its kind says is reported, not read.
    let image = fatbin(&[fat_entry(2, (1, 8), 90, 0, ptx.as_bytes())]);
    assert!(rpc_run_inspect("liar.fatbin", &image)
        .contains("unread=\"the payload is not the cubin its header says\""));
}

#[test]
fn a_malformed_fatbin_is_a_bad_image_and_never_a_panic() {
    let cubin = start_cubin(7, 0x5a_055a);
    let image = fatbin(&[fat_entry(2, (1, 8), 90, 0, &cubin)]);
    for len in 0..image.len() {
        let read = std::panic::catch_unwind(|| inspect(&image[..len]));
        assert!(read.is_ok(), "a panic at length {len}");
    }
    // A fat binary nested in an entry (deeply, as a hostile file could) is not followed.
    let mut nested = image.clone();
    for _ in 0..1000 {
        nested = fatbin(&[fat_entry(2, (1, 8), 90, 0, &nested)]);
    }
    let report = inspect(&nested).unwrap();
    assert_eq!(report.client, Client::Unread);
    // A payload size past the container.
    let mut bad = fatbin(&[fat_entry(1, (7, 8), 90, 0, b".version 7.8\n")]);
    bad[16 + 8] = 0xff;
    let error = inspect(&bad).unwrap_err();
    assert!(error.0.contains("fat binary: a payload at byte"), "{error}");
}

/// The PTX images `cargo xtask gpu-images` built (LLVM 22's GPU libc tests), if it has run
/// here, each wrapped in a fat binary as `fatbinary --create` would: the fat binary reads as
/// its PTX does.
#[test]
fn a_fatbin_of_each_built_ptx_image_reads_as_the_ptx() {
    let images = common::built_gpu_images(Some("nvptx64"));
    for path in &images {
        let ptx = std::fs::read(path).unwrap();
        let plain = inspect(&ptx).unwrap();
        assert_eq!(plain.format, Format::Ptx, "{}", path.display());
        let wrapped = inspect(&fatbin(&[fat_entry(
            1,
            (7, 8),
            90,
            FLAGS_64BIT_LINUX,
            &ptx,
        )]))
        .unwrap();
        assert_eq!(wrapped.client, plain.client, "{}", path.display());
        assert_eq!(wrapped.kernels, plain.kernels, "{}", path.display());
        assert_eq!(wrapped.init_fini, plain.init_fini, "{}", path.display());
        assert_eq!(wrapped.target, "sm_90");
        assert!(matches!(wrapped.client, Client::Known { size: 552, .. }));
    }
    eprintln!("wrapped {} built PTX images", images.len());
}

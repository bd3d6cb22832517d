//! LLVM's start protocol for a GPU executable, over any plugin (the one [`crate::run_file`]
//! picks, or plugin-host's CPU device in the tests):
//!
//! 1. argv and envp are copied into one block of device-visible memory: the pointer arrays
//!    (each ending in a null pointer), the `int` the program's status is or-ed into, then the
//!    strings;
//! 2. `_begin(int argc, char **argv, char **envp)` runs on one thread (GPU libc runs the
//!    constructors there and registers the destructors with `atexit`);
//! 3. `_start(int argc, char **argv, char **envp, int *ret)` runs on the grid: every thread
//!    calls `main` and ors its result into `*ret`;
//! 4. `_end()` runs on one thread (LLVM 18 and 19 images: `_end(int ret)`, which calls `exit(ret)`
//!    itself), running the `atexit` functions and destructors.
//!
//! NVPTX has no linker that gathers constructors, so before `_begin` the loader does, as
//! LLVM's: each `__init_array_object_NAME_PRIORITY` / `__fini_array_object_NAME_PRIORITY`
//! global holds a function pointer; they are copied, sorted by priority, into two tables in
//! device-visible memory whose bounds go into `__init_array_start/_end` and
//! `__fini_array_start/_end` ([`constructor_tables`]). AMDGPU's `ld.lld` fills those itself.
//!
//! The program's status is `*ret` after `_start`. A kernel's `exit(n)` ends the program
//! earlier: under the default [`rpc_core::ExitPolicy::Process`] the server flushes the
//! program's output and ends this process with `n`, as LLVM's loader does; under
//! `ExitPolicy::Record` (the tests) `synchronize` returns it and [`run`] returns `n`.

use rpc_core::plugin::Grid;
use rpc_core::protocol::Numbering;
use rpc_core::KernelExit;
use rpc_core::Runtime;

use crate::Failure;

/// The program's command line and environment.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Program {
    /// `argv[0..]`, the image's path first as LLVM's loader passes it.
    pub args: Vec<String>,
    /// `NAME=VALUE` strings.
    pub env: Vec<String>,
}

/// Where the start block's parts are, in bytes from its start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StartBlock {
    pub argv: usize,
    pub envp: usize,
    pub ret: usize,
    pub strings: usize,
    pub len: usize,
}

impl StartBlock {
    pub fn of(program: &Program) -> StartBlock {
        let argv = 0;
        let envp = argv + 8 * (program.args.len() + 1);
        let ret = envp + 8 * (program.env.len() + 1);
        let strings = ret + 8;
        let text: usize = program
            .args
            .iter()
            .chain(&program.env)
            .map(|s| s.len() + 1)
            .sum();
        StartBlock {
            argv,
            envp,
            ret,
            strings,
            len: strings + text,
        }
    }

    /// The block's bytes when it lives at device address `base`.
    pub fn bytes(&self, program: &Program, base: u64) -> Vec<u8> {
        let mut out = vec![0u8; self.len];
        let mut at = self.strings;
        let mut put = |table: usize, strings: &[String], out: &mut Vec<u8>| {
            for (i, s) in strings.iter().enumerate() {
                let addr = base + at as u64;
                out[table + 8 * i..table + 8 * i + 8].copy_from_slice(&addr.to_le_bytes());
                out[at..at + s.len()].copy_from_slice(s.as_bytes());
                at += s.len() + 1; // the NUL is already there
            }
        };
        put(self.argv, &program.args, &mut out);
        put(self.envp, &program.env, &mut out);
        out
    }
}

/// `_begin` and `_start`'s first three arguments: `int argc` (padded to 8), `argv`, `envp`.
pub fn begin_args(argc: i32, argv: u64, envp: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(32);
    out.extend_from_slice(&argc.to_le_bytes());
    out.extend_from_slice(&[0; 4]);
    out.extend_from_slice(&argv.to_le_bytes());
    out.extend_from_slice(&envp.to_le_bytes());
    out
}

/// The constructor (`init`) and destructor (`fini`) globals among `names`, each sorted by the
/// priority its name ends with (lower first, as LLVM's loader sorts both); a name without a
/// number is an error.
pub fn constructor_tables<'n>(
    names: impl Iterator<Item = &'n str>,
) -> Result<(Vec<&'n str>, Vec<&'n str>), Failure> {
    let (mut init, mut fini) = (Vec::new(), Vec::new());
    for name in names {
        let table = if name.starts_with("__init_array_object_") {
            &mut init
        } else if name.starts_with("__fini_array_object_") {
            &mut fini
        } else {
            continue;
        };
        let priority: u16 = name
            .rsplit('_')
            .next()
            .and_then(|p| p.parse().ok())
            .ok_or_else(|| Failure::BadImage(format!("{name}: no priority at its end")))?;
        table.push((priority, name));
    }
    init.sort_by_key(|&(p, _)| p);
    fini.sort_by_key(|&(p, _)| p);
    Ok((
        init.into_iter().map(|(_, n)| n).collect(),
        fini.into_iter().map(|(_, n)| n).collect(),
    ))
}

/// Fills `__init_array_start/_end` and `__fini_array_start/_end` of a loaded image from its
/// constructor globals `objects` (see the module docs). The tables' memory is returned: it
/// must live until `_end` has run.
fn fill_constructor_tables(
    runtime: &dyn Runtime,
    dev: usize,
    image: rpc_core::ImageId,
    objects: &[String],
) -> Result<Option<Box<dyn rpc_core::plugin::SharedRegion>>, Failure> {
    let (init, fini) = constructor_tables(objects.iter().map(String::as_str))?;
    if init.is_empty() && fini.is_empty() {
        return Ok(None);
    }
    let symbol = |name: &str| {
        runtime
            .find_symbol(image, name)
            .ok_or_else(|| Failure::BadImage(format!("the image has no `{name}`")))
    };
    let device = |what: String| move |e: rpc_core::Error| Failure::Device(format!("{what}: {e}"));
    let entries = init.len() + fini.len();
    let region = runtime
        .alloc_shared(dev, 8 * entries)
        .map_err(device("allocating the constructor tables".into()))?;
    let base = region.device_addr();
    let mut table = Vec::with_capacity(8 * entries);
    for name in init.iter().chain(&fini) {
        let mut pointer = [0u8; 8];
        runtime
            .copy_from_device(dev, symbol(name)?.addr, &mut pointer)
            .map_err(device(format!("reading {name}")))?;
        table.extend_from_slice(&pointer);
    }
    runtime
        .copy_to_device(dev, base, &table)
        .map_err(device("writing the constructor tables".into()))?;
    let fini_at = base + 8 * init.len() as u64;
    let bounds = [
        ("__init_array_start", base),
        ("__init_array_end", fini_at),
        ("__fini_array_start", fini_at),
        ("__fini_array_end", base + 8 * entries as u64),
    ];
    for (name, value) in bounds {
        runtime
            .copy_to_device(dev, symbol(name)?.addr, &value.to_le_bytes())
            .map_err(device(format!("writing {name}")))?;
    }
    Ok(Some(region))
}

/// Runs `image` on device `device` of `runtime` over `grid`; the program's exit status.
/// `numbering` says how the image numbers its opcodes (LLVM 19's `_end` takes the status);
/// `constructors` are its NVPTX constructor globals (empty elsewhere).
pub fn run(
    runtime: &dyn Runtime,
    device: usize,
    image: &[u8],
    numbering: Numbering,
    constructors: &[String],
    program: &Program,
    grid: Grid,
) -> Result<i32, Failure> {
    if device >= runtime.device_count() {
        return Err(Failure::NoDevice(match runtime.reason() {
            Some(reason) => format!("{}: no device {device} ({reason})", runtime.plugin_name()),
            None => format!(
                "{}: no device {device} ({} found)",
                runtime.plugin_name(),
                runtime.device_count()
            ),
        }));
    }
    let image = runtime.load_image(device, image).map_err(|e| match e {
        rpc_core::Error::Protocol(rpc_core::ProtocolError::BadClientObjectSize(_)) => {
            Failure::UnknownGeneration(e.to_string())
        }
        other => Failure::BadImage(format!("loading the image: {other}")),
    })?;
    let tables = fill_constructor_tables(runtime, device, image, constructors)?;
    let block = StartBlock::of(program);
    let region = runtime
        .alloc_shared(device, block.len)
        .map_err(|e| Failure::Device(format!("allocating argv and envp: {e}")))?;
    let base = region.device_addr();
    runtime
        .copy_to_device(device, base, &block.bytes(program, base))
        .map_err(|e| Failure::Device(format!("copying argv and envp: {e}")))?;
    let argc = program.args.len() as i32;
    let (argv, envp, ret) = (
        base + block.argv as u64,
        base + block.envp as u64,
        base + block.ret as u64,
    );
    let one = Grid::linear(1, 1);
    let launch = |kernel: &str, args: &[u8], grid: Grid| -> Result<Option<i32>, Failure> {
        runtime
            .launch(image, kernel, args, grid)
            .map_err(|e| Failure::Launch(format!("launching {kernel}: {e}")))?;
        match runtime.synchronize(device) {
            Err(e) => Err(Failure::Kernel(format!("{kernel}: {e}"))),
            Ok(None) => Ok(None),
            Ok(Some(KernelExit::Exit(status))) => Ok(Some(status)),
            Ok(Some(KernelExit::Abort)) => Err(Failure::Aborted(kernel.to_owned())),
        }
    };
    if let Some(status) = launch("_begin", &begin_args(argc, argv, envp), one)? {
        return Ok(status);
    }
    let mut start_args = begin_args(argc, argv, envp);
    start_args.extend_from_slice(&ret.to_le_bytes());
    if let Some(status) = launch("_start", &start_args, grid)? {
        return Ok(status);
    }
    let mut status = [0u8; 4];
    runtime
        .copy_from_device(device, ret, &mut status)
        .map_err(|e| Failure::Device(format!("reading the program's status: {e}")))?;
    let status = i32::from_le_bytes(status);
    let end_args = match numbering {
        Numbering::Llvm19 => status.to_le_bytes().to_vec(),
        Numbering::Current => Vec::new(),
    };
    if let Some(exit) = launch("_end", &end_args, one)? {
        return Ok(exit);
    }
    drop((region, tables));
    Ok(status)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constructor_globals_are_sorted_by_their_priority() {
        let names = [
            "__init_array_object_b_200",
            "x",
            "__fini_array_object_f_7",
            "__init_array_object_a_101",
            "__fini_array_object_g_3",
        ];
        let (init, fini) = constructor_tables(names.into_iter()).unwrap();
        assert_eq!(
            init,
            ["__init_array_object_a_101", "__init_array_object_b_200"]
        );
        assert_eq!(fini, ["__fini_array_object_g_3", "__fini_array_object_f_7"]);
        assert!(constructor_tables(["__init_array_object_x"].into_iter()).is_err());
    }

    #[test]
    fn the_start_block_holds_null_terminated_tables_then_the_strings() {
        let program = Program {
            args: vec!["a.out".into(), "x".into()],
            env: vec!["K=V".into()],
        };
        let block = StartBlock::of(&program);
        assert_eq!(
            block,
            StartBlock {
                argv: 0,
                envp: 24,
                ret: 40,
                strings: 48,
                len: 48 + 6 + 2 + 4
            }
        );
        let bytes = block.bytes(&program, 0x1000);
        let word = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap());
        assert_eq!(word(0), 0x1000 + 48);
        assert_eq!(word(8), 0x1000 + 54);
        assert_eq!(word(16), 0, "argv[argc] is null");
        assert_eq!(word(24), 0x1000 + 56);
        assert_eq!(word(32), 0, "envp ends in null");
        assert_eq!(&bytes[40..48], &[0; 8], "the status starts at 0");
        assert_eq!(&bytes[48..], b"a.out\0x\0K=V\0");
        assert_eq!(begin_args(2, 0x10, 0x20).len(), 24);
    }
}

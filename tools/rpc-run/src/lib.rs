//! `rpc-run`: runs a clang-built GPU executable linked with LLVM's GPU libc the way LLVM's
//! `llvm-gpu-loader` (formerly `nvptx-loader` / `amdhsa-loader`) does, served by this
//! project's server.
//!
//! ```text
//! rpc-run [--plugin cuda|amdgpu|host|auto] [--threads X[,Y,Z]] [--blocks X[,Y,Z]] [--device N]
//!         [--timeout SECONDS] IMAGE [[--] ARGS...]
//! rpc-run --inspect IMAGE
//! rpc-run --devices [--json] [--plugin cuda|amdgpu|host|auto]
//! rpc-run --help
//! ```
//!
//! - [`image`]: the image's format (PTX, cubin, fatbin: CUDA; AMDGPU ELF: HSA), kernels,
//!   argument sizes, stack needs and client symbol, read without a GPU (`--inspect`), with
//!   [`ptx`], [`cubin`] and [`fatbin`] for NVIDIA's formats;
//! - [`native`]: a native host image (a shared object of this machine, such as a Rust
//!   program built with `rpc-device` for the host), run on plugin-host's CPU warps;
//! - [`start`]: LLVM's start protocol (`_begin`, `_start`, `_end`) over any plugin;
//! - this file: the command line (clap: `--help`, every number ranged), the bounded read of
//!   the image ([`read_bytes`]: a regular file of at most [`MAX_IMAGE_BYTES`], its magic
//!   checked before the rest is read), the choice of plugin, the plugin set-up LLVM's loader does
//!   (CUDA's 3 KiB stack limit), the watchdog, one exit code per failure class
//!   ([`Failure::code`]), and `--devices` ([`devices`]: each plugin's devices, or why none).
//!
//! The image's plugin is a loaded library when [`plugin_library`] finds one
//! (`libplugin_cuda.so` / `libplugin_amdgpu.so` in `RPC_PLUGIN_PATH`'s folders, then beside
//! this program), opened with `plugin-loader`; otherwise the plugin linked into `rpc-run`.
//!
//! The process exits with the program's status: `main`'s result, or the status a kernel
//! passed to `exit`, after the program's output is flushed.

pub mod cubin;
pub mod fatbin;
pub mod image;
pub mod native;
pub mod ptx;
pub mod start;

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use rpc_core::plugin::{Grid, Plugin};
use rpc_core::PluginRuntime;
use rpc_core::ServerConfig;

use image::{Client, Format, Inspection};
pub use start::Program;

/// Exit codes of failures (the program's own status is passed through unchanged; these
/// follow `sysexits.h` where it has a class, and `timeout(1)` for the watchdog).
pub mod code {
    /// A bad command line.
    pub const USAGE: u8 = 64;
    /// Not a GPU image, or one no plugin here can load.
    pub const BAD_IMAGE: u8 = 65;
    /// The image file cannot be read.
    pub const NO_INPUT: u8 = 66;
    /// The image has no `_start` (or `_begin` / `_end`) kernel.
    pub const MISSING_START: u8 = 67;
    /// The image's RPC client symbol is of no known generation.
    pub const UNKNOWN_GENERATION: u8 = 68;
    /// No driver or no device.
    pub const NO_DEVICE: u8 = 69;
    /// A kernel faulted, failed to launch, or the device failed.
    pub const KERNEL_FAULT: u8 = 70;
    /// A kernel called `abort()` (under the process policy the process aborts instead).
    pub const ABORTED: u8 = 71;
    /// `--timeout` passed.
    pub const TIMEOUT: u8 = 124;
}

/// Why a program could not run to its end (a bad command line is clap's error, exit
/// [`code::USAGE`]).
#[derive(Debug, PartialEq, Eq)]
pub enum Failure {
    NoInput(String),
    BadImage(String),
    MissingStart(String),
    UnknownGeneration(String),
    NoDevice(String),
    Launch(String),
    Kernel(String),
    Device(String),
    Aborted(String),
}

impl Failure {
    /// The process exit code of this failure class.
    pub fn code(&self) -> u8 {
        match self {
            Failure::NoInput(_) => code::NO_INPUT,
            Failure::BadImage(_) => code::BAD_IMAGE,
            Failure::MissingStart(_) => code::MISSING_START,
            Failure::UnknownGeneration(_) => code::UNKNOWN_GENERATION,
            Failure::NoDevice(_) => code::NO_DEVICE,
            Failure::Launch(_) | Failure::Kernel(_) | Failure::Device(_) => code::KERNEL_FAULT,
            Failure::Aborted(_) => code::ABORTED,
        }
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Failure::NoInput(m) => write!(f, "cannot read the image: {m}"),
            Failure::BadImage(m) => write!(f, "bad image: {m}"),
            Failure::MissingStart(m) => write!(f, "not a GPU executable: {m}"),
            Failure::UnknownGeneration(m) => write!(f, "{m}"),
            Failure::NoDevice(m) => write!(f, "no GPU to run on: {m}"),
            Failure::Launch(m) => write!(f, "launch failed: {m}"),
            Failure::Kernel(m) => write!(f, "kernel failed: {m}"),
            Failure::Device(m) => write!(f, "device failed: {m}"),
            Failure::Aborted(m) => write!(f, "the program called abort() in {m}"),
        }
    }
}

/// The largest image rpc-run reads: 1 GiB, far above any GPU executable, so that a wrong path
/// cannot make it read gigabytes.
pub const MAX_IMAGE_BYTES: u64 = 1 << 30;
/// The longest `--timeout`, in seconds (a week).
pub const MAX_TIMEOUT_SECONDS: f64 = 604_800.0;
/// The highest `--device` index.
pub const MAX_DEVICE: usize = 1023;

/// What the command line asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Options {
    /// `cuda`, `amdgpu` or `auto` (from the image).
    pub plugin: String,
    pub grid: Grid,
    pub device: usize,
    pub timeout: Option<Duration>,
    pub inspect: bool,
    /// Serve the typed test functions of PROTOCOL section 12.
    pub dispatch_tests: bool,
    /// `--devices`: list each plugin's devices ([`devices`]) and run nothing.
    pub devices: bool,
    /// `--json`, with `--devices`.
    pub json: bool,
    /// Empty with `--devices`, which takes no image.
    pub image: String,
    /// The program's arguments after `--` (argv\[0\] is the image).
    pub args: Vec<String>,
}

/// The command line as clap reads it; [`Options`] is what it means.
#[derive(clap::Parser, Debug)]
#[command(
    name = "rpc-run",
    about = "Runs a clang-built GPU executable linked with LLVM's GPU libc, as LLVM's \
             llvm-gpu-loader does, or inspects it (--inspect)",
    override_usage = "rpc-run [OPTIONS] IMAGE [[--] ARGS...]\n       rpc-run --inspect IMAGE\n       \
                      rpc-run --devices [--json] [--plugin PLUGIN]",
    after_help = EXIT_CODES
)]
struct Cli {
    /// The plugin to run on; auto: the image's (CUDA for PTX, cubins and fat binaries,
    /// AMDGPU for AMDGPU code objects, host for a shared object of this machine)
    #[arg(long, value_name = "PLUGIN", default_value = "auto",
          value_parser = ["cuda", "amdgpu", "host", "auto"])]
    plugin: String,
    /// Threads per block, in up to three dimensions
    #[arg(long, value_name = "X[,Y,Z]", value_parser = dims, allow_negative_numbers = true)]
    threads: Option<[u32; 3]>,
    /// Blocks in the grid, in up to three dimensions
    #[arg(long, value_name = "X[,Y,Z]", value_parser = dims, allow_negative_numbers = true)]
    blocks: Option<[u32; 3]>,
    /// Threads along x (LLVM's loader's spelling; overrides --threads on that axis)
    #[arg(long, value_name = "N", value_parser = count, allow_negative_numbers = true)]
    threads_x: Option<u32>,
    /// Threads along y (LLVM's loader's spelling)
    #[arg(long, value_name = "N", value_parser = count, allow_negative_numbers = true)]
    threads_y: Option<u32>,
    /// Threads along z (LLVM's loader's spelling)
    #[arg(long, value_name = "N", value_parser = count, allow_negative_numbers = true)]
    threads_z: Option<u32>,
    /// Blocks along x (LLVM's loader's spelling; overrides --blocks on that axis)
    #[arg(long, value_name = "N", value_parser = count, allow_negative_numbers = true)]
    blocks_x: Option<u32>,
    /// Blocks along y (LLVM's loader's spelling)
    #[arg(long, value_name = "N", value_parser = count, allow_negative_numbers = true)]
    blocks_y: Option<u32>,
    /// Blocks along z (LLVM's loader's spelling)
    #[arg(long, value_name = "N", value_parser = count, allow_negative_numbers = true)]
    blocks_z: Option<u32>,
    /// The device to run on, from 0
    #[arg(long, value_name = "N", default_value = "0", value_parser = device,
          allow_negative_numbers = true)]
    device: usize,
    /// Ends the run with status 124 after this many seconds
    #[arg(long, value_name = "SECONDS", value_parser = seconds, allow_negative_numbers = true)]
    timeout: Option<Duration>,
    /// Prints what the image holds (format, target, client and generation, kernels) and
    /// runs nothing; no GPU needed
    #[arg(long)]
    inspect: bool,
    /// Also serve the typed test functions of LLVM's rpc::dispatch (PROTOCOL section 12:
    /// 0x64000000 + n), with the plugin linked into rpc-run (a loaded plugin library's server
    /// takes no Rust functions)
    #[arg(long, conflicts_with_all = ["inspect", "devices"])]
    dispatch_tests: bool,
    /// Prints one line per plugin (--plugin's, or all with auto): its devices with their
    /// names, lane widths and ports, or why it has none; runs nothing
    #[arg(long, conflicts_with_all = ["inspect", "image"])]
    devices: bool,
    /// With --devices: one JSON array of {"plugin", "devices", "detail"}
    #[arg(long)]
    json: bool,
    /// The GPU executable: PTX, a cubin, a CUDA fat binary, an AMDGPU code object or a
    /// native host image (a shared object of this machine), a regular file of at most 1 GiB
    #[arg(value_name = "IMAGE", required_unless_present = "devices")]
    image: Option<String>,
    /// The program's arguments (argv[1..]; argv[0] is IMAGE)
    #[arg(
        value_name = "ARGS",
        trailing_var_arg = true,
        allow_hyphen_values = true,
        conflicts_with = "inspect"
    )]
    args: Vec<String>,
}

/// The exit codes, as `--help` lists them.
const EXIT_CODES: &str = "\
Exit status: the program's own (main's, or what a kernel passed to exit), else
  64 usage, 65 bad image (not one, truncated, over 1 GiB, for another plugin),
  66 unreadable file (missing, not a regular file), 67 no _start/_begin/_end,
  68 unknown RPC generation, 69 no driver or device, 70 kernel fault or launch
  failure, 71 abort(), 124 --timeout passed";

/// A count of threads or blocks along one axis: 1 to `u32::MAX`.
fn count(text: &str) -> Result<u32, String> {
    text.trim()
        .parse::<u32>()
        .ok()
        .filter(|&n| n > 0)
        .ok_or_else(|| format!("wants a count from 1 to {}", u32::MAX))
}

/// `X`, `X,Y` or `X,Y,Z`, each a [`count`]; the axes not given are 1.
fn dims(text: &str) -> Result<[u32; 3], String> {
    let parts: Vec<&str> = text.split(',').collect();
    if parts.len() > 3 {
        return Err("wants X, X,Y or X,Y,Z".into());
    }
    let mut out = [1u32; 3];
    for (axis, part) in parts.iter().enumerate() {
        out[axis] = count(part).map_err(|why| format!("`{part}` {why}"))?;
    }
    Ok(out)
}

/// A device index: 0 to [`MAX_DEVICE`].
fn device(text: &str) -> Result<usize, String> {
    text.parse::<usize>()
        .ok()
        .filter(|&n| n <= MAX_DEVICE)
        .ok_or_else(|| format!("wants a device index from 0 to {MAX_DEVICE}"))
}

/// Seconds, a decimal number from 0.001 to [`MAX_TIMEOUT_SECONDS`] (so the duration never
/// overflows).
fn seconds(text: &str) -> Result<Duration, String> {
    text.parse::<f64>()
        .ok()
        .filter(|s| (0.001..=MAX_TIMEOUT_SECONDS).contains(s))
        .map(Duration::from_secs_f64)
        .ok_or_else(|| format!("wants seconds from 0.001 to {MAX_TIMEOUT_SECONDS}"))
}

impl Options {
    /// Parses a command line (`args[0]` is the program's name). The error is clap's:
    /// `--help` (print it, exit 0; [`clap::Error::use_stderr`] is false) or a usage error
    /// (print it, exit [`code::USAGE`]).
    pub fn parse<I, T>(args: I) -> Result<Options, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        let cli = <Cli as clap::Parser>::try_parse_from(args)?;
        // Not clap's `requires`: a flag's default (false) counts as present there.
        if cli.json && !cli.devices {
            return Err(<Cli as clap::CommandFactory>::command().error(
                clap::error::ErrorKind::MissingRequiredArgument,
                "--json is for --devices",
            ));
        }
        let mut grid = Grid::linear(1, 1);
        grid.threads = cli.threads.unwrap_or(grid.threads);
        grid.blocks = cli.blocks.unwrap_or(grid.blocks);
        let axes = [
            (
                &mut grid.threads,
                [cli.threads_x, cli.threads_y, cli.threads_z],
            ),
            (&mut grid.blocks, [cli.blocks_x, cli.blocks_y, cli.blocks_z]),
        ];
        for (dims, one_axis) in axes {
            for (axis, n) in one_axis.into_iter().enumerate() {
                dims[axis] = n.unwrap_or(dims[axis]);
            }
        }
        Ok(Options {
            plugin: cli.plugin,
            grid,
            device: cli.device,
            timeout: cli.timeout,
            inspect: cli.inspect,
            dispatch_tests: cli.dispatch_tests,
            devices: cli.devices,
            json: cli.json,
            image: cli.image.unwrap_or_default(),
            args: cli.args,
        })
    }
}

/// The usage lines, as `--help` and usage errors start them.
pub fn usage() -> String {
    <Cli as clap::CommandFactory>::command()
        .render_usage()
        .to_string()
}

/// The first bytes read of an image: enough for every format's magic (PTX's `.version` may
/// follow comments).
const HEAD_BYTES: u64 = 4096;

/// The bytes of the image at `path`, read only if it is a regular file of at most
/// [`MAX_IMAGE_BYTES`] that starts like a GPU image.
pub fn read_bytes(path: &str) -> Result<Vec<u8>, Failure> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let no_input = |e: std::io::Error| Failure::NoInput(format!("{path}: {e}"));
    // Non-blocking, so that opening a FIFO does not wait for a writer (it is refused below).
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(no_input)?;
    // The open file's own status, so that what is checked is what is read.
    let metadata = file.metadata().map_err(no_input)?;
    if !metadata.is_file() {
        return Err(Failure::NoInput(format!(
            "{path}: not a regular file (a {})",
            file_kind(&metadata.file_type())
        )));
    }
    let too_big = |size: u64| {
        Failure::BadImage(format!(
            "{path}: {size} bytes, more than an image may have ({MAX_IMAGE_BYTES} bytes, 1 GiB)"
        ))
    };
    if metadata.len() > MAX_IMAGE_BYTES {
        return Err(too_big(metadata.len()));
    }
    let mut bytes = Vec::new();
    (&mut file)
        .take(HEAD_BYTES)
        .read_to_end(&mut bytes)
        .map_err(no_input)?;
    image::format(&bytes).map_err(|e| Failure::BadImage(format!("{path}: {e}")))?;
    // The rest, never past the bound, should the file have grown since its size was read.
    (&mut file)
        .take(MAX_IMAGE_BYTES + 1 - bytes.len() as u64)
        .read_to_end(&mut bytes)
        .map_err(no_input)?;
    if bytes.len() as u64 > MAX_IMAGE_BYTES {
        return Err(too_big(bytes.len() as u64));
    }
    Ok(bytes)
}

/// What kind of file `kind` is, in words.
fn file_kind(kind: &std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if kind.is_dir() {
        "directory"
    } else if kind.is_fifo() {
        "FIFO"
    } else if kind.is_char_device() {
        "character device"
    } else if kind.is_block_device() {
        "block device"
    } else if kind.is_socket() {
        "socket"
    } else {
        "special file"
    }
}

/// Reads ([`read_bytes`]) and inspects the image file.
pub fn read_image(path: &str) -> Result<(Vec<u8>, Inspection), Failure> {
    let bytes = read_bytes(path)?;
    let inspection =
        image::inspect(&bytes).map_err(|e| Failure::BadImage(format!("{path}: {e}")))?;
    Ok((bytes, inspection))
}

/// Checks what a run needs of the image: the start kernels and a known client generation.
pub fn check_runnable(inspection: &Inspection) -> Result<(), Failure> {
    if let Client::Unknown { symbol, size } = &inspection.client {
        return Err(Failure::UnknownGeneration(format!(
            "unknown RPC generation: `{symbol}` is {size} bytes; known are `__llvm_rpc_client` \
             of 552 bytes (LLVM 20-22, v1) or 2096 bytes (LLVM 23+, v2) and \
             `__llvm_libc_rpc_client`, an 8-byte pointer to a 96-byte (LLVM 18, v0) or \
             552-byte (LLVM 19, v1) client"
        )));
    }
    if let Client::Unclear(why) = &inspection.client {
        return Err(Failure::UnknownGeneration(format!(
            "unknown RPC generation: {why}"
        )));
    }
    if inspection.kernels_known {
        for kernel in ["_begin", "_start", "_end"] {
            if inspection.kernel(kernel).is_none() {
                return Err(Failure::MissingStart(format!(
                    "the image has no `{kernel}` kernel (a GPU executable is linked with \
                     LLVM's GPU libc startup code, crt1.o)"
                )));
            }
        }
    }
    Ok(())
}

/// A runtime over `plugin` (process exit policy: a kernel's `exit` ends this process), with
/// the typed test functions if `dispatch_tests`.
pub fn runtime<P: Plugin>(plugin: P, dispatch_tests: bool) -> Result<PluginRuntime<P>, Failure> {
    let runtime = PluginRuntime::new(plugin, ServerConfig::default())
        .map_err(|e| Failure::NoDevice(format!("initialising the plugin: {e}")))?;
    if dispatch_tests {
        rpc_core::services::dispatch_tests::register(runtime.server())
            .map_err(|e| Failure::NoDevice(format!("the typed test functions: {e}")))?;
    }
    Ok(runtime)
}

/// The library of plugin `name` to run with: the first `libplugin_NAME.so` in the folders of
/// `RPC_PLUGIN_PATH`, then in the folder of this program; None: the linked-in plugin.
pub fn plugin_library(name: &str) -> Option<PathBuf> {
    let exe = std::env::current_exe().ok();
    let beside = exe.as_deref().and_then(Path::parent);
    plugin_loader::find_plugins(beside)
        .into_iter()
        .find(|path| plugin_loader::plugin_name_of(path) == Some(name))
}

/// Runs the image of `options` to its end; its exit status.
pub fn run_file(options: &Options) -> Result<i32, Failure> {
    let (bytes, inspection) = read_image(&options.image)?;
    check_runnable(&inspection)?;
    let numbering = match inspection.client {
        Client::Known { numbering, .. } => numbering,
        _ => Default::default(),
    };
    let plugin = match options.plugin.as_str() {
        "auto" => inspection.format.plugin(),
        chosen => chosen,
    };
    if plugin != inspection.format.plugin() {
        return Err(Failure::BadImage(format!(
            "{}: {} cannot run on the {plugin} plugin (it runs on {})",
            options.image,
            inspection.format,
            inspection.format.plugin()
        )));
    }
    let mut program = Program {
        args: vec![options.image.clone()],
        env: std::env::vars().map(|(k, v)| format!("{k}={v}")).collect(),
    };
    program.args.extend(options.args.iter().cloned());
    let device = options.device;
    // NVPTX images need their constructor tables filled (see `start`); AMDGPU's linker did,
    // and a native image's constructors ran when it was loaded.
    let constructors: &[String] = match inspection.format {
        Format::AmdGpu | Format::Host => &[],
        _ => &inspection.init_fini,
    };
    let run = |runtime: &dyn rpc_core::Runtime| {
        start::run(
            runtime,
            device,
            &bytes,
            numbering,
            constructors,
            &program,
            options.grid,
        )
    };
    let library = plugin_library(plugin).filter(|_| !options.dispatch_tests);
    if let Some(path) = library {
        log::info!("{plugin}: the plugin of {}", path.display());
        let runtime =
            plugin_loader::LoadedPlugin::open(&path, plugin_abi::RPC_INIT_LOADER_SETTINGS)
                .map_err(|e| Failure::NoDevice(format!("loading the plugin: {e}")))?;
        return run(&runtime);
    }
    match inspection.format {
        Format::Ptx | Format::Cubin | Format::Fatbin => {
            let runtime = runtime(plugin_cuda::CudaPlugin::new(), options.dispatch_tests)?;
            prepare_cuda(&runtime, device)?;
            run(&runtime)
        }
        Format::AmdGpu => run(&runtime(
            plugin_amdgpu::AmdGpuPlugin::new(),
            options.dispatch_tests,
        )?),
        Format::Host => run(&runtime(
            plugin_host::HostPlugin::new(plugin_host::HostConfig::default()),
            options.dispatch_tests,
        )?),
    }
}

/// `--devices`: one line per plugin named by `plugin` (`auto`: host, cuda and amdgpu), as
/// [`rpc_core::plugin::describe`] writes it (`NAME: K devices (...)`, or `NAME: 0 devices
/// (WHY)`), or with `json` one JSON array of `{"plugin", "devices", "detail"}`. The plugins
/// linked into rpc-run are asked, each initialised and released again.
pub fn devices(plugin: &str, json: bool) -> String {
    use rpc_core::plugin::probe;
    let lines: Vec<String> = ["host", "cuda", "amdgpu"]
        .into_iter()
        .filter(|name| plugin == "auto" || plugin == *name)
        .map(|name| match name {
            "host" => probe(plugin_host::HostPlugin::new(Default::default())),
            "cuda" => probe(plugin_cuda::CudaPlugin::new()),
            _ => probe(plugin_amdgpu::AmdGpuPlugin::new()),
        })
        .collect();
    if json {
        let list: Vec<serde_json::Value> = lines.iter().map(|line| device_json(line)).collect();
        format!("{}\n", serde_json::Value::Array(list))
    } else {
        lines.iter().map(|line| format!("{line}\n")).collect()
    }
}

/// A plugin's line (`NAME: K device(s) (DETAIL)`, as `rpc_core::plugin::describe` writes it) as
/// `{"plugin", "devices", "detail"}`; `devices` is null if the line does not read so.
fn device_json(line: &str) -> serde_json::Value {
    let (plugin, rest) = line.split_once(": ").unwrap_or((line, ""));
    let devices = rest
        .split_whitespace()
        .next()
        .and_then(|k| k.parse::<u64>().ok());
    let detail = rest
        .split_once(" (")
        .map(|(_, d)| d.strip_suffix(')').unwrap_or(d));
    serde_json::json!({ "plugin": plugin, "devices": devices, "detail": detail })
}

/// What LLVM's loader sets on the CUDA devices before it loads a program: a 3 KiB stack per
/// thread (`cuCtxSetLimit(CU_LIMIT_STACK_SIZE)`, the plugin's
/// `Loadable::prepare_for_loader`, as a loaded `libplugin_cuda.so` does it). Nothing when
/// there is no device `device` ([`start::run`] says so).
pub fn prepare_cuda(
    runtime: &PluginRuntime<plugin_cuda::CudaPlugin>,
    device: usize,
) -> Result<(), Failure> {
    if runtime.devices().get(device).is_none() {
        return Ok(());
    }
    <plugin_cuda::CudaPlugin as plugin_abi::Loadable>::prepare_for_loader(runtime)
        .map_err(|e| Failure::Device(format!("setting the stack size: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `line` as rpc-run's command line, its words split at white space.
    fn parse(line: &str) -> Result<Options, clap::Error> {
        Options::parse(std::iter::once("rpc-run").chain(line.split_whitespace()))
    }

    #[test]
    fn the_command_line_of_llvms_loader() {
        let o = parse("--threads 32,2 --blocks 4 --device 1 a.ptx -- x -y").unwrap();
        assert_eq!(o.grid.threads, [32, 2, 1]);
        assert_eq!(o.grid.blocks, [4, 1, 1]);
        assert_eq!(o.device, 1);
        assert_eq!(o.image, "a.ptx");
        assert_eq!(o.args, ["x", "-y"]);
        assert_eq!(o.plugin, "auto");
        // Arguments right after the image, as LLVM's loader takes them.
        let o = parse("--timeout 2.5 a.out one --two").unwrap();
        assert_eq!(o.args, ["one", "--two"]);
        assert_eq!(parse("a.out -x -- y").unwrap().args, ["-x", "--", "y"]);
        assert_eq!(o.timeout, Some(Duration::from_millis(2500)));
        assert!(parse("--inspect a.out").unwrap().inspect);
        let o = parse("--devices --json --plugin cuda").unwrap();
        assert!(o.devices && o.json);
        assert_eq!((o.plugin.as_str(), o.image.as_str()), ("cuda", ""));
        // LLVM's loader's flags, as its tests pass them, over --threads / --blocks.
        let o = parse("--blocks-x 2 --blocks-z 3 --threads 8,8 --threads-y 4 t").unwrap();
        assert_eq!(o.grid.blocks, [2, 1, 3]);
        assert_eq!(o.grid.threads, [8, 4, 1]);
        assert!(parse("--threads-x 1,2 t").is_err());
    }

    #[test]
    fn bad_command_lines_are_usage_errors_naming_the_range() {
        let range = format!("from 1 to {}", u32::MAX);
        let timeout = "from 0.001 to 604800";
        let cases = [
            ("--threads 0 a", range.as_str()),
            ("--threads 99999999999 a", &range),
            ("--threads-z 4294967296 a", &range),
            ("--threads 1,2,3,4 a", "X, X,Y or X,Y,Z"),
            ("--plugin opencl a", "opencl"),
            ("--timeout -1 a", timeout),
            ("--timeout 1e300 a", timeout),
            ("--timeout 2^64 a", timeout),
            ("--timeout 99999999999999999999 a", timeout),
            ("--timeout NaN a", timeout),
            ("--device 99999999999999999999 a", "from 0 to 1023"),
            ("--bogus a", "--bogus"),
            ("--inspect a b", "cannot be used with"),
            ("", "IMAGE"),
            ("--devices a", "cannot be used with"),
            ("--devices --inspect", "cannot be used with"),
            ("--json a", "--devices"),
        ];
        for (bad, says) in cases {
            let error = parse(bad).unwrap_err();
            assert!(error.use_stderr(), "{bad:?}: {error}");
            assert!(error.to_string().contains(says), "{bad:?}: {error}");
        }
        let help = parse("--help").unwrap_err();
        assert!(!help.use_stderr());
    }

    #[test]
    fn a_plugins_line_reads_as_json() {
        let none = device_json("cuda: 0 devices (libcuda.so.1 not found)");
        assert_eq!(
            none,
            serde_json::json!({"plugin": "cuda", "devices": 0, "detail": "libcuda.so.1 not found"})
        );
        let host: serde_json::Value = serde_json::from_str(&devices("host", true)).unwrap();
        assert_eq!(host.as_array().map(Vec::len), Some(1), "{host}");
        assert_eq!(host[0]["plugin"], "host");
        assert!(
            host[0]["devices"].as_u64().is_some_and(|n| n >= 1),
            "{host}"
        );
    }

    #[test]
    fn every_failure_class_has_its_own_exit_code() {
        let failures = [
            Failure::NoInput(String::new()),
            Failure::BadImage(String::new()),
            Failure::MissingStart(String::new()),
            Failure::UnknownGeneration(String::new()),
            Failure::NoDevice(String::new()),
            Failure::Kernel(String::new()),
            Failure::Aborted(String::new()),
        ];
        let mut codes: Vec<u8> = failures.iter().map(Failure::code).collect();
        codes.extend([code::USAGE, code::TIMEOUT]);
        let count = codes.len();
        codes.sort_unstable();
        codes.dedup();
        assert_eq!(codes.len(), count);
    }
}

//! `rpc-run`: runs a clang-built GPU executable linked with LLVM's GPU libc the way LLVM's
//! `llvm-gpu-loader` (formerly `nvptx-loader` / `amdhsa-loader`) does, served by this
//! project's server.
//!
//! ```text
//! rpc-run [--plugin cuda|amdgpu|auto] [--threads X[,Y,Z]] [--blocks X[,Y,Z]] [--device N]
//!         [--timeout SECONDS] IMAGE [-- ARGS...]
//! rpc-run --inspect IMAGE
//! ```
//!
//! - [`image`]: the image's format (PTX, cubin, fatbin: CUDA; AMDGPU ELF: HSA), kernels,
//!   argument sizes, stack needs and client symbol, read without a GPU (`--inspect`), with
//!   [`ptx`], [`cubin`] and [`fatbin`] for NVIDIA's formats;
//! - [`start`]: LLVM's start protocol (`_begin`, `_start`, `_end`) over any plugin;
//! - this file: the command line, the choice of plugin, the plugin set-up LLVM's loader does
//!   (CUDA's 3 KiB stack limit), the watchdog, and one exit code per failure class
//!   ([`Failure::code`]).
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

/// Why a program could not run to its end.
#[derive(Debug, PartialEq, Eq)]
pub enum Failure {
    Usage(String),
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
            Failure::Usage(_) => code::USAGE,
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
            Failure::Usage(m) => write!(f, "{m}\n{USAGE}"),
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

pub const USAGE: &str = "usage: rpc-run [--plugin cuda|amdgpu|auto] [--threads X[,Y,Z]] \
[--blocks X[,Y,Z]] [--device N] [--timeout SECONDS] IMAGE [-- ARGS...]\n       rpc-run --inspect IMAGE\n\
(LLVM's loader's --threads-x/-y/-z and --blocks-x/-y/-z are accepted too)";

/// What the command line asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Options {
    /// `cuda`, `amdgpu` or `auto` (from the image).
    pub plugin: String,
    pub grid: Grid,
    pub device: usize,
    pub timeout: Option<Duration>,
    pub inspect: bool,
    pub image: String,
    /// The program's arguments after `--` (argv\[0\] is the image).
    pub args: Vec<String>,
}

fn dims(flag: &str, value: &str) -> Result<[u32; 3], Failure> {
    let parts: Vec<&str> = value.split(',').collect();
    if parts.is_empty() || parts.len() > 3 {
        return Err(Failure::Usage(format!(
            "{flag} {value}: give X, X,Y or X,Y,Z"
        )));
    }
    let mut out = [1u32; 3];
    for (i, part) in parts.iter().enumerate() {
        out[i] = part.trim().parse().ok().filter(|&n| n > 0).ok_or_else(|| {
            Failure::Usage(format!("{flag} {value}: {part:?} is not a count above 0"))
        })?;
    }
    Ok(out)
}

impl Options {
    /// Parses the arguments after the program name.
    pub fn parse(args: &[String]) -> Result<Options, Failure> {
        let mut options = Options {
            plugin: "auto".into(),
            grid: Grid::linear(1, 1),
            device: 0,
            timeout: None,
            inspect: false,
            image: String::new(),
            args: Vec::new(),
        };
        let mut it = args.iter();
        let mut image = None;
        while let Some(arg) = it.next() {
            let mut value = |flag: &str| {
                it.next()
                    .cloned()
                    .ok_or_else(|| Failure::Usage(format!("{flag} needs a value")))
            };
            match arg.as_str() {
                "--plugin" => {
                    let plugin = value(arg)?;
                    if !["cuda", "amdgpu", "auto"].contains(&plugin.as_str()) {
                        return Err(Failure::Usage(format!(
                            "--plugin {plugin}: cuda, amdgpu or auto"
                        )));
                    }
                    options.plugin = plugin;
                }
                "--threads" => options.grid.threads = dims(arg, &value(arg)?)?,
                "--blocks" => options.grid.blocks = dims(arg, &value(arg)?)?,
                // LLVM's loader's spelling, one dimension at a time (LLVM's tests pass these).
                flag @ ("--threads-x" | "--threads-y" | "--threads-z" | "--blocks-x"
                | "--blocks-y" | "--blocks-z") => {
                    let v = value(flag)?;
                    let d = dims(flag, &v)?;
                    if v.contains(',') {
                        return Err(Failure::Usage(format!("{flag} {v}: one count")));
                    }
                    let axis = usize::from(flag.as_bytes()[flag.len() - 1] - b'x');
                    if flag.starts_with("--threads") {
                        options.grid.threads[axis] = d[0];
                    } else {
                        options.grid.blocks[axis] = d[0];
                    }
                }
                "--device" => {
                    let v = value(arg)?;
                    options.device = v
                        .parse()
                        .map_err(|_| Failure::Usage(format!("--device {v}: not a number")))?;
                }
                "--timeout" => {
                    let v = value(arg)?;
                    let seconds: f64 = v
                        .parse()
                        .ok()
                        .filter(|s: &f64| s.is_finite() && *s > 0.0)
                        .ok_or_else(|| {
                        Failure::Usage(format!("--timeout {v}: seconds above 0"))
                    })?;
                    options.timeout = Some(Duration::from_secs_f64(seconds));
                }
                "--inspect" => options.inspect = true,
                "--" => {
                    options.args = it.by_ref().cloned().collect();
                }
                other if other.starts_with("--") => {
                    return Err(Failure::Usage(format!("unknown option {other}")));
                }
                other if image.is_none() => image = Some(other.to_owned()),
                other => {
                    // LLVM's loader takes the program's arguments right after the image.
                    options.args.push(other.to_owned());
                    options.args.extend(it.by_ref().cloned());
                }
            }
        }
        options.image = image.ok_or_else(|| Failure::Usage("no IMAGE given".into()))?;
        Ok(options)
    }
}

/// Reads and inspects the image file.
pub fn read_image(path: &str) -> Result<(Vec<u8>, Inspection), Failure> {
    let bytes = std::fs::read(path).map_err(|e| Failure::NoInput(format!("{path}: {e}")))?;
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

/// A runtime over `plugin` (process exit policy: a kernel's `exit` ends this process).
pub fn runtime<P: Plugin>(plugin: P) -> Result<PluginRuntime<P>, Failure> {
    PluginRuntime::new(plugin, ServerConfig::default())
        .map_err(|e| Failure::NoDevice(format!("initialising the plugin: {e}")))
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
            "{}: a {:?} image cannot run on the {plugin} plugin",
            options.image, inspection.format
        )));
    }
    let mut program = Program {
        args: vec![options.image.clone()],
        env: std::env::vars().map(|(k, v)| format!("{k}={v}")).collect(),
    };
    program.args.extend(options.args.iter().cloned());
    let device = options.device;
    // NVPTX images need their constructor tables filled (see `start`); AMDGPU's linker did.
    let constructors: &[String] = match inspection.format {
        Format::AmdGpu => &[],
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
    if let Some(path) = plugin_library(plugin) {
        log::info!("{plugin}: the plugin of {}", path.display());
        let runtime =
            plugin_loader::LoadedPlugin::open(&path, plugin_abi::RPC_INIT_LOADER_SETTINGS)
                .map_err(|e| Failure::NoDevice(format!("loading the plugin: {e}")))?;
        return run(&runtime);
    }
    match inspection.format {
        Format::Ptx | Format::Cubin | Format::Fatbin => {
            let runtime = runtime(plugin_cuda::CudaPlugin::new())?;
            prepare_cuda(&runtime, device)?;
            run(&runtime)
        }
        Format::AmdGpu => run(&runtime(plugin_amdgpu::AmdGpuPlugin::new())?),
    }
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

    fn parse(args: &[&str]) -> Result<Options, Failure> {
        Options::parse(&args.iter().map(|s| s.to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn the_command_line_of_llvms_loader() {
        let o = parse(&[
            "--threads",
            "32,2",
            "--blocks",
            "4",
            "--device",
            "1",
            "a.ptx",
            "--",
            "x",
            "-y",
        ])
        .unwrap();
        assert_eq!(o.grid.threads, [32, 2, 1]);
        assert_eq!(o.grid.blocks, [4, 1, 1]);
        assert_eq!(o.device, 1);
        assert_eq!(o.image, "a.ptx");
        assert_eq!(o.args, ["x", "-y"]);
        assert_eq!(o.plugin, "auto");
        // Arguments right after the image, as LLVM's loader takes them.
        let o = parse(&["--timeout", "2.5", "a.out", "one", "--two"]).unwrap();
        assert_eq!(o.args, ["one", "--two"]);
        assert_eq!(o.timeout, Some(Duration::from_millis(2500)));
        assert!(parse(&["--inspect", "a.out"]).unwrap().inspect);
        // LLVM's loader's flags, as its tests pass them.
        let o = parse(&[
            "--blocks-x",
            "2",
            "--blocks-z",
            "3",
            "--threads-y",
            "4",
            "t",
        ])
        .unwrap();
        assert_eq!(o.grid.blocks, [2, 1, 3]);
        assert_eq!(o.grid.threads, [1, 4, 1]);
        assert_eq!(
            parse(&["--threads-x", "1,2", "t"]).unwrap_err().code(),
            code::USAGE
        );
    }

    #[test]
    fn bad_command_lines_are_usage_errors() {
        for bad in [
            &["--threads", "0", "a"][..],
            &["--threads", "1,2,3,4", "a"],
            &["--plugin", "opencl", "a"],
            &["--timeout", "-1", "a"],
            &["--bogus", "a"],
            &["--device"],
            &[],
        ] {
            let failure = parse(bad).unwrap_err();
            assert_eq!(failure.code(), code::USAGE, "{bad:?}: {failure}");
        }
    }

    #[test]
    fn every_failure_class_has_its_own_exit_code() {
        let failures = [
            Failure::Usage(String::new()),
            Failure::NoInput(String::new()),
            Failure::BadImage(String::new()),
            Failure::MissingStart(String::new()),
            Failure::UnknownGeneration(String::new()),
            Failure::NoDevice(String::new()),
            Failure::Kernel(String::new()),
            Failure::Aborted(String::new()),
        ];
        let mut codes: Vec<u8> = failures.iter().map(Failure::code).collect();
        codes.push(code::TIMEOUT);
        let count = codes.len();
        codes.sort_unstable();
        codes.dedup();
        assert_eq!(codes.len(), count);
    }
}

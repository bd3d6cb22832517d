//! `cargo xtask`: the project's automation, as a plain Rust binary (alias in `.cargo/config.toml`).
//!
//! Arguments are parsed by hand ([`flags`]): the commands take a few `--name value` flags and
//! nothing more. A usage error exits with status 2, a failing command with status 1.

mod bench;
mod flags;
mod fuzz;
mod gpu_check;
mod layout;
mod llvm_client;
mod nightly;
mod plugins;
mod sanitize;
mod soak;
mod stress;
mod test;

use std::fmt;
use std::path::PathBuf;
use std::process::ExitCode;

const USAGE: &str = "\
usage: cargo xtask <command> [flags]

commands:
  demo [--plugin host|cuda|amdgpu] [--image FILE --kernel NAME]
                                         the main job: a small offload program (host plugin)
  test                                   fmt, clippy, the tests, loom, miri (where nightly has it),
                                         the no_std build, a 30 s soak
  devices                                one line per plugin: its devices or why there are none
  build --plugin host|cuda|amdgpu|all [--release]
                                         build the binaries embedding those plugins
  layout --gen v1|v2 --ports N --lanes L print a mailbox layout's offsets and sizes in bytes
  stress [--threads T] [--ops N]         the server life-cycle stress (default 8 x 2000)
  bench [--quick] [--peer llvm] [--pin] [--latency-only] [--park-us N]
                                         the performance table (docs/performance.md)
  gpu-check [--no-clang]                 prepare target/gpu-check/ for a machine with an NVIDIA GPU
  soak [--seconds S]                     two plugins under mixed traffic; nothing lost or leaked
  fuzz [--seconds S] [--target mailbox|printf]
                                         cargo fuzz on a fuzzed mailbox and the printf parser
  sanitize [thread|address]... [-- ARGS] rpc-core's tests under ThreadSanitizer/AddressSanitizer
  llvm-client [--allow-skip] [--gen v1|v2]
                                         LLVM's own client (Debian's LLVM 22 and 23) against rpc-serve
  help                                   this text";

/// Why a command did not succeed.
#[derive(Debug, PartialEq, Eq)]
pub enum Failure {
    /// Bad command line: the message, then the usage; exit status 2.
    Usage(String),
    /// The command ran and failed: the message; exit status 1.
    Failed(String),
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Failure::Usage(why) | Failure::Failed(why) => f.write_str(why),
        }
    }
}

/// A command that reports failure as text failed (it did not misuse the command line).
impl From<String> for Failure {
    fn from(why: String) -> Self {
        Failure::Failed(why)
    }
}

pub type Result<T = ()> = std::result::Result<T, Failure>;

/// The workspace root (the folder above this crate).
pub fn project_root() -> PathBuf {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest
        .parent()
        .expect("xtask lives one folder below the workspace root")
        .to_path_buf()
}

/// The cargo that runs us (`$CARGO`), else the one on `PATH`.
pub fn cargo() -> std::ffi::OsString {
    std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into())
}

fn run(args: &[String]) -> Result {
    let Some((command, rest)) = args.split_first() else {
        return Err(Failure::Usage("no command given".into()));
    };
    match command.as_str() {
        "demo" => plugins::demo(rest),
        "devices" => plugins::devices(rest),
        "build" => plugins::build(rest),
        "test" => test::run(rest),
        "layout" => layout::run(rest),
        "stress" => stress::run(rest),
        "bench" => Ok(bench::run(rest)?),
        "gpu-check" => Ok(gpu_check::run(rest)?),
        "soak" => soak::run(rest),
        "fuzz" => fuzz::run(rest),
        "sanitize" => Ok(sanitize::run(rest)?),
        "llvm-client" => llvm_client::run(rest),
        "help" | "--help" | "-h" => {
            println!("{USAGE}");
            Ok(())
        }
        other => Err(Failure::Usage(format!("unknown command `{other}`"))),
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::Usage(why)) => {
            eprintln!("xtask: {why}\n\n{USAGE}");
            ExitCode::from(2)
        }
        Err(Failure::Failed(why)) => {
            eprintln!("xtask: {why}");
            ExitCode::FAILURE
        }
    }
}

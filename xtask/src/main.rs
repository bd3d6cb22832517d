//! `cargo xtask`: the project's automation, as a plain Rust binary (alias in `.cargo/config.toml`).
//!
//! Arguments are parsed with `lexopt` ([`flags`]): the commands take a few `--name value` flags
//! and switches, and `--help`. A usage error exits with status 2 (the message, then the
//! command's usage), a failing command with status 1.

mod bench;
mod flags;
mod fuzz;
mod gpu_check;
mod gpu_images;
mod header;
mod layout;
mod llvm_client;
mod nightly;
mod plugins;
mod run;
mod sanitize;
mod soak;
mod stress;
mod test;
mod tidy;

use std::fmt;
use std::path::PathBuf;
use std::process::ExitCode;

const USAGE: &str = "\
usage: cargo xtask <command> [flags]

commands:
  demo [--plugin host|cuda|amdgpu] [--image FILE --kernel NAME] [--json]
                                         the main job: a small offload program (host plugin)
  test                                   tidy, fmt, clippy, the tests, loom, miri (where nightly has
                                         it), the no_std build, a 30 s soak
  tidy                                   the layering and file rules ARCHITECTURE.md states, and
                                         that include/rpc_plugin.h is current
  header                                 regenerate include/rpc_plugin.h (cbindgen, from plugin-abi)
  devices [--json]                       one line per plugin: its devices or why there are none
  build --plugin host|cuda|amdgpu|all [--release]
                                         build the binaries embedding those plugins and the
                                         plugins' libraries (target/plugins/lib/libplugin_*.so)
  layout --gen v0|v1|v2 --ports N --lanes L
                                         print a mailbox layout's offsets and sizes in bytes
  stress [--threads T] [--ops N]         the server life-cycle stress (default 8 x 2000)
  bench [--quick] [--peer llvm] [--float] [--latency-only] [--park-us N]
                                         the performance table (docs/performance.md)
  gpu-check [--no-clang] [--no-self-check]
                                         assemble the GPU check kit in target/gpu-check/ (run.sh)
  soak [--seconds S] [--json]            two plugins under mixed traffic; nothing lost or leaked
  fuzz [--seconds S] [--target mailbox|printf]
                                         cargo fuzz on a fuzzed mailbox and the printf parser
  sanitize [thread|address]... [-- ARGS] rpc-core's tests under ThreadSanitizer/AddressSanitizer
  llvm-client [--allow-skip] [--gen v0|v1|v2]
                                         LLVM's own client (Debian's LLVM 22 and 23) against rpc-serve
  gpu-images [--allow-skip] [--target nvptx64|amdgcn]
                                         build LLVM's GPU libc, its integration tests and a hello
                                         world; check rpc-run --inspect reads them all
  run [--release] -- [RPC-RUN ARGS]      build rpc-run and run a GPU executable (or --inspect it)
  help                                   this text";

/// Why a command did not succeed.
#[derive(Debug, PartialEq, Eq)]
pub enum Failure {
    /// Bad command line: the message, then the usage; exit status 2.
    Usage(String),
    /// The command ran and failed: the message; exit status 1.
    Failed(String),
    /// `--help` was asked for: the text to print; exit status 0.
    Help(String),
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Failure::Usage(why) | Failure::Failed(why) | Failure::Help(why) => f.write_str(why),
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

/// The lines of [`USAGE`] about `command` (its line and the indented lines that follow it).
pub fn usage_of(command: &str) -> String {
    let mut lines = USAGE.lines().skip_while(|line| {
        let name = line.split_whitespace().next();
        !(line.starts_with("  ") && !line.starts_with("   ") && name == Some(command))
    });
    let Some(first) = lines.next() else {
        return USAGE.to_string();
    };
    let rest = lines.take_while(|line| line.starts_with("    ") && !line.trim().is_empty());
    let body: Vec<&str> = std::iter::once(first).chain(rest).collect();
    format!("usage: cargo xtask {}", body.join("\n").trim_start())
}

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
        "tidy" => tidy::run(rest),
        "header" => header::run(rest),
        "layout" => layout::run(rest),
        "stress" => stress::run(rest),
        "bench" => bench::run(rest),
        "gpu-check" => gpu_check::run(rest),
        "soak" => soak::run(rest),
        "fuzz" => fuzz::run(rest),
        "sanitize" => sanitize::run(rest),
        "llvm-client" => llvm_client::run(rest),
        "run" => run::run(rest),
        "gpu-images" => gpu_images::run(rest),
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
        Err(Failure::Help(text)) => {
            println!("{text}");
            ExitCode::SUCCESS
        }
        Err(Failure::Usage(why)) => {
            let command = args.first().map(String::as_str).unwrap_or_default();
            eprintln!("xtask: {why}\n\n{}", usage_of(command));
            ExitCode::from(2)
        }
        Err(Failure::Failed(why)) => {
            eprintln!("xtask: {why}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_command_has_its_own_usage_lines() {
        let commands = [
            "demo",
            "test",
            "devices",
            "build",
            "layout",
            "stress",
            "bench",
            "gpu-check",
            "soak",
            "fuzz",
            "sanitize",
            "llvm-client",
        ];
        for command in commands {
            let usage = usage_of(command);
            assert!(
                usage.starts_with(&format!("usage: cargo xtask {command}")),
                "{usage}"
            );
            assert!(usage.len() < USAGE.len() / 3, "{command}: {usage}");
        }
        assert_eq!(usage_of("frob"), USAGE);
    }

    #[test]
    fn usage_errors_and_help_from_every_command_line() {
        let args =
            |line: &str| -> Vec<String> { line.split_whitespace().map(String::from).collect() };
        for line in [
            "layout --help",
            "stress -h",
            "soak --seconds 5 --help",
            "bench --help",
            "gpu-check --help",
            "sanitize --help",
            "llvm-client --help",
            "test --help",
            "build --help",
        ] {
            assert!(matches!(run(&args(line)), Err(Failure::Help(_))), "{line}");
        }
        for line in [
            "layout --frob",
            "layout --gen v1 --ports 99999999999 --lanes 1",
            "stress --threads 99999999999",
            "stress --threads 100000",
            "stress --ops 0",
            "soak --seconds 0",
            "soak --seconds 99999999999",
            "bench --frob",
            "gpu-check --frob",
            "sanitize frob",
            "llvm-client --gen v3",
            "test extra",
            "build --plugin tpu",
            "build --plugin host --release=yes",
            "demo --plugin host --image x",
            "demo --plugin host --kernel y",
            "frob",
        ] {
            assert!(matches!(run(&args(line)), Err(Failure::Usage(_))), "{line}");
        }
    }
}

//! `cargo xtask`: the project's automation, as a plain Rust binary (alias in `.cargo/config.toml`).
//!
//! The command line is clap's ([`Cli`]; ranged numbers from [`flags`]): every command takes
//! `--help` (exit 0). A usage error exits with status 2 (the message, then the command's
//! usage), a failing command with status 1. README.md's Commands list is checked against
//! [`Cli`] by a test here.

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
#[cfg(test)]
mod readme;
mod run;
mod rust_kernels;
mod sanitize;
mod soak;
mod stress;
mod test;
mod tidy;

use std::fmt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};

/// The command line: one command and its flags.
#[derive(Parser, Debug)]
#[command(
    name = "xtask",
    bin_name = "cargo xtask",
    about = "The project's automation: each command is described in README.md, Commands"
)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// The commands, in README.md's order.
#[derive(Subcommand, Debug)]
enum Command {
    /// The whole test suite as CI runs it: tidy, fmt, clippy, doc, the tests, loom, miri
    /// (where nightly has it), the no_std build, a 30 s soak
    Test(test::Args),
    /// The layering and file rules ARCHITECTURE.md states, and that include/rpc_plugin.h is
    /// current
    Tidy,
    /// Prints a mailbox layout's offsets and sizes in bytes
    Layout(layout::Args),
    /// The server life-cycle stress (RPC_STRESS_SEED replays a run)
    Stress(stress::Args),
    /// The main job: a small offload program (rpc-demo) on the host plugin
    Demo(plugins::DemoArgs),
    /// Builds rpc-demo with just those plugins (and rpc-serve with the host plugin) and each
    /// plugin's library libplugin_NAME.so beside them: in target/debug/ (target/release/ with
    /// --release) for all plugins, else in target/plugins/PLUGIN/debug/ (or release/)
    Build(plugins::BuildArgs),
    /// Regenerates include/rpc_plugin.h (cbindgen, from plugin-abi)
    Header,
    /// The performance table (docs/performance.md)
    Bench(bench::Args),
    /// Assembles the GPU check kit in target/gpu-check/ and runs its run.sh here
    GpuCheck(gpu_check::Args),
    /// Two plugin-host runtimes under mixed traffic; nothing may be lost or leaked
    Soak(soak::Args),
    /// cargo fuzz on a fuzzed mailbox and on the printf parser
    Fuzz(fuzz::Args),
    /// rpc-core's and the workloads' tests under ThreadSanitizer / AddressSanitizer
    Sanitize(sanitize::Args),
    /// LLVM's own client (LLVM 18, 22 and 23) against rpc-serve
    LlvmClient(llvm_client::Args),
    /// Builds rpc-run and runs it with the arguments after `--`; exits with its status
    Run(run::Args),
    /// Builds LLVM's GPU libc, its integration tests and a hello world; checks that rpc-run
    /// --inspect reads them all
    GpuImages(gpu_images::Args),
    /// Builds rpc-device's Rust examples for sm_90 PTX and gfx942 (nightly) and checks them
    /// with rpc-run --inspect's reader; --run-host runs them on the host plugin
    RustKernels(rust_kernels::Args),
}

/// Why a command did not succeed.
#[derive(Debug, PartialEq, Eq)]
pub enum Failure {
    /// A command line clap could not check alone (a flag that fits only some plugins, a bad
    /// `RPC_STRESS_SEED`): the message, then the usage; exit status 2.
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

/// Runs `command` to its end; if it does not succeed, why, named by `what` ("WHAT: why" when
/// it does not start, "WHAT failed (STATUS)" when it fails).
pub fn succeed(command: &mut std::process::Command, what: &str) -> std::result::Result<(), String> {
    let status = command.status().map_err(|e| format!("{what}: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("{what} failed ({status})"))
    }
}

/// Where cargo builds the workspace at `root`: `$CARGO_TARGET_DIR`, else its `target`.
pub fn target_dir(root: &Path) -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"))
}

fn run(command: Command) -> Result {
    match command {
        Command::Test(args) => test::run(&args),
        Command::Tidy => tidy::run(),
        Command::Layout(args) => layout::run(&args),
        Command::Stress(args) => stress::run(&args),
        Command::Demo(args) => plugins::demo(&args),
        Command::Build(args) => plugins::build(&args),
        Command::Header => header::run(),
        Command::Bench(args) => bench::run(&args),
        Command::GpuCheck(args) => gpu_check::run(&args),
        Command::Soak(args) => soak::run(&args),
        Command::Fuzz(args) => fuzz::run(&args),
        Command::Sanitize(args) => sanitize::run(&args),
        Command::LlvmClient(args) => llvm_client::run(&args),
        Command::Run(args) => run::run(&args),
        Command::GpuImages(args) => gpu_images::run(&args),
        Command::RustKernels(args) => rust_kernels::run(&args),
    }
}

/// The usage lines of command `name` (`cargo xtask NAME ...`), or of xtask itself.
fn usage_of(name: Option<&str>) -> String {
    let mut cli = Cli::command();
    cli.build();
    match name.and_then(|name| cli.find_subcommand_mut(name)) {
        Some(command) => command.render_usage().to_string(),
        None => cli.render_usage().to_string(),
    }
}

/// Prints a usage error (`error: ...`), then the usage of the command given, where the
/// message does not hold it yet; exit status 2.
fn usage_error(text: &str) -> ExitCode {
    eprint!("{text}");
    if !text.contains("Usage:") {
        let command = std::env::args().nth(1);
        eprintln!("\n{}", usage_of(command.as_deref()));
    }
    ExitCode::from(2)
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(help) if !help.use_stderr() => {
            let _ = help.print();
            return ExitCode::SUCCESS;
        }
        Err(error) => return usage_error(&error.render().to_string()),
    };
    match run(cli.command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::Usage(why)) => usage_error(&format!("error: {why}\n")),
        Err(Failure::Failed(why)) => {
            eprintln!("xtask: {why}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// `cargo xtask LINE` as clap reads it; a usage error as [`Failure::Usage`].
    pub fn parse(line: &str) -> Result<Command> {
        let words = std::iter::once("xtask").chain(line.split_whitespace());
        Cli::try_parse_from(words)
            .map(|cli| cli.command)
            .map_err(|e| Failure::Usage(e.to_string()))
    }

    #[test]
    fn the_readme_lists_every_command_and_flag_clap_knows_and_no_other() {
        let cli = Cli::command();
        let known: Vec<(String, Vec<String>)> = cli
            .get_subcommands()
            .map(|command| {
                let flags = command
                    .get_arguments()
                    .filter_map(|arg| arg.get_long())
                    .filter(|&long| long != "help")
                    .map(|long| format!("--{long}"))
                    .collect();
                (command.get_name().to_string(), flags)
            })
            .collect();
        let mut documented = crate::readme::commands(&project_root());
        let mut known_sorted = known.clone();
        for list in [&mut documented, &mut known_sorted] {
            list.iter_mut().for_each(|(_, flags)| flags.sort());
            list.sort();
        }
        let names = |list: &[(String, Vec<String>)]| -> Vec<String> {
            list.iter().map(|(name, _)| name.clone()).collect()
        };
        assert_eq!(
            names(&documented),
            names(&known_sorted),
            "README.md vs clap"
        );
        for ((name, readme), (_, clap)) in documented.iter().zip(&known_sorted) {
            assert_eq!(
                readme, clap,
                "cargo xtask {name}: README.md's flags vs clap's"
            );
        }
    }

    #[test]
    fn every_command_takes_help() {
        for command in Cli::command().get_subcommands() {
            let name = command.get_name();
            for help in ["--help", "-h"] {
                let error = Cli::try_parse_from(["xtask", name, help]).unwrap_err();
                assert!(!error.use_stderr(), "{name} {help}: {error}");
                assert!(
                    error
                        .to_string()
                        .contains(&format!("Usage: cargo xtask {name}")),
                    "{error}"
                );
            }
        }
    }

    #[test]
    fn bad_command_lines_are_usage_errors_that_say_what_is_wrong() {
        for (line, says) in [
            ("layout --frob", "--frob"),
            (
                "layout --gen v1 --ports 99999999999 --lanes 1",
                "from 0 to 4294967295",
            ),
            (
                "layout --gen v9 --ports 1 --lanes 32",
                "[possible values: v0, v1, v2]",
            ),
            ("stress --threads 99999999999", "from 1 to 256"),
            ("stress --threads 100000", "from 1 to 256"),
            ("stress --ops 0", "from 1 to 10000000"),
            ("soak --seconds 0", "from 1 to 86400"),
            ("soak --seconds 99999999999999999999999", "from 1 to 86400"),
            ("fuzz --target all", "[possible values: mailbox, printf]"),
            ("bench --park-us 0", "from 1 to 1000000"),
            ("bench --park-us 4294967296000", "from 1 to 1000000"),
            ("bench --peer gcc", "[possible values: llvm]"),
            ("gpu-check --frob", "--frob"),
            ("sanitize frob", "[possible values: thread, address]"),
            ("llvm-client --gen v9", "[possible values: v0, v1, v2]"),
            (
                "gpu-images --target x86",
                "[possible values: nvptx64, amdgcn]",
            ),
            ("test extra", "extra"),
            ("tidy extra", "extra"),
            ("header extra", "extra"),
            (
                "build --plugin tpu",
                "[possible values: host, cuda, amdgpu, all]",
            ),
            ("build --plugin host --release=yes", "--release"),
            ("demo --kernel y", "--image"),
            ("run --release", "RPC-RUN-ARGS"),
            ("frob", "frob"),
        ] {
            match parse(line) {
                Err(Failure::Usage(why)) => assert!(why.contains(says), "{line}: {why}"),
                other => panic!("{line}: {other:?}"),
            }
        }
        // What clap cannot check alone, the command refuses before it does anything.
        for line in ["demo --plugin host --image x", "demo --image x --kernel y"] {
            let Ok(Command::Demo(args)) = parse(line) else {
                panic!("{line}");
            };
            assert!(
                matches!(plugins::demo(&args), Err(Failure::Usage(_))),
                "{line}"
            );
        }
    }

    #[test]
    fn run_passes_everything_after_the_dashes_to_rpc_run() {
        let Ok(Command::Run(args)) = parse("run --release -- --help --inspect x.ptx") else {
            panic!("not run");
        };
        assert_eq!(
            format!("{args:?}"),
            r#"Args { release: true, rpc_run_args: ["--help", "--inspect", "x.ptx"] }"#
        );
    }
}

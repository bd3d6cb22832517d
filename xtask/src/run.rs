//! `cargo xtask run [--release] -- RPC-RUN-ARGS...`: builds `rpc-run` and runs it with the
//! arguments after `--`; xtask exits with rpc-run's status (the program's own, or rpc-run's
//! failure code), so a script sees what the program returned.

use std::process::Command;

use crate::{cargo, project_root, Failure, Result};

/// `cargo xtask run`'s flags; rpc-run's own come after `--` (`-- --help` is rpc-run's help).
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Build and run the release rpc-run
    #[arg(long)]
    release: bool,
    /// rpc-run's arguments, e.g. -- --inspect IMAGE
    #[arg(last = true, required = true, value_name = "RPC-RUN-ARGS")]
    rpc_run_args: Vec<String>,
}

pub fn run(args: &Args) -> Result {
    let (release, theirs) = (args.release, &args.rpc_run_args);
    let root = project_root();
    let mut build = Command::new(cargo());
    build
        .current_dir(&root)
        .args(["build", "-q", "-p", "rpc-run"]);
    if release {
        build.arg("--release");
    }
    let built = build
        .status()
        .map_err(|e| format!("running cargo build: {e}"))?;
    if !built.success() {
        return Err(Failure::Failed(format!("building rpc-run: {built}")));
    }
    let binary = root
        .join("target")
        .join(if release { "release" } else { "debug" })
        .join("rpc-run");
    let status = Command::new(&binary)
        .args(theirs)
        .status()
        .map_err(|e| format!("running {}: {e}", binary.display()))?;
    // The program's status is the answer: pass it on unchanged (a signal becomes 128 + n).
    use std::os::unix::process::ExitStatusExt;
    let code = status
        .code()
        .unwrap_or_else(|| 128 + status.signal().unwrap_or(0));
    std::process::exit(code)
}

//! `cargo xtask bench [--quick] [--peer llvm] [ARGS]`: builds and runs `tools/rpc-bench`
//! (docs/performance.md).
//!
//! xtask only prepares: the release builds of `rpc-bench` and `rpc-serve` (the cross-process
//! server it measures) and, with `--peer llvm`, LLVM's own host server: LLVM libc's server
//! sources from Debian's `llvm-toolchain-22` (v1) and `-23` (v2) source packages, fetched,
//! verified and cached as `cargo xtask llvm-client` does (`llvm_client::fetch_source`), compiled with
//! our glue `tools/rpc-bench/llvm-peer.cpp`. A generation whose peer cannot be had or built is
//! named with the reason and its rows run against ours alone. Every other argument goes to
//! rpc-bench.

use std::path::{Path, PathBuf};
use std::process::Command;

use rpc_core::protocol::Generation;

use crate::llvm_client::{self, Problem};
use crate::{cargo, project_root, succeed, target_dir, Failure, Result};

/// `cargo xtask bench`'s flags, checked here before any build: rpc-bench's own (passed on),
/// plus `--peer`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The short run (about a minute): fewer sizes and repetitions
    #[arg(long)]
    quick: bool,
    /// Every cross-process row against LLVM's own host server too
    #[arg(long, value_name = "PEER", value_parser = ["llvm"])]
    peer: Option<String>,
    /// The quiet regime's threads placed by the scheduler, not pinned
    #[arg(long)]
    float: bool,
    /// Only the latency rows
    #[arg(long)]
    latency_only: bool,
    /// The in-process servers' park time in microseconds (ServerConfig::park)
    #[arg(long, value_name = "N", value_parser = crate::flags::number(1u64, 1_000_000),
          allow_negative_numbers = true)]
    park_us: Option<u64>,
    /// Busy threads in the loaded regime (more than the CPUs: an oversubscribed node)
    #[arg(long, value_name = "N", value_parser = crate::flags::number(1u64, 16),
          allow_negative_numbers = true)]
    hogs: Option<u64>,
}

pub fn run(args: &Args) -> Result {
    let root = project_root();
    let peer = args.peer.is_some();
    let switches = [
        (args.quick, "--quick"),
        (args.float, "--float"),
        (args.latency_only, "--latency-only"),
    ];
    let mut pass: Vec<String> = switches
        .into_iter()
        .filter(|(given, _)| *given)
        .map(|(_, flag)| flag.to_string())
        .collect();
    if let Some(us) = args.park_us {
        pass.extend(["--park-us".to_string(), us.to_string()]);
    }
    if let Some(hogs) = args.hogs {
        pass.extend(["--hogs".to_string(), hogs.to_string()]);
    }
    succeed(
        Command::new(cargo())
            .current_dir(&root)
            .args([
                "build",
                "--release",
                "--quiet",
                "-p",
                "rpc-bench",
                "-p",
                "rpc-serve",
            ])
            .args(["--bin", "rpc-bench", "--bin", "rpc-serve"]),
        "bench: building rpc-bench and rpc-serve",
    )?;
    let release = target_dir(&root).join("release");
    let mut bench = Command::new(release.join("rpc-bench"));
    bench
        .current_dir(&root)
        .arg("--rpc-serve")
        .arg(release.join("rpc-serve"))
        .arg("--out")
        .arg(root.join("target/bench"));
    if peer {
        for (major, generation) in [(22, Generation::V1), (23, Generation::V2)] {
            match build_peer(&root, major, generation) {
                Ok(binary) => {
                    bench.arg(format!("--peer-{generation}")).arg(binary);
                }
                Err(why) => println!(
                    "bench: no LLVM peer for {generation} (LLVM {major}): {why}; its rows run \
                     against rpc-serve alone"
                ),
            }
        }
    }
    let status = bench
        .args(&pass)
        .status()
        .map_err(|e| format!("bench: running rpc-bench: {e}"))?;
    if status.success() {
        Ok(())
    } else if status.code() == Some(2) {
        Err(Failure::Usage(
            "bench: rpc-bench refused its arguments".into(),
        ))
    } else {
        Err(Failure::Failed(format!(
            "bench: rpc-bench failed ({status})"
        )))
    }
}

/// LLVM MAJOR's server with our glue: `target/bench/llvm-peer-MAJOR`, rebuilt when the glue is
/// newer than it.
fn build_peer(
    root: &Path,
    major: u32,
    generation: Generation,
) -> std::result::Result<PathBuf, String> {
    let why = |p: Problem| match p {
        Problem::Unavailable(why) | Problem::Failed(why) => why,
    };
    let (sources, version) = llvm_client::server_sources(major).map_err(why)?;
    let compiler = llvm_client::compiler().map_err(why)?;
    let glue = root.join("tools/rpc-bench/llvm-peer.cpp");
    let binary = root.join(format!("target/bench/llvm-peer-{major}"));
    let modified = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    if modified(&binary).is_some() && modified(&binary) >= modified(&glue) {
        println!("bench: {} is up to date (LLVM {version})", binary.display());
        return Ok(binary);
    }
    std::fs::create_dir_all(root.join("target/bench")).map_err(|e| e.to_string())?;
    let libc = sources.join("libc");
    // -O2, as LLVM's release builds compile the offload plugin; LLVM's headers as system
    // headers: their warnings are not ours to fail on.
    let output = Command::new(&compiler)
        .args([
            "-std=c++17",
            "-O2",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-pthread",
        ])
        // GCC sees through LLVM's TEST_INTERFACE handler into a read it cannot prove
        // initialised (it is: the client sends first); not our code to fail on.
        .arg("-Wno-maybe-uninitialized")
        .arg(format!(
            "-DLLVM_PEER_GENERATION={}",
            if generation == Generation::V1 { 1 } else { 2 }
        ))
        .arg("-isystem")
        .arg(&libc)
        .arg("-isystem")
        .arg(libc.join("include"))
        .arg(&glue)
        .arg("-o")
        .arg(&binary)
        .output()
        .map_err(|e| format!("running {compiler}: {e}"))?;
    if !output.status.success() {
        return Err(format!(
            "{compiler} failed on {} against LLVM {version}:\n{}",
            glue.display(),
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    println!("bench: built {} (LLVM {version})", binary.display());
    Ok(binary)
}

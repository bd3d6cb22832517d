//! `cargo xtask rust-kernels [--run-host]`: Rust GPU programs built with `rpc-device`.
//!
//! Builds the crate's examples (`hello`, `panic`) with nightly (`-Zbuild-std=core,alloc`, the
//! `rust-src` component, `--features panic-handler`) for `nvptx64-nvidia-cuda` (sm_90, PTX
//! text: a static library, so that no linker runs, with `--emit asm` under fat LTO, so that
//! the one module holds the program and the crates it uses) and `amdgcn-amd-amdhsa` (gfx942, a code object linked by rust-lld), into
//! `target/rust-kernels/`. Each image is printed (`image PATH`) and read with rpc-run
//! `--inspect`'s reader: the `__llvm_rpc_client` of v2, `_begin`, `_start` and `_end`; the PTX
//! must show system-scope fences and warp votes.
//!
//! With `--run-host` it also builds them for the host (shared objects, plugin-host's native
//! images), with the v2 client object and with v1's (the `v1` feature), and runs each under
//! `rpc-run` on the host plugin, checking the generation, the output and the exit status, and
//! ends with `rust-kernels: host N passed, M failed`.

use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use rpc_core::protocol::Generation;
use rpc_run::image::{Client, Format};

use crate::{cargo, project_root, succeed, Failure, Result};

/// The command line of `cargo xtask rust-kernels`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Also build the examples for the host and run them under rpc-run on the host plugin
    #[arg(long)]
    run_host: bool,
}

/// The examples built.
const EXAMPLES: &[&str] = &["hello", "panic"];

/// One GPU target: its triple, CPU and the file the build leaves per example.
struct Gpu {
    triple: &'static str,
    cpu: &'static str,
    /// Whether the image is PTX text (`--emit asm`), else a linked code object.
    ptx: bool,
}

const GPUS: &[Gpu] = &[
    Gpu {
        triple: "nvptx64-nvidia-cuda",
        cpu: "sm_90",
        ptx: true,
    },
    Gpu {
        triple: "amdgcn-amd-amdhsa",
        cpu: "gfx942",
        ptx: false,
    },
];

pub fn run(args: &Args) -> Result {
    let root = project_root();
    let target = root.join("target/rust-kernels");
    check_nightly()?;
    for gpu in GPUS {
        for example in EXAMPLES {
            let image = build_gpu(&root, &target, gpu, example)?;
            println!("image {}", image.display());
            check_image(&image, gpu)?;
        }
    }
    if args.run_host {
        run_host(&root, &target)?;
    }
    Ok(())
}

/// Nightly with `rust-src`, which `-Zbuild-std` needs (added where it can be); said loudly
/// where it cannot be had.
fn check_nightly() -> Result {
    crate::nightly::ensure_component("rust-src").map_err(|why| {
        Failure::Failed(format!(
            "rust-kernels: NO GPU BUILD: nightly's rust-src is needed for -Zbuild-std: {why}"
        ))
    })
}

/// Builds `example` for `gpu`; the image's path.
fn build_gpu(root: &Path, target: &Path, gpu: &Gpu, example: &str) -> Result<PathBuf> {
    let mut command = Command::new("rustup");
    command
        .args(["run", "nightly", "cargo"])
        .args([
            if gpu.ptx { "rustc" } else { "build" },
            "-p",
            "rpc-device",
            "--example",
            example,
            "--release",
            "--features",
            "panic-handler",
            "-Zbuild-std=core,alloc",
            "--target",
            gpu.triple,
            "--target-dir",
        ])
        .arg(target)
        .current_dir(root)
        .env("RUSTFLAGS", format!("-Ctarget-cpu={}", gpu.cpu))
        .env("CARGO_PROFILE_RELEASE_LTO", "fat");
    if gpu.ptx {
        // A static library: no linker runs (NVPTX's, llvm-bitcode-linker, is not to be had),
        // and under fat LTO the PTX `--emit asm` writes is the whole program's.
        command.args(["--crate-type", "staticlib", "--", "--emit", "asm"]);
    }
    succeed(
        &mut command,
        &format!("rust-kernels: building {example} for {}", gpu.triple),
    )?;
    let folder = target.join(gpu.triple).join("release/examples");
    let image = if gpu.ptx {
        newest(&folder, example, ".s")?
    } else {
        folder.join(format!("{example}.elf"))
    };
    Ok(image)
}

/// The newest file of `folder` named `NAME-HASH.EXT` or `libNAME-HASH.EXT`.
fn newest(folder: &Path, name: &str, ext: &str) -> Result<PathBuf> {
    let entries = std::fs::read_dir(folder)
        .map_err(|e| format!("rust-kernels: {}: {e}", folder.display()))?;
    entries
        .filter_map(|e| e.ok())
        .filter(|e| {
            let file = e.file_name().to_string_lossy().into_owned();
            let stem = file.strip_prefix("lib").unwrap_or(&file);
            stem.starts_with(&format!("{name}-")) && file.ends_with(ext)
        })
        .max_by_key(|e| e.metadata().and_then(|m| m.modified()).ok())
        .map(|e| e.path())
        .ok_or_else(|| {
            Failure::Failed(format!(
                "rust-kernels: no {name}-*{ext} in {}",
                folder.display()
            ))
        })
}

/// Reads the image as `rpc-run --inspect` does and checks what a run needs; for PTX, that
/// the hand-overs are ordered at system scope and the warp votes are there.
fn check_image(image: &Path, gpu: &Gpu) -> Result {
    let path = image.to_string_lossy();
    let (bytes, inspection) =
        rpc_run::read_image(&path).map_err(|e| format!("rust-kernels: {path}: {e}"))?;
    let want = if gpu.ptx { Format::Ptx } else { Format::AmdGpu };
    let mut problems = Vec::new();
    if inspection.format != want {
        problems.push(format!("format {:?}, not {want:?}", inspection.format));
    }
    match &inspection.client {
        Client::Known { generation, .. } if *generation == Generation::V2 => {}
        other => problems.push(format!("client {other:?}, not v2's __llvm_rpc_client")),
    }
    for kernel in ["_begin", "_start", "_end"] {
        if inspection.kernel(kernel).is_none() {
            problems.push(format!("no {kernel} kernel"));
        }
    }
    if gpu.ptx {
        let text = String::from_utf8_lossy(&bytes);
        if !["fence.sc.sys", "fence.acq_rel.sys", "membar.sys"]
            .iter()
            .any(|f| text.contains(f))
        {
            problems.push("no system-scope fence".into());
        }
        for vote in [
            "activemask.b32",
            "vote.sync.ballot.b32",
            "shfl.sync.idx.b32",
        ] {
            if !text.contains(vote) {
                problems.push(format!("no {vote}"));
            }
        }
    }
    if !problems.is_empty() {
        return Err(Failure::Failed(format!(
            "rust-kernels: {path}: {}",
            problems.join("; ")
        )));
    }
    println!(
        "checked {path}: {} target={} client=v2 _begin _start _end",
        inspection.format, inspection.target
    );
    Ok(())
}

/// A host run and what it must give.
struct HostRun {
    example: &'static str,
    args: &'static [&'static str],
    /// The exit status, or the signal (negative).
    status: i32,
    /// The stdout, its lines sorted (lanes of several warps come in any order).
    stdout: &'static str,
    /// Text stderr must hold.
    stderr: &'static str,
}

const HOST_RUNS: &[HostRun] = &[
    HostRun {
        example: "hello",
        args: &["--threads", "4", "IMAGE", "one", "two"],
        status: 3,
        stdout: "arguments: [\"one\", \"two\"]\n\
                 hello from thread  0 of block 0: 1 squares, the last Some(0), sum 0x0\n\
                 hello from thread  1 of block 0: 2 squares, the last Some(1), sum 0x1\n\
                 hello from thread  2 of block 0: 3 squares, the last Some(4), sum 0x5\n\
                 hello from thread  3 of block 0: 4 squares, the last Some(9), sum 0xe\n",
        stderr: "",
    },
    HostRun {
        example: "hello",
        args: &["--threads", "2", "IMAGE", "exit"],
        status: 4,
        stdout: "arguments: [\"exit\"]\n\
                 hello from thread  0 of block 0: 1 squares, the last Some(0), sum 0x0\n",
        stderr: "",
    },
    HostRun {
        example: "hello",
        args: &["--dispatch-tests", "--threads", "2", "IMAGE", "typed"],
        status: 3,
        stdout: "arguments: [\"typed\"]\n\
                 hello from thread  0 of block 0: 1 squares, the last Some(0), sum 0x0\n\
                 hello from thread  1 of block 0: 2 squares, the last Some(1), sum 0x1\n\
                 thread 0 typed: add 40, fill 4 [0, 1, 2, 3], negate -1, length 5\n\
                 thread 1 typed: add 41, fill 4 [10, 11, 12, 13], negate -2, length 5\n",
        stderr: "",
    },
    HostRun {
        example: "panic",
        args: &["--threads", "2", "IMAGE"],
        status: -libc::SIGABRT,
        stdout: "thread 0 before the panic\nthread 1 before the panic\n",
        stderr: "thread 1 of block 0 panicked at rpc-device/examples/panic.rs:20:9:\n\
                 thread 1 looked for a value and found None\n",
    },
];

/// Runs `cargo ARGS` in the workspace.
fn cargo_build(root: &Path, args: &[&str], target_dir: Option<&Path>) -> Result {
    let mut command = Command::new(cargo());
    command.args(args).current_dir(root);
    if let Some(dir) = target_dir {
        command.arg("--target-dir").arg(dir);
    }
    Ok(succeed(
        &mut command,
        &format!("rust-kernels: cargo {}", args.join(" ")),
    )?)
}

/// Builds the examples for the host, with the v2 client object (into the workspace's
/// `target/debug/`, beside rpc-run, as `cargo xtask run` builds it) and with v1's (the `v1`
/// feature, into `target/rust-kernels/host-v1/`), and runs each of [`HOST_RUNS`] with each
/// under rpc-run, after checking the image's generation as `--inspect` reads it.
fn run_host(root: &Path, target: &Path) -> Result {
    let examples = ["build", "-p", "rpc-device", "--examples"];
    cargo_build(root, &[&examples[..], &["-p", "rpc-run"]].concat(), None)?;
    let v1 = target.join("host-v1");
    cargo_build(
        root,
        &[&examples[..], &["--features", "v1"]].concat(),
        Some(&v1),
    )?;
    let rpc_run = root.join("target/debug/rpc-run");
    let builds = [
        (Generation::V2, root.join("target/debug/examples")),
        (Generation::V1, v1.join("debug/examples")),
    ];
    let (mut passed, mut failed) = (0, 0);
    for (generation, folder) in &builds {
        for case in HOST_RUNS {
            let image = folder.join(format!("lib{}.so", case.example));
            println!("image {}", image.display());
            match host_run(&rpc_run, &image, *generation, case)? {
                None => passed += 1,
                Some(why) => {
                    failed += 1;
                    println!("{why}");
                }
            }
        }
    }
    println!("rust-kernels: host {passed} passed, {failed} failed");
    if failed > 0 {
        return Err(Failure::Failed(format!(
            "rust-kernels: {failed} host runs failed"
        )));
    }
    Ok(())
}

/// Runs `case` with `image` under `rpc_run`; None if it gave what it must, else why not.
fn host_run(
    rpc_run: &Path,
    image: &Path,
    generation: Generation,
    case: &HostRun,
) -> Result<Option<String>> {
    let after: Vec<&str> = case
        .args
        .iter()
        .skip_while(|&&a| a != "IMAGE")
        .skip(1)
        .copied()
        .collect();
    let name = format!("host {generation} {} {}", case.example, after.join(" "));
    let path = image.to_string_lossy();
    match rpc_run::read_image(&path).map(|(_, inspection)| inspection.client) {
        Ok(Client::Known { generation: g, .. }) if g == generation => {}
        other => {
            return Ok(Some(format!(
                "{name}: FAILED: client {other:?}, not {generation}"
            )))
        }
    }
    let args: Vec<&str> = case
        .args
        .iter()
        .map(|&a| if a == "IMAGE" { &*path } else { a })
        .collect();
    let output = Command::new(rpc_run)
        .args(&args)
        .output()
        .map_err(|e| format!("rust-kernels: rpc-run: {e}"))?;
    let status = output
        .status
        .code()
        .or(output.status.signal().map(|s| -s))
        .unwrap_or(i32::MIN);
    let mut lines: Vec<&str> = std::str::from_utf8(&output.stdout)
        .unwrap_or_default()
        .lines()
        .collect();
    lines.sort_unstable();
    let stdout = lines.iter().map(|l| format!("{l}\n")).collect::<String>();
    let stderr = String::from_utf8_lossy(&output.stderr);
    if status == case.status && stdout == case.stdout && stderr.contains(case.stderr) {
        println!("{name}: ok (status {status})");
        return Ok(None);
    }
    Ok(Some(format!(
        "{name}: FAILED: status {status} (want {}), stdout:\n{stdout}stderr:\n{stderr}",
        case.status
    )))
}

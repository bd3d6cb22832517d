//! `cargo xtask gpu-check [--no-clang]`: prepares the GPU check for a machine with an NVIDIA GPU
//! but no Rust toolchain (docs/gpu-check.md).
//!
//! Builds `cuda-gpu-check` (tools/gpu-check) in release for x86-64 Linux, and puts it, the CUDA
//! client `tools/gpu-check/rpc_client.cu` and `run.sh` into `target/gpu-check/`. Where clang is
//! installed (and `--no-clang` is not given) it also compiles the client to
//! `rpc_client.clang.ptx` here, which checks the source and gives run.sh a PTX for a machine
//! without nvcc. Prints the one command to run on the GPU machine from the workspace root:
//! `bash target/gpu-check/run.sh`.

use std::path::{Path, PathBuf};

use crate::flags::Flags;
use std::process::Command;

/// The target the GPU machines run.
const TARGET: &str = "x86_64-unknown-linux-gnu";
/// The clang names tried, newest first.
const CLANGS: &[&str] = &[
    "clang++",
    "clang++-19",
    "clang++-18",
    "clang++-17",
    "clang++-16",
    "clang++-15",
    "clang++-14",
];

pub fn run(args: &[String]) -> crate::Result {
    let use_clang = !Flags::parse_with("gpu-check", args, &[], &["no-clang"])?.switch("no-clang");
    Ok(prepare(use_clang)?)
}

/// Builds and gathers the kit in `target/gpu-check/`.
fn prepare(use_clang: bool) -> Result<(), String> {
    let root = workspace_root();
    let sources = root.join("tools/gpu-check");
    let out = root.join("target/gpu-check");

    // Natively where this is x86-64 Linux; otherwise cross (needs the target's std and linker).
    let native = cfg!(all(target_arch = "x86_64", target_os = "linux"));
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut build = Command::new(cargo);
    build.current_dir(&root).args([
        "build",
        "--release",
        "-p",
        "gpu-check",
        "--bin",
        "cuda-gpu-check",
    ]);
    if !native {
        build.args(["--target", TARGET]);
    }
    println!("gpu-check: building cuda-gpu-check (release, {TARGET})");
    let status = build
        .status()
        .map_err(|e| format!("gpu-check: running cargo: {e}"))?;
    if !status.success() {
        return Err(format!("gpu-check: cargo build failed ({status})"));
    }
    let binary = if native {
        root.join("target/release/cuda-gpu-check")
    } else {
        root.join("target")
            .join(TARGET)
            .join("release/cuda-gpu-check")
    };

    if out.exists() {
        std::fs::remove_dir_all(&out)
            .map_err(|e| format!("gpu-check: clearing {}: {e}", out.display()))?;
    }
    std::fs::create_dir_all(&out)
        .map_err(|e| format!("gpu-check: creating {}: {e}", out.display()))?;
    copy(&binary, &out.join("cuda-gpu-check"))?;
    copy(&sources.join("rpc_client.cu"), &out.join("rpc_client.cu"))?;
    copy(&sources.join("run.sh"), &out.join("run.sh"))?;
    make_executable(&out.join("cuda-gpu-check"))?;
    make_executable(&out.join("run.sh"))?;

    if use_clang {
        match clang_ptx(&sources, &out.join("rpc_client.clang.ptx")) {
            Ok(clang) => println!("gpu-check: {clang} compiled rpc_client.cu to rpc_client.clang.ptx (sm_70, PTX 7.0)"),
            Err(why) => println!("gpu-check: no clang-built PTX ({why}); run.sh will need nvcc"),
        }
    }

    println!("gpu-check: ready in {}:", out.display());
    let mut entries: Vec<_> = std::fs::read_dir(&out)
        .map_err(|e| format!("gpu-check: listing {}: {e}", out.display()))?
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            Some((
                e.file_name().to_string_lossy().into_owned(),
                e.metadata().ok()?.len(),
            ))
        })
        .collect();
    entries.sort();
    for (name, len) in entries {
        println!("  {name:<24} {len:>10} bytes");
    }
    println!("gpu-check: on the GPU machine, from the workspace root, run:");
    println!("  bash target/gpu-check/run.sh");
    Ok(())
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the workspace")
        .to_path_buf()
}

fn copy(from: &Path, to: &Path) -> Result<(), String> {
    std::fs::copy(from, to).map(|_| ()).map_err(|e| {
        format!(
            "gpu-check: copying {} to {}: {e}",
            from.display(),
            to.display()
        )
    })
}

#[cfg(unix)]
fn make_executable(path: &Path) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))
        .map_err(|e| format!("gpu-check: chmod {}: {e}", path.display()))
}

#[cfg(not(unix))]
fn make_executable(_: &Path) -> Result<(), String> {
    Ok(())
}

/// Compiles the client with the first clang found, through clang_shim.h (no CUDA toolkit).
fn clang_ptx(sources: &Path, ptx: &Path) -> Result<String, String> {
    let clang = CLANGS
        .iter()
        .find(|name| {
            Command::new(name)
                .arg("--version")
                .output()
                .is_ok_and(|o| o.status.success())
        })
        .ok_or("no clang++ on PATH")?;
    let output = Command::new(clang)
        .current_dir(sources)
        .args([
            "-x",
            "cuda",
            "--cuda-device-only",
            "--cuda-gpu-arch=sm_70",
            "-nocudainc",
            "-nocudalib",
            "-O2",
            "-Xclang",
            "-target-feature",
            "-Xclang",
            "+ptx70",
            "-DRPC_CLANG_SHIM",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-S",
            "-o",
        ])
        .arg(ptx)
        .arg("rpc_client.cu")
        .output()
        .map_err(|e| format!("running {clang}: {e}"))?;
    if !output.status.success() {
        let _ = std::fs::remove_file(ptx);
        return Err(format!(
            "{clang} failed: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        ));
    }
    Ok((*clang).to_owned())
}

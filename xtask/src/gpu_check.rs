//! `cargo xtask gpu-check [--no-clang] [--no-self-check]`: assembles the GPU check kit, for
//! one run on a machine with an NVIDIA GPU and its driver but no Rust and perhaps an old
//! distribution (docs/gpu-check.md).
//!
//! Into `target/gpu-check/`: `run.sh` (the one command), `bin/rpc-run` and
//! `bin/cuda-gpu-check` built in release with `cargo zigbuild` for
//! `x86_64-unknown-linux-gnu.2.17` (with `gettid_shim.c`, since Rust's std calls `gettid`,
//! which glibc has only since 2.30) and checked with `objdump -T` to need no symbol newer
//! than glibc 2.17; the CUDA client `rpc_client.cu`, its clang-built PTX where clang is
//! installed (and `--no-clang` is not given); and `images/`, the PTX images of LLVM's GPU
//! libc tests that `cargo xtask gpu-images` built; and `rust/`, rpc-device's examples as
//! `cargo xtask rust-kernels` built them (sm_90 PTX). Without cargo-zigbuild the binaries are
//! built natively, and it says which glibc they need.
//!
//! Then, on a machine with no NVIDIA GPU (and unless `--no-self-check`), it runs the kit's
//! `run.sh` here: it must end with status 0, every GPU step skipped, and the
//! `GPU-CHECK SUMMARY` line last. Its outputs are removed again, so the kit is as carried.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::succeed;

/// The target the kit's binaries are built for: x86-64 Linux, glibc 2.17 (RHEL/CentOS 7).
const KIT_TARGET: &str = "x86_64-unknown-linux-gnu.2.17";
/// Cargo's name of that target (cargo-zigbuild takes the glibc version off).
const CARGO_TARGET: &str = "x86_64-unknown-linux-gnu";
/// The newest glibc symbol version the kit's binaries may need.
const GLIBC_MAX: (u32, u32) = (2, 17);
/// The clang names tried, newest first.
const CLANGS: &[&str] = &[
    "clang++",
    "clang++-22",
    "clang++-19",
    "clang++-18",
    "clang++-17",
    "clang++-16",
    "clang++-15",
    "clang++-14",
];

/// `cargo xtask gpu-check`'s flags.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Leave out the LLVM images built with clang
    #[arg(long)]
    no_clang: bool,
    /// Do not run the kit's run.sh here
    #[arg(long)]
    no_self_check: bool,
}

pub fn run(args: &Args) -> crate::Result {
    Ok(prepare(!args.no_clang, !args.no_self_check)?)
}

/// Builds and gathers the kit in `target/gpu-check/`, then checks it here.
fn prepare(use_clang: bool, self_check: bool) -> Result<(), String> {
    let root = workspace_root();
    let sources = root.join("tools/gpu-check");
    let out = root.join("target/gpu-check");

    let (binaries, portable) = build_binaries(&root)?;
    if out.exists() {
        std::fs::remove_dir_all(&out)
            .map_err(|e| format!("gpu-check: clearing {}: {e}", out.display()))?;
    }
    std::fs::create_dir_all(out.join("bin"))
        .map_err(|e| format!("gpu-check: creating {}: {e}", out.display()))?;
    for binary in ["rpc-run", "cuda-gpu-check"] {
        let from = binaries.join(binary);
        let to = out.join("bin").join(binary);
        copy(&from, &to)?;
        make_executable(&to)?;
        match glibc_needed(&to) {
            Ok(Some((major, minor))) if portable && (major, minor) > GLIBC_MAX => {
                return Err(format!(
                    "gpu-check: bin/{binary} needs glibc {major}.{minor}, more than {}.{}",
                    GLIBC_MAX.0, GLIBC_MAX.1
                ))
            }
            Ok(Some((major, minor))) => {
                println!("gpu-check: bin/{binary} needs glibc {major}.{minor} at most (objdump -T)")
            }
            Ok(None) => println!("gpu-check: bin/{binary} needs no versioned glibc symbol"),
            Err(why) => println!("gpu-check: bin/{binary}: glibc versions not checked ({why})"),
        }
    }
    copy(&sources.join("rpc_client.cu"), &out.join("rpc_client.cu"))?;
    copy(&sources.join("run.sh"), &out.join("run.sh"))?;
    make_executable(&out.join("run.sh"))?;

    if use_clang {
        match clang_ptx(&sources, &out.join("rpc_client.clang.ptx")) {
            Ok(clang) => println!("gpu-check: {clang} compiled rpc_client.cu to rpc_client.clang.ptx (sm_70, PTX 7.0)"),
            Err(why) => println!("gpu-check: no clang-built PTX ({why}); run.sh will need nvcc"),
        }
    }
    let images = root.join("target/gpu-images/nvptx64");
    let mut copied = 0;
    if let Ok(entries) = std::fs::read_dir(&images) {
        std::fs::create_dir_all(out.join("images"))
            .map_err(|e| format!("gpu-check: creating images/: {e}"))?;
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_file() && path.extension().is_none() {
                copy(&path, &out.join("images").join(entry.file_name()))?;
                copied += 1;
            }
        }
    }
    if copied == 0 {
        println!(
            "gpu-check: no LLVM images in {} (run `cargo xtask gpu-images --target nvptx64` \
             first): run.sh will skip them",
            images.display()
        );
    } else {
        println!(
            "gpu-check: {copied} LLVM GPU images from {}",
            images.display()
        );
    }

    copy_rust_images(&root, &out)?;

    if self_check {
        check_here(&out)?;
    }

    println!("gpu-check: the kit is ready in {}:", out.display());
    list(&out, &out)?;
    println!("gpu-check: carry the directory to the GPU machine and run:");
    println!("  bash gpu-check/run.sh        # or: bash gpu-check/run.sh --quick");
    Ok(())
}

/// The Rust programs (rpc-device's examples) as `cargo xtask rust-kernels` built them for
/// sm_90, copied to `rust/NAME.ptx` (the newest build of each); run.sh runs them.
fn copy_rust_images(root: &Path, out: &Path) -> Result<(), String> {
    let built = root.join("target/rust-kernels/nvptx64-nvidia-cuda/release/examples");
    let mut copied = 0;
    for name in ["hello", "panic"] {
        let newest = std::fs::read_dir(&built)
            .into_iter()
            .flatten()
            .flatten()
            .map(|entry| entry.path())
            .filter(|path| {
                let file = path.file_name().and_then(|f| f.to_str()).unwrap_or("");
                file.starts_with(&format!("{name}-")) && file.ends_with(".s")
            })
            .max_by_key(|path| path.metadata().and_then(|m| m.modified()).ok());
        if let Some(ptx) = newest {
            std::fs::create_dir_all(out.join("rust"))
                .map_err(|e| format!("gpu-check: creating rust/: {e}"))?;
            copy(&ptx, &out.join("rust").join(format!("{name}.ptx")))?;
            copied += 1;
        }
    }
    match copied {
        0 => println!(
            "gpu-check: no Rust images in {} (run `cargo xtask rust-kernels` first): run.sh \
             will skip them",
            built.display()
        ),
        n => println!("gpu-check: {n} Rust images (rpc-device's examples, sm_90 PTX)"),
    }
    Ok(())
}

/// Builds rpc-run and cuda-gpu-check in release: for glibc 2.17 with cargo-zigbuild where it
/// is installed (`true`), natively otherwise. The folder holding them.
fn build_binaries(root: &Path) -> Result<(PathBuf, bool), String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let zigbuild = Command::new("cargo-zigbuild")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    let packages = ["-p", "rpc-run", "-p", "gpu-check"];
    if !zigbuild {
        println!(
            "gpu-check: no cargo-zigbuild (pip install cargo-zigbuild ziglang): building \
             natively, so the binaries need this machine's glibc or newer"
        );
        succeed(
            Command::new(cargo)
                .current_dir(root)
                .args(["build", "--release"])
                .args(packages),
            "gpu-check: cargo build --release",
        )?;
        return Ok((root.join("target/release"), false));
    }
    let shim_dir = root.join("target/gpu-check-shim");
    std::fs::create_dir_all(&shim_dir).map_err(|e| format!("gpu-check: {e}"))?;
    let shim = shim_dir.join("gettid.o");
    succeed(
        Command::new("cargo-zigbuild")
            .args([
                "zig",
                "cc",
                "--",
                "-target",
                "x86_64-linux-gnu.2.17",
                "-O2",
                "-fPIC",
                "-c",
                "-o",
            ])
            .arg(&shim)
            .arg(root.join("tools/gpu-check/gettid_shim.c")),
        "gpu-check: zig cc gettid_shim.c",
    )?;
    println!("gpu-check: building rpc-run and cuda-gpu-check (release, {KIT_TARGET})");
    succeed(
        Command::new("cargo-zigbuild")
            .current_dir(root)
            .args(["zigbuild", "--release", "--target", KIT_TARGET])
            .args(packages)
            .env(
                "CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUSTFLAGS",
                format!("-C link-arg={}", shim.display()),
            ),
        "gpu-check: cargo zigbuild",
    )?;
    Ok((root.join("target").join(CARGO_TARGET).join("release"), true))
}

/// The newest `GLIBC_x.y` symbol version `binary` needs, from `objdump -T`.
fn glibc_needed(binary: &Path) -> Result<Option<(u32, u32)>, String> {
    let output = Command::new("objdump")
        .arg("-T")
        .arg(binary)
        .output()
        .map_err(|e| format!("objdump: {e}"))?;
    if !output.status.success() {
        return Err(String::from_utf8_lossy(&output.stderr).trim().to_owned());
    }
    Ok(newest_glibc(&String::from_utf8_lossy(&output.stdout)))
}

/// The newest `GLIBC_x.y[.z]` named in an `objdump -T` listing (`(GLIBC_2.3.4)` counts as 2.3).
fn newest_glibc(listing: &str) -> Option<(u32, u32)> {
    listing
        .split(|c: char| c.is_whitespace() || c == '(' || c == ')')
        .filter_map(|word| word.strip_prefix("GLIBC_"))
        .filter_map(|version| {
            let mut parts = version.split('.').map(str::parse::<u32>);
            Some((parts.next()?.ok()?, parts.next()?.ok()?))
        })
        .max()
}

/// Runs the kit's run.sh here, with no GPU: it must end cleanly with every GPU step skipped
/// and the summary last. Its outputs are removed afterwards.
fn check_here(kit: &Path) -> Result<(), String> {
    if Path::new("/dev/nvidia0").exists() {
        println!("gpu-check: this machine has an NVIDIA GPU; run the kit's run.sh to use it");
        return Ok(());
    }
    println!("gpu-check: running the kit's run.sh here (no GPU: every GPU step must be skipped)");
    let output = Command::new("bash")
        .arg(kit.join("run.sh"))
        .arg("--quick")
        .env("GPU_CHECK_TIMEOUT", "120")
        .output()
        .map_err(|e| format!("gpu-check: running run.sh: {e}"))?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    for stale in ["results.txt", "groups.txt", "build"] {
        let path = kit.join(stale);
        let _ = std::fs::remove_file(&path).or_else(|_| std::fs::remove_dir_all(&path));
    }
    let mut problems = Vec::new();
    if !output.status.success() {
        problems.push(format!("run.sh exited with {}", output.status));
    }
    let summary = stdout.lines().last().unwrap_or_default();
    if !summary.starts_with("GPU-CHECK SUMMARY pass=") || !summary.contains(" fail=0 ") {
        problems.push(format!(
            "the last line is {summary:?}, not a summary with fail=0"
        ));
    }
    for line in stdout.lines() {
        let needs_gpu = ["gpu-check-", "run-"].iter().any(|step| {
            line.split_once(' ')
                .is_some_and(|(_, rest)| rest.starts_with(step))
        });
        if needs_gpu && !line.starts_with("SKIP ") {
            problems.push(format!("a GPU step not skipped: {line}"));
        }
    }
    if problems.is_empty() {
        println!("gpu-check: run.sh here: {summary}");
        Ok(())
    } else {
        Err(format!(
            "gpu-check: the kit's run.sh misbehaved here:\n  {}\n--- its output:\n{stdout}",
            problems.join("\n  ")
        ))
    }
}

/// Prints the kit's files with their sizes.
fn list(dir: &Path, kit: &Path) -> Result<(), String> {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .map_err(|e| format!("gpu-check: listing {}: {e}", dir.display()))?
        .filter_map(|e| e.ok())
        .collect();
    entries.sort_by_key(|e| e.file_name());
    for entry in entries {
        let path = entry.path();
        if path.is_dir() {
            list(&path, kit)?;
        } else {
            let len = entry.metadata().map(|m| m.len()).unwrap_or(0);
            let name = path
                .strip_prefix(kit)
                .unwrap_or(&path)
                .display()
                .to_string();
            println!("  {name:<32} {len:>10} bytes");
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_newest_glibc_version_of_an_objdump_listing() {
        let listing = "0000000000000000      DF *UND*\t0000000000000000 (GLIBC_2.2.5) pthread_create\n\
                       0000000000000000      DF *UND*\t0000000000000000  GLIBC_2.17  clock_gettime\n\
                       0000000000000000  w   DF *UND*\t0000000000000000 (GLIBC_2.3.4) __register_atfork\n\
                       0000000000000000      DO *UND*\t0000000000000000 (GLIBC_PRIVATE) x\n";
        assert_eq!(newest_glibc(listing), Some((2, 17)));
        let newer = format!("{listing}0 DF *UND* 0 (GLIBC_2.34) __libc_start_main\n");
        assert_eq!(newest_glibc(&newer), Some((2, 34)));
        assert_eq!(newest_glibc("no versions here"), None);
    }
}

//! `cargo xtask gpu-images [--allow-skip] [--target nvptx64|amdgcn]`: real GPU executables
//! nobody here wrote. Builds LLVM's GPU libc from Debian's `llvm-toolchain-22` source package
//! (the same fetch as `llvm-client`) with Debian's `clang-22` / `lld-22`, for
//! `nvptx64-nvidia-cuda` (sm_90, PTX 7.8, linked to PTX text with `-Wl,--lto-emit-asm`, so no
//! ptxas) and `amdgcn-amd-amdhsa` (gfx942, `ld.lld`), entry points trimmed to assert, ctype,
//! errno, stdio, stdlib, string, strings and gpu; then LLVM's integration tests and a hello
//! world of ours (`tests/gpu-images/hello.c`), copied to `target/gpu-images/TARGET/`.
//!
//! Then every image is read with `rpc-run --inspect`'s reader and checked against what the
//! image must hold and against an independent reading: `_begin`, `_start`, `_end` with LLVM's
//! argument sizes (24, 32, 0 bytes explicit), the `__llvm_rpc_client` of LLVM 22 (552 bytes,
//! v1), and on AMDGPU each kernel's kernarg size, private segment size, dynamic stack flag and
//! wavefront size as `llvm-readelf-22 --notes` prints the metadata.
//!
//! Cached: the source tree in `target/llvm-src/llvm-22-tree/`, the build folders in
//! `target/gpu-libc/TARGET/` (configured once; ninja rebuilds only what changed). Not part of
//! `cargo xtask test` (it needs clang-22, cmake, ninja and a 200 MB download); see
//! docs/llvm-compat.md for the figures.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use crate::llvm_client::{fetch_source, Problem};
use crate::{project_root, Failure, Result};

/// The parts of the LLVM tree a runtimes build of libc reads.
const MEMBERS: &[&str] = &[
    "libc/*",
    "runtimes/*",
    "cmake/*",
    "llvm/cmake/*",
    "llvm/utils/lit/*",
    "llvm/utils/llvm-lit/*",
    "third-party/*",
];

/// The libc entry point folders kept (the rest, math above all, is most of the build).
const KEPT: &[&str] = &[
    "assert", "ctype", "errno", "stdio", "stdlib", "string", "strings", "gpu",
];

/// LLVM's integration tests built: (ninja target, image name).
const TESTS: &[(&str, &str)] = &[
    (
        "libc.test.integration.startup.gpu.startup_rpc_test",
        "rpc_test",
    ),
    (
        "libc.test.integration.startup.gpu.startup_rpc_interface_test",
        "rpc_interface_test",
    ),
    (
        "libc.test.integration.startup.gpu.startup_rpc_stream_test",
        "rpc_stream_test",
    ),
    (
        "libc.test.integration.startup.gpu.startup_args_test",
        "args_test",
    ),
    (
        "libc.test.integration.startup.gpu.init_fini_array_test",
        "init_fini_array_test",
    ),
    (
        "libc.test.integration.src.stdio.gpu.printf_test",
        "printf_test",
    ),
];

/// One GPU target.
struct Target {
    /// Folder name under target/gpu-libc and target/gpu-images.
    name: &'static str,
    triple: &'static str,
    arch: &'static str,
    /// The lane test's name for this target's wavefront.
    lane_test: &'static str,
    /// Extra compile flags (C and C++) and link flags.
    cflags: &'static str,
    ldflags: &'static str,
    /// `-march` or `-mcpu` for the hello world.
    arch_flag: &'static str,
    /// The ninja target of the startup object (`crt1`).
    crt1: &'static str,
}

const TARGETS: &[Target] = &[
    Target {
        name: "nvptx64",
        triple: "nvptx64-nvidia-cuda",
        arch: "sm_90",
        lane_test: "startup_rpc_lane_test_w32",
        // Objects stay bitcode (no ptxas) and need PTX 7.8 for sm_90's warp intrinsics.
        cflags: "--cuda-feature=+ptx78 -flto",
        ldflags: "-Wl,--lto-emit-asm",
        arch_flag: "-march=sm_90",
        crt1: "libc.startup.gpu.nvptx.crt1",
    },
    Target {
        name: "amdgcn",
        triple: "amdgcn-amd-amdhsa",
        arch: "gfx942",
        lane_test: "startup_rpc_lane_test_w64",
        cflags: "",
        ldflags: "",
        arch_flag: "-mcpu=gfx942",
        crt1: "libc.startup.gpu.amdgpu.crt1",
    },
];

/// `cargo xtask gpu-images`'s flags.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Missing tools or sources are a skip message instead of a failure
    #[arg(long)]
    allow_skip: bool,
    /// Only this target [default: both]
    #[arg(long, value_name = "TARGET", value_parser = ["nvptx64", "amdgcn"])]
    target: Option<String>,
}

pub fn run(args: &Args) -> Result {
    match build_and_check(args.target.as_deref()) {
        Ok(()) => Ok(()),
        Err(Problem::Unavailable(why)) if args.allow_skip => {
            println!("gpu-images: skipped: {why}");
            Ok(())
        }
        Err(Problem::Unavailable(why)) | Err(Problem::Failed(why)) => {
            Err(Failure::Failed(format!("gpu-images: {why}")))
        }
    }
}

fn on_path(tool: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join(tool).is_file()))
}

fn run_logged(command: &mut Command, log: &Path, what: &str) -> std::result::Result<(), Problem> {
    let output = command
        .output()
        .map_err(|e| format!("{what}: running {command:?}: {e}"))?;
    let mut text = output.stdout.clone();
    text.extend_from_slice(&output.stderr);
    std::fs::write(log, &text).map_err(|e| format!("writing {}: {e}", log.display()))?;
    if output.status.success() {
        Ok(())
    } else {
        let text = String::from_utf8_lossy(&text);
        let tail: Vec<&str> = text.lines().rev().take(15).collect();
        Err(Problem::Failed(format!(
            "{what} failed ({}); the end of {}:\n{}",
            output.status,
            log.display(),
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        )))
    }
}

/// Writes `config/gpu/ARCH/entrypoints.txt` from its pristine copy, keeping only [`KEPT`].
fn trim_entrypoints(tree: &Path) -> std::result::Result<(), Problem> {
    for arch in ["nvptx", "amdgpu"] {
        let file = tree.join(format!("libc/config/gpu/{arch}/entrypoints.txt"));
        let pristine = file.with_extension("txt.orig");
        if !pristine.exists() {
            std::fs::copy(&file, &pristine)
                .map_err(|e| format!("copying {}: {e}", file.display()))?;
        }
        let text = std::fs::read_to_string(&pristine)
            .map_err(|e| format!("reading {}: {e}", pristine.display()))?;
        let kept: Vec<&str> = text
            .lines()
            .filter(|line| match line.trim().strip_prefix("libc.src.") {
                None => true,
                Some(rest) => KEPT
                    .iter()
                    .any(|k| rest.strip_prefix(k).is_some_and(|r| r.starts_with('.'))),
            })
            .collect();
        let trimmed = kept.join("\n") + "\n";
        if std::fs::read_to_string(&file).ok().as_deref() != Some(trimmed.as_str()) {
            std::fs::write(&file, trimmed)
                .map_err(|e| format!("writing {}: {e}", file.display()))?;
        }
    }
    Ok(())
}

fn build_and_check(only: Option<&str>) -> std::result::Result<(), Problem> {
    let root = project_root();
    for tool in [
        "clang-22",
        "clang++-22",
        "cmake",
        "ninja",
        "python3",
        "llvm-readelf-22",
    ] {
        if !on_path(tool) {
            return Err(Problem::Unavailable(format!(
                "`{tool}` not found (apt-get install clang-22 lld-22 llvm-22 cmake ninja-build \
                 python3-yaml)"
            )));
        }
    }
    let started = Instant::now();
    let (tree, version) = fetch_source(
        22,
        &root.join("target/llvm-src/llvm-22-tree"),
        MEMBERS,
        true,
    )?;
    println!("gpu-images: LLVM {version} sources in {}", tree.display());
    trim_entrypoints(&tree)?;
    let rpc_run = build_rpc_run(&root)?;
    let mut images = Vec::new();
    for target in TARGETS.iter().filter(|t| only.is_none_or(|o| o == t.name)) {
        let begin = Instant::now();
        let built = build_target(&root, &tree, target, &rpc_run)?;
        println!(
            "gpu-images: {}: {} images in {:.0} s: {}",
            target.name,
            built.len(),
            begin.elapsed().as_secs_f64(),
            built
                .iter()
                .map(|p| p.file_name().unwrap_or_default().to_string_lossy())
                .collect::<Vec<_>>()
                .join(", ")
        );
        images.extend(built);
    }
    let mut failures = Vec::new();
    for image in &images {
        match check_image(image) {
            Ok(summary) => println!("gpu-images: {}: {summary}", short(&root, image)),
            Err(why) => failures.push(format!("{}: {why}", short(&root, image))),
        }
    }
    if !failures.is_empty() {
        return Err(Problem::Failed(format!(
            "--inspect misread {} of {} images:\n{}",
            failures.len(),
            images.len(),
            failures.join("\n")
        )));
    }
    println!(
        "gpu-images: --inspect read all {} images correctly; {:.0} s in all",
        images.len(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

fn short(root: &Path, path: &Path) -> String {
    path.strip_prefix(root)
        .unwrap_or(path)
        .display()
        .to_string()
}

fn build_rpc_run(root: &Path) -> std::result::Result<PathBuf, Problem> {
    let status = Command::new(crate::cargo())
        .current_dir(root)
        .args(["build", "-q", "-p", "rpc-run"])
        .status()
        .map_err(|e| format!("running cargo build -p rpc-run: {e}"))?;
    if !status.success() {
        return Err(Problem::Failed(format!("cargo build -p rpc-run: {status}")));
    }
    Ok(root.join("target/debug/rpc-run"))
}

/// Configures (once) and builds one target; the images, copied to target/gpu-images/NAME/.
fn build_target(
    root: &Path,
    tree: &Path,
    target: &Target,
    rpc_run: &Path,
) -> std::result::Result<Vec<PathBuf>, Problem> {
    let build = root.join("target/gpu-libc").join(target.name);
    let out = root.join("target/gpu-images").join(target.name);
    std::fs::create_dir_all(&out).map_err(|e| format!("creating {}: {e}", out.display()))?;
    if !build.join("build.ninja").exists() {
        let mut cmake = Command::new("cmake");
        cmake
            .arg("-S")
            .arg(tree.join("runtimes"))
            .arg("-B")
            .arg(&build)
            .args([
                "-G",
                "Ninja",
                "-DLLVM_ENABLE_RUNTIMES=libc",
                "-DLLVM_LIBC_FULL_BUILD=ON",
            ])
            .args([
                "-DCMAKE_C_COMPILER=clang-22",
                "-DCMAKE_CXX_COMPILER=clang++-22",
            ])
            .arg(format!("-DLLVM_RUNTIMES_TARGET={}", target.triple))
            .arg(format!("-DCMAKE_C_COMPILER_TARGET={}", target.triple))
            .arg(format!("-DCMAKE_CXX_COMPILER_TARGET={}", target.triple))
            // No GPU toolchain to link a test program with at configure time.
            .args([
                "-DCMAKE_C_COMPILER_WORKS=ON",
                "-DCMAKE_CXX_COMPILER_WORKS=ON",
            ])
            .args(["-DCMAKE_BUILD_TYPE=Release", "-DLLVM_INCLUDE_TESTS=ON"])
            .arg(format!("-DLIBC_GPU_TEST_ARCHITECTURE={}", target.arch))
            // The tests' loader: rpc-run itself (`ninja check-libc` on a GPU runs them with it).
            .arg(format!(
                "-DLIBC_GPU_LOADER_EXECUTABLE={}",
                rpc_run.display()
            ))
            .arg(format!("-DCMAKE_C_FLAGS={}", target.cflags))
            .arg(format!("-DCMAKE_CXX_FLAGS={}", target.cflags))
            .arg(format!("-DCMAKE_EXE_LINKER_FLAGS={}", target.ldflags));
        std::fs::create_dir_all(&build)
            .map_err(|e| format!("creating {}: {e}", build.display()))?;
        run_logged(&mut cmake, &build.join("xtask-cmake.log"), "cmake")?;
    }
    let lane = format!("libc.test.integration.startup.gpu.{}", target.lane_test);
    let mut wanted: Vec<(String, String)> = TESTS
        .iter()
        .map(|&(t, n)| (t.to_owned(), n.to_owned()))
        .collect();
    wanted.push((lane, "rpc_lane_test".into()));
    let mut ninja = Command::new("ninja");
    ninja
        .current_dir(&build)
        .args(["-j", "2", "libc", target.crt1]);
    for (test, _) in &wanted {
        ninja.arg(format!("{test}.__build__"));
    }
    run_logged(&mut ninja, &build.join("xtask-ninja.log"), "ninja")?;
    let mut images = Vec::new();
    for (test, name) in &wanted {
        let folder = test
            .strip_prefix("libc.")
            .and_then(|t| t.rsplit_once('.'))
            .map(|(dir, _)| dir.replace('.', "/"))
            .unwrap_or_default();
        let built = build
            .join("libc")
            .join(folder)
            .join(format!("{test}.__build__"));
        let copy = out.join(name);
        std::fs::copy(&built, &copy).map_err(|e| format!("copying {}: {e}", built.display()))?;
        images.push(copy);
    }
    images.push(hello(root, &build, target, &out)?);
    Ok(images)
}

/// Our hello world, linked against the built libc and its startup object.
fn hello(
    root: &Path,
    build: &Path,
    target: &Target,
    out: &Path,
) -> std::result::Result<PathBuf, Problem> {
    let crt1 = find_crt1(&build.join("libc/startup/gpu"))
        .ok_or_else(|| format!("no crt1 object under {}", build.display()))?;
    let image = out.join("hello");
    let mut clang = Command::new("clang-22");
    clang
        .arg(format!("--target={}", target.triple))
        .arg(target.arch_flag)
        .args(target.cflags.split_whitespace())
        .args([
            "-O2",
            "-flto",
            "-nogpulib",
            "-nostdlib",
            "-static",
            "-isystem",
        ])
        .arg(build.join("libc/include"))
        .arg(root.join("tests/gpu-images/hello.c"))
        .arg(crt1)
        .arg(build.join("libc/lib/libc.a"))
        .args(target.ldflags.split_whitespace())
        .arg("-o")
        .arg(&image);
    run_logged(&mut clang, &out.join("hello.log"), "compiling hello.c")?;
    Ok(image)
}

fn find_crt1(dir: &Path) -> Option<PathBuf> {
    for entry in std::fs::read_dir(dir).ok()?.flatten() {
        let path = entry.path();
        if path.is_dir() {
            if let Some(found) = find_crt1(&path) {
                return Some(found);
            }
        } else if path.file_name().is_some_and(|n| n == "crt1.o")
            // The object library's one object: `CMakeFiles/<crt1 target>.dir/start.cpp.o`.
            || (path.ends_with("start.cpp.o")
                && path
                    .parent()
                    .is_some_and(|d| d.to_string_lossy().ends_with("crt1.dir")))
        {
            return Some(path);
        }
    }
    None
}

/// Reads `image` as `rpc-run --inspect` does and checks it; a one-line summary.
fn check_image(image: &Path) -> std::result::Result<String, String> {
    let bytes = std::fs::read(image).map_err(|e| e.to_string())?;
    let inspection = rpc_run::image::inspect(&bytes).map_err(|e| e.to_string())?;
    let report = inspection.to_string();
    match &inspection.client {
        rpc_run::image::Client::Known {
            size: 552,
            generation: rpc_core::protocol::Generation::V1,
            ..
        } => {}
        other => {
            return Err(format!(
                "client {other:?}, expected LLVM 22's 552-byte v1\n{report}"
            ))
        }
    }
    // Explicit argument bytes of LLVM's start kernels.
    for (kernel, explicit) in [("_begin", 24), ("_start", 32), ("_end", 0)] {
        let k = inspection
            .kernel(kernel)
            .ok_or_else(|| format!("no {kernel}\n{report}"))?;
        let size = k.kernarg_size.unwrap_or(0);
        let ok = match inspection.format {
            rpc_run::image::Format::Ptx => size == explicit,
            // Explicit arguments, then the code object v5 implicit ones (256 bytes).
            _ => size >= explicit,
        };
        if !ok {
            return Err(format!(
                "{kernel}: kernarg {size}, expected {explicit} explicit\n{report}"
            ));
        }
    }
    if inspection.format == rpc_run::image::Format::AmdGpu {
        compare_with_readelf(image, &inspection)?;
    }
    // LLVM's constructor test has one constructor and one destructor; on NVPTX rpc-run must
    // find both to fill the tables (ld.lld fills AMDGPU's).
    let is_ptx = inspection.format == rpc_run::image::Format::Ptx;
    if is_ptx && image.ends_with("init_fini_array_test") {
        let init = inspection
            .init_fini
            .iter()
            .filter(|n| n.starts_with("__init"))
            .count();
        let fini = inspection
            .init_fini
            .iter()
            .filter(|n| n.starts_with("__fini"))
            .count();
        if (init, fini) != (1, 1) {
            return Err(format!(
                "{init} constructors and {fini} destructors, expected 1 and 1\n{report}"
            ));
        }
    }
    let start = inspection
        .kernel("_start")
        .map(|k| (k.kernarg_size, k.stack));
    Ok(format!(
        "{} kernels, client {} bytes, _start kernarg/stack {:?}",
        inspection.kernels.len(),
        552,
        start.unwrap_or_default()
    ))
}

/// Each kernel's metadata as `llvm-readelf-22 --notes` prints it (YAML), against ours.
fn compare_with_readelf(
    image: &Path,
    inspection: &rpc_run::image::Inspection,
) -> std::result::Result<(), String> {
    let output = Command::new("llvm-readelf-22")
        .arg("--notes")
        .arg(image)
        .output()
        .map_err(|e| format!("running llvm-readelf-22: {e}"))?;
    let text = String::from_utf8_lossy(&output.stdout);
    // `amdhsa.kernels:` is a list of maps, each starting `  - .agpr_count:` or similar; the
    // keys of one kernel are the lines until the next `  - `.
    let mut kernels: Vec<Vec<(String, String)>> = Vec::new();
    let mut in_kernels = false;
    for line in text.lines() {
        if line.starts_with("amdhsa.kernels:") {
            in_kernels = true;
            continue;
        }
        if in_kernels && !line.starts_with(' ') {
            in_kernels = false;
        }
        if !in_kernels {
            continue;
        }
        if let Some(rest) = line.strip_prefix("  - ") {
            kernels.push(Vec::new());
            if let Some((k, v)) = rest.split_once(':') {
                kernels
                    .last_mut()
                    .unwrap()
                    .push((k.trim().into(), v.trim().into()));
            }
        } else if let (Some(current), Some((k, v))) = (kernels.last_mut(), line.split_once(':')) {
            // Only the kernel's own keys (four spaces), not those of its `.args` entries.
            if line.starts_with("    .") {
                current.push((k.trim().into(), v.trim().into()));
            }
        }
    }
    if kernels.len() != inspection.kernels.len() {
        return Err(format!(
            "llvm-readelf lists {} kernels, --inspect {}",
            kernels.len(),
            inspection.kernels.len()
        ));
    }
    for keys in &kernels {
        let get = |key: &str| keys.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str());
        let name = get(".name").unwrap_or("?");
        let ours = inspection
            .kernel(name)
            .ok_or_else(|| format!("llvm-readelf lists {name}, --inspect does not"))?;
        let number = |key| get(key).and_then(|v| v.parse::<u32>().ok());
        let checks = [
            (".kernarg_segment_size", ours.kernarg_size),
            (".private_segment_fixed_size", ours.stack),
            (".wavefront_size", ours.wavefront_size),
        ];
        for (key, value) in checks {
            if number(key) != value {
                return Err(format!(
                    "{name}: {key} is {:?} to llvm-readelf, {value:?} to --inspect",
                    get(key)
                ));
            }
        }
        let dynamic = get(".uses_dynamic_stack").map(|v| v == "true");
        if dynamic.unwrap_or(false) != ours.dynamic_stack.unwrap_or(false) {
            return Err(format!(
                "{name}: .uses_dynamic_stack is {dynamic:?} to llvm-readelf, {:?} to --inspect",
                ours.dynamic_stack
            ));
        }
    }
    Ok(())
}

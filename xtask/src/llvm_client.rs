//! `cargo xtask llvm-client [--allow-skip] [--gen v0|v1|v2]`: LLVM's own client against
//! `rpc-serve`, in every generation Debian carries the source of (docs/llvm-compat.md).
//!
//! 1. **Sources.** LLVM's header-only client (`libc/shared/rpc.h`, `rpc_util.h`,
//!    `rpc_opcodes.h`; `rpc_server.h` and the offload plugin's `RPC.h`/`RPC.cpp` come along to
//!    read) from Debian's `llvm-toolchain-22` (LLVM 22: the v1 layout) and `llvm-toolchain-23`
//!    (LLVM 23: v2, the doorbell) source packages: `apt-cache showsrc` names the versions the
//!    `deb-src` entries carry (`.ci/run` adds one for sid), `apt-get source --download-only`
//!    fetches them, the orig tarball is checked against the SHA-256 of the signed Sources index
//!    (`apt-get source --print-uris`), and `tar --occurrence` takes out only those files (it stops
//!    reading once it has them). They are kept in `target/llvm-src/llvm-MAJOR/` (with a
//!    `VERSION` file) and the tarball is deleted: a rerun downloads nothing. LLVM 18 (trixie's
//!    `llvm-toolchain-18`: v0) has no header-only client: its `libc/src/__support/RPC/rpc.h` and
//!    the libc headers it includes are taken out by pattern ([`FILES_18`]). Nothing from LLVM is
//!    committed.
//! 2. **Build.** Our driver, `workloads/llvm-client/driver.cpp`, compiled for the host (a CPU
//!    client: lane size one) against each generation's headers with `$CXX` (else g++, c++ or
//!    clang++), and `rpc-serve` (debug, as the tests build it).
//! 3. **Run.** For each generation and each run of [`RUNS`]: a fresh `rpc-serve` in a scratch
//!    sandbox (`target/llvm-client/GEN-pN/`) fed a known stdin, the driver over its memfd
//!    mailbox (one serial run, then, at 3 ports, [`THREADS`] threads at once on one client
//!    object), SIGTERM, and then the checks the driver cannot make itself: rpc-serve's device
//!    stdout and stderr against what the driver expected, byte for byte (the serial part in
//!    order, each thread's tagged lines in that thread's order), the files left in the sandbox,
//!    the client object LLVM's constructor made against rpc-core's `Layout::client_object` for
//!    the same base, and rpc-serve's statistics (no errors, panics, unknown opcodes or abandoned
//!    exchanges).
//! 4. **Typed calls** (LLVM 23 on, whose `libc/shared/rpc_dispatch.h` is fetched with the
//!    rest): `workloads/llvm-client/dispatch.cpp`, built against it, calls every test function
//!    of `rpc-serve --dispatch-tests` (PROTOCOL section 12) with LLVM's own `rpc::dispatch`
//!    from one thread, then from [`THREADS`] at once on 3 ports, each answer checked against
//!    the same C++ function run locally; rpc-serve must have served every call, none refused.
//!
//! Sources that cannot be had (no apt, no `deb-src` entry carrying the package, no network) and
//! a missing C++ compiler fail the command, or with `--allow-skip` print why and skip that
//! generation. A failed build, a mismatch or a hang always fails. Times are liveness bounds
//! only: nothing waits for a duration to pass.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::time::{Duration, Instant};

use rpc_core::protocol::{Generation, Layout};

use crate::{cargo, project_root, succeed, target_dir, Failure, Result};

/// The Debian source packages tried, the generation their client speaks, newest LLVM last.
const SOURCES: &[(u32, Generation)] = &[
    (18, Generation::V0),
    (22, Generation::V1),
    (23, Generation::V2),
];
/// The runs of each generation: port count (0: LLVM's MAX_PORT_COUNT, 4096 or 16384) and client
/// threads after the serial part. Three ports for four threads make them contend for ports,
/// and 3 is no multiple of 8, where LLVM's packet offset `align_up(D + 24N, 8)` once disagreed
/// with ours; the most ports LLVM's client holds is what its loader gives a big GPU. The
/// parallel part runs once: its spinning clients (LLVM's CPU client spins without yielding)
/// are the slow part on two cores.
const RUNS: &[(u32, u32)] = &[(3, THREADS), (0, 0)];
/// Client threads of the parallel run.
const THREADS: u32 = 4;
/// LLVM libc's host server, for `bench --peer llvm`: LLVM 23's `libc/shared/rpc_server.h`
/// holds it all; LLVM 22's includes `src/__support/RPC/rpc_server.h`, which includes libc's
/// printf core, `hdr/` and `include/`; and the loop of offload's `RPC.cpp`.
const SERVER_FILES: &[&str] = &[
    "libc/shared/*",
    "libc/src/__support/*",
    "libc/src/stdio/printf_core/*",
    "libc/src/string/*",
    "libc/hdr/*",
    "libc/include/*",
    "offload/plugins-nextgen/common/src/RPC.cpp",
];

/// LLVM MAJOR's host server sources (see [`SERVER_FILES`]), cached in
/// `target/llvm-src/llvm-MAJOR-server`.
pub(crate) fn server_sources(major: u32) -> std::result::Result<(PathBuf, String), Problem> {
    let cache = crate::project_root().join(format!("target/llvm-src/llvm-{major}-server"));
    fetch_source(major, &cache, SERVER_FILES, true)
}

/// The files taken out of the tarball, below its top folder.
const FILES: &[&str] = &[
    "libc/shared/rpc.h",
    "libc/shared/rpc_util.h",
    "libc/shared/rpc_opcodes.h",
    "libc/shared/rpc_server.h",
    "offload/plugins-nextgen/common/include/RPC.h",
    "offload/plugins-nextgen/common/src/RPC.cpp",
];
/// LLVM 23 on also has typed calls (`rpc::dispatch`, `rpc::invoke`), in their own header.
const DISPATCH_FILES: &[&str] = &["libc/shared/rpc_dispatch.h"];
/// The first LLVM whose headers have [`DISPATCH_FILES`].
const DISPATCH_MAJOR: u32 = 23;
/// Rounds of calls of every typed test function per thread of the dispatch driver.
const DISPATCH_ROUNDS: u32 = 200;
/// LLVM 18 has no header-only client: its client is `libc/src/__support/RPC/rpc.h`, which
/// includes libc's `CPP/`, `GPU/`, `macros/` support and `string/memory_utils/`; its opcodes
/// are in `include/llvm-libc-types/`; `utils/gpu/` holds its loaders and server (read, not
/// built), `CMakeLists.txt` its default `LIBC_NAMESPACE`. Patterns: one pass over the tarball.
const FILES_18: &[&str] = &[
    "libc/src/__support/*",
    "libc/src/string/memory_utils/*",
    "libc/include/llvm-libc-types/*",
    "libc/utils/gpu/*",
    "libc/CMakeLists.txt",
];
/// LLVM 18's default `LIBC_NAMESPACE` for 18.1.8 (`__llvm_libc_MAJOR_MINOR_PATCH_SUFFIX` in
/// its `libc/CMakeLists.txt`, the suffix empty in a release).
const LIBC_NAMESPACE_18: &str = "__llvm_libc_18_1_8_";

/// What rpc-serve's stdin holds for the driver to read back.
const STDIN: &str = "stdin first line\nthe rest of stdin, read by READ_FROM_STREAM\nlast line\n";
/// Liveness bounds: far beyond what a run takes on a loaded 2-core machine.
const READY_BOUND: Duration = Duration::from_secs(60);
const DRIVER_BOUND: Duration = Duration::from_secs(600);
const EXIT_BOUND: Duration = Duration::from_secs(60);

/// Why a generation could not be run: `Unavailable` may be skipped with `--allow-skip`.
pub(crate) enum Problem {
    Unavailable(String),
    Failed(String),
}

impl From<String> for Problem {
    fn from(why: String) -> Self {
        Problem::Failed(why)
    }
}

/// `cargo xtask llvm-client`'s flags.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Missing sources or compiler are a skip message instead of a failure
    #[arg(long)]
    allow_skip: bool,
    /// Only this generation (v0: LLVM 18, v1: LLVM 22, v2: LLVM 23) [default: all three]
    #[arg(long = "gen", value_name = "GEN", value_parser = crate::flags::generation())]
    generation: Option<Generation>,
}

pub fn run(args: &Args) -> Result {
    let allow_skip = args.allow_skip;
    let only = args.generation;
    let root = project_root();
    let started = Instant::now();

    let mut fetched = Vec::new();
    let mut skipped = Vec::new();
    let mut fetch_time = Duration::ZERO;
    for &(major, generation) in SOURCES {
        if only.is_some_and(|g| g != generation) {
            continue;
        }
        let begin = Instant::now();
        match sources(&root, major) {
            Ok((dir, version)) => fetched.push((major, generation, dir, version)),
            Err(Problem::Unavailable(why)) if allow_skip => {
                println!("llvm-client: SKIPPED {generation} (LLVM {major}): {why}");
                skipped.push(generation);
            }
            Err(Problem::Unavailable(why)) | Err(Problem::Failed(why)) => {
                return Err(Failure::Failed(format!("llvm-client: LLVM {major}: {why}")))
            }
        }
        fetch_time += begin.elapsed();
    }
    if fetched.is_empty() {
        println!("llvm-client: nothing run (every generation skipped)");
        return Ok(());
    }

    let begin = Instant::now();
    let compiler = match compiler() {
        Ok(compiler) => compiler,
        Err(Problem::Unavailable(why)) if allow_skip => {
            println!("llvm-client: SKIPPED: {why}");
            return Ok(());
        }
        Err(Problem::Unavailable(why)) | Err(Problem::Failed(why)) => {
            return Err(Failure::Failed(format!("llvm-client: {why}")))
        }
    };
    let out = root.join("target/llvm-client");
    // The generations' drivers compile at once (one compiler each).
    let builds: Vec<_> = fetched
        .iter()
        .map(|(major, generation, dir, version)| {
            let binary = out.join(format!("llvm-client-{major}"));
            let build = start_driver_build(&compiler, &root, dir, *generation, &binary);
            (build, (*generation, binary, version.clone()))
        })
        .collect();
    // The typed calls' driver, where the headers have them.
    let dispatch_builds: Vec<_> = fetched
        .iter()
        .filter(|f| f.0 >= DISPATCH_MAJOR)
        .map(|(major, _, dir, version)| {
            let binary = out.join(format!("llvm-dispatch-{major}"));
            let build = start_dispatch_build(&compiler, &root, dir, &binary);
            (build, (binary, version.clone()))
        })
        .collect();
    let mut drivers = Vec::new();
    for (build, driver) in builds {
        build?.finish()?;
        drivers.push(driver);
    }
    let mut dispatch_drivers = Vec::new();
    for (build, driver) in dispatch_builds {
        build?.finish()?;
        dispatch_drivers.push(driver);
    }
    let driver_time = begin.elapsed();

    let begin = Instant::now();
    let serve = build_rpc_serve(&root)?;
    let serve_time = begin.elapsed();

    let begin = Instant::now();
    let mut passed = Vec::new();
    for (generation, driver, version) in &drivers {
        for &(ports, threads) in RUNS {
            let ports = if ports == 0 {
                generation.max_port_count()
            } else {
                ports
            };
            let line =
                run_one(&out, &serve, driver, *generation, ports, threads).map_err(|why| {
                    format!("llvm-client: {generation} (LLVM {version}), {ports} ports: {why}")
                })?;
            println!("llvm-client: {generation} (LLVM {version}), {ports} ports: passed; {line}");
        }
        passed.push(format!("{generation} (LLVM {version})"));
    }
    for (driver, version) in &dispatch_drivers {
        let line = run_dispatch(&out, &serve, driver)
            .map_err(|why| format!("llvm-client: typed calls (LLVM {version}): {why}"))?;
        println!("llvm-client: typed calls (LLVM {version}, rpc::dispatch): passed; {line}");
        passed.push(format!("typed calls (LLVM {version})"));
    }
    let run_time = begin.elapsed();
    if let Some((_, _, dir, _)) = fetched.iter().find(|f| f.1 == Generation::V0) {
        llvm18_gpu_objects(&out, dir)?;
    }
    println!(
        "llvm-client: passed {}{}; sources {:.1} s, driver build {:.1} s, rpc-serve build {:.1} \
         s, runs {:.1} s, total {:.1} s",
        passed.join(" and "),
        if skipped.is_empty() {
            String::new()
        } else {
            format!(
                " ({} skipped)",
                skipped
                    .iter()
                    .map(|g| g.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        },
        fetch_time.as_secs_f64(),
        driver_time.as_secs_f64(),
        serve_time.as_secs_f64(),
        run_time.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

// ---- 1. the sources ----------------------------------------------------------------------

/// LLVM MAJOR's `contents`: the cached folder, or fetched and extracted into it. Returns
/// the folder and the upstream version.
fn sources(root: &Path, major: u32) -> std::result::Result<(PathBuf, String), Problem> {
    let cache = root.join(format!("target/llvm-src/llvm-{major}"));
    if major == 18 {
        fetch_source(major, &cache, FILES_18, true)
    } else if major >= DISPATCH_MAJOR {
        fetch_source(major, &cache, &[FILES, DISPATCH_FILES].concat(), false)
    } else {
        fetch_source(major, &cache, FILES, false)
    }
}

/// Parts of LLVM MAJOR's source tree in `cache`: the cached folder, or fetched from Debian's
/// `llvm-toolchain-MAJOR` source package (verified against the signed index) and extracted
/// into it. `members` are paths in the tree (with `wildcards`, tar patterns such as
/// `libc/*`; the cache counts as complete when each pattern's folder exists). Returns the
/// folder and the upstream version. Shared by `llvm-client` and `gpu-images`.
pub(crate) fn fetch_source(
    major: u32,
    cache: &Path,
    members: &[&str],
    wildcards: bool,
) -> std::result::Result<(PathBuf, String), Problem> {
    let root = crate::project_root();
    let cache = cache.to_path_buf();
    let stamp = cache.join("VERSION");
    let present = |m: &&str| {
        let path = cache.join(m.trim_end_matches("/*"));
        if wildcards {
            path.exists()
        } else {
            path.is_file()
        }
    };
    if let Ok(text) = std::fs::read_to_string(&stamp) {
        if members.iter().all(present) {
            let version = upstream_of(text.split_whitespace().nth(1).unwrap_or("?"));
            println!(
                "llvm-src: LLVM {major}: cached in {} ({})",
                cache.display(),
                text.trim()
            );
            return Ok((cache, version));
        }
    }
    let package = format!("llvm-toolchain-{major}");
    for tool in ["apt-get", "apt-cache", "dpkg", "sha256sum", "tar", "xz"] {
        if !on_path(tool) {
            return Err(Problem::Unavailable(format!(
                "`{tool}` not found (a Debian machine with apt and xz-utils is needed to fetch \
                 {package})"
            )));
        }
    }
    let versions = source_versions(&package)?;
    if versions.is_empty() {
        return Err(Problem::Unavailable(format!(
            "apt knows no source package {package}: add a deb-src entry for a suite that carries \
             it (Debian sid: a file /etc/apt/sources.list.d/sid-src.sources with `Types: \
             deb-src`, `URIs: http://deb.debian.org/debian`, `Suites: sid`, `Components: main`, \
             `Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg`; .ci/run does this), \
             then apt-get update"
        )));
    }
    let download = root.join("target/llvm-src/download");
    std::fs::create_dir_all(&download)
        .map_err(|e| format!("creating {}: {e}", download.display()))?;
    let mut tried = Vec::new();
    for version in &versions {
        let begin = Instant::now();
        let Some(orig) = orig_tarball(&package, version)? else {
            tried.push(format!("{version}: no orig tarball listed"));
            continue;
        };
        let tarball = download.join(&orig.name);
        if !matches_hash(&tarball, &orig)? {
            println!(
                "llvm-src: LLVM {major}: apt-get source --download-only {package}={version} \
                 ({} MB)",
                orig.size / 1_000_000
            );
            // The .dsc and the Debian diff may be missing from a mirror (seen here: 404s) and
            // apt then exits 1; only the orig tarball matters, and its hash decides.
            let output = Command::new("apt-get")
                .current_dir(&download)
                .args(["source", "--download-only", "-qq"])
                .arg(format!("{package}={version}"))
                .output()
                .map_err(|e| format!("running apt-get: {e}"))?;
            if !matches_hash(&tarball, &orig)? {
                let said = String::from_utf8_lossy(&output.stderr);
                let why: Vec<&str> = said
                    .lines()
                    .filter(|l| l.starts_with("E:") && l.contains(&orig.name))
                    .collect();
                tried.push(format!(
                    "{version}: {} not downloaded ({})",
                    orig.name,
                    why.join("; ")
                ));
                continue;
            }
        }
        let fetched = begin.elapsed();
        let begin = Instant::now();
        extract(&tarball, &orig.name, &cache, members, wildcards)?;
        let stamp_text = format!("{package} {version} {} sha256:{}\n", orig.name, orig.sha256);
        std::fs::write(&stamp, &stamp_text)
            .map_err(|e| format!("writing {}: {e}", stamp.display()))?;
        // The tarball (and a .dsc or Debian diff the mirror had) are not kept: the cache is
        // the extracted files.
        if let Ok(entries) = std::fs::read_dir(&download) {
            for entry in entries.flatten() {
                if entry
                    .file_name()
                    .to_string_lossy()
                    .starts_with(&format!("{package}_"))
                {
                    let _ = std::fs::remove_file(entry.path());
                }
            }
        }
        println!(
            "llvm-src: LLVM {major}: {} verified (sha256 {}), download {:.1} s, extract {:.1} \
             s, into {}",
            orig.name,
            &orig.sha256[..16],
            fetched.as_secs_f64(),
            begin.elapsed().as_secs_f64(),
            cache.display()
        );
        return Ok((cache, upstream_of(version)));
    }
    Err(Problem::Unavailable(format!(
        "{package} could not be downloaded (no network, or stale package lists: apt-get \
         update); tried {}",
        tried.join(", ")
    )))
}

/// "1:22.1.8-1" -> "22.1.8".
fn upstream_of(version: &str) -> String {
    let version = version.split_once(':').map_or(version, |(_, v)| v);
    version
        .rsplit_once('-')
        .map_or(version, |(v, _)| v)
        .to_string()
}

fn on_path(tool: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join(tool).is_file()))
}

/// The versions of `package` the deb-src entries carry, newest first.
fn source_versions(package: &str) -> std::result::Result<Vec<String>, Problem> {
    let output = Command::new("apt-cache")
        .args(["showsrc", package])
        .output()
        .map_err(|e| format!("running apt-cache: {e}"))?;
    let text = String::from_utf8_lossy(&output.stdout);
    let mut versions: Vec<String> = Vec::new();
    let mut in_package = false;
    for line in text.lines() {
        if let Some(name) = line.strip_prefix("Package: ") {
            in_package = name.trim() == package;
        } else if let Some(version) = line.strip_prefix("Version: ") {
            let version = version.trim().to_string();
            if in_package && !versions.contains(&version) {
                versions.push(version);
            }
        }
    }
    // Newest first, by dpkg's ordering (insertion sort: a handful of versions).
    let mut sorted: Vec<String> = Vec::new();
    for version in versions {
        let at = sorted
            .iter()
            .position(|v| newer(&version, v))
            .unwrap_or(sorted.len());
        sorted.insert(at, version);
    }
    Ok(sorted)
}

fn newer(a: &str, b: &str) -> bool {
    Command::new("dpkg")
        .args(["--compare-versions", a, "gt", b])
        .status()
        .is_ok_and(|s| s.success())
}

/// The orig tarball of `package=version` as the signed Sources index lists it.
struct Orig {
    name: String,
    size: u64,
    sha256: String,
}

fn orig_tarball(package: &str, version: &str) -> std::result::Result<Option<Orig>, Problem> {
    let output = Command::new("apt-get")
        .args(["source", "--print-uris", "-qq"])
        .arg(format!("{package}={version}"))
        .output()
        .map_err(|e| format!("running apt-get: {e}"))?;
    let text = String::from_utf8_lossy(&output.stdout);
    // 'URI' NAME SIZE SHA256:HEX
    for line in text.lines().filter(|l| l.starts_with('\'')) {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if let [_, name, size, hash] = fields[..] {
            if name.ends_with(".orig.tar.xz") {
                let sha256 = hash.strip_prefix("SHA256:").ok_or_else(|| {
                    format!("apt lists {name} without a SHA-256 ({hash}): cannot verify it")
                })?;
                return Ok(Some(Orig {
                    name: name.to_string(),
                    size: size.parse().unwrap_or(0),
                    sha256: sha256.to_lowercase(),
                }));
            }
        }
    }
    Ok(None)
}

/// Whether `path` exists with the size and SHA-256 the index lists (a wrong one is deleted).
fn matches_hash(path: &Path, orig: &Orig) -> std::result::Result<bool, Problem> {
    match std::fs::metadata(path) {
        Ok(meta) if meta.len() == orig.size => {}
        Ok(_) => {
            let _ = std::fs::remove_file(path);
            return Ok(false);
        }
        Err(_) => return Ok(false),
    }
    let output = Command::new("sha256sum")
        .arg(path)
        .output()
        .map_err(|e| format!("running sha256sum: {e}"))?;
    let text = String::from_utf8_lossy(&output.stdout);
    let got = text.split_whitespace().next().unwrap_or("");
    if got == orig.sha256 {
        Ok(true)
    } else {
        let _ = std::fs::remove_file(path);
        Err(Problem::Failed(format!(
            "{}: SHA-256 {got}, but the signed index lists {} (deleted)",
            path.display(),
            orig.sha256
        )))
    }
}

/// Takes `members` out of `tarball` into `cache` (replacing it), through a temporary folder.
/// Plain names stop the read once all are out (`--occurrence`); patterns read the whole file.
fn extract(
    tarball: &Path,
    name: &str,
    cache: &Path,
    members: &[&str],
    wildcards: bool,
) -> std::result::Result<(), Problem> {
    let top = name.trim_end_matches(".orig.tar.xz");
    let partial = cache.with_extension("partial");
    let _ = std::fs::remove_dir_all(&partial);
    std::fs::create_dir_all(&partial)
        .map_err(|e| format!("creating {}: {e}", partial.display()))?;
    let output = Command::new("tar")
        .arg("-xJf")
        .arg(tarball)
        .arg("-C")
        .arg(&partial)
        .arg("--strip-components=1")
        .arg(if wildcards {
            "--wildcards"
        } else {
            "--occurrence"
        })
        .args(members.iter().map(|f| format!("{top}/{f}")))
        .output()
        .map_err(|e| format!("running tar: {e}"))?;
    if !output.status.success() {
        return Err(Problem::Failed(format!(
            "tar -xJf {}: {} ({})",
            tarball.display(),
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        )));
    }
    let _ = std::fs::remove_dir_all(cache);
    std::fs::rename(&partial, cache)
        .map_err(|e| format!("renaming {} to {}: {e}", partial.display(), cache.display()))?;
    Ok(())
}

// ---- 2. building -------------------------------------------------------------------------

pub(crate) fn compiler() -> std::result::Result<String, Problem> {
    let mut names: Vec<String> = std::env::var("CXX").into_iter().collect();
    names.extend(["g++", "c++", "clang++"].map(String::from));
    names
        .into_iter()
        .find(|name| {
            Command::new(name)
                .arg("--version")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        })
        .ok_or_else(|| {
            Problem::Unavailable(
                "no C++17 compiler ($CXX, g++, c++ or clang++): install g++".into(),
            )
        })
}

/// A compiler building one driver.
struct DriverBuild {
    child: Child,
    what: String,
}

fn start_driver_build(
    compiler: &str,
    root: &Path,
    headers: &Path,
    generation: Generation,
    binary: &Path,
) -> Result<DriverBuild> {
    if let Some(dir) = binary.parent() {
        std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    }
    // LLVM's headers as system headers: their warnings are not ours to fail on.
    let mut flags = vec!["-U_FORTIFY_SOURCE".to_string()];
    flags.extend(match generation {
        // LLVM 18's client lives in libc's own tree and namespace.
        Generation::V0 => vec![
            "-DLLVM_RPC_18".to_string(),
            format!("-DLIBC_NAMESPACE={LIBC_NAMESPACE_18}"),
            "-isystem".to_string(),
            headers.join("libc").display().to_string(),
        ],
        Generation::V1 | Generation::V2 => vec![
            "-isystem".to_string(),
            headers.join("libc/shared").display().to_string(),
        ],
    });
    DriverBuild::start(
        compiler,
        &flags,
        &root.join("workloads/llvm-client/driver.cpp"),
        binary,
        format!(
            "{} ({compiler}, LLVM's headers from {})",
            binary.display(),
            headers.display()
        ),
    )
}

impl DriverBuild {
    /// Starts `compiler` on `source` with `flags` (before the source), to `binary`: C++17 at
    /// -O1 (the driver waits on rpc-serve, and -O2 doubles the build), every warning an error.
    fn start(
        compiler: &str,
        flags: &[String],
        source: &Path,
        binary: &Path,
        what: String,
    ) -> Result<DriverBuild> {
        let child = Command::new(compiler)
            .args([
                "-std=c++17",
                "-O1",
                "-Wall",
                "-Wextra",
                "-Werror",
                "-pthread",
            ])
            .args(flags)
            .arg(source)
            .arg("-o")
            .arg(binary)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("llvm-client: running {compiler}: {e}"))?;
        Ok(DriverBuild { child, what })
    }

    fn finish(mut self) -> Result {
        let mut complaints = String::new();
        if let Some(mut stderr) = self.child.stderr.take() {
            let _ = stderr.read_to_string(&mut complaints);
        }
        let status = self
            .child
            .wait()
            .map_err(|e| format!("llvm-client: waiting for the compiler: {e}"))?;
        if !status.success() {
            return Err(Failure::Failed(format!(
                "llvm-client: building {} failed ({status}):\n{complaints}",
                self.what
            )));
        }
        println!("llvm-client: built {}", self.what);
        Ok(())
    }
}

/// Starts building `workloads/llvm-client/dispatch.cpp` against LLVM's `rpc_dispatch.h`.
fn start_dispatch_build(
    compiler: &str,
    root: &Path,
    headers: &Path,
    binary: &Path,
) -> Result<DriverBuild> {
    DriverBuild::start(
        compiler,
        &[
            "-isystem".to_string(),
            headers.join("libc/shared").display().to_string(),
        ],
        &root.join("workloads/llvm-client/dispatch.cpp"),
        binary,
        format!(
            "{} ({compiler}, LLVM's rpc_dispatch.h from {})",
            binary.display(),
            headers.display()
        ),
    )
}

fn build_rpc_serve(root: &Path) -> Result<PathBuf> {
    succeed(
        Command::new(cargo())
            .current_dir(root)
            .args(["build", "--quiet", "-p", "rpc-serve"]),
        "llvm-client: cargo build of rpc-serve",
    )?;
    Ok(target_dir(root).join("debug/rpc-serve"))
}

// ---- LLVM 18's client as real GPU code ---------------------------------------------------

/// The two targets LLVM 18's GPU libc builds for: triple, clang flags, output name.
const GPU_TARGETS_18: &[(&str, &[&str], &str)] = &[
    (
        "nvptx64-nvidia-cuda",
        // PTX text (-S): what the CUDA plugin JIT-compiles; sm_90 needs PTX 7.8.
        &[
            "-march=sm_90",
            "-Xclang",
            "-target-feature",
            "-Xclang",
            "+ptx78",
            "-S",
        ],
        "rpc_client_18.ptx",
    ),
    (
        "amdgcn-amd-amdhsa",
        // A linked code object; clang 22 no longer defines the wavefront macro LLVM 18 reads.
        &[
            "-mcpu=gfx942",
            "-nogpulib",
            "-nostdlib",
            "-D__AMDGCN_WAVEFRONT_SIZE=64",
            "-fuse-ld=lld",
        ],
        "rpc_client_18.amdgcn",
    ),
];

/// LLVM 18's `libc/src/__support/RPC/rpc_client.cpp` (its `rpc::client` and the
/// `__llvm_libc_rpc_client` pointer to it) compiled by clang-22 for NVPTX and AMDGPU, then
/// read by `rpc-run --inspect`'s reader, which must call both LLVM 18 (v0). Skipped, saying
/// so, without clang-22 and ld.lld-22.
fn llvm18_gpu_objects(out: &Path, tree: &Path) -> Result {
    let missing: Vec<&str> = ["clang-22", "ld.lld-22"]
        .into_iter()
        .filter(|tool| !on_path(tool))
        .collect();
    let linker = std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|dir| dir.join("ld.lld-22"))
            .find(|p| p.is_file())
    });
    let (true, Some(linker)) = (missing.is_empty(), linker) else {
        println!(
            "llvm-client: LLVM 18 GPU objects SKIPPED: no {} (apt-get install clang-22 lld-22)",
            missing.join(", ")
        );
        return Ok(());
    };
    let dir = out.join("llvm18-gpu");
    std::fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    let libc = tree.join("libc");
    for (triple, flags, name) in GPU_TARGETS_18 {
        let object = dir.join(name);
        let output = Command::new("clang-22")
            .arg(format!("--target={triple}"))
            .args(*flags)
            .args([
                "-std=c++17",
                "-O2",
                "-ffreestanding",
                "-nostdlibinc",
                "-fno-exceptions",
            ])
            .args(["-fno-rtti", "-fvisibility=hidden"])
            .arg(format!("--ld-path={}", linker.display()))
            .arg(format!("-DLIBC_NAMESPACE={LIBC_NAMESPACE_18}"))
            .arg("-I")
            .arg(&libc)
            .arg("-I")
            .arg(libc.join("include"))
            .arg(libc.join("src/__support/RPC/rpc_client.cpp"))
            .arg("-o")
            .arg(&object)
            .output()
            .map_err(|e| format!("llvm-client: running clang-22: {e}"))?;
        if !output.status.success() {
            return Err(Failure::Failed(format!(
                "llvm-client: clang-22 --target={triple} of LLVM 18's rpc_client.cpp failed:\n{}",
                String::from_utf8_lossy(&output.stderr)
            )));
        }
        let bytes = read(&object).map_err(Failure::Failed)?;
        let inspection = rpc_run::image::inspect(&bytes)
            .map_err(|e| format!("llvm-client: inspecting {}: {e}", object.display()))?;
        let text = inspection.to_string();
        let client = text
            .lines()
            .find(|l| l.starts_with("client "))
            .unwrap_or("");
        if !matches!(
            inspection.client,
            rpc_run::image::Client::Known {
                generation: Generation::V0,
                ..
            }
        ) || inspection.client.llvm() != "LLVM 18"
        {
            return Err(Failure::Failed(format!(
                "llvm-client: {} (LLVM 18's client, {triple}) was not read as LLVM 18: {client}",
                object.display()
            )));
        }
        println!("llvm-client: LLVM 18's rpc_client.cpp for {triple}: {client}");
    }
    Ok(())
}

// ---- 3. one run --------------------------------------------------------------------------

/// A child killed and reaped if still running when dropped (a failed run leaves nothing).
struct Killing(Child);

impl Drop for Killing {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn lines_of(stream: impl Read + Send + 'static) -> Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stream)
            .lines()
            .map_while(std::io::Result::ok)
        {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

/// Waits for `child` to exit, failing after `bound` (a liveness bound: the exit is what counts).
fn wait_bounded(
    child: &mut Child,
    bound: Duration,
    what: &str,
) -> std::result::Result<std::process::ExitStatus, String> {
    let deadline = Instant::now() + bound;
    loop {
        if let Some(status) = child
            .try_wait()
            .map_err(|e| format!("waiting for {what}: {e}"))?
        {
            return Ok(status);
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "{what} did not finish within {} s (hung?)",
                bound.as_secs()
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn read(path: &Path) -> std::result::Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| format!("reading {}: {e}", path.display()))
}

/// One generation, one port count: returns the driver's summary and rpc-serve's statistics.
fn run_one(
    out: &Path,
    serve: &Path,
    driver: &Path,
    generation: Generation,
    ports: u32,
    threads: u32,
) -> std::result::Result<String, String> {
    let dir = out.join(format!("{generation}-p{ports}"));
    let _ = std::fs::remove_dir_all(&dir);
    let sandbox = dir.join("sandbox");
    let expect = dir.join("expect");
    for d in [&sandbox, &expect.join("files")] {
        std::fs::create_dir_all(d).map_err(|e| format!("creating {}: {e}", d.display()))?;
    }
    let stdin = dir.join("stdin.txt");
    std::fs::write(&stdin, STDIN).map_err(|e| format!("writing {}: {e}", stdin.display()))?;
    let layout = Layout::new(generation, ports, 1).map_err(|e| e.to_string())?;

    // rpc-serve: the sandbox is its working directory, the device's stdio go to files.
    let mut command = Command::new(serve);
    command
        .current_dir(&sandbox)
        .args([
            "--gen",
            &generation.to_string(),
            "--ports",
            &ports.to_string(),
        ])
        .args([
            "--lanes",
            "1",
            "--stdout",
            "../stdout.txt",
            "--stderr",
            "../stderr.txt",
        ])
        .stdin(std::fs::File::open(&stdin).map_err(|e| e.to_string())?);
    let mut serving = Serving::start(command, dir.join("rpc-serve.log"))?;
    if serving.bytes != layout.total_size().to_string() {
        return Err(format!(
            "rpc-serve's mailbox is {} bytes; rpc-core's Layout says {}",
            serving.bytes,
            layout.total_size()
        ));
    }

    let summary = serving.run_driver(driver, ports, "the driver", |command| {
        command
            .args([
                "--gen",
                &generation.to_string(),
                "--threads",
                &threads.to_string(),
            ])
            .arg("--expect")
            .arg(&expect)
            .arg("--stdin")
            .arg(&stdin)
    })?;
    let stopped = serving.stop(&[
        "errors=0",
        "unknown=0",
        "bad_headers=0",
        "panics=0",
        "abandoned=0",
    ])?;

    // The device's output, the files, the client object.
    for stream in ["stdout", "stderr"] {
        let actual = read(&dir.join(format!("{stream}.txt")))?;
        let serial = read(&expect.join(format!("{stream}.serial")))?;
        let per_thread = (0..threads)
            .map(|t| read(&expect.join(format!("{stream}.t{t}"))))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        compare_output(&actual, &serial, &per_thread)
            .map_err(|why| format!("rpc-serve's device {stream}: {why}"))?;
    }
    compare_files(&sandbox, &expect.join("files"))?;
    let object = read(&expect.join("client-object.bin"))?;
    let base: u64 = String::from_utf8_lossy(&read(&expect.join("client-object.base"))?)
        .trim()
        .parse()
        .map_err(|e| format!("client-object.base: {e}"))?;
    compare_client_object(&object, &layout.client_object(base), layout)?;
    let sizes = String::from_utf8_lossy(&read(&expect.join("allocation-sizes.txt"))?).into_owned();
    compare_allocation_sizes(&sizes, generation)?;

    Ok(format!(
        "{} rpc-serve {}",
        summary.join(" ").trim_start_matches("llvm-client: "),
        stopped
            .split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    ))
}

/// The typed calls: `rpc-serve --dispatch-tests` (v2, 3 ports, lane size 1) and the dispatch
/// driver, which calls every test function from one thread and then from [`THREADS`] at
/// once, each answer checked; then rpc-serve's statistics: every request served, none
/// refused or failed. Returns the driver's summary and rpc-serve's count.
fn run_dispatch(out: &Path, serve: &Path, driver: &Path) -> std::result::Result<String, String> {
    let dir = out.join("dispatch");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    let ports = 3;
    let mut command = Command::new(serve);
    command
        .current_dir(&dir)
        .args(["--gen", "v2", "--ports", &ports.to_string(), "--lanes", "1"])
        .arg("--dispatch-tests")
        .stdin(Stdio::null());
    let mut serving = Serving::start(command, dir.join("rpc-serve.log"))?;
    let summary = serving.run_driver(driver, ports, "the dispatch driver", |command| {
        command
            .args(["--threads", &THREADS.to_string()])
            .args(["--rounds", &DISPATCH_ROUNDS.to_string()])
    })?;
    // Eight calls per round, from one thread and then from each of THREADS.
    let calls = 8 * DISPATCH_ROUNDS * (1 + THREADS);
    serving.stop(&[
        &format!("served={calls}"),
        "errors=0",
        "refused=0",
        "unknown=0",
        "bad_headers=0",
        "panics=0",
        "abandoned=0",
    ])?;
    Ok(format!(
        "{} rpc-serve served={calls}",
        summary.join(" ").trim_start_matches("llvm-dispatch: ")
    ))
}

/// A running rpc-serve that said `ready PATH BYTES`: what the drivers of both runs need of it.
struct Serving {
    server: Killing,
    /// The rest of its stdout's lines.
    said: Receiver<String>,
    /// The mailbox's path and its size, as it said them.
    path: String,
    bytes: String,
    /// Its stderr (the log), quoted when something fails.
    log_path: PathBuf,
}

impl Serving {
    /// Starts `command` (rpc-serve with its arguments, directory and stdin), logging to
    /// `log_path`, and waits up to [`READY_BOUND`] for its ready line.
    fn start(mut command: Command, log_path: PathBuf) -> std::result::Result<Serving, String> {
        let log = std::fs::File::create(&log_path).map_err(|e| e.to_string())?;
        let mut server = Killing(
            command
                .env("RUST_LOG", "warn")
                .stdout(Stdio::piped())
                .stderr(log)
                .spawn()
                .map_err(|e| {
                    let serve = Path::new(command.get_program());
                    format!("starting {}: {e}", serve.display())
                })?,
        );
        let said = lines_of(server.0.stdout.take().expect("piped"));
        let ready = said
            .recv_timeout(READY_BOUND)
            .map_err(|_| format!("no ready line from rpc-serve; its log: {}", tail(&log_path)))?;
        let (path, bytes) = ready
            .strip_prefix("ready ")
            .and_then(|rest| rest.rsplit_once(' '))
            .ok_or_else(|| format!("not a ready line: {ready:?}"))?;
        Ok(Serving {
            server,
            said,
            path: path.to_string(),
            bytes: bytes.to_string(),
            log_path,
        })
    }

    /// Runs `driver MAILBOX --bytes B --ports N` with the arguments `more` adds, bounded by
    /// [`DRIVER_BOUND`]; returns its stdout's lines (the summary), or its stderr's and
    /// rpc-serve's log if it failed.
    fn run_driver(
        &self,
        driver: &Path,
        ports: u32,
        what: &str,
        more: impl FnOnce(&mut Command) -> &mut Command,
    ) -> std::result::Result<Vec<String>, String> {
        let mut command = Command::new(driver);
        command
            .arg(&self.path)
            .args(["--bytes", &self.bytes, "--ports", &ports.to_string()]);
        let mut client = Killing(
            more(&mut command)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .map_err(|e| format!("starting {}: {e}", driver.display()))?,
        );
        let client_out = lines_of(client.0.stdout.take().expect("piped"));
        let client_err = lines_of(client.0.stderr.take().expect("piped"));
        let status = wait_bounded(&mut client.0, DRIVER_BOUND, what)
            .map_err(|why| format!("{why}; rpc-serve's log: {}", tail(&self.log_path)))?;
        if !status.success() {
            let complaints: Vec<String> = client_err.iter().collect();
            return Err(format!(
                "the driver failed ({status}):\n  {}\nrpc-serve's log: {}",
                complaints.join("\n  "),
                tail(&self.log_path)
            ));
        }
        Ok(client_out.iter().collect())
    }

    /// Stops rpc-serve with SIGTERM (it flushes the device's output and prints its
    /// statistics), waits a bounded time for a clean exit and returns its `stopped: ...` line,
    /// which must hold each word of `clean`.
    fn stop(&mut self, clean: &[&str]) -> std::result::Result<String, String> {
        // SAFETY: kill has no memory-safety preconditions; the pid is our live child's.
        if unsafe { libc::kill(self.server.0.id() as i32, libc::SIGTERM) } != 0 {
            return Err(format!(
                "SIGTERM to rpc-serve: {}",
                std::io::Error::last_os_error()
            ));
        }
        let status = wait_bounded(&mut self.server.0, EXIT_BOUND, "rpc-serve after SIGTERM")?;
        if !status.success() {
            return Err(format!(
                "rpc-serve exited with {status}; its log: {}",
                tail(&self.log_path)
            ));
        }
        let stats: Vec<String> = self.said.iter().collect();
        let stopped = stats
            .into_iter()
            .find(|l| l.starts_with("stopped: "))
            .ok_or_else(|| "rpc-serve printed no statistics".to_string())?;
        for clean in clean {
            if !stopped.split_whitespace().any(|w| w == *clean) {
                return Err(format!(
                    "rpc-serve's statistics should say {clean}: {stopped}; its log: {}",
                    tail(&self.log_path)
                ));
            }
        }
        Ok(stopped)
    }
}

fn tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    let start = lines.len().saturating_sub(20);
    format!("{}:\n    {}", log.display(), lines[start..].join("\n    "))
}

/// `actual` must be `serial` and then the lines of every thread, each thread's in its order
/// (a thread's lines all start `tK `; the threads' lines interleave in any way).
fn compare_output(
    actual: &[u8],
    serial: &[u8],
    threads: &[Vec<u8>],
) -> std::result::Result<(), String> {
    if !actual.starts_with(serial) {
        let at = actual
            .iter()
            .zip(serial)
            .take_while(|(a, b)| a == b)
            .count();
        return Err(format!(
            "the single-threaded part differs at byte {at} of {}: expected {:?}, got {:?}",
            serial.len(),
            excerpt(serial, at),
            excerpt(actual, at)
        ));
    }
    let mut got: Vec<Vec<u8>> = vec![Vec::new(); threads.len()];
    for line in actual[serial.len()..].split_inclusive(|&b| b == b'\n') {
        let thread = line
            .strip_prefix(b"t")
            .and_then(|rest| rest.iter().position(|&b| b == b' ').map(|n| &rest[..n]))
            .and_then(|digits| std::str::from_utf8(digits).ok()?.parse::<usize>().ok())
            .filter(|&t| t < threads.len())
            .ok_or_else(|| {
                format!(
                    "a line no thread wrote: {:?}",
                    String::from_utf8_lossy(line)
                )
            })?;
        got[thread].extend_from_slice(line);
    }
    for (t, (got, want)) in got.iter().zip(threads).enumerate() {
        if got != want {
            let at = got.iter().zip(want).take_while(|(a, b)| a == b).count();
            return Err(format!(
                "thread {t}'s lines differ at byte {at} ({} bytes, expected {}): expected {:?}, \
                 got {:?}",
                got.len(),
                want.len(),
                excerpt(want, at),
                excerpt(got, at)
            ));
        }
    }
    Ok(())
}

fn excerpt(bytes: &[u8], at: usize) -> String {
    let end = (at + 60).min(bytes.len());
    String::from_utf8_lossy(&bytes[at.min(end)..end]).into_owned()
}

/// The sandbox holds exactly the expected files, with the expected bytes.
fn compare_files(sandbox: &Path, expected: &Path) -> std::result::Result<(), String> {
    let names = |dir: &Path| -> std::result::Result<Vec<String>, String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .map_err(|e| format!("listing {}: {e}", dir.display()))?
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        Ok(names)
    };
    let (have, want) = (names(sandbox)?, names(expected)?);
    if have != want {
        return Err(format!(
            "the sandbox holds {have:?}; the driver left {want:?}"
        ));
    }
    for name in want {
        if read(&sandbox.join(&name))? != read(&expected.join(&name))? {
            return Err(format!(
                "{name} in the sandbox differs from what the driver wrote"
            ));
        }
    }
    Ok(())
}

/// LLVM's `allocation_size` ("PORTS LANES BYTES" lines) against rpc-core's `Layout`.
fn compare_allocation_sizes(
    lines: &str,
    generation: Generation,
) -> std::result::Result<(), String> {
    let mut compared = 0;
    for line in lines.lines() {
        let numbers: Vec<u64> = line
            .split_whitespace()
            .map(|w| {
                w.parse()
                    .map_err(|e| format!("allocation-sizes.txt: {line:?}: {e}"))
            })
            .collect::<std::result::Result<_, _>>()?;
        let [ports, lanes, llvm] = numbers[..] else {
            return Err(format!(
                "allocation-sizes.txt: not PORTS LANES BYTES: {line:?}"
            ));
        };
        let layout =
            Layout::new(generation, ports as u32, lanes as u32).map_err(|e| e.to_string())?;
        if layout.total_size() as u64 != llvm {
            return Err(format!(
                "LLVM's allocation_size for {layout} is {llvm} bytes, rpc-core's Layout says {}",
                layout.total_size()
            ));
        }
        compared += 1;
    }
    if compared == 0 {
        return Err("allocation-sizes.txt lists no size".into());
    }
    Ok(())
}

/// LLVM's `rpc::Client(ports, base)` against rpc-core's client object for the same base.
fn compare_client_object(
    llvm: &[u8],
    ours: &[u8],
    layout: Layout,
) -> std::result::Result<(), String> {
    if llvm.len() != ours.len() {
        return Err(format!(
            "LLVM's client object is {} bytes, rpc-core's {} for {}",
            llvm.len(),
            ours.len(),
            layout.generation()
        ));
    }
    if let Some(at) = llvm.iter().zip(ours).position(|(a, b)| a != b) {
        let word = |bytes: &[u8]| {
            let start = at & !7;
            let mut w = [0u8; 8];
            w.copy_from_slice(&bytes[start..start + 8]);
            u64::from_le_bytes(w)
        };
        return Err(format!(
            "the client objects differ at byte {at}: LLVM's word there is {:#x}, rpc-core's \
             {:#x}",
            word(llvm),
            word(ours)
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstream_versions_drop_the_epoch_and_the_debian_revision() {
        assert_eq!(upstream_of("1:22.1.8-1"), "22.1.8");
        assert_eq!(upstream_of("1:23.1.1-2"), "23.1.1");
        assert_eq!(upstream_of("22.1.8"), "22.1.8");
    }

    #[test]
    fn output_is_the_serial_part_then_each_threads_lines_in_its_order() {
        let threads = [b"t0 a\nt0 b\n".to_vec(), b"t1 x\n".to_vec()];
        let ok = compare_output(b"S\0t0 a\nt1 x\nt0 b\n", b"S\0", &threads);
        assert_eq!(ok, Ok(()));
        // A thread's own lines out of order, a line nobody wrote, a lost line, a bad prefix.
        assert!(compare_output(b"S\0t0 b\nt1 x\nt0 a\n", b"S\0", &threads).is_err());
        assert!(compare_output(b"S\0t0 a\nt1 x\nt0 b\nt7 z\n", b"S\0", &threads).is_err());
        assert!(compare_output(b"S\0t0 a\nt0 b\n", b"S\0", &threads).is_err());
        assert!(compare_output(b"s\0t0 a\nt1 x\nt0 b\n", b"S\0", &threads).is_err());
        // A line split by another thread's write would not end where it should.
        assert!(compare_output(b"S\0t0 at1 x\n\nt0 b\n", b"S\0", &threads).is_err());
    }

    #[test]
    fn allocation_sizes_are_compared_with_the_layout() {
        let good = "1 1 192\n3 1 448\n512 64 2134016\n";
        assert_eq!(compare_allocation_sizes(good, Generation::V0), Ok(()));
        let why = compare_allocation_sizes("3 1 264\n", Generation::V0).unwrap_err();
        assert!(why.contains("264 bytes"), "{why}");
        assert_eq!(
            compare_allocation_sizes("3 1 264\n", Generation::V1),
            Ok(())
        );
        assert!(compare_allocation_sizes("", Generation::V1).is_err());
        assert!(compare_allocation_sizes("3 1\n", Generation::V1).is_err());
    }

    #[test]
    fn client_objects_are_compared_byte_for_byte() {
        let layout = Layout::new(Generation::V1, 3, 1).unwrap();
        let ours = layout.client_object(0x7f00_0000_0000);
        assert_eq!(compare_client_object(&ours, &ours, layout), Ok(()));
        let mut other = ours.clone();
        other[8 + 3] ^= 1;
        let why = compare_client_object(&other, &ours, layout).unwrap_err();
        assert!(why.contains("byte 11"), "{why}");
        assert!(compare_client_object(&ours[..100], &ours, layout).is_err());
    }
}

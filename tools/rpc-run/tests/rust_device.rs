//! Rust programs built with `rpc-device` for the host (native images: `cdylib`s of this
//! machine) run under rpc-run on the host plugin through the real server: every lane prints,
//! allocates from the host's MALLOC, the status is `main`'s or `exit`'s, and a panic's message
//! and `file:line` reach stderr before the program aborts.

use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

/// The examples' shared objects, built once (a nested `cargo build` into this test's target
/// folder: the outer build has ended, so its lock is free).
fn examples() -> &'static Path {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| {
        // target/<profile>/deps/rust_device-HASH
        let exe = std::env::current_exe().unwrap();
        let target = exe.ancestors().nth(3).unwrap().to_path_buf();
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let status = Command::new(cargo)
            .args(["build", "-p", "rpc-device", "--examples", "--target-dir"])
            .arg(&target)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .status()
            .unwrap();
        assert!(status.success(), "building rpc-device's examples: {status}");
        target.join("debug/examples")
    })
}

fn rpc_run(args: &[&str]) -> Output {
    let output = Command::new(env!("CARGO_BIN_EXE_rpc-run"))
        .args(args)
        .output()
        .unwrap();
    eprintln!("stderr: {}", String::from_utf8_lossy(&output.stderr));
    output
}

fn image(name: &str) -> String {
    examples()
        .join(format!("lib{name}.so"))
        .to_string_lossy()
        .into_owned()
}

fn sorted_lines(bytes: &[u8]) -> Vec<String> {
    let mut lines: Vec<String> = String::from_utf8_lossy(bytes)
        .lines()
        .map(str::to_owned)
        .collect();
    lines.sort();
    lines
}

#[test]
fn inspect_reads_a_rust_host_image_as_a_c_one() {
    let output = rpc_run(&["--inspect", &image("hello")]);
    assert!(output.status.success());
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(text.contains("image format=host plugin=host"), "{text}");
    assert!(
        text.contains("client symbol=__llvm_rpc_client size=2096 generation=v2"),
        "{text}"
    );
    for kernel in ["_begin", "_start", "_end"] {
        assert!(text.contains(&format!("kernel name={kernel} ")), "{text}");
    }
}

#[test]
fn every_lane_prints_its_formatted_line_and_main_gives_the_status() {
    let output = rpc_run(&["--threads", "4", &image("hello"), "one", "--two"]);
    assert_eq!(output.status.code(), Some(3));
    let expected = [
        "arguments: [\"one\", \"--two\"]",
        "hello from thread  0 of block 0: 1 squares, the last Some(0), sum 0x0",
        "hello from thread  1 of block 0: 2 squares, the last Some(1), sum 0x1",
        "hello from thread  2 of block 0: 3 squares, the last Some(4), sum 0x5",
        "hello from thread  3 of block 0: 4 squares, the last Some(9), sum 0xe",
    ];
    assert_eq!(sorted_lines(&output.stdout), expected);
}

/// Typed calls from Rust, served by the same Rust functions as LLVM 23's `rpc::dispatch` from
/// C++ (`rpc-run --dispatch-tests`): a value, a span the host fills, a pointer it rewrites and
/// a C string, each lane with its own arguments and results, 32 and then 40 lanes (two warps).
#[test]
fn rust_kernels_make_typed_calls_lane_by_lane() {
    for threads in [32u32, 40] {
        let threads_arg = threads.to_string();
        let output = rpc_run(&[
            "--dispatch-tests",
            "--threads",
            &threads_arg,
            &image("hello"),
            "typed",
        ]);
        assert_eq!(output.status.code(), Some(3));
        let lines = sorted_lines(&output.stdout);
        for t in 0..threads {
            let v = t * 10;
            let line = format!(
                "thread {t} typed: add {}, fill 4 [{v}, {}, {}, {}], negate -{}, length 5",
                u64::from(t) + 40,
                v + 1,
                v + 2,
                v + 3,
                t + 1
            );
            assert!(lines.contains(&line), "{line} in {lines:?}");
        }
    }
}

#[test]
fn warps_of_several_blocks_share_the_ports() {
    // Two blocks of two warps (32 lanes) and a partial one: five host threads at once.
    let output = rpc_run(&["--threads", "70", "--blocks", "2", &image("hello")]);
    assert_eq!(output.status.code(), Some(3));
    let lines = sorted_lines(&output.stdout);
    assert_eq!(lines.len(), 2 * 70 + 2, "{lines:?}");
    for block in 0..2 {
        for thread in 0..70u32 {
            let sum: u32 = (0..=thread).map(|i| i * i).sum();
            let line = format!(
                "hello from thread {thread:>2} of block {block}: {} squares, the last Some({}), \
                 sum {sum:#x}",
                thread + 1,
                thread * thread
            );
            assert!(lines.contains(&line), "{line}");
        }
    }
}

#[test]
fn each_lane_writes_seeks_and_reads_back_its_own_file() {
    let dir = std::env::temp_dir().join(format!("rpc-device-files-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_rpc-run"))
        .args(["--threads", "3", "--blocks", "2", &image("hello")])
        .env("RPC_DEVICE_HELLO_DIR", &dir)
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(3));
    let lines = sorted_lines(&output.stdout);
    for block in 0..2 {
        for thread in 0..3 {
            let text = format!("thread {thread} of block {block} was here");
            let line = format!(
                "thread {thread} of block {block} read back {text:?} of {} bytes",
                text.len()
            );
            assert!(lines.contains(&line), "{line} in {lines:?}");
            let renamed = format!("thread {thread} of block {block} renamed and removed");
            assert!(lines.contains(&renamed), "{renamed} in {lines:?}");
            let file = |ending| dir.join(format!("thread-{block}-{thread}.{ending}"));
            assert_eq!(std::fs::read_to_string(file("txt")).unwrap(), text);
            assert!(!file("tmp").exists() && !file("gone").exists());
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_thread_reads_the_hosts_stdin_to_its_end() {
    use std::io::Write;
    let mut run = Command::new(env!("CARGO_BIN_EXE_rpc-run"))
        .args(["--threads", "2", &image("hello"), "stdin"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // More than one read's 16 bytes, so the loop reads piece by piece up to the end.
    let input = "one line\nand another, longer line\n";
    run.stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let output = run.wait_with_output().unwrap();
    assert_eq!(output.status.code(), Some(3));
    let line = format!("stdin gave {} bytes: {input:?}", input.len());
    assert!(sorted_lines(&output.stdout).contains(&line), "{line}");
}

#[test]
fn a_line_longer_than_the_devices_buffer_arrives_in_full() {
    let output = Command::new(env!("CARGO_BIN_EXE_rpc-run"))
        .args(["--threads", "1", &image("hello")])
        .env("RPC_DEVICE_HELLO_LONG", "1")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(3));
    let long = format!("0{}", "-".repeat(999));
    assert!(sorted_lines(&output.stdout).contains(&long));
}

#[test]
fn exit_ends_the_program_with_its_status() {
    let output = rpc_run(&["--threads", "2", &image("hello"), "exit"]);
    assert_eq!(output.status.code(), Some(4));
}

#[test]
fn a_panic_reaches_stderr_with_its_place_and_aborts() {
    let output = rpc_run(&["--threads", "2", &image("panic")]);
    // rpc-run serves ABORT as LLVM's loader does: the process aborts.
    assert_eq!(
        output.status.signal(),
        Some(libc::SIGABRT),
        "{:?}",
        output.status
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("thread 1 of block 0 panicked at rpc-device/examples/panic.rs:20:9:\nthread 1 looked for a value and found None"),
        "{stderr}"
    );
    assert!(String::from_utf8_lossy(&output.stdout).contains("thread 0 before the panic"));
}

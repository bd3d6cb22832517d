//! The `rpc-run` binary as a user meets it: each failure class exits with its own code and a
//! clear message (each run under `workloads::bounded`'s address-space limit and hang guard),
//! and `--inspect` reads the real images `cargo xtask gpu-images` built.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use workloads::bounded;

fn rpc_run(args: &[&str]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_rpc-run"));
    command.args(args).env_remove("RUST_LOG");
    bounded::output(command)
}

fn scratch(name: &str, text: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

fn ptx(client: &str, kernels: &[&str]) -> String {
    let mut text = format!(".version 7.8\n.target sm_90\n.address_size 64\n{client}\n");
    for k in kernels {
        text.push_str(&format!(".visible .entry {k}()\n{{\nret;\n}}\n"));
    }
    text
}

fn expect(output: &Output, code: i32, says: &str) {
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(code), "stderr: {stderr}");
    assert!(stderr.contains(says), "expected {says:?} in: {stderr}");
}

#[test]
fn every_failure_class_exits_with_its_own_code_and_says_why() {
    expect(
        &rpc_run(&["--bogus", "x"]),
        64,
        "unexpected argument '--bogus'",
    );
    expect(&rpc_run(&[]), 64, "<IMAGE>");
    expect(
        &rpc_run(&["/nonexistent/image"]),
        66,
        "cannot read the image",
    );
    let text = scratch("not-an-image.txt", "hello\n");
    expect(&rpc_run(&[text.to_str().unwrap()]), 65, "not a GPU image");
    let client = ".visible .global .align 8 .b8 __llvm_rpc_client[552];";
    let no_start = scratch("no-start.ptx", &ptx(client, &["_begin", "_end"]));
    expect(
        &rpc_run(&[no_start.to_str().unwrap()]),
        67,
        "no `_start` kernel",
    );
    let odd = ".visible .global .align 8 .b8 __llvm_rpc_client[600];";
    let unknown = scratch("unknown.ptx", &ptx(odd, &["_begin", "_start", "_end"]));
    expect(
        &rpc_run(&[unknown.to_str().unwrap()]),
        68,
        "unknown RPC generation",
    );
    let wrong = scratch(
        "wrong-plugin.ptx",
        &ptx(client, &["_begin", "_start", "_end"]),
    );
    expect(
        &rpc_run(&["--plugin", "amdgpu", wrong.to_str().unwrap()]),
        65,
        "PTX text cannot run on the amdgpu plugin (it runs on cuda)",
    );
}

#[test]
fn help_exits_0_and_names_every_flag() {
    bounded::assert_help_names(
        env!("CARGO_BIN_EXE_rpc-run"),
        &[
            "--plugin",
            "--threads ",
            "--blocks ",
            "--threads-x",
            "--threads-y",
            "--threads-z",
            "--blocks-x",
            "--blocks-y",
            "--blocks-z",
            "--device",
            "--timeout",
            "--inspect",
            "--devices",
            "--json",
            "--help",
            "IMAGE",
            "ARGS",
            "64 usage, 65 bad image",
        ],
    );
}

#[test]
fn devices_lists_each_plugin_or_why_it_has_none() {
    let output = rpc_run(&["--devices"]);
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    let text = String::from_utf8_lossy(&output.stdout);
    let names: Vec<&str> = text.lines().filter_map(|l| l.split(": ").next()).collect();
    assert_eq!(names, ["host", "cuda", "amdgpu"], "{text}");
    assert!(text.starts_with("host: 1 device (cpu0: L=32"), "{text}");
    let output = rpc_run(&["--devices", "--json", "--plugin", "host"]);
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(text.starts_with(r#"[{"detail":"cpu0: L=32"#), "{text}");
    expect(&rpc_run(&["--json", "a"]), 64, "--json is for --devices");
}

#[test]
fn numbers_out_of_range_are_usage_errors_that_name_the_range() {
    let counts = "from 1 to 4294967295";
    let cases: [(&[&str], &str); 7] = [
        (&["--threads", "99999999999", "a"], counts),
        (&["--blocks", "1,0", "a"], counts),
        (&["--blocks-y", "-1", "a"], counts),
        (&["--timeout", "1e300", "a"], "seconds from 0.001 to 604800"),
        (&["--timeout", "2^64", "a"], "seconds from 0.001 to 604800"),
        (
            &["--timeout", "99999999999999999999", "a"],
            "seconds from 0.001 to 604800",
        ),
        (&["--device", "1024", "a"], "from 0 to 1023"),
    ];
    for (args, says) in cases {
        let output = rpc_run(args);
        expect(&output, 64, says);
        assert!(
            String::from_utf8_lossy(&output.stderr).contains("Usage: rpc-run"),
            "{args:?}"
        );
    }
}

#[test]
fn only_a_regular_file_is_read_and_only_one() {
    expect(
        &rpc_run(&["--inspect", "/dev/zero"]),
        66,
        "/dev/zero: not a regular file (a character device)",
    );
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    expect(
        &rpc_run(&["--inspect", dir.to_str().unwrap()]),
        66,
        "not a regular file (a directory)",
    );
    // A FIFO nobody writes: opening it must not wait, reading it must not start.
    let fifo = dir.join("image.fifo");
    let _ = std::fs::remove_file(&fifo);
    let path = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: `path` is a NUL-terminated string that lives across the call.
    assert_eq!(unsafe { libc::mkfifo(path.as_ptr(), 0o600) }, 0);
    expect(
        &rpc_run(&["--inspect", fifo.to_str().unwrap()]),
        66,
        "not a regular file (a FIFO)",
    );
    let client = ".visible .global .align 8 .b8 __llvm_rpc_client[552];";
    let image = scratch("one.ptx", &ptx(client, &["_start"]));
    let image = image.to_str().unwrap();
    expect(
        &rpc_run(&["--inspect", image, image]),
        64,
        "'--inspect' cannot be used with",
    );
}

#[test]
fn an_image_past_the_bound_is_refused_and_the_magic_is_read_first() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    // Sparse files: no disk, and reading either whole would pass the address-space limit.
    let huge = dir.join("huge.ptx");
    let file = std::fs::File::create(&huge).unwrap();
    file.set_len((1 << 30) + 1).unwrap();
    expect(
        &rpc_run(&["--inspect", huge.to_str().unwrap()]),
        65,
        "1073741825 bytes, more than an image may have (1073741824 bytes, 1 GiB)",
    );
    let zeros = dir.join("zeros.bin");
    let file = std::fs::File::create(&zeros).unwrap();
    file.set_len(1 << 30).unwrap();
    expect(&rpc_run(&[zeros.to_str().unwrap()]), 65, "not a GPU image");
    std::fs::remove_file(&huge).unwrap();
    std::fs::remove_file(&zeros).unwrap();
}

#[test]
fn a_truncated_ptx_is_a_bad_image() {
    let client = ".visible .global .align 8 .b8 __llvm_rpc_client[552];";
    let whole = ptx(client, &["_begin", "_start", "_end"]);
    let cases = [
        (
            whole.find("_start()").unwrap() + 8,
            "ends inside `.entry _start`",
        ),
        (whole.find("[552]").unwrap() + 3, "has no end"),
        (whole.find(".target").unwrap(), "no `.target` directive"),
    ];
    for (at, says) in cases {
        let image = scratch("truncated.ptx", &whole[..at]);
        expect(&rpc_run(&["--inspect", image.to_str().unwrap()]), 65, says);
        expect(&rpc_run(&[image.to_str().unwrap()]), 65, says);
    }
}

/// Where this machine has a CUDA driver the run gets further; here it must be "no device".
#[test]
fn a_valid_image_without_a_gpu_is_no_device() {
    if Path::new("/dev/nvidia0").exists() {
        eprintln!("skipped: this machine has an NVIDIA GPU");
        return;
    }
    let client = ".visible .global .align 8 .b8 __llvm_rpc_client[552];";
    let image = scratch("valid.ptx", &ptx(client, &["_begin", "_start", "_end"]));
    expect(
        &rpc_run(&["--timeout", "60", image.to_str().unwrap()]),
        69,
        "no GPU to run on",
    );
}

#[test]
fn inspect_prints_the_generation_and_kernels() {
    // LLVM 19's client: the pointer to its 552-byte `rpc::client`.
    let client = ".global .align 8 .b8 _ZN19__llvm_libc_19_1_7_3rpc6clientE[552];\n.visible \
                  .global .align 8 .u64 __llvm_libc_rpc_client;";
    let image = scratch("llvm19.ptx", &ptx(client, &["_begin", "_start", "_end"]));
    let output = rpc_run(&["--inspect", image.to_str().unwrap()]);
    assert!(output.status.success());
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(
        text.starts_with("image format=ptx plugin=cuda target=sm_90 version=7.8\n"),
        "{text}"
    );
    assert!(
        text.contains("client symbol=__llvm_libc_rpc_client size=8 generation=v1 opcodes=16-bit"),
        "{text}"
    );
    assert!(text.contains("kernel name=_end kernarg=0"), "{text}");
}

/// The images `cargo xtask gpu-images` built (LLVM 22's GPU libc tests and our hello world),
/// if it has run on this machine: each is read as LLVM 22's v1 client with the start kernels.
/// The xtask checks them in more depth (against llvm-readelf).
#[test]
fn inspect_reads_the_built_gpu_images() {
    let images = common::built_gpu_images(None);
    for path in &images {
        let output = rpc_run(&["--inspect", path.to_str().unwrap()]);
        let text = String::from_utf8_lossy(&output.stdout);
        assert!(output.status.success(), "{}: {output:?}", path.display());
        assert!(
            text.contains("client symbol=__llvm_rpc_client size=552 generation=v1"),
            "{}: {text}",
            path.display()
        );
        for kernel in ["_begin", "_start", "_end"] {
            assert!(
                text.contains(&format!("kernel name={kernel} ")),
                "{}: {text}",
                path.display()
            );
        }
    }
    eprintln!("read {} built images", images.len());
}

/// A `libplugin_cuda.so` in `RPC_PLUGIN_PATH` is the plugin rpc-run uses (here one of another
/// ABI version, built with `cc`, so the run says the loader refused it).
#[test]
fn a_plugin_library_in_rpc_plugin_path_is_the_one_used() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("plugin-path");
    std::fs::create_dir_all(&dir).unwrap();
    let source =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../plugin-loader/tests/c/bad_version.c");
    let status = Command::new("cc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(dir.join("libplugin_cuda.so"))
        .arg(source)
        .status()
        .expect("cc runs");
    assert!(status.success());
    let client = ".visible .global .align 8 .b8 __llvm_rpc_client[552];";
    let image = scratch("loaded.ptx", &ptx(client, &["_begin", "_start", "_end"]));
    let mut command = Command::new(env!("CARGO_BIN_EXE_rpc-run"));
    command
        .arg(&image)
        .env("RPC_PLUGIN_PATH", &dir)
        .env_remove("RUST_LOG");
    let output = bounded::output(command);
    expect(
        &output,
        69,
        "libplugin_cuda.so: plugin ABI version 999, but this loader speaks version 2",
    );
}

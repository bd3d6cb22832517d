//! rpc-bench's command line, as a user meets it: `--help` names every flag and exits 0; a
//! `--park-us` outside `cargo xtask bench`'s range is refused with the range, exit 2, before
//! anything is measured, and a `--requests-only` port count that is no shape with the shapes;
//! the floor's hidden `floor-serve` says ready on a mailbox file and refuses what does not fit;
//! each run under `workloads::bounded`'s address-space limit and hang guard.

use workloads::bounded;

const BENCH: &str = env!("CARGO_BIN_EXE_rpc-bench");

#[test]
fn help_exits_0_and_names_every_flag() {
    bounded::assert_help_names(
        BENCH,
        &[
            "--quick",
            "--float",
            "--latency-only",
            "--stream-only",
            "--printf-only",
            "--pipelined-only",
            "--idle-only",
            "--requests-only",
            "--park-us",
            "--rpc-serve",
            "--peer-v1",
            "--peer-v2",
            "--out",
        ],
    );
}

#[test]
fn park_us_out_of_its_range_is_refused_naming_the_range() {
    for bad in ["0", "4294967296", "1000001"] {
        let out = bounded::run(
            BENCH,
            &["--park-us", bad, "--out", "/nonexistent/never-written"],
        );
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{bad}: {stderr}");
        assert!(stderr.contains("1..=1000000"), "{bad}: {stderr}");
        assert!(out.stdout.is_empty(), "nothing measured");
    }
}

/// `--requests-only N K` takes only a shape of the round-trip rows, and says which.
#[test]
fn requests_only_refuses_a_port_count_that_is_no_shape_naming_the_shapes() {
    let out = bounded::run(
        BENCH,
        &[
            "--requests-only",
            "100",
            "5",
            "--out",
            "/nonexistent/never-written",
        ],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("N is one of 64, 1024, 4096, 16384, not 100"),
        "{stderr}"
    );
    assert!(out.stdout.is_empty(), "nothing measured");
}

/// The hidden `floor-serve` (the floor's process, which the bench starts from its own binary):
/// on a mailbox file of the layout it says it is ready, naming the file and its size, and
/// answers until ended; a port the layout does not have, or a file of another size, is
/// refused, exit 1, naming it.
#[test]
fn floor_serve_says_ready_on_a_mailbox_file_and_refuses_a_port_or_file_that_does_not_fit() {
    use std::io::BufRead;
    let dir = std::env::temp_dir().join(format!("rpc-bench-cli-floor-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("mailbox");
    let bytes = rpc_core::protocol::Layout::new(rpc_core::protocol::Generation::V1, 64, 1)
        .unwrap()
        .total_size();
    std::fs::File::create(&file)
        .unwrap()
        .set_len(bytes as u64)
        .unwrap();
    let path = file.to_str().unwrap();
    let args = |port: &'static str| {
        let file = ["floor-serve", "--file", path];
        let layout = ["--gen", "v1", "--ports", "64", "--lanes", "1"];
        [&file[..], &layout[..], &["--port", port]].concat()
    };

    let mut floor = std::process::Command::new(BENCH)
        .args(args("63"))
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(floor.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    floor.kill().unwrap();
    floor.wait().unwrap();
    assert_eq!(line, format!("ready {path} {bytes}\n"));

    let out = bounded::run(BENCH, &args("64"));
    let (code, stdout, stderr) = bounded::texts(&out);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("port 64 of 64"), "{stderr}");
    assert!(stdout.is_empty(), "never ready");

    std::fs::File::options()
        .write(true)
        .open(&file)
        .unwrap()
        .set_len(bytes as u64 + 1)
        .unwrap();
    let out = bounded::run(BENCH, &args("63"));
    let (code, stdout, stderr) = bounded::texts(&out);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!("{} bytes, not {bytes}", bytes + 1)),
        "{stderr}"
    );
    assert!(stdout.is_empty(), "never ready");
    let _ = std::fs::remove_dir_all(&dir);
}

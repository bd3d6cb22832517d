//! rpc-bench's command line, as a user meets it: `--help` names every flag and exits 0; a
//! `--park-us` outside `cargo xtask bench`'s range is refused with the range, exit 2, before
//! anything is measured, and a `--requests-only` port count that is no shape with the shapes;
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

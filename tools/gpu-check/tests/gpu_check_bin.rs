//! `cuda-gpu-check` without a GPU: says why and exits 69 (the kit reports a skip), never
//! panics; bad arguments exit 2.

use workloads::bounded;

const CHECK: &str = env!("CARGO_BIN_EXE_cuda-gpu-check");

/// Runs cuda-gpu-check under `workloads::bounded`'s address-space limit and hang guard.
fn check(args: &[&str]) -> (Option<i32>, String, String) {
    bounded::texts(&bounded::run(CHECK, args))
}

#[test]
fn without_a_device_it_says_why_and_exits_69() {
    let (code, stdout, stderr) = check(&["/nonexistent/rpc_client.ptx", "--quick"]);
    if !stdout.starts_with("cuda: 0 devices (") {
        eprintln!("skipped: this machine has a CUDA device ({stdout})");
        return;
    }
    assert_eq!(code, Some(69), "{stdout}{stderr}");
    assert!(
        stdout.contains("gpu-check: SKIP: no CUDA device to check"),
        "{stdout}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn bad_arguments_exit_2_with_the_message_and_the_usage() {
    for (args, says) in [
        (&[][..], "<PTX>"),
        (&["a.ptx", "--iterations-many", "0"], "from 1 to 100000000"),
        (
            &["a.ptx", "--iterations-1warp", "99999999999999999999"],
            "from 1 to 100000000",
        ),
        (
            &["a.ptx", "--timeout-s", "-1"],
            "whole seconds from 1 to 86400",
        ),
        (&["a.ptx", "b.ptx"], "unexpected argument 'b.ptx'"),
        (&["--bogus"], "unexpected argument '--bogus'"),
    ] {
        let (code, _, stderr) = check(args);
        assert_eq!(code, Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
        assert!(stderr.contains("Usage: cuda-gpu-check"), "{stderr}");
    }
}

#[test]
fn help_exits_0_and_names_every_flag() {
    bounded::assert_help_names(
        CHECK,
        &[
            "PTX",
            "--quick",
            "--iterations-1warp",
            "--iterations-many",
            "--timeout-s",
        ],
    );
}

//! The demo binary as a user runs it.

use std::process::Command;

use workloads::bounded;

fn demo(args: &[&str]) -> (Option<i32>, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_rpc-demo"))
        .args(args)
        .env("RUST_LOG", "error")
        .output()
        .unwrap();
    bounded::texts(&out)
}

#[test]
fn the_host_demo_runs_every_service_and_reports_statistics() {
    let (code, stdout, stderr) = demo(&[]);
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    let lines_with = |text: &str| stdout.lines().filter(|l| l.contains(text)).count();
    assert_eq!(lines_with("hello from a CPU warp"), 16, "{stdout}");
    assert_eq!(lines_with("(aligned to its size: yes)"), 4, "{stdout}");
    for line in [
        "block 1 lane 7: hello from a CPU warp, 15 squared is 225",
        "file: read back written by a kernel, 42!",
        "typed: lane 2: count_up(\"lane 2\") = 3, span 6,7,8",
        "refused: fopen outside the demo directory returned 0",
        "refused=2",
        "live allocations after the program: 0",
    ] {
        assert!(stdout.contains(line), "{line:?} in {stdout}");
    }
}

#[test]
fn json_makes_the_statistics_line_json() {
    let (code, stdout, stderr) = demo(&["--json"]);
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    let last = stdout.lines().last().unwrap();
    let stats: serde_json::Value = serde_json::from_str(last).unwrap();
    assert_eq!(stats["refused"], 2, "{last}");
    assert_eq!(stats["panics"], 0, "{last}");
    assert!(
        stats["served"]["PRINTF_TO_STDOUT"].as_u64().unwrap() > 0,
        "{last}"
    );
    assert_eq!(
        stats["served"]["0x75000001"], 2,
        "the custom opcode, by number: {last}"
    );
    assert_eq!(
        stats["total_served"],
        stats["served"]
            .as_object()
            .unwrap()
            .values()
            .map(|n| n.as_u64().unwrap())
            .sum::<u64>()
    );
    assert!(
        !stdout.contains("refused=2"),
        "no text statistics line: {stdout}"
    );
}

#[test]
fn gpu_plugins_without_a_device_say_why_and_fail() {
    for plugin in ["cuda", "amdgpu"] {
        let (code, stdout, stderr) = demo(&["--plugin", plugin]);
        assert_eq!(code, Some(1), "{stdout}\n{stderr}");
        // Either no device (with the reason), or a device but no image to run.
        assert!(
            stderr.contains(&format!("no {plugin} device: "))
                || stderr.contains("pass --image FILE"),
            "{stderr}"
        );
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
}

/// `rpc-demo ARGS` under `workloads::bounded`'s address-space limit and hang guard.
fn bounded_demo(args: &[&str]) -> (Option<i32>, String, String) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_rpc-demo"));
    command.args(args).env("RUST_LOG", "error");
    bounded::texts(&bounded::output(command))
}

#[test]
fn help_exits_0_and_names_every_flag() {
    bounded::assert_help_names(
        env!("CARGO_BIN_EXE_rpc-demo"),
        &[
            "Usage: rpc-demo",
            "--plugin",
            "--image",
            "--kernel",
            "--json",
            "--help",
            "host, cuda, amdgpu",
        ],
    );
}

#[test]
fn bad_arguments_exit_2_with_the_message_and_the_usage() {
    for (bad, says) in [
        (
            &["--plugin"][..],
            "a value is required for '--plugin <PLUGIN>'",
        ),
        (
            &["--plugin", "nope"],
            "invalid value 'nope' for '--plugin <PLUGIN>'",
        ),
        (
            &["--plugin", "tpu"],
            "[possible values: host, cuda, amdgpu]",
        ),
        (&["--frob"], "unexpected argument '--frob'"),
        (
            &["--plugin", "host", "--image", "x.o"],
            "--image and --kernel are for the cuda",
        ),
        (&["--image", "x.o"], "--image and --kernel are for the cuda"),
        (&["--kernel", "main"], "--image <FILE>"),
        (&["stray"], "unexpected argument 'stray'"),
        (&["--json", "--json"], "cannot be used multiple times"),
    ] {
        let (code, _, stderr) = bounded_demo(bad);
        assert_eq!(code, Some(2), "{bad:?}: {stderr}");
        assert!(stderr.contains(says), "{bad:?}: {stderr}");
        assert!(stderr.contains("Usage: rpc-demo"), "{bad:?}: {stderr}");
    }
}

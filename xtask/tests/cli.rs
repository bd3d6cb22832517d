//! `cargo xtask` as a user meets it, run as a process under `workloads::bounded`'s
//! address-space limit and hang guard: `--help` of every command in README.md exits 0 and
//! names the flags README names; bad command lines exit 2 with what is wrong and the usage.
//! Only command lines that end before any build or run are used.

use std::path::Path;
use std::process::{Command, Output};

#[path = "../src/readme.rs"]
mod readme;

fn xtask(args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String, String) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_xtask"));
    command.args(args).envs(env.iter().copied());
    let Output {
        status,
        stdout,
        stderr,
    } = workloads::bounded::output(command);
    (
        status.code(),
        String::from_utf8_lossy(&stdout).into_owned(),
        String::from_utf8_lossy(&stderr).into_owned(),
    )
}

#[test]
fn help_of_xtask_and_of_every_command_exits_0_and_names_its_flags() {
    let commands = readme::commands(&Path::new(env!("CARGO_MANIFEST_DIR")).join(".."));
    assert!(commands.len() >= 16, "{commands:?}");
    for help in [&["--help"][..], &["-h"], &["help"]] {
        let (code, stdout, stderr) = xtask(help, &[]);
        assert_eq!(code, Some(0), "{help:?}: {stderr}");
        for (name, _) in &commands {
            assert!(
                stdout.contains(&format!("  {name} ")),
                "{name} not in: {stdout}"
            );
        }
    }
    for (name, flags) in &commands {
        for help in ["--help", "-h"] {
            let (code, stdout, stderr) = xtask(&[name, help], &[]);
            assert_eq!(code, Some(0), "{name} {help}: {stderr}");
            assert!(
                stdout.contains(&format!("Usage: cargo xtask {name}")),
                "{stdout}"
            );
            for flag in flags.iter().map(String::as_str).chain(["--help"]) {
                assert!(stdout.contains(flag), "{name}: {flag} not in: {stdout}");
            }
        }
    }
    // Where `cargo xtask build` puts the plugins' libraries, as it does.
    let (_, build, _) = xtask(&["help", "build"], &[]);
    assert!(build.contains("target/plugins/PLUGIN/debug/"), "{build}");
    assert!(!build.contains("target/plugins/lib"), "{build}");
}

/// A usage error: exit status 2, the message saying `says`, then the command's usage.
fn expect_usage_error(args: &[&str], env: &[(&str, &str)], says: &str) {
    let (code, _, stderr) = xtask(args, env);
    assert_eq!(code, Some(2), "{args:?}: {stderr}");
    assert!(stderr.contains(says), "{args:?}: {stderr}");
    let usage = match args[0] {
        "frob" => "Usage: cargo xtask <COMMAND>".to_string(),
        command => format!("Usage: cargo xtask {command}"),
    };
    assert!(stderr.contains(&usage), "{args:?}: {stderr}");
}

#[test]
fn bad_command_lines_exit_2_with_what_is_wrong_and_the_usage() {
    let cases: [(&[&str], &str); 8] = [
        (&["stress", "--threads", "99999999999"], "from 1 to 256"),
        (&["bench", "--park-us", "0"], "from 1 to 1000000"),
        (
            &["llvm-client", "--gen", "v9"],
            "[possible values: v0, v1, v2]",
        ),
        (&["tidy", "--frob"], "unexpected argument '--frob'"),
        (&["gpu-images", "extra"], "unexpected argument 'extra'"),
        (&["run"], "RPC-RUN-ARGS"),
        (&["frob"], "unrecognized subcommand 'frob'"),
        (
            &["demo", "--image", "x"],
            "--image and --kernel are for the cuda",
        ),
    ];
    for (args, says) in cases {
        expect_usage_error(args, &[], says);
    }
    // Checked before the stress starts.
    let seed = [("RPC_STRESS_SEED", "banana")];
    expect_usage_error(&["stress"], &seed, "RPC_STRESS_SEED wants a whole number");
}

//! rpc-serve's command line: `--help` and `-h` exit 0 and name every flag; usage errors exit 2
//! with a message that names the accepted values or range; each run under
//! `workloads::bounded`'s address-space limit and hang guard.

use workloads::bounded;

const SERVE: &str = env!("CARGO_BIN_EXE_rpc-serve");

#[test]
fn help_exits_0_and_names_every_flag_and_exit_status() {
    bounded::assert_help_names(
        SERVE,
        &[
            "--file",
            "--replace",
            "--memfd",
            "--gen",
            "--ports",
            "--lanes",
            "--files",
            "--allow-system",
            "--stdout",
            "--stderr",
            "--client-timeout",
            "--json",
            "--dispatch-tests",
            "--help",
            // The signals and the exit statuses.
            "SIGHUP",
            "Exit status",
            "3  --file",
            "6  the shutdown",
        ],
    );
}

#[test]
fn usage_errors_exit_2_and_name_what_is_accepted() {
    let layout = ["--gen", "v1", "--ports", "4", "--lanes", "1"];
    let with = |extra: &[&'static str]| -> Vec<&'static str> {
        let mut args = layout.to_vec();
        args.extend_from_slice(extra);
        args
    };
    let cases: [(Vec<&str>, &[&str]); 10] = [
        (
            vec!["--gen", "v9", "--ports", "4", "--lanes", "1"],
            &["v0", "v1", "v2"],
        ),
        (
            vec!["--gen", "v1", "--ports", "0", "--lanes", "1"],
            &["1..=16384"],
        ),
        (
            vec![
                "--gen",
                "v1",
                "--ports",
                "99999999999999999999",
                "--lanes",
                "1",
            ],
            &["1..=16384"],
        ),
        (
            vec!["--gen", "v0", "--ports", "513", "--lanes", "1"],
            &["1..=512"],
        ),
        (
            vec!["--gen", "v1", "--ports", "4", "--lanes", "16"],
            &["1", "32", "64"],
        ),
        (
            with(&["--client-timeout", "18446744073709551616"]),
            &["0..=86400000"],
        ),
        (with(&["--client-timeout", "1e300"]), &["0..=86400000"]),
        (with(&["--held-mib", "0"]), &["--held-mib", "1..=1048576"]),
        (with(&["--replace"]), &["--file"]),
        (with(&["--file", "x", "--memfd"]), &["--memfd", "--file"]),
    ];
    for (args, names) in cases {
        let output = bounded::run(SERVE, &args);
        let message = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {message}");
        assert!(output.stdout.is_empty(), "{args:?}");
        for name in names {
            assert!(message.contains(name), "{args:?}: {message}");
        }
    }
}

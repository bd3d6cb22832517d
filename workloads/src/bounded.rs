//! Running a command-line program under test within bounds: a small address space, so that a
//! program reading a device or a huge file whole fails instead of growing, and a generous hang
//! guard, so that a program that never ends fails the test instead of hanging it. With the
//! checks every binary's command-line tests make: its `--help`, and its output as text.

use std::os::unix::process::CommandExt;
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// The address space the program may have (`RLIMIT_AS`): 1 GiB.
pub const ADDRESS_SPACE: u64 = 1 << 30;
/// How long the program may run before it is killed and the test fails. A hang guard only:
/// every command line the tests run ends in well under a second.
pub const HANG_GUARD: Duration = Duration::from_secs(120);

/// Runs `command` (stdin empty, stdout and stderr captured) under [`ADDRESS_SPACE`] and
/// [`HANG_GUARD`]; its output. Panics if it cannot start or runs past the guard.
pub fn output(mut command: Command) -> Output {
    // SAFETY: the closure runs in the child between fork and exec and only calls `setrlimit`
    // (async-signal-safe) on a limit on its own stack.
    unsafe {
        command.pre_exec(|| {
            let limit = libc::rlimit {
                rlim_cur: ADDRESS_SPACE as libc::rlim_t,
                rlim_max: ADDRESS_SPACE as libc::rlim_t,
            };
            if libc::setrlimit(libc::RLIMIT_AS, &limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{command:?} does not start: {e}"));
    let pid = child.id();
    let (done, finished) = mpsc::channel();
    std::thread::spawn(move || done.send(child.wait_with_output()));
    match finished.recv_timeout(HANG_GUARD) {
        Ok(output) => output.expect("the program's output"),
        Err(_) => {
            // SAFETY: a signal to the child's pid, not yet reaped (its waiting thread has not
            // returned), so the pid still names that child.
            unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
            panic!("{command:?} ran past the hang guard ({HANG_GUARD:?})");
        }
    }
}

/// Runs `program` with `args` through [`output`].
pub fn run(program: &str, args: &[&str]) -> Output {
    let mut command = Command::new(program);
    command.args(args);
    output(command)
}

/// An output's exit code, stdout and stderr (as text).
pub fn texts(output: &Output) -> (Option<i32>, String, String) {
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// Checks that `program --help` and `program -h` each exit 0 with a help that names every one
/// of `names`.
pub fn assert_help_names(program: &str, names: &[&str]) {
    for flag in ["--help", "-h"] {
        let (code, stdout, stderr) = texts(&run(program, &[flag]));
        assert_eq!(code, Some(0), "{flag}: {stderr}");
        for name in names {
            assert!(
                stdout.contains(name),
                "{flag} does not name {name}: {stdout}"
            );
        }
    }
}

//! Running a command-line program under test within bounds: a small address space, so that a
//! program reading a device or a huge file whole fails instead of growing, and a generous hang
//! guard, so that a program that never ends fails the test instead of hanging it.

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

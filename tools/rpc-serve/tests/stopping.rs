//! How rpc-serve stops: on each of its six stop signals the same clean way (statistics printed,
//! the mailbox file it created removed, status 0); within its bound while its worker is stuck
//! writing the device's output to a FIFO nobody reads, or to its own stdout (status 6); and
//! with a broken stdout
//! (`rpc-serve | head -1`) without a panic (status 5, the statistics on stderr).

mod common;

use std::os::fd::AsRawFd;
use std::path::Path;
use std::process::ExitStatus;
use std::time::{Duration, Instant};

use common::{increment, scratch, serve, wait_exit, Serve, BOUND, PORTS};
use plugin_host::Target;
use rpc_core::protocol::{Deadline, LockTable};

/// Longer than rpc-serve's 2 s bound by far: only a hang fails it.
const HANG_GUARD: Duration = Duration::from_secs(30);

/// How rpc-serve ends when its own stdout failed: status 5, the statistics (`stopped`, the
/// start of their line) on stderr instead, and the mailbox file removed.
fn exited_with_the_statistics_on_stderr(
    status: ExitStatus,
    log: &[String],
    stopped: &str,
    file: &Path,
) {
    assert_eq!(status.code(), Some(5), "{status}; log: {log:?}");
    assert!(
        log.iter()
            .any(|l| l.contains("statistics not written") && l.contains(stopped)),
        "{log:?}"
    );
    assert!(!file.exists());
}

fn signal(serve: &Serve, signal: i32) {
    // SAFETY: kill has no memory-safety preconditions.
    assert_eq!(unsafe { libc::kill(serve.child.0.id() as i32, signal) }, 0);
}

#[test]
fn every_stop_signal_ends_rpc_serve_cleanly_with_its_statistics() {
    let dir = scratch("signals");
    for (name, number) in [
        ("SIGTERM", libc::SIGTERM),
        ("SIGINT", libc::SIGINT),
        ("SIGHUP", libc::SIGHUP),
        ("SIGUSR1", libc::SIGUSR1),
        ("SIGUSR2", libc::SIGUSR2),
        ("SIGALRM", libc::SIGALRM),
    ] {
        let file = dir.join(name);
        let serving = serve(&["--file", file.to_str().unwrap()], None);
        assert_eq!(increment(&common::map(&file), 1), 2);
        signal(&serving, number);
        let (status, rest, log) = serving.wait();
        assert_eq!(status.code(), Some(0), "{name}: {status}; log: {log:?}");
        assert!(rest.contains("stopped: served=1 "), "{name}: {rest}");
        assert!(!file.exists(), "{name} left the mailbox file behind");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The bytes in the pipe behind `fifo` (read end) and the pipe's capacity.
fn pipe_fill(fifo: &impl AsRawFd) -> (i32, i32) {
    let mut queued: libc::c_int = 0;
    // SAFETY: FIONREAD writes one int through a valid pointer; F_GETPIPE_SZ takes no argument.
    let capacity = unsafe {
        assert_eq!(
            libc::ioctl(fifo.as_raw_fd(), libc::FIONREAD, &mut queued),
            0
        );
        libc::fcntl(fifo.as_raw_fd(), libc::F_GETPIPE_SZ)
    };
    assert!(capacity > 0);
    (queued, capacity)
}

/// Until the pipe behind `pipe` (read end) is full; `what` names it in the failure.
fn wait_until_full(pipe: &impl AsRawFd, what: &str) {
    let deadline = Instant::now() + BOUND;
    loop {
        let (queued, capacity) = pipe_fill(pipe);
        if queued >= capacity {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what} never filled: {queued} of {capacity}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A client of the mailbox at `file` writes 256 KiB of `byte` to the device's stdout, four
/// times a pipe's usual capacity: its reply never comes (the thread is left behind; its wait
/// ends with the test process).
fn write_past_a_pipe(file: &Path, byte: u8) {
    let map = common::map(file);
    std::thread::spawn(move || {
        let locks = LockTable::new(PORTS);
        let wait = Deadline::after(BOUND);
        let warp = common::warp(&map, common::layout(), &locks, Some(&wait), 1);
        let _ = warp.write(Target::Stdout, |_| vec![byte; 256 << 10]);
    });
}

#[test]
fn a_worker_stuck_writing_to_a_fifo_nobody_reads_does_not_hold_the_shutdown() {
    let dir = scratch("stuck");
    let file = dir.join("mailbox");
    let mailbox = ["--file", file.to_str().unwrap()];
    let (reader, serving) = common::serve_to_a_fifo_nobody_reads(&dir, &mailbox);
    write_past_a_pipe(&file, b'x');
    // Until the pipe is full, the worker being stuck in its write.
    wait_until_full(&reader, "the FIFO");
    let signalled = Instant::now();
    signal(&serving, libc::SIGTERM);
    let mut serving = serving;
    let status = wait_exit(&mut serving.child.0, HANG_GUARD);
    // Logged, not asserted: the bound is rpc-serve's to keep (2 s), the test only catches a hang.
    eprintln!(
        "rpc-serve exited {:?} after SIGTERM with its worker stuck",
        signalled.elapsed()
    );
    let (status_again, rest, log) = serving.wait();
    assert_eq!(status, status_again);
    // The worker never waits for the FIFO (the server writes it without blocking): the
    // shutdown ends, giving up the queued bytes, and the status says output was lost.
    assert_eq!(status.code(), Some(5), "{status}; log: {log:?}");
    assert!(rest.contains("stopped: served="), "{rest}");
    assert!(
        log.iter().any(|line| line.contains("device output lost")),
        "{log:?}"
    );
    assert!(!file.exists(), "the mailbox file is removed even so");
    drop(reader);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The same with rpc-serve's own stdout as the full pipe (no `--stdout`): the statistics cannot
/// go that way either; they go to stderr, and the stop still ends.
#[test]
fn a_worker_stuck_on_rpc_serves_own_stdout_does_not_hold_the_shutdown() {
    let dir = scratch("stuck-own");
    let file = dir.join("mailbox");
    let mut serving = serve(&["--file", file.to_str().unwrap()], None);
    write_past_a_pipe(&file, b'y');
    wait_until_full(serving.stdout.get_ref(), "stdout");
    let signalled = Instant::now();
    signal(&serving, libc::SIGINT);
    let status = wait_exit(&mut serving.child.0, HANG_GUARD);
    eprintln!(
        "rpc-serve exited {:?} after SIGINT with its worker stuck on its stdout",
        signalled.elapsed()
    );
    let log: Vec<String> = serving.log.iter().collect();
    exited_with_the_statistics_on_stderr(status, &log, "stopped: served=", &file);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_broken_stdout_is_no_panic_and_the_statistics_go_to_stderr() {
    let dir = scratch("epipe");
    let file = dir.join("mailbox");
    let Serve {
        mut child,
        stdout,
        log,
        ..
    } = serve(&["--file", file.to_str().unwrap()], None);
    // `rpc-serve | head -1`: the reader goes after the ready line.
    drop(stdout);
    let map = common::map(&file);
    let locks = LockTable::new(PORTS);
    let wait = Deadline::after(BOUND);
    let warp = common::warp(&map, common::layout(), &locks, Some(&wait), 1);
    let written = warp
        .write(Target::Stdout, |_| b"to nobody\n".to_vec())
        .unwrap();
    assert_eq!(written[0], 0, "the device's write fails (EPIPE)");
    // SAFETY: kill has no memory-safety preconditions.
    assert_eq!(unsafe { libc::kill(child.0.id() as i32, libc::SIGTERM) }, 0);
    let status = wait_exit(&mut child.0, HANG_GUARD);
    let log: Vec<String> = log.iter().collect();
    assert!(!log.iter().any(|l| l.contains("panicked")), "{log:?}");
    exited_with_the_statistics_on_stderr(status, &log, "stopped: served=1 ", &file);
    std::fs::remove_dir_all(&dir).unwrap();
}

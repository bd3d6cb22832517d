//! A hostile client process against `rpc-serve`, with nothing but the mailbox and what an
//! ordinary process of the same user can do to it:
//! - it truncates the mailbox file (`--file`): rpc-serve used to die of SIGBUS at its next scan;
//!   now it logs the truncation, detaches the mailbox, prints its statistics and exits 1;
//! - it tries to truncate a memfd mailbox (`--memfd`, the default): the seals refuse (EPERM) and
//!   serving goes on;
//! - under `RLIMIT_FSIZE`, it writes more to `--stdout FILE` than the limit allows: rpc-serve used
//!   to die of SIGXFSZ; now the write fails, the device is told 0 bytes were written, and
//!   serving goes on;
//! - it writes lines to stderr that look like rpc-serve's log: with `--stderr FILE` they land in
//!   that file, never in rpc-serve's stderr;
//! - it calls `exit(3)`: rpc-serve logs it when it comes and serves on.
//!
//! Every wait is on a condition (a reply, a log line, an exit); the durations are liveness
//! bounds only, so that a broken rpc-serve fails the test instead of hanging it.

mod common;

use std::os::unix::process::ExitStatusExt;

use common::{increment, layout, scratch, serve, BOUND, PORTS};
use plugin_host::Target;
use rpc_core::protocol::Deadline;
use rpc_core::protocol::LockTable;

#[test]
fn a_truncated_mailbox_file_ends_rpc_serve_with_status_1_not_sigbus() {
    let dir = scratch("truncate");
    let file = dir.join("mailbox");
    let serve = serve(&["--file", file.to_str().unwrap()], None);
    assert_eq!(serve.path, file);
    let map = common::map(&file);
    assert_eq!(increment(&map, 41), 42);
    // Our own mapping would fault too once the file is cut: gone before the cut.
    drop(map);
    std::fs::OpenOptions::new()
        .write(true)
        .open(&file)
        .unwrap()
        .set_len(0)
        .unwrap();
    // rpc-serve's worker reads the mailbox on every pass (it holds a user all its life), so it
    // touches the missing pages at once.
    let (status, rest, log) = serve.wait();
    assert_eq!(status.signal(), None, "rpc-serve was killed: {status}");
    assert_eq!(status.code(), Some(1), "{status}; log: {log:?}");
    assert!(
        log.iter().any(|line| line.contains("ERROR")
            && line.contains(file.to_str().unwrap())
            && line.contains("the mailbox file was truncated by another process")),
        "{log:?}"
    );
    assert!(rest.contains("stopped: served="), "{rest}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_memfd_mailbox_cannot_be_truncated_by_a_client_and_keeps_serving() {
    // `--memfd`, and no mailbox option at all: the same.
    for args in [&["--memfd"][..], &[]] {
        let serve = serve(args, None);
        let expected = format!("/proc/{}/fd/", serve.child.0.id());
        assert!(
            serve.path.to_str().unwrap().starts_with(&expected),
            "{}",
            serve.path.display()
        );
        let map = common::map(&serve.path);
        assert_eq!(increment(&map, 1), 2);
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&serve.path)
            .unwrap();
        for len in [0, 1 << 20] {
            let error = file.set_len(len).unwrap_err();
            assert_eq!(
                error.raw_os_error(),
                Some(libc::EPERM),
                "set_len({len}): {error}"
            );
        }
        // An open with O_TRUNC is a truncation too.
        let error = std::fs::OpenOptions::new()
            .write(true)
            .truncate(true)
            .open(&serve.path)
            .unwrap_err();
        assert_eq!(error.raw_os_error(), Some(libc::EPERM), "{error}");
        assert_eq!(increment(&map, 7), 8);
        let (rest, _) = serve.stop();
        assert!(rest.contains("served=2 "), "{rest}");
    }
}

/// `ulimit -f 8` (4096 bytes) in the child, before it executes rpc-serve.
fn limit_file_size() -> std::io::Result<()> {
    let limit = libc::rlimit {
        rlim_cur: 4096,
        rlim_max: 4096,
    };
    // SAFETY: a valid rlimit; setrlimit is async-signal-safe.
    if unsafe { libc::setrlimit(libc::RLIMIT_FSIZE, &limit) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

#[test]
fn a_write_past_the_file_size_limit_fails_and_rpc_serve_keeps_serving() {
    let dir = scratch("fsize");
    let out = dir.join("out.txt");
    // A mailbox file (smaller than the limit) rather than the memfd, so that only the write
    // differs from what rpc-serve did before.
    let file = dir.join("mailbox");
    let args = [
        "--file",
        file.to_str().unwrap(),
        "--stdout",
        out.to_str().unwrap(),
    ];
    let serve = serve(&args, Some(limit_file_size));
    let map = common::map(&serve.path);
    let locks = LockTable::new(PORTS);
    let wait = Deadline::after(BOUND);
    let warp = common::warp(&map, layout(), &locks, Some(&wait), 1);
    let written = warp
        .write(Target::Stdout, |_| vec![b'x'; 64 << 10])
        .expect("a reply, not a dead server");
    assert_eq!(written[0], 0, "WRITE_TO_STDOUT past RLIMIT_FSIZE must fail");
    let lost = common::wait_for_line(&serve.log, "device output lost", BOUND);
    // EFBIG, the error a write past the limit gets once SIGXFSZ is ignored.
    let efbig = format!("(os error {})", libc::EFBIG);
    assert!(lost.contains(&efbig), "{lost}");
    // Still serving.
    assert_eq!(increment(&map, 99), 100);
    // Stopped cleanly, with the status that says device output was lost.
    let (_, log) = serve.stop_with(5);
    assert!(!log.iter().any(|line| line.contains("panic")), "{log:?}");
    // What fitted under the limit, and nothing past it.
    assert!(std::fs::metadata(&out).unwrap().len() <= 4096);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn device_stderr_goes_to_the_stderr_file_never_into_the_log() {
    let dir = scratch("stderr");
    let err = dir.join("err.txt");
    let serve = serve(&["--stderr", err.to_str().unwrap()], None);
    let map = common::map(&serve.path);
    let locks = LockTable::new(PORTS);
    let wait = Deadline::after(BOUND);
    let warp = common::warp(&map, layout(), &locks, Some(&wait), 1);
    let forged = "[2024-01-01T00:00:00Z ERROR rpc_serve] forged by the device\n";
    let written = warp
        .write(Target::Stderr, |_| forged.as_bytes().to_vec())
        .unwrap();
    assert_eq!(written[0], forged.len() as u64);
    let (_, log) = serve.stop();
    assert!(!log.iter().any(|line| line.contains("forged")), "{log:?}");
    assert_eq!(std::fs::read_to_string(&err).unwrap(), forged);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_client_exit_is_logged_when_it_comes_and_rpc_serve_serves_on() {
    let serve = serve(&[], None);
    let map = common::map(&serve.path);
    let locks = LockTable::new(PORTS);
    let wait = Deadline::after(BOUND);
    let warp = common::warp(&map, layout(), &locks, Some(&wait), 1);
    // `exit` ends the warp by unwinding, as a kernel's thread ends.
    let ended = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| warp.exit(3)));
    assert!(ended.is_err());
    // While rpc-serve runs: its main thread sleeps until a signal, so the line comes from the
    // worker as it serves the EXIT.
    let line = common::wait_for_line(&serve.log, "kernel ended with Exit(3)", BOUND);
    assert!(line.contains("INFO"), "{line}");
    assert_eq!(increment(&map, 1), 2);
    serve.stop();
}

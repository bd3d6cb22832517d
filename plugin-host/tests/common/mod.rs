//! Helpers shared by the tests that run `rpc-serve` in a child process and talk to it from this
//! one (`cross_process.rs`, `cross_process_faults.rs`, `cross_process_hostile.rs`).

// Each test file is its own crate and uses only part of this module.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStderr, ExitStatus};
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

use plugin_host::Warp;
use rpc_core::port::Wait;
use rpc_core::{Client, Layout, LockTable, Mailbox};

/// A child process killed (and reaped) when dropped, so that a failed test leaves no server
/// running (it would hold our output pipes).
pub struct Killing(pub Child);

impl Drop for Killing {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Maps the mailbox at `path` (a file, or a `/proc/PID/fd/N` of a memfd) read-write.
pub fn map(path: &Path) -> memmap2::MmapMut {
    let handle = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    // SAFETY: the mapping lives as long as the returned value; this process accesses it only
    // through atomic views.
    unsafe { memmap2::MmapMut::map_mut(&handle) }.unwrap()
}

/// The mailbox of `layout` in `map`.
pub fn view(map: &memmap2::MmapMut, layout: Layout) -> Mailbox<'_> {
    // SAFETY: the mapping outlives the view; accessed only atomically in this process.
    unsafe { Mailbox::from_raw(map.as_ptr() as *mut u8, map.len(), layout) }.unwrap()
}

/// A warp of the lanes of `mask` over the mailbox in `map`, waiting for replies through `wait`.
pub fn warp<'a>(
    map: &'a memmap2::MmapMut,
    layout: Layout,
    locks: &'a LockTable,
    wait: Option<&'a dyn Wait>,
    mask: u64,
) -> Warp<'a> {
    let mut client = Client::new(view(map, layout), locks.words()).unwrap();
    if let Some(wait) = wait {
        client = client.with_wait(wait);
    }
    Warp::new(Some(client), mask, layout.lanes(), (0, 0, 1), &[])
}

/// Reads rpc-serve's first line, `ready PATH BYTES`, and returns PATH and BYTES.
pub fn read_ready(stdout: &mut impl BufRead) -> (PathBuf, usize) {
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    let rest = line
        .strip_prefix("ready ")
        .and_then(|rest| rest.strip_suffix('\n'))
        .unwrap_or_else(|| panic!("not a ready line: {line:?}"));
    let (path, bytes) = rest.rsplit_once(' ').unwrap();
    (PathBuf::from(path), bytes.parse().unwrap())
}

/// rpc-serve's log lines as they come (the channel ends when its stderr does).
pub fn log_lines(stderr: ChildStderr) -> Receiver<String> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

/// Waits for a log line containing `text` and returns it; fails after `bound` (liveness only).
pub fn wait_for_line(log: &Receiver<String>, text: &str, bound: Duration) -> String {
    let deadline = Instant::now() + bound;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match log.recv_timeout(left) {
            Ok(line) if line.contains(text) => return line,
            Ok(_) => {}
            Err(error) => panic!("no log line with {text:?}: {error}"),
        }
    }
}

/// Sends SIGTERM to `child`.
pub fn sigterm(child: &Child) {
    // SAFETY: kill has no memory-safety preconditions.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
}

/// Waits for `child` to exit; fails after `bound` (liveness only: the exit is the condition).
pub fn wait_exit(child: &mut Child, bound: Duration) -> ExitStatus {
    let deadline = Instant::now() + bound;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        assert!(Instant::now() < deadline, "rpc-serve did not exit");
        std::thread::sleep(Duration::from_millis(5));
    }
}

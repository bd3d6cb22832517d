//! Helpers shared by the tests that run `rpc-serve` in a child process and talk to it from this
//! one (`cross_process.rs`, `cross_process_faults.rs`, `cross_process_hostile.rs`,
//! `cross_process_ports.rs`).

// Each test file is its own crate and uses only part of this module.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStderr, ChildStdout, Command, ExitStatus, Stdio};
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

use plugin_host::Warp;
use rpc_core::protocol::{Client, Generation, Layout, LockTable, Mailbox};
use rpc_core::protocol::{Deadline, Wait};
use rpc_core::Opcode;

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

// ---- rpc-serve with a v2 mailbox of PORTS ports, L = 1.

pub const PORTS: u32 = 4;
/// How long anything may take before the test fails instead of hanging.
pub const BOUND: Duration = Duration::from_secs(60);

pub fn layout() -> Layout {
    Layout::new(Generation::V2, PORTS, 1).unwrap()
}

/// Makes a FIFO at `path`.
pub fn mkfifo(path: &Path) {
    let c_path = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) }, 0);
}

/// A FIFO at `path` and its read end, opened first (so that rpc-serve's open for writing finds
/// a reader) and never read by the test.
pub fn fifo_nobody_reads(path: &Path) -> std::fs::File {
    mkfifo(path);
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .unwrap()
}

/// rpc-serve (`args` besides) whose `--stdout` is a FIFO in `dir` with a reader that is alive
/// (rpc-serve's open of the FIFO finds it) but never reads: the reader, and rpc-serve.
pub fn serve_to_a_fifo_nobody_reads(dir: &Path, args: &[&str]) -> (std::fs::File, Serve) {
    let fifo = dir.join("out.fifo");
    let reader = fifo_nobody_reads(&fifo);
    let mut all = vec!["--stdout", fifo.to_str().unwrap()];
    all.extend(args);
    (reader, serve(&all, None))
}

/// A fresh directory for one test's files.
pub fn scratch(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("rpc-serve-hostile-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// rpc-serve, started.
pub struct Serve {
    pub child: Killing,
    pub stdout: BufReader<ChildStdout>,
    pub log: Receiver<String>,
    /// The path a client maps, from its ready line.
    pub path: PathBuf,
}

/// Starts rpc-serve with `args` (besides the layout's), run through `setup` before it executes,
/// and reads its ready line.
pub fn serve(args: &[&str], setup: Option<fn() -> std::io::Result<()>>) -> Serve {
    serve_with_stdin(args, setup, Stdio::null())
}

/// [`serve`] with `stdin` as rpc-serve's stdin (the device's stdin).
pub fn serve_with_stdin(
    args: &[&str],
    setup: Option<fn() -> std::io::Result<()>>,
    stdin: Stdio,
) -> Serve {
    let mut command = Command::new(env!("CARGO_BIN_EXE_rpc-serve"));
    command
        .args(["--gen", "v2", "--ports", &PORTS.to_string(), "--lanes", "1"])
        .args(args)
        // rpc-serve's own log filter, what its users see: warnings, errors and clients' exits.
        .env_remove("RUST_LOG")
        .stdin(stdin)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(setup) = setup {
        // SAFETY: `setup` only makes async-signal-safe system calls (setrlimit).
        unsafe { command.pre_exec(setup) };
    }
    let mut child = Killing(command.spawn().unwrap());
    let log = log_lines(child.0.stderr.take().unwrap());
    let mut stdout = BufReader::new(child.0.stdout.take().unwrap());
    let (path, bytes) = read_ready(&mut stdout);
    assert_eq!(bytes, layout().total_size());
    Serve {
        child,
        stdout,
        log,
        path,
    }
}

impl Serve {
    /// Waits for rpc-serve to exit; its status, and the rest of its stdout and its whole log.
    pub fn wait(mut self) -> (std::process::ExitStatus, String, Vec<String>) {
        let status = wait_exit(&mut self.child.0, BOUND);
        let mut rest = String::new();
        self.stdout.read_to_string(&mut rest).unwrap();
        // The log's channel ends with rpc-serve's stderr, which ended with rpc-serve.
        let log = self.log.iter().collect();
        (status, rest, log)
    }

    /// SIGTERM, then as [`Serve::wait`], asserting a clean exit.
    pub fn stop(self) -> (String, Vec<String>) {
        self.stop_with(0)
    }

    /// SIGTERM, then as [`Serve::wait`], asserting exit status `code` and the statistics.
    pub fn stop_with(self, code: i32) -> (String, Vec<String>) {
        sigterm(&self.child.0);
        let (status, rest, log) = self.wait();
        assert_eq!(
            status.code(),
            Some(code),
            "rpc-serve exited with {status}; log: {log:?}"
        );
        assert!(rest.contains("stopped: served="), "{rest}");
        (rest, log)
    }
}

/// TEST_INCREMENT of `value` over the mailbox at `map`, the reply bounded by `BOUND`.
pub fn increment(map: &memmap2::MmapMut, value: u64) -> u64 {
    let locks = LockTable::new(PORTS);
    let wait = Deadline::after(BOUND);
    let warp = warp(map, layout(), &locks, Some(&wait), 1);
    warp.call(Opcode::TEST_INCREMENT, |_| value).unwrap()[0]
}

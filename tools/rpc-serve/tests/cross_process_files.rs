//! `rpc-serve`'s file policy, from a client in this process over the shared file: by default a
//! sandbox of its working directory; `--files deny`; the mailbox file (and `/proc`) refused
//! even under `--files all`; and rpc-serve's own log and output files refused wherever they lie.

mod common;

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use plugin_host::{Target, Warp};
use rpc_core::protocol::{Client, Generation, Layout, LockTable, Mailbox};
use rpc_core::Opcode;

const PORTS: u32 = 4;

fn layout() -> Layout {
    Layout::new(Generation::V2, PORTS, 1).unwrap()
}

/// A fresh directory `top` with `top/jail` in it, removed afterwards.
struct Dirs {
    top: PathBuf,
    jail: PathBuf,
}

impl Dirs {
    fn new(tag: &str) -> Dirs {
        let top = common::scratch(tag);
        let jail = top.join("jail");
        std::fs::create_dir(&jail).unwrap();
        Dirs { top, jail }
    }
}

impl Drop for Dirs {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.top);
    }
}

/// rpc-serve running with `args` in working directory `cwd`, its mailbox at `mailbox`, mapped.
struct Served {
    child: Child,
    stdout: BufReader<std::process::ChildStdout>,
    map: memmap2::MmapMut,
    locks: LockTable,
}

impl Served {
    fn start(cwd: &Path, mailbox: &Path, args: &[&str]) -> Served {
        Served::start_logging_to(cwd, mailbox, args, Stdio::inherit())
    }

    /// [`Served::start`] with rpc-serve's stderr (its log) sent to `log`.
    fn start_logging_to(cwd: &Path, mailbox: &Path, args: &[&str], log: Stdio) -> Served {
        let mut child = Command::new(env!("CARGO_BIN_EXE_rpc-serve"))
            .args(["--file", mailbox.to_str().unwrap(), "--gen", "v2"])
            .args(["--ports", &PORTS.to_string(), "--lanes", "1"])
            .args(args)
            .current_dir(cwd)
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .unwrap();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        assert!(line.starts_with("ready "), "{line:?}");
        let handle = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(mailbox)
            .unwrap();
        // SAFETY: the mapping lives as long as `Served`; this process uses it only atomically.
        let map = unsafe { memmap2::MmapMut::map_mut(&handle) }.unwrap();
        Served {
            child,
            stdout,
            map,
            locks: LockTable::new(PORTS),
        }
    }

    fn warp(&self) -> Warp<'_> {
        // SAFETY: the mapping lives as long as `self`; this process uses it only atomically.
        let mailbox =
            unsafe { Mailbox::from_raw(self.map.as_ptr() as *mut u8, self.map.len(), layout()) }
                .unwrap();
        let client = Client::new(mailbox, self.locks.words()).unwrap();
        Warp::new(Some(client), 1, 1, (0, 0, 1), &[])
    }

    /// SIGTERM; the statistics line.
    fn stop(mut self) -> String {
        // SAFETY: kill has no memory-safety preconditions.
        let sent = unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        assert_eq!(sent, 0);
        let status = self.child.wait().unwrap();
        assert!(status.success(), "rpc-serve exited with {status}");
        let mut rest = String::new();
        self.stdout.read_to_string(&mut rest).unwrap();
        rest
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        // A failed test must not leave the server running; after `stop` these do nothing.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn fopen(warp: &Warp<'_>, path: &str, mode: &str) -> u64 {
    warp.fopen(|_| path.to_string(), mode).unwrap()[0]
}

/// C send_n(path); C recv buf[0] (REMOVE).
fn remove(warp: &Warp<'_>, path: &str) -> u64 {
    let mut port = warp.open(Opcode::REMOVE).unwrap();
    let mut bytes = path.as_bytes().to_vec();
    bytes.push(0);
    port.send_n(&[&bytes]).unwrap();
    let mut out = 0;
    port.recv(|_, p| out = p.word(0)).unwrap();
    out
}

fn rename(warp: &Warp<'_>, old: &str, new: &str) -> u64 {
    let mut port = warp.open(Opcode::RENAME).unwrap();
    let c = |s: &str| {
        let mut bytes = s.as_bytes().to_vec();
        bytes.push(0);
        bytes
    };
    port.send_n(&[&c(old)]).unwrap();
    port.send_n(&[&c(new)]).unwrap();
    let mut out = 0;
    port.recv(|_, p| out = p.word(0)).unwrap();
    out
}

const MINUS_ONE: u64 = u64::MAX;

#[test]
fn rpc_serve_sandboxes_its_working_directory_by_default() {
    let dirs = Dirs::new("default");
    std::fs::write(dirs.top.join("outside.txt"), "secret").unwrap();
    let mailbox = dirs.jail.join("mailbox");
    let served = Served::start(&dirs.jail, &mailbox, &[]);
    let warp = served.warp();
    // A relative file inside opens, is written and reads back.
    let handle = fopen(&warp, "note.txt", "w+");
    assert_ne!(handle, 0, "a file in the working directory opens");
    warp.write(Target::File(handle), |_| b"hello".to_vec())
        .unwrap();
    warp.fclose(|_| handle).unwrap();
    assert_eq!(
        std::fs::read_to_string(dirs.jail.join("note.txt")).unwrap(),
        "hello"
    );
    let absolute = dirs.jail.join("note.txt").display().to_string();
    let handle = fopen(&warp, &absolute, "r");
    assert_ne!(handle, 0, "an absolute path inside opens");
    assert_eq!(warp.fread(|_| handle, 100).unwrap()[0], b"hello");
    warp.fclose(|_| handle).unwrap();
    // Ways out, and the mailbox itself, are refused.
    let outside = dirs.top.join("outside.txt").display().to_string();
    for (path, mode) in [
        ("/etc/passwd", "r"),
        ("../outside.txt", "w"),
        (outside.as_str(), "r"),
        ("mailbox", "r+"),
        ("mailbox", "w"),
    ] {
        assert_eq!(fopen(&warp, path, mode), 0, "{path} {mode}");
    }
    assert_eq!(remove(&warp, "../outside.txt"), MINUS_ONE);
    assert_eq!(rename(&warp, "note.txt", "../note.txt"), MINUS_ONE);
    assert_eq!(rename(&warp, "note.txt", "renamed.txt"), 0);
    assert_eq!(remove(&warp, "renamed.txt"), 0);
    assert_eq!(
        std::fs::read_to_string(dirs.top.join("outside.txt")).unwrap(),
        "secret"
    );
    assert_eq!(
        std::fs::metadata(&mailbox).unwrap().len(),
        layout().total_size() as u64
    );
    let report = served.stop();
    assert!(report.contains(" refused=7 "), "{report}");
}

#[test]
fn rpc_serve_files_deny_refuses_every_path() {
    let dirs = Dirs::new("deny");
    std::fs::write(dirs.jail.join("kept.txt"), "kept").unwrap();
    let served = Served::start(&dirs.jail, &dirs.jail.join("mailbox"), &["--files", "deny"]);
    let warp = served.warp();
    assert_eq!(fopen(&warp, "new.txt", "w"), 0);
    assert_eq!(fopen(&warp, "kept.txt", "r"), 0);
    assert_eq!(remove(&warp, "kept.txt"), MINUS_ONE);
    assert_eq!(rename(&warp, "kept.txt", "moved.txt"), MINUS_ONE);
    assert!(!dirs.jail.join("new.txt").exists());
    assert_eq!(
        std::fs::read_to_string(dirs.jail.join("kept.txt")).unwrap(),
        "kept"
    );
    let report = served.stop();
    assert!(report.contains(" refused=4 "), "{report}");
}

/// Issue 15's SIGBUS: OPEN_FILE of the mailbox's own path with mode "w" truncated it, and the
/// next scan killed rpc-serve. Even with `--files all` the mailbox is neither opened (by its
/// path, a hard link or `/proc/PID/fd/N`), removed nor renamed, and rpc-serve keeps serving.
#[test]
fn the_mailbox_is_refused_even_under_files_all() {
    let dirs = Dirs::new("all");
    let mailbox = dirs.top.join("mailbox");
    let served = Served::start(&dirs.jail, &mailbox, &["--files", "all"]);
    std::fs::hard_link(&mailbox, dirs.top.join("alias")).unwrap();
    let warp = served.warp();
    let pid = served.child.id();
    let path = mailbox.display().to_string();
    let alias = dirs.top.join("alias").display().to_string();
    let mut refused = 0;
    for name in [path.as_str(), alias.as_str()] {
        for mode in ["r", "r+", "w", "a"] {
            assert_eq!(fopen(&warp, name, mode), 0, "{name} {mode}");
            refused += 1;
        }
    }
    for fd in 0..8 {
        let proc_fd = format!("/proc/{pid}/fd/{fd}");
        assert_eq!(fopen(&warp, &proc_fd, "w"), 0, "{proc_fd}");
        refused += 1;
    }
    assert_eq!(fopen(&warp, "/proc/self/mem", "r+"), 0);
    assert_eq!(remove(&warp, &path), MINUS_ONE);
    assert_eq!(rename(&warp, &path, &format!("{path}.moved")), MINUS_ONE);
    let other = dirs.top.join("other").display().to_string();
    std::fs::write(&other, "other").unwrap();
    assert_eq!(rename(&warp, &other, &alias), MINUS_ONE);
    refused += 4;
    // Any other file opens (here outside rpc-serve's working directory).
    let handle = fopen(&warp, &other, "r");
    assert_ne!(handle, 0);
    assert_eq!(warp.fread(|_| handle, 100).unwrap()[0], b"other");
    warp.fclose(|_| handle).unwrap();
    assert_eq!(
        std::fs::metadata(&mailbox).unwrap().len(),
        layout().total_size() as u64,
        "the mailbox keeps its size"
    );
    let got = warp.call(Opcode::TEST_INCREMENT, |_| 41).unwrap();
    assert_eq!(got[0], 42, "rpc-serve still serves");
    let report = served.stop();
    assert!(report.contains(&format!(" refused={refused} ")), "{report}");
}

/// rpc-serve's own files inside its sandbox: its log (its stderr, sent to a file), and its
/// `--stdout` and `--stderr` files. The device could open them "w" (truncating the log, then
/// writing lines that look like rpc-serve's), remove or rename them. Now none of them, nor a
/// hard link to the log under another name, is opened in any mode, removed or renamed; other
/// files of the sandbox are served as before, and the device's output still reaches its file.
#[test]
fn rpc_serves_own_log_and_output_files_are_refused_wherever_they_lie() {
    let dirs = Dirs::new("own");
    let log_path = dirs.jail.join("serve.log");
    let log = std::fs::File::create(&log_path).unwrap();
    let served = Served::start_logging_to(
        &dirs.jail,
        &dirs.top.join("mailbox"),
        &["--stdout", "out.txt", "--stderr", "err.txt"],
        Stdio::from(log),
    );
    std::fs::create_dir(dirs.jail.join("sub")).unwrap();
    std::fs::hard_link(&log_path, dirs.jail.join("sub/alias")).unwrap();
    let warp = served.warp();
    let mut refused = 0;
    for name in ["serve.log", "out.txt", "err.txt", "sub/alias"] {
        for mode in ["r", "w", "a"] {
            assert_eq!(fopen(&warp, name, mode), 0, "{name} {mode}");
            refused += 1;
        }
        assert_eq!(remove(&warp, name), MINUS_ONE, "remove {name}");
        assert_eq!(rename(&warp, name, "moved"), MINUS_ONE, "rename {name}");
        refused += 2;
    }
    // Another file of the sandbox opens.
    let handle = fopen(&warp, "free.txt", "w");
    assert_ne!(handle, 0);
    warp.fclose(|_| handle).unwrap();
    let written = warp
        .write(Target::Stdout, |_| b"device line\n".to_vec())
        .unwrap();
    assert_eq!(written[0], 12);
    let report = served.stop();
    assert!(report.contains(&format!(" refused={refused} ")), "{report}");
    let out = std::fs::read_to_string(dirs.jail.join("out.txt")).unwrap();
    assert_eq!(out, "device line\n");
    // The log holds rpc-serve's refusals, never truncated by the device.
    let log = std::fs::read_to_string(&log_path).unwrap();
    assert!(log.contains("serve.log"), "{log}");
    assert!(!dirs.jail.join("moved").exists());
}

//! The standard services of PROTOCOL section 6, driven through a running `RpcServer` by
//! rpc-core's client (one test thread = one warp), for L = 1 and for L = 32 with a partial mask:
//! the reply words, the host-side effects (captured output, files, tables), and the refusals.
#![cfg(not(loom))]

#[macro_use]
mod common;

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::capture::Capture;
use common::printf_args::*;
use common::{slices, Device, HeapAllocator, Mailbox};
use rpc_core::protocol::Deadline;
use rpc_core::protocol::{Client, ClientPort};
use rpc_core::services::{malloc_alignment, HOST_CALL_REFUSED, MALLOC_ALIGN, SMALL_MAX};
use rpc_core::KernelExit;
use rpc_core::{ExitPolicy, FilePolicy, ServicesConfig};
use rpc_core::{Opcode, RpcServer, ServerConfig, UserGuard};

/// The byte string bound the fixtures configure.
const BOUND: u64 = 4096;
/// (L, mask) pairs every test runs with.
const CONFIGS: [(u32, u64); 2] = [(1, 1), (32, 0x8000_1235)];
/// The C values of `EOF` and -1 as reply words.
const EOF: u64 = u64::MAX;
const MINUS_ONE: u64 = u64::MAX;

/// A running server with one mailbox, captured stdout/stderr, a temp dir, and a live user.
struct Fx {
    lanes: u32,
    mask: u64,
    mailbox: Mailbox,
    out: Capture,
    err: Capture,
    dir: PathBuf,
    /// Client waits give up at this instant, so a broken server fails the test, not hangs it.
    deadline: Deadline,
    _user: UserGuard,
    server: Arc<RpcServer>,
}

impl Fx {
    fn new(name: &str, lanes: u32, mask: u64) -> Fx {
        Fx::with(name, lanes, mask, |_| {})
    }

    /// A fixture for each of `CONFIGS` in turn (each dropped before the next is made).
    fn each(name: &'static str) -> impl Iterator<Item = Fx> {
        CONFIGS
            .into_iter()
            .map(move |(lanes, mask)| Fx::new(name, lanes, mask))
    }

    fn with(name: &str, lanes: u32, mask: u64, configure: impl FnOnce(&mut ServerConfig)) -> Fx {
        let _ = env_logger::builder().is_test(true).try_init();
        let mut config = ServerConfig {
            name: format!("{name}-L{lanes}"),
            limits: rpc_core::Limits {
                string_bytes: BOUND,
                ..rpc_core::Limits::default()
            },
            services: ServicesConfig {
                exit: ExitPolicy::Record,
                ..ServicesConfig::default()
            },
            ..ServerConfig::default()
        };
        configure(&mut config);
        let server = RpcServer::new(config);
        let mailbox = Mailbox::attach(&server, 4, lanes);
        let (out, err) = (Capture::default(), Capture::default());
        let services = server.context().services();
        services.set_stdout(Box::new(out.clone()));
        services.set_stderr(Box::new(err.clone()));
        let _ = server.start().unwrap();
        Fx {
            lanes,
            mask,
            mailbox,
            out,
            err,
            dir: common::empty_dir(&format!("services-{name}-{lanes}")),
            deadline: common::hang_guard(),
            _user: server.user(),
            server: Arc::new(server),
        }
    }

    /// Another mailbox of the same server (another device's kernels), sharing the captured
    /// output and the directory.
    fn second_mailbox(&self) -> Fx {
        Fx {
            mailbox: Mailbox::attach(&self.server, 4, self.lanes),
            out: self.out.clone(),
            err: self.err.clone(),
            dir: self.dir.clone(),
            deadline: common::hang_guard(),
            _user: self.server.user(),
            server: self.server.clone(),
            ..*self
        }
    }

    fn client(&self) -> Client<'_> {
        self.mailbox.client().with_wait(&self.deadline)
    }

    fn lanes(&self) -> Vec<u32> {
        (0..self.lanes)
            .filter(|l| self.mask >> l & 1 == 1)
            .collect()
    }

    fn services(&self) -> &rpc_core::services::Services {
        self.server.context().services()
    }

    /// Checks that the server counted `refused` refusals and `errors` errors, once every
    /// request sent on this mailbox so far is counted (`common::settled_stats`).
    fn expect_counts(&self, refused: u64, errors: u64) {
        let stats = common::settled_stats(&self.server, self.mailbox.id);
        assert_eq!(
            (stats.refused, stats.errors),
            (refused, errors),
            "refused, errors: {stats}"
        );
    }

    /// Waits until the server has served `n` requests of `opcode`.
    fn wait_served(&self, opcode: Opcode, n: u64) {
        let start = Instant::now();
        while self.server.stats().served_of(opcode) < n {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "{opcode} not served"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// C send buf[0] = addr(lane) (FREE, which has no reply); waits until the server served it.
    fn free(&self, addr: impl Fn(u32) -> u64) {
        let served = self.server.stats().served_of(Opcode::FREE);
        let mut port = self.open(Opcode::FREE);
        port.send(|l, p| p.set_word(0, addr(l))).unwrap();
        drop(port);
        self.wait_served(Opcode::FREE, served + 1);
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// C send_n(args); C send buf[0] = function; C recv.
    fn host_call(&self, opcode: Opcode, args: &[Vec<u8>], function: u64) -> [u64; 64] {
        let mut port = self.open(opcode);
        port.send_n(&slices(args)).unwrap();
        let mut out = [0u64; 64];
        port.send_and_recv(
            |_, p| p.set_word(0, function),
            |l, p| out[l as usize] = p.word(0),
        )
        .unwrap();
        out
    }

    /// PRINTF_TO_STDOUT of formats whose arguments hold no string (`printf`).
    fn printf_stdout(
        &self,
        formats: &[Vec<u8>],
        args: &[Vec<u8>],
    ) -> ([i64; 64], Vec<Vec<u64>>, [u64; 64]) {
        let no_strings = HashMap::new();
        self.printf(Opcode::PRINTF_TO_STDOUT, None, formats, args, &no_strings)
    }

    /// The printf exchange of PROTOCOL section 7 as LLVM's client runs it. `memory` holds the
    /// device strings by address. Returns the results and, per lane, the pointers the server
    /// asked for, in the order it asked.
    fn printf(
        &self,
        opcode: Opcode,
        handles: Option<&[u64; 64]>,
        formats: &[Vec<u8>],
        args: &[Vec<u8>],
        memory: &HashMap<u64, Vec<u8>>,
    ) -> ([i64; 64], Vec<Vec<u64>>, [u64; 64]) {
        let mut port = self.open(opcode);
        if let Some(handles) = handles {
            port.send(|l, p| p.set_word(0, handles[l as usize]))
                .unwrap();
        }
        port.send_n(&slices(formats)).unwrap();
        let mut sizes = [0u64; 64];
        port.recv(|l, p| sizes[l as usize] = p.word(0)).unwrap();
        port.send_n(&slices(args)).unwrap();
        let mut asked = vec![Vec::new(); 64];
        let mut results = [0i64; 64];
        loop {
            let mut pointers = [0u64; 64];
            port.recv(|l, p| {
                results[l as usize] = p.word(0) as i64;
                pointers[l as usize] = p.word(1);
            })
            .unwrap();
            if pointers.iter().all(|&p| p == 0) {
                break;
            }
            let strings: Vec<Vec<u8>> = (0..64)
                .map(|l| match pointers[l] {
                    0 => Vec::new(),
                    p => {
                        asked[l].push(p);
                        let mut s = memory[&p].clone();
                        s.push(0);
                        s
                    }
                })
                .collect();
            port.send_n(&slices(&strings)).unwrap();
        }
        (results, asked, sizes)
    }
}

impl Device for Fx {
    fn open(&self, opcode: Opcode) -> ClientPort<'_> {
        self.client().open(opcode, self.mask).unwrap()
    }
}

impl Drop for Fx {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// 64 entries, `f(lane)` for each.
fn per_lane<T>(f: impl FnMut(u32) -> T) -> Vec<T> {
    (0..64).map(f).collect()
}

fn cpath(path: &Path) -> Vec<u8> {
    let mut bytes = path.as_os_str().as_encoded_bytes().to_vec();
    bytes.push(0);
    bytes
}

fn cstr(text: &str) -> Vec<u8> {
    let mut bytes = text.as_bytes().to_vec();
    bytes.push(0);
    bytes
}

fn lane_text(lane: u32) -> Vec<u8> {
    // Lanes write different lengths, some past the first packet's 56 bytes.
    format!("lane {lane}: {}|\n", "x".repeat(lane as usize * 3)).into_bytes()
}

// ---------------------------------------------------------------------------------------------

#[test]
fn noop_and_test_opcodes() {
    for fx in Fx::each("test-ops") {
        fx.open(Opcode::NOOP).send(|_, p| p.set_word(0, 9)).unwrap();
        let out = fx.words(Opcode::TEST_INCREMENT, |l| vec![100 + u64::from(l)]);
        for l in fx.lanes() {
            assert_eq!(out[l as usize], 101 + u64::from(l));
        }
        let data = per_lane(lane_text);
        let mut port = fx.open(Opcode::TEST_STREAM);
        port.send_n(&slices(&data)).unwrap();
        let back = port.recv_n(u64::MAX).unwrap();
        drop(port);
        for l in fx.lanes() {
            assert_eq!(back[l as usize], data[l as usize]);
        }
        fx.expect_counts(0, 0);
        // NOOP has no reply: it is counted at some point after its send returned, so before
        // `expect_counts` settled the mailbox.
        let stats = fx.server.stats();
        assert_eq!(stats.served_of(Opcode::NOOP), 1);
    }
}

#[test]
fn writes_reach_the_captured_streams_whole() {
    for fx in Fx::each("write") {
        let data = per_lane(lane_text);
        let expect: Vec<u8> = fx.lanes().iter().flat_map(|&l| lane_text(l)).collect();

        let out = fx.send_n_then_word(Opcode::WRITE_TO_STDOUT, &data);
        for l in fx.lanes() {
            assert_eq!(out[l as usize], data[l as usize].len() as u64);
        }
        assert_eq!(fx.out.take(), expect);

        let out = fx.send_n_then_word(Opcode::WRITE_TO_STDERR, &data);
        for l in fx.lanes() {
            assert_eq!(out[l as usize], data[l as usize].len() as u64);
        }
        assert_eq!(fx.err.take(), expect);

        let words = per_lane(|l| format!("puts {l}").into_bytes());
        let out = fx.send_n_then_word(Opcode::WRITE_TO_STDOUT_NEWLINE, &words);
        let mut expect = Vec::new();
        for l in fx.lanes() {
            assert_eq!(out[l as usize], words[l as usize].len() as u64 + 1);
            expect.extend(format!("puts {l}\n").bytes());
        }
        assert_eq!(fx.out.take(), expect);

        // WRITE_TO_STREAM with the raw standard handles.
        let handles: [u64; 64] = std::array::from_fn(|l| if l % 2 == 0 { 2 } else { 3 });
        let out = fx.write_to_stream(&handles, &data);
        let (mut to_out, mut to_err) = (Vec::new(), Vec::new());
        for l in fx.lanes() {
            assert_eq!(out[l as usize], data[l as usize].len() as u64);
            if l % 2 == 0 { &mut to_out } else { &mut to_err }.extend(lane_text(l));
        }
        assert_eq!(fx.out.take(), to_out);
        assert_eq!(fx.err.take(), to_err);
        fx.expect_counts(0, 0);
    }
}

#[test]
fn files_open_write_seek_read_tell_unget_and_close() {
    for fx in Fx::each("files") {
        let names = per_lane(|l| fx.path(&format!("lane{l}.txt")));
        let paths = per_lane(|l| cpath(&names[l as usize]));
        let handles = fx.fopen(&paths, "w+");
        let mut seen = std::collections::HashSet::new();
        for l in fx.lanes() {
            let h = handles[l as usize];
            assert!(h != 0 && h & 3 == 0, "lane {l}: handle {h:#x}");
            assert!(seen.insert(h), "handles are distinct");
        }
        assert_eq!(fx.services().open_files(), fx.lanes().len());

        let text = per_lane(|l| format!("first {l}\nsecond line\nthird").into_bytes());
        let out = fx.write_to_stream(&handles, &text);
        for l in fx.lanes() {
            assert_eq!(out[l as usize], text[l as usize].len() as u64);
        }
        let out = fx.on_handles(Opcode::FFLUSH, &handles);
        let out_tell = fx.on_handles(Opcode::FTELL, &handles);
        for l in fx.lanes() {
            assert_eq!(out[l as usize], 0);
            assert_eq!(out_tell[l as usize], text[l as usize].len() as u64);
            let on_disk = std::fs::read(&names[l as usize]).unwrap();
            assert_eq!(on_disk, text[l as usize], "lane {l}");
        }

        // fseek(f, 0, SEEK_SET), then fread everything.
        let out = fx.words(Opcode::FSEEK, |l| vec![handles[l as usize], 0, 0]);
        for l in fx.lanes() {
            assert_eq!(out[l as usize], 0);
        }
        let (data, count) = fx.fread(1000, &handles);
        let feof = fx.on_handles(Opcode::FEOF, &handles);
        for l in fx.lanes() {
            assert_eq!(data[l as usize], text[l as usize]);
            assert_eq!(count[l as usize], text[l as usize].len() as u64);
            assert_eq!(feof[l as usize], 1, "short fread sets EOF");
        }

        // fseek(f, -5, SEEK_END) (a negative offset as an i64 in the word).
        let out = fx.words(Opcode::FSEEK, |l| {
            vec![handles[l as usize], -5i64 as u64, 2]
        });
        let tell = fx.on_handles(Opcode::FTELL, &handles);
        let feof = fx.on_handles(Opcode::FEOF, &handles);
        for l in fx.lanes() {
            assert_eq!(out[l as usize], 0);
            assert_eq!(tell[l as usize], text[l as usize].len() as u64 - 5);
            assert_eq!(feof[l as usize], 0, "fseek clears EOF");
        }
        let (data, _) = fx.fread(1000, &handles);
        for l in fx.lanes() {
            assert_eq!(data[l as usize], b"third");
        }

        // Back to the start; fgets line by line; ungetc; ferror; clearerr.
        fx.words(Opcode::FSEEK, |l| vec![handles[l as usize], 0, 0]);
        let lines = fx.fgets(100, &handles);
        for l in fx.lanes() {
            assert_eq!(lines[l as usize], format!("first {l}\n\0").into_bytes());
        }
        let lines = fx.fgets(4, &handles);
        for l in fx.lanes() {
            assert_eq!(lines[l as usize], b"sec\0");
        }
        let out = fx.words(Opcode::UNGETC, |l| {
            vec![u64::from(b'A' + l as u8), handles[l as usize]]
        });
        for l in fx.lanes() {
            assert_eq!(out[l as usize], u64::from(b'A' + l as u8));
        }
        let lines = fx.fgets(100, &handles);
        for l in fx.lanes() {
            let expect = format!("{}ond line\n\0", char::from(b'A' + l as u8));
            assert_eq!(lines[l as usize], expect.into_bytes());
        }
        let lines = fx.fgets(100, &handles);
        let at_end = fx.fgets(100, &handles);
        let ferror = fx.on_handles(Opcode::FERROR, &handles);
        let feof = fx.on_handles(Opcode::FEOF, &handles);
        for l in fx.lanes() {
            assert_eq!(lines[l as usize], b"third\0");
            assert!(at_end[l as usize].is_empty(), "fgets at EOF sends 0 bytes");
            assert_eq!(ferror[l as usize], 0);
            assert_eq!(feof[l as usize], 1);
        }
        let mut port = fx.open(Opcode::CLEARERR);
        let mut echoed = [0u64; 64];
        port.send_and_recv(
            |l, p| {
                p.set_word(0, handles[l as usize]);
                p.set_word(5, 55);
            },
            |l, p| echoed[l as usize] = p.word(0) ^ p.word(5),
        )
        .unwrap();
        drop(port);
        let feof = fx.on_handles(Opcode::FEOF, &handles);
        for l in fx.lanes() {
            assert_eq!(
                echoed[l as usize],
                handles[l as usize] ^ 55,
                "sent back unchanged"
            );
            assert_eq!(feof[l as usize], 0, "clearerr clears EOF");
        }
        // fflush(NULL) flushes everything.
        let out = fx.on_handles(Opcode::FFLUSH, &[0; 64]);
        for l in fx.lanes() {
            assert_eq!(out[l as usize], 0);
        }

        let out = fx.on_handles(Opcode::CLOSE_FILE, &handles);
        for l in fx.lanes() {
            assert_eq!(out[l as usize], 0);
        }
        assert_eq!(fx.services().open_files(), 0);

        // Reopen for reading: "r" works, a missing file gives 0 without a refusal.
        let handles = fx.fopen(&paths, "r");
        let missing = fx.fopen(&per_lane(|_| cpath(&fx.path("missing"))), "r");
        for l in fx.lanes() {
            assert_ne!(handles[l as usize], 0);
            assert_eq!(missing[l as usize], 0);
        }
        let (data, _) = fx.fread(3, &handles);
        for l in fx.lanes() {
            assert_eq!(data[l as usize], b"fir");
        }
        fx.on_handles(Opcode::CLOSE_FILE, &handles);
        fx.expect_counts(0, 0);
    }
}

#[test]
fn stdin_reads_in_lane_order() {
    for fx in Fx::each("stdin") {
        let n = fx.lanes().len();
        let mut input = String::new();
        for i in 0..n {
            input.push_str(&format!("line {i}\n"));
        }
        input.push_str("tail");
        fx.services()
            .set_stdin(Box::new(std::io::Cursor::new(input.into_bytes())));
        let stdin = [1u64; 64];
        let lines = fx.fgets(100, &stdin);
        for (i, l) in fx.lanes().into_iter().enumerate() {
            assert_eq!(lines[l as usize], format!("line {i}\n\0").into_bytes());
        }
        let first = fx.lanes()[0] as usize;
        let out = fx.words(Opcode::UNGETC, |l| vec![u64::from(b'0' + l as u8), 1]);
        // One byte of pushback, as C guarantees: the first lane's; the others get EOF.
        assert_eq!(out[first], u64::from(b'0' + first as u8));
        for &l in &fx.lanes()[1..] {
            assert_eq!(out[l as usize], MINUS_ONE, "lane {l}: a second ungetc");
        }
        let (data, count) = fx.fread(2, &stdin);
        // The pushback is read first, before "tail".
        let mut all: Vec<u8> = Vec::new();
        for l in fx.lanes() {
            assert_eq!(count[l as usize], data[l as usize].len() as u64);
            all.extend(&data[l as usize]);
        }
        let expect: Vec<u8> = std::iter::once(b'0' + first as u8)
            .chain(*b"tail")
            .take(2 * n)
            .collect();
        assert_eq!(all, expect);
        let (_, _) = fx.fread(100, &stdin);
        let feof = fx.on_handles(Opcode::FEOF, &stdin);
        let ftell = fx.on_handles(Opcode::FTELL, &stdin);
        let fseek = fx.words(Opcode::FSEEK, |_| vec![1, 0, 0]);
        for l in fx.lanes() {
            assert_eq!(feof[l as usize], 1);
            assert_eq!(ftell[l as usize], MINUS_ONE, "stdin does not tell");
            assert_eq!(fseek[l as usize], MINUS_ONE, "stdin does not seek");
        }
        fx.expect_counts(0, 0);
    }
}

#[test]
fn remove_and_rename() {
    for fx in Fx::each("remove") {
        for l in fx.lanes() {
            std::fs::write(fx.path(&format!("a{l}")), format!("{l}")).unwrap();
        }
        let old = per_lane(|l| cpath(&fx.path(&format!("a{l}"))));
        let new = per_lane(|l| cpath(&fx.path(&format!("b{l}"))));
        let out = fx.rename(&old, &new);
        for l in fx.lanes() {
            assert_eq!(out[l as usize], 0);
            assert!(!fx.path(&format!("a{l}")).exists());
            assert_eq!(
                std::fs::read_to_string(fx.path(&format!("b{l}"))).unwrap(),
                format!("{l}")
            );
        }
        let out = fx.send_n_then_word(Opcode::REMOVE, &new);
        for l in fx.lanes() {
            assert_eq!(out[l as usize], 0);
            assert!(!fx.path(&format!("b{l}")).exists());
        }
        // As C: removing a missing file is -1, not a refusal.
        let out = fx.send_n_then_word(Opcode::REMOVE, &new);
        for l in fx.lanes() {
            assert_eq!(out[l as usize], MINUS_ONE);
        }
        fx.expect_counts(0, 0);
    }
}

#[test]
fn file_policy_confines_paths_to_a_directory() {
    for fx in Fx::each("policy") {
        let jail = fx.path("jail");
        std::fs::create_dir_all(&jail).unwrap();
        std::fs::write(fx.path("outside.txt"), "secret").unwrap();
        std::fs::write(jail.join("inside.txt"), "ok").unwrap();
        fx.services()
            .set_file_policy(FilePolicy::Sandbox(jail.clone()));

        let outside = per_lane(|_| cpath(&jail.join("../outside.txt")));
        let inside = per_lane(|_| cpath(&jail.join("inside.txt")));
        let out = fx.fopen(&outside, "r");
        assert!(fx.lanes().iter().all(|&l| out[l as usize] == 0));
        fx.expect_counts(1, 0);
        let out = fx.send_n_then_word(Opcode::REMOVE, &outside);
        assert!(fx.lanes().iter().all(|&l| out[l as usize] == MINUS_ONE));
        fx.expect_counts(2, 0);
        let out = fx.rename(&inside, &outside);
        assert!(fx.lanes().iter().all(|&l| out[l as usize] == MINUS_ONE));
        fx.expect_counts(3, 0);
        assert_eq!(
            std::fs::read_to_string(fx.path("outside.txt")).unwrap(),
            "secret"
        );

        let handles = fx.fopen(&inside, "r");
        let (data, _) = fx.fread(10, &handles);
        for l in fx.lanes() {
            assert_eq!(data[l as usize], b"ok");
        }
        fx.on_handles(Opcode::CLOSE_FILE, &handles);

        fx.services().set_file_policy(FilePolicy::Deny);
        let out = fx.fopen(&inside, "r");
        assert!(fx.lanes().iter().all(|&l| out[l as usize] == 0));
        fx.expect_counts(4, 0);
        // A bad mode is refused whatever the policy.
        fx.services().set_file_policy(FilePolicy::Allow);
        let out = fx.fopen(&inside, "r,ccs=UTF-8");
        assert!(fx.lanes().iter().all(|&l| out[l as usize] == 0));
        fx.expect_counts(5, 0);
    }
}

#[test]
fn malloc_and_free_through_the_plugin_allocator() {
    for fx in Fx::each("malloc") {
        // No allocator: 0 and a refusal.
        let out = fx.words(Opcode::MALLOC, |_| vec![64]);
        assert!(fx.lanes().iter().all(|&l| out[l as usize] == 0));
        fx.expect_counts(1, 0);

        let allocator = Arc::new(HeapAllocator::default());
        fx.services().set_allocator(allocator.clone());
        // Small sizes (chunks of slabs, one slab per chunk size) and one above SMALL_MAX (a
        // block of its own, 2 MiB aligned).
        let size = |l: u32| match l {
            0 => SMALL_MAX + 1,
            l => 100 + u64::from(l),
        };
        let out = fx.words(Opcode::MALLOC, |l| vec![size(l)]);
        let mut live = Vec::new();
        let mut blocks = std::collections::BTreeSet::new();
        for l in fx.lanes() {
            let addr = out[l as usize];
            let align = malloc_alignment(size(l));
            assert!(addr != 0 && addr % align == 0, "lane {l}: {addr:#x}");
            // It is real memory (the "device" is the host here).
            // SAFETY: the allocator handed out at least 100 bytes at `addr`.
            unsafe { std::ptr::write_bytes(addr as *mut u8, 0xab, 100) };
            let usable = if align == MALLOC_ALIGN {
                size(l)
            } else {
                align
            };
            live.push((addr, usable));
            blocks.insert(align);
        }
        live.sort();
        let reported: Vec<_> = fx
            .services()
            .live_allocations()
            .iter()
            .map(|a| (a.addr, a.size))
            .collect();
        assert_eq!(reported, live);
        assert_eq!(
            allocator.live(),
            blocks.len(),
            "a block or slab per alignment"
        );

        let mut port = fx.open(Opcode::FREE);
        port.send(|l, p| p.set_word(0, out[l as usize])).unwrap();
        drop(port);
        let start = Instant::now();
        // FREE drops the server's record before it calls the allocator, so the allocator
        // emptying last means both are done.
        while allocator.live() != 0 {
            assert!(start.elapsed() < Duration::from_secs(10));
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(fx.services().live_allocations().is_empty());
        // malloc(0) is 0, free(NULL) is nothing.
        let zero = fx.words(Opcode::MALLOC, |_| vec![0]);
        assert!(fx.lanes().iter().all(|&l| zero[l as usize] == 0));
        fx.open(Opcode::FREE).send(|_, p| p.set_word(0, 0)).unwrap();
        fx.expect_counts(1, 0);
        let served = fx.server.stats().served_of(Opcode::FREE);
        assert!(served >= 1);
    }
}

#[test]
fn host_calls_run_only_registered_functions() {
    for fx in Fx::each("host-call") {
        let sum = |args: &[u8]| args.iter().map(|&b| u64::from(b)).sum::<u64>() + 1_000_000;
        fx.services().register_host_function(0x4000, Arc::new(sum));
        let args = per_lane(|l| (0..(l as u8 * 3)).collect::<Vec<u8>>());
        for opcode in [Opcode::HOST_CALL, Opcode::OFFLOAD_HOST_CALL] {
            let out = fx.host_call(opcode, &args, 0x4000);
            for l in fx.lanes() {
                assert_eq!(out[l as usize], sum(&args[l as usize]), "{opcode} lane {l}");
            }
        }
        fx.expect_counts(0, 0);
        // Each refused call answers HOST_CALL_REFUSED on every lane and counts a refusal.
        let refused = |opcode, function, refusals| {
            let out = fx.host_call(opcode, &args, function);
            assert!(fx
                .lanes()
                .iter()
                .all(|&l| out[l as usize] == HOST_CALL_REFUSED));
            fx.expect_counts(refusals, 0);
        };
        refused(Opcode::HOST_CALL, 0x4001, 1);
        fx.services().register_host_function(
            0x5000,
            Arc::new(|_: &[u8]| {
                // A panic that skips the panic hook, whose backtrace (RUST_BACKTRACE=1) takes
                // seconds to symbolize under a sanitizer; the server sees the same unwind.
                std::panic::resume_unwind(Box::new("host function bug"))
            }),
        );
        refused(Opcode::HOST_CALL, 0x5000, 2);
        assert!(fx.services().unregister_host_function(0x4000));
        refused(Opcode::OFFLOAD_HOST_CALL, 0x4000, 3);
    }
}

#[test]
fn system_only_when_allowed() {
    for fx in Fx::each("system") {
        let marker = fx.path("ran");
        let commands = per_lane(|_| cstr(&format!("touch '{}'; exit 3", marker.display())));
        let out = fx.send_n_then_word(Opcode::SYSTEM, &commands);
        assert!(fx.lanes().iter().all(|&l| out[l as usize] == MINUS_ONE));
        assert!(!marker.exists(), "a denied command does not run");
        fx.expect_counts(1, 0);
        fx.services().set_system_allowed(true);
        let out = fx.send_n_then_word(Opcode::SYSTEM, &commands);
        for l in fx.lanes() {
            assert_eq!(out[l as usize], 3 << 8, "the wait status of exit 3");
        }
        assert!(marker.exists());
        fx.expect_counts(1, 0);
    }
}

#[test]
fn exit_and_abort_are_recorded_per_mailbox() {
    for fx in Fx::each("exit") {
        let mut port = fx.open(Opcode::EXIT);
        port.send_and_recv(|_, _| {}, |_, _| {}).unwrap();
        port.send(|l, p| p.set_word(0, 0xdead_0000_0000 | (7 + u64::from(l))))
            .unwrap();
        drop(port);
        let first = fx.lanes()[0];
        let start = Instant::now();
        let exit = loop {
            if let Some(exit) = fx.services().take_exit(fx.mailbox.id) {
                break exit;
            }
            assert!(start.elapsed() < Duration::from_secs(10));
            std::thread::sleep(Duration::from_millis(1));
        };
        assert_eq!(exit, KernelExit::Exit(7 + first as i32));
        assert_eq!(fx.services().take_exit(fx.mailbox.id), None);

        let mut port = fx.open(Opcode::ABORT);
        port.send_and_recv(|_, _| {}, |_, _| {}).unwrap();
        port.send(|_, _| {}).unwrap();
        drop(port);
        let start = Instant::now();
        while fx.server.stats().served_of(Opcode::ABORT) == 0 {
            assert!(start.elapsed() < Duration::from_secs(10));
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(
            fx.services().take_exit(fx.mailbox.id),
            Some(KernelExit::Abort)
        );
        // The server keeps serving.
        let out = fx.words(Opcode::TEST_INCREMENT, |_| vec![1]);
        assert_eq!(out[first as usize], 2);
    }
}

const CHILD: &str = "RPC_SERVICES_EXIT_CHILD";

/// Run as a child process by `the_default_exit_policy_ends_the_process`: a server with the
/// default policy, whose device exits (or aborts). Does nothing in a normal test run.
#[test]
fn exit_child() {
    let Ok(how) = std::env::var(CHILD) else {
        return;
    };
    let fx = Fx::with("exit-child", 1, 1, |c| {
        c.services = ServicesConfig::default()
    });
    // The process ends before `fx` drops: remove its directory now.
    std::fs::remove_dir_all(&fx.dir).unwrap();
    let mut port = fx.open(if how == "abort" {
        Opcode::ABORT
    } else {
        Opcode::EXIT
    });
    port.send_and_recv(|_, _| {}, |_, _| {}).unwrap();
    port.send(|_, p| p.set_word(0, 42)).unwrap();
    drop(port);
    std::thread::sleep(Duration::from_secs(20));
    panic!("the process should have ended");
}

#[test]
fn the_default_exit_policy_ends_the_process() {
    use std::os::unix::process::ExitStatusExt;
    let run = |how: &str| {
        std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "exit_child", "--nocapture", "--test-threads=1"])
            .env(CHILD, how)
            .output()
            .unwrap()
            .status
    };
    assert_eq!(run("exit").code(), Some(42));
    assert_eq!(run("abort").signal(), Some(libc::SIGABRT));
}

// ---- Refusals: each gets the C error value and a log line, and the server keeps serving.

#[test]
fn bad_stream_handles_get_error_results() {
    for fx in Fx::each("bad-handles") {
        let paths = per_lane(|l| cpath(&fx.path(&format!("f{l}"))));
        let live = fx.fopen(&paths, "w+");
        let stale = live;
        fx.on_handles(Opcode::CLOSE_FILE, &stale);
        let newer = fx.fopen(&paths, "w+");
        // Stale handles, garbage, and a "pointer" with the file tag.
        for (round, bad) in [stale, [0x1234_5670; 64], [0xdead_beef_0000; 64]]
            .into_iter()
            .enumerate()
        {
            let refused = std::cell::Cell::new(fx.server.stats().refused);
            let expect = |out: [u64; 64], value: u64, what: &str| {
                for l in fx.lanes() {
                    assert_eq!(out[l as usize], value, "round {round} {what} lane {l}");
                }
                refused.set(refused.get() + 1);
                fx.expect_counts(refused.get(), 0);
            };
            let data = per_lane(|_| b"never".to_vec());
            expect(fx.write_to_stream(&bad, &data), 0, "WRITE_TO_STREAM");
            let (read, count) = fx.fread(100, &bad);
            assert!(read.iter().all(Vec::is_empty));
            expect(count, 0, "READ_FROM_STREAM");
            let lines = fx.fgets(100, &bad);
            assert!(lines.iter().all(Vec::is_empty));
            refused.set(refused.get() + 1);
            fx.expect_counts(refused.get(), 0);
            expect(fx.on_handles(Opcode::FEOF, &bad), 1, "FEOF");
            expect(fx.on_handles(Opcode::FERROR, &bad), 1, "FERROR");
            let echoed = fx.on_handles(Opcode::CLEARERR, &bad);
            let first = fx.lanes()[0] as usize;
            assert!(fx
                .lanes()
                .iter()
                .all(|&l| echoed[l as usize] == bad[l as usize]));
            expect(echoed.map(|_| echoed[first]), bad[first], "CLEARERR");
            expect(
                fx.words(Opcode::FSEEK, |l| vec![bad[l as usize], 0, 0]),
                MINUS_ONE,
                "FSEEK",
            );
            expect(fx.on_handles(Opcode::FTELL, &bad), MINUS_ONE, "FTELL");
            expect(fx.on_handles(Opcode::FFLUSH, &bad), EOF, "FFLUSH");
            expect(
                fx.words(Opcode::UNGETC, |l| vec![u64::from(b'x'), bad[l as usize]]),
                EOF,
                "UNGETC",
            );
            expect(fx.on_handles(Opcode::CLOSE_FILE, &bad), EOF, "CLOSE_FILE");
            let formats = per_lane(|_| cstr("never %d\n"));
            let args = per_lane(|_| 5u32.to_le_bytes().to_vec());
            let (results, asked, sizes) = fx.printf(
                Opcode::PRINTF_TO_STREAM,
                Some(&bad),
                &formats,
                &args,
                &HashMap::new(),
            );
            assert!(asked.iter().all(Vec::is_empty));
            for l in fx.lanes() {
                assert_eq!(sizes[l as usize], 0);
            }
            expect(results.map(|r| r as u64), MINUS_ONE, "PRINTF_TO_STREAM");
        }
        // The standard streams cannot be closed.
        let refused = fx.server.stats().refused;
        let out = fx.on_handles(Opcode::CLOSE_FILE, &[2; 64]);
        assert!(fx.lanes().iter().all(|&l| out[l as usize] == EOF));
        fx.expect_counts(refused + 1, 0);

        // The newer files, in the slots the stale handles named, are untouched and work.
        let data = per_lane(lane_text);
        let out = fx.write_to_stream(&newer, &data);
        fx.on_handles(Opcode::CLOSE_FILE, &newer);
        for l in fx.lanes() {
            assert_eq!(out[l as usize], data[l as usize].len() as u64);
            assert_eq!(
                std::fs::read(fx.path(&format!("f{l}"))).unwrap(),
                data[l as usize]
            );
        }
        assert!(fx.out.take().is_empty() && fx.err.take().is_empty());
        fx.expect_counts(refused + 1, 0);
    }
}

#[test]
fn free_of_foreign_or_freed_pointers_is_refused() {
    for fx in Fx::each("bad-free") {
        let allocator = Arc::new(HeapAllocator::default());
        fx.services().set_allocator(allocator.clone());
        let out = fx.words(Opcode::MALLOC, |_| vec![10]);
        fx.free(|_| 0x1000);
        fx.expect_counts(1, 0);
        // Inside a chunk, never where one starts.
        fx.free(|l| out[l as usize] + 8);
        fx.expect_counts(2, 0);
        let live = fx.services().live_allocations().len();
        assert_eq!(live, fx.lanes().len(), "nothing was freed");
        assert_eq!(allocator.live(), 1, "the lanes' chunks share a slab");
        fx.free(|l| out[l as usize]);
        fx.expect_counts(2, 0);
        assert_eq!(allocator.live(), 0);
        fx.free(|l| out[l as usize]);
        fx.expect_counts(3, 0);
        let out = fx.words(Opcode::TEST_INCREMENT, |_| vec![41]);
        assert!(fx.lanes().iter().all(|&l| out[l as usize] == 42));
    }
}

/// MALLOC is charged what it holds: MALLOC(1) after MALLOC(1) share one slab of 2 MiB, the
/// quota counts the slab (with its padding, in pages), and the next slab that would pass the
/// quota is refused, so the allocator never holds more than the quota (before, each MALLOC(1)
/// held a block of 2 MiB and the quota counted 1 byte). Every address frees, the last chunk
/// frees the slab, foreign and double FREEs are refused, and a detach frees what is left.
#[test]
fn small_mallocs_share_slabs_and_the_quota_counts_what_the_allocator_holds() {
    // Room for one slab of 16-byte chunks (2 MiB and 15 bytes of padding: a page more), not two.
    let quota = 3 << 20;
    let fx = Fx::with("malloc-small", 64, u64::MAX, |c| {
        c.limits.malloc_bytes = quota;
    });
    let allocator = Arc::new(HeapAllocator::default());
    fx.services().set_allocator(allocator.clone());
    let mut addrs = Vec::new();
    loop {
        let out = fx.words(Opcode::MALLOC, |_| vec![1]);
        assert!(
            allocator.bytes() <= quota,
            "{} bytes held",
            allocator.bytes()
        );
        let got: Vec<u64> = out[..].iter().copied().filter(|&a| a != 0).collect();
        addrs.extend_from_slice(&got);
        if got.len() < 64 {
            break;
        }
    }
    let chunks = (2 << 20) / 16;
    assert_eq!(addrs.len(), chunks, "one slab's chunks, then refusals");
    assert_eq!((allocator.live(), allocator.bytes()), (1, (2 << 20) + 15));
    fx.expect_counts(1, 0);
    let distinct: std::collections::BTreeSet<u64> = addrs.iter().copied().collect();
    assert_eq!(distinct.len(), chunks);
    assert!(addrs.iter().all(|a| a % 16 == 0));

    // Foreign: inside a chunk; then every chunk freed, the last taking the slab with it.
    fx.free(|l| addrs[l as usize] + 4);
    fx.expect_counts(2, 0);
    for batch in addrs.chunks(64) {
        fx.free(|l| batch[l as usize]);
    }
    assert_eq!((allocator.live(), allocator.bytes()), (0, 0));
    fx.free(|l| addrs[l as usize]);
    fx.expect_counts(3, 0);
    assert!(fx.services().live_allocations().is_empty());

    // The quota is free again; and a detach frees what a mailbox holds.
    let other = fx.second_mailbox();
    other
        .services()
        .set_mailbox_allocator(other.mailbox.id, allocator.clone());
    let mine = fx.words(Opcode::MALLOC, |_| vec![1]);
    let theirs = other.words(Opcode::MALLOC, |l| vec![u64::from(l % 16) + 1]);
    assert!(mine.iter().chain(&theirs).all(|&a| a != 0));
    assert_eq!(
        allocator.live(),
        2,
        "a slab each: the other's quota is its own"
    );
    fx.server.detach(other.mailbox.id).unwrap();
    assert_eq!(allocator.live(), 1);
    assert_eq!(fx.services().live_allocations().len(), 64);
}

/// Beyond the server's memory budget (`Limits::held_bytes`) a byte string is received and dropped
/// and its request answered with the C function's error value (a refusal), a read is served in
/// part; within it all is served, and nothing stays charged.
#[test]
fn the_memory_budget_refuses_byte_strings_and_shortens_reads_beyond_it() {
    let fx = Fx::with("held", 1, 1, |c| c.limits.held_bytes = 1000);
    let long = per_lane(|_| vec![b'x'; 2000]);
    assert_eq!(fx.send_n_then_word(Opcode::WRITE_TO_STDOUT, &long)[0], 0);
    assert!(fx.out.take().is_empty());
    fx.expect_counts(1, 0);
    let path = per_lane(|_| [cpath(&fx.path("a")), vec![b'/'; 1500]].concat());
    assert_eq!(fx.fopen(&path, "w")[0], 0);
    assert_eq!(fx.send_n_then_word(Opcode::REMOVE, &path)[0], MINUS_ONE);
    fx.expect_counts(3, 0);
    // printf: a format, and a `%s` string, beyond the budget.
    let none = HashMap::new();
    let format = per_lane(|_| [vec![b'f'; 1200], b"\0".to_vec()].concat());
    let no_args = per_lane(|_| Vec::new());
    let (results, _, _) = fx.printf(Opcode::PRINTF_TO_STDOUT, None, &format, &no_args, &none);
    assert_eq!(results[0], -1);
    let string = HashMap::from([(0x1000u64, vec![b's'; 1500])]);
    let format = per_lane(|_| b"%s\0".to_vec());
    let args = per_lane(|_| 0x1000u64.to_le_bytes().to_vec());
    let (results, asked, _) = fx.printf(Opcode::PRINTF_TO_STDOUT, None, &format, &args, &string);
    assert_eq!((results[0], &asked[0][..]), (-1, &[0x1000][..]));
    assert!(fx.out.take().is_empty());
    fx.expect_counts(5, 0);
    let fits = per_lane(|_| vec![b'y'; 900]);
    assert_eq!(fx.send_n_then_word(Opcode::WRITE_TO_STDOUT, &fits)[0], 900);
    assert_eq!(fx.out.take(), vec![b'y'; 900]);
    fx.services()
        .set_stdin(Box::new(std::io::Cursor::new(vec![b'z'; 5000])));
    let (data, count) = fx.fread(4096, &[1; 64]);
    assert_eq!((data[0].len(), count[0]), (1000, 1000), "served in part");
    fx.expect_counts(5, 0);
    // Released when each handler ends, which may be just after its reply.
    let start = Instant::now();
    while fx.server.context().held_bytes() != 0 {
        assert!(start.elapsed() < Duration::from_secs(10), "a charge kept");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// A lane claiming a byte string above the bound ends the exchange at once, whatever the opcode: the
/// server keeps no byte of it, counts an error and drains the port (PROTOCOL section 11). The
/// rest of the client's script is answered without being read, its reply is the opcode's
/// failure word, nothing is printed, and the same port serves the kernel's next request at once
/// (before, it stayed locked until the kernel was gone, and the client hung).
#[test]
fn a_byte_string_above_the_bound_ends_the_exchange_at_once() {
    for (lanes, mask) in CONFIGS {
        for opcode in [
            Opcode::WRITE_TO_STDOUT,
            Opcode::OPEN_FILE,
            Opcode::SYSTEM,
            Opcode::TEST_STREAM,
            Opcode::PRINTF_TO_STDOUT,
        ] {
            let fx = Fx::new("too-long", lanes, mask);
            let first = fx.lanes()[0];
            let data = per_lane(|l| {
                if l == first {
                    vec![b'z'; BOUND as usize + 1]
                } else {
                    lane_text(l)
                }
            });
            let client = fx.client();
            let mut port = client.open(opcode, mask).unwrap();
            let index = port.index();
            port.send_n(&slices(&data)).unwrap();
            if opcode == Opcode::OPEN_FILE {
                port.send(|_, p| p.write_bytes(0, b"w\0")).unwrap();
            }
            let mut replies = vec![None; lanes as usize];
            port.recv(|l, p| replies[l as usize] = Some(p.word(0)))
                .unwrap();
            drop(port);
            for l in fx.lanes() {
                assert_eq!(
                    replies[l as usize],
                    Some(opcode.failure_word()),
                    "{opcode} lane {l}"
                );
            }
            fx.expect_counts(0, 1);
            assert!(fx.out.take().is_empty(), "{opcode}: nothing printed");
            let mut port = client
                .try_open_at(index, Opcode::TEST_INCREMENT, mask)
                .unwrap()
                .expect("the drained port is free at once");
            let mut out = vec![0; lanes as usize];
            port.send_and_recv(
                |l, p| p.set_word(0, u64::from(l)),
                |l, p| out[l as usize] = p.word(0),
            )
            .unwrap();
            assert!(fx
                .lanes()
                .iter()
                .all(|&l| out[l as usize] == u64::from(l) + 1));
        }
    }
}

// ---- printf

/// The table, with strings that differ per lane.
fn rows(lane: u32) -> Vec<Row> {
    let ls = |text: &str| s(&format!("{text}{lane}"));
    let long = "0123456789abcdef".repeat(12) + &lane.to_string();
    vec![
        row!(c"hello, world\n";),
        row!(c"%d %i %u|\n"; I(-42), I(lane as i32), U(4_000_000_000)),
        row!(c"%s and %s\n"; ls("alpha"), ls("beta")),
        row!(c"%s|%s|%s|\n"; NULL, ls("x"), NULL),
        row!(c"[%-10s|%10s]\n"; ls("left"), ls("right")),
        row!(c"%.3s|%.10s|\n"; ls("truncate"), ls("sh")),
        row!(c"%5.2f %e %g\n"; D(3.25159), D(12345.678), D(0.0001 * f64::from(lane + 1))),
        row!(c"%x %X %o %#x %#o\n"; U(255), U(0xABCDEF), U(8), U(255 + lane), U(8)),
        row!(c"%ld %lu %lld\n"; L(-1 << 40), UL(u64::MAX), L(i64::MIN)),
        row!(c"%c%c%c\n"; Ch(b'a'), Ch(b'b' + lane as u8 % 20), Ch(b'c')),
        row!(c"%p %p\n"; P(0xdead_beef), P(0x7f00_0000_1000 + u64::from(lane))),
        row!(c"[%*d|%-*d]\n"; I(6), I(42), I(6), I(lane as i32)),
        row!(c"%.*f|%*.*s|\n"; I(2), D(2.5189), I(8), I(3), ls("precise")),
        row!(c"100%% %s %%\n"; ls("pct")),
        row!(c"%hd %hhu %hx\n"; I(70_000), I(300), I(-1)),
        row!(c"%s=%d, %s=%lu, %s\n"; ls("a"), I(1), ls("b"), UL(2), NULL),
        row!(c"%+d % d %05d %-5d|\n"; I(5), I(5), I(-5), I(-5)),
        row!(c"%a %A\n"; D(1.5), D(-0.125)),
        row!(c"[%10.4s]\n"; ls("abcdefgh")),
        row!(c"%s%s%s%s%s\n"; s("1"), s("22"), s(""), ls("333"), s("55555")),
        row!(c"%zu %jd %td\n"; UL(12), L(-12), L(34)),
        row!(c"mixed %c %s %d %f %s\n"; Ch(b'Z'), ls("str"), I(9), D(-0.5), NULL),
        row!(c"[%.2s|%.0s|%8s]\n"; NULL, ls("x"), NULL),
        row!(c"long: %s\n"; s(&long)),
        row!(c"%s %d %s %ld %s %f %s\n"; ls("s1"), I(1), ls("s2"), L(2), ls("s3"), D(3.0), ls("s4")),
    ]
}

#[test]
fn printf_matches_the_host_snprintf_packed_and_unpacked() {
    let mut checked = 0;
    for fx in Fx::each("printf") {
        let table: Vec<Vec<Row>> = (0..64).map(rows).collect();
        assert!(table[0].len() >= 20);
        let files = per_lane(|l| cpath(&fx.path(&format!("printf{l}"))));
        let handles = fx.fopen(&files, "w");
        let mut in_files: Vec<Vec<u8>> = vec![Vec::new(); 64];
        for (r, row) in table[0].iter().enumerate() {
            for (packed, opcodes) in [
                (
                    false,
                    [
                        Opcode::PRINTF_TO_STDOUT,
                        Opcode::PRINTF_TO_STDERR,
                        Opcode::PRINTF_TO_STREAM,
                    ],
                ),
                (
                    true,
                    [
                        Opcode::PRINTF_TO_STDOUT_PACKED,
                        Opcode::PRINTF_TO_STDERR_PACKED,
                        Opcode::PRINTF_TO_STREAM_PACKED,
                    ],
                ),
            ] {
                let formats = per_lane(|_| row.format.to_bytes_with_nul().to_vec());
                let mut memory = HashMap::new();
                let mut args = vec![Vec::new(); 64];
                let mut pointers = vec![Vec::new(); 64];
                for l in fx.lanes() {
                    let (buf, strings, ptrs) = encode(l, &table[l as usize][r].args, packed);
                    args[l as usize] = buf;
                    memory.extend(strings);
                    pointers[l as usize] = ptrs;
                }
                let opcode = opcodes[r % 3];
                let stream = (opcode == opcodes[2]).then_some(&handles);
                // Twice: the second time, a plain format comes from the worker's kept formats
                // (`printf::cache`), not parsed again.
                for time in ["first", "again"] {
                    let (results, asked, sizes) =
                        fx.printf(opcode, stream, &formats, &args, &memory);
                    let what = format!("L={} {opcode} {:?} ({time})", fx.lanes, row.format);
                    let mut expect = Vec::new();
                    for l in fx.lanes() {
                        let i = l as usize;
                        let reference = &table[i][r].reference;
                        assert_eq!(sizes[i], args[i].len() as u64, "{what} lane {l}: args size");
                        let mut last_first = pointers[i].clone();
                        last_first.reverse();
                        assert_eq!(asked[i], last_first, "{what} lane {l}: fetch order");
                        assert_eq!(results[i], reference.len() as i64, "{what} lane {l}");
                        if stream.is_some() {
                            in_files[i].extend(reference);
                        } else {
                            expect.extend(reference);
                        }
                    }
                    let got = match r % 3 {
                        0 => fx.out.take(),
                        1 => fx.err.take(),
                        _ => Vec::new(),
                    };
                    let lossy = String::from_utf8_lossy;
                    assert_eq!(lossy(&got), lossy(&expect), "{what}");
                    assert_eq!(got, expect, "{what}");
                    checked += 1;
                }
            }
        }
        let out = fx.on_handles(Opcode::CLOSE_FILE, &handles);
        for l in fx.lanes() {
            assert_eq!(out[l as usize], 0);
            let on_disk = std::fs::read(fx.path(&format!("printf{l}"))).unwrap();
            assert_eq!(
                on_disk, in_files[l as usize],
                "lane {l}: PRINTF_TO_STREAM output"
            );
        }
        fx.expect_counts(0, 0);
    }
    assert!(checked >= 2 * 2 * 2 * 20);
}

/// LLVM's own client (`cargo xtask llvm-client`) found this: `%5%` was refused (-1, nothing
/// printed) where LLVM's servers, both generations, and glibc print `%`. A specification that
/// ends in `%` prints `%` whatever its flags, width, precision or length; it takes no value,
/// only the 4-byte argument of each `*` (as LLVM sizes the buffer, and glibc reads it).
#[test]
fn printf_percent_with_flags_or_width_prints_a_percent_as_llvm_does() {
    for fx in Fx::each("printf-percent") {
        let formats = per_lane(|_| cstr("[%5%|%-05%|%.3%|%l%|%+ #%|%*%|%-*.*%] %d\n"));
        let args = per_lane(|l| {
            let words = [-5, 6, 7, l as i32];
            words.iter().flat_map(|w| w.to_le_bytes()).collect()
        });
        let (results, asked, sizes) = fx.printf_stdout(&formats, &args);
        let mut expect = Vec::new();
        for l in fx.lanes() {
            let text = format!("[%|%|%|%|%|%|%] {l}\n");
            assert_eq!(
                sizes[l as usize], 16,
                "the three `*`s and the %d take arguments"
            );
            assert_eq!(results[l as usize], text.len() as i64);
            assert!(asked[l as usize].is_empty());
            expect.extend(text.into_bytes());
        }
        assert_eq!(fx.out.take(), expect);
        fx.expect_counts(0, 0);
    }
}

#[test]
fn printf_of_malformed_formats_prints_them_and_of_short_arguments_answers_minus_one() {
    for fx in Fx::each("printf-bad") {
        let first = fx.lanes()[0];
        let mut refused = 0;
        let mut check = |format: &str, args: Vec<u8>, want_size: Option<u64>| {
            // The first lane gets the bad case; the others print "ok <lane>".
            let formats = per_lane(|l| {
                if l == first {
                    cstr(format)
                } else {
                    cstr("ok %d\n")
                }
            });
            let all_args = per_lane(|l| {
                if l == first {
                    args.clone()
                } else {
                    (l as i32).to_le_bytes().to_vec()
                }
            });
            let (results, asked, sizes) = fx.printf_stdout(&formats, &all_args);
            assert_eq!(results[first as usize], -1, "{format:?}");
            assert!(asked[first as usize].is_empty());
            if let Some(size) = want_size {
                assert_eq!(sizes[first as usize], size, "{format:?}");
            }
            let mut expect = Vec::new();
            for l in fx.lanes().into_iter().filter(|&l| l != first) {
                let text = format!("ok {l}\n");
                assert_eq!(results[l as usize], text.len() as i64);
                expect.extend(text.into_bytes());
            }
            assert_eq!(
                fx.out.take(),
                expect,
                "{format:?}: only the good lanes print"
            );
            refused += 1;
            fx.expect_counts(refused, 0);
        };
        // Malformed formats print, as LLVM 23's server has glibc print them (its parser
        // writes a spec the format ends in as it is).
        for (format, printed) in [
            ("unterminated %", "unterminated %"),
            ("width then nothing %-08", "width then nothing %-08"),
            ("unknown %k conversion", "unknown %k conversion"),
            ("length %ll] then %*y", "length %] then %5y"),
        ] {
            let formats = per_lane(|_| cstr(format));
            let star = 5i32.to_le_bytes().to_vec();
            let args = per_lane(|_| star.clone());
            let (results, asked, sizes) = fx.printf_stdout(&formats, &args);
            let want_size = if format.contains('*') { 4 } else { 0 };
            let mut expect = Vec::new();
            for l in fx.lanes() {
                assert_eq!(sizes[l as usize], want_size, "{format:?}");
                assert!(asked[l as usize].is_empty());
                assert_eq!(results[l as usize], printed.len() as i64, "{format:?}");
                expect.extend(printed.bytes());
            }
            assert_eq!(fx.out.take(), expect, "{format:?}");
            fx.expect_counts(0, 0);
        }
        // More arguments than the device sent (a client that sends fewer bytes than asked).
        check("%d %d %d\n", 7u32.to_le_bytes().to_vec(), Some(12));
        check("%s\n", vec![1, 2, 3], Some(8));
        check("%*d\n", Vec::new(), Some(8));
        // (A format or a %s string above the stream bound ends the exchange: see
        // `a_byte_string_above_the_bound_ends_the_exchange_at_once`.)

        // Served normally afterwards.
        let formats = per_lane(|_| cstr("%s %d\n"));
        let mut memory = HashMap::new();
        let args = per_lane(|l| {
            memory.insert(0x5000 + u64::from(l), b"again".to_vec());
            let mut a = (0x5000 + u64::from(l)).to_le_bytes().to_vec();
            a.extend((l as i32).to_le_bytes());
            a
        });
        let (results, _, _) = fx.printf(Opcode::PRINTF_TO_STDOUT, None, &formats, &args, &memory);
        let mut expect = Vec::new();
        for l in fx.lanes() {
            let text = format!("again {l}\n");
            assert_eq!(results[l as usize], text.len() as i64);
            expect.extend(text.into_bytes());
        }
        assert_eq!(fx.out.take(), expect);
        fx.expect_counts(refused, 0);
    }
}

// ---- Limits (issue 15): what one request or one mailbox may make the host hold.

/// A writer that records the size of every write it gets.
#[derive(Clone, Default)]
struct WriteSizes(Arc<Mutex<Vec<usize>>>);

impl Write for WriteSizes {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().push(buf.len());
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// `%4096d` a thousand times prints 4 MB: it reaches stdout in pieces of about 64 KiB (the
/// server never held the whole output), and the reply counts every byte.
#[test]
fn a_long_printf_goes_out_in_pieces() {
    const SPECS: usize = 1000;
    let fx = Fx::with("printf-long", 1, 1, |c| c.limits.string_bytes = 1 << 20);
    let writes = WriteSizes::default();
    fx.services().set_stdout(Box::new(writes.clone()));
    let formats = per_lane(|_| cstr(&"%4096d".repeat(SPECS)));
    let args = per_lane(|_| 7u32.to_le_bytes().repeat(SPECS));
    let (results, _, _) = fx.printf_stdout(&formats, &args);
    assert_eq!(results[0], (4096 * SPECS) as i64);
    let writes = writes.0.lock().unwrap().clone();
    assert_eq!(writes.iter().sum::<usize>(), 4096 * SPECS);
    let largest = writes.iter().copied().max().unwrap();
    assert!(
        largest <= rpc_core::services::printf::CHUNK + rpc_core::protocol::printf::MAX_FIELD,
        "one write of {largest} bytes"
    );
    fx.expect_counts(0, 0);
}

/// Short lines of every lane go to stdout in one write (a syscall per request, not per lane),
/// and each lane still gets its own count.
#[test]
fn short_printfs_of_all_lanes_go_out_in_one_write() {
    let fx = Fx::new("printf-one-write", 32, u64::from(u32::MAX));
    let writes = WriteSizes::default();
    fx.services().set_stdout(Box::new(writes.clone()));
    let formats = per_lane(|_| cstr("lane %d\n"));
    let args = per_lane(|l| (l as i32).to_le_bytes().to_vec());
    let (results, _, _) = fx.printf_stdout(&formats, &args);
    let lines: Vec<String> = fx
        .lanes()
        .into_iter()
        .map(|l| format!("lane {l}\n"))
        .collect();
    for l in fx.lanes() {
        assert_eq!(results[l as usize], lines[l as usize].len() as i64);
    }
    let total: usize = lines.iter().map(String::len).sum();
    assert_eq!(*writes.0.lock().unwrap(), [total]);
    fx.expect_counts(0, 0);
}

/// The short printf lines that one pass formats for different exchanges go out in one write (a
/// group commit), and each exchange replies only once its line was written. Deterministic: GATE
/// holds the server thread while both clients send their arguments, so the next pass finds
/// both exchanges ready and stages both lines before either is polled again to commit.
#[test]
fn printfs_formatted_in_one_pass_go_out_in_one_write_before_their_replies() {
    const GATE: Opcode = Opcode::user(23);
    let fx = Fx::new("printf-group-commit", 1, 1);
    let writes = WriteSizes::default();
    fx.services().set_stdout(Box::new(writes.clone()));
    let (entered_tx, entered) = std::sync::mpsc::channel();
    let (go, go_rx) = std::sync::mpsc::channel::<()>();
    let (entered_tx, go_rx) = (Mutex::new(entered_tx), Mutex::new(go_rx));
    fx.server.register_packet(GATE, move |_, _| {
        entered_tx.lock().unwrap().send(()).unwrap();
        go_rx.lock().unwrap().recv_timeout(LIVENESS).unwrap();
    });
    let lines = [&b"first %d\n"[..], b"second %d\n"];
    let mut ports: Vec<_> = lines
        .iter()
        .map(|format| {
            let mut port = fx.open(Opcode::PRINTF_TO_STDOUT);
            let mut format = format.to_vec();
            format.push(0);
            port.send_n(&[&format]).unwrap();
            port
        })
        .collect();
    for port in &mut ports {
        let mut size = 0;
        port.recv(|_, p| size = p.word(0)).unwrap();
        assert_eq!(size, 4);
    }
    let mut gate = fx.open(GATE);
    gate.send(|_, _| {}).unwrap();
    entered.recv_timeout(LIVENESS).unwrap();
    for (k, port) in ports.iter_mut().enumerate() {
        port.send_n(&[&(k as i32).to_le_bytes()]).unwrap();
    }
    go.send(()).unwrap();
    gate.recv(|_, _| {}).unwrap();
    let expected = [b"first 0\n".len(), b"second 1\n".len()];
    for (port, len) in ports.iter_mut().zip(expected) {
        let mut result = 0;
        port.recv(|_, p| result = p.word(0)).unwrap();
        assert_eq!(result, len as u64);
        // The reply came after the write that carried both lines.
        assert_eq!(*writes.0.lock().unwrap(), [expected.iter().sum::<usize>()]);
    }
    drop(ports);
    fx.expect_counts(0, 0);
}

/// A pointer printed many times is fetched once; strings above the request's limit make the
/// lane print nothing and answer -1 (a refusal), and the other lanes print.
#[test]
fn printf_strings_are_fetched_once_and_within_the_limit() {
    let fx = Fx::with("printf-strings", 32, 0x8000_1235, |c| {
        c.limits.string_bytes = 1 << 20;
        c.limits.printf_string_bytes = 40_000;
    });
    let first = fx.lanes()[0];
    let mut memory = HashMap::new();
    // Each lane prints its pointer ten times; the first lane's string is 10 000 bytes: fetched
    // once per lane, all lanes' strings are within the limit (ten fetches of it would not be).
    for l in fx.lanes() {
        let text = if l == first {
            vec![b'x'; 10_000]
        } else {
            lane_text(l)
        };
        memory.insert(0x1000 + u64::from(l), text);
    }
    let formats = per_lane(|_| cstr(&"%s".repeat(10)));
    let args = per_lane(|l| (0x1000 + u64::from(l)).to_le_bytes().repeat(10));
    let (results, asked, _) = fx.printf(Opcode::PRINTF_TO_STDOUT, None, &formats, &args, &memory);
    for l in fx.lanes() {
        assert_eq!(asked[l as usize], vec![0x1000 + u64::from(l)], "lane {l}");
        let len = memory[&(0x1000 + u64::from(l))].len() * 10;
        assert_eq!(results[l as usize], len as i64, "lane {l}");
    }
    let printed: usize = memory.values().map(|text| text.len() * 10).sum();
    assert_eq!(fx.out.take().len(), printed);
    // Three distinct 20 000-byte strings: the second goes above 40 000 with the first.
    let mut memory = HashMap::new();
    for p in 1..=3u64 {
        memory.insert(p << 20, vec![b'y'; 20_000]);
    }
    let formats = per_lane(|l| {
        if l == first {
            cstr("%s%s%s")
        } else {
            cstr("ok")
        }
    });
    let args = per_lane(|l| {
        if l == first {
            [3u64 << 20, 2 << 20, 1 << 20]
                .iter()
                .flat_map(|p| p.to_le_bytes())
                .collect()
        } else {
            Vec::new()
        }
    });
    let (results, asked, _) = fx.printf(Opcode::PRINTF_TO_STDOUT, None, &formats, &args, &memory);
    assert_eq!(results[first as usize], -1);
    assert!(
        asked[first as usize].len() < 3,
        "{:?}",
        asked[first as usize]
    );
    for &l in &fx.lanes()[1..] {
        assert_eq!(results[l as usize], 2, "lane {l}");
    }
    assert_eq!(fx.out.take(), b"ok".repeat(fx.lanes().len() - 1));
    fx.expect_counts(1, 0);
}

/// Lanes that send the same format share one parse of it, also when the lane that parsed it
/// is refused (its arguments too short, its string above the limit): the others still print.
#[test]
fn lanes_of_one_format_share_its_parse_whichever_of_them_is_refused() {
    let fx = Fx::with("printf-shared", 32, 0b1_1111, |c| {
        c.limits.printf_string_bytes = 100;
    });
    let shared = "n=%d s=%s\n";
    // Unpacked: the int, padding to 8, the pointer.
    let args_of =
        |n: i32, pointer: u64| [&n.to_le_bytes()[..], &[0; 4], &pointer.to_le_bytes()].concat();
    let memory = HashMap::from([
        (0x10, cstr("one")),
        (0x30, vec![b'z'; 200]),
        (0x40, cstr("four")),
    ]);
    // Lane 0 parses the shared format and is refused (short arguments), lane 1 prints with
    // its parse; lane 2's format differs, so lane 3 parses the shared one again and is refused
    // (its string goes above the limit), and lane 4 prints with lane 3's parse.
    let formats = per_lane(|l| cstr(if l == 2 { "other %d\n" } else { shared }));
    let args = per_lane(|l| match l {
        0 => 7i32.to_le_bytes().to_vec(),
        2 => 2i32.to_le_bytes().to_vec(),
        l => args_of(l as i32, 0x10 * u64::from(l)),
    });
    let (results, asked, sizes) =
        fx.printf(Opcode::PRINTF_TO_STDOUT, None, &formats, &args, &memory);
    assert_eq!(&sizes[..5], &[16, 16, 4, 16, 16]);
    assert_eq!(
        &asked[..5],
        &[vec![], vec![0x10], vec![], vec![0x30], vec![0x40]]
    );
    let lines = ["", "n=1 s=one\n", "other 2\n", "", "n=4 s=four\n"];
    let want: Vec<i64> = lines
        .iter()
        .map(|line| {
            if line.is_empty() {
                -1
            } else {
                line.len() as i64
            }
        })
        .collect();
    assert_eq!(&results[..5], &want[..]);
    assert_eq!(fx.out.take(), lines.concat().into_bytes());
    fx.expect_counts(1, 0);
}

/// A read of 2^62 bytes from an endless stdin holds at most the request's read limit: the
/// lanes get it in lane order, each a short count, and the count matches the data.
#[test]
fn reads_are_served_in_parts_within_the_limit() {
    for (lanes, mask) in CONFIGS {
        let fx = Fx::with("read-limit", lanes, mask, |c| c.limits.read_bytes = 10_000);
        fx.services().set_stdin(Box::new(std::io::repeat(b'z')));
        let stdin = [1u64; 64];
        let (data, count) = fx.fread(1 << 62, &stdin);
        let first = fx.lanes()[0] as usize;
        for l in fx.lanes() {
            let l = l as usize;
            assert_eq!(count[l], data[l].len() as u64);
            let expected = if l == first { 10_000 } else { 0 };
            assert_eq!(data[l].len(), expected, "lane {l}");
        }
        let lines = fx.fgets(1 << 62, &stdin);
        assert_eq!(lines[first].len(), 10_000, "the line so far, with its NUL");
        assert_eq!(lines[first].last(), Some(&0));
        fx.expect_counts(0, 0);
    }
}

/// Each mailbox has its own files, allocations and quotas: another mailbox's handles and
/// addresses name nothing, one mailbox at its limits leaves the other its own, and detaching a
/// mailbox closes its files and frees its allocations.
#[test]
fn each_mailbox_has_its_own_files_allocations_and_quotas() {
    let fx = Fx::with("isolation", 1, 1, |c| {
        c.limits.open_files = 2;
        // One 2 MiB block and its padding (the heap aligns blocks to 8 bytes only).
        c.limits.malloc_bytes = 5 << 20;
    });
    let allocator = Arc::new(HeapAllocator::default());
    fx.services().set_allocator(allocator.clone());
    let other = fx.second_mailbox();
    let file = |name: &str| per_lane(|_| cpath(&fx.path(name)));

    let a = fx.fopen(&file("a"), "w")[0];
    let b = fx.fopen(&file("b"), "w")[0];
    assert!(a != 0 && b != 0 && a != b);
    assert_eq!(fx.fopen(&file("c"), "w")[0], 0, "the mailbox's third file");
    let d = other.fopen(&file("d"), "w")[0];
    assert_ne!(d, 0, "the other mailbox has its own quota");
    assert_eq!(fx.services().open_files(), 3);
    // The first mailbox's handle from the other: nothing written, nothing closed.
    let mut handles = [0u64; 64];
    handles[0] = a;
    assert_eq!(
        other.write_to_stream(&handles, &per_lane(|_| b"x".to_vec()))[0],
        0
    );
    assert_eq!(other.on_handles(Opcode::CLOSE_FILE, &handles)[0], EOF);
    assert_eq!(
        fx.write_to_stream(&handles, &per_lane(|_| b"y".to_vec()))[0],
        1
    );
    assert_eq!(fx.services().open_files(), 3);

    let two_mib = 2 << 20;
    let mine = fx.words(Opcode::MALLOC, |_| vec![two_mib])[0];
    assert_ne!(mine, 0);
    assert_eq!(
        fx.words(Opcode::MALLOC, |_| vec![two_mib])[0],
        0,
        "above 5 MiB"
    );
    let theirs = other.words(Opcode::MALLOC, |_| vec![two_mib])[0];
    assert_ne!(theirs, 0, "the other mailbox's own quota");
    // FREE of the first mailbox's memory from the other frees nothing.
    other.free(|_| mine);
    assert_eq!(fx.services().live_allocations().len(), 2);
    // Refused: the third open, the foreign write and close, the MALLOC above the quota, the
    // foreign FREE.
    fx.expect_counts(5, 0);

    fx.server.detach(other.mailbox.id).unwrap();
    assert_eq!(
        fx.services().open_files(),
        2,
        "the other mailbox's file closed"
    );
    let live = fx.services().live_allocations();
    assert_eq!(live.len(), 1, "the other mailbox's allocation freed");
    assert_eq!(live[0].addr, mine);
    assert_eq!(allocator.live(), 1);
}

/// Handles are not guessable from each other: one slot opened and closed again and again
/// gives a different handle each time, and two mailboxes' first handles differ.
#[test]
fn handles_carry_unpredictable_tags() {
    let fx = Fx::new("tags", 1, 1);
    let other = fx.second_mailbox();
    let path = per_lane(|_| cpath(&fx.path("t")));
    let mut seen = std::collections::HashSet::new();
    let mut tags = Vec::new();
    for _ in 0..50 {
        let handle = fx.fopen(&path, "w")[0];
        assert_ne!(handle, 0);
        assert!(seen.insert(handle), "handle {handle:#x} again");
        tags.push(handle >> 32);
        let mut handles = [0u64; 64];
        handles[0] = handle;
        assert_eq!(fx.on_handles(Opcode::CLOSE_FILE, &handles)[0], 0);
    }
    let slots: std::collections::HashSet<u64> = seen.iter().map(|h| h & 0xffff_ffff).collect();
    assert_eq!(slots.len(), 1, "one slot reused");
    // Not a counter: the steps from one tag to the next are not all the same.
    let steps: std::collections::HashSet<u64> =
        tags.windows(2).map(|w| w[1].wrapping_sub(w[0])).collect();
    assert!(steps.len() > 1, "tags {tags:x?} step evenly");
    let theirs = other.fopen(&path, "w")[0];
    assert!(!seen.contains(&theirs));
    fx.expect_counts(0, 0);
}

/// How long a test waits for the server before it fails (a liveness bound, never a timing).
const LIVENESS: Duration = Duration::from_secs(30);

/// A device allocator whose `allocate` tells the test it was entered, then waits until the
/// test lets it go.
struct GatedAllocator {
    inner: HeapAllocator,
    entered: Mutex<std::sync::mpsc::Sender<()>>,
    go: Mutex<std::sync::mpsc::Receiver<()>>,
}

impl rpc_core::plugin::DeviceAllocator for GatedAllocator {
    fn allocate(&self, size: u64) -> Result<u64, rpc_core::plugin::VendorError> {
        self.entered.lock().unwrap().send(()).unwrap();
        self.go.lock().unwrap().recv_timeout(LIVENESS).unwrap();
        self.inner.allocate(size)
    }
    unsafe fn deallocate(&self, addr: u64, size: u64) -> Result<(), rpc_core::plugin::VendorError> {
        // SAFETY: the caller's contract, passed on.
        unsafe { self.inner.deallocate(addr, size) }
    }
}

/// A MALLOC the worker is inside when its mailbox is detached: the allocation it then makes is
/// freed at once, not recorded for a mailbox that is gone. (It was recorded after `detach` had
/// freed the mailbox's allocations, and stayed live for good: found by the adversarial tests,
/// which detach a case's mailboxes while leftover requests are being served.)
#[test]
fn an_allocation_made_while_its_mailbox_detaches_is_freed() {
    let fx = Fx::new("detach-malloc", 1, 1);
    let other = fx.second_mailbox();
    let (entered_tx, entered) = std::sync::mpsc::channel();
    let (go, go_rx) = std::sync::mpsc::channel();
    let gate = Arc::new(GatedAllocator {
        inner: HeapAllocator::default(),
        entered: Mutex::new(entered_tx),
        go: Mutex::new(go_rx),
    });
    fx.services()
        .set_mailbox_allocator(other.mailbox.id, gate.clone());
    other
        .open(Opcode::MALLOC)
        .send(|_, p| p.set_word(0, 4096))
        .unwrap();
    entered
        .recv_timeout(LIVENESS)
        .expect("the worker calls the allocator");
    let detach = std::thread::spawn({
        let (server, id) = (fx.server.clone(), other.mailbox.id);
        move || server.detach(id)
    });
    // `detach` forgets the mailbox (dropping its allocator from the table: the test's handle
    // and the MALLOC's are left) before the worker lets go of it. Let the allocation land after
    // that, as it did when the bug showed; the wait is bounded, the outcome must not depend on it.
    let start = Instant::now();
    while Arc::strong_count(&gate) > 2 && start.elapsed() < Duration::from_secs(10) {
        std::thread::yield_now();
    }
    go.send(()).unwrap();
    detach.join().unwrap().unwrap();
    assert_eq!(fx.services().live_allocations(), Vec::new());
    assert_eq!(gate.inner.live(), 0, "the allocation made late was freed");
}

/// An OPEN_FILE whose call is still queued for the I/O threads when its mailbox is detached:
/// the file it then opens is closed at once, not put into the table of a mailbox that is gone
/// (it was, and stayed open for good: found by the adversarial tests).
#[test]
fn a_file_opened_while_its_mailbox_detaches_is_closed() {
    let fx = Fx::with("detach-open", 1, 1, |c| c.io_threads = 1);
    let other = fx.second_mailbox();
    // HOLD's call keeps the only I/O thread until the test lets it go; MARK's call, queued
    // after the OPEN_FILE's, runs after it (one thread, calls in order).
    const HOLD: Opcode = Opcode::user(21);
    const MARK: Opcode = Opcode::user(22);
    let (entered_tx, entered) = std::sync::mpsc::channel();
    let (go, go_rx) = std::sync::mpsc::channel::<()>();
    let (entered_tx, go_rx) = (Mutex::new(entered_tx), Arc::new(Mutex::new(go_rx)));
    fx.server.register(HOLD, move |mut req| {
        let entered = entered_tx.lock().unwrap().clone();
        let go = go_rx.clone();
        async move {
            req.recv(|_, _| {}).await?;
            req.blocking(move |_| {
                entered.send(()).unwrap();
                go.lock().unwrap().recv_timeout(LIVENESS).unwrap();
            })
            .await?;
            req.send(|_, _| {}).await
        }
    });
    fx.server.register(MARK, |mut req| async move {
        req.recv(|_, _| {}).await?;
        req.blocking(|_| ()).await?;
        req.send(|_, p| p.set_word(0, 1)).await
    });
    fx.open(HOLD).send(|_, _| {}).unwrap();
    entered
        .recv_timeout(LIVENESS)
        .expect("HOLD's call runs on the I/O thread");
    let calls = fx.server.stats().blocking_calls;
    let mut port = other.open(Opcode::OPEN_FILE);
    port.send_n(&[cpath(&fx.path("late")).as_slice()]).unwrap();
    port.send(|_, p| p.write_bytes(0, b"w\0")).unwrap();
    drop(port);
    let start = Instant::now();
    while fx.server.stats().blocking_calls == calls {
        assert!(
            start.elapsed() < LIVENESS,
            "the OPEN_FILE's call is never queued"
        );
        std::thread::yield_now();
    }
    fx.server.detach(other.mailbox.id).unwrap();
    assert_eq!(fx.services().open_files(), 0);
    go.send(()).unwrap();
    assert_eq!(fx.words(MARK, |_| vec![0])[0], 1);
    assert_eq!(
        fx.services().open_files(),
        0,
        "a file opened for a detached mailbox"
    );
}

/// Input directly followed by output on one file, which C leaves undefined: `ungetc`, then
/// `fwrite`s, again and again. glibc then wrote the output into the small buffer it had
/// allocated for the pushed-back byte and corrupted the host's heap ("double free or
/// corruption" at the next `fclose` or `malloc`): a device could do that on purpose. The
/// server now keeps the pushed-back byte itself, and puts the positioning call C requires
/// between input and output. Found by the adversarial tests (a release build aborted).
#[test]
fn ungetc_then_writes_leave_the_host_heap_whole() {
    for fx in Fx::each("unget-write") {
        let paths = per_lane(|l| cpath(&fx.path(&format!("u{l}"))));
        let handles = fx.fopen(&paths, "w+");
        let block = per_lane(|l| vec![b'a' + l as u8; BOUND as usize]);
        fx.write_to_stream(&handles, &per_lane(|_| b"hello world\n".to_vec()));
        fx.words(Opcode::FSEEK, |l| vec![handles[l as usize], 0, 0]);
        for round in 0..8u64 {
            let c = u64::from(b'A') + round;
            let pushed = fx.words(Opcode::UNGETC, |l| vec![c, handles[l as usize]]);
            for l in fx.lanes() {
                assert_eq!(pushed[l as usize], c, "lane {l}: ungetc");
            }
            for _ in 0..3 {
                let written = fx.write_to_stream(&handles, &block);
                for l in fx.lanes() {
                    assert_eq!(written[l as usize], BOUND, "lane {l}: fwrite");
                }
            }
        }
        let closed = fx.on_handles(Opcode::CLOSE_FILE, &handles);
        for l in fx.lanes() {
            assert_eq!(closed[l as usize], 0, "lane {l}: fclose");
            // Each round's writes begin where its ungetc left the position, one byte back (the
            // first round's at the start, where one back is undefined): 24 blocks less 7 bytes.
            let content = std::fs::read(fx.path(&format!("u{l}"))).unwrap();
            assert_eq!(content.len(), 24 * BOUND as usize - 7, "lane {l}");
            assert!(content.iter().all(|&b| b == b'a' + l as u8), "lane {l}");
        }
        // The heap is whole: the allocator still works.
        drop(vec![0u8; 1 << 20]);
        fx.expect_counts(0, 0);
    }
}

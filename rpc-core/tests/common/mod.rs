//! What rpc-core's integration tests share: the device side of the standard opcodes' scripts,
//! as LLVM's libc runs them, for the tests that drive a running server through rpc-core's
//! client (arrays indexed by lane); a writer that captures the device's output; a logger
//! that keeps its lines.

// Each test file is its own crate and uses only part of this module.
#![allow(dead_code, unused_imports)]

pub mod capture;
#[macro_use]
pub mod printf_args;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rpc_core::protocol::{Client, ClientPort, Deadline, Wait};
use rpc_core::protocol::{Generation, Layout, LockTable, MailboxMemory};
use rpc_core::AttachOptions;
use rpc_core::{MailboxId, Opcode, ProtocolError, RpcServer};

/// A mailbox in host memory attached to a server, with its client's lock table.
pub struct Mailbox {
    pub memory: Arc<MailboxMemory>,
    pub locks: LockTable,
    pub id: MailboxId,
}

impl Mailbox {
    /// A mailbox of LLVM's first layout.
    pub fn attach(server: &RpcServer, ports: u32, lanes: u32) -> Self {
        Mailbox::attach_as(server, Generation::V1, ports, lanes)
    }

    pub fn attach_as(server: &RpcServer, generation: Generation, ports: u32, lanes: u32) -> Self {
        let memory = Arc::new(MailboxMemory::new(
            Layout::new(generation, ports, lanes).unwrap(),
        ));
        let id = server.attach(Box::new(memory.clone()), AttachOptions::default());
        Mailbox {
            memory,
            locks: LockTable::new(ports),
            id,
        }
    }

    /// A client of the mailbox (whose waits back off and never give up: a test gives it its
    /// hang guard with `with_wait`).
    pub fn client(&self) -> Client<'_> {
        Client::new(self.memory.view(), self.locks.words()).unwrap()
    }

    /// Opens a port for `opcode` with the lanes of `mask`, waiting for a free one as `wait`
    /// says.
    pub fn open<'a>(&'a self, wait: &'a dyn Wait, opcode: Opcode, mask: u64) -> ClientPort<'a> {
        self.client().with_wait(wait).open(opcode, mask).unwrap()
    }
}

/// Registers `opcode` on `server`: one packet in, then the flag returned is set, then the
/// exchange holds its port's buffer until a shutdown cuts it.
pub fn register_holding(server: &RpcServer, opcode: Opcode) -> Arc<AtomicBool> {
    let started = Arc::new(AtomicBool::new(false));
    let flag = started.clone();
    server.register(opcode, move |mut req| {
        let flag = flag.clone();
        async move {
            req.recv(|_, _| {}).await?;
            flag.store(true, Ordering::Release);
            std::future::pending::<()>().await;
            Ok(())
        }
    });
    started
}

/// Waits until `condition` holds, looking every millisecond; fails naming `what` after 60 s
/// (a hang guard for a loaded 2-core machine, never a measure of speed).
pub fn eventually(what: &str, condition: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !condition() {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// The statistics once every request begun on a mailbox is counted (read counts through it
/// after a reply: a script's request is counted after its reply lets the client go on).
pub use workloads::settled_stats;

/// An empty folder of the test's own, `rpc-{name}-{pid}` under the temporary folder (what an
/// earlier run of the same test left there is removed).
pub fn empty_dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("rpc-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A client's wait that gives up at a fixed instant this far ahead: a hang guard, so that a
/// server that blocks fails the test instead of hanging it.
pub fn hang_guard() -> Deadline {
    Deadline::after(Duration::from_secs(120))
}

/// The lines logged since [`keep_log_lines`], as text.
static LOGGED: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// The test binary's logger: keeps every line.
struct Keeping;

impl log::Log for Keeping {
    fn enabled(&self, _: &log::Metadata) -> bool {
        true
    }
    fn log(&self, record: &log::Record) {
        let line = record.args().to_string();
        LOGGED.lock().unwrap_or_else(|e| e.into_inner()).push(line);
    }
    fn flush(&self) {}
}

/// Keeps every line logged at `level` or above from now on (the logger is installed once
/// per test binary: a test that reads the log is in a binary of its own, without
/// `env_logger`).
pub fn keep_log_lines(level: log::LevelFilter) {
    static INSTALL: std::sync::Once = std::sync::Once::new();
    INSTALL.call_once(|| log::set_logger(&Keeping).unwrap());
    log::set_max_level(level);
}

/// The lines kept so far.
pub fn logged() -> Vec<String> {
    LOGGED.lock().unwrap_or_else(|e| e.into_inner()).clone()
}

/// A client's wait that gives up once one wait for the server (one hand-over) has lasted
/// `patience`: a hang guard per hand-over, however many a test makes, so it never measures
/// their speed (beside busy processes a 4 MiB byte string's whole run outlasted a 120 s deadline).
/// Backs off as [`Deadline`] does.
pub struct EachWait {
    patience: Duration,
    /// When the current wait began (its first pause).
    began: Mutex<Instant>,
}

impl EachWait {
    pub fn new(patience: Duration) -> Self {
        EachWait {
            patience,
            began: Mutex::new(Instant::now()),
        }
    }
}

impl Wait for EachWait {
    fn pause(&self, port: u32, attempt: u32) -> Result<(), ProtocolError> {
        let mut began = self.began.lock().unwrap();
        if attempt == 0 {
            *began = Instant::now();
        }
        Deadline(*began + self.patience).pause(port, attempt)
    }
}

/// The data of each lane as the slices `send_n` takes.
pub fn slices(data: &[Vec<u8>]) -> Vec<&[u8]> {
    data.iter().map(Vec::as_slice).collect()
}

/// A warp of a test: opens ports on its mailbox with its lane mask; the scripts follow.
pub trait Device {
    /// Opens a port for `opcode` with the warp's lanes (waiting through the test's deadline).
    fn open(&self, opcode: Opcode) -> ClientPort<'_>;

    /// C send buf[0..] = words; C recv buf[0].
    fn words(&self, opcode: Opcode, words: impl Fn(u32) -> Vec<u64>) -> [u64; 64] {
        let mut port = self.open(opcode);
        let mut out = [0u64; 64];
        port.send_and_recv(
            |l, p| {
                for (i, w) in words(l).into_iter().enumerate() {
                    p.set_word(i, w);
                }
            },
            |l, p| out[l as usize] = p.word(0),
        )
        .unwrap();
        out
    }

    /// C send_n(data); C recv buf[0] (WRITE_TO_STDOUT, REMOVE, SYSTEM, ...).
    fn send_n_then_word(&self, opcode: Opcode, data: &[Vec<u8>]) -> [u64; 64] {
        let mut port = self.open(opcode);
        port.send_n(&slices(data)).unwrap();
        let mut out = [0u64; 64];
        port.recv(|l, p| out[l as usize] = p.word(0)).unwrap();
        out
    }

    fn write_to_stream(&self, handles: &[u64; 64], data: &[Vec<u8>]) -> [u64; 64] {
        let mut port = self.open(Opcode::WRITE_TO_STREAM);
        port.send(|l, p| p.set_word(0, handles[l as usize]))
            .unwrap();
        port.send_n(&slices(data)).unwrap();
        let mut out = [0u64; 64];
        port.recv(|l, p| out[l as usize] = p.word(0)).unwrap();
        out
    }

    fn fopen(&self, paths: &[Vec<u8>], mode: &str) -> [u64; 64] {
        let mut port = self.open(Opcode::OPEN_FILE);
        port.send_n(&slices(paths)).unwrap();
        let mut mode = mode.as_bytes().to_vec();
        mode.push(0);
        let mut out = [0u64; 64];
        port.send_and_recv(
            |_, p| p.write_bytes(0, &mode),
            |l, p| out[l as usize] = p.word(0),
        )
        .unwrap();
        out
    }

    /// Opens a read (READ_FROM_STREAM, READ_FGETS) and sends its request: C send {buf[0] =
    /// `want`, buf[1] = handle}.
    fn open_read(&self, opcode: Opcode, want: u64, handles: &[u64; 64]) -> ClientPort<'_> {
        let mut port = self.open(opcode);
        port.send(|l, p| {
            p.set_word(0, want);
            p.set_word(1, handles[l as usize]);
        })
        .unwrap();
        port
    }

    fn fread(&self, max: u64, handles: &[u64; 64]) -> (Vec<Vec<u8>>, [u64; 64]) {
        let mut port = self.open_read(Opcode::READ_FROM_STREAM, max, handles);
        let data = port.recv_n(u64::MAX).unwrap();
        let mut out = [0u64; 64];
        port.recv(|l, p| out[l as usize] = p.word(0)).unwrap();
        (data, out)
    }

    fn fgets(&self, count: u64, handles: &[u64; 64]) -> Vec<Vec<u8>> {
        let mut port = self.open_read(Opcode::READ_FGETS, count, handles);
        let lines = port.recv_n(u64::MAX).unwrap();
        for (lane, line) in lines.iter().enumerate() {
            assert!(line.len() as u64 <= count, "lane {lane}: more than count");
        }
        lines
    }

    fn on_handles(&self, opcode: Opcode, handles: &[u64; 64]) -> [u64; 64] {
        self.words(opcode, |l| vec![handles[l as usize]])
    }

    fn rename(&self, old: &[Vec<u8>], new: &[Vec<u8>]) -> [u64; 64] {
        let mut port = self.open(Opcode::RENAME);
        port.send_n(&slices(old)).unwrap();
        port.send_n(&slices(new)).unwrap();
        let mut out = [0u64; 64];
        port.recv(|l, p| out[l as usize] = p.word(0)).unwrap();
        out
    }
}

/// The tests' device memory for MALLOC: raw blocks from the heap, as plugin-host's
/// `HostAllocator` serves it (rpc-core's tests cannot depend on a plugin), with a table of the
/// live ones that checks the server's calls: a block freed twice, or by another size, panics.
#[derive(Default)]
pub struct HeapAllocator {
    live: std::sync::Mutex<std::collections::HashMap<u64, std::alloc::Layout>>,
}

impl HeapAllocator {
    /// Allocations not yet freed.
    pub fn live(&self) -> usize {
        self.live.lock().unwrap().len()
    }
    /// Bytes of the allocations not yet freed.
    pub fn bytes(&self) -> u64 {
        let live = self.live.lock().unwrap();
        live.values().map(|layout| layout.size() as u64).sum()
    }
}

impl rpc_core::plugin::DeviceAllocator for HeapAllocator {
    fn allocate(&self, size: u64) -> Result<u64, rpc_core::VendorError> {
        let layout = std::alloc::Layout::from_size_align(usize::try_from(size.max(1))?, 8)?;
        // SAFETY: `layout` has a non-zero size.
        let ptr = unsafe { std::alloc::alloc(layout) };
        if ptr.is_null() {
            return Err(format!("out of host memory for {size} bytes").into());
        }
        self.live.lock().unwrap().insert(ptr as u64, layout);
        Ok(ptr as u64)
    }

    unsafe fn deallocate(&self, addr: u64, size: u64) -> Result<(), rpc_core::VendorError> {
        let layout = self.live.lock().unwrap().remove(&addr);
        let layout = layout.unwrap_or_else(|| panic!("{addr:#x} is no live block"));
        assert_eq!(
            layout.size() as u64,
            size.max(1),
            "{addr:#x} freed by another size"
        );
        // SAFETY: `addr` came from `alloc` with `layout` and was not freed since (it was in the
        // table, which it just left).
        unsafe { std::alloc::dealloc(addr as *mut u8, layout) };
        Ok(())
    }
}

impl Drop for HeapAllocator {
    fn drop(&mut self) {
        for (addr, layout) in self.live.lock().unwrap().drain() {
            // SAFETY: as in `deallocate`: allocated with `layout`, not freed since.
            unsafe { std::alloc::dealloc(addr as *mut u8, layout) };
        }
    }
}

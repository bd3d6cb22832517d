//! One server pass over two mailboxes whose every byte comes from the fuzzer: words in any
//! state, headers with any mask and opcode, packets with any lengths, handles, pointers, paths
//! and formats.
//!
//! Input: byte 0 picks the layout of both mailboxes (bit 0: v1/v2; bits 1-2: lanes 1, 32 or
//! 64; bits 3-4: 1-4 ports; bit 5: attach the first with a v2 doorbell counter), the rest is
//! laid over the first mailbox's region from offset 0 and, past its end, over the second's
//! (each region is zero past the input). One long-lived server (a user guard held, so it
//! serves; small limits; files in a sandbox directory holding real files, a FIFO and links
//! leading out, beside a canary file) attaches both, serves at least one full pass over them
//! (an exchange waiting for a packet the input never sends is suspended, not waited for), and
//! detaches them (abandoning the suspended exchanges). Checked: no handler panicked, the
//! detaches returned, the worker still runs, no file is left open and no allocation live (a
//! detach closes and frees what its mailbox's requests made), and the canary is unchanged.
//!
//! Only each port's first packet is ever there (nobody answers), so the exchanges of one
//! packet run whole (REMOVE of a fuzzed path, under the sandbox; MALLOC; FREE; reads of
//! stdin) and the longer ones up to their second packet.
#![no_main]

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex};

use libfuzzer_sys::fuzz_target;
use rpc_core::AttachOptions;
use rpc_core::plugin::{DeviceAllocator, VendorError};
use rpc_core::protocol::{Generation, Layout, MailboxMemory};
use rpc_core::FilePolicy;
use rpc_core::{ExitPolicy, RpcServer, ServerConfig, ServicesConfig, UserGuard};

/// Hands out addresses without memory behind them, so fuzzed MALLOC sizes cost nothing.
#[derive(Default)]
struct FakeAllocator {
    next: AtomicU64,
    live: Mutex<HashSet<u64>>,
}

impl DeviceAllocator for FakeAllocator {
    fn allocate(&self, size: u64) -> Result<u64, VendorError> {
        if size > 1 << 41 {
            return Err("too large".into());
        }
        // Disjoint blocks, one after another from 1 MiB (a bump pointer; nothing behind it).
        let addr = (1 << 20) + self.next.fetch_add(size.max(1), Ordering::Relaxed);
        self.live.lock().unwrap().insert(addr);
        Ok(addr)
    }
    unsafe fn deallocate(&self, addr: u64, _size: u64) -> Result<(), VendorError> {
        if self.live.lock().unwrap().remove(&addr) {
            Ok(())
        } else {
            Err("not live".into())
        }
    }
}

struct Fixture {
    server: RpcServer,
    allocator: Arc<FakeAllocator>,
    canary: PathBuf,
    _user: UserGuard,
}

const CANARY: &[u8] = b"outside the sandbox: never changed\n";

/// `$TMPDIR/rpc-fuzz-PID/`: `canary`, and `sandbox/` with `a.txt`, `sub/b.txt`, a FIFO,
/// a link to the canary and one to `/proc/self/mem`. Files the inputs create stay there.
fn sandbox() -> (PathBuf, PathBuf) {
    let root = std::env::temp_dir().join(format!("rpc-fuzz-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let sandbox = root.join("sandbox");
    std::fs::create_dir_all(sandbox.join("sub")).expect("a temporary directory");
    let canary = root.join("canary");
    std::fs::write(&canary, CANARY).expect("the canary");
    std::fs::write(sandbox.join("a.txt"), b"alpha\n").expect("a.txt");
    std::fs::write(sandbox.join("sub/b.txt"), b"beta\n").expect("sub/b.txt");
    let fifo = std::ffi::CString::new(sandbox.join("fifo").into_os_string().into_encoded_bytes())
        .expect("no NUL");
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0, "mkfifo");
    std::os::unix::fs::symlink("../canary", sandbox.join("out")).expect("a link");
    std::os::unix::fs::symlink("/proc/self/mem", sandbox.join("mem")).expect("a link");
    (sandbox, canary)
}

static FIXTURE: LazyLock<Fixture> = LazyLock::new(|| {
    let (sandbox, canary) = sandbox();
    let server = RpcServer::new(ServerConfig {
        name: "fuzz".into(),
        limits: rpc_core::Limits {
            string_bytes: 4096,
            request_bytes: 16 << 10,
            printf_string_bytes: 4096,
            read_bytes: 4096,
            open_files: 4,
            malloc_bytes: 1 << 30,
            ..rpc_core::Limits::default()
        },
        services: ServicesConfig {
            exit: ExitPolicy::Record,
            files: FilePolicy::Sandbox(sandbox),
            allow_system: false,
        },
        ..ServerConfig::default()
    });
    let services = server.context().services();
    services.set_stdout(Box::new(std::io::sink()));
    services.set_stderr(Box::new(std::io::sink()));
    services.set_stdin(Box::new(std::io::empty()));
    let allocator = Arc::new(FakeAllocator::default());
    services.set_allocator(allocator.clone());
    let _ = server.start().expect("the worker starts");
    let user = server.user();
    Fixture {
        server,
        allocator,
        canary,
        _user: user,
    }
});

/// A v2 doorbell with a counter starting at a fuzzed value and no interrupt: its wait just
/// sleeps out the timeout, or returns at once if the counter is non-zero.
struct CountingBell(AtomicU64);

impl rpc_core::plugin::Doorbell for CountingBell {
    fn record(&self) -> [u8; 64] {
        [0; 64]
    }
    fn counter(&self) -> &AtomicU64 {
        &self.0
    }
    fn wait(&self, timeout: std::time::Duration) -> bool {
        if self.0.load(Ordering::Relaxed) != 0 {
            return true;
        }
        std::thread::sleep(timeout);
        false
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&shape, bytes)) = data.split_first() else {
        return;
    };
    let generation = if shape & 1 == 0 {
        Generation::V1
    } else {
        Generation::V2
    };
    let lanes = [1, 32, 64, 1][usize::from(shape >> 1 & 3)];
    let ports = u32::from(shape >> 3 & 3) + 1;
    let layout = Layout::new(generation, ports, lanes).expect("a valid layout");
    let size = layout.total_size();
    let memories = [0, 1].map(|k| {
        let memory = Arc::new(MailboxMemory::new(layout));
        let input = bytes.get(k * size..).unwrap_or_default();
        for (w, chunk) in input.chunks(8).take(size / 8).enumerate() {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            // SAFETY: word w lies inside the region (`take` above), which `memory` keeps alive
            // and 64-byte aligned; nothing else accesses it yet, and only atomically afterwards.
            let cell = unsafe { AtomicU64::from_ptr(memory.as_ptr().add(8 * w).cast()) };
            cell.store(u64::from_le_bytes(word), Ordering::Relaxed);
        }
        memory
    });
    let fixture = &*FIXTURE;
    let server = &fixture.server;
    let passes = server.stats().passes;
    let first = if shape & 32 != 0 && generation == Generation::V2 {
        let bell = CountingBell(AtomicU64::new(u64::from(shape >> 6)));
        server.attach(
            Box::new(memories[0].clone()),
            AttachOptions::default().doorbell(Box::new(bell)),
        )
    } else {
        server.attach(Box::new(memories[0].clone()), AttachOptions::default())
    };
    let second = server.attach(Box::new(memories[1].clone()), AttachOptions::default());
    // Two passes started after the attaches: at least one ran over both mailboxes.
    while server.stats().passes < passes + 2 {
        std::thread::yield_now();
    }
    server.detach(first).expect("attached above");
    server.detach(second).expect("attached above");
    let stats = server.stats();
    assert_eq!(stats.panics, 0, "{stats}");
    assert!(server.is_running());
    let services = server.context().services();
    assert_eq!(services.open_files(), 0, "a file outlived its mailbox");
    assert_eq!(services.live_allocations(), Vec::new());
    assert!(
        fixture.allocator.live.lock().unwrap().is_empty(),
        "an allocation outlived its mailbox"
    );
    assert_eq!(std::fs::read(&fixture.canary).expect("the canary"), CANARY);
});

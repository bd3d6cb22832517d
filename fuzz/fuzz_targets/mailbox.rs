//! One server pass over a mailbox whose every byte comes from the fuzzer: words in any state,
//! headers with any mask and opcode, packets with any lengths, handles, pointers and formats.
//!
//! Input: byte 0 picks the layout (bit 0: v1/v2; bits 1-2: lanes 1, 32 or 64; bits 3-4: 1-4
//! ports; bit 5: attach with a v2 doorbell counter), the rest is laid over the mailbox region
//! from offset 0 (the region is zero past the input). One long-lived server (a user guard held,
//! so it serves) attaches the mailbox, serves at least one full pass over it (an exchange
//! waiting for a packet the input never sends is suspended, not waited for), and detaches it
//! (abandoning the suspended exchanges). Checked: no handler panicked, the detach
//! returned, the worker still runs and no file was opened.
#![no_main]

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex};

use libfuzzer_sys::fuzz_target;
use rpc_core::plugin::{DeviceAllocator, VendorError};
use rpc_core::services::FilePolicy;
use rpc_core::{
    ExitPolicy, Generation, Layout, MailboxMemory, RpcServer, ServerConfig, ServicesConfig,
    UserGuard,
};

/// Hands out addresses without memory behind them, so fuzzed MALLOC sizes cost nothing.
#[derive(Default)]
struct FakeAllocator {
    next: AtomicU64,
    live: Mutex<HashSet<u64>>,
}

impl DeviceAllocator for FakeAllocator {
    fn allocate(&self, size: u64, align: u64) -> Result<u64, VendorError> {
        if size > 1 << 40 {
            return Err("too large".into());
        }
        let addr = (self.next.fetch_add(1, Ordering::Relaxed) + 1) * align.max(1);
        self.live.lock().unwrap().insert(addr);
        Ok(addr)
    }
    fn deallocate(&self, addr: u64) -> Result<(), VendorError> {
        if self.live.lock().unwrap().remove(&addr) {
            Ok(())
        } else {
            Err("not live".into())
        }
    }
}

struct Fixture {
    server: RpcServer,
    _user: UserGuard,
}

static FIXTURE: LazyLock<Fixture> = LazyLock::new(|| {
    let server = RpcServer::new(ServerConfig {
        name: "fuzz".into(),
        limits: rpc_core::Limits {
            stream_bytes: 4096,
            ..rpc_core::Limits::default()
        },
        services: ServicesConfig {
            exit: ExitPolicy::Record,
            files: FilePolicy::Deny,
            allow_system: false,
        },
        ..ServerConfig::default()
    });
    let services = server.context().services();
    services.set_stdout(Box::new(std::io::sink()));
    services.set_stderr(Box::new(std::io::sink()));
    services.set_stdin(Box::new(std::io::empty()));
    services.set_allocator(Arc::new(FakeAllocator::default()));
    let _ = server.start().expect("the worker starts");
    let user = server.user();
    Fixture {
        server,
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
    let memory = Arc::new(MailboxMemory::new(layout));
    for (k, chunk) in bytes.chunks(8).take(layout.total_size() / 8).enumerate() {
        let mut word = [0u8; 8];
        word[..chunk.len()].copy_from_slice(chunk);
        // SAFETY: word k lies inside the region (`take` above), which `memory` keeps alive and
        // 64-byte aligned; nothing else accesses it yet, and only atomically afterwards.
        let cell = unsafe { AtomicU64::from_ptr(memory.as_ptr().add(8 * k).cast()) };
        cell.store(u64::from_le_bytes(word), Ordering::Relaxed);
    }
    let fixture = &*FIXTURE;
    let server = &fixture.server;
    let passes = server.stats().passes;
    let id = if shape & 32 != 0 && generation == Generation::V2 {
        let bell = CountingBell(AtomicU64::new(u64::from(shape >> 6)));
        server.attach_with_doorbell(Box::new(memory.clone()), Box::new(bell))
    } else {
        server.attach(Box::new(memory.clone()))
    };
    // Two passes started after the attach: at least one ran over the whole mailbox.
    while server.stats().passes < passes + 2 {
        std::thread::yield_now();
    }
    server.detach(id).expect("attached above");
    let stats = server.stats();
    assert_eq!(stats.panics, 0, "{stats}");
    assert!(server.is_running());
    assert_eq!(server.context().services().open_files(), 0);
});

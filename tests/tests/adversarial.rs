//! Property tests: thousands of adversarial clients (`tests::adversary`) against a running
//! `RpcServer`. Whatever a device writes into the mailbox, the server
//! - never panics out of a handler (`stats().panics == 0`: none is injected here),
//! - never hangs (each case, including a well-formed request after it, ends within a deadline),
//! - never leaks (the server's table of allocations matches the allocator's truth after every
//!   case, no file is left open, and at the end every allocation is freed through FREE),
//! - and afterwards serves a well-formed request correctly.
//!
//! Ports `0..HOSTILE` of each mailbox belong to the adversaries; the last port belongs to a
//! well-formed client whose lock table holds the hostile ports' bits forever, as a GPU's
//! device-private locks would for warps that died holding them.
//!
//! Cases per property: `PROPTEST_CASES` (default 400; four properties of 1-3 scripts each).

use std::sync::Arc;
use std::time::{Duration, Instant};

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use rpc_core::plugin::{DeviceAllocator, VendorError};
use rpc_core::port::{Backoff, Deadline};
use rpc_core::services::{FilePolicy, HostAllocator};
use rpc_core::sync::Ordering;
use rpc_core::{
    Client, ExitPolicy, Generation, Layout, LockTable, MailboxMemory, Opcode, RpcServer,
    ServerConfig, ServicesConfig,
};
use tests::adversary::{RawMailbox, Step};

/// Stream bound of the server under attack: small, so lengths just inside it make the server
/// wait for many packets that never come.
const BOUND: u64 = 2048;
/// Ports the adversaries use; the next one is the well-formed client's.
const HOSTILE: u32 = 3;
/// A case (its scripts and the well-formed request after it) must end within this.
const CASE_DEADLINE: Duration = Duration::from_secs(10);

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(400)
}

/// The host allocator, refusing requests above 1 GiB: devices here ask for up to 2^64-1 bytes,
/// which the system allocator refuses (MALLOC answers 0) but the sanitizers' allocators abort on
/// (`cargo xtask sanitize` runs these tests), and sizes below that only reserve address space.
#[derive(Default)]
struct CappedAllocator(HostAllocator);

impl CappedAllocator {
    fn live(&self) -> usize {
        self.0.live()
    }
}

impl DeviceAllocator for CappedAllocator {
    fn allocate(&self, size: u64, align: u64) -> Result<u64, VendorError> {
        if size > 1 << 30 {
            return Err(format!("{size} bytes is more than this test gives").into());
        }
        self.0.allocate(size, align)
    }
    fn deallocate(&self, addr: u64) -> Result<(), VendorError> {
        self.0.deallocate(addr)
    }
}

struct Fixture {
    server: RpcServer,
    memory: Arc<MailboxMemory>,
    allocator: Arc<CappedAllocator>,
    /// The well-formed client's lock bits: the hostile ports locked for good.
    locks: LockTable,
}

impl Fixture {
    fn new(name: &str, generation: Generation, lanes: u32) -> Self {
        let _ = env_logger::builder().is_test(true).try_init();
        let server = RpcServer::new(ServerConfig {
            name: name.into(),
            limits: rpc_core::Limits {
                stream_bytes: BOUND,
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
        services.set_stdin(Box::new(std::io::Cursor::new(
            b"a line of input\nanother\n".repeat(64),
        )));
        let allocator = Arc::new(CappedAllocator::default());
        services.set_allocator(allocator.clone());
        // Custom opcodes: an echo of a stream, and a family answered by a predicate.
        server.register(Opcode::user(1), |mut req| async move {
            let data = req.recv_n().await?;
            let slices: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
            req.send_n(&slices).await
        });
        server.register_matching(
            "user 2..10",
            |op| op.is_user() && (2..10).contains(&op.number()),
            |mut req| async move {
                req.recv_and_send(|_, p| p.set_word(0, p.word(0) ^ 0x5a))
                    .await
            },
        );
        let layout = Layout::new(generation, HOSTILE + 1, lanes).unwrap();
        let memory = Arc::new(MailboxMemory::new(layout));
        server.attach(Box::new(memory.clone()));
        let _ = server.start().unwrap();
        let locks = LockTable::new(layout.ports());
        for port in 0..HOSTILE {
            locks.words()[port as usize / 32].fetch_or(1 << (port % 32), Ordering::Relaxed);
        }
        Fixture {
            server,
            memory,
            allocator,
            locks,
        }
    }

    fn raw(&self) -> RawMailbox<'_> {
        RawMailbox::new(&self.memory)
    }

    /// A well-formed TEST_INCREMENT and TEST_STREAM on the good port, checked lane by lane.
    fn well_formed(&self, deadline: Instant, salt: u64) {
        let wait = Deadline(deadline);
        let client = Client::new(self.memory.view(), self.locks.words())
            .unwrap()
            .with_wait(&wait);
        let layout = self.memory.layout();
        let mask = layout.lane_mask();
        let mut port = client.open(Opcode::TEST_INCREMENT, mask).unwrap();
        assert_eq!(port.index(), HOSTILE, "only the good port is ours");
        let mut got = [0u64; 64];
        port.send_and_recv(
            |l, p| p.set_word(0, salt + u64::from(l)),
            |l, p| got[l as usize] = p.word(0),
        )
        .unwrap();
        drop(port);
        for lane in 0..layout.lanes() {
            assert_eq!(
                got[lane as usize],
                salt + u64::from(lane) + 1,
                "lane {lane}"
            );
        }
        let data: Vec<Vec<u8>> = (0..layout.lanes())
            .map(|l| {
                (0..(salt % 150 + u64::from(l)))
                    .map(|i| i as u8 ^ l as u8)
                    .collect()
            })
            .collect();
        let slices: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
        let mut port = client.open(Opcode::TEST_STREAM, mask).unwrap();
        port.send_n(&slices).unwrap();
        let back = port.recv_n(BOUND).unwrap();
        drop(port);
        for lane in 0..layout.lanes() as usize {
            assert_eq!(back[lane], data[lane], "lane {lane}");
        }
    }

    /// Checks after a case: nothing panicked, no file open, the server's allocation table is
    /// exactly what the allocator holds.
    fn check_invariants(&self) {
        let stats = self.server.stats();
        assert_eq!(stats.panics, 0, "{stats}");
        let services = self.server.context().services();
        assert_eq!(services.open_files(), 0);
        // The worker may be in the middle of a leftover MALLOC (allocated, not yet recorded):
        // the two must agree once it is done, within the deadline.
        eventually("the server's table and the allocator agree", || {
            services.live_allocations().len() == self.allocator.live()
        });
    }

    /// Frees every allocation the adversaries were handed, through FREE from the good port,
    /// until nothing is live (a leftover hostile MALLOC may still be served meanwhile).
    fn free_everything(&self) {
        let deadline = Instant::now() + CASE_DEADLINE;
        let _user = self.server.user();
        let wait = Deadline(deadline);
        let client = Client::new(self.memory.view(), self.locks.words())
            .unwrap()
            .with_wait(&wait);
        let services = self.server.context().services();
        let mut attempt = 0;
        while !(services.live_allocations().is_empty() && self.allocator.live() == 0) {
            assert!(
                Instant::now() < deadline,
                "allocations left: FREE not served or a leak"
            );
            for allocation in services.live_allocations() {
                let mut port = client.open(Opcode::FREE, 1).unwrap();
                port.send(|_, p| p.set_word(0, allocation.addr)).unwrap();
            }
            Backoff::step(attempt);
            attempt += 1;
        }
    }
}

/// Polls `condition` (backing off) until it holds; fails the test after `CASE_DEADLINE`.
fn eventually(what: &str, condition: impl Fn() -> bool) {
    let deadline = Instant::now() + CASE_DEADLINE;
    let mut attempt = 0;
    while !condition() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        Backoff::step(attempt);
        attempt += 1;
    }
}

fn values() -> impl Strategy<Value = u64> {
    prop_oneof![
        3 => 0..160u64,
        1 => Just(u64::MAX),
        1 => Just(1 << 63),
        1 => Just(BOUND),
        1 => Just(BOUND + 1),
        1 => 160..BOUND,
        2 => any::<u64>(),
    ]
}

fn opcodes() -> impl Strategy<Value = u32> {
    let known: Vec<u32> = Opcode::ALL.iter().map(|o| o.0).collect();
    prop_oneof![
        6 => prop::sample::select(known),
        1 => Just(Opcode::user(1).0),
        1 => (2u32..12).prop_map(|n| Opcode::user(n).0),
        2 => any::<u32>(),
    ]
}

fn masks(lanes: u32) -> impl Strategy<Value = u64> {
    let full = if lanes == 64 {
        u64::MAX
    } else {
        (1 << lanes) - 1
    };
    prop_oneof![
        4 => Just(full),
        3 => 1..=full,
        1 => Just(0u64),
        1 => Just(1u64 << lanes.min(63)),
        2 => any::<u64>(),
    ]
}

fn texts() -> impl Strategy<Value = Vec<u8>> {
    let formats: Vec<Vec<u8>> = [
        &b"%s %s %s\0"[..],
        b"%d %n %p %c\0",
        b"%*.*d|%-*s\0",
        b"%lld %f %e %g %a\0",
        b"%",
        b"%%%5000000000d%.99999999999f\0",
        b"%hhx%jd%zu%tX%Lf\0",
        b"/tmp/adversary\0",
        b"r+\0",
    ]
    .iter()
    .map(|f| f.to_vec())
    .collect();
    prop_oneof![
        3 => prop::sample::select(formats),
        1 => prop::collection::vec(any::<u8>(), 0..56),
    ]
}

fn steps(lanes: u32) -> impl Strategy<Value = Step> {
    prop_oneof![
        8 => Just(Step::Send),
        6 => (0u8..6).prop_map(|ms| Step::Receive { ms }),
        6 => (0..lanes + 2, 0u8..8, values()).prop_map(|(lane, word, value)| Step::Word {
            lane,
            word,
            value
        }),
        1 => any::<u64>().prop_map(|seed| Step::Fill { seed }),
        2 => (values(), texts()).prop_map(|(len, bytes)| Step::Text { len, bytes }),
        1 => (masks(lanes), opcodes()).prop_map(|(mask, opcode)| Step::Header { mask, opcode }),
        1 => prop_oneof![Just(0u32), Just(1), any::<u32>()].prop_map(Step::Secondary),
        1 => prop_oneof![Just(0u32), Just(1), any::<u32>()].prop_map(Step::Primary),
        1 => Just(Step::Abandon),
    ]
}

/// A script: a header (usually a real opcode), then up to 20 steps, on one hostile port.
fn script(lanes: u32) -> impl Strategy<Value = (u32, Vec<Step>)> {
    (
        0..HOSTILE,
        masks(lanes),
        opcodes(),
        prop::collection::vec(steps(lanes), 0..20),
    )
        .prop_map(|(port, mask, opcode, mut steps)| {
            steps.insert(0, Step::Header { mask, opcode });
            (port, steps)
        })
}

/// Runs `cases` cases of 1-3 scripts one after the other (or, with `concurrent`, each on its
/// own port and thread, beside a well-formed client), then the checks above.
fn run_property(name: &str, generation: Generation, lanes: u32, concurrent: bool) {
    let fixture = Fixture::new(name, generation, lanes);
    let mut runner = TestRunner::new(Config {
        cases: cases(),
        failure_persistence: None,
        ..Config::default()
    });
    let strategy = prop::collection::vec(script(lanes), 1..4);
    let salt = std::sync::atomic::AtomicU64::new(1);
    let result = runner.run(&strategy, |scripts| {
        let started = Instant::now();
        let deadline = started + CASE_DEADLINE;
        let user = fixture.server.user();
        if concurrent {
            std::thread::scope(|scope| {
                for (k, (_, steps)) in scripts.iter().enumerate() {
                    let raw = fixture.raw();
                    scope.spawn(move || raw.run(k as u32 % HOSTILE, steps));
                }
                // A well-formed client next door while they scribble.
                fixture.well_formed(deadline, salt.fetch_add(1000, Ordering::Relaxed));
            });
        } else {
            for (port, steps) in &scripts {
                fixture.raw().run(*port, steps);
            }
        }
        // End the scripts: the server abandons any exchange waiting for them.
        drop(user);
        let _user = fixture.server.user();
        fixture.well_formed(deadline, salt.fetch_add(1000, Ordering::Relaxed));
        fixture.check_invariants();
        prop_assert!(
            started.elapsed() < CASE_DEADLINE,
            "case took {:?}",
            started.elapsed()
        );
        Ok(())
    });
    if let Err(error) = result {
        panic!("{name}: {error}");
    }
    fixture.free_everything();
    fixture.check_invariants();
    let stats = fixture.server.stats();
    eprintln!("{name}: {} cases; {stats}", cases());
    let _ = fixture
        .server
        .shutdown_with(rpc_core::ShutdownPolicy::Force);
}

#[test]
fn adversarial_scripts_on_a_v1_mailbox_with_one_lane() {
    run_property("adv-v1-L1", Generation::V1, 1, false);
}

#[test]
fn adversarial_scripts_on_a_v2_mailbox_with_32_lanes() {
    run_property("adv-v2-L32", Generation::V2, 32, false);
}

#[test]
fn adversarial_scripts_on_a_v1_mailbox_with_64_lanes() {
    run_property("adv-v1-L64", Generation::V1, 64, false);
}

#[test]
fn concurrent_adversaries_beside_a_well_formed_client() {
    run_property("adv-concurrent-L32", Generation::V2, 32, true);
}

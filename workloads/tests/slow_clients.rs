//! Slow honest clients on many ports at once, against a server with a client timeout and a
//! small memory budget: PROTOCOL section 11 and `Limits::held_bytes` under load. Each client
//! thread owns one port of a 32-lane mailbox and echoes streams (TEST_STREAM) through it,
//! napping now and then while it waits for the buffer, so that some of its streams stand
//! unfinished for longer than the client timeout and some ports' streams wait at once. How
//! long a nap lasts decides only which of the allowed outcomes a request gets; the properties
//! hold whatever the timing:
//! - no late packet is run as a request: every request the clients opened ends exactly once
//!   (served, an error or abandoned), and the server counts no other;
//! - no port is lost: after each echo, a TEST_INCREMENT on the same port is answered right;
//! - an echo is exact, or empty (refused by the budget, or abandoned before its reply), or
//!   the exact bytes up to where the server gave up and zeros after (the drained reply);
//! - the server never holds more than its budget, and holds nothing once the clients are done.
//!
//! Cases: `PROPTEST_CASES` (default 48).
#![cfg(not(loom))]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use rpc_core::protocol::{
    Backoff, Client, ClientPort, Generation, Layout, LockTable, MailboxMemory, ProtocolError, Wait,
};
use rpc_core::AttachOptions;
use rpc_core::{Limits, Opcode, RpcServer, ServerConfig, StatsSnapshot};
use workloads::claims::increment_lanes;
use workloads::stress::SplitMix64;

const PORTS: u32 = 8;
const LANES: u32 = 32;
/// Bytes a lane's echo carries at most.
const LANE_BYTES: usize = 2048;
/// What the server may hold, every port together: one and a half full 32-lane echoes, of up
/// to seven at once, so that the budget refuses some.
const BUDGET: u64 = 3 * LANES as u64 * LANE_BYTES as u64 / 2;
const CLIENT_TIMEOUT: Duration = Duration::from_millis(2);
/// A hang guard, never reached by a correct server.
const HANG_GUARD: Duration = Duration::from_secs(60);

/// A slow client's wait: before some of its polls it naps (up to `nap_us`), which leaves the
/// server waiting on its port; otherwise it backs off as any client does, up to the hang
/// guard.
struct Slow {
    rng: Mutex<SplitMix64>,
    nap_us: u64,
    guard: Instant,
}

impl Wait for Slow {
    fn pause(&self, port: u32, attempt: u32) -> Result<(), ProtocolError> {
        if attempt == 0 && self.nap_us > 0 {
            let mut rng = self.rng.lock().unwrap();
            if rng.below(4) == 0 {
                std::thread::sleep(Duration::from_micros(rng.below(self.nap_us)));
            }
        }
        if Instant::now() >= self.guard {
            return Err(ProtocolError::Abandoned {
                port,
                reason: "hang guard",
            });
        }
        Backoff::step(attempt);
        Ok(())
    }
}

/// One echo: its active lanes and the seed of its bytes and lengths.
#[derive(Clone, Debug)]
struct Echo {
    mask: u64,
    seed: u64,
}

/// One client thread: its echoes and how long it may nap.
#[derive(Clone, Debug)]
struct Script {
    echoes: Vec<Echo>,
    nap_us: u64,
    seed: u64,
}

fn script() -> impl Strategy<Value = Script> {
    let echo = (1u64..=u64::from(u32::MAX), any::<u64>()).prop_map(|(mask, seed)| Echo {
        mask: mask & ((1 << LANES) - 1) | 1,
        seed,
    });
    (
        prop::collection::vec(echo, 1..4),
        prop_oneof![Just(0u64), Just(500), Just(5000)],
        any::<u64>(),
    )
        .prop_map(|(echoes, nap_us, seed)| Script {
            echoes,
            nap_us,
            seed,
        })
}

/// Lane `lane`'s bytes of `echo`.
fn bytes(echo: &Echo, lane: u32) -> Vec<u8> {
    let x = echo.seed ^ u64::from(lane).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    let len = (x % (LANE_BYTES as u64 + 1)) as usize;
    (0..len).map(|i| (x >> (i % 56)) as u8 ^ i as u8).collect()
}

/// Opens `index` (this thread's own port) once the server has handed its buffer back.
fn open_own<'a>(client: &Client<'a>, index: u32, opcode: Opcode, mask: u64) -> ClientPort<'a> {
    let start = Instant::now();
    for attempt in 0.. {
        if let Some(port) = client.try_open_at(index, opcode, mask).unwrap() {
            return port;
        }
        assert!(start.elapsed() < HANG_GUARD, "port {index} never came back");
        Backoff::step(attempt);
    }
    unreachable!()
}

/// How lanes' echoes came back, for the report: exact, empty, cut (zeros after a point).
static OUTCOMES: [AtomicU64; 3] = [const { AtomicU64::new(0) }; 3];

/// Whether `got` is an allowed echo of `sent` (see the module docs); counts its kind.
fn allowed(sent: &[u8], got: &[u8]) -> bool {
    let same = sent.iter().zip(got).take_while(|(a, b)| a == b).count();
    let kind = if got == sent {
        0
    } else if got.is_empty() {
        1
    } else if got.len() == sent.len() && got[same..].iter().all(|&b| b == 0) {
        2
    } else {
        return false;
    };
    OUTCOMES[kind].fetch_add(1, Ordering::Relaxed);
    true
}

/// Runs one thread's script on port `index`; the requests it opened.
fn run(client: &Client<'_>, index: u32, script: &Script) -> u64 {
    let mut opened = 0;
    for (k, echo) in script.echoes.iter().enumerate() {
        let data: Vec<Vec<u8>> = (0..LANES).map(|l| bytes(echo, l)).collect();
        let slices: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
        let mut port = open_own(client, index, Opcode::TEST_STREAM, echo.mask);
        port.send_n(&slices).unwrap();
        let back = port.recv_n(LANE_BYTES as u64).unwrap();
        drop(port);
        opened += 1;
        for lane in rpc_core::protocol::lanes(echo.mask) {
            let (sent, got) = (&data[lane as usize], &back[lane as usize]);
            assert!(
                allowed(sent, got),
                "port {index} echo {k} lane {lane}: sent {} bytes, got {} back, first \
                 difference at {:?}",
                sent.len(),
                got.len(),
                sent.iter().zip(got).position(|(a, b)| a != b)
            );
        }
        // The port serves again.
        let x = script.seed.wrapping_add(k as u64) >> 1;
        let mut port = open_own(client, index, Opcode::TEST_INCREMENT, echo.mask);
        let got = increment_lanes(&mut port, x);
        drop(port);
        opened += 1;
        for lane in rpc_core::protocol::lanes(echo.mask) {
            assert_eq!(got[lane as usize], x + u64::from(lane) + 1, "port {index}");
        }
    }
    opened
}

/// Every request the server ended, however it ended it.
fn ended(stats: &StatsSnapshot) -> u64 {
    stats.served_of(Opcode::TEST_STREAM)
        + stats.served_of(Opcode::TEST_INCREMENT)
        + stats.errors
        + stats.panics
        + stats.abandoned
}

/// Waits (within the hang guard) until `done`.
fn wait_until(what: &str, done: impl Fn() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < HANG_GUARD, "hang guard: {what}");
        std::thread::sleep(Duration::from_micros(200));
    }
}

#[test]
fn slow_clients_on_many_ports_lose_no_port_and_run_no_late_packet() {
    let _ = env_logger::builder().is_test(true).try_init();
    let server = RpcServer::new(ServerConfig {
        name: "slow".into(),
        limits: Limits {
            string_bytes: LANE_BYTES as u64,
            held_bytes: BUDGET,
            ..Limits::default()
        },
        client_timeout: Some(CLIENT_TIMEOUT),
        ..ServerConfig::default()
    });
    let _ = server.start().unwrap();
    let layout = Layout::new(Generation::V1, PORTS, LANES).unwrap();
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(48);
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        max_shrink_time: 60_000,
        ..Config::default()
    });
    let opened_total = AtomicU64::new(0);
    let most_held = AtomicU64::new(0);
    let strategy = prop::collection::vec(script(), 1..PORTS as usize);
    let result = runner.run(&strategy, |scripts| {
        let memory = Arc::new(MailboxMemory::new(layout));
        let id = server.attach(Box::new(memory.clone()), AttachOptions::default());
        let user = server.user();
        let locks = LockTable::new(PORTS);
        let guard = Instant::now() + HANG_GUARD;
        let before = ended(&server.stats());
        let running = AtomicU64::new(scripts.len() as u64);
        let opened: u64 = std::thread::scope(|scope| {
            let threads: Vec<_> = scripts
                .iter()
                .enumerate()
                .map(|(index, script)| {
                    let (memory, locks, running) = (&memory, &locks, &running);
                    scope.spawn(move || {
                        let wait = Slow {
                            rng: Mutex::new(SplitMix64::new(script.seed)),
                            nap_us: script.nap_us,
                            guard,
                        };
                        let client = Client::new(memory.view(), locks.words())
                            .unwrap()
                            .with_wait(&wait);
                        let opened = run(&client, index as u32, script);
                        running.fetch_sub(1, Ordering::Relaxed);
                        opened
                    })
                })
                .collect();
            // The budget holds while they run.
            while running.load(Ordering::Relaxed) > 0 {
                let held = server.context().held_bytes();
                most_held.fetch_max(held, Ordering::Relaxed);
                assert!(held <= BUDGET, "held {held} bytes, budget {BUDGET}");
                std::thread::sleep(Duration::from_micros(100));
            }
            threads.into_iter().map(|t| t.join().unwrap()).sum()
        });
        opened_total.fetch_add(opened, Ordering::Relaxed);
        // Each request is counted once it has ended; none more.
        wait_until("every request counted", || {
            ended(&server.stats()) - before >= opened
        });
        wait_until("nothing held", || server.context().held_bytes() == 0);
        server.detach(id).unwrap();
        drop(user);
        let counted = ended(&server.stats()) - before;
        prop_assert_eq!(counted, opened, "requests ended vs opened");
        Ok(())
    });
    if let Err(error) = result {
        panic!("{error}");
    }
    let stats = server.stats();
    eprintln!(
        "{cases} cases: {} requests, {} abandoned (client timeout); lanes' echoes {:?} (exact, \
         empty, cut); at most {} of {BUDGET} bytes held; {stats}",
        opened_total.load(Ordering::Relaxed),
        stats.abandoned,
        OUTCOMES.each_ref().map(|n| n.load(Ordering::Relaxed)),
        most_held.load(Ordering::Relaxed),
    );
    assert_eq!(ended(&stats), opened_total.load(Ordering::Relaxed));
}

//! Ports whose exchange the server abandoned (PROTOCOL section 11): a byte string claimed above
//! the bound on every opcode that receives one, eight of them at once, a client slower than the client
//! timeout, and a worker with no users beside such ports. Each port is drained: the client's
//! script is answered to its end with the opcode's failure word, no late packet runs as a
//! request, and the port serves its client's next request.
//!
//! Every wait is for a condition (a reply, a counter); the durations are hang guards only.
#![cfg(not(loom))]

mod common;

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use common::capture::Capture;
use common::{register_holding, Mailbox};
use rpc_core::protocol::{Client, ClientPort, Deadline, LockTable, FIRST_PACKET_BYTES};
use rpc_core::{Limits, Opcode, RpcServer, ServerConfig, ShutdownPolicy, Started, Stopped};
use workloads::claims::{claim, finish_claim, finish_string, increment_at, open, start_string};
use workloads::claims::{string_first, write_stdout_at};

/// Bytes a lane may send (the claims below are far above it).
const BOUND: u64 = 4096;
/// How long anything may take before the test fails instead of hanging.
const HANG_GUARD: Duration = Duration::from_secs(60);

/// A running server with one mailbox of `ports` ports (L = 1) and its output captured.
struct Fx {
    server: RpcServer,
    mailbox: Mailbox,
    output: Capture,
    wait: Deadline,
}

impl Fx {
    fn new(name: &str, ports: u32, client_timeout: Option<Duration>) -> Fx {
        let _ = env_logger::builder().is_test(true).try_init();
        let server = RpcServer::new(ServerConfig {
            name: name.into(),
            limits: Limits {
                string_bytes: BOUND,
                ..Limits::default()
            },
            client_timeout,
            ..ServerConfig::default()
        });
        let mailbox = Mailbox::attach(&server, ports, 1);
        let output = Capture::default();
        let services = server.context().services();
        services.set_stdout(Box::new(output.clone()));
        services.set_stderr(Box::new(output.clone()));
        assert_eq!(server.start(), Ok(Started::Started));
        Fx {
            server,
            mailbox,
            output,
            wait: Deadline::after(HANG_GUARD),
        }
    }

    /// The kernel's client, with the mailbox's lock table.
    fn client(&self) -> Client<'_> {
        self.mailbox.client().with_wait(&self.wait)
    }

    /// A client with a lock table of its own (another process's, or a new kernel's).
    fn client_with<'a>(&'a self, locks: &'a LockTable) -> Client<'a> {
        Client::new(self.mailbox.memory.view(), locks.words())
            .unwrap()
            .with_wait(&self.wait)
    }

    /// Waits until `condition` holds of the server's counters.
    fn eventually(&self, what: &str, condition: impl Fn(&rpc_core::StatsSnapshot) -> bool) {
        let start = Instant::now();
        loop {
            let stats = self.server.stats();
            if condition(&stats) {
                return;
            }
            assert!(start.elapsed() < HANG_GUARD, "never {what}: {stats}");
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

/// A claim above the bound on each opcode that receives a byte string, on port 0 while the server keeps a user
/// (as rpc-serve does all its life): each is answered to its end with the opcode's failure
/// word, nothing is printed, and port 0 then serves a TEST_INCREMENT. (Before, the port stayed
/// locked until the user was gone: the client's next wait never ended.)
#[test]
fn an_over_long_claim_on_each_send_n_opcode_leaves_its_port_serving() {
    let fx = Fx::new("claims", 2, None);
    let _user = fx.server.user();
    let client = fx.client();
    let string_first = string_first();
    for (k, &opcode) in string_first.iter().enumerate() {
        let port = claim(&client, 0, opcode);
        assert_eq!(finish_claim(port), opcode.failure_word(), "{opcode}");
        fx.eventually("counted the error", |s| s.errors == k as u64 + 1);
        assert_eq!(increment_at(&client, 0, 10 * k as u64), 10 * k as u64 + 1);
    }
    assert!(fx.output.bytes().is_empty(), "{:?}", fx.output.bytes());
    // The last TEST_INCREMENT is counted after its reply came back.
    let stats = common::settled_stats(&fx.server, fx.mailbox.id);
    assert_eq!(stats.total_served(), string_first.len() as u64, "{stats}");
    assert_eq!(
        stats.served_of(Opcode::TEST_INCREMENT),
        string_first.len() as u64
    );
}

/// Eight claims above the bound on the eight ports of a mailbox, all outstanding at once: each
/// is answered, and then every port serves.
#[test]
fn eight_over_long_claims_on_eight_ports_then_all_eight_serve() {
    let fx = Fx::new("eight-claims", 8, None);
    let _user = fx.server.user();
    let client = fx.client();
    let string_first = string_first();
    let ports: Vec<ClientPort<'_>> = (0..8)
        .map(|index| claim(&client, index, string_first[index as usize]))
        .collect();
    for (index, port) in ports.into_iter().enumerate() {
        assert_eq!(finish_claim(port), string_first[index].failure_word());
    }
    for index in 0..8 {
        assert_eq!(
            increment_at(&client, index, u64::from(index)),
            u64::from(index) + 1
        );
    }
    fx.eventually("counted the errors", |s| s.errors == 8);
    assert!(fx.output.bytes().is_empty());
}

/// A slow but honest client: it sends the first packet of a 200-byte string, and the rest only
/// once the server has given the exchange up (its client timeout, set short here). Its late
/// packets are answered, never read as a request: nothing is printed (a WRITE), nothing is
/// echoed (a TEST_STREAM: the reply says 0 bytes), and the port serves the client's next
/// requests. (Before, the first late packet was served as a new request, its bytes taken for a
/// length and a text, and the port was then lost.)
#[test]
fn a_slow_clients_late_packets_are_answered_never_run_and_its_port_serves_again() {
    let fx = Fx::new("slow", 2, Some(Duration::from_millis(20)));
    let _user = fx.server.user();
    let client = fx.client();
    let data: Vec<u8> = (0..200u32).map(|i| b'a' + (i % 26) as u8).collect();
    for (k, opcode) in [Opcode::WRITE_TO_STDOUT, Opcode::TEST_STREAM]
        .into_iter()
        .enumerate()
    {
        let port = start_string(&client, 0, opcode, &data);
        fx.eventually("gave the silent client up", |s| s.abandoned == k as u64 + 1);
        assert_eq!(
            finish_string(port, &data),
            0,
            "{opcode}: 0 bytes written, or an empty echo"
        );
        assert_eq!(fx.server.stats().served_of(opcode), 0, "{opcode} ran");
        assert!(fx.output.bytes().is_empty(), "{:?}", fx.output.bytes());
        assert_eq!(increment_at(&client, 0, 41), 42);
    }
    // A write on that port prints again.
    assert_eq!(write_stdout_at(&client, 0, b"again\n"), 6);
    assert_eq!(fx.output.bytes(), b"again\n");
}

/// A client process killed mid-exchange (its lock table gone with it) and a new process, with a
/// lock table of its own, that takes the same port once the server gave the dead client up (its
/// client timeout; the count says when): the new client's request is served, and the port after
/// it. (Issue 44: a reset that wrote the server's word back could swallow that request. The
/// drain writes the header's mark, and the drained reply only when the buffer is the server's;
/// a new client's fresh header and flip are then its own. A request opened before the drain is
/// PROTOCOL section 11's "not guaranteed": no timing-free test can place it.)
#[test]
fn a_new_client_takes_the_port_of_a_timed_out_one_and_is_served() {
    let fx = Fx::new("taken", 2, Some(Duration::from_millis(20)));
    let _user = fx.server.user();
    let dead_locks = LockTable::new(2);
    let dead = fx.client_with(&dead_locks);
    let mut port = open(&dead, 0, Opcode::TEST_STREAM);
    port.send(|_, p| {
        p.set_word(0, 200);
        p.write_bytes(8, &[b'd'; FIRST_PACKET_BYTES]);
    })
    .unwrap();
    // The process dies here: its port and lock bits are never seen again.
    std::mem::forget(port);
    fx.eventually("gave the dead client up", |s| s.abandoned == 1);
    let client = fx.client();
    assert_eq!(increment_at(&client, 0, 41), 42);
    let mut port = open(&client, 0, Opcode::TEST_STREAM);
    port.send_n(&[&b"mine"[..]]).unwrap();
    assert_eq!(port.recv_n(BOUND).unwrap()[0], b"mine");
    drop(port);
    assert_eq!(increment_at(&client, 0, 7), 8);
    assert_eq!(fx.server.stats().served_of(Opcode::TEST_STREAM), 1);
}

/// Drained and quarantined ports are no users: with a drained port and a port a forced
/// shutdown quarantined, the worker goes to sleep once the kernels are gone, and a new kernel
/// finds both ports serving. The drained port serves while another kernel still runs (before,
/// it stayed locked until every kernel that had arrived by its claim was gone).
#[test]
fn drained_and_quarantined_ports_keep_no_worker_awake() {
    let fx = Fx::new("asleep", 2, None);
    let started = register_holding(&fx.server, Opcode::user(1));
    let other_kernel = fx.server.user_for(fx.mailbox.id);
    let kernel = fx.server.user_for(fx.mailbox.id);
    let client = fx.client();
    let port = claim(&client, 0, Opcode::WRITE_TO_STDOUT);
    assert_eq!(finish_claim(port), 0);
    assert_eq!(increment_at(&client, 0, 1), 2);
    // Port 1: an exchange a forced shutdown cuts, whose kernel dies with it.
    let mut cut = open(&client, 1, Opcode::user(1));
    cut.send(|_, p| p.set_word(0, 7)).unwrap();
    std::mem::forget(cut);
    let start = Instant::now();
    while !started.load(Ordering::Acquire) {
        assert!(start.elapsed() < HANG_GUARD, "port 1 was never served");
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(
        fx.server.shutdown_with(ShutdownPolicy::Force),
        Ok(Stopped::Stopped)
    );
    assert_eq!(fx.server.stats().abandoned, 1);
    drop((kernel, other_kernel));
    let sleeps = fx.server.stats().sleeps;
    assert_eq!(fx.server.start(), Ok(Started::Started));
    fx.eventually("slept with no user", |s| s.sleeps > sleeps);
    let _kernel = fx.server.user_for(fx.mailbox.id);
    let fresh = LockTable::new(2);
    let client = fx.client_with(&fresh);
    assert_eq!(increment_at(&client, 0, 3), 4);
    // The quarantined port is drained at the new kernel's first pass: free soon after.
    let start = Instant::now();
    let mut port = loop {
        if let Some(port) = client.try_open_at(1, Opcode::TEST_INCREMENT, 1).unwrap() {
            break port;
        }
        assert!(start.elapsed() < HANG_GUARD, "port 1 never served again");
        std::thread::sleep(Duration::from_millis(1));
    };
    let mut got = 0;
    port.send_and_recv(|_, p| p.set_word(0, 5), |_, p| got = p.word(0))
        .unwrap();
    assert_eq!(got, 6);
}

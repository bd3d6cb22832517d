//! The server-wide memory budget (`Limits::held_bytes`): byte strings of many ports, each within the
//! per-request bounds, together never make the server hold more than the budget. A test binary
//! of its own, so that the process's resident memory is this test's alone.
#![cfg(not(loom))]

mod common;

use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use common::{eventually, Mailbox};
use rpc_core::protocol::{Client, ClientPort, FIRST_PACKET_BYTES};
use rpc_core::{Limits, Opcode, RpcServer, ServerConfig};

const LANES: u32 = 32;
const PORTS: u32 = 8;
/// Each lane's byte string: 8 MiB a port.
const LANE_BYTES: usize = 256 << 10;
const PORT_BYTES: u64 = (LANE_BYTES as u64) * LANES as u64;
/// Room for two ports' byte strings, not three.
const BUDGET: u64 = 20 << 20;

/// The device's stdout: counts the bytes, keeps none.
#[derive(Clone, Default)]
struct Count(Arc<AtomicU64>);

impl Write for Count {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.fetch_add(buf.len() as u64, Ordering::Relaxed);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// This process's resident memory, in bytes.
fn rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    let kib: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kib << 10
}

/// A WRITE_TO_STDOUT whose byte string has gone out but for its last packet.
fn unfinished_write<'a>(client: &Client<'a>, fill: u8) -> ClientPort<'a> {
    let mut port = client
        .open(Opcode::WRITE_TO_STDOUT, u64::from(u32::MAX))
        .unwrap();
    let bytes = vec![fill; LANE_BYTES];
    port.send(|_, p| {
        p.set_word(0, LANE_BYTES as u64);
        p.write_bytes(8, &bytes[..FIRST_PACKET_BYTES]);
    })
    .unwrap();
    let rest: Vec<&[u8]> = bytes[FIRST_PACKET_BYTES..].chunks(64).collect();
    for chunk in &rest[..rest.len() - 1] {
        port.send(|_, p| p.write_bytes(0, chunk)).unwrap();
    }
    port
}

/// Sends the last packet of `unfinished_write`'s byte string; the bytes written, per lane.
fn finish(mut port: ClientPort<'_>) -> Vec<u64> {
    let last = (LANE_BYTES - FIRST_PACKET_BYTES - 1) % 64 + 1;
    port.send(|_, p| p.write_bytes(0, &[0; 64][..last]))
        .unwrap();
    let mut written = vec![0; LANES as usize];
    port.recv(|l, p| written[l as usize] = p.word(0)).unwrap();
    written
}

/// Eight ports each send 8 MiB of a write and stop before the last packet (within every
/// per-request bound). Before the budget, the server held all 64 MiB at once. With a budget
/// of 20 MiB the first two are held (16 MiB, the counter says so and the process grew by
/// about that); the other six claims are received and dropped, and their writes answered 0
/// (refused) once they end. A write after one of the held ones ended is served whole, and
/// detaching the mailbox with one still unfinished gives the budget back entirely.
#[test]
fn unfinished_byte_strings_of_many_ports_hold_at_most_the_budget() {
    let _ = env_logger::builder().is_test(true).try_init();
    let server = RpcServer::new(ServerConfig {
        name: "budget".into(),
        limits: Limits {
            held_bytes: BUDGET,
            ..Limits::default()
        },
        ..ServerConfig::default()
    });
    let written_out = Count::default();
    let services = server.context().services();
    services.set_stdout(Box::new(written_out.clone()));
    let mailbox = Mailbox::attach(&server, PORTS, LANES);
    let _ = server.start().unwrap();
    let user = server.user();
    let deadline = common::hang_guard();
    let client = mailbox.client().with_wait(&deadline);

    let before = rss();
    let mut ports: Vec<ClientPort<'_>> = (0..PORTS)
        .map(|i| unfinished_write(&client, b'a' + i as u8))
        .collect();
    let held = server.context().held_bytes();
    let grown = rss().saturating_sub(before);
    eprintln!("held {held} bytes; the process grew by {} KiB", grown >> 10);
    assert_eq!(held, 2 * PORT_BYTES, "two ports' byte strings");
    assert!(held <= BUDGET);
    // A sanity bound (the budget and as much again), far below the 64 MiB of before. Not under
    // a sanitizer (`cargo xtask sanitize` says so): AddressSanitizer's shadow memory, redzones
    // and quarantine of freed blocks are resident too, and not the server's; the counter above
    // is the bound there.
    if std::env::var_os("RPC_SANITIZER").is_none() {
        assert!(grown < 2 * BUDGET, "resident +{grown} bytes");
    }

    // A refused one ends: written 0 on every lane, nothing printed, nothing held.
    let refused = ports.remove(2);
    assert_eq!(finish(refused), vec![0; LANES as usize]);
    // A held one ends: served whole; its charge goes with it.
    let first = ports.remove(0);
    assert_eq!(finish(first), vec![LANE_BYTES as u64; LANES as usize]);
    eventually("one port's charge given back", || {
        server.context().held_bytes() == PORT_BYTES
    });
    // Room again: a new write is served whole.
    let again = unfinished_write(&client, b'z');
    assert_eq!(server.context().held_bytes(), 2 * PORT_BYTES);
    assert_eq!(finish(again), vec![LANE_BYTES as u64; LANES as usize]);
    // The other refused ones end as the first did; one held byte string is left unfinished.
    let unfinished = ports.remove(0);
    for port in ports {
        assert_eq!(finish(port), vec![0; LANES as usize]);
    }
    eventually("six refused", || server.stats().refused == 6);
    assert_eq!(written_out.0.load(Ordering::Relaxed), 2 * PORT_BYTES);

    // Its kernel gone and the mailbox detached, the budget is whole again.
    std::mem::forget(unfinished);
    drop(user);
    server.detach(mailbox.id).unwrap();
    eventually("every charge given back", || {
        server.context().held_bytes() == 0
    });
    let stats = server.stats();
    assert_eq!(
        (stats.refused, stats.errors, stats.panics),
        (6, 0, 0),
        "{stats}"
    );
}

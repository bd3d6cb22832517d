//! loom models of the port protocol: every interleaving (within the preemption bound) of small
//! exchanges over loom atomics. Run with
//! `RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=2 cargo test -p rpc-core --release --lib loom`.
//!
//! Headers and packets are shadowed under loom (`sync::DataWord`): each word's load is a read
//! of a `loom::cell::UnsafeCell` and its store a write, so a side touching a buffer before the
//! fences have ordered the other side's last use of it is a data race loom reports, although
//! the words themselves are relaxed atomics (which never race).

use std::vec::Vec;

use crate::protocol::port::Spin;
use crate::protocol::{Client, Generation, Layout, LockTable, MailboxMemory, Opcode, ServerEnd};
use crate::sync::{thread, Arc, AtomicU32, Ordering};

struct Fixture {
    memory: MailboxMemory,
    client_locks: LockTable,
    server_locks: LockTable,
}

fn fixture(ports: u32) -> Arc<Fixture> {
    let layout = Layout::new(Generation::V1, ports, 1).unwrap();
    Arc::new(Fixture {
        memory: MailboxMemory::new(layout),
        client_locks: LockTable::new(ports),
        server_locks: LockTable::new(ports),
    })
}

/// Serves one TEST_INCREMENT request; returns false if no port was pending.
fn serve_one(f: &Fixture) -> bool {
    let server = ServerEnd::new(f.memory.view(), f.server_locks.words()).unwrap();
    let Some(mut port) = server.open_next(0, &Spin) else {
        return false;
    };
    port.recv_and_send(|_, p| p.set_word(0, p.word(0) + 1))
        .unwrap();
    true
}

#[test]
fn exchange_with_recv_after_recv() {
    loom::model(|| {
        let f = fixture(1);
        let server = {
            let f = f.clone();
            thread::spawn(move || {
                let server = ServerEnd::new(f.memory.view(), f.server_locks.words()).unwrap();
                let mut port = loop {
                    if let Some(port) = server.open_next(0, &Spin) {
                        break port;
                    }
                    thread::yield_now();
                };
                let (mut a, mut b) = (0, 0);
                port.recv(|_, p| a = p.word(0)).unwrap();
                port.recv(|_, p| b = p.word(0)).unwrap(); // recv after recv: acknowledges first
                port.send(|_, p| p.set_word(0, a + b)).unwrap();
            })
        };
        let client = Client::new(f.memory.view(), f.client_locks.words())
            .unwrap()
            .with_wait(&Spin);
        let mut port = client.open(Opcode::user(1), 1).unwrap();
        port.send(|_, p| p.set_word(0, 20)).unwrap();
        port.send(|_, p| p.set_word(0, 22)).unwrap();
        let mut sum = 0;
        port.recv(|_, p| sum = p.word(0)).unwrap();
        assert_eq!(sum, 42);
        drop(port);
        server.join().unwrap();
        // The exchange left the port with the client.
        assert!(client.try_open_at(0, Opcode::NOOP, 1).unwrap().is_some());
    });
}

#[test]
fn two_clients_race_for_one_port() {
    loom::model(|| {
        let f = fixture(1);
        // Each client makes one attempt: take the lock, check ownership, send, close. Whatever
        // the interleaving, only one can win, even if the winner has already closed (its
        // request is still pending, so the buffer is the server's).
        let clients: Vec<_> = (1..=2u64)
            .map(|t| {
                let f = f.clone();
                thread::spawn(move || {
                    let client = Client::new(f.memory.view(), f.client_locks.words()).unwrap();
                    let mut port = client.try_open_at(0, Opcode::TEST_INCREMENT, 1).unwrap()?;
                    port.send(|_, p| p.set_word(0, 10 * t)).unwrap();
                    Some(t)
                })
            })
            .collect();
        let winners: Vec<u64> = clients
            .into_iter()
            .filter_map(|c| c.join().unwrap())
            .collect();
        assert_eq!(winners.len(), 1, "exactly one client gets the port");
        assert!(serve_one(&f));
        let client = Client::new(f.memory.view(), f.client_locks.words()).unwrap();
        let mut port = client
            .try_open_at(0, Opcode::NOOP, 1)
            .unwrap()
            .expect("answered");
        // The answer to the winner's request is what the port holds now.
        let mut got = 0;
        port.recv(|_, p| got = p.word(0)).unwrap();
        assert_eq!(got, 10 * winners[0] + 1);
    });
}

#[test]
fn two_server_threads_share_a_lock_table() {
    loom::model(|| {
        let f = fixture(1);
        let served = Arc::new(AtomicU32::new(0));
        let servers: Vec<_> = (0..2)
            .map(|_| {
                let (f, served) = (f.clone(), served.clone());
                thread::spawn(move || {
                    // Each server thread makes two attempts; the request must be served once.
                    for _ in 0..2 {
                        if serve_one(&f) {
                            served.fetch_add(1, Ordering::Relaxed);
                        }
                        thread::yield_now();
                    }
                })
            })
            .collect();
        let client = Client::new(f.memory.view(), f.client_locks.words())
            .unwrap()
            .with_wait(&Spin);
        let mut port = client.open(Opcode::TEST_INCREMENT, 1).unwrap();
        port.send(|_, p| p.set_word(0, 1)).unwrap();
        servers.into_iter().for_each(|s| s.join().unwrap());
        let answered = served.load(Ordering::Relaxed);
        assert!(answered <= 1, "served twice");
        if answered == 1 {
            let mut got = 0;
            port.recv(|_, p| got = p.word(0)).unwrap();
            assert_eq!(got, 2);
        }
    });
}

/// A request that needs no answer (FREE, a NOOP), then the next request on the same port. The
/// client learns that the port is its own again only from the server's flip when it closes the
/// port, not from a reply it waited for: `open_at`'s acquire fence is what orders the server's
/// reads of the first request's header and packet before the client's writes of the second's.
/// Without it those writes race with the reads (in the shadow cells), which loom reports.
#[test]
fn a_port_reopened_after_a_request_without_answer_is_ordered_after_the_servers_reads() {
    loom::model(|| {
        let f = fixture(1);
        let server = {
            let f = f.clone();
            thread::spawn(move || {
                let server = ServerEnd::new(f.memory.view(), f.server_locks.words()).unwrap();
                let mut port = loop {
                    if let Some(port) = server.open_next(0, &Spin) {
                        break port;
                    }
                    thread::yield_now();
                };
                let mut got = 0;
                port.recv(|_, p| got = p.word(0)).unwrap();
                assert_eq!(got, 1);
                // Dropping the port hands the buffer back (a flip after a release fence).
            })
        };
        let client = Client::new(f.memory.view(), f.client_locks.words())
            .unwrap()
            .with_wait(&Spin);
        client
            .open(Opcode::NOOP, 1)
            .unwrap()
            .send(|_, p| p.set_word(0, 1))
            .unwrap();
        // Waits (spinning) until the server closed the first request's port.
        client
            .open(Opcode::NOOP, 1)
            .unwrap()
            .send(|_, p| p.set_word(0, 2))
            .unwrap();
        server.join().unwrap();
    });
}

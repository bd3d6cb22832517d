//! loom models of the port protocol: every interleaving (within the preemption bound) of small
//! exchanges over loom atomics. Run with
//! `RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=2 cargo test -p gpu-rpc-core --release --lib loom`.
//!
//! Headers and packets are shadowed under loom (`sync::DataWord`): each word's load is a read
//! of a `loom::cell::UnsafeCell` and its store a write, so a side touching a buffer before the
//! fences have ordered the other side's last use of it is a data race loom reports, although
//! the words themselves are relaxed atomics (which never race).

use std::vec::Vec;

use crate::protocol::port::Spin;
use crate::protocol::port::{Batch, Port};
use crate::protocol::{
    Client, ClientPort, Generation, Layout, LockTable, MailboxMemory, Opcode, ProtocolError,
    ServerEnd, ServerPort, Wait,
};
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

/// A client of `memory` with `locks` as its lock bits, spinning (`Spin`) whenever it waits
/// (the models of `server/` use it too).
pub(crate) fn spinning_client<'a>(memory: &'a MailboxMemory, locks: &'a LockTable) -> Client<'a> {
    Client::new(memory.view(), locks.words())
        .unwrap()
        .with_wait(&Spin)
}

impl Fixture {
    fn client(&self) -> Client<'_> {
        spinning_client(&self.memory, &self.client_locks)
    }

    /// The server's end; every server thread of a model shares `server_locks`.
    fn server(&self) -> ServerEnd<'_> {
        ServerEnd::new(self.memory.view(), self.server_locks.words()).unwrap()
    }
}

/// A model thread running `serve` over the fixture's server end.
fn spawn_server(
    f: &Arc<Fixture>,
    serve: impl FnOnce(&ServerEnd<'_>) + Send + 'static,
) -> thread::JoinHandle<()> {
    let f = f.clone();
    thread::spawn(move || serve(&f.server()))
}

/// A model of two threads over a mailbox of `ports` ports: a server thread running `serve`,
/// and this thread running `client` (`Spin`ning when it waits); the server thread is joined
/// last.
fn model_client_and_server(ports: u32, serve: fn(&ServerEnd<'_>), client: fn(&Client<'_>)) {
    loom::model(move || {
        let f = fixture(ports);
        let server = spawn_server(&f, serve);
        client(&f.client());
        server.join().unwrap();
    });
}

/// Two server threads each running `serve` (which counts each request it answers in `served`)
/// on one port's fixture, while the client sends one TEST_INCREMENT of 1: the request is
/// answered at most once, and if answered the answer is 2. Returns the fixture for more checks.
fn two_servers_answer_one_request(serve: fn(&Fixture, &AtomicU32)) -> Arc<Fixture> {
    let f = fixture(1);
    let served = Arc::new(AtomicU32::new(0));
    let servers: Vec<_> = (0..2)
        .map(|_| {
            let (f, served) = (f.clone(), served.clone());
            thread::spawn(move || serve(&f, &served))
        })
        .collect();
    let client = f.client();
    let mut port = client.open(Opcode::TEST_INCREMENT, 1).unwrap();
    port.send(|_, p| p.set_word(0, 1)).unwrap();
    servers.into_iter().for_each(|s| s.join().unwrap());
    let answered = served.load(Ordering::Relaxed);
    assert!(answered <= 1, "served twice");
    if answered == 1 {
        assert_eq!(recv_word(&mut port), 2);
    }
    drop(port);
    f
}

/// Serves one TEST_INCREMENT request with `wait`; returns false if no port was pending.
fn serve_one(f: &Fixture, wait: &dyn Wait) -> bool {
    let server = f.server();
    let Some(mut port) = server.open_next(0, wait) else {
        return false;
    };
    answer_increment(&mut port);
    true
}

/// The server's side of TEST_INCREMENT: word 0 of the request, plus one.
fn answer_increment(port: &mut ServerPort<'_>) {
    port.recv_and_send(|_, p| p.set_word(0, p.word(0) + 1))
        .unwrap();
}

/// The server port pending first, waiting (yielding) until a client's request arrives.
fn open_when_pending<'a>(server: &'a ServerEnd<'a>, wait: &'a dyn Wait) -> ServerPort<'a> {
    loop {
        if let Some(port) = server.open_next(0, wait) {
            break port;
        }
        thread::yield_now();
    }
}

/// One TEST_INCREMENT request of `x` on port 0; returns the answer (the client reads the reply
/// packet after the server's flip, in the shadow cells of `sync::DataWord`).
pub(crate) fn increment(client: &Client<'_>, x: u64) -> u64 {
    let mut port = client.open(Opcode::TEST_INCREMENT, 1).unwrap();
    round_trip(&mut port, x)
}

/// Sends `x` in word 0 on `port` and returns word 0 of the reply (the models of `server/` use
/// it too).
pub(crate) fn round_trip(port: &mut ClientPort<'_>, x: u64) -> u64 {
    let mut got = 0;
    port.send_and_recv(|_, p| p.set_word(0, x), |_, p| got = p.word(0))
        .unwrap();
    got
}

/// A request of `x` in word 0 that needs no answer (NOOP).
fn send_noop(client: &Client<'_>, x: u64) {
    client
        .open(Opcode::NOOP, 1)
        .unwrap()
        .send(|_, p| p.set_word(0, x))
        .unwrap();
}

/// Receives one packet on `port` (either side's) and returns its word 0.
fn recv_word<const SERVER: bool>(port: &mut Port<'_, SERVER>) -> u64 {
    let mut got = 0;
    port.recv(|_, p| got = p.word(0)).unwrap();
    got
}

// The batch of deferred flips (`port::Batch`) under loom: the server thread below runs each
// exchange with a wait that defers its flips and unlocks into a real `Batch` (`Batching`), as
// the executor's wait does in a pass with two or more exchanges in flight, and the client
// checks every packet it reads after each flip. Every `a_batch_*` model fails (a data race on
// a reply or request packet's shadow cell) if the release fence at the top of `Batch::publish`
// is removed; the order of a batch (flips, then unlocks) is held by
// `a_batch_publishes_its_flips_before_its_unlocks`.

/// A blocking wait that defers a server port's flips and unlocks into a [`Batch`] (spinning
/// like `Spin`, and publishing before each pause, as a batching wait must), published when it
/// is dropped or told to. The lock is for `Sync` only: one model thread uses each.
struct Batching(std::sync::Mutex<Batch>);

impl Batching {
    fn new() -> Self {
        Batching(std::sync::Mutex::new(Batch::EMPTY))
    }
}

impl Wait for Batching {
    fn pause(&self, _port: u32, _attempt: u32) -> Result<(), ProtocolError> {
        self.publish();
        crate::sync::spin_hint();
        Ok(())
    }
    fn flip(&self, word: &AtomicU32, value: u32) {
        // SAFETY: every model's mailbox and lock tables (its `Fixture`) outlive its waits, and
        // a wait's batch is published when it is dropped.
        unsafe { self.0.lock().unwrap().flip(word, value) };
    }
    fn unlock(&self, locks: &[AtomicU32], index: u32) {
        // SAFETY: as in `flip`.
        unsafe { self.0.lock().unwrap().unlock(locks, index) };
    }
    fn publish(&self) {
        self.0.lock().unwrap().publish();
    }
}

impl Drop for Batching {
    /// The end of the batch (a dispatcher's pass): what waits goes out.
    fn drop(&mut self) {
        self.publish();
    }
}

/// A batch published when it ends (the end of a dispatcher's pass): the reply's flip and the
/// port's unlock wait in the batch until it drops. Catches: no release fence in
/// `Batch::publish` (the client's read of the reply races with the server's write of it).
#[test]
fn a_batch_published_at_the_end_of_a_pass_orders_the_reply_before_its_flip() {
    model_client_and_server(
        1,
        |server| {
            let batch = Batching::new();
            let mut port = open_when_pending(server, &batch);
            answer_increment(&mut port);
            drop(port);
            drop(batch);
        },
        |client| assert_eq!(increment(client, 41), 42),
    );
}

/// A batch published before its thread waits for a client (the wait's pause), and at a
/// checkpoint's explicit publish (what the sweep does before it yields): the second round's
/// request comes only after the first round's reply is seen, and port 1's only after port 0's
/// exchange ended, so a batch holding either flip back would never let the model end.
/// Catches: no release fence in `Batch::publish`; no publish before the pause (loom reports
/// the model never ending).
#[test]
fn a_batch_published_at_a_wait_and_a_checkpoint_orders_each_reply_before_its_flip() {
    model_client_and_server(
        2,
        |server| {
            let batch = Batching::new();
            let mut port = open_when_pending(server, &batch);
            for _ in 0..2 {
                // The second `recv` waits for the client, which waits for our first flip.
                answer_increment(&mut port);
            }
            drop(port);
            // The checkpoint: port 1's client waits for port 0's close.
            batch.publish();
            let mut port = open_when_pending(server, &batch);
            answer_increment(&mut port);
        },
        |client| {
            let mut port = client
                .try_open_at(0, Opcode::TEST_INCREMENT, 1)
                .unwrap()
                .unwrap();
            for x in [10, 20] {
                assert_eq!(round_trip(&mut port, x), x + 1);
            }
            drop(port);
            let mut port = client
                .try_open_at(1, Opcode::TEST_INCREMENT, 1)
                .unwrap()
                .unwrap();
            assert_eq!(round_trip(&mut port, 30), 31);
            drop(port);
        },
    );
}

/// A batch holding `ServerEnd::close`'s flip (a request without answer, closed by the
/// dispatcher once its handler is done): the client's next request on the port writes the
/// packet the server read. Catches: no release fence in `Batch::publish` (the client's write
/// races with the server's read of the first request).
#[test]
fn a_batch_published_after_a_close_orders_the_servers_reads_before_the_next_request() {
    model_client_and_server(
        1,
        |server| {
            let batch = Batching::new();
            let mut port = open_when_pending(server, &batch);
            assert_eq!(recv_word(&mut port), 1);
            let index = port.index();
            let owned = port.quarantine();
            server.close(index, owned, &batch);
            drop(batch);
        },
        |client| {
            for x in 1..=2 {
                // The second `open` waits (spinning) until the batch is published.
                send_noop(client, x);
            }
        },
    );
}

/// Two server threads on one lock table, each serving inside a batch: a batch must store its
/// flips before it clears its lock bits, or the other thread could lock the port while our
/// word still says pending and serve the request again; and a thread that locked the port it
/// saw pending but found it served by the other (`ServerEnd::try_open`) must unlock it, or the
/// port is never served again. Catches: the unlocks published before the flips in
/// `Batch::publish` (served twice); no `unlock` in `try_take`'s not-pending branch (a lock
/// left behind).
#[test]
fn a_batch_publishes_its_flips_before_its_unlocks() {
    loom::model(|| {
        let f = two_servers_answer_one_request(|f, served| {
            let batch = Batching::new();
            if serve_one(f, &batch) {
                served.fetch_add(1, Ordering::Relaxed);
            }
            drop(batch);
            if serve_one(f, &Spin) {
                served.fetch_add(1, Ordering::Relaxed);
            }
        });
        let locks = f.server_locks.words();
        assert!(
            locks.iter().all(|w| w.load(Ordering::Relaxed) == 0),
            "a server port's lock left behind"
        );
    });
}

#[test]
fn exchange_with_recv_after_recv() {
    loom::model(|| {
        let f = fixture(1);
        let server = spawn_server(&f, |server| {
            let mut port = open_when_pending(server, &Spin);
            let a = recv_word(&mut port);
            let b = recv_word(&mut port); // recv after recv: acknowledges first
            port.send(|_, p| p.set_word(0, a + b)).unwrap();
        });
        let client = f.client();
        let mut port = client.open(Opcode::user(1), 1).unwrap();
        port.send(|_, p| p.set_word(0, 20)).unwrap();
        port.send(|_, p| p.set_word(0, 22)).unwrap();
        assert_eq!(recv_word(&mut port), 42);
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
                    let client = f.client();
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
        assert!(serve_one(&f, &Spin));
        let client = f.client();
        let mut port = client
            .try_open_at(0, Opcode::NOOP, 1)
            .unwrap()
            .expect("answered");
        // The answer to the winner's request is what the port holds now.
        assert_eq!(recv_word(&mut port), 10 * winners[0] + 1);
    });
}

#[test]
fn two_server_threads_share_a_lock_table() {
    loom::model(|| {
        // Each server thread makes two attempts; the request must be served once.
        two_servers_answer_one_request(|f, served| {
            for _ in 0..2 {
                if serve_one(f, &Spin) {
                    served.fetch_add(1, Ordering::Relaxed);
                }
                thread::yield_now();
            }
        });
    });
}

/// A request that needs no answer (FREE, a NOOP), then the next request on the same port. The
/// client learns that the port is its own again only from the server's flip when it closes the
/// port, not from a reply it waited for: `open_at`'s acquire fence is what orders the server's
/// reads of the first request's header and packet before the client's writes of the second's.
/// Without it those writes race with the reads (in the shadow cells), which loom reports.
#[test]
fn a_port_reopened_after_a_request_without_answer_is_ordered_after_the_servers_reads() {
    model_client_and_server(
        1,
        |server| {
            let mut port = open_when_pending(server, &Spin);
            assert_eq!(recv_word(&mut port), 1);
            // Dropping the port hands the buffer back (a flip after a release fence).
        },
        |client| {
            send_noop(client, 1);
            // Waits (spinning) until the server closed the first request's port.
            send_noop(client, 2);
        },
    );
}

//! loom models of the resumable exchanges (see `dispatch.rs`): a packet handler's request
//! counted before its reply, a port waiting for its client while another is served, an
//! exchange abandoned once its kernel is gone (its port then serving a new kernel), a drained
//! port (PROTOCOL section 11: a slow client's late packet racing the drain, a script refused
//! midway) answering the rest of its client's script and never running a late packet as a
//! request, and `detach` against a pass (it returns only once no pass holds the mailbox). The hand-off to the I/O threads is modelled on the pool alone in `loom_io_pool`
//! (a model with the passes too did not finish in loom within minutes);
//! `workloads/tests/interleaving.rs` covers the two together with real threads.
//!
//! The passes run on a model thread of their own, as the worker runs them but without its
//! sleeping and back-off (`loom_thread` models those): the state here is the per-port
//! one of `dispatch`.

use std::boxed::Box;
use std::time::Duration;

use crate::protocol::loom::{round_trip, spinning_client};
use crate::protocol::{Client, ClientPort, Generation, Layout, LockTable, MailboxMemory};
use crate::server::dispatch::PassCache;
use crate::server::exec::Fate;
use crate::server::pass_tests::{open_when_free, register_two_packet_sum};
use crate::server::AttachOptions;
use crate::server::Inner;
use crate::sync::{thread, Arc, AtomicBool, AtomicUsize, Ordering};
use crate::{MailboxId, Opcode, ProtocolError, RpcServer, ServerError};

struct Fixture {
    server: RpcServer,
    memory: Arc<MailboxMemory>,
    id: MailboxId,
    locks: LockTable,
}

/// A server with one mailbox of `ports` ports and `register_two_packet_sum`'s script for
/// `user(1)`.
fn fixture(ports: u32) -> Arc<Fixture> {
    let server = RpcServer::new(Default::default());
    register_two_packet_sum(&server);
    let memory = Arc::new(MailboxMemory::new(
        Layout::new(Generation::V1, ports, 1).unwrap(),
    ));
    let id = server.attach(Box::new(memory.clone()), AttachOptions::default());
    Arc::new(Fixture {
        server,
        memory,
        id,
        locks: LockTable::new(ports),
    })
}

impl Fixture {
    fn client<'a>(&'a self, locks: &'a LockTable) -> Client<'a> {
        spinning_client(&self.memory, locks)
    }
}

/// A model thread serving passes until it is stopped; the exchanges still in flight then end.
struct Passes {
    done: Arc<AtomicBool>,
    thread: thread::JoinHandle<()>,
}

impl Passes {
    fn start(f: &Fixture) -> Passes {
        let done = Arc::new(AtomicBool::new(false));
        let (inner, stop) = (f.server.inner.clone(), done.clone());
        let thread = thread::spawn(move || {
            let mut cache = PassCache::new();
            while !stop.load(Ordering::Acquire) {
                Inner::serve_pass(&inner, &mut cache);
                thread::yield_now();
            }
            cache.clear(&inner.context, Fate::Drain, "model over");
        });
        Passes { done, thread }
    }

    /// Tells the thread to stop after its pass and waits for it.
    fn stop(self) {
        self.done.store(true, Ordering::Release);
        self.thread.join().unwrap();
    }
}

/// `loom::model` with room for the passes that poll an exchange while it waits (a pass is a
/// few dozen atomic operations; loom's default allows 1000 per execution).
fn model(body: impl Fn() + Sync + Send + 'static) {
    let mut model = loom::model::Builder::new();
    model.max_branches = 10_000;
    model.check(body);
}

/// TEST_INCREMENT on `index`, waiting (yielding) until the port is free.
fn increment(client: &Client<'_>, index: u32, x: u64) -> u64 {
    let mut port = open_when_free(client, index, Opcode::TEST_INCREMENT);
    round_trip(&mut port, x)
}

/// Opens `opcode` on port 0, which must be free, and sends the first packet of a two-packet
/// sum, `a`.
fn first_of_two<'a>(client: &'a Client<'a>, opcode: Opcode, a: u64) -> ClientPort<'a> {
    let mut port = client.try_open_at(0, opcode, 1).unwrap().unwrap();
    port.send(|_, p| p.set_word(0, a)).unwrap();
    port
}

/// A packet handler's request is counted before its reply goes: the client that has its
/// answer finds it in the statistics, and the mailbox drained (`wait_drained` with no time
/// left), at once. Counted after the hand-over (as a script's request still is), the client
/// may read its answer before the count: loom finds that order.
#[test]
fn a_packet_request_is_counted_before_its_reply() {
    model(|| {
        let f = fixture(1);
        let passes = Passes::start(&f);
        let client = f.client(&f.locks);
        assert_eq!(increment(&client, 0, 41), 42);
        assert_eq!(f.server.stats().served_of(Opcode::TEST_INCREMENT), 1);
        assert!(f.server.wait_drained(f.id, Duration::ZERO));
        passes.stop();
    });
}

#[test]
fn a_suspended_exchange_does_not_hold_up_another_port() {
    model(|| {
        let f = fixture(2);
        let _user = f.server.user();
        let passes = Passes::start(&f);
        let client = f.client(&f.locks);
        let mut slow = first_of_two(&client, Opcode::user(1), 40);
        // Port 0's exchange now waits for its second packet, which comes only after port 1
        // was served: a server that waited for it would never serve port 1 (loom reports it).
        assert_eq!(increment(&client, 1, 6), 7);
        let sum = round_trip(&mut slow, 2);
        assert_eq!(sum, 42);
        passes.stop();
    });
}

/// A kernel arriving (taking its user guard) while the passes run, its exchange then waiting
/// for its second packet: the exchange is kept, as its kernel lives. The pass reads the users'
/// marks after the port's acquire fence (`serve_pass`); read before, a mark older than the
/// kernel's ticket makes the live kernel look gone. Catches: `Marks::now` read before
/// `try_take` (the exchange is drained midway: the client reads the failure word, not 42).
#[test]
fn a_kernel_arriving_during_a_pass_keeps_its_exchange() {
    model(|| {
        let f = fixture(1);
        let passes = Passes::start(&f);
        let kernel = f.server.user();
        let client = f.client(&f.locks);
        let mut port = first_of_two(&client, Opcode::user(1), 40);
        // The second packet only after a whole pass began since: the exchange has then
        // suspended, and a pass has weighed whether its kernel is gone.
        let since = f.server.stats().passes;
        while f.server.stats().passes < since + 2 {
            thread::yield_now();
        }
        let sum = round_trip(&mut port, 2);
        assert_eq!(sum, 42, "the live kernel's exchange was given up");
        assert_eq!(f.server.stats().abandoned, 0);
        drop(port);
        drop(kernel);
        passes.stop();
    });
}

#[test]
fn an_exchange_whose_kernel_is_gone_is_abandoned_and_its_port_serves_again() {
    model(|| {
        let f = fixture(1);
        let passes = Passes::start(&f);
        {
            let _kernel = f.server.user();
            let client = f.client(&f.locks);
            let port = first_of_two(&client, Opcode::user(1), 40);
            // The kernel dies mid-exchange: its port is never closed (its lock bit stays set).
            core::mem::forget(port);
        }
        // Once the server has ended the dead exchange (not before: until then the port looks
        // free from outside, and a new client's packet would be read as the old exchange's
        // next one; on a GPU the dead warp's lock bit stays set, so no new kernel comes), a
        // new kernel with its own lock bits gets the port, drained. It learns of the end from
        // the server (rpc-serve's log line), which orders the drain's mark before its open:
        // here the passes stop and are joined, and new ones serve it.
        while f
            .server
            .inner
            .context
            .stats
            .abandoned
            .load(Ordering::Relaxed)
            == 0
        {
            thread::yield_now();
        }
        passes.stop();
        let passes = Passes::start(&f);
        let _kernel = f.server.user();
        let fresh = LockTable::new(1);
        assert_eq!(increment(&f.client(&fresh), 0, 41), 42);
        passes.stop();
        assert_eq!(f.server.stats().abandoned, 1);
    });
}

/// Registers `opcode`: two packets in, their sum back, counting its runs in `runs`; a first
/// packet above `bound` ends it there with an error (as a byte string claimed above its bound
/// does).
fn register_counted_sum(f: &Fixture, opcode: Opcode, bound: u64, runs: &Arc<AtomicUsize>) {
    let runs = runs.clone();
    f.server.register(opcode, move |mut req| {
        // RMW: one run more (read after the model's threads are joined).
        runs.fetch_add(1, Ordering::Relaxed);
        async move {
            let (mut a, mut b) = (0, 0);
            req.recv(|_, p| a = p.word(0)).await?;
            if a > bound {
                let (lane, len) = (0, a);
                return Err(ServerError::Protocol(ProtocolError::TooLong {
                    lane,
                    len,
                    bound,
                }));
            }
            req.recv(|_, p| b = p.word(0)).await?;
            req.send(|_, p| p.set_word(0, a + b)).await
        }
    });
}

/// A slow client: its kernel's user guard goes while it is still inside its exchange (as a
/// client timeout takes a slow client for gone), so the server may drain the port before the
/// client's second packet comes. Whichever comes first, the script runs once: the client reads
/// the sum (its packet came in time) or the failure word 0 (it came late: answered, not run as
/// a new request), and its next request on the port is served. A drain without the mark (the
/// old reset) runs the late packet as a new request: two runs, and the client reads its own
/// packet back.
#[test]
fn a_late_packet_of_a_drained_exchange_is_answered_never_run() {
    model(|| {
        let f = fixture(1);
        let runs = Arc::new(AtomicUsize::new(0));
        register_counted_sum(&f, Opcode::user(2), u64::MAX, &runs);
        let passes = Passes::start(&f);
        let kernel = f.server.user();
        let client = f.client(&f.locks);
        let mut port = first_of_two(&client, Opcode::user(2), 40);
        drop(kernel);
        let sum = round_trip(&mut port, 2);
        drop(port);
        assert!(sum == 42 || sum == 0, "read {sum}");
        let _kernel = f.server.user();
        assert_eq!(increment(&client, 0, 41), 42);
        passes.stop();
        assert_eq!(runs.load(Ordering::Relaxed), 1);
    });
}

/// A script its handler ends midway with an error (a claim above its bound) while its client
/// goes on: the port is drained at once, the client's next packet is answered without being
/// run, its reply is the failure word 0, and the port serves the same client's next request
/// while its kernel still runs. (Quarantined instead, the client waited for good; drained
/// without the mark, its next packet ran as a new request, and it read that packet back.)
#[test]
fn a_port_drained_midway_answers_the_rest_of_its_script_and_serves_again() {
    model(|| {
        let f = fixture(1);
        let runs = Arc::new(AtomicUsize::new(0));
        register_counted_sum(&f, Opcode::user(3), 1, &runs);
        let _kernel = f.server.user();
        let passes = Passes::start(&f);
        let client = f.client(&f.locks);
        let mut port = first_of_two(&client, Opcode::user(3), 5);
        let reply = round_trip(&mut port, 7);
        drop(port);
        assert_eq!(reply, 0);
        assert_eq!(increment(&client, 0, 41), 42);
        passes.stop();
        assert_eq!(runs.load(Ordering::Relaxed), 1);
        assert_eq!(f.server.stats().errors, 1);
    });
}

/// `detach` against a pass: it returns only once no pass holds the mailbox (its copy of the
/// list, an exchange suspended on it), so the memory is the caller's alone afterwards. Here the
/// detached mailbox has an exchange waiting for its client, which never answers: the pass
/// abandons it because the mailbox is marked detached, leaving its memory untouched.
#[test]
fn detach_returns_once_no_pass_holds_the_mailbox() {
    model(|| {
        let f = fixture(1);
        let _user = f.server.user();
        let passes = Passes::start(&f);
        let client = f.client(&f.locks);
        let port = first_of_two(&client, Opcode::user(1), 40);
        f.server.detach(f.id).unwrap();
        assert_eq!(
            Arc::strong_count(&f.memory),
            1,
            "detach returned while a pass still held the mailbox"
        );
        passes.stop();
        drop(port);
    });
}

//! Faults around a running server: client threads killed at every step of multi-packet
//! exchanges, handlers that panic at every step, a forced shutdown with requests in flight
//! followed by a restart, and attach/detach while exchanges are in flight. In each case nothing
//! hangs (every wait is bounded by a deadline that fails the test), the server keeps serving,
//! and a well-formed request afterwards is answered correctly.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize};
use std::sync::Arc;
use std::time::{Duration, Instant};

use plugin_host::kernel::{encode_printf, PrintfCall};
use plugin_host::Arg;
use rpc_core::protocol::{lanes, Backoff, Deadline};
use rpc_core::protocol::{Client, ClientPort, Generation, Layout, LockTable, MailboxMemory};
use rpc_core::AttachOptions;
use rpc_core::{
    ExitPolicy, MailboxId, Opcode, RpcServer, ServerConfig, ServicesConfig, ShutdownPolicy,
    StatsSnapshot,
};
use std::sync::atomic::Ordering;
use workloads::claims::increment_lanes;

const LANES: u32 = 32;
/// Lanes 0, 1 and 3: a partial warp, so inactive lanes are exercised too.
const MASK: u64 = 0b1011;
const PORTS: u32 = 4;

/// Waits (backing off) until `condition` holds; fails the test after 30 s (a liveness bound,
/// generous for sanitizer builds on a loaded machine).
fn eventually(what: &str, condition: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut attempt = 0;
    while !condition() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        Backoff::step(attempt);
        attempt += 1;
    }
}

/// A client's wait that gives up once `stop` is set, or at its liveness bound.
struct UntilStopped<'a> {
    stop: &'a AtomicBool,
    bound: Deadline,
}

impl rpc_core::protocol::Wait for UntilStopped<'_> {
    fn pause(&self, port: u32, attempt: u32) -> Result<(), rpc_core::ProtocolError> {
        // Acquire: pairs with the Release that sets it (a plain flag; nothing else is ordered).
        if self.stop.load(Ordering::Acquire) {
            return Err(rpc_core::ProtocolError::Abandoned {
                port,
                reason: "the test stopped waiting",
            });
        }
        self.bound.pause(port, attempt)
    }
}

fn server(name: &str) -> RpcServer {
    let _ = env_logger::builder().is_test(true).try_init();
    let server = RpcServer::new(ServerConfig {
        name: name.into(),
        limits: rpc_core::Limits {
            string_bytes: 1 << 20,
            ..rpc_core::Limits::default()
        },
        services: ServicesConfig {
            exit: ExitPolicy::Record,
            ..ServicesConfig::default()
        },
        ..ServerConfig::default()
    });
    server
        .context()
        .services()
        .set_stdout(Box::new(std::io::sink()));
    server
}

fn attach(server: &RpcServer) -> (Arc<MailboxMemory>, MailboxId) {
    let layout = Layout::new(Generation::V1, PORTS, LANES).unwrap();
    let memory = Arc::new(MailboxMemory::new(layout));
    let id = server.attach(Box::new(memory.clone()), AttachOptions::default());
    (memory, id)
}

/// Steady traffic as mailbox `id`'s kernel until `stop`: increments on `MASK`'s lanes, each
/// answer checked, `each` called after every one.
fn increment_until(
    server: &RpcServer,
    memory: &MailboxMemory,
    id: MailboxId,
    stop: &AtomicBool,
    mut each: impl FnMut(),
) {
    as_kernel(server, memory, id, |client| {
        let mut x = 0u64;
        while !stop.load(Ordering::Relaxed) {
            let mut port = client.open(Opcode::TEST_INCREMENT, MASK).unwrap();
            let got = increment_lanes(&mut port, x);
            assert!(lanes(MASK).all(|l| got[l as usize] == x + u64::from(l) + 1));
            x += 100;
            each();
        }
    })
}

/// Runs `f` with a client of `memory` as a kernel of mailbox `id` (its user guard held), with
/// lock bits of its own and a 30 s hang guard.
fn as_kernel<R>(
    server: &RpcServer,
    memory: &MailboxMemory,
    id: MailboxId,
    f: impl FnOnce(&Client<'_>) -> R,
) -> R {
    let _kernel = server.user_for(id);
    let locks = LockTable::new(PORTS);
    let wait = Deadline::after(Duration::from_secs(30));
    let client = Client::new(memory.view(), locks.words())
        .unwrap()
        .with_wait(&wait);
    f(&client)
}

/// Requests whose dispatch ended, however it ended.
fn ended(stats: &StatsSnapshot) -> u64 {
    stats.total_served()
        + stats.errors
        + stats.abandoned
        + stats.unknown
        + stats.bad_headers
        + stats.panics
}

/// The payload a client thread unwinds with when the test kills it (via `resume_unwind`, so no
/// panic message is printed).
struct Killed;

/// Kills the calling thread at step `at` of a script (steps count sends and receives).
struct Killer {
    at: usize,
    step: Cell<usize>,
}

impl Killer {
    fn at(at: usize) -> Self {
        Killer {
            at,
            step: Cell::new(0),
        }
    }
    fn tick(&self) {
        let step = self.step.get();
        if step == self.at {
            std::panic::resume_unwind(Box::new(Killed));
        }
        self.step.set(step + 1);
    }
}

/// `send_n`, packet by packet, ticking before each packet.
fn send_strings(port: &mut ClientPort<'_>, data: &[Vec<u8>], k: &Killer) -> rpc_core::Result<()> {
    let lane = |l: u32| data.get(l as usize).map_or(&[][..], Vec::as_slice);
    k.tick();
    port.send(|l, p| {
        let d = lane(l);
        p.set_word(0, d.len() as u64);
        p.write_bytes(8, &d[..d.len().min(56)]);
    })?;
    let longest = lanes(port.mask()).map(|l| lane(l).len()).max().unwrap_or(0);
    let mut offset = 56;
    while offset < longest {
        k.tick();
        port.send(|l, p| {
            let d = lane(l);
            if offset < d.len() {
                p.write_bytes(0, &d[offset..d.len().min(offset + 64)]);
            }
        })?;
        offset += 64;
    }
    Ok(())
}

/// `recv_n`, packet by packet, ticking before each packet.
fn recv_strings(port: &mut ClientPort<'_>, k: &Killer) -> rpc_core::Result<Vec<Vec<u8>>> {
    let mut out: Vec<Vec<u8>> = vec![Vec::new(); 64];
    let mut lengths = [0usize; 64];
    k.tick();
    port.recv(|l, p| {
        let n = p.word(0).min(1 << 20) as usize;
        lengths[l as usize] = n;
        out[l as usize] = vec![0; n];
        p.read_bytes(8, &mut out[l as usize][..n.min(56)]);
    })?;
    let longest = lengths.iter().copied().max().unwrap_or(0);
    let mut offset = 56;
    while offset < longest {
        k.tick();
        port.recv(|l, p| {
            let n = lengths[l as usize];
            if offset < n {
                let end = n.min(offset + 64);
                p.read_bytes(0, &mut out[l as usize][offset..end]);
            }
        })?;
        offset += 64;
    }
    Ok(out)
}

fn stream_data() -> Vec<Vec<u8>> {
    (0..64u32)
        .map(|l| {
            let n = [10, 130, 0, 200][l as usize % 4];
            (0..n).map(|i| (i as u32 * 31 + l) as u8).collect()
        })
        .collect()
}

/// TEST_STREAM: send_n, recv_n; checks the echo when it gets that far.
fn test_stream(client: &Client<'_>, k: &Killer) -> rpc_core::Result<()> {
    let mut port = client.open(Opcode::TEST_STREAM, MASK)?;
    let data = stream_data();
    send_strings(&mut port, &data, k)?;
    let back = recv_strings(&mut port, k)?;
    for l in lanes(MASK) {
        assert_eq!(back[l as usize], data[l as usize], "lane {l}");
    }
    k.tick();
    Ok(())
}

/// TEST_INTERFACE, the client's mirror of the server's script: every hop adds one.
fn test_interface(client: &Client<'_>, k: &Killer, end_with_recv: bool) -> rpc_core::Result<()> {
    let mut port = client.open(Opcode::TEST_INTERFACE, MASK)?;
    let mut cnt = [0u64; 64];
    k.tick();
    port.send(|_, p| p.set_word(0, end_with_recv.into()))?;
    k.tick();
    port.send(|l, p| p.set_word(0, 100 + u64::from(l)))?;
    let ops = [false, true, false, true, true, false, false, end_with_recv];
    for send in ops {
        k.tick();
        if send {
            port.send(|l, p| p.set_word(0, cnt[l as usize] + 1))?;
        } else {
            port.recv(|l, p| cnt[l as usize] = p.word(0))?;
        }
    }
    if end_with_recv {
        // The last hop was ours: the value we sent.
        for l in lanes(MASK) {
            cnt[l as usize] += 1;
        }
    }
    // Seven hops after the start value, each adding one (the two sends in a row repeat a value).
    for l in lanes(MASK) {
        assert_eq!(cnt[l as usize], 107 + u64::from(l), "lane {l}");
    }
    k.tick();
    Ok(())
}

/// PRINTF_TO_STDOUT with `%s` strings long enough to take several packets.
fn printf(client: &Client<'_>, k: &Killer) -> rpc_core::Result<()> {
    let long = "x".repeat(150);
    let calls: Vec<PrintfCall> = (0..64u32)
        .map(|l| {
            encode_printf(
                "%s|%d|%s\n",
                &[
                    Arg::Str(Some("lane")),
                    Arg::Int(l.into()),
                    Arg::Str(Some(&long)),
                ],
                false,
            )
        })
        .collect();
    let mut port = client.open(Opcode::PRINTF_TO_STDOUT, MASK)?;
    let formats: Vec<Vec<u8>> = calls.iter().map(|c| c.format.clone()).collect();
    send_strings(&mut port, &formats, k)?;
    let mut sizes = [0usize; 64];
    k.tick();
    port.recv(|l, p| sizes[l as usize] = p.word(0) as usize)?;
    let args: Vec<Vec<u8>> = (0..64)
        .map(|l| {
            let mut a = calls[l].args.clone();
            a.resize(sizes[l], 0);
            a
        })
        .collect();
    send_strings(&mut port, &args, k)?;
    loop {
        let mut pointers = [0u64; 64];
        let mut results = [0u64; 64];
        k.tick();
        port.recv(|l, p| {
            results[l as usize] = p.word(0);
            pointers[l as usize] = p.word(1);
        })?;
        if lanes(MASK).all(|l| pointers[l as usize] == 0) {
            for l in lanes(MASK) {
                let expected = format!("lane|{l}|{long}\n").len() as u64;
                assert_eq!(results[l as usize], expected, "lane {l}");
            }
            break;
        }
        let strings: Vec<Vec<u8>> = (0..64)
            .map(|l| {
                calls[l]
                    .strings
                    .get(&pointers[l])
                    .cloned()
                    .unwrap_or_default()
            })
            .collect();
        send_strings(&mut port, &strings, k)?;
    }
    k.tick();
    Ok(())
}

type Script = fn(&Client<'_>, &Killer) -> rpc_core::Result<()>;

/// Runs `script` once to count its steps, then kills a client thread at each step in turn.
/// After each kill: the exchange ends on the server (abandoned, or served if the client had
/// nothing left to send), the server serves the killed thread's lock table on another port,
/// and the dead port serves a fresh client (a new kernel with its own lock bits) correctly.
fn kill_at_every_step(name: &str, script: Script) {
    let server = server(name);
    let (memory, id) = attach(&server);
    let _ = server.start().unwrap();
    let steps = {
        let before = ended(&server.stats());
        as_kernel(&server, &memory, id, |client| {
            let killer = Killer::at(usize::MAX);
            script(client, &killer).unwrap();
            // A script may end with the client's send: wait for the server to finish reading
            // it.
            eventually("the full script ended", || {
                ended(&server.stats()) == before + 1
            });
            killer.step.get()
        })
    };
    assert!(steps >= 4, "{name}: {steps} steps");
    // Requests ended so far, counted by the test: the server counts a request just after its
    // last flip, so a count read right after a reply may not include it yet.
    let mut expected = ended(&server.stats());
    for at in 0..=steps {
        let locks = LockTable::new(PORTS);
        let port = AtomicU32::new(u32::MAX);
        let outcome = std::thread::scope(|s| {
            s.spawn(|| {
                let _kernel = server.user_for(id);
                let wait = Deadline::after(Duration::from_secs(30));
                let client = Client::new(memory.view(), locks.words())
                    .unwrap()
                    .with_wait(&wait);
                // Remember which port the victim takes: the first free one.
                let free = (0..PORTS)
                    .find(|&i| {
                        client
                            .try_open_at(i, Opcode::NOOP, 1)
                            .unwrap()
                            .map(drop)
                            .is_some()
                    })
                    .unwrap();
                port.store(free, Ordering::Relaxed);
                script(&client, &Killer::at(at))
            })
            .join()
        });
        match outcome {
            Ok(result) => {
                assert!(at >= steps, "{name}: not killed at step {at}");
                result.unwrap();
            }
            Err(payload) => {
                assert!(payload.is::<Killed>(), "{name}: step {at}: a real panic");
                assert!(at < steps);
            }
        }
        let dead = port.load(Ordering::Relaxed);
        let sent = at > 0;
        expected += u64::from(sent);
        eventually(&format!("{name}: step {at}: the exchange ended"), || {
            ended(&server.stats()) == expected
        });
        let _user = server.user_for(id);
        let wait = Deadline::after(Duration::from_secs(30));
        // The killed thread's lock table: its dead port stays locked, another one serves.
        let client = Client::new(memory.view(), locks.words())
            .unwrap()
            .with_wait(&wait);
        let mut other = client.open(Opcode::TEST_INCREMENT, MASK).unwrap();
        if at < steps {
            assert_ne!(
                other.index(),
                dead,
                "{name}: step {at}: the dead port stays locked"
            );
        }
        let mut got = [0u64; 64];
        other
            .send_and_recv(
                |l, p| p.set_word(0, l.into()),
                |l, p| got[l as usize] = p.word(0),
            )
            .unwrap();
        drop(other);
        assert!(lanes(MASK).all(|l| got[l as usize] == u64::from(l) + 1));
        // A fresh client on the dead port: the server has let go of it.
        let fresh = LockTable::new(PORTS);
        let client = Client::new(memory.view(), fresh.words())
            .unwrap()
            .with_wait(&wait);
        let mut port = client
            .try_open_at(dead, Opcode::TEST_STREAM, MASK)
            .unwrap()
            .expect("the dead port is free again");
        let data = stream_data();
        let slices: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
        port.send_n(&slices).unwrap();
        let back = port.recv_n(1 << 20).unwrap();
        drop(port);
        for l in lanes(MASK) {
            assert_eq!(
                back[l as usize], data[l as usize],
                "{name}: step {at}: lane {l}"
            );
        }
        expected += 2; // The increment on another port and the fresh stream.
    }
    let stats = server.stats();
    assert_eq!(stats.panics, 0, "{stats}");
    assert!(stats.abandoned > 0, "{stats}");
    eprintln!("{name}: {steps} steps; {stats}");
}

#[test]
fn a_client_killed_at_every_step_of_test_stream() {
    kill_at_every_step("kill-stream", test_stream);
}

#[test]
fn a_client_killed_at_every_step_of_test_interface() {
    kill_at_every_step("kill-interface-send", |c, k| test_interface(c, k, false));
    kill_at_every_step("kill-interface-recv", |c, k| test_interface(c, k, true));
}

#[test]
fn a_client_killed_at_every_step_of_printf() {
    kill_at_every_step("kill-printf", printf);
}

/// A user handler for a stream echo that panics at packet `PANIC_AT` of its script (counting
/// the received and sent packets): the panic is caught and counted, the client never hangs,
/// and the server goes on serving.
#[test]
fn a_handler_panicking_at_every_step_of_a_stream_exchange() {
    static PANIC_AT: AtomicUsize = AtomicUsize::new(usize::MAX);
    let server = server("handler-panic");
    let echo = Opcode::user(7);
    server.register(echo, |mut req| async move {
        let at = PANIC_AT.load(Ordering::Relaxed);
        let tick = |step: usize| {
            if step == at {
                // A panic that skips the panic hook. With RUST_BACKTRACE=1 the default hook
                // symbolizes a backtrace under std's process-wide lock: the first one took
                // 10 s here under ASan (30 s+ under load, past `eventually`'s bound), and the
                // worker waits in it. The server's catch sees the same unwind either way.
                std::panic::resume_unwind(Box::new(format!("injected handler panic at step {at}")));
            }
        };
        tick(0);
        let data = req.recv_n().await?;
        tick(1);
        let slices: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
        req.send_n(&slices).await?;
        tick(2);
        Ok(())
    });
    let (memory, id) = attach(&server);
    let _ = server.start().unwrap();
    let locks = LockTable::new(PORTS);
    let data = stream_data();
    let slices: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
    for at in 0..3 {
        PANIC_AT.store(at, Ordering::Relaxed);
        let before = server.stats().panics;
        {
            let _kernel = server.user_for(id);
            // The client streams as long as the server takes packets (however slowly: no
            // deadline of its own but the liveness bound), and gives up once the panic is
            // counted: after it, nothing more can come back.
            let stop = AtomicBool::new(false);
            let wait = UntilStopped {
                stop: &stop,
                bound: Deadline::after(Duration::from_secs(30)),
            };
            let client = Client::new(memory.view(), locks.words())
                .unwrap()
                .with_wait(&wait);
            std::thread::scope(|scope| {
                scope.spawn(|| {
                    let mut port = client.open(echo, MASK).unwrap();
                    // The echo may come back garbled or not at all.
                    let _ = port.send_n(&slices).and_then(|()| port.recv_n(1 << 20));
                });
                // The panic is counted, and its port drained: the rest of the stream is
                // answered with failures, never run as new requests.
                eventually("the panic is counted", || server.stats().panics > before);
                stop.store(true, Ordering::Release);
            });
        }
    }
    PANIC_AT.store(usize::MAX, Ordering::Relaxed);
    let _user = server.user_for(id);
    let wait = Deadline::after(Duration::from_secs(30));
    let fresh = LockTable::new(PORTS);
    let client = Client::new(memory.view(), fresh.words())
        .unwrap()
        .with_wait(&wait);
    for op in [echo, Opcode::TEST_STREAM] {
        // Every port, so none is left stuck by a panic.
        for index in 0..PORTS {
            let Some(mut port) = client.try_open_at(index, op, MASK).unwrap() else {
                continue;
            };
            port.send_n(&slices).unwrap();
            let back = port.recv_n(1 << 20).unwrap();
            for l in lanes(MASK) {
                assert_eq!(
                    back[l as usize], data[l as usize],
                    "{op} port {index} lane {l}"
                );
            }
        }
    }
    assert!(server.stats().panics >= 3);
}

/// Forced shutdowns while clients send single-packet and multi-packet requests, each followed
/// by a new start: every TEST_INCREMENT is answered correctly (opened requests finish, pending
/// ones wait for the next worker), every TEST_STREAM is served correctly or cut (a stream cut
/// by a shutdown leaves its port locked on both sides, so the client gives up and is never
/// handed garbage; the port serves again once its kernel is gone), nothing hangs, and the
/// server serves normally at the end. Increments and streams use two mailboxes,
/// so that a stream port a client had to give up cannot starve the increments.
#[test]
fn forced_shutdown_with_requests_in_flight_then_start_again() {
    let server = RpcServer::new(ServerConfig {
        name: "force".into(),
        limits: rpc_core::Limits {
            string_bytes: 1 << 20,
            ..rpc_core::Limits::default()
        },
        ..ServerConfig::default()
    });
    let (memory, id) = attach(&server);
    let (streams_memory, streams_id) = attach(&server);
    let _ = server.start().unwrap();
    let stop = AtomicBool::new(false);
    let increments = AtomicU64::new(0);
    let streams = (AtomicU64::new(0), AtomicU64::new(0));
    std::thread::scope(|s| {
        let (memory, streams_memory, server, stop) = (&memory, &streams_memory, &server, &stop);
        let (increments, streams) = (&increments, &streams);
        s.spawn(move || {
            increment_until(server, memory, id, stop, || {
                increments.fetch_add(1, Ordering::Relaxed);
            })
        });
        s.spawn(move || {
            let data = stream_data();
            let slices: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
            while !stop.load(Ordering::Relaxed) {
                // One "kernel": its user guard and its lock bits, until every port it had was
                // cut (each cut port stays locked on both sides); then it ends, the server
                // lifts the quarantine of its ports, and a new kernel takes them.
                let _kernel = server.user_for(streams_id);
                let locks = LockTable::new(PORTS);
                while !stop.load(Ordering::Relaxed) {
                    // How long a client waits before it gives up (a stream cut by a shutdown
                    // is never answered; this only bounds the time such a cut costs).
                    let wait = Deadline(Instant::now() + Duration::from_millis(100));
                    let client = Client::new(streams_memory.view(), locks.words())
                        .unwrap()
                        .with_wait(&wait);
                    let Ok(mut port) = client.open(Opcode::TEST_STREAM, MASK) else {
                        break;
                    };
                    match port.send_n(&slices).and_then(|()| port.recv_n(1 << 20)) {
                        Ok(back) => {
                            // A stream that completes is never garbled, cut or not nearby.
                            for l in lanes(MASK) {
                                assert_eq!(back[l as usize], data[l as usize], "lane {l}");
                            }
                            streams.0.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(_) => {
                            streams.1.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            }
        });
        // 40 shutdown/start cycles under that traffic (on a slow machine, e.g. under a
        // sanitizer beside a busy loop, every stream may be cut: that is fine).
        for _ in 0..40 {
            std::thread::sleep(Duration::from_millis(3));
            let _ = server.shutdown_with(ShutdownPolicy::Force).unwrap();
            assert_eq!(server.stats().live_workers, 0);
            std::thread::sleep(Duration::from_millis(1));
            let _ = server.start().unwrap();
        }
        // Then, with the server left running, both clients are served again: an increment and
        // a whole stream (its kernel renews itself if all its ports were cut).
        let increments_before = increments.load(Ordering::Relaxed);
        let streams_before = streams.0.load(Ordering::Relaxed);
        eventually(
            "an increment and a stream are served after the restarts",
            || {
                increments.load(Ordering::Relaxed) > increments_before
                    && streams.0.load(Ordering::Relaxed) > streams_before
            },
        );
        stop.store(true, Ordering::Relaxed);
    });
    let stats = server.stats();
    assert_eq!(stats.panics, 0, "{stats}");
    assert!(stats.workers_started >= 41, "{stats}");
    assert!(increments.load(Ordering::Relaxed) > 0);
    assert!(streams.0.load(Ordering::Relaxed) > 0);
    eprintln!(
        "force: {} increments, {} streams served, {} streams cut; {stats}",
        increments.load(Ordering::Relaxed),
        streams.0.load(Ordering::Relaxed),
        streams.1.load(Ordering::Relaxed)
    );
    let _user = server.user();
    let wait = Deadline::after(Duration::from_secs(30));
    let fresh = LockTable::new(PORTS);
    let client = Client::new(memory.view(), fresh.words())
        .unwrap()
        .with_wait(&wait);
    let mut port = client.open(Opcode::TEST_INCREMENT, 1).unwrap();
    assert_eq!(increment_lanes(&mut port, 41)[0], 42);
}

/// Mailboxes attached and detached while another mailbox serves steady traffic, each detached
/// in the middle of a multi-packet exchange: `detach` returns (the wait is abandoned), the
/// steady client's every answer is right, and the detached memory is ours again.
#[test]
fn attach_and_detach_with_exchanges_in_flight() {
    let server = server("detach");
    let (memory, id) = attach(&server);
    let _ = server.start().unwrap();
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        let (memory, server, stop) = (&memory, &server, &stop);
        s.spawn(move || increment_until(server, memory, id, stop, || ()));
        for round in 0..30 {
            let (other, other_id) = attach(server);
            let _kernel = server.user_for(other_id);
            let locks = LockTable::new(PORTS);
            let wait = Deadline(Instant::now() + Duration::from_millis(200));
            let client = Client::new(other.view(), locks.words())
                .unwrap()
                .with_wait(&wait);
            let mut port = client.open(Opcode::TEST_STREAM, MASK).unwrap();
            // The first of several packets; the server waits for the next one.
            port.send(|l, p| p.set_word(0, 500 + u64::from(l))).unwrap();
            if round % 2 == 1 {
                std::thread::sleep(Duration::from_millis(1));
            }
            let started = Instant::now();
            server.detach(other_id).unwrap();
            assert!(
                started.elapsed() < Duration::from_secs(5),
                "detach took too long"
            );
            std::mem::forget(port);
            drop(other);
        }
        stop.store(true, Ordering::Relaxed);
    });
    assert_eq!(server.mailboxes(), vec![id]);
    assert_eq!(server.stats().panics, 0);
}

//! The server object and its thread with real threads: the seed scenario, independent servers,
//! users and sleep, shutdown policies, unknown opcodes, panics, abandoned exchanges, detach.
#![cfg(not(loom))]

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use common::{eventually, register_holding, Mailbox};
use rpc_core::protocol::{Backoff, Deadline};
use rpc_core::protocol::{Client, ClientPort, Generation, Layout, LockTable, MailboxMemory};
use rpc_core::AttachOptions;
use rpc_core::{
    MailboxId, Opcode, RpcServer, ServerConfig, ServerError, ShutdownPolicy, Started, Stopped,
};

fn increment(client: &Client<'_>, opcode: Opcode, x: u64) -> u64 {
    let mut port = client.open(opcode, 1).unwrap();
    let mut got = 0;
    port.send_and_recv(|_, p| p.set_word(0, x), |_, p| got = p.word(0))
        .unwrap();
    got
}

/// A server named `name` with a mailbox of `ports` ports and `lanes` lanes, started.
fn serving(name: &str, ports: u32, lanes: u32) -> (Arc<RpcServer>, Mailbox) {
    let server = Arc::new(RpcServer::new(config(name)));
    let mailbox = Mailbox::attach(&server, ports, lanes);
    let _ = server.start().unwrap();
    (server, mailbox)
}

fn config(name: &str) -> ServerConfig {
    ServerConfig {
        name: name.into(),
        ..ServerConfig::default()
    }
}

/// `normal`, or `under_miri` when miri runs the test (it interprets every instruction): the
/// same scenario, fewer rounds.
const fn scaled(normal: usize, under_miri: usize) -> usize {
    if cfg!(miri) {
        under_miri
    } else {
        normal
    }
}

#[test]
fn seed_scenario_four_mailboxes_one_worker_shutdown_twice() {
    let server = RpcServer::new(config("seed"));
    let mailboxes: Vec<Mailbox> = (0..4).map(|_| Mailbox::attach(&server, 4, 1)).collect();
    let started: Vec<Started> = mailboxes.iter().map(|_| server.start().unwrap()).collect();
    assert_eq!(
        started.iter().filter(|&&s| s == Started::Started).count(),
        1
    );
    assert_eq!(server.stats().live_workers, 1);
    let _user = server.user();
    for (k, mailbox) in mailboxes.iter().enumerate() {
        assert_eq!(
            increment(&mailbox.client(), Opcode::TEST_INCREMENT, k as u64),
            k as u64 + 1
        );
    }
    drop(_user);
    assert_eq!(server.shutdown().unwrap(), Stopped::Stopped);
    assert_eq!(server.shutdown().unwrap(), Stopped::AlreadyStopped);
    assert_eq!(server.stats().live_workers, 0);
    assert_eq!(server.stats().workers_started, 1);
    // Start after shutdown starts a fresh worker.
    assert_eq!(server.start().unwrap(), Started::Started);
    assert_eq!(server.stats().workers_started, 2);
    assert_eq!(server.shutdown().unwrap(), Stopped::Stopped);
    assert_eq!(server.stats().max_live_workers, 1);
}

#[test]
fn two_servers_are_independent_and_custom_opcodes_stay_private() {
    let nvidia = RpcServer::new(config("nvidia"));
    let amd = RpcServer::new(config("amd"));
    let custom = Opcode::user(42);
    nvidia.register_packet(custom, move |_, p| p.set_word(0, p.word(0) * 2));
    // Which thread serves each: a handler that answers with its thread's name (8 bytes).
    let whose = Opcode::user(43);
    let first_8 = |name: &str| {
        let mut bytes = [0; 8];
        let n = name.len().min(8);
        bytes[..n].copy_from_slice(&name.as_bytes()[..n]);
        u64::from_le_bytes(bytes)
    };
    for server in [&nvidia, &amd] {
        server.register_packet(whose, move |_, p| {
            p.set_word(0, first_8(thread::current().name().unwrap_or_default()))
        });
    }
    let on_nvidia = Mailbox::attach(&nvidia, 2, 32);
    let on_amd = Mailbox::attach(&amd, 2, 64);
    let _ = nvidia.start().unwrap();
    let _ = amd.start().unwrap();
    let (_a, _b) = (nvidia.user(), amd.user());
    // One worker each, named after its server ("rpc-nvidia", "rpc-amd").
    assert_eq!(
        increment(&on_nvidia.client(), whose, 0),
        first_8("rpc-nvidia")
    );
    assert_eq!(increment(&on_amd.client(), whose, 0), first_8("rpc-amd"));
    assert_eq!(increment(&on_nvidia.client(), custom, 21), 42);
    // Unknown on the other server: closed unanswered, so the client reads its own request.
    assert_eq!(increment(&on_amd.client(), custom, 21), 21);
    // An unknown opcode is counted before its port closes; a served one after its reply.
    assert_eq!(amd.stats().unknown, 1);
    let on_nvidia_counts = common::settled_stats(&nvidia, on_nvidia.id);
    assert_eq!(on_nvidia_counts.unknown, 0);
    assert_eq!(on_nvidia_counts.served_of(custom), 1);
    // And the other server still serves its own requests afterwards.
    assert_eq!(increment(&on_amd.client(), Opcode::TEST_INCREMENT, 1), 2);
    assert!(nvidia.handler_names()[0].contains("0x7500002a"));
}

#[test]
fn concurrent_start_and_shutdown_keep_at_most_one_worker() {
    let server = Arc::new(RpcServer::new(config("race")));
    thread::scope(|s| {
        for t in 0..4 {
            let server = &server;
            s.spawn(move || {
                for i in 0..scaled(200, 10) {
                    if (i + t) % 2 == 0 {
                        let _ = server.start().unwrap();
                    } else {
                        let _ = server.shutdown().unwrap();
                    }
                }
            });
        }
    });
    let _ = server.shutdown().unwrap();
    assert_eq!(server.stats().max_live_workers, 1);
    assert_eq!(server.stats().live_workers, 0);
}

#[test]
fn shutdown_policies_with_a_live_guard() {
    let server = RpcServer::new(config("policy"));
    let _ = server.start().unwrap();
    let guard = server.user();
    assert_eq!(
        server.shutdown(),
        Err(ServerError::LiveUsers(1)),
        "the default policy refuses"
    );
    assert!(server.is_running());
    assert_eq!(
        server.shutdown_with(ShutdownPolicy::Wait(Duration::from_millis(20))),
        Err(ServerError::LiveUsers(1))
    );
    let dropper = thread::spawn(move || {
        thread::sleep(Duration::from_millis(50));
        drop(guard);
    });
    assert_eq!(
        server.shutdown_with(ShutdownPolicy::Wait(Duration::from_secs(30))),
        Ok(Stopped::Stopped)
    );
    dropper.join().unwrap();
    let _ = server.start().unwrap();
    let _guard = server.user();
    assert_eq!(
        server.shutdown_with(ShutdownPolicy::Force),
        Ok(Stopped::Stopped)
    );
    assert_eq!(server.stats().live_workers, 0);
}

#[test]
fn a_panicking_handler_is_caught_and_the_worker_goes_on() {
    let server = RpcServer::new(config("panic"));
    server.register::<_, _, ()>(Opcode::user(1), |mut req| async move {
        req.recv(|_, _| {}).await?;
        // A panic that skips the panic hook: with RUST_BACKTRACE=1 the default hook
        // symbolizes a backtrace (seconds under a sanitizer) under std's process-wide lock,
        // stalling every thread that panics meanwhile. The server sees the same unwind.
        std::panic::resume_unwind(Box::new("handler bug"));
    });
    let mailbox = Mailbox::attach(&server, 2, 1);
    let _ = server.start().unwrap();
    let user = server.user();
    let client = mailbox.client();
    let mut port = client.open(Opcode::user(1), 1).unwrap();
    assert_eq!(port.index(), 0);
    port.send(|_, p| p.set_word(0, 5)).unwrap();
    drop(port);
    // Port 0 is drained (its script stopped midway: what its client sends next is answered,
    // never run); the next increment is served on port 0 or 1. A pass may serve port 1 before
    // it reaches port 0 (miri's scheduler found one), so the panic is awaited.
    assert_eq!(increment(&client, Opcode::TEST_INCREMENT, 9), 10);
    eventually("the panic is counted", || server.stats().panics == 1);
    // Once the kernel that was inside the exchange is gone, port 0 serves again.
    drop(user);
    let _user = server.user();
    eventually("port 0 is released", || {
        let Some(mut port) = client.try_open_at(0, Opcode::TEST_INCREMENT, 1).unwrap() else {
            return false;
        };
        let mut got = 0;
        port.send_and_recv(|_, p| p.set_word(0, 1), |_, p| got = p.word(0))
            .unwrap();
        got == 2
    });
}

#[test]
fn a_bad_lane_mask_is_counted_and_the_port_returned() {
    let (server, mailbox) = serving("mask", 1, 32);
    let _user = server.user();
    // Write a header with a bit above L by hand, as a broken device would.
    let layout = mailbox.memory.layout();
    let base = mailbox.memory.as_ptr();
    // SAFETY: offsets inside the region; every access is atomic.
    unsafe {
        let word = |offset: usize| &*(base.add(offset) as *const std::sync::atomic::AtomicU64);
        word(layout.header()).store(1 << 40 | 1, Ordering::Relaxed);
        word(layout.header() + 8).store(u64::from(Opcode::TEST_INCREMENT.0), Ordering::Relaxed);
        std::sync::atomic::fence(Ordering::Release);
        (*(base.add(layout.secondary()) as *const std::sync::atomic::AtomicU32))
            .store(1, Ordering::Relaxed);
    }
    eventually("the bad header is counted", || {
        server.stats().bad_headers == 1
    });
    assert_eq!(increment(&mailbox.client(), Opcode::TEST_INCREMENT, 1), 2);
}

#[test]
fn an_exchange_whose_kernel_is_gone_is_abandoned() {
    let (server, mailbox) = serving("abandon", 2, 1);
    let client = mailbox.client();
    {
        let _kernel = server.user_for(mailbox.id);
        // First packet of a 1000-byte string, then the "kernel" dies.
        let port = send_n_begun(&client);
        std::mem::forget(port); // A dead kernel never closes its port.
    }
    eventually("the exchange is abandoned", || {
        server.stats().abandoned == 1
    });
    // Port 0 stays locked by the dead client (its device-private lock); port 1 serves.
    let _user = server.user_for(mailbox.id);
    assert_eq!(increment(&client, Opcode::TEST_INCREMENT, 1), 2);
}

#[test]
fn a_client_timeout_drains_the_port_of_a_client_that_stopped_answering() {
    let server = RpcServer::new(ServerConfig {
        client_timeout: Some(Duration::from_millis(50)),
        ..config("timeout")
    });
    let mailbox = Mailbox::attach(&server, 2, 1);
    let _ = server.start().unwrap();
    let _kernel = server.user_for(mailbox.id); // Still "running", but silent.
    let client = mailbox.client();
    let port = send_n_begun(&client);
    eventually("the client times out", || server.stats().abandoned == 1);
    std::mem::forget(port);
    assert_eq!(increment(&client, Opcode::TEST_INCREMENT, 7), 8);
    // The port was drained for a new client (another process, with its own lock bits).
    let fresh = LockTable::new(2);
    let other = Client::new(mailbox.memory.view(), fresh.words()).unwrap();
    assert!(other
        .try_open_at(0, Opcode::TEST_INCREMENT, 1)
        .unwrap()
        .is_some());
}

#[test]
fn a_blocking_call_longer_than_the_client_timeout_is_not_the_clients_silence() {
    // The client waits for the server here, not the other way round: however long the call
    // runs on an I/O thread, the exchange is not abandoned. The client's request is one packet,
    // so the exchange never waits for the client before the call (a slow client there would
    // rightly time out, whatever the machine's load).
    let server = RpcServer::new(ServerConfig {
        client_timeout: Some(Duration::from_millis(1)),
        ..config("slow-call")
    });
    let (release, held) = std::sync::mpsc::channel::<()>();
    let held = Arc::new(std::sync::Mutex::new(held));
    let entered = Arc::new(AtomicBool::new(false));
    let slow = Opcode::user(0x510);
    let inside = entered.clone();
    server.register(slow, move |mut req| {
        let (held, inside) = (held.clone(), inside.clone());
        async move {
            let mut x = 0;
            req.recv(|_, p| x = p.word(0)).await?;
            let answer = req
                .blocking(move |_| {
                    inside.store(true, Ordering::Release);
                    held.lock().unwrap().recv().unwrap();
                    x + 100
                })
                .await?;
            req.send(|_, p| p.set_word(0, answer)).await
        }
    });
    let mailbox = Mailbox::attach(&server, 1, 1);
    let _ = server.start().unwrap();
    let _kernel = server.user_for(mailbox.id);
    thread::scope(|s| {
        let call = s.spawn(|| increment(&mailbox.client(), slow, 4));
        eventually("the call runs", || entered.load(Ordering::Acquire));
        // Far past the timeout, with passes polling the exchange all the while.
        let passes = server.stats().passes;
        thread::sleep(Duration::from_millis(20));
        eventually("the server polls on", || {
            server.stats().passes > passes + 10
        });
        release.send(()).unwrap();
        assert_eq!(call.join().unwrap(), 104);
    });
    assert_eq!(server.stats().abandoned, 0);
}

/// A blocking call queued behind another on the one I/O thread, whose exchange is abandoned
/// (its kernel gone) before the thread is free, is never run: it would act for a client that
/// is gone (as a stdin read would, on the next client's stdin).
#[test]
fn a_queued_call_of_an_abandoned_exchange_never_runs() {
    let server = RpcServer::new(ServerConfig {
        io_threads: 1,
        ..config("queued-call")
    });
    let (release, held) = std::sync::mpsc::channel::<()>();
    let held = Arc::new(std::sync::Mutex::new(held));
    let entered = Arc::new(AtomicBool::new(false));
    let ran = Arc::new(AtomicU64::new(0));
    // HOLD: a call that waits until released; COUNT: one that counts that it ran.
    let (hold, count) = (Opcode::user(0x520), Opcode::user(0x521));
    let inside = entered.clone();
    server.register(hold, move |mut req| {
        let (held, inside) = (held.clone(), inside.clone());
        async move {
            req.recv(|_, _| {}).await?;
            req.blocking(move |_| {
                inside.store(true, Ordering::Release);
                let _ = held.lock().unwrap().recv();
            })
            .await?;
            req.send(|_, p| p.set_word(0, 1)).await
        }
    });
    let counter = ran.clone();
    server.register(count, move |mut req| {
        let counter = counter.clone();
        async move {
            req.recv(|_, _| {}).await?;
            req.blocking(move |_| counter.fetch_add(1, Ordering::Relaxed))
                .await?;
            req.send(|_, p| p.set_word(0, 1)).await
        }
    });
    let (first, second) = (
        Mailbox::attach(&server, 2, 1),
        Mailbox::attach(&server, 1, 1),
    );
    let _ = server.start().unwrap();
    let _kernel = server.user_for(first.id);
    thread::scope(|s| {
        let held_call = s.spawn(|| increment(&first.client(), hold, 0));
        eventually("the first call holds the I/O thread", || {
            entered.load(Ordering::Acquire)
        });
        {
            let _dying = server.user_for(second.id);
            let client = second.client();
            let mut port = client.open(count, 1).unwrap();
            port.send(|_, _| {}).unwrap();
            eventually("the second call is queued", || {
                server.stats().blocking_calls == 2
            });
            std::mem::forget(port); // Its kernel dies without a word.
        }
        eventually("its exchange is abandoned", || {
            server.stats().abandoned == 1
        });
        release.send(()).unwrap();
        assert_eq!(held_call.join().unwrap(), 1);
    });
    // A third call on the same thread comes after the second's turn in the queue.
    release.send(()).unwrap();
    assert_eq!(increment(&first.client(), hold, 0), 1);
    assert_eq!(ran.load(Ordering::Relaxed), 0, "the abandoned call ran");
}

#[test]
fn requests_left_by_a_finished_kernel_are_served_before_sleeping() {
    let (server, mailbox) = serving("last-pass", 1, 1);
    {
        let _kernel = server.user();
        let mut port = mailbox.client().open(Opcode::NOOP, 1).unwrap();
        port.send(|_, _| {}).unwrap(); // Needs no answer: the kernel ends at once.
    }
    eventually("the NOOP is served", || {
        server.stats().served_of(Opcode::NOOP) == 1
    });
}

#[test]
fn detach_while_serving() {
    let (server, keep) = serving("detach", 2, 1);
    let _user = server.user();
    let stop = AtomicBool::new(false);
    thread::scope(|s| {
        s.spawn(|| {
            let client = keep.client();
            let mut x = 0;
            while !stop.load(Ordering::Relaxed) {
                assert_eq!(increment(&client, Opcode::TEST_INCREMENT, x), x + 1);
                x += 1;
            }
        });
        for _ in 0..scaled(50, 5) {
            let other = Mailbox::attach(&server, 4, 32);
            let client = other.client();
            let mut port = client.open(Opcode::TEST_INCREMENT, 0xF).unwrap();
            port.send(|_, p| p.set_word(0, 1)).unwrap();
            server.detach(other.id).unwrap();
            // Either served before the detach or never: the memory is ours again either way.
            drop(port);
            drop(other);
        }
        stop.store(true, Ordering::Relaxed);
    });
    assert_eq!(server.mailboxes(), vec![keep.id]);
    assert_eq!(
        server.detach(MailboxId(999)),
        Err(ServerError::NoSuchMailbox(999))
    );
}

/// The kernel's id of this process's thread named `name`, once it runs.
fn worker_tid(name: &str) -> i32 {
    let find = || {
        std::fs::read_dir("/proc/self/task")
            .unwrap()
            .find_map(|task| {
                let task = task.ok()?.path();
                let comm = std::fs::read_to_string(task.join("comm")).ok()?;
                (comm.trim_end() == name).then(|| task.file_name()?.to_str()?.parse().ok())?
            })
    };
    eventually("the worker runs", || find().is_some());
    find().unwrap()
}

/// The kernel's count of the CPU time thread `tid` has used.
fn thread_cpu_time(tid: i32) -> Duration {
    let text = std::fs::read_to_string(format!("/proc/self/task/{tid}/schedstat")).unwrap();
    Duration::from_nanos(text.split_whitespace().next().unwrap().parse().unwrap())
}

#[test]
#[cfg_attr(
    miri,
    ignore = "reads the worker's CPU time from /proc, which miri neither has nor allows"
)]
fn an_idle_server_uses_no_measurable_cpu() {
    let (server, _mailbox) = serving("idle", 64, 32);
    let tid = worker_tid("rpc-idle");
    let before = thread_cpu_time(tid);
    thread::sleep(Duration::from_secs(1));
    let used = thread_cpu_time(tid) - before;
    // Reported, not asserted: timing is measured by `cargo xtask bench`.
    println!("idle worker CPU over 1 s with no users: {used:?}");
    let _ = server.shutdown().unwrap();
}

#[test]
fn backoff_is_a_valid_wait() {
    // `Backoff` never gives up; a few hundred steps go through spin, yield and nap.
    for attempt in 0..700 {
        Backoff::step(attempt);
    }
}

#[test]
fn a_new_kernel_does_not_keep_a_dead_kernels_exchange_alive() {
    let (server, mailbox) = serving("relaunch", 2, 1);
    let client = mailbox.client();
    let first = server.user_for(mailbox.id);
    let mut port = send_n_begun(&client);
    // The second packet goes once the worker has opened the port (taking its marks) and
    // read the first: the TEST_STREAM exchange is then in flight, waiting for the third.
    port.send(|_, _| {}).unwrap();
    std::mem::forget(port);
    // The next launch starts before the first one's end is noticed.
    let second = server.user_for(mailbox.id);
    drop(first);
    assert_eq!(increment(&client, Opcode::TEST_INCREMENT, 3), 4);
    eventually("the dead kernel's exchange is abandoned", || {
        server.stats().abandoned == 1
    });
    drop(second);
}

/// Regression: the worker only looked at its state when a pass found nothing to serve, so a
/// client sending back to back kept `shutdown` (even `Force`) waiting for as long as it kept
/// sending. The request in flight at the shutdown is served by the next worker. No timing is
/// asserted: a watchdog ends the traffic after 30 s, and the test fails if it had to.
#[test]
fn shutdown_returns_while_a_client_keeps_the_worker_busy() {
    let (server, mailbox) = serving("busy", 2, 1);
    let stop = AtomicBool::new(false);
    let watchdog_fired = AtomicBool::new(false);
    thread::scope(|s| {
        s.spawn(|| {
            let _kernel = server.user_for(mailbox.id);
            let client = mailbox.client();
            let mut x = 0;
            while !stop.load(Ordering::Relaxed) {
                assert_eq!(increment(&client, Opcode::TEST_INCREMENT, x), x + 1);
                x += 1;
            }
        });
        s.spawn(|| {
            let deadline = Instant::now() + Duration::from_secs(30);
            while !stop.load(Ordering::Relaxed) {
                if Instant::now() > deadline {
                    watchdog_fired.store(true, Ordering::Relaxed);
                    stop.store(true, Ordering::Relaxed);
                }
                thread::sleep(Duration::from_millis(10));
            }
        });
        for _ in 0..scaled(5, 2) {
            let served = server.stats().served_of(Opcode::TEST_INCREMENT);
            eventually("traffic flows", || {
                server.stats().served_of(Opcode::TEST_INCREMENT) > served + 20
            });
            assert_eq!(
                server.shutdown_with(ShutdownPolicy::Force),
                Ok(Stopped::Stopped)
            );
            assert_eq!(server.start(), Ok(Started::Started));
        }
        stop.store(true, Ordering::Relaxed);
    });
    assert!(
        !watchdog_fired.load(Ordering::Relaxed),
        "shutdown waited for the traffic to end"
    );
}

/// Re-entrancy: a handler (running on the worker) may call `start`, `shutdown` and `detach` on
/// its own server. None of them waits for the worker, which is itself: `start` says it runs,
/// `shutdown` is refused, `detach` of another mailbox returns at once (the worker lets go of it
/// after the pass). The server serves on.
#[test]
fn a_handler_calling_start_shutdown_and_detach_on_its_own_server_does_not_deadlock() {
    let server = Arc::new(RpcServer::new(config("reentrant")));
    let mailbox = Mailbox::attach(&server, 2, 1);
    let other = Mailbox::attach(&server, 1, 1);
    let other_id = other.id;
    let weak = Arc::downgrade(&server);
    server.register(Opcode::user(1), move |mut req| {
        let weak = weak.clone();
        async move {
            let server = weak.upgrade().expect("the test holds the server");
            let started = server.start() == Ok(Started::AlreadyRunning);
            let refused = matches!(server.shutdown(), Err(ServerError::Refused(_)));
            let detached = server.detach(other_id).is_ok();
            let answer = u64::from(started) | u64::from(refused) << 1 | u64::from(detached) << 2;
            req.recv_and_send(|_, p| p.set_word(0, answer)).await
        }
    });
    let _ = server.start().unwrap();
    let _user = server.user();
    let client = mailbox.client();
    let mut port = client.open(Opcode::user(1), 1).unwrap();
    let mut answer = 0;
    port.send_and_recv(|_, _| {}, |_, p| answer = p.word(0))
        .unwrap();
    drop(port);
    assert_eq!(answer, 0b111, "start, shutdown and detach as documented");
    assert_eq!(server.mailboxes(), vec![mailbox.id]);
    assert!(server.is_running());
    assert_eq!(increment(&client, Opcode::TEST_INCREMENT, 1), 2);
    drop(_user);
    let _ = server.shutdown().unwrap();
}

/// `ShutdownPolicy::Wait(d)` is a deadline: users coming and going all the time (each one
/// notifying the condition variable shutdown waits on) do not extend it. Were each wake-up to
/// restart the wait, this shutdown would not return while the churn lasts.
#[test]
fn a_shutdown_wait_is_a_deadline_however_often_users_come_and_go() {
    let server = RpcServer::new(config("deadline"));
    let _ = server.start().unwrap();
    let stay = server.user();
    let stop = AtomicBool::new(false);
    thread::scope(|s| {
        s.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                drop(server.user());
            }
        });
        let result = server.shutdown_with(ShutdownPolicy::Wait(Duration::from_millis(100)));
        assert!(
            matches!(result, Err(ServerError::LiveUsers(n)) if n >= 1),
            "{result:?}"
        );
        stop.store(true, Ordering::Relaxed);
    });
    drop(stay);
    let _ = server.shutdown().unwrap();
}

/// A matcher that panics costs only the request it was asked about (closed unanswered, counted
/// in `panics`); a mailbox whose memory source panics is no longer served, and the other
/// mailboxes are. The worker runs on through both.
#[test]
fn panics_outside_handlers_are_caught_and_cost_only_what_they_touch() {
    let server = RpcServer::new(config("outside"));
    server.register_matching(
        "panicky matcher",
        |op| {
            if op == Opcode::user(5) {
                // Skips the panic hook (see `a_panicking_handler_is_caught_...`).
                std::panic::resume_unwind(Box::new("matcher bug"));
            }
            false
        },
        |_req| async { Ok(()) },
    );
    let mailbox = Mailbox::attach(&server, 2, 1);
    /// A memory source that panics once told to.
    struct Flaky(Arc<MailboxMemory>, Arc<AtomicBool>);
    impl rpc_core::AtomicMailbox for Flaky {
        fn view(&self) -> rpc_core::protocol::Mailbox<'_> {
            if self.1.load(Ordering::Relaxed) {
                // Skips the panic hook (see `a_panicking_handler_is_caught_...`).
                std::panic::resume_unwind(Box::new("source bug"));
            }
            self.0.view()
        }
    }
    let broken = Arc::new(AtomicBool::new(false));
    let flaky = Arc::new(MailboxMemory::new(
        Layout::new(Generation::V1, 1, 1).unwrap(),
    ));
    let _flaky_id = server.attach(
        Box::new(Flaky(flaky, broken.clone())),
        AttachOptions::default(),
    );
    let _ = server.start().unwrap();
    let _user = server.user();
    let client = mailbox.client();
    let mut port = client.open(Opcode::user(5), 1).unwrap();
    let mut back = 0;
    port.send_and_recv(|_, p| p.set_word(0, 77), |_, p| back = p.word(0))
        .unwrap();
    drop(port);
    assert_eq!(
        back, 77,
        "closed unanswered: the client reads its request back"
    );
    eventually("the matcher's panic is counted", || {
        server.stats().panics == 1
    });
    assert_eq!(increment(&client, Opcode::TEST_INCREMENT, 1), 2);
    broken.store(true, Ordering::Relaxed);
    eventually("the source's panic is counted", || {
        server.stats().panics == 2
    });
    assert!(server.is_running());
    assert_eq!(increment(&client, Opcode::TEST_INCREMENT, 2), 3);
    assert_eq!(
        server.stats().panics,
        2,
        "the failed mailbox is not served again"
    );
    drop(_user);
    let _ = server.shutdown().unwrap();
}

/// The last handle on a server dropped by one of its own handlers (through a `Weak` it had
/// upgraded), on the worker: the worker stops by itself, and everything the server held goes
/// with it (here: the mailbox memory, whose other owner is this test).
#[test]
fn a_server_dropped_by_its_own_handler_stops_and_frees_everything() {
    let server = Arc::new(RpcServer::new(config("self-drop")));
    let mailbox = Mailbox::attach(&server, 1, 1);
    let weak = Arc::downgrade(&server);
    let upgraded = Arc::new(AtomicBool::new(false));
    let seen = upgraded.clone();
    server.register(Opcode::user(1), move |mut req| {
        let (weak, seen) = (weak.clone(), seen.clone());
        async move {
            let server = weak.upgrade().expect("the test still holds the server");
            seen.store(true, Ordering::Release);
            // Waits for the second packet, which comes once the test has dropped its handle.
            req.recv(|_, _| {}).await?;
            req.recv(|_, _| {}).await?;
            drop(server); // The last handle: RpcServer::drop runs here, on the worker.
            req.send(|_, p| p.set_word(0, 1)).await
        }
    });
    let _ = server.start().unwrap();
    let user = server.user();
    let client = mailbox.client();
    let mut port = client.open(Opcode::user(1), 1).unwrap();
    port.send(|_, _| {}).unwrap();
    eventually("the handler holds the server", || {
        upgraded.load(Ordering::Acquire)
    });
    drop(server);
    port.send(|_, _| {}).unwrap();
    std::mem::forget(port); // The reply may or may not come: the server is going away.
    drop(user);
    eventually("the worker is gone and freed the mailbox", || {
        Arc::strong_count(&mailbox.memory) == 1
    });
}

// Deterministic tests of properties that mutation testing found unguarded (docs/reliability.md,
// "Concurrency: what the models and mutants prove"). Each waits only for something the code
// promises will happen; durations are liveness bounds, never the thing being checked.

/// Runs `body` on a thread of its own; fails if it has not returned within a generous bound
/// (a hang is the failure being tested for, e.g. a `detach` that never returns).
fn within_bound<R: Send + 'static>(what: &str, body: impl FnOnce() -> R + Send + 'static) -> R {
    let (done, finished) = std::sync::mpsc::channel();
    let runner = thread::spawn(move || {
        let _ = done.send(body());
    });
    match finished.recv_timeout(Duration::from_secs(60)) {
        Ok(result) => {
            runner.join().unwrap();
            result
        }
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
            std::panic::resume_unwind(runner.join().expect_err("the body panicked"))
        }
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => panic!("{what}: did not return"),
    }
}

/// Detaches `mailbox` (within `within_bound`'s bound, as `what`); the server let go of its
/// memory.
fn detach_within_bound(what: &str, server: &Arc<RpcServer>, mailbox: &Mailbox) {
    let (detaching, id) = (server.clone(), mailbox.id);
    within_bound(what, move || detaching.detach(id)).unwrap();
    assert_eq!(
        Arc::strong_count(&mailbox.memory),
        1,
        "the server let go of the memory"
    );
}

/// Opens TEST_STREAM (waiting for a free port) and sends the first packet of a 1000-byte
/// string: the server then waits for the rest.
fn send_n_begun<'a>(client: &Client<'a>) -> ClientPort<'a> {
    let mut port = client.open(Opcode::TEST_STREAM, 1).unwrap();
    port.send(|_, p| p.set_word(0, 1000)).unwrap();
    port
}

/// Registers `user(1)`: two packets in, their sum back. The flag returned is set once the first
/// packet is in, just before the script suspends waiting for the second.
fn register_sum(server: &RpcServer) -> Arc<AtomicBool> {
    let started = Arc::new(AtomicBool::new(false));
    let set = started.clone();
    server.register(Opcode::user(1), move |mut req| {
        let started = set.clone();
        async move {
            let (mut a, mut b) = (0, 0);
            req.recv(|_, p| a = p.word(0)).await?;
            started.store(true, Ordering::Release);
            req.recv(|_, p| b = p.word(0)).await?;
            req.send(|_, p| p.set_word(0, a + b)).await
        }
    });
    started
}

/// Opens `opcode` and sends its first packet (40), then waits until its handler has it
/// (`started`) and suspends: the exchange is in flight, waiting for the client.
fn suspended<'a>(client: &Client<'a>, opcode: Opcode, started: &AtomicBool) -> ClientPort<'a> {
    let mut port = client.open(opcode, 1).unwrap();
    port.send(|_, p| p.set_word(0, 40)).unwrap();
    eventually("the exchange is suspended in flight", || {
        started.load(Ordering::Acquire)
    });
    port
}

/// The worker reads `stopping` before every pass, so once a shutdown has begun it serves at
/// most the pass it is in and then its last pass, however busy it is. Here the worker is held
/// inside a handler until the shutdown has begun (the state is no longer Running), and the
/// passes are counted from there: exactly two more. A worker that only looked at its state
/// when idle would first run its whole back-off (hundreds of passes).
#[test]
fn once_a_shutdown_begins_the_worker_serves_only_its_current_and_last_pass() {
    let server = Arc::new(RpcServer::new(config("stopping")));
    let passes_at_stop = Arc::new(std::sync::atomic::AtomicU64::new(u64::MAX));
    let inside = Arc::new(AtomicBool::new(false));
    {
        let weak = Arc::downgrade(&server);
        let (passes_at_stop, inside) = (passes_at_stop.clone(), inside.clone());
        server.register(Opcode::user(1), move |mut req| {
            let (weak, passes_at_stop, inside) =
                (weak.clone(), passes_at_stop.clone(), inside.clone());
            async move {
                req.recv(|_, _| {}).await?;
                let server = weak.upgrade().expect("the test holds the server");
                inside.store(true, Ordering::Release);
                let bound = Instant::now() + Duration::from_secs(60);
                while server.is_running() && Instant::now() < bound {
                    thread::yield_now();
                }
                passes_at_stop.store(server.stats().passes, Ordering::Release);
                Ok(())
            }
        });
    }
    let mailbox = Mailbox::attach(&server, 1, 1);
    let _ = server.start().unwrap();
    let _kernel = server.user();
    let client = mailbox.client();
    client
        .open(Opcode::user(1), 1)
        .unwrap()
        .send(|_, _| {})
        .unwrap();
    eventually("the worker is inside the handler", || {
        inside.load(Ordering::Acquire)
    });
    assert_eq!(
        server.shutdown_with(ShutdownPolicy::Force),
        Ok(Stopped::Stopped)
    );
    let at_stop = passes_at_stop.load(Ordering::Acquire);
    assert_ne!(at_stop, u64::MAX, "the handler saw the shutdown begin");
    assert_eq!(
        server.stats().passes - at_stop,
        2,
        "passes after the shutdown began: the one in progress and the last"
    );
}

/// A shutdown ends the exchanges in flight (abandoned, counted) and leaves their ports
/// quarantined: locked until the kernels that could be inside them are gone, then served again.
/// The exchange here holds the buffer (it waits on something other than its client), so a new
/// client finds the port busy until the quarantine is lifted, and then gets it clean.
#[test]
fn a_shutdown_abandons_the_exchanges_in_flight_and_their_ports_serve_once_the_kernel_is_gone() {
    let server = RpcServer::new(config("abandon-at-shutdown"));
    let started = register_holding(&server, Opcode::user(2));
    let mailbox = Mailbox::attach(&server, 1, 1);
    let _ = server.start().unwrap();
    let kernel = server.user_for(mailbox.id);
    let client = mailbox.client();
    let port = suspended(&client, Opcode::user(2), &started);
    assert_eq!(
        server.shutdown_with(ShutdownPolicy::Force),
        Ok(Stopped::Stopped)
    );
    assert_eq!(
        server.stats().abandoned,
        1,
        "the exchange in flight is ended"
    );
    // The kernel dies without finishing its exchange (its lock bit stays set, as on a GPU).
    std::mem::forget(port);
    drop(kernel);
    // A new kernel, with lock bits of its own, gets the port once the quarantine is lifted.
    let _ = server.start().unwrap();
    let _kernel = server.user_for(mailbox.id);
    let fresh = LockTable::new(1);
    let wait = rpc_core::protocol::Deadline::after(Duration::from_secs(60));
    let other = Client::new(mailbox.memory.view(), fresh.words())
        .unwrap()
        .with_wait(&wait);
    assert_eq!(increment(&other, Opcode::TEST_INCREMENT, 41), 42);
}

/// After a shutdown a new worker serves: the shutdown's `stopping` flag is cleared when it ends.
#[test]
fn a_restarted_server_serves_again() {
    let server = RpcServer::new(config("restart"));
    let mailbox = Mailbox::attach(&server, 1, 1);
    assert_eq!(server.start(), Ok(Started::Started));
    assert_eq!(server.shutdown(), Ok(Stopped::Stopped));
    assert_eq!(server.start(), Ok(Started::Started));
    let _kernel = server.user();
    let wait = rpc_core::protocol::Deadline::after(Duration::from_secs(60));
    let client = mailbox.client().with_wait(&wait);
    let mut port = client.open(Opcode::TEST_INCREMENT, 1).unwrap();
    let mut got = 0;
    port.send_and_recv(|_, p| p.set_word(0, 41), |_, p| got = p.word(0))
        .expect("the restarted worker answers");
    assert_eq!(got, 42);
}

/// A kernel's exchange waiting for its client is kept while the kernel runs: the worker polls
/// it pass after pass without abandoning it (the kernel's ticket is the oldest live one), and
/// it completes when the client answers.
#[test]
fn a_live_kernels_suspended_exchange_is_kept_pass_after_pass() {
    let (server, mailbox) = serving("kept", 1, 1);
    let started = register_sum(&server);
    let _kernel = server.user_for(mailbox.id);
    let client = mailbox.client();
    let mut port = suspended(&client, Opcode::user(1), &started);
    // Two more passes end: the one that suspended the exchange, and one that polled it.
    let passes = server.stats().passes;
    eventually("two more passes", || server.stats().passes >= passes + 2);
    assert_eq!(
        server.stats().abandoned,
        0,
        "a live kernel's exchange was abandoned"
    );
    let mut sum = 0;
    port.send_and_recv(|_, p| p.set_word(0, 2), |_, p| sum = p.word(0))
        .unwrap();
    assert_eq!(sum, 42);
}

/// Once the last user is gone the worker goes back to sleep (it does not go on polling).
#[test]
fn the_worker_sleeps_again_once_its_users_are_gone() {
    let (server, mailbox) = serving("sleeps", 1, 1);
    eventually("the new worker sleeps", || server.stats().sleeps == 1);
    let kernel = server.user();
    assert_eq!(increment(&mailbox.client(), Opcode::TEST_INCREMENT, 1), 2);
    drop(kernel);
    eventually("the worker sleeps again", || server.stats().sleeps == 2);
    let _ = server.shutdown().unwrap();
}

/// `detach` after the worker went to sleep returns: before sleeping the worker let go of its
/// copy of the mailbox list and drained the exchange of a kernel that died midway, so nothing
/// of it still holds the mailbox while it sleeps (a detach only wakes it for a moment; the
/// sleep resumes while no user lives). Catches: `PassCache::clear_gone` keeping the list copy
/// (`detach` waits forever: its 60 s bound). (A `clear_gone` that keeps the gone kernel's
/// exchange is not caught here: a pass of the stretch already finds that kernel gone.)
#[test]
fn detach_after_the_worker_went_to_sleep_returns() {
    let (server, mailbox) = serving("detach-asleep", 1, 1);
    let started = register_sum(&server);
    eventually("the new worker sleeps", || server.stats().sleeps == 1);
    {
        let _kernel = server.user();
        let client = mailbox.client();
        let port = suspended(&client, Opcode::user(1), &started);
        // The kernel dies midway: its port is never closed.
        std::mem::forget(port);
    }
    eventually("the worker sleeps again", || server.stats().sleeps == 2);
    assert_eq!(server.stats().abandoned, 1, "the gone kernel's exchange");
    detach_within_bound("detach after the worker slept", &server, &mailbox);
    let _ = server.shutdown().unwrap();
}

/// `detach` of a mailbox on which an exchange waits for a client that never answers (while its
/// kernel runs) returns: the mailbox is marked detached, so the worker abandons the exchange
/// and lets go of the memory, untouched.
#[test]
fn detach_ends_an_exchange_waiting_on_the_mailbox_and_returns() {
    let (server, mailbox) = serving("detach-in-flight", 1, 1);
    let started = register_sum(&server);
    let _kernel = server.user();
    let client = mailbox.client();
    let port = suspended(&client, Opcode::user(1), &started);
    detach_within_bound("detach with an exchange in flight", &server, &mailbox);
    assert_eq!(server.stats().abandoned, 1);
    drop(port);
}

/// A request sent after `register` returned is served by the new handler even when the pass
/// that meets it began, and took its copy of the registry, before the registration (it was
/// answered as an unknown opcode: found by the ASan run of `services.rs`, whose tests register
/// while the worker runs). Made certain here: the handler of port 0 registers the new opcode
/// from the worker itself, midway through the pass, and waits there until port 1's request
/// with it has been sent, so the same pass meets that request next.
#[test]
fn a_handler_registered_midway_through_a_pass_serves_the_requests_sent_after() {
    const FIRST: Opcode = Opcode::user(30);
    const LATE: Opcode = Opcode::user(31);
    let server = Arc::new(RpcServer::new(config("mid-pass")));
    let mailbox = Mailbox::attach(&server, 2, 1);
    let (registered_tx, registered) = std::sync::mpsc::channel::<()>();
    let (sent, sent_rx) = std::sync::mpsc::channel::<()>();
    let sent_rx = Arc::new(std::sync::Mutex::new(sent_rx));
    let weak = Arc::downgrade(&server);
    server.register(FIRST, move |mut req| {
        let (weak, registered, sent) = (weak.clone(), registered_tx.clone(), sent_rx.clone());
        async move {
            req.recv(|_, _| {}).await?;
            let server = weak.upgrade().expect("the test holds the server");
            server.register_packet(LATE, |_, p| p.set_word(0, p.word(0) + 100));
            registered.send(()).unwrap();
            // The worker waits here, inside this pass, until port 1's request is sent.
            let _ = sent.lock().unwrap().recv_timeout(Duration::from_secs(60));
            req.send(|_, p| p.set_word(0, 1)).await
        }
    });
    let _ = server.start().unwrap();
    let _user = server.user();
    let wait = rpc_core::protocol::Deadline::after(Duration::from_secs(60));
    let client = mailbox.client().with_wait(&wait);
    let mut first = client.try_open_at(0, FIRST, 1).unwrap().unwrap();
    first.send(|_, p| p.set_word(0, 0)).unwrap();
    registered
        .recv_timeout(Duration::from_secs(60))
        .expect("FIRST's handler runs");
    let mut late = client.try_open_at(1, LATE, 1).unwrap().unwrap();
    late.send(|_, p| p.set_word(0, 7)).unwrap();
    sent.send(()).unwrap();
    let mut back = 0;
    late.recv(|_, p| back = p.word(0)).unwrap();
    assert_eq!(
        back, 107,
        "LATE's handler answered (7 is the request read back unanswered)"
    );
    let mut done = 0;
    first.recv(|_, p| done = p.word(0)).unwrap();
    assert_eq!(done, 1);
    assert_eq!(server.stats().unknown, 0);
}

/// `Request::yield_now` lets the other ports go first: YIELDER's exchange yields until port 1's
/// request has been served, which the server thread can only do between its polls of port 0.
#[test]
fn an_exchange_that_yields_lets_the_other_ports_be_served_meanwhile() {
    const YIELDER: Opcode = Opcode::user(32);
    const MARKER: Opcode = Opcode::user(33);
    let server = RpcServer::new(config("yield"));
    let mailbox = Mailbox::attach(&server, 2, 1);
    let marked = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let seen = marked.clone();
    server.register_packet(MARKER, move |_, p| {
        seen.store(true, std::sync::atomic::Ordering::Release);
        p.set_word(0, 1);
    });
    let started = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (flag, start_flag) = (marked.clone(), started.clone());
    server.register(YIELDER, move |mut req| {
        let (marked, started) = (flag.clone(), start_flag.clone());
        async move {
            req.recv(|_, _| {}).await?;
            started.store(true, std::sync::atomic::Ordering::Release);
            let mut yields = 0u64;
            while !marked.load(std::sync::atomic::Ordering::Acquire) {
                req.yield_now().await;
                yields += 1;
            }
            req.send(|_, p| p.set_word(0, yields)).await
        }
    });
    let _ = server.start().unwrap();
    let _user = server.user();
    let wait = rpc_core::protocol::Deadline::after(Duration::from_secs(60));
    let client = mailbox.client().with_wait(&wait);
    let mut yielder = client.try_open_at(0, YIELDER, 1).unwrap().unwrap();
    yielder.send(|_, _| {}).unwrap();
    // Port 0's exchange is yielding (it saw no mark yet): port 1 is still served.
    eventually("YIELDER's exchange starts", || {
        started.load(std::sync::atomic::Ordering::Acquire)
    });
    let mut marker = client.try_open_at(1, MARKER, 1).unwrap().unwrap();
    let mut marked_back = 0;
    marker
        .send_and_recv(|_, _| {}, |_, p| marked_back = p.word(0))
        .unwrap();
    assert_eq!(marked_back, 1);
    let mut yields = 0;
    yielder.recv(|_, p| yields = p.word(0)).unwrap();
    assert!(yields >= 1, "it yielded until port 1 was served");
    let stats = common::settled_stats(&server, mailbox.id);
    assert_eq!((stats.errors, stats.panics), (0, 0));
}

/// A script that drops its request before its first poll (it never keeps it), and one that
/// drops it midway and completes on a later poll: each hands the buffer back as its port closes
/// (the request tells the executor whether it owned the buffer whenever it is dropped), so the
/// client's next request on the port is served. Fails (an open gives up at its deadline) where
/// only a request dropped in the poll that completes its exchange is heard.
#[test]
fn a_script_that_lets_go_of_its_request_early_still_hands_the_buffer_back() {
    const IGNORES: Opcode = Opcode::user(34);
    const DROPS_MIDWAY: Opcode = Opcode::user(35);
    let server = RpcServer::new(config("early drop"));
    let mailbox = Mailbox::attach(&server, 1, 1);
    server.register(IGNORES, |_request| async { Ok(()) });
    server.register(DROPS_MIDWAY, |mut req| async move {
        req.recv(|_, _| {}).await?;
        drop(req);
        // Suspended once on nothing (not its port, not a yield): it completes on a later poll.
        let mut polled = false;
        std::future::poll_fn(|_| {
            if std::mem::replace(&mut polled, true) {
                std::task::Poll::Ready(())
            } else {
                std::task::Poll::Pending
            }
        })
        .await;
        Ok(())
    });
    let _ = server.start().unwrap();
    let _user = server.user();
    let wait = Deadline::after(Duration::from_secs(60));
    let client = mailbox.client().with_wait(&wait);
    for opcode in [IGNORES, DROPS_MIDWAY, IGNORES, DROPS_MIDWAY] {
        let mut port = client.open(opcode, 1).expect("the port was handed back");
        port.send(|_, p| p.set_word(0, 1)).unwrap();
    }
    assert_eq!(increment(&client, Opcode::TEST_INCREMENT, 41), 42);
    let stats = common::settled_stats(&server, mailbox.id);
    assert_eq!((stats.errors, stats.panics, stats.abandoned), (0, 0, 0));
}

#[test]
fn each_request_receives_only_its_own_bytes_though_buffers_are_reused() {
    // `recv_n` fills buffers a finished exchange left (`recycle.rs`): a request after a
    // longer one, or with fewer lanes, must see exactly its own strings.
    let server = RpcServer::new(config("recycled"));
    let seen: Arc<std::sync::Mutex<Vec<Vec<Vec<u8>>>>> = Arc::default();
    let record = seen.clone();
    server.register(Opcode::user(9), move |mut req| {
        let record = record.clone();
        async move {
            let received = req.recv_n().await?;
            record.lock().unwrap().push(received.to_vec());
            req.send(|lane, p| p.set_word(0, u64::from(lane))).await
        }
    });
    let mailbox = Mailbox::attach(&server, 1, 32);
    let _ = server.start().unwrap();
    let _kernel = server.user_for(mailbox.id);
    let client = mailbox.client();
    // (lane, length) per active lane; the other lanes' strings are empty.
    let request = |lanes: &[(usize, usize)]| -> (u64, Vec<Vec<u8>>) {
        let mut data = std::vec![Vec::new(); 32];
        let mut mask = 0;
        for &(lane, len) in lanes {
            data[lane] = (0..len).map(|i| (lane * 7) as u8 ^ i as u8).collect();
            mask |= 1 << lane;
        }
        (mask, data)
    };
    let requests = [
        request(&[(0, 300), (1, 200), (2, 100), (31, 64)]),
        request(&[(0, 3)]),
        request(&[(1, 0), (2, 70)]),
        request(&[(0, 57), (5, 1), (31, 2)]),
    ];
    for _ in 0..scaled(3, 1) {
        for (mask, data) in &requests {
            let mut port = client.open(Opcode::user(9), *mask).unwrap();
            let slices: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
            port.send_n(&slices).unwrap();
            port.recv(|_, _| {}).unwrap();
        }
    }
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), requests.len() * scaled(3, 1));
    for (got, (_, sent)) in seen.iter().zip(requests.iter().cycle()) {
        assert_eq!(got.as_slice(), sent.as_slice());
    }
}

/// Regression: when its last user left, the worker ran a last pass and then reset every
/// exchange still in flight ("no running kernel can answer"). A kernel that arrived in between
/// could have its request opened by that last pass and then reset midway: its next packet was
/// taken for a new request (the adversarial test's rare `Fixture::own` failure: OPEN_FILE's
/// mode read as a path length). Kernels here come and go back to back, each a two-packet
/// exchange, with pauses between them; every one must get its sum. Bounded in count and time;
/// a lost exchange shows as a client deadline (10 s) or a wrong sum.
#[test]
fn kernels_arriving_while_the_worker_ends_its_stretch_keep_their_exchanges() {
    let (server, mailbox) = serving("stretch", 1, 1);
    register_sum(&server);
    let wait = rpc_core::protocol::Deadline::after(Duration::from_secs(10));
    let client = mailbox.client().with_wait(&wait);
    let until = Instant::now() + Duration::from_secs(if cfg!(miri) { 1 } else { 5 });
    let mut kernels = 0u64;
    while kernels < scaled(20_000, 20) as u64 && Instant::now() < until {
        let kernel = server.user();
        let mut port = client.open(Opcode::user(1), 1).unwrap();
        port.send(|_, p| p.set_word(0, kernels)).unwrap();
        let mut sum = 0;
        port.send_and_recv(|_, p| p.set_word(0, 1), |_, p| sum = p.word(0))
            .unwrap();
        assert_eq!(sum, kernels + 1, "kernel {kernels}");
        drop(port);
        drop(kernel);
        kernels += 1;
        // A pause of 0-400 µs (pseudo-random): the worker notices that no user is left
        // only after its back-off, so the next kernel arrives before, during or after the
        // end of the stretch.
        let pause = Duration::from_micros(kernels.wrapping_mul(0x9E37_79B9) % 400);
        let from = Instant::now();
        while from.elapsed() < pause {
            thread::yield_now();
        }
    }
    // The last kernel's exchange is counted (abandoned or not) after its reply.
    let stats = common::settled_stats(&server, mailbox.id);
    assert_eq!(stats.abandoned, 0, "after {kernels} kernels");
}

/// Many exchanges in flight at once, as from a pipelining client or many warps: the worker's
/// passes that begin with two or more then publish their hand-overs and unlocks in batches
/// (`protocol::deferred`). Four client threads run TEST_INTERFACE (every send/recv adjacency,
/// so acknowledgements among them) and TEST_STREAM echoes of 1 to 5 packets each way: every
/// answer must be right, every exchange served once, no port left locked.
#[test]
fn many_exchanges_in_flight_are_each_served_whole() {
    // How long one round (two exchanges) may wait for its answers before the test fails: a
    // hang guard, renewed each round so that it never measures the speed of the rounds before
    // (beside busy processes on the same cores a whole thread's rounds took 6-7.5 s); miri
    // interprets the server thread some thousand times slower.
    const PATIENCE: Duration = Duration::from_secs(if cfg!(miri) { 600 } else { 60 });
    const THREADS: u64 = 4;
    let rounds = scaled(300, 1) as u64;
    let (server, mailbox) = serving("in-flight", 64, 1);
    let _user = server.user_for(mailbox.id);
    thread::scope(|scope| {
        for t in 0..THREADS {
            let mailbox = &mailbox;
            scope.spawn(move || {
                for round in 0..rounds {
                    // A hand-over never published fails the test rather than hanging it.
                    let wait = Deadline::after(PATIENCE);
                    let client = mailbox.client().with_wait(&wait);
                    let mut port = client.open(Opcode::TEST_INTERFACE, 1).unwrap();
                    // TEST_INTERFACE: the client's part, each number one more than the last.
                    let end_with_recv = round % 2 == 0;
                    let mut count = 100 * t + round;
                    port.send(|_, p| p.set_word(0, end_with_recv as u64))
                        .unwrap();
                    port.send(|_, p| p.set_word(0, count)).unwrap();
                    let mut step = |send: bool| {
                        if send {
                            count += 1;
                            port.send(|_, p| p.set_word(0, count)).unwrap();
                        } else {
                            port.recv(|_, p| {
                                assert_eq!(p.word(0), count + 1, "thread {t} round {round}");
                                count += 1;
                            })
                            .unwrap();
                        }
                    };
                    for send in [false, true, false, true, true, false, false, end_with_recv] {
                        step(send);
                    }
                    drop(port);
                    let data: Vec<u8> = (0..1 + (t * 97 + round * 31) % 300)
                        .map(|i| (i ^ t ^ round) as u8)
                        .collect();
                    let mut port = client.open(Opcode::TEST_STREAM, 1).unwrap();
                    port.send_n(&[&data]).unwrap();
                    let back = port.recv_n(u64::MAX).unwrap();
                    assert_eq!(back[0], data, "thread {t} round {round}");
                }
            });
        }
    });
    let each = THREADS * rounds;
    let stats = common::settled_stats(&server, mailbox.id);
    assert_eq!(stats.served_of(Opcode::TEST_STREAM), each);
    assert_eq!(stats.served_of(Opcode::TEST_INTERFACE), each);
    assert_eq!((stats.errors, stats.abandoned, stats.panics), (0, 0, 0));
    // Every port was handed back and unlocked: each serves one more request.
    let wait = Deadline::after(PATIENCE);
    let client = mailbox.client().with_wait(&wait);
    for k in 0..64 {
        let port = std::cell::RefCell::new(None);
        eventually("the port is the client's again", || {
            *port.borrow_mut() = client.try_open_at(k, Opcode::TEST_INCREMENT, 1).unwrap();
            port.borrow().is_some()
        });
        let mut port = port.into_inner().unwrap();
        let mut got = 0;
        port.send_and_recv(|_, p| p.set_word(0, k.into()), |_, p| got = p.word(0))
            .unwrap();
        assert_eq!(got, u64::from(k) + 1, "port {k}");
    }
    drop(_user);
    let _ = server.shutdown().unwrap();
}

/// A mailbox is drained (`wait_drained`, what `PluginRuntime::synchronize` waits for) only once
/// every request the server began on it is counted: a script whose reply has gone to the client
/// but which has not ended yet (here it waits on an I/O thread for the test's word) keeps it
/// undrained, and once it ends the count is there. Before, `wait_drained` looked only at the
/// flags: the reply made the port look idle, so a caller read the statistics before the request
/// was counted (`served_of` one short after `synchronize`, now and then).
#[test]
fn a_mailbox_is_drained_only_once_its_last_request_is_counted() {
    const ECHO: Opcode = Opcode::user(0x51);
    let server = RpcServer::new(config("drained"));
    let (go, wait) = std::sync::mpsc::channel::<()>();
    let wait = Arc::new(std::sync::Mutex::new(wait));
    server.register(ECHO, move |mut req| {
        let wait = wait.clone();
        async move {
            req.recv_and_send(|_, p| p.set_word(0, p.word(0) + 1))
                .await?;
            // After the reply: the client has its answer and goes on.
            req.blocking(move |_| wait.lock().unwrap().recv().unwrap())
                .await?;
            Ok(())
        }
    });
    let mailbox = Mailbox::attach(&server, 2, 1);
    let _user = server.user();
    let _ = server.start().unwrap();
    let deadline = Deadline::after(Duration::from_secs(60));
    let client = mailbox.client().with_wait(&deadline);
    for round in 1..=scaled(20, 2) as u64 {
        assert_eq!(increment(&client, ECHO, round), round + 1);
        assert!(
            !server.wait_drained(mailbox.id, Duration::ZERO),
            "round {round}: drained while its request was not counted"
        );
        assert_eq!(server.stats().served_of(ECHO), round - 1);
        go.send(()).unwrap();
        assert!(server.wait_drained(mailbox.id, Duration::from_secs(60)));
        assert_eq!(server.stats().served_of(ECHO), round, "round {round}");
    }
}

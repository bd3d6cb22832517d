//! loom models of the `ServerThread` state machine (see `server_thread.rs`).

use std::boxed::Box;
use std::vec::Vec;

use crate::protocol::loom::{increment, spinning_client};
use crate::protocol::{Generation, Layout, LockTable, MailboxMemory};
use crate::server::AttachOptions;
use crate::sync::{thread, Arc};
use crate::{Opcode, RpcServer, ServerConfig, ServerError, ShutdownPolicy, Started, Stopped};

fn server() -> Arc<RpcServer> {
    Arc::new(RpcServer::new(ServerConfig::default()))
}

/// A server with a mailbox of one port and one lane, started.
fn started_with_one_port() -> (Arc<RpcServer>, Arc<MailboxMemory>) {
    let server = server();
    let memory = Arc::new(MailboxMemory::new(
        Layout::new(Generation::V1, 1, 1).unwrap(),
    ));
    server.attach(Box::new(memory.clone()), AttachOptions::default());
    assert_eq!(server.start().unwrap(), Started::Started);
    (server, memory)
}

#[test]
fn concurrent_start_shutdown_start() {
    loom::model(|| {
        let server = server();
        let threads: Vec<_> = (0..2)
            .map(|t| {
                let server = server.clone();
                thread::spawn(move || {
                    let _ = server.start().unwrap();
                    if t == 0 {
                        let _ = server.shutdown().unwrap();
                    }
                })
            })
            .collect();
        let _ = server.start().unwrap();
        threads.into_iter().for_each(|t| t.join().unwrap());
        assert!(
            server.stats().max_live_workers <= 1,
            "two workers alive at once"
        );
        let _ = server.shutdown().unwrap();
        assert_eq!(server.stats().live_workers, 0);
        assert!(!server.is_running());
        assert_eq!(server.shutdown().unwrap(), Stopped::AlreadyStopped);
    });
}

#[test]
fn a_user_arriving_as_the_worker_goes_to_sleep_is_served() {
    loom::model(|| {
        let (server, memory) = started_with_one_port();
        let client = {
            let (server, memory) = (server.clone(), memory.clone());
            thread::spawn(move || {
                let locks = LockTable::new(1);
                let _user = server.user();
                let client = spinning_client(&memory, &locks);
                // A lost wake-up leaves this wait spinning forever, which loom reports.
                assert_eq!(increment(&client, 41), 42);
            })
        };
        client.join().unwrap();
        let _ = server.shutdown().unwrap();
        assert_eq!(server.stats().live_workers, 0);
    });
}

#[test]
fn shutdown_while_a_guard_is_live() {
    loom::model(|| {
        let server = server();
        let _ = server.start().unwrap();
        let guard = server.user();
        assert_eq!(
            server.shutdown_with(ShutdownPolicy::Refuse),
            Err(ServerError::LiveUsers(1))
        );
        assert!(server.is_running(), "a refused shutdown keeps serving");
        let dropper = thread::spawn(move || drop(guard));
        // Waits for the guard to go (loom's timed wait never times out, so it must be woken).
        assert_eq!(
            server.shutdown_with(ShutdownPolicy::Wait(std::time::Duration::from_secs(1))),
            Ok(Stopped::Stopped)
        );
        dropper.join().unwrap();
        assert_eq!(server.stats().live_workers, 0);
    });
}

#[test]
fn a_request_of_a_user_that_came_and_went_is_still_served() {
    loom::model(|| {
        let (server, memory) = started_with_one_port();
        {
            // A kernel that sends a request needing no answer and ends before the worker looks.
            let _user = server.user();
            let locks = LockTable::new(1);
            let client = spinning_client(&memory, &locks);
            client
                .open(Opcode::NOOP, 1)
                .unwrap()
                .send(|_, _| {})
                .unwrap();
        }
        // If the worker slept through the user, this spins forever and loom reports it.
        while server.stats().served_of(Opcode::NOOP) == 0 {
            thread::yield_now();
        }
        let _ = server.shutdown().unwrap();
    });
}

/// Two shutdowns at once: each returns only once the worker has exited (the one that finds
/// the other stopping waits for it in `settle`), and exactly one of them stopped it.
#[test]
fn concurrent_shutdowns_both_return_after_the_worker_exited() {
    loom::model(|| {
        let server = server();
        assert_eq!(server.start().unwrap(), Started::Started);
        let other = {
            let server = server.clone();
            thread::spawn(move || {
                let stopped = server.shutdown().unwrap();
                assert_eq!(
                    server.stats().live_workers,
                    0,
                    "shutdown returned before the worker exited"
                );
                stopped
            })
        };
        let mine = server.shutdown().unwrap();
        assert_eq!(
            server.stats().live_workers,
            0,
            "shutdown returned before the worker exited"
        );
        let theirs = other.join().unwrap();
        let stopped = [mine, theirs]
            .iter()
            .filter(|&&s| s == Stopped::Stopped)
            .count();
        assert_eq!(stopped, 1, "one shutdown stops, the other finds it stopped");
        assert!(!server.is_running());
    });
}

/// Two users, one outliving the other: the first leaves (on another thread, at any point of
/// the second's request) and the worker still serves the second, whose guard keeps the count
/// at one; both gone, the count is zero. Catches: a guard whose drop is counted twice
/// (`remove_user` called twice: the count read 0 while the second user lived, and a worker
/// that sees no users goes to sleep).
#[test]
fn of_two_users_the_one_that_outlives_the_other_is_served() {
    loom::model(|| {
        let (server, memory) = started_with_one_port();
        let (first, second) = (server.user(), server.user());
        let leaver = thread::spawn(move || drop(first));
        let locks = LockTable::new(1);
        let client = spinning_client(&memory, &locks);
        assert_eq!(increment(&client, 1), 2);
        leaver.join().unwrap();
        assert_eq!(server.users(), 1, "the second user still lives");
        drop(second);
        assert_eq!(server.users(), 0);
        let _ = server.shutdown().unwrap();
    });
}

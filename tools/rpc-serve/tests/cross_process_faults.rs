//! A client process SIGKILLed in the middle of an exchange with `rpc-serve`: rpc-serve keeps
//! serving the other ports, gives the dead exchange up after `--client-timeout MS`, and the dead
//! port serves a new client process (with its own, fresh lock table). And SIGTERM ends
//! rpc-serve while one of its I/O threads is stuck reading its stdin, a pipe nobody writes (a
//! FIFO, which once blocked an I/O thread in `openat`, is refused at once).
//!
//! The victim is this test binary run again as a child, in `helper_client_process`.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{map, Killing};
use rpc_core::protocol::Deadline;
use rpc_core::protocol::{Client, Generation, Layout, LockTable, Mailbox};
use rpc_core::Opcode;

const CHILD_ENV: &str = "RPC_FAULT_CHILD_FILE";
const PORTS: u32 = 4;
const CLIENT_TIMEOUT_MS: u64 = 300;

fn layout() -> Layout {
    Layout::new(Generation::V2, PORTS, 1).unwrap()
}

fn view(map: &memmap2::MmapMut) -> Mailbox<'_> {
    common::view(map, layout())
}

/// Not a test of its own: when run as the child of the test below, a client that opens port 0,
/// sends the first packet of a 10000-byte TEST_STREAM, says so, and waits to be killed.
#[test]
fn helper_client_process() {
    let Ok(file) = std::env::var(CHILD_ENV) else {
        return;
    };
    let map = map(Path::new(&file));
    let locks = LockTable::new(PORTS);
    let client = Client::new(view(&map), locks.words()).unwrap();
    let mut port = client
        .try_open_at(0, Opcode::TEST_STREAM, 1)
        .unwrap()
        .expect("port 0 is free");
    port.send(|_, p| p.set_word(0, 10_000)).unwrap();
    println!("mid-exchange on port 0");
    std::io::stdout().flush().unwrap();
    std::thread::sleep(Duration::from_secs(60));
    panic!("the parent should have killed this process");
}

#[test]
fn a_client_process_killed_mid_exchange_loses_only_its_port_until_the_client_timeout() {
    let dir: PathBuf =
        std::env::temp_dir().join(format!("rpc-serve-kill-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("mailbox");
    let mut serve = Killing(
        Command::new(env!("CARGO_BIN_EXE_rpc-serve"))
            .args(["--file", file.to_str().unwrap(), "--gen", "v2"])
            .args(["--ports", &PORTS.to_string(), "--lanes", "1"])
            .args(["--client-timeout", &CLIENT_TIMEOUT_MS.to_string()])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    // rpc-serve's log lines, as they come.
    let log = common::log_lines(serve.0.stderr.take().unwrap());
    let mut serve_out = BufReader::new(serve.0.stdout.take().unwrap());
    let mut line = String::new();
    serve_out.read_line(&mut line).unwrap();
    assert!(line.starts_with("ready "), "{line}");

    // The victim: this binary again, running only the helper.
    let mut victim = Killing(
        Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "helper_client_process", "--nocapture"])
            .args(["--test-threads", "1"])
            .env(CHILD_ENV, &file)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut victim_out = BufReader::new(victim.0.stdout.take().unwrap());
    loop {
        let mut line = String::new();
        assert_ne!(
            victim_out.read_line(&mut line).unwrap(),
            0,
            "the victim ended"
        );
        if line.contains("mid-exchange on port 0") {
            break;
        }
    }
    victim.0.kill().unwrap(); // SIGKILL
    let status = victim.0.wait().unwrap();
    assert!(!status.success());

    let map = map(&file);
    // Another client process sharing the mailbox by convention: port 0 was the victim's, so its
    // lock bit is set here (two clients of one mailbox must never share a port).
    let locks = LockTable::new(PORTS);
    locks.words()[0].fetch_or(1, std::sync::atomic::Ordering::Relaxed);
    let wait = Deadline(Instant::now() + Duration::from_secs(10));
    let client = Client::new(view(&map), locks.words())
        .unwrap()
        .with_wait(&wait);
    let mut port = client.open(Opcode::TEST_INCREMENT, 1).unwrap();
    assert_ne!(port.index(), 0);
    let mut got = 0;
    port.send_and_recv(|_, p| p.set_word(0, 41), |_, p| got = p.word(0))
        .unwrap();
    drop(port);
    assert_eq!(got, 42);
    // The other ports were served at once: the dead exchange is only suspended. Once the client
    // timeout has passed with no packet from the victim, the worker gives the dead exchange up
    // (and says so): a new client process, with fresh lock bits, may then use port 0 again. (Not
    // before: port 0 looks free from outside while the server waits for the victim's next
    // packet, which a new client's request would be taken for.)
    loop {
        let line = log
            .recv_timeout(Duration::from_secs(30))
            .expect("rpc-serve never gave the dead exchange up");
        if line.contains("port 0") && line.contains("the client timed out") {
            break;
        }
    }
    let fresh = LockTable::new(PORTS);
    // A deadline of its own: the first client's was counting while we waited for the timeout.
    let fresh_wait = Deadline(Instant::now() + Duration::from_secs(60));
    let client = Client::new(view(&map), fresh.words())
        .unwrap()
        .with_wait(&fresh_wait);
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut port = loop {
        if let Some(port) = client.try_open_at(0, Opcode::TEST_STREAM, 1).unwrap() {
            break port;
        }
        assert!(Instant::now() < deadline, "port 0 never reset");
        std::thread::sleep(Duration::from_millis(5));
    };
    let data: Vec<u8> = (0..1000u32).map(|i| (i * 13) as u8).collect();
    port.send_n(&[&data]).unwrap();
    let back = port.recv_n(1 << 20).unwrap();
    drop(port);
    assert_eq!(back[0], data);

    // SIGTERM: rpc-serve stops cleanly and reports the one abandoned exchange.
    let rest = stop(&mut serve, &mut serve_out);
    assert!(rest.contains("abandoned=1 "), "{rest}");
    assert!(rest.contains("panics=0 "), "{rest}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// SIGTERM to `serve`: it stops cleanly; what it printed after that (its statistics), from
/// `out`.
fn stop(serve: &mut Killing, out: &mut impl Read) -> String {
    common::sigterm(&serve.0);
    let status = serve.0.wait().unwrap();
    assert!(status.success(), "rpc-serve exited with {status}");
    let mut rest = String::new();
    out.read_to_string(&mut rest).unwrap();
    rest
}

/// The thread of process `pid` named `name` (as the kernel shortens it) blocked in the system
/// call `number`, if any.
fn thread_in_syscall(pid: u32, name: &str, number: u32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    tasks.flatten().any(|task| {
        let read = |file: &str| std::fs::read_to_string(task.path().join(file)).unwrap_or_default();
        read("comm").trim() == name
            && read("syscall").split(' ').next() == Some(number.to_string().as_str())
    })
}

#[test]
fn sigterm_ends_rpc_serve_while_an_io_thread_is_stuck_reading_stdin() {
    let dir: PathBuf =
        std::env::temp_dir().join(format!("rpc-serve-stdin-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("mailbox");
    let fifo = dir.join("fifo");
    common::mkfifo(&fifo);
    let mut serve = Killing(
        Command::new(env!("CARGO_BIN_EXE_rpc-serve"))
            .args(["--file", file.to_str().unwrap(), "--gen", "v2"])
            .args(["--ports", &PORTS.to_string(), "--lanes", "1"])
            .args(["--files", "all"])
            // A pipe this test holds open and never writes.
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let _stdin = serve.0.stdin.take().unwrap();
    let mut serve_out = BufReader::new(serve.0.stdout.take().unwrap());
    let mut line = String::new();
    serve_out.read_line(&mut line).unwrap();
    assert!(line.starts_with("ready "), "{line}");
    let map = map(&file);
    let locks = LockTable::new(PORTS);
    let wait = Deadline(Instant::now() + Duration::from_secs(30));
    let client = Client::new(view(&map), locks.words())
        .unwrap()
        .with_wait(&wait);
    // fopen(fifo, "r") once blocked until a writer came, which never did: now it is answered,
    // at once, with no file.
    let mut port = client.open(Opcode::OPEN_FILE, 1).unwrap();
    let mut path = fifo.to_str().unwrap().as_bytes().to_vec();
    path.push(0);
    port.send_n(&[&path]).unwrap();
    let mut handle = u64::MAX;
    port.send_and_recv(|_, p| p.write_bytes(0, b"r\0"), |_, p| handle = p.word(0))
        .unwrap();
    drop(port);
    assert_eq!(handle, 0, "the FIFO is refused");
    // fgets on rpc-serve's stdin blocks in read on an I/O thread.
    let mut port = client
        .try_open_at(0, Opcode::READ_FGETS, 1)
        .unwrap()
        .unwrap();
    port.send(|_, p| {
        p.set_word(0, 100);
        p.set_word(1, rpc_core::protocol::STDIN);
    })
    .unwrap();
    // Until rpc-serve's I/O thread sits in read (0 on x86-64), the other ports serve.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !thread_in_syscall(serve.0.id(), "rpc-rpc-serve-i", 0) {
        assert!(Instant::now() < deadline, "stdin was never read");
        let mut other = client.open(Opcode::TEST_INCREMENT, 1).unwrap();
        assert_ne!(other.index(), 0);
        let mut got = 0;
        other
            .send_and_recv(|_, p| p.set_word(0, 1), |_, p| got = p.word(0))
            .unwrap();
        assert_eq!(got, 2);
    }
    std::mem::forget(port);
    let rest = stop(&mut serve, &mut serve_out);
    assert!(rest.contains("io_threads_abandoned=1"), "{rest}");
    assert!(rest.contains(" refused=1 "), "{rest}");
    std::fs::remove_dir_all(&dir).unwrap();
}

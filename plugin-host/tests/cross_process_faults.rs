//! A client process SIGKILLed in the middle of an exchange with `rpc-serve`: with
//! `--client-timeout MS`, rpc-serve gives the dead exchange up after MS, keeps serving the
//! other ports, and the dead port serves a new client process (with its own, fresh lock table).
//!
//! The victim is this test binary run again as a child, in `helper_client_process`.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rpc_core::port::Deadline;
use rpc_core::{Client, Generation, Layout, LockTable, Mailbox, Opcode};

const CHILD_ENV: &str = "RPC_FAULT_CHILD_FILE";
const PORTS: u32 = 4;
const CLIENT_TIMEOUT_MS: u64 = 300;

fn layout() -> Layout {
    Layout::new(Generation::V2, PORTS, 1).unwrap()
}

fn map(file: &Path) -> memmap2::MmapMut {
    let handle = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(file)
        .unwrap();
    // SAFETY: the mapping lives as long as the returned value; this process accesses it only
    // through atomic views.
    unsafe { memmap2::MmapMut::map_mut(&handle) }.unwrap()
}

fn view(map: &memmap2::MmapMut) -> Mailbox<'_> {
    // SAFETY: the mapping outlives the view; accessed only atomically in this process.
    unsafe { Mailbox::from_raw(map.as_ptr() as *mut u8, map.len(), layout()) }.unwrap()
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

struct Killing(Child);

impl Drop for Killing {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
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
            .spawn()
            .unwrap(),
    );
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
    let killed_at = Instant::now();

    let map = map(&file);
    // Another client process sharing the mailbox by convention: port 0 was the victim's, so its
    // lock bit is set here (two clients of one mailbox must never share a port).
    let locks = LockTable::new(PORTS);
    locks.words()[0].fetch_or(1, rpc_core::sync::Ordering::Relaxed);
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
    // The worker waited on the dead port for at most the client timeout before this was served.
    let served_after = killed_at.elapsed();
    assert!(
        served_after < Duration::from_millis(CLIENT_TIMEOUT_MS) + Duration::from_secs(5),
        "{served_after:?}"
    );

    // Once the client timeout has passed with no packet from the victim, the worker has given
    // the dead exchange up: a new client process, with fresh lock bits, may use port 0 again.
    std::thread::sleep(Duration::from_millis(3 * CLIENT_TIMEOUT_MS));
    let fresh = LockTable::new(PORTS);
    let client = Client::new(view(&map), fresh.words())
        .unwrap()
        .with_wait(&wait);
    let mut port = client
        .try_open_at(0, Opcode::TEST_STREAM, 1)
        .unwrap()
        .expect("port 0 is free again");
    let data: Vec<u8> = (0..1000u32).map(|i| (i * 13) as u8).collect();
    port.send_n(&[&data]).unwrap();
    let back = port.recv_n(1 << 20).unwrap();
    drop(port);
    assert_eq!(back[0], data);

    // SIGTERM: rpc-serve stops cleanly and reports the one abandoned exchange.
    // SAFETY: kill has no memory-safety preconditions.
    assert_eq!(unsafe { libc::kill(serve.0.id() as i32, libc::SIGTERM) }, 0);
    let status = serve.0.wait().unwrap();
    assert!(status.success(), "rpc-serve exited with {status}");
    let mut rest = String::new();
    serve_out.read_to_string(&mut rest).unwrap();
    assert!(rest.contains("abandoned=1 "), "{rest}");
    assert!(rest.contains("panics=0 "), "{rest}");
    std::fs::remove_dir_all(&dir).unwrap();
}

//! No port of `rpc-serve` is lost to a refused or a slow client, seen from another process
//! (PROTOCOL section 11):
//! - a stream claim above the bound on every opcode that streams is answered to the end of its
//!   script with the opcode's failure word, and the same port then serves a TEST_INCREMENT;
//!   eight such claims on eight ports at once, and then all eight serve;
//! - a slow but honest client, whose next packet comes after `--client-timeout`: that late
//!   packet is answered and never run (nothing reaches `--stdout`), and the port serves again.
//!
//! Every wait is on a condition (a reply, a log line, an exit); the durations are liveness
//! bounds only, so that a broken rpc-serve fails the test instead of hanging it.

mod common;

use std::io::BufReader;
use std::path::Path;
use std::process::{Command, Stdio};

use common::{log_lines, read_ready, scratch, sigterm, wait_exit, wait_for_line, Killing, BOUND};
use rpc_core::protocol::{Client, ClientPort, Deadline, Generation, Layout, LockTable};
use rpc_core::Opcode;
use workloads::claims::{claim, finish_claim, finish_string, increment_at, start_string};
use workloads::claims::{string_first, write_stdout_at};

const PORTS: u32 = 8;
fn layout() -> Layout {
    Layout::new(Generation::V2, PORTS, 1).unwrap()
}

/// rpc-serve over a memfd of [`layout`], the device's output in `dir`, with `args`.
struct Serve {
    child: Killing,
    stdout: BufReader<std::process::ChildStdout>,
    log: std::sync::mpsc::Receiver<String>,
    map: memmap2::MmapMut,
}

fn serve(dir: &Path, args: &[&str]) -> Serve {
    let mut child = Killing(
        Command::new(env!("CARGO_BIN_EXE_rpc-serve"))
            .args(["--gen", "v2", "--ports", &PORTS.to_string(), "--lanes", "1"])
            .args(["--files", dir.to_str().unwrap()])
            .args(["--stdout", dir.join("out").to_str().unwrap()])
            .args(["--stderr", dir.join("err").to_str().unwrap()])
            .args(args)
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let log = log_lines(child.0.stderr.take().unwrap());
    let mut stdout = BufReader::new(child.0.stdout.take().unwrap());
    let (path, bytes) = read_ready(&mut stdout);
    assert_eq!(bytes, layout().total_size());
    let map = common::map(&path);
    Serve {
        child,
        stdout,
        log,
        map,
    }
}

impl Serve {
    /// SIGTERM; rpc-serve's statistics line once it exited cleanly.
    fn stop(mut self) -> String {
        drop(self.map);
        sigterm(&self.child.0);
        let status = wait_exit(&mut self.child.0, BOUND);
        assert_eq!(status.code(), Some(0), "rpc-serve exited with {status}");
        let mut rest = String::new();
        std::io::Read::read_to_string(&mut self.stdout, &mut rest).unwrap();
        assert!(rest.contains("stopped: served="), "{rest}");
        rest
    }
}

#[test]
fn over_long_claims_on_every_send_n_opcode_and_on_eight_ports_lose_no_port() {
    let dir = scratch("ports-claims");
    let serve = serve(&dir, &[]);
    let locks = LockTable::new(PORTS);
    let wait = Deadline::after(BOUND);
    let client = Client::new(common::view(&serve.map, layout()), locks.words())
        .unwrap()
        .with_wait(&wait);
    let string_first = string_first();
    for (k, &opcode) in string_first.iter().enumerate() {
        let port = claim(&client, 0, opcode);
        assert_eq!(finish_claim(port), opcode.failure_word(), "{opcode}");
        assert_eq!(increment_at(&client, 0, k as u64), k as u64 + 1, "{opcode}");
    }
    let ports: Vec<ClientPort<'_>> = (0..PORTS)
        .map(|index| claim(&client, index, string_first[index as usize]))
        .collect();
    for (index, port) in ports.into_iter().enumerate() {
        assert_eq!(finish_claim(port), string_first[index].failure_word());
    }
    for index in 0..PORTS {
        assert_eq!(increment_at(&client, index, 100), 101, "port {index}");
    }
    let stats = serve.stop();
    let claims = string_first.len() + PORTS as usize;
    let increments = string_first.len() + PORTS as usize;
    assert!(stats.contains(&format!("served={increments} ")), "{stats}");
    assert!(stats.contains(&format!("errors={claims} ")), "{stats}");
    assert!(stats.contains("panics=0 "), "{stats}");
    for name in ["out", "err"] {
        let bytes = std::fs::read(dir.join(name)).unwrap();
        assert!(
            bytes.is_empty(),
            "{name}: {:?}",
            String::from_utf8_lossy(&bytes)
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_slow_clients_late_packets_are_never_run_and_its_port_serves_again() {
    let dir = scratch("ports-slow");
    let serve = serve(&dir, &["--client-timeout", "50"]);
    let locks = LockTable::new(PORTS);
    let wait = Deadline::after(BOUND);
    let client = Client::new(common::view(&serve.map, layout()), locks.words())
        .unwrap()
        .with_wait(&wait);
    let data: Vec<u8> = (0..200u32).map(|i| b'a' + (i % 26) as u8).collect();
    for opcode in [Opcode::WRITE_TO_STDOUT, Opcode::TEST_STREAM] {
        let port = start_string(&client, 0, opcode, &data);
        // The rest only once rpc-serve has given the exchange up.
        let line = wait_for_line(&serve.log, "the client timed out", BOUND);
        assert!(line.contains("port 0"), "{line}");
        assert_eq!(
            finish_string(port, &data),
            0,
            "{opcode}: 0 bytes written, or an empty echo"
        );
        assert_eq!(increment_at(&client, 0, 41), 42, "{opcode}");
    }
    // A write on that port prints again.
    assert_eq!(write_stdout_at(&client, 0, b"again\n"), 6);
    let stats = serve.stop();
    // The three requests served are the two increments and the last write; the abandoned
    // exchanges and their late packets ran nothing.
    assert!(stats.contains("served=3 "), "{stats}");
    assert!(stats.contains("abandoned=2 "), "{stats}");
    assert_eq!(std::fs::read(dir.join("out")).unwrap(), b"again\n");
    std::fs::remove_dir_all(&dir).unwrap();
}

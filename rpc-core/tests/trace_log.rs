//! `RUST_LOG=trace` shows each packet of an exchange: the server's name, the mailbox, the port,
//! the opcode and what moved. Its own test binary: it installs a logger that keeps the lines.
#![cfg(not(loom))]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use rpc_core::protocol::{Client, Deadline, Generation, Layout, LockTable, MailboxMemory};
use rpc_core::{Opcode, RpcServer, ServerConfig};

static LINES: Mutex<Vec<String>> = Mutex::new(Vec::new());

struct Keeping;

impl log::Log for Keeping {
    fn enabled(&self, _: &log::Metadata) -> bool {
        true
    }
    fn log(&self, record: &log::Record) {
        if record.level() == log::Level::Trace {
            let line = record.args().to_string();
            LINES.lock().unwrap_or_else(|e| e.into_inner()).push(line);
        }
    }
    fn flush(&self) {}
}

#[test]
fn trace_lines_show_every_packet_of_an_exchange() {
    log::set_logger(&Keeping).unwrap();
    log::set_max_level(log::LevelFilter::Trace);
    let server = RpcServer::new(ServerConfig {
        name: "traced".into(),
        ..ServerConfig::default()
    });
    let memory = Arc::new(MailboxMemory::new(
        Layout::new(Generation::V1, 2, 1).unwrap(),
    ));
    let id = server.attach(Box::new(memory.clone()));
    let _ = server.start().unwrap();
    let user = server.user();
    let locks = LockTable::new(2);
    let deadline = Deadline::after(Duration::from_secs(120));
    let client = Client::new(memory.view(), locks.words())
        .unwrap()
        .with_wait(&deadline);
    let data = vec![7u8; 100];
    let mut port = client.open(Opcode::TEST_STREAM, 1).unwrap();
    port.send_n(&[&data]).unwrap();
    let back = port.recv_n(1 << 20).unwrap();
    assert_eq!(back[0], data);
    let index = port.index();
    drop(port);
    // The worker logs a packet's line right after handing the packet over, in the same
    // poll: once it has exited, every line of the exchange is in.
    drop(user);
    let _ = server.shutdown().unwrap();

    let lines = LINES.lock().unwrap().clone();
    let prefix = format!("traced: mailbox {} port {index}: TEST_STREAM", id.0);
    for what in [
        "received a stream (longest lane 100 bytes)",
        "sent a stream (longest lane 100 bytes)",
    ] {
        let want = format!("{prefix} ({:#x}): {what}", Opcode::TEST_STREAM.0);
        assert!(
            lines
                .iter()
                .any(|l| l.starts_with(&prefix) && l.ends_with(what)),
            "no line `{want}` in {lines:#?}"
        );
    }
}

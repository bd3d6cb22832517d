//! `RUST_LOG=trace` shows each packet of an exchange: the server's name, the mailbox, the port,
//! the opcode and what moved. Its own test binary: it installs a logger that keeps the lines.
#![cfg(not(loom))]

mod common;

use common::Mailbox;
use rpc_core::{Opcode, RpcServer, ServerConfig};

#[test]
fn trace_lines_show_every_packet_of_an_exchange() {
    common::keep_log_lines(log::LevelFilter::Trace);
    let server = RpcServer::new(ServerConfig {
        name: "traced".into(),
        ..ServerConfig::default()
    });
    let mailbox = Mailbox::attach(&server, 2, 1);
    let _ = server.start().unwrap();
    let user = server.user();
    let deadline = common::hang_guard();
    let client = mailbox.client().with_wait(&deadline);
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

    let lines = common::logged();
    let prefix = format!("traced: mailbox {} port {index}: TEST_STREAM", mailbox.id.0);
    for what in [
        "received byte strings (longest lane 100 bytes)",
        "sent byte strings (longest lane 100 bytes)",
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

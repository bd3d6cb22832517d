//! A client that makes byte-string claims no server may take at its word, and the one-port
//! requests that show a port still serves after: the client side of the abandoned-port tests
//! (PROTOCOL section 11), in process (`rpc-core/tests/abandoned_ports.rs`) and across
//! processes (`tools/rpc-serve/tests/cross_process_ports.rs`).

use rpc_core::protocol::{Client, ClientPort, FIRST_PACKET_BYTES};
use rpc_core::Opcode;

/// A claim no server may take at its word.
pub const CLAIM: u64 = 1 << 62;

/// Every opcode whose script begins (after a stream handle, for the `_STREAM` ones) with a
/// byte string from the client (`send_n`).
pub fn string_first() -> Vec<Opcode> {
    let mut all = vec![
        Opcode::WRITE_TO_STDOUT,
        Opcode::WRITE_TO_STDERR,
        Opcode::WRITE_TO_STREAM,
        Opcode::WRITE_TO_STDOUT_NEWLINE,
        Opcode::OPEN_FILE,
        Opcode::HOST_CALL,
        Opcode::OFFLOAD_HOST_CALL,
    ];
    all.extend(Opcode::PRINTF);
    all.extend([
        Opcode::REMOVE,
        Opcode::RENAME,
        Opcode::SYSTEM,
        Opcode::TEST_STREAM,
    ]);
    all
}

/// Opens `opcode` on port `index`, which must be free.
pub fn open<'a>(client: &Client<'a>, index: u32, opcode: Opcode) -> ClientPort<'a> {
    client
        .try_open_at(index, opcode, 1)
        .unwrap()
        .unwrap_or_else(|| panic!("port {index} is not free for {opcode}"))
}

/// TEST_INCREMENT of `x` on port `index`, which must be free: the reply.
pub fn increment_at(client: &Client<'_>, index: u32, x: u64) -> u64 {
    increment_lanes(&mut open(client, index, Opcode::TEST_INCREMENT), x)[0]
}

/// TEST_INCREMENT on `port`, opened for it, each lane sending `x + lane`: each lane's reply
/// (`x + lane + 1` from a server that serves it).
pub fn increment_lanes(port: &mut ClientPort<'_>, x: u64) -> [u64; 64] {
    let mut got = [0u64; 64];
    port.send_and_recv(
        |l, p| p.set_word(0, x + u64::from(l)),
        |l, p| got[l as usize] = p.word(0),
    )
    .unwrap();
    got
}

/// WRITE_TO_STDOUT of `text` on port `index`, which must be free: the reply (bytes written).
pub fn write_stdout_at(client: &Client<'_>, index: u32, text: &[u8]) -> u64 {
    let mut port = open(client, index, Opcode::WRITE_TO_STDOUT);
    port.send_n(&[text]).unwrap();
    let mut written = 0;
    port.recv(|_, p| written = p.word(0)).unwrap();
    written
}

/// Opens `opcode` (a byte string first, with no handle before it) on port `index` and sends
/// the first packet of the byte string `data`: its length and first bytes. The server waits for the
/// rest.
pub fn start_string<'a>(
    client: &Client<'a>,
    index: u32,
    opcode: Opcode,
    data: &[u8],
) -> ClientPort<'a> {
    let mut port = open(client, index, opcode);
    port.send(|_, p| {
        p.set_word(0, data.len() as u64);
        p.write_bytes(8, &data[..FIRST_PACKET_BYTES]);
    })
    .unwrap();
    port
}

/// The rest of [`start_string`]'s byte string, after its first packet, then the reply: its word 0.
pub fn finish_string(mut port: ClientPort<'_>, data: &[u8]) -> u64 {
    for chunk in data[FIRST_PACKET_BYTES..].chunks(64) {
        port.send(|_, p| p.write_bytes(0, chunk)).unwrap();
    }
    let mut reply = None;
    port.recv(|_, p| reply = Some(p.word(0))).unwrap();
    reply.unwrap()
}

/// Opens `opcode` on port `index` and sends what its script sends first, ending with a byte
/// string whose first packet claims [`CLAIM`] bytes: the server refuses the claim there.
pub fn claim<'a>(client: &Client<'a>, index: u32, opcode: Opcode) -> ClientPort<'a> {
    let mut port = open(client, index, opcode);
    let streams = [
        Opcode::WRITE_TO_STREAM,
        Opcode::PRINTF_TO_STREAM,
        Opcode::PRINTF_TO_STREAM_PACKED,
    ];
    if streams.contains(&opcode) {
        // The stream handle (stdout, tagged), then the byte string.
        port.send(|_, p| p.set_word(0, 2)).unwrap();
    }
    port.send(|_, p| {
        p.set_word(0, CLAIM);
        p.write_bytes(8, &[b'x'; FIRST_PACKET_BYTES]);
    })
    .unwrap();
    port
}

/// The client goes on with its script as if the claim had been taken: one more packet of its
/// byte string, then it reads the reply. Returns the reply's word 0.
pub fn finish_claim(mut port: ClientPort<'_>) -> u64 {
    port.send(|_, p| p.write_bytes(0, &[b'y'; 64])).unwrap();
    let mut reply = None;
    port.recv(|_, p| reply = Some(p.word(0))).unwrap();
    reply.unwrap()
}

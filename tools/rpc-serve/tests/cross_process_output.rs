//! rpc-serve's `--stdout` is a FIFO whose reader is alive but never reads. A client writes far
//! more than the FIFO holds: rpc-serve keeps serving the other ports (it once sat in
//! `write(2)` on its server thread, and no port was answered again), and SIGTERM still ends it,
//! counting the bytes it gave up.

mod common;

use common::{layout, scratch, BOUND, PORTS};
use rpc_core::protocol::{Client, Deadline, LockTable};
use rpc_core::Opcode;

#[test]
fn a_stdout_fifo_nobody_reads_holds_no_other_port_and_sigterm_ends_rpc_serve() {
    let dir = scratch("stuck-stdout");
    std::fs::write(dir.join("x.txt"), b"x").unwrap();
    let files = ["--files", dir.to_str().unwrap()];
    let (_reader, serve) = common::serve_to_a_fifo_nobody_reads(&dir, &files);
    let map = common::map(&serve.path);
    let locks = LockTable::new(PORTS);
    let wait = Deadline::after(BOUND);
    let client = Client::new(common::view(&map, layout()), locks.words())
        .unwrap()
        .with_wait(&wait);
    // Port 0: 1 MiB to stdout, 16 times what the FIFO holds; its reply never comes.
    let blob = vec![b'o'; 1 << 20];
    let mut port = client
        .try_open_at(0, Opcode::WRITE_TO_STDOUT, 1)
        .unwrap()
        .unwrap();
    port.send_n(&[&blob]).unwrap();
    std::mem::forget(port); // Its port stays locked: the exchange is still open.
                            // The other ports are served meanwhile.
    for x in 0..1000 {
        let mut port = client.open(Opcode::TEST_INCREMENT, 1).unwrap();
        assert_ne!(port.index(), 0);
        let mut got = 0;
        port.send_and_recv(|_, p| p.set_word(0, x), |_, p| got = p.word(0))
            .unwrap();
        assert_eq!(got, x + 1);
    }
    let mut port = client.open(Opcode::OPEN_FILE, 1).unwrap();
    port.send_n(&[b"x.txt\0"]).unwrap();
    let mut handle = 0;
    port.send_and_recv(|_, p| p.write_bytes(0, b"r\0"), |_, p| handle = p.word(0))
        .unwrap();
    drop(port);
    assert_ne!(handle, 0, "OPEN_FILE answered with a file");
    // SIGTERM ends it (within the bound, which is only a guard), and it says what it gave up:
    // exit status 5, output lost.
    let (rest, log) = serve.stop_with(5);
    let lost: u64 = rest
        .split_whitespace()
        .find_map(|word| word.strip_prefix("output_lost_bytes="))
        .expect("the statistics count lost output")
        .parse()
        .unwrap();
    assert!(lost > 0 && lost <= blob.len() as u64, "{rest}");
    assert!(rest.contains(" abandoned=1 "), "{rest}");
    assert!(
        log.iter().any(|line| line.contains("device output lost")),
        "{log:?}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

//! `examples/rpc_serve_client.py`, a client written from PROTOCOL alone in another language,
//! against rpc-serve: increment, a line to stdout and a four-packet stream each way.

use std::process::Command;

#[test]
fn the_python_example_client_is_served() {
    let example = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../examples/rpc_serve_client.py"
    );
    let out = Command::new("python3")
        .arg(example)
        .arg(env!("CARGO_BIN_EXE_rpc-serve"))
        .output()
        .expect("python3 runs (the machine this is tested on has CPython)");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    for line in [
        "TEST_INCREMENT 41 -> 42",
        "WRITE_TO_STDOUT_NEWLINE wrote 19 bytes",
        "TEST_STREAM 200 bytes came back whole",
        "python client: ok",
    ] {
        assert!(stdout.contains(line), "{stdout}\n{stderr}");
    }
}

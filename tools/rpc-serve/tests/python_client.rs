//! `examples/rpc_serve_client.py`, a client written from PROTOCOL alone in another language,
//! against rpc-serve: increment, a line to stdout and a four-packet stream each way.

use std::io::Write as _;
use std::process::Command;

#[test]
fn the_python_example_client_is_served() {
    let example = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../examples/rpc_serve_client.py"
    );
    let out = match Command::new("python3")
        .arg(example)
        .arg(env!("CARGO_BIN_EXE_rpc-serve"))
        .output()
    {
        Ok(out) => out,
        // Not every machine has CPython (README lists it; `.ci/run`'s Debian has it).
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            // Straight to stderr, which the test harness does not capture: a skip is seen.
            let _ = writeln!(
                std::io::stderr(),
                "the_python_example_client_is_served: skipped: no python3 on PATH"
            );
            return;
        }
        Err(e) => panic!("python3: {e}"),
    };
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

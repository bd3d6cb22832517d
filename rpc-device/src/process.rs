//! Ending the program: [`exit`] and [`abort`] (EXIT and ABORT, PROTOCOL section 6). The host
//! decides what follows (rpc-run, as LLVM's loader: the process exits with the status, or
//! aborts); the calling thread stops for good.

use rpc_core::protocol::Opcode;

use crate::arch;
use crate::client::Port;

/// Ends the program with `status` (the first lane's, where several call it together).
pub fn exit(status: i32) -> ! {
    let mut port = Port::open(Opcode::EXIT);
    // The handshake, then the status: C send; S recv; S send; C recv; C send.
    port.send(|_| {});
    port.recv(|_| {});
    port.send(|packet| packet[0] = u64::from(status as u32));
    // The port stays locked: nothing of this program runs after it.
    core::mem::forget(port);
    arch::halt()
}

/// Ends the program abnormally.
pub fn abort() -> ! {
    let mut port = Port::open(Opcode::ABORT);
    port.send(|_| {});
    port.recv(|_| {});
    port.send(|_| {});
    core::mem::forget(port);
    arch::halt()
}

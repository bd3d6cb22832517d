//! What the tests and loom models of the passes (`dispatch.rs`) share, and the passes' own
//! tests.

/// Registers, for the tests and models of the passes, a script for `user(1)`: two packets in,
/// their sum back (the second recv suspends until the client sends it).
pub(crate) fn register_two_packet_sum(server: &crate::RpcServer) {
    server.register(crate::Opcode::user(1), |mut req| async move {
        let (mut a, mut b) = (0, 0);
        req.recv(|_, p| a = p.word(0)).await?;
        req.recv(|_, p| b = p.word(0)).await?;
        req.send(|_, p| p.set_word(0, a + b)).await
    });
}

/// Opens `opcode` on port `index` for one lane, yielding until the port is free.
pub(crate) fn open_when_free<'a>(
    client: &'a crate::protocol::Client<'a>,
    index: u32,
    opcode: crate::Opcode,
) -> crate::protocol::ClientPort<'a> {
    loop {
        if let Some(port) = client.try_open_at(index, opcode, 1).unwrap() {
            return port;
        }
        crate::sync::thread::yield_now();
    }
}

#[cfg(not(loom))]
mod tests {
    use super::*;
    use crate::protocol::opcode::Opcode;
    use crate::protocol::server_end::HOT_STRIDE;
    use crate::protocol::{Client, Generation, Layout, LockTable, MailboxMemory, Spin};
    use crate::server::dispatch::PassCache;
    use crate::server::exec::Fate;
    use crate::server::Inner;
    use crate::sync::AtomicBool;
    use crate::sync::{Arc, Ordering};
    use crate::RpcServer;

    /// Passes that yield at every quiet checkpoint, as in the loaded regime, serve every port
    /// of a mailbox of two strides, also while two exchanges wait in flight (so the passes
    /// defer their flips, which go out before each yield).
    #[test]
    fn passes_that_yield_within_the_scan_serve_every_port() {
        const PORTS: u32 = 2 * HOT_STRIDE as u32;
        let server = RpcServer::new(Default::default());
        register_two_packet_sum(&server);
        let memory = Arc::new(MailboxMemory::new(
            Layout::new(Generation::V1, PORTS, 1).unwrap(),
        ));
        server.attach(std::boxed::Box::new(memory.clone()), Default::default());
        let _user = server.user();
        let locks = LockTable::new(PORTS);
        let done = AtomicBool::new(false);
        std::thread::scope(|s| {
            s.spawn(|| {
                let mut cache = PassCache::new();
                while !done.load(Ordering::Relaxed) {
                    // A yield that ran nobody clears it; here every pass yields.
                    cache.yield_every = Some(HOT_STRIDE);
                    Inner::serve_pass(&server.inner, &mut cache);
                }
                cache.clear(&server.inner.context, Fate::Drain, "test over");
            });
            let client = Client::new(memory.view(), locks.words())
                .unwrap()
                .with_wait(&Spin);
            let waiting = [300, PORTS - 300].map(|index| {
                let mut port = open_when_free(&client, index, Opcode::user(1));
                port.send(|_, p| p.set_word(0, u64::from(index))).unwrap();
                (index, port)
            });
            for index in [0, HOT_STRIDE as u32 - 1, HOT_STRIDE as u32, PORTS - 1] {
                let mut port = open_when_free(&client, index, Opcode::TEST_INCREMENT);
                let mut got = 0;
                port.send_and_recv(
                    |_, p| p.set_word(0, u64::from(index)),
                    |_, p| got = p.word(0),
                )
                .unwrap();
                assert_eq!(got, u64::from(index) + 1, "port {index}");
            }
            for (index, mut port) in waiting {
                let mut sum = 0;
                port.send_and_recv(|_, p| p.set_word(0, 1), |_, p| sum = p.word(0))
                    .unwrap();
                assert_eq!(sum, u64::from(index) + 1, "port {index}");
            }
            done.store(true, Ordering::Relaxed);
        });
    }
}

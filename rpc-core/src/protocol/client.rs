//! The client side of the port protocol: what a GPU warp does, for host threads acting as one
//! warp each (plugin-host's kernels, tests, other processes over a shared file). `no_std`.

use crate::protocol::error::ProtocolError;
use crate::protocol::mailbox::{check_locks, try_lock, unlock, Mailbox};
use crate::protocol::opcode::Opcode;
use crate::protocol::port::{normalize, ClientPort, Port, Wait, DEFAULT_WAIT};
use crate::sync::{fence, AtomicU32, AtomicU64, Ordering};

/// A client of one mailbox. Every client thread of the mailbox must share one lock table (the
/// device-private lock bits of a GPU client); share the `Client` itself or its `locks`.
#[derive(Clone, Copy)]
pub struct Client<'a> {
    mailbox: Mailbox<'a>,
    locks: &'a [AtomicU32],
    wait: &'a dyn Wait,
    doorbell: Option<ClientDoorbell<'a>>,
}

/// The client's part of a v2 doorbell (PROTOCOL section 9): after each open, count the request
/// in `value`; on the 0 -> 1 transition store `event_id` into `mailbox` and raise the interrupt.
#[derive(Clone, Copy)]
pub struct ClientDoorbell<'a> {
    /// The open-request counter (the doorbell record's `value`).
    pub value: &'a AtomicU64,
    /// The word the event id is stored into (the record's `mailbox`).
    pub mailbox: &'a AtomicU64,
    /// The event id stored on the 0 -> 1 transition.
    pub event_id: u32,
    /// Raises the interrupt.
    pub raise: &'a (dyn Fn() + Sync),
}

impl<'a> Client<'a> {
    /// A client over `mailbox` using `locks` (at least `ceil(N / 32)` words) as its lock bits.
    pub fn new(mailbox: Mailbox<'a>, locks: &'a [AtomicU32]) -> Result<Self, ProtocolError> {
        check_locks(&mailbox, locks)?;
        Ok(Client {
            mailbox,
            locks,
            wait: &DEFAULT_WAIT,
            doorbell: None,
        })
    }

    /// Waits with `wait` instead of the default back-off (e.g. to give up after a timeout).
    pub fn with_wait(mut self, wait: &'a dyn Wait) -> Self {
        self.wait = wait;
        self
    }

    /// Rings `doorbell` after each open.
    pub fn with_doorbell(mut self, doorbell: ClientDoorbell<'a>) -> Self {
        self.doorbell = Some(doorbell);
        self
    }

    /// The mailbox this client opens ports in.
    pub fn mailbox(&self) -> &Mailbox<'a> {
        &self.mailbox
    }

    fn check_mask(&self, mask: u64) -> Result<(), ProtocolError> {
        let layout = self.mailbox.layout();
        if mask == 0 || mask & !layout.lane_mask() != 0 {
            return Err(ProtocolError::BadMask {
                mask,
                lanes: layout.lanes(),
            });
        }
        Ok(())
    }

    /// Opens a port for `opcode` with the lanes of `mask` active, scanning from port 0 and
    /// wrapping until one is free (as a GPU warp does; the wait decides whether to give up).
    pub fn open(&self, opcode: Opcode, mask: u64) -> Result<ClientPort<'a>, ProtocolError> {
        self.check_mask(mask)?;
        let mut attempt = 0;
        loop {
            for index in 0..self.mailbox.layout().ports() {
                if let Some(port) = self.open_at(index, opcode, mask) {
                    return Ok(port);
                }
            }
            self.wait.pause(u32::MAX, attempt)?;
            attempt = attempt.saturating_add(1);
        }
    }

    /// Opens port `index` if it is free and the client owns its buffer.
    pub fn try_open_at(
        &self,
        index: u32,
        opcode: Opcode,
        mask: u64,
    ) -> Result<Option<ClientPort<'a>>, ProtocolError> {
        self.check_mask(mask)?;
        if index >= self.mailbox.layout().ports() {
            return Err(ProtocolError::BadPortCount {
                ports: index,
                max: self.mailbox.layout().ports() - 1,
                generation: self.mailbox.layout().generation(),
            });
        }
        Ok(self.open_at(index, opcode, mask))
    }

    fn open_at(&self, index: u32, opcode: Opcode, mask: u64) -> Option<ClientPort<'a>> {
        let i = index as usize;
        if !try_lock(self.locks, index) {
            return None;
        }
        // Relaxed: the lock's acquire already ordered our own word; the server's word is
        // ordered by the fence below once we decide to use the port.
        let inbox = normalize(self.mailbox.primary[i].load(Ordering::Relaxed));
        let out = normalize(self.mailbox.secondary[i].load(Ordering::Relaxed));
        if inbox != out {
            // The server still owns this port's buffer (it is serving the last request).
            unlock(self.locks, index);
            return None;
        }
        // Pairs with the server's release fence before its last flip: it is done with the
        // buffers before we write the header (and later the packets).
        fence(Ordering::Acquire);
        let header = self.mailbox.header(index);
        header[0].store(mask.to_le(), Ordering::Relaxed);
        header[1].store(u64::from(opcode.0).to_le(), Ordering::Relaxed);
        if let Some(bell) = &self.doorbell {
            // RMW: one more open request (n -> n + 1). Relaxed: the counter only decides whether
            // the server sleeps; the request itself is ordered by the flip of our word.
            if bell.value.fetch_add(1, Ordering::Relaxed) == 0 {
                bell.mailbox
                    .store(u64::from(bell.event_id), Ordering::Relaxed);
                (bell.raise)();
            }
        }
        Some(Port::opened(
            &self.mailbox,
            self.locks,
            index,
            mask,
            opcode,
            out,
            self.wait,
            None,
        ))
    }
}

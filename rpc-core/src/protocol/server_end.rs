//! The server side of the port protocol over one mailbox: finding pending ports and opening
//! them. The thread that drives it is [`crate::server::thread`]; handlers run the port scripts.

use crate::protocol::error::ProtocolError;
use crate::protocol::mailbox::{lock_words, try_lock, unlock, Mailbox};
use crate::protocol::opcode::Opcode;
use crate::protocol::port::{normalize, prefetch, Port, ServerPort, Wait};
use crate::sync::{fence, AtomicU32, AtomicU64, Ordering};

/// The server's end of one mailbox. Every thread serving the mailbox must use the same `locks`,
/// or two threads can open one port.
#[derive(Clone, Copy)]
pub struct ServerEnd<'a> {
    mailbox: Mailbox<'a>,
    locks: &'a [AtomicU32],
    doorbell: Option<&'a AtomicU64>,
}

impl<'a> ServerEnd<'a> {
    /// A server over `mailbox` using `locks` (at least `ceil(N / 32)` words).
    pub fn new(mailbox: Mailbox<'a>, locks: &'a [AtomicU32]) -> Result<Self, ProtocolError> {
        let need = lock_words(mailbox.layout().ports());
        if locks.len() < need {
            return Err(ProtocolError::BadRegion {
                addr: 0,
                len: locks.len() * 4,
                need: need * 4,
            });
        }
        Ok(ServerEnd {
            mailbox,
            locks,
            doorbell: None,
        })
    }

    /// Decrements `counter` (the host view of the v2 doorbell's `value`) once per served port.
    pub fn with_doorbell(mut self, counter: &'a AtomicU64) -> Self {
        self.doorbell = Some(counter);
        self
    }

    /// The mailbox this end serves.
    pub fn mailbox(&self) -> &Mailbox<'a> {
        &self.mailbox
    }

    /// True if the client has handed port `index` to the server (`C != S`). A hint only: read
    /// without the lock, it is re-checked when the port is opened.
    #[inline]
    pub(crate) fn is_pending(&self, index: u32) -> bool {
        let i = index as usize;
        // Relaxed: a hint; `try_open` re-reads under the lock and fences.
        normalize(self.mailbox.secondary[i].load(Ordering::Relaxed))
            != normalize(self.mailbox.primary[i].load(Ordering::Relaxed))
    }

    /// Both flags of port `index` as they are (our word, the client's). Relaxed: a snapshot to
    /// compare with a later one, ordering nothing.
    pub(crate) fn flags(&self, index: u32) -> (u32, u32) {
        let i = index as usize;
        (
            self.mailbox.primary[i].load(Ordering::Relaxed),
            self.mailbox.secondary[i].load(Ordering::Relaxed),
        )
    }

    /// Closes port `index`, which the caller holds locked with its exchange ended: hands the
    /// buffer back if we `owned` it (flips our word, as a port's drop does), then unlocks, both
    /// through `wait` (which may defer them, as it does a port's: `deferred`).
    pub(crate) fn close<W: Wait + ?Sized>(&self, index: u32, owned: bool, wait: &W) {
        let i = index as usize;
        if owned {
            // Only we write our word, so once our deferred flips are out it reads what we
            // last stored.
            wait.publish();
            let out = normalize(self.mailbox.primary[i].load(Ordering::Relaxed));
            wait.flip(&self.mailbox.primary[i], out ^ 1);
        }
        wait.unlock(self.locks, index);
    }

    /// Drains port `index`, whose exchange the server abandoned and which the caller holds
    /// locked (PROTOCOL section 11): marks its header as holding no request (mask 0), so that a
    /// late packet of that exchange is never read as a new one; answers the client, if the
    /// buffer is ours, with `reply` in every lane's word 0 (the other words 0); unlocks. Also
    /// how a late packet (a pending port whose header has the mark) is answered.
    ///
    /// The mark is written while the client may own the buffer (a drain of an exchange waiting
    /// for its client): a client writes the header only when it opens a request, which the
    /// client of this exchange, holding its lock, cannot do before it closes. A request opened
    /// anyway (a client of another lock table) and written before the mark reads as a late
    /// packet: answered, never run. The flip and the unlock go through `wait`, as in `close`.
    pub(crate) fn drain<W: Wait + ?Sized>(&self, index: u32, reply: u64, wait: &W) {
        let i = index as usize;
        // Relaxed: later loads of ours see it (or a client's later header), and the release
        // fence of our next flip orders it before whatever the client does after that flip.
        self.mailbox.header(index)[0].store(0, Ordering::Relaxed);
        // Only we write our word, so once our deferred flips are out it reads what we stored.
        wait.publish();
        let out = normalize(self.mailbox.primary[i].load(Ordering::Relaxed));
        // Relaxed: the fence below orders the packets once the buffer is ours.
        let inbox = normalize(self.mailbox.secondary[i].load(Ordering::Relaxed));
        if inbox != out {
            // Pairs with the client's release fence before its flip: its packet writes are
            // done before ours overwrite them.
            fence(Ordering::Acquire);
            for (k, word) in self.mailbox.packets(index).iter().enumerate() {
                let value = if k % 8 == 0 { reply } else { 0 };
                word.store(value.to_le(), Ordering::Relaxed);
            }
            // The flip's release fence (here or in the batch) publishes the reply first.
            wait.flip(&self.mailbox.primary[i], out ^ 1);
        }
        wait.unlock(self.locks, index);
    }

    /// The first pending port at or after `from`.
    pub fn next_pending(&self, from: u32) -> Option<u32> {
        crate::protocol::scan::next_pending(self.mailbox.primary, self.mailbox.secondary, from)
    }

    /// One pass's walk over the ports, re-checking `hot` (the recently served ports) on the way.
    pub(crate) fn sweep<'h>(
        &self,
        hot: &'h mut crate::protocol::scan::HotPorts,
    ) -> crate::protocol::scan::Sweep<'h>
    where
        'a: 'h,
    {
        crate::protocol::scan::Sweep::new(self.mailbox.primary, self.mailbox.secondary, hot)
    }

    /// Opens port `index` if it is pending and no other server thread holds it.
    pub fn try_open<'w>(&'w self, index: u32, wait: &'w dyn Wait) -> Option<ServerPort<'w>> {
        let i = index as usize;
        if index >= self.mailbox.layout().ports() {
            return None;
        }
        // The client wrote the header and (usually) lane 0's packet just before its flip: start
        // fetching both lines now, in parallel with each other and with the lock, instead of
        // one after the other when the header and then the handler read them.
        prefetch(&self.mailbox.header(index)[0]);
        prefetch(&self.mailbox.packets(index)[0]);
        if !try_lock(self.locks, index) {
            return None;
        }
        // Relaxed: the lock's acquire orders our own word (another server thread may have
        // flipped it before unlocking); the client's word is ordered by the fence below.
        let out = normalize(self.mailbox.primary[i].load(Ordering::Relaxed));
        let inbox = normalize(self.mailbox.secondary[i].load(Ordering::Relaxed));
        if inbox == out {
            unlock(self.locks, index);
            return None;
        }
        // Pairs with the client's release fence before its flip: header and packets are visible.
        fence(Ordering::Acquire);
        let header = self.mailbox.header(index);
        let header_mask = u64::from_le(header[0].load(Ordering::Relaxed));
        let opcode = Opcode(u64::from_le(header[1].load(Ordering::Relaxed)) as u32);
        let layout = self.mailbox.layout();
        Some(Port {
            index,
            inbox: &self.mailbox.secondary[i],
            outbox: &self.mailbox.primary[i],
            packets: self.mailbox.packets(index),
            locks: self.locks,
            mask: header_mask & layout.lane_mask(),
            header_mask,
            lanes: layout.lanes(),
            opcode,
            out,
            owns: true,
            receive: false,
            wait,
            resumable: wait.resumable(),
            doorbell: self.doorbell,
            gave_up: false,
        })
    }

    /// Opens the first pending port at or after `from` that no other server thread holds.
    pub fn open_next<'w>(&'w self, mut from: u32, wait: &'w dyn Wait) -> Option<ServerPort<'w>> {
        while let Some(index) = self.next_pending(from) {
            if let Some(port) = self.try_open(index, wait) {
                return Some(port);
            }
            from = index + 1;
        }
        None
    }
}

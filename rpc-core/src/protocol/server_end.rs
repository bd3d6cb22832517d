//! The server side of the port protocol over one mailbox: finding pending ports and opening
//! them. The thread that drives it is [`crate::server::thread`]; handlers run the port scripts.
//!
//! # Finding pending ports
//! A port is pending when `C != S` for port i (each word normalised: non-zero counts as 1).
//!
//! Two costs matter (DESIGN.md, "Performance targets"): the cost of a pass over a mailbox whose
//! ports are nearly all idle (up to 16384 of them), and the delay before a busy port is seen.
//!
//! - **Blocks of words.** [`next_pending_in`] reads the words of [`BLOCK`] ports of each array
//!   per step and ORs their XOR differences, with no branch per port; only a block with a
//!   non-zero difference is looked at port by port (with the normalisation, so garbage such as `2` vs `1` is not
//!   pending). An idle port then costs two loads and two ALU operations instead of two loads,
//!   two normalisations, a compare and a branch.
//! - **Hot ports.** A [`Sweep`] (one pass over one mailbox) checks the few most recently served
//!   ports ([`HotPorts`]) first (in a mailbox of more than a stride), and again every
//!   [`HOT_STRIDE`] ports of its scan, so a client that talks to the server in a loop is
//!   answered within a stride of scanning instead of a whole pass, however many idle ports
//!   there are. Every pending port the sweep passes is still served in the same pass.
//! - **Watch.** A sweep that served one port and no other looks at that port again every
//!   [`WATCH_STRIDE`] ports of its scan, so a client in a loop on it, whose next request
//!   lands while the scan goes on, waits some 64 ports of scanning, not up to a stride.
//! - **Dwell.** A sweep that served one port and no other watches that port for a few spin
//!   hints once its scan is done ([`Sweep::dwell`], at most [`DWELLS`] times a sweep), so a
//!   client in a loop on it is answered in the same sweep instead of after the pass's end
//!   and the next pass's bookkeeping.
//!
//! # Why plain relaxed atomic loads are sound and enough
//! Every word is read with a `Relaxed` atomic load of its own size (`u32`): the arrays are
//! shared with another party, so the reads must be atomic (no data race in this process), and
//! they must have the same size as the other side's stores (mixed-size atomic accesses racing
//! with each other are not allowed by Rust's memory model). Wider loads or SIMD would be faster
//! still but would be exactly such non-atomic or mixed-size racing reads. On x86-64 and AArch64
//! each load is a plain move, so the block loop is as cheap as a non-atomic one short of
//! vectorisation.
//!
//! The answer is a hint: the words may change right after we read them. That is harmless both
//! ways. A port that becomes pending after we looked is found by the next pass (or the next
//! hot-port check). A port we report but that is not pending any more (or was never pending:
//! a block's fast check and the per-port check read the words at different times) is re-checked
//! by [`crate::protocol::ServerEnd::try_open`] under the port's lock, which also supplies the ordering (its
//! acquire fence pairs with the client's release fence); nothing read here orders anything.

use crate::protocol::error::ProtocolError;
use crate::protocol::mailbox::{check_locks, lock_words, try_lock, unlock, Mailbox};
use crate::protocol::opcode::Opcode;
use crate::protocol::port::{
    count_closed, normalize, prefetch, Port, PortPackets, ServerPort, Wait,
};
use crate::sync::{fence, spin_hint, AtomicU32, AtomicU64, Ordering};

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
        check_locks(&mailbox, locks)?;
        Ok(ServerEnd::sized(mailbox, locks, None))
    }

    /// A server over `mailbox` using `locks`, which its caller sized for the mailbox's layout
    /// (an attached mailbox's table), decrementing `doorbell` (see `with_doorbell`). Panics
    /// if `locks` is too small after all (a memory source whose view changed its layout).
    /// Built in place, with no `Result` to move through: the worker makes one on every pass.
    #[inline]
    pub(crate) fn sized(
        mailbox: Mailbox<'a>,
        locks: &'a [AtomicU32],
        doorbell: Option<&'a AtomicU64>,
    ) -> Self {
        assert!(
            locks.len() >= lock_words(mailbox.layout().ports()),
            "lock table sized for the layout"
        );
        ServerEnd {
            mailbox,
            locks,
            doorbell,
        }
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
    /// through `wait` (which may defer them, as it does a port's: `Batch`).
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
        next_pending(self.mailbox.primary, self.mailbox.secondary, from)
    }

    /// One pass's walk over the ports, re-checking `hot` (the recently served ports) on the way.
    pub(crate) fn sweep<'h>(&self, hot: &'h mut HotPorts) -> Sweep<'h>
    where
        'a: 'h,
    {
        Sweep::new(self.mailbox.primary, self.mailbox.secondary, hot)
    }

    /// Opens port `index` if it is pending and no other server thread holds it. Inlined: the
    /// port (17 fields) is then built where its opener keeps it, not returned and copied
    /// there.
    #[inline]
    pub fn try_open<'w>(&'w self, index: u32, wait: &'w dyn Wait) -> Option<ServerPort<'w>> {
        let taken = self.try_take(index)?;
        Some(self.port(taken, wait))
    }

    /// The port `try_take` opened, with `wait`.
    #[inline]
    pub(crate) fn port<'w>(&'w self, taken: Taken, wait: &'w dyn Wait) -> ServerPort<'w> {
        Port::opened(
            &self.mailbox,
            self.locks,
            taken.index,
            taken.header_mask,
            taken.opcode,
            taken.out,
            wait,
            self.doorbell,
        )
    }

    /// The active lanes of the port `try_take` opened, and its packets.
    #[inline]
    pub(crate) fn packets(&self, taken: &Taken) -> PortPackets<'a> {
        PortPackets {
            mask: taken.header_mask & self.mailbox.layout().lane_mask(),
            packets: self.mailbox.packets(taken.index),
        }
    }

    /// Closes the port `try_take` opened, as its port's drop does: hands the buffer, its
    /// packets rewritten, back to the client (flips our word), counts the request closed in
    /// the doorbell, and unlocks the port; the flip and the unlock through `wait` (which may
    /// defer them, as it does a port's: `Batch`).
    #[inline(always)]
    pub(crate) fn answer<W: Wait + ?Sized>(&self, taken: &Taken, wait: &W) {
        let (ours, _) = self.mailbox.flags(taken.index);
        wait.flip(ours, taken.out ^ 1);
        count_closed(self.doorbell);
        wait.unlock(self.locks, taken.index);
    }

    /// Takes port `index` if it is pending and no other server thread holds it: its lock
    /// taken, the client's header and packets ordered before our reads (the buffer ours),
    /// and what the header says read; a [`ServerPort`] is made of it by
    /// [`port`](Self::port), or it is answered by [`answer`](Self::answer) (a packet
    /// handler's request, which needs no port). Inlined into its opener (`try_open`, the
    /// worker's `Inner::start`, once a request).
    #[inline]
    pub(crate) fn try_take(&self, index: u32) -> Option<Taken> {
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
        let (ours, theirs) = self.mailbox.flags(index);
        let out = normalize(ours.load(Ordering::Relaxed));
        let inbox = normalize(theirs.load(Ordering::Relaxed));
        if inbox == out {
            unlock(self.locks, index);
            return None;
        }
        // Pairs with the client's release fence before its flip: header and packets are visible.
        fence(Ordering::Acquire);
        let header = self.mailbox.header(index);
        let header_mask = u64::from_le(header[0].load(Ordering::Relaxed));
        let opcode = Opcode(u64::from_le(header[1].load(Ordering::Relaxed)) as u32);
        Some(Taken {
            index,
            header_mask,
            opcode,
            out,
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

/// A port [`ServerEnd::try_take`] opened: locked by us, the buffer ours, and what its header
/// and our word said. Made into a [`ServerPort`] or answered ([`ServerEnd::answer`]) by its
/// taker; until then it holds the port's lock.
#[derive(Clone, Copy)]
pub(crate) struct Taken {
    pub(crate) index: u32,
    /// The mask as found in the header.
    pub(crate) header_mask: u64,
    /// The opcode as found in the header (the mailbox's numbering, until its taker
    /// translates it).
    pub(crate) opcode: Opcode,
    /// The value of our own word.
    pub(crate) out: u32,
}

/// Ports compared per step of a scan (8 words: 4 of each array). Measured on the Zen 5 of
/// `docs/performance.md`, 16384 idle ports take about 2.5 µs with 4, 4 µs with 8, 6 µs with 16 or
/// 32 (the compiler keeps atomic loads in program order and spills the larger blocks' values to
/// the stack) and 8.5-11.5 µs port by port.
pub(crate) const BLOCK: usize = 4;
/// Ports scanned between two looks at the hot ports (about 80 ns of scanning).
pub(crate) const HOT_STRIDE: usize = 512;
/// How many recently served ports a mailbox's sweep keeps re-checking.
pub(crate) const HOT_PORTS: usize = 4;
/// Ports scanned between two looks at the one port a sweep served (see [`Sweep::walk`]):
/// some 10 ns of scanning, where a stride is 80. (Measured in `docs/performance.md`: where
/// the served port was looked at only at the stride's checkpoints, a client in a loop on
/// port 16383 waited some 40 ns a request longer than on the floor's.)
pub(crate) const WATCH_STRIDE: usize = 64;
/// Looks at the port just served, a spin-loop hint apart, in one dwell (see [`Sweep::dwell`]):
/// some 0.3-1.5 µs, as long as a pause instruction lasts on the CPU. One under loom, whose
/// models would otherwise explore every look.
pub(crate) const DWELL_LOOKS: u32 = if cfg!(loom) { 1 } else { 32 };
/// Dwells a sweep makes at most, so its mailbox's other ports wait at most this many dwells
/// and the requests they catch longer than one pass.
pub(crate) const DWELLS: u32 = 8;

/// Whether one port is pending. Relaxed: a hint (see the module docs). Equal words are
/// equal normalised too: only unequal ones are normalised (in the block a scan found, most
/// of the ports are idle, their words equal).
#[inline]
fn pending(primary: &AtomicU32, secondary: &AtomicU32) -> bool {
    let (ours, theirs) = (
        primary.load(Ordering::Relaxed),
        secondary.load(Ordering::Relaxed),
    );
    ours != theirs && normalize(ours) != normalize(theirs)
}

/// The first pending port of two equally long runs of words, port by port.
#[inline]
fn first_pending(primary: &[AtomicU32], secondary: &[AtomicU32]) -> Option<usize> {
    primary
        .iter()
        .zip(secondary)
        .position(|(s, c)| pending(s, c))
}

/// The first port at or after `from` whose client word differs from the server's.
pub(crate) fn next_pending(
    primary: &[AtomicU32],
    secondary: &[AtomicU32],
    from: u32,
) -> Option<u32> {
    next_pending_in(primary, secondary, from as usize, usize::MAX).map(|i| i as u32)
}

/// The first pending port in `from..to` (`to` is clamped to the arrays' length). Inlined
/// into `Sweep::walk`, its caller once a pass (its frame and call cost a pass some 20
/// instructions).
#[inline(always)]
pub(crate) fn next_pending_in(
    primary: &[AtomicU32],
    secondary: &[AtomicU32],
    from: usize,
    to: usize,
) -> Option<usize> {
    let to = to.min(primary.len()).min(secondary.len());
    let (primary, secondary) = (primary.get(from..to)?, secondary.get(from..to)?);
    // Two blocks a turn: one loop branch per two blocks (each block is still tested alone,
    // its loads before the next block's, so no more words are live at once).
    let mut pairs = primary
        .chunks_exact(2 * BLOCK)
        .zip(secondary.chunks_exact(2 * BLOCK));
    let mut at = from;
    for (s, c) in &mut pairs {
        for (s, c) in s.chunks_exact(BLOCK).zip(c.chunks_exact(BLOCK)) {
            // Relaxed: a hint (see the module docs). Raw words, not normalised: equal words
            // are equal after normalisation too, so a zero difference proves no port here is
            // pending; a non-zero one is checked port by port below.
            let difference = s.iter().zip(c).fold(0, |d, (s, c)| {
                d | (s.load(Ordering::Relaxed) ^ c.load(Ordering::Relaxed))
            });
            if difference != 0 {
                if let Some(k) = first_pending(s, c) {
                    return Some(at + k);
                }
            }
            at += BLOCK;
        }
    }
    let done = at - from;
    first_pending(&primary[done..], &secondary[done..]).map(|k| at + k)
}

/// The ports of one mailbox served most recently (by one worker; a private hint, no atomics).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct HotPorts {
    ports: [u32; HOT_PORTS],
    len: usize,
    /// The slot the next new port replaces once all are used.
    next: usize,
}

impl HotPorts {
    /// Remembers that `index` was just served.
    pub(crate) fn note(&mut self, index: u32) {
        if self.ports[..self.len].contains(&index) {
            return;
        }
        self.ports[self.next] = index;
        self.next = (self.next + 1) % HOT_PORTS;
        self.len = (self.len + 1).min(HOT_PORTS);
    }
}

/// What a sweep found next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Step {
    /// A port that looks pending.
    Pending(u32),
    /// [`HOT_STRIDE`] more ports scanned.
    Checkpoint,
}

/// The ports a sweep served since it began or last dwelt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Served {
    None,
    One(u32),
    Many,
}

/// One pass's walk over a mailbox's ports: the hot ports, then every port in order, found a
/// block at a time, with the hot ports re-checked every [`HOT_STRIDE`] ports.
pub(crate) struct Sweep<'a> {
    primary: &'a [AtomicU32],
    secondary: &'a [AtomicU32],
    hot: &'a mut HotPorts,
    /// The ports: as many as both arrays hold (found once, here, not at every step).
    len: usize,
    /// The next port the in-order scan looks at.
    next: usize,
    /// Where the scan stops next to look at the hot ports.
    checkpoint: usize,
    /// Hot ports (`hot.ports[..hot_left]`) still to look at for the current checkpoint.
    hot_left: usize,
    /// The one port served since the sweep began or last dwelt, or `Served::Many` (the watch
    /// and a dwell are only for a sweep that serves one port: a client in a loop on it).
    served: Served,
    /// Dwells still allowed in this sweep.
    dwells_left: u32,
}

impl<'a> Sweep<'a> {
    pub(crate) fn new(
        primary: &'a [AtomicU32],
        secondary: &'a [AtomicU32],
        hot: &'a mut HotPorts,
    ) -> Self {
        // The hot ports first, too, in a mailbox of more than a stride: a client in a loop on
        // one port of a large mailbox shares its CPU with the server when another program
        // keeps the other busy (the loaded regime of `docs/performance.md`); it sends its next
        // request while the server yields between passes, and the next pass then finds it at
        // once, not after a whole scan. A smaller mailbox is scanned within a stride anyway.
        let len = primary.len().min(secondary.len());
        let hot_left = if len > HOT_STRIDE { hot.len } else { 0 };
        Sweep {
            primary,
            secondary,
            hot,
            len,
            next: 0,
            checkpoint: HOT_STRIDE,
            hot_left,
            served: Served::None,
            dwells_left: DWELLS,
        }
    }

    /// The next port that looks pending, or None once the whole mailbox was scanned. A hot port
    /// may come back more than once per sweep (each time it was found pending again).
    #[cfg(all(test, not(loom)))]
    pub(crate) fn next_pending(&mut self) -> Option<u32> {
        loop {
            match self.next()? {
                Step::Pending(index) => return Some(index),
                Step::Checkpoint => continue,
            }
        }
    }

    /// The next port that looks pending, or a checkpoint (every [`HOT_STRIDE`] ports scanned,
    /// where the caller may look at other work), or None once the whole mailbox was scanned.
    /// The end of the sweep is seen in line: a pass that served a port at the end of its
    /// mailbox (the last port of a client in a loop on it) asks once more, and that answer
    /// costs a compare, not a call.
    #[inline]
    pub(crate) fn next(&mut self) -> Option<Step> {
        if self.hot_left == 0 && self.next >= self.len {
            return None;
        }
        self.walk()
    }

    /// [`Sweep::next`] before the end: the hot ports still to look at, then the scan. While
    /// the sweep has served one port and no other (a client in a loop on it), the scan stops
    /// every [`WATCH_STRIDE`] ports to look at that port, and gives it if its client is back:
    /// the scan goes on from where it stood after it is served, so it still ends, at least
    /// [`WATCH_STRIDE`] ports further for each such request.
    #[inline(never)]
    fn walk(&mut self) -> Option<Step> {
        let len = self.len;
        loop {
            while self.hot_left > 0 {
                self.hot_left -= 1;
                let index = self.hot.ports[self.hot_left] as usize;
                // Also ports ahead of the scan: a client looping on the last port would
                // otherwise wait for the whole scan. The scan may find such a port again (a
                // new request by then, or not pending any more: `try_open` re-checks).
                if pending(&self.primary[index], &self.secondary[index]) {
                    return Some(Step::Pending(index as u32));
                }
            }
            if self.next >= len {
                return None;
            }
            let watched = match self.served {
                Served::One(index) => Some(index as usize),
                _ => None,
            };
            let stride_end = self.checkpoint.min(len);
            let end = watched.map_or(stride_end, |_| stride_end.min(self.next + WATCH_STRIDE));
            if let Some(index) = next_pending_in(self.primary, self.secondary, self.next, end) {
                self.next = index + 1;
                return Some(Step::Pending(index as u32));
            }
            self.next = end;
            if end == self.checkpoint {
                self.checkpoint += HOT_STRIDE;
                self.hot_left = self.hot.len;
                return Some(Step::Checkpoint);
            }
            if let Some(index) = watched.filter(|_| end < len) {
                if pending(&self.primary[index], &self.secondary[index]) {
                    return Some(Step::Pending(index as u32));
                }
            }
        }
    }

    /// The ports the in-order scan has looked at so far.
    pub(crate) fn position(&self) -> usize {
        self.next
    }

    /// Records that port `index` was served, for this and later sweeps of the mailbox.
    pub(crate) fn served(&mut self, index: u32) {
        self.hot.note(index);
        self.served = match self.served {
            Served::None => Served::One(index),
            Served::One(port) if port == index => Served::One(index),
            _ => Served::Many,
        };
    }

    /// Once the scan is done ([`Sweep::next`] gave None): where this sweep served one port
    /// (once or more) and no other since it began or last dwelt, watches that port for
    /// [`DWELL_LOOKS`] looks and gives it if it turned pending. A client in a loop on one
    /// port sends its next request about a cache-line round trip after our answer, while the
    /// worker would be ending this pass and starting the next; served here, in the same
    /// sweep, it waits for neither. At most [`DWELLS`] times a sweep, so the other ports are
    /// scanned again after at most that many dwells and their requests. Relaxed: a hint, as
    /// the scan (see the module docs).
    pub(crate) fn dwell(&mut self) -> Option<u32> {
        let Served::One(index) = self.served else {
            return None;
        };
        if self.dwells_left == 0 {
            return None;
        }
        self.dwells_left -= 1;
        self.served = Served::None;
        let index = index as usize;
        let (ours, theirs) = (self.primary.get(index)?, self.secondary.get(index)?);
        for _ in 0..DWELL_LOOKS {
            if pending(ours, theirs) {
                return Some(index as u32);
            }
            spin_hint();
        }
        None
    }
}

#[cfg(all(test, not(loom)))]
mod scan_tests {
    use super::*;
    use std::vec::Vec;

    fn words(values: &[u32]) -> Vec<AtomicU32> {
        values.iter().map(|&v| AtomicU32::new(v)).collect()
    }

    /// The obvious port-by-port scan, as the reference.
    fn reference(primary: &[u32], secondary: &[u32], from: usize) -> Option<usize> {
        (from..primary.len()).find(|&i| (primary[i] != 0) != (secondary[i] != 0))
    }

    /// A small deterministic generator (xorshift), so the test needs no dependency.
    fn xorshift(state: &mut u64) -> u64 {
        *state ^= *state << 13;
        *state ^= *state >> 7;
        *state ^= *state << 17;
        *state
    }

    #[test]
    fn block_scan_agrees_with_a_port_by_port_scan_including_garbage_words() {
        let mut seed = 0x9E37_79B9_7F4A_7C15;
        // Under miri, which interprets every load, a few arrays of each length.
        let rounds = if cfg!(miri) { 2 } else { 50 };
        for n in [0usize, 1, 15, 16, 17, 33, 64, 100, 1024, 1031] {
            for _ in 0..rounds {
                // Mostly equal words; a few differ, some only in garbage (2 vs 1: not pending).
                let mut p = Vec::with_capacity(n);
                let mut s = Vec::with_capacity(n);
                for _ in 0..n {
                    let r = xorshift(&mut seed);
                    let base = (r & 1) as u32;
                    let (a, b) = match (r >> 8) % 64 {
                        0 => (base, base ^ 1),
                        1 => (2, 1),
                        2 => (0, 7),
                        _ => (base, base),
                    };
                    p.push(a);
                    s.push(b);
                }
                let (pa, sa) = (words(&p), words(&s));
                for from in [0, 1, 5, 16, n / 2, n.saturating_sub(1), n, n + 3] {
                    assert_eq!(
                        next_pending_in(&pa, &sa, from, usize::MAX),
                        reference(&p, &s, from),
                        "n={n} from={from}"
                    );
                }
            }
        }
    }

    #[test]
    fn range_scan_stops_at_the_end_of_the_range() {
        let p = words(&[0; 40]);
        let s = words(&[0; 40]);
        s[35].store(1, Ordering::Relaxed);
        assert_eq!(next_pending_in(&p, &s, 0, 35), None);
        assert_eq!(next_pending_in(&p, &s, 0, 36), Some(35));
        assert_eq!(next_pending_in(&p, &s, 36, 40), None);
    }

    #[test]
    fn sweep_visits_every_pending_port_once_in_order_when_nothing_changes() {
        // Under miri, which interprets every load, past two scan checkpoints only.
        let (n, last) = if cfg!(miri) {
            (1100, 1098)
        } else {
            (5000, 4095)
        };
        let p = words(&std::vec![0; n]);
        let s = words(&std::vec![0; n]);
        let pending = [0, 17, 1023, 1024, 1025, last, n - 1];
        for &i in &pending {
            s[i].store(1, Ordering::Relaxed);
        }
        let mut hot = HotPorts::default();
        let mut sweep = Sweep::new(&p, &s, &mut hot);
        let mut seen = Vec::new();
        while let Some(i) = sweep.next_pending() {
            seen.push(i as usize);
            // Serve it: the server flips its word.
            p[i as usize].store(1, Ordering::Relaxed);
            sweep.served(i);
        }
        assert_eq!(seen, pending);
    }

    #[test]
    fn sweep_rechecks_a_hot_port_behind_the_scan() {
        let n = 4 * HOT_STRIDE;
        let p = words(&std::vec![0; n]);
        let s = words(&std::vec![0; n]);
        let mut hot = HotPorts::default();
        hot.note(3);
        let mut sweep = Sweep::new(&p, &s, &mut hot);
        // Port 3 turns pending after the scan went past it: seen at the next checkpoint, not
        // only in the next pass.
        s[HOT_STRIDE + 5].store(1, Ordering::Relaxed);
        assert_eq!(sweep.next_pending(), Some(HOT_STRIDE as u32 + 5));
        s[3].store(1, Ordering::Relaxed);
        assert_eq!(sweep.next_pending(), Some(3));
        p[3].store(1, Ordering::Relaxed); // served
        assert_eq!(sweep.next_pending(), None);
    }

    #[test]
    fn sweep_watches_the_one_port_it_served_every_watch_stride_and_still_ends() {
        let n = 2 * HOT_STRIDE;
        let p = words(&std::vec![0; n]);
        let s = words(&std::vec![0; n]);
        let last = n - 1;
        let mut hot = HotPorts::default();
        hot.note(last as u32);
        let mut sweep = Sweep::new(&p, &s, &mut hot);
        // The hot port first; served.
        s[last].store(1, Ordering::Relaxed);
        assert_eq!(sweep.next_pending(), Some(last as u32));
        p[last].store(1, Ordering::Relaxed);
        sweep.served(last as u32);
        // Its client is back at once, again and again: given after each WATCH_STRIDE ports
        // of the scan (not at the stride's checkpoint), the scan going on in between.
        let mut positions = Vec::new();
        loop {
            s[last].store(s[last].load(Ordering::Relaxed) ^ 1, Ordering::Relaxed);
            match sweep.next_pending() {
                Some(i) if i as usize == last && sweep.position() < n => {
                    positions.push(sweep.position());
                    p[last].store(s[last].load(Ordering::Relaxed), Ordering::Relaxed);
                    sweep.served(last as u32);
                }
                // The scan reached the port itself, and then the end.
                Some(i) => {
                    assert_eq!((i as usize, sweep.position()), (last, n));
                    p[last].store(s[last].load(Ordering::Relaxed), Ordering::Relaxed);
                    sweep.served(last as u32);
                    assert_eq!(sweep.next_pending(), None);
                    break;
                }
                None => panic!("the watched port was pending"),
            }
        }
        // Every WATCH_STRIDE ports (at a checkpoint, the hot ports give it, at the same place).
        let every: Vec<usize> = (1..n / WATCH_STRIDE).map(|k| k * WATCH_STRIDE).collect();
        assert_eq!(positions, every);
        // Two ports served: no watch, so a port served before the scan turning pending again
        // is left for the checkpoint's look at the hot ports.
        let mut hot = HotPorts::default();
        let mut sweep = Sweep::new(&p, &s, &mut hot);
        sweep.served(1);
        sweep.served(2);
        let back = |i: usize| s[i].store(s[i].load(Ordering::Relaxed) ^ 1, Ordering::Relaxed);
        back(1);
        assert_eq!(
            sweep.next_pending(),
            Some(1),
            "the scan finds port 1 itself"
        );
        assert_eq!(sweep.position(), 2);
        p[1].store(s[1].load(Ordering::Relaxed), Ordering::Relaxed);
        sweep.served(1);
        back(1);
        assert_eq!(
            sweep.next_pending(),
            Some(1),
            "at the checkpoint, not sooner"
        );
        assert_eq!(sweep.position(), HOT_STRIDE);
    }

    #[test]
    fn sweep_dwells_only_on_the_one_port_it_served_and_a_bounded_number_of_times() {
        let p = words(&[0; 64]);
        let s = words(&[0; 64]);
        let mut hot = HotPorts::default();
        let mut sweep = Sweep::new(&p, &s, &mut hot);
        // Nothing served: no dwell.
        assert_eq!(sweep.next_pending(), None);
        assert_eq!(sweep.dwell(), None);
        // One port served, its client already back: the dwell gives it, DWELLS times.
        sweep.served(63);
        for _ in 0..DWELLS {
            s[63].store(s[63].load(Ordering::Relaxed) ^ 1, Ordering::Relaxed);
            assert_eq!(sweep.dwell(), Some(63));
            p[63].store(s[63].load(Ordering::Relaxed), Ordering::Relaxed); // served
            sweep.served(63);
        }
        s[63].store(s[63].load(Ordering::Relaxed) ^ 1, Ordering::Relaxed);
        assert_eq!(sweep.dwell(), None, "no more than DWELLS dwells a sweep");
        // Two ports served since the last dwell: none (many clients, the scan serves them).
        let mut hot = HotPorts::default();
        let mut sweep = Sweep::new(&p, &s, &mut hot);
        sweep.served(1);
        sweep.served(2);
        assert_eq!(sweep.dwell(), None);
    }

    #[test]
    fn hot_ports_keep_the_last_distinct_ports_first_in_first_out() {
        let mut hot = HotPorts::default();
        for i in [1, 2, 2, 3, 4, 5, 1] {
            hot.note(i);
        }
        let mut ports = hot.ports[..hot.len].to_vec();
        ports.sort();
        // 5 replaced 1 (the oldest), then 1 replaced 2.
        assert_eq!(ports, [1, 3, 4, 5]);
    }
}

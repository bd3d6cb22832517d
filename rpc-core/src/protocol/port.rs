//! An open port and its state machine, the same for both sides (PROTOCOL sections 3-5).
//!
//! # Memory ordering
//! Ownership of a port's header and packets moves by flipping one's own word:
//! - before a flip, `fence(Release)` then a `Relaxed` store (`Port::hand_over`, through
//!   `store_own_word`, or in the batch of a server port's wait, `Batch`): every
//!   header and packet write before it is visible to whoever sees the flip;
//! - waiting for the other side's flip uses `Relaxed` loads, then `fence(Acquire)`
//!   (`Port::take_buffer`), which pairs with that side's release fence, so its writes are
//!   visible before we read or overwrite the buffers.
//!
//! Packet and header words themselves are `Relaxed`: the fences order them.
//!
//! # Waiting: blocking or resumable
//! Every operation is written once, as an `async fn` (`*_async`), whose only suspension point is
//! `Port::poll_take`: "is the buffer ours yet?". A blocking [`Wait`] (a client warp, the raw
//! protocol [`crate::protocol::ServerEnd`]) pauses inside that poll until it is, so the future completes in
//! its first poll and the synchronous methods (`send`, `recv`, ...) just poll it once. A
//! resumable wait ([`Resumable`], or the [`crate::RpcServer`]'s for its exchanges) returns
//! `Pending` instead, and whoever polls the operation polls it again later (the server's
//! executor, on a later pass, while it serves the other ports). The layer keeps no per-thread
//! state: what a server thread's executor needs to know of a wait (that it suspended on its
//! port, how long it may spin) and its batch of deferred flips are the business of its
//! [`Wait`], through the trait's hooks. Closures get each packet with a fresh lifetime
//! (`Packet<'_>`), so no reference into the mailbox outlives the call that lent it.
//!
//! | field | who touches it |
//! |---|---|
//! | own word (`outbox`) | only this side, only while holding the port's lock |
//! | other word (`inbox`) | read only |
//! | header, packets | only while `owns` (or, for the client, between open and its first send) |
//!
//! # Batches of hand-overs
//! A server thread serving many exchanges at once stores its
//! flips (PROTOCOL section 3), and the unlocks of the ports whose exchanges they ended, a few
//! at a time instead of one by one.
//!
//! Why: a flip is a store to a cache line the client keeps reading (it polls for our word), so
//! the store waits in the CPU's store buffer while that line comes back, a cross-core round
//! trip. Stores leave the buffer in order, so the next locked instruction (a port's lock bit,
//! an `Arc` count, the allocator's lock) or the next load the buffer cannot forward (the moves
//! of odd-sized values after a hand-over are full of them) waits for that round trip too:
//! about one stall per flip: batching them made the pipelined printf row 17-25% faster
//! (docs/performance.md). Deferred, the flips of several exchanges go out together: their
//! lines are fetched at once, and the thread stalls once per batch.
//!
//! The price is latency, each deferred flip reaching its client later by the work done before
//! the batch is published: so the server's executor defers only in passes that begin with two
//! or more exchanges in flight (a client that pipelines, or many warps), never for a request
//! alone, and at most [`BATCH_MAX`] flips or unlocks wait.
//!
//! # Rules
//! - A server port's flips and unlocks go through its [`Wait`]
//!   (`Wait::flip`, `Wait::unlock`; `Port::hand_over`, a server port's drop,
//!   `ServerEnd::close` and `ServerEnd::drain`): a wait that batches puts them in a [`Batch`]
//!   it keeps, the others store them at once ([`store_own_word`], [`crate::protocol::mailbox`]'s
//!   unlock). This layer keeps no batch of its own: the server keeps one per thread.
//! - A batch is published behind one release fence, the flips in the order they were made,
//!   then the unlocks: every packet written before a flip is visible before it (as with
//!   [`store_own_word`]), and a port's flips before its unlock, so whoever locks the port next
//!   reads our word as we left it.
//! - It is published when [`BATCH_MAX`] flips or unlocks wait, when its owner ends it, and before its
//!   thread waits for a client (a wait's pause or spin), writes its own word otherwise (a
//!   reset) or reads it to flip it (`ServerEnd::close` of a buffer we own): `Wait::publish`.
//! - Until then our word in memory is the old one. The scan then sees the port still pending
//!   and the sweep polls its exchange, which finds the buffer not ours (the port's own state
//!   is current) and suspends again; and `ServerEnd::flags` reads the old word, so an exchange's
//!   snapshot of its flags may see one change more than there was: a pass counted as progress,
//!   nothing else.

use crate::protocol::error::ProtocolError;
use crate::protocol::layout::{Buffer, BUFFER_SIZE, FIRST_PACKET_BYTES};
use crate::protocol::mailbox::{unlock, Mailbox};
use crate::protocol::opcode::Opcode;
use crate::sync::{fence, AtomicU32, AtomicU64, DataWord, Ordering};
use core::future::Future;
use core::ptr::NonNull;
use core::task::{Context, Poll, Waker};
#[cfg(feature = "std")]
use std::vec::Vec;

#[cfg(not(feature = "std"))]
extern crate alloc;
#[cfg(not(feature = "std"))]
use alloc::vec::Vec;

/// How a side waits for the other, and when its hand-overs reach it. A blocking wait pauses
/// after each poll that found the buffer not yet ours; a resumable one suspends the operation
/// instead. A server port's flips and unlocks go through its wait too, so that a wait may defer
/// them into a batch it keeps (`Batch`); the provided methods store them at once.
pub trait Wait: Sync {
    /// Pause before the next poll of `port` (`attempt` counts from 0), or give up with an error
    /// (usually [`ProtocolError::Abandoned`]). A wait that defers flips publishes them first.
    fn pause(&self, port: u32, attempt: u32) -> Result<(), ProtocolError>;
    /// True if a port should not wait at all but suspend its operation (`Poll::Pending`), to be
    /// polled again later; `pause` is then never called. Asked once, when the port opens.
    fn resumable(&self) -> bool {
        false
    }
    /// A resumable wait's last look before its operation suspends: it may spin a while for the
    /// other side's answer (`answered` looks for it; a wait that defers flips publishes them
    /// first), and may note that its thread's operation waits on its port. True if the answer
    /// came: the operation goes on instead.
    fn before_suspending(&self, answered: &dyn Fn() -> bool) -> bool {
        let _ = answered;
        false
    }
    /// Hands a server port's buffer over: stores `value` to this side's `word` behind a release
    /// fence, or defers the store into the wait's batch.
    fn flip(&self, word: &AtomicU32, value: u32) {
        store_own_word(word, value);
    }
    /// Unlocks server port `index` of `locks` (after its flips), or defers it into the wait's
    /// batch.
    fn unlock(&self, locks: &[AtomicU32], index: u32) {
        unlock(locks, index);
    }
    /// Publishes what the wait deferred: before its thread writes or reads its own word outside
    /// a flip.
    fn publish(&self) {}
}

/// The plain resumable wait: never pauses, suspends instead, and defers nothing (see the module
/// docs). The synchronous operations of a port with this wait fail with
/// [`ProtocolError::WouldBlock`] rather than wait: for a client that drives many ports from one
/// thread.
#[cfg(feature = "std")]
pub struct Resumable;

#[cfg(feature = "std")]
impl Wait for Resumable {
    fn pause(&self, _port: u32, _attempt: u32) -> Result<(), ProtocolError> {
        Ok(())
    }
    fn resumable(&self) -> bool {
        true
    }
}

/// Spins forever; the only wait available without `std`.
pub struct Spin;

impl Wait for Spin {
    fn pause(&self, _port: u32, _attempt: u32) -> Result<(), ProtocolError> {
        crate::sync::spin_hint();
        Ok(())
    }
}

/// Spins briefly, then yields, then sleeps in short naps; never gives up. On a 2-core machine a
/// waiter that only spins can starve the very thread it waits for, hence the yield and naps.
/// Where the CPUs are crowded it naps without yielding (see `Crowding`, crate-private).
#[cfg(feature = "std")]
pub struct Backoff;

/// Polls spent spinning before [`Backoff`] starts yielding.
#[cfg(feature = "std")]
pub(crate) const SPIN_POLLS: u32 = 64;
/// Polls (counted from the start) after which [`Backoff`] naps instead of yielding (not under
/// loom, where a step is only a spin hint).
#[cfg(all(feature = "std", not(loom)))]
pub(crate) const YIELD_POLLS: u32 = SPIN_POLLS + 512;
/// [`Backoff`]'s nap (it lasts up to the thread's timer slack longer, 50 µs by default).
#[cfg(all(feature = "std", not(loom)))]
const NAP: std::time::Duration = std::time::Duration::from_micros(20);

#[cfg(feature = "std")]
impl Backoff {
    /// One back-off step for poll `attempt`: spin, yield or nap.
    pub fn step(attempt: u32) {
        #[cfg(loom)]
        {
            let _ = attempt;
            crate::sync::spin_hint();
        }
        #[cfg(not(loom))]
        if attempt < SPIN_POLLS {
            crate::sync::spin_hint();
        } else if attempt < YIELD_POLLS && !CROWDING.skips_yields(attempt == SPIN_POLLS) {
            CROWDING.yield_now();
        } else {
            std::thread::sleep(NAP);
        }
    }
}

/// Whether the CPUs are crowded: more threads want to run than there are CPUs, and some of
/// them never wait (busy loops beside us, as MPI ranks that busy-poll on a node). A yield then
/// hands the CPU to one of them for the rest of its time slice (milliseconds), while a nap's
/// wake-up runs us again within some 70 µs (the nap and the timer's slack). So two yields in
/// a row that each took longer than [`CROWDED_YIELD`] mark the process's next
/// [`CROWDED_WAITS`] waits crowded: in those, a client's [`Backoff`] naps at once instead of
/// its 512 yields, the server thread suspends an exchange instead of yielding between its
/// spins for the answer (`server::exec`'s context), and its back-off parks without its yield
/// passes (`server::worker`). The next yield after them probes again (one long yield then
/// marks them again, the last one noted being long). One long yield is not enough: a process
/// that was stopped (SIGSTOP, a debugger, the bench between its rows) or whose vCPU the host
/// ran elsewhere took long in its yield with no crowd, and the yields after it are short; a
/// busy thread beside us makes the next one long too. Process-wide, not per thread: the
/// crowd is the machine's, and one thread's yield tells every thread of ours.
///
/// The threshold is what keeps this free where the CPUs are not crowded: a yield that runs
/// another thread of ours (the worker, a sibling client, both waiting in turn) returns when
/// that thread waits again, in microseconds to some tens of them, and then yielding is
/// cheaper than napping; an older try marked a thread crowded after a yield of 20 µs (less
/// than a nap really takes) and made a test whose own five threads share 2 CPUs 3-4x slower.
///
/// # Memory ordering
/// `waits_left` and `long_before` are hints that order nothing: `Relaxed`, and `waits_left`'s
/// count down a load and a store (a decrement lost to a race only makes the crowded stretch a
/// wait longer; two threads' yields noted at once may mark a stretch a yield early or late).
/// A stale value costs some naps or yields, never a request.
#[cfg(all(feature = "std", not(loom)))]
pub(crate) struct Crowding {
    /// Waits left that skip their yields.
    waits_left: AtomicU32,
    /// Whether the last yield noted was longer than [`CROWDED_YIELD`].
    long_before: crate::sync::AtomicBool,
}

/// A yield longer than this ran a thread that does not wait (see [`Crowding`]): over three
/// times a nap's real length, and below a scheduler's time slice (0.75-3 ms).
#[cfg(all(feature = "std", not(loom)))]
const CROWDED_YIELD: std::time::Duration = std::time::Duration::from_micros(250);

/// How many waits skip their yields after a yield longer than [`CROWDED_YIELD`].
#[cfg(all(feature = "std", not(loom)))]
const CROWDED_WAITS: u32 = 64;

/// This process's [`Crowding`].
#[cfg(feature = "std")]
pub(crate) static CROWDING: Crowding = Crowding::new();

/// Under loom no wait counts as crowded: a model's executions must not depend on time.
#[cfg(all(feature = "std", loom))]
pub(crate) struct Crowding;

#[cfg(all(feature = "std", loom))]
impl Crowding {
    const fn new() -> Crowding {
        Crowding
    }
    pub(crate) fn skips_yields(&self, _new_wait: bool) -> bool {
        false
    }
    pub(crate) fn yield_now(&self) -> core::time::Duration {
        crate::sync::thread::yield_now();
        core::time::Duration::ZERO
    }
}

#[cfg(all(feature = "std", not(loom)))]
impl Crowding {
    const fn new() -> Crowding {
        Crowding {
            waits_left: AtomicU32::new(0),
            long_before: crate::sync::AtomicBool::new(false),
        }
    }

    /// Whether a wait skips its yields now (napping or suspending instead); `new_wait` (its
    /// first look) counts it among the crowded waits.
    pub(crate) fn skips_yields(&self, new_wait: bool) -> bool {
        let left = self.waits_left.load(Ordering::Relaxed);
        if left > 0 && new_wait {
            self.waits_left.store(left - 1, Ordering::Relaxed);
        }
        left > 0
    }

    /// Yields the CPU, notes how long that took, and says it.
    pub(crate) fn yield_now(&self) -> std::time::Duration {
        let start = std::time::Instant::now();
        std::thread::yield_now();
        let took = start.elapsed();
        self.note_yield(took);
        took
    }

    /// Notes a yield that took `took`: the second long one in a row marks the next waits
    /// crowded. `long_before` is written only when it changes (no store a yield).
    fn note_yield(&self, took: std::time::Duration) {
        let long = took > CROWDED_YIELD;
        if long && self.long_before.load(Ordering::Relaxed) {
            self.waits_left.store(CROWDED_WAITS, Ordering::Relaxed);
        } else if long != self.long_before.load(Ordering::Relaxed) {
            self.long_before.store(long, Ordering::Relaxed);
        }
    }
}

#[cfg(feature = "std")]
impl Wait for Backoff {
    fn pause(&self, _port: u32, attempt: u32) -> Result<(), ProtocolError> {
        Backoff::step(attempt);
        Ok(())
    }
}

/// Backs off like [`Backoff`], and gives up ([`ProtocolError::Abandoned`]) once the instant has
/// passed: for a client that must not wait forever on a server that may be gone (tests, tools,
/// other processes).
#[cfg(feature = "std")]
pub struct Deadline(pub std::time::Instant);

#[cfg(feature = "std")]
impl Deadline {
    /// A deadline `timeout` from now.
    pub fn after(timeout: std::time::Duration) -> Self {
        Deadline(std::time::Instant::now() + timeout)
    }
}

#[cfg(feature = "std")]
impl Wait for Deadline {
    fn pause(&self, port: u32, attempt: u32) -> Result<(), ProtocolError> {
        // Reading the clock costs more than a spin: only once the spinning is over.
        if attempt >= SPIN_POLLS && std::time::Instant::now() >= self.0 {
            return Err(ProtocolError::Abandoned {
                port,
                reason: "deadline passed",
            });
        }
        Backoff::step(attempt);
        Ok(())
    }
}

/// The default wait of a side: [`Backoff`] with `std`, [`Spin`] without.
#[cfg(feature = "std")]
pub(crate) static DEFAULT_WAIT: Backoff = Backoff;
/// The default wait of a side: [`Backoff`] with `std`, [`Spin`] without.
#[cfg(not(feature = "std"))]
pub(crate) static DEFAULT_WAIT: Spin = Spin;

/// A mailbox word as the protocol reads it: any non-zero value counts as 1 (robustness: a peer
/// that writes garbage cannot push us outside the two states).
#[inline]
pub(crate) fn normalize(word: u32) -> u32 {
    (word != 0) as u32
}

/// Hints the CPU to fetch the cache line holding `word` (no-op where we have no such hint).
/// A prefetch reads nothing the program sees and cannot fault, so it neither races nor needs an
/// ordering: the fences of the protocol still order the loads that use the data.
#[inline(always)]
pub(crate) fn prefetch(word: &DataWord) {
    #[cfg(all(target_arch = "x86_64", not(loom)))]
    // SAFETY: PREFETCHT0 is part of SSE, which every x86-64 CPU has; it only takes an address,
    // which is valid anyway (it comes from a reference).
    unsafe {
        core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(
            word.as_ptr().cast::<i8>().cast_const(),
        );
    }
    #[cfg(not(all(target_arch = "x86_64", not(loom))))]
    let _ = word;
}

/// The lanes whose bits are set in `mask`, lowest first.
pub fn lanes(mut mask: u64) -> impl Iterator<Item = u32> {
    core::iter::from_fn(move || {
        if mask == 0 {
            return None;
        }
        let lane = mask.trailing_zeros();
        mask &= mask - 1;
        Some(lane)
    })
}

/// One lane's 64-byte packet in shared memory.
#[derive(Clone, Copy)]
pub struct Packet<'a> {
    words: &'a [DataWord],
}

impl<'a> Packet<'a> {
    /// Word `i` (0..8), little-endian on the wire.
    #[inline]
    pub fn word(&self, i: usize) -> u64 {
        u64::from_le(self.words[i].load(Ordering::Relaxed))
    }

    #[inline]
    /// Writes word `i`.
    pub fn set_word(&self, i: usize, value: u64) {
        self.words[i].store(value.to_le(), Ordering::Relaxed)
    }

    /// The whole packet.
    pub fn read(&self) -> Buffer {
        Buffer {
            data: core::array::from_fn(|i| self.word(i)),
        }
    }

    /// Writes the whole packet.
    pub fn write(&self, buffer: &Buffer) {
        for (i, &word) in buffer.data.iter().enumerate() {
            self.set_word(i, word);
        }
    }

    /// The bytes after word 0 (a byte string's first packet's payload).
    pub fn payload(&self) -> [u8; FIRST_PACKET_BYTES] {
        let mut bytes = [0u8; FIRST_PACKET_BYTES];
        for (i, chunk) in bytes.chunks_exact_mut(8).enumerate() {
            chunk.copy_from_slice(&self.word(1 + i).to_le_bytes());
        }
        bytes
    }

    /// Copies `out.len()` bytes starting at byte `offset` out of the packet.
    /// Panics if the range leaves the packet (a bug of this crate, never input-driven).
    pub fn read_bytes(&self, offset: usize, out: &mut [u8]) {
        assert!(
            offset + out.len() <= BUFFER_SIZE,
            "byte range outside the packet"
        );
        if offset % 8 == 0 {
            // Word-aligned (every `send_n` packet): whole words, each a copy of constant size,
            // then the head of the last word.
            let first = offset / 8;
            let whole = out.len() / 8;
            let mut chunks = out.chunks_exact_mut(8);
            for (i, chunk) in (&mut chunks).enumerate() {
                chunk.copy_from_slice(&self.word(first + i).to_le_bytes());
            }
            let tail = chunks.into_remainder();
            if !tail.is_empty() {
                let n = tail.len();
                tail.copy_from_slice(&self.word(first + whole).to_le_bytes()[..n]);
            }
            return;
        }
        let mut done = 0;
        while done < out.len() {
            let at = offset + done;
            let bytes = self.word(at / 8).to_le_bytes();
            let take = (8 - at % 8).min(out.len() - done);
            out[done..done + take].copy_from_slice(&bytes[at % 8..at % 8 + take]);
            done += take;
        }
    }

    /// Copies `data` into the packet starting at byte `offset`; the other bytes keep their values.
    /// Panics if the range leaves the packet (a bug of this crate, never input-driven).
    pub fn write_bytes(&self, offset: usize, data: &[u8]) {
        assert!(
            offset + data.len() <= BUFFER_SIZE,
            "byte range outside the packet"
        );
        if offset % 8 == 0 {
            // Word-aligned (every `send_n` packet): whole words, each a load of constant size,
            // then the head of the last word (its other bytes kept).
            let first = offset / 8;
            let mut chunks = data.chunks_exact(8);
            for (i, chunk) in (&mut chunks).enumerate() {
                let word: [u8; 8] = chunk.try_into().expect("chunks of 8 bytes");
                self.set_word(first + i, u64::from_le_bytes(word));
            }
            let tail = chunks.remainder();
            if !tail.is_empty() {
                let at = first + data.len() / 8;
                let mut bytes = self.word(at).to_le_bytes();
                bytes[..tail.len()].copy_from_slice(tail);
                self.set_word(at, u64::from_le_bytes(bytes));
            }
            return;
        }
        let mut done = 0;
        while done < data.len() {
            let at = offset + done;
            let take = (8 - at % 8).min(data.len() - done);
            let mut bytes = self.word(at / 8).to_le_bytes();
            bytes[at % 8..at % 8 + take].copy_from_slice(&data[done..done + take]);
            self.set_word(at / 8, u64::from_le_bytes(bytes));
            done += take;
        }
    }
}

/// An open port. `SERVER` picks the side: it decides who owns the buffer for a pair of words and
/// whether `close` hands the buffer back. Dropping a port closes it.
pub struct Port<'a, const SERVER: bool> {
    pub(crate) index: u32,
    /// The other side's word.
    pub(crate) inbox: &'a AtomicU32,
    /// This side's word.
    pub(crate) outbox: &'a AtomicU32,
    pub(crate) packets: &'a [DataWord],
    pub(crate) locks: &'a [AtomicU32],
    /// Active lanes: the header mask restricted to real lanes.
    pub(crate) mask: u64,
    /// The mask as found in (or written to) the header.
    pub(crate) header_mask: u64,
    pub(crate) lanes: u32,
    pub(crate) opcode: Opcode,
    /// The value of our own word.
    pub(crate) out: u32,
    pub(crate) owns: bool,
    pub(crate) receive: bool,
    pub(crate) wait: &'a dyn Wait,
    /// What `wait.resumable()` said when the port opened.
    pub(crate) resumable: bool,
    /// v2 doorbell counter, decremented once when a server port closes.
    pub(crate) doorbell: Option<&'a AtomicU64>,
    /// Set when a wait gave up or `recv_n` refused a length: the exchange stopped midway, so
    /// the other side may still be inside it (see `Drop`).
    pub(crate) gave_up: bool,
}

/// A port opened by a client warp.
pub type ClientPort<'a> = Port<'a, false>;
/// A port opened by the server.
pub type ServerPort<'a> = Port<'a, true>;

impl<'a, const SERVER: bool> Port<'a, SERVER> {
    /// Port `index` of `mailbox`, just opened by this side (its lock bit in `locks` taken,
    /// the buffer ours): the words are the other side's and this side's (the server writes
    /// `primary`, the client `secondary`), `out` the value of ours, `header_mask` the mask
    /// in the header (the active lanes are those below `L`). Inlined: the opener builds the
    /// port where it keeps it.
    #[inline]
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn opened(
        mailbox: &Mailbox<'a>,
        locks: &'a [AtomicU32],
        index: u32,
        header_mask: u64,
        opcode: Opcode,
        out: u32,
        wait: &'a dyn Wait,
        doorbell: Option<&'a AtomicU64>,
    ) -> Self {
        let (primary, secondary) = mailbox.flags(index);
        let (theirs, ours) = if SERVER {
            (secondary, primary)
        } else {
            (primary, secondary)
        };
        let layout = mailbox.layout();
        Port {
            index,
            inbox: theirs,
            outbox: ours,
            packets: mailbox.packets(index),
            locks,
            mask: header_mask & layout.lane_mask(),
            header_mask,
            lanes: layout.lanes(),
            opcode,
            out,
            owns: true,
            receive: false,
            wait,
            resumable: wait.resumable(),
            doorbell,
            gave_up: false,
        }
    }

    pub fn index(&self) -> u32 {
        self.index
    }
    pub fn opcode(&self) -> Opcode {
        self.opcode
    }
    /// The active lanes (header mask bits below `L`).
    pub fn mask(&self) -> u64 {
        self.mask
    }
    /// The lane size `L`.
    pub fn lane_size(&self) -> u32 {
        self.lanes
    }
    /// The first active lane (0 when the mask is empty).
    pub fn first_lane(&self) -> u32 {
        self.mask.trailing_zeros().min(self.lanes.saturating_sub(1))
    }

    /// Whether the other side's word says the buffer is ours. Relaxed: a poll; the acquire
    /// fence in `poll_take` orders the data once it says so.
    #[inline]
    fn owned(&self) -> bool {
        let inbox = normalize(self.inbox.load(Ordering::Relaxed));
        // Client owns iff the words are equal; server owns iff they differ.
        (inbox != self.out) == SERVER
    }

    #[inline]
    fn packet(&self, lane: u32) -> Packet<'a> {
        self.active().packet(lane)
    }

    /// The active lanes and their packets.
    #[inline]
    fn active(&self) -> PortPackets<'a> {
        PortPackets {
            mask: self.mask,
            packets: self.packets,
        }
    }

    /// Whether this side owns the buffer now, taking it if so (see the module's memory-ordering
    /// note). A blocking wait pauses here until it does (or gives up); a resumable one returns
    /// `Pending` at once.
    pub(crate) fn poll_take(&mut self) -> Poll<Result<(), ProtocolError>> {
        if self.owns {
            return Poll::Ready(Ok(()));
        }
        let mut attempt = 0;
        while !self.owned() {
            if self.resumable {
                if self.wait.before_suspending(&|| self.owned()) {
                    break;
                }
                return Poll::Pending;
            }
            if let Err(error) = self.wait.pause(self.index, attempt) {
                self.gave_up = true;
                return Poll::Ready(Err(error));
            }
            attempt = attempt.saturating_add(1);
        }
        // Pairs with the other side's release fence before its flip.
        fence(Ordering::Acquire);
        self.owns = true;
        Poll::Ready(Ok(()))
    }

    /// Waits (or suspends) until this side owns the buffer.
    async fn take_buffer(&mut self) -> Result<(), ProtocolError> {
        core::future::poll_fn(|_| self.poll_take()).await
    }

    /// Hands the buffer to the other side by flipping our own word (a server port's flip goes
    /// through its wait, which may defer it into a `Batch`).
    fn hand_over(&mut self) {
        self.out ^= 1;
        if SERVER {
            self.wait.flip(self.outbox, self.out);
        } else {
            store_own_word(self.outbox, self.out);
        }
        self.owns = false;
    }

    /// Waits for the buffer, lets `fill` write each active lane's packet, hands it over.
    pub(crate) async fn send_async(
        &mut self,
        mut fill: impl FnMut(u32, Packet<'_>),
    ) -> Result<(), ProtocolError> {
        self.take_buffer().await?;
        for lane in lanes(self.mask) {
            fill(lane, self.packet(lane));
        }
        self.hand_over();
        self.receive = false;
        Ok(())
    }

    /// Waits for the other side's packet and lets `use_` read each active lane's. A recv right
    /// after a recv first hands the buffer back as an empty acknowledgement.
    pub(crate) async fn recv_async(
        &mut self,
        mut use_: impl FnMut(u32, Packet<'_>),
    ) -> Result<(), ProtocolError> {
        core::future::poll_fn(|_| self.poll_packets()).await?;
        for lane in lanes(self.mask) {
            use_(lane, self.packet(lane));
        }
        self.receive = true;
        Ok(())
    }

    /// The wait of a recv: acknowledges the last packet if the last operation was a recv too,
    /// then waits for the other side's packets (and asks for their lines). A poll function,
    /// not an `async fn`: one state machine less in every recv (with one, the pipelined rows
    /// read 1.5-2% slower in A/B runs).
    fn poll_packets(&mut self) -> Poll<Result<(), ProtocolError>> {
        self.acknowledge();
        match self.poll_take() {
            Poll::Ready(Ok(())) => {}
            other => return other,
        }
        // The other side wrote each active lane's packet line, so each read below misses. The
        // loop reads them one after the other (each read's use decides what comes next); asked
        // for at once, the lines come in parallel. At L=32 the first reads were three quarters
        // of printf's `recv_n`, and printf lines went up 13-21%. Only the server's ports: a
        // client's loop is the device's (or, here, the bench's measuring instrument).
        self.prefetch_packets();
        Poll::Ready(Ok(()))
    }

    /// Asks for every active lane's packet line at once (a server port's, of more than one
    /// lane), before they are read one after the other: see `poll_packets`.
    #[inline]
    fn prefetch_packets(&self) {
        if SERVER {
            self.active().prefetch();
        }
    }

    /// Hands the buffer of the last recv back, as an empty packet, if the last operation was a
    /// recv: the other side's next send waits for it.
    fn acknowledge(&mut self) {
        if self.receive {
            self.hand_over();
            // Sent: a synchronous `recv` of a resumable port that stops at its wait
            // (`WouldBlock`) and is polled again must not acknowledge twice.
            self.receive = false;
        }
    }

    /// `send(fill)` then `recv(use_)`.
    pub(crate) async fn send_and_recv_async(
        &mut self,
        fill: impl FnMut(u32, Packet<'_>),
        use_: impl FnMut(u32, Packet<'_>),
    ) -> Result<(), ProtocolError> {
        self.send_async(fill).await?;
        self.recv_async(use_).await
    }

    /// Receives, lets `work` rewrite each lane's packet in place, and sends it back.
    pub(crate) async fn recv_and_send_async(
        &mut self,
        work: impl FnMut(u32, Packet<'_>),
    ) -> Result<(), ProtocolError> {
        self.recv_async(|_, _| {}).await?;
        self.send_async(work).await
    }

    /// Sends a byte string per lane (`data[lane]`; lanes past `data.len()` send 0 bytes):
    /// first packet `buf[0] = n` and up to 56 bytes, then 64-byte packets (PROTOCOL section 5).
    pub(crate) async fn send_n_async(&mut self, data: &[&[u8]]) -> Result<(), ProtocolError> {
        let lane_data = |lane: u32| data.get(lane as usize).copied().unwrap_or(&[]);
        self.send_async(|lane, packet| {
            let bytes = lane_data(lane);
            packet.set_word(0, bytes.len() as u64);
            packet.write_bytes(8, &bytes[..bytes.len().min(FIRST_PACKET_BYTES)]);
        })
        .await?;
        let longest = lanes(self.mask)
            .map(|lane| lane_data(lane).len())
            .max()
            .unwrap_or(0);
        let mut offset = FIRST_PACKET_BYTES;
        while offset < longest {
            self.send_async(|lane, packet| {
                let bytes = lane_data(lane);
                if offset < bytes.len() {
                    packet.write_bytes(0, &bytes[offset..bytes.len().min(offset + BUFFER_SIZE)]);
                }
            })
            .await?;
            offset += BUFFER_SIZE;
        }
        Ok(())
    }

    /// Receives a byte string per lane (index = lane; inactive lanes get empty vectors).
    /// A lane claiming more than `bound` bytes ends the exchange with
    /// [`ProtocolError::TooLong`]; memory grows with the bytes actually received, never with
    /// the claimed length.
    pub(crate) async fn recv_n_async(&mut self, bound: u64) -> Result<Vec<Vec<u8>>, ProtocolError> {
        let mut out = Vec::new();
        self.recv_n_within_async(bound, u64::MAX, &mut out, |_| true)
            .await?;
        Ok(out)
    }

    /// `recv_n_async` whose lanes together may claim at most `total` bytes (a request's
    /// budget): above it the script stops as above a lane's `bound`. The strings are received
    /// into `out`'s buffers, emptied (their capacity reused: a server's are recycled). `out` is
    /// borrowed, not moved in: a vector moved into the future was copied there with wider loads
    /// than the stores that had just made it, which the store buffer cannot forward, so each
    /// waited for the exchange's stores to shared memory (`protocol::deferred`): 1-4% of a
    /// pipelined printf (docs/performance.md).
    ///
    /// Before the strings grow past their first packet, `admit` is asked for the bytes the
    /// lanes that go further claim, in sum (the server's memory budget): refused, the rest of
    /// the packets are received and dropped (the exchange stays in step with the client), every
    /// lane's string is left empty, and this returns `Ok(false)`.
    pub(crate) async fn recv_n_within_async(
        &mut self,
        bound: u64,
        total: u64,
        out: &mut Vec<Vec<u8>>,
        admit: impl FnOnce(u64) -> bool,
    ) -> Result<bool, ProtocolError> {
        out.iter_mut().for_each(Vec::clear);
        out.resize_with(self.lanes as usize, Vec::new);
        // Each lane's length, kept only when one goes past the first packet: an array of 64
        // here would be most of a suspended script's size (each is a boxed future).
        let mut lengths: Vec<usize> = Vec::new();
        let lane_count = self.lanes as usize;
        let mut too_long = None;
        let mut claimed = 0u64;
        self.recv_async(|lane, packet| {
            let len = packet.word(0);
            if len > bound {
                too_long.get_or_insert(ProtocolError::TooLong { lane, len, bound });
                return;
            }
            claimed = claimed.saturating_add(len);
            if claimed > total {
                too_long.get_or_insert(ProtocolError::RequestTooLong {
                    len: claimed,
                    bound: total,
                });
                return;
            }
            let len = len as usize; // `bound` fits in usize on every host we build for.
            if len > FIRST_PACKET_BYTES {
                lengths.resize(lane_count, 0);
                lengths[lane as usize] = len;
            }
            // The whole payload is copied and then cut to the lane's length: copies of constant
            // size, where a copy of `len` bytes into zeroed ones was a call to memset and one
            // to memcpy per lane (a printf's three `recv_n` of 32 lanes made 192 such calls).
            let bytes = &mut out[lane as usize];
            bytes.reserve(len.clamp(FIRST_PACKET_BYTES, 1 << 16));
            bytes.extend_from_slice(&packet.payload());
            bytes.truncate(len.min(FIRST_PACKET_BYTES));
        })
        .await?;
        if let Some(error) = too_long {
            // The script stops here although the other side goes on sending: as after a wait
            // that gave up, the port must not be reused by this client (see `Drop`).
            self.gave_up = true;
            return Err(error);
        }
        let longest = lengths.iter().copied().max().unwrap_or(0);
        let admitted = longest <= FIRST_PACKET_BYTES || admit(lengths.iter().sum::<usize>() as u64);
        if !admitted {
            out.iter_mut().for_each(Vec::clear);
        }
        let mut offset = FIRST_PACKET_BYTES;
        while offset < longest {
            core::future::poll_fn(|_| self.poll_packets()).await?;
            // No await from here to the end of the iteration: the scratch `append_packets`
            // reads into lives on the stack, not in the (boxed) future.
            let last = offset + BUFFER_SIZE >= longest;
            match self.lanes {
                _ if !admitted => self.skip_packet(last),
                1 => self.append_packets::<1>(offset, &lengths, last, out),
                32 => self.append_packets::<32>(offset, &lengths, last, out),
                _ => self.append_packets::<64>(offset, &lengths, last, out),
            }
            offset += BUFFER_SIZE;
        }
        Ok(admitted)
    }

    /// A packet of a `recv_n` whose strings are not kept (not admitted): read nothing, hand
    /// the buffer back as `append_packets` does.
    fn skip_packet(&mut self, last: bool) {
        self.receive = true;
        if !last {
            self.acknowledge();
        }
    }

    /// The packets of a `recv_n` after its first, once they are ours: reads each active lane's
    /// bytes from `offset` (of its length in `lengths`) into a scratch of `L` lanes, hands the
    /// buffer back unless these are the `last` bytes, then appends them to `out`. The appends
    /// are stores into vectors far from the cache (a 1 MiB byte string's), and the flip that hands
    /// the buffer back, a store too, would become visible only after them (x86 keeps stores in
    /// order); handed back first, the other side writes its next packet while this side
    /// appends: a 32-lane TEST_STREAM some 3-10% faster in A/B runs (docs/performance.md).
    fn append_packets<const L: usize>(
        &mut self,
        offset: usize,
        lengths: &[usize],
        last: bool,
        out: &mut [Vec<u8>],
    ) {
        let take = |lane: u32| {
            lengths[lane as usize]
                .saturating_sub(offset)
                .min(BUFFER_SIZE)
        };
        let mut scratch = [[0u8; BUFFER_SIZE]; L];
        for lane in lanes(self.mask) {
            self.packet(lane)
                .read_bytes(0, &mut scratch[lane as usize][..take(lane)]);
        }
        self.receive = true;
        if !last {
            // A recv comes next: acknowledge now rather than when it begins. (After the last
            // packet a send may come, which hands the buffer over itself.)
            self.acknowledge();
        }
        for lane in lanes(self.mask) {
            out[lane as usize].extend_from_slice(&scratch[lane as usize][..take(lane)]);
        }
    }

    /// Sends `size` bytes per active lane in `ceil(size / 64)` packets, without a length word
    /// (the fixed-size object variant). Every active lane's slice must have `size` bytes.
    pub(crate) async fn send_fixed_async(
        &mut self,
        size: usize,
        data: &[&[u8]],
    ) -> Result<(), ProtocolError> {
        for lane in lanes(self.mask) {
            let len = data.get(lane as usize).map_or(0, |d| d.len());
            if len != size {
                return Err(ProtocolError::BadLength {
                    lane,
                    len,
                    expected: size,
                });
            }
        }
        for offset in (0..size).step_by(BUFFER_SIZE) {
            let end = size.min(offset + BUFFER_SIZE);
            self.send_async(|lane, packet| {
                packet.write_bytes(0, &data[lane as usize][offset..end])
            })
            .await?;
        }
        Ok(())
    }

    /// Receives `size` bytes per active lane sent by [`Port::send_fixed`].
    pub(crate) async fn recv_fixed_async(
        &mut self,
        size: usize,
    ) -> Result<Vec<Vec<u8>>, ProtocolError> {
        let mut out: Vec<Vec<u8>> = (0..self.lanes).map(|_| Vec::new()).collect();
        for lane in lanes(self.mask) {
            out[lane as usize] = alloc_vec(size);
        }
        for offset in (0..size).step_by(BUFFER_SIZE) {
            let end = size.min(offset + BUFFER_SIZE);
            self.recv_async(|lane, packet| {
                packet.read_bytes(0, &mut out[lane as usize][offset..end])
            })
            .await?;
        }
        Ok(out)
    }

    /// Waits for the buffer, lets `fill` write each active lane's packet, hands it over.
    pub fn send(&mut self, fill: impl FnMut(u32, Packet<'_>)) -> Result<(), ProtocolError> {
        complete(self.index, self.send_async(fill))
    }

    /// Waits for the other side's packet and lets `use_` read each active lane's. A recv right
    /// after a recv first hands the buffer back as an empty acknowledgement.
    pub fn recv(&mut self, use_: impl FnMut(u32, Packet<'_>)) -> Result<(), ProtocolError> {
        complete(self.index, self.recv_async(use_))
    }

    /// `send(fill)` then `recv(use_)`.
    pub fn send_and_recv(
        &mut self,
        fill: impl FnMut(u32, Packet<'_>),
        use_: impl FnMut(u32, Packet<'_>),
    ) -> Result<(), ProtocolError> {
        complete(self.index, self.send_and_recv_async(fill, use_))
    }

    /// Receives, lets `work` rewrite each lane's packet in place, and sends it back.
    pub fn recv_and_send(
        &mut self,
        work: impl FnMut(u32, Packet<'_>),
    ) -> Result<(), ProtocolError> {
        if self.owns && !self.receive {
            // The other side's packet is here already (a server port just opened): nothing to
            // wait for, so no operation to build and poll. The same steps as
            // `recv_and_send_async`'s when neither of its waits waits.
            self.rewrite(work);
            self.hand_over();
            return Ok(());
        }
        complete(self.index, self.recv_and_send_async(work))
    }

    /// Lets `work` rewrite each active lane's packet in place, the other side's packet being
    /// here already and ours (`owns`, and nothing received yet: a server port just opened).
    /// The buffer stays ours: a hand-over, or a server port's close, sends the rewritten
    /// packets back. (The server's packet handlers rewrite a port's [`PortPackets`] instead,
    /// with no port made.)
    #[inline]
    pub(crate) fn rewrite(&self, mut work: impl FnMut(u32, Packet<'_>)) {
        debug_assert!(self.owns && !self.receive, "a packet not ours to rewrite");
        self.prefetch_packets();
        for lane in lanes(self.mask) {
            work(lane, self.packet(lane));
        }
    }

    /// Sends a byte string per lane (see `send_n_async`, PROTOCOL section 5).
    pub fn send_n(&mut self, data: &[&[u8]]) -> Result<(), ProtocolError> {
        complete(self.index, self.send_n_async(data))
    }

    /// Receives a byte string per lane, each at most `bound` bytes (see `recv_n_async`).
    pub fn recv_n(&mut self, bound: u64) -> Result<Vec<Vec<u8>>, ProtocolError> {
        complete(self.index, self.recv_n_async(bound))
    }

    /// Sends `size` bytes per active lane without a length word (see `send_fixed_async`).
    pub fn send_fixed(&mut self, size: usize, data: &[&[u8]]) -> Result<(), ProtocolError> {
        complete(self.index, self.send_fixed_async(size, data))
    }

    /// Receives `size` bytes per active lane sent by [`Port::send_fixed`].
    pub fn recv_fixed(&mut self, size: usize) -> Result<Vec<Vec<u8>>, ProtocolError> {
        complete(self.index, self.recv_fixed_async(size))
    }

    /// Closes the port (the same as dropping it).
    pub fn close(self) {}
}

/// Runs a port operation to completion in one poll: a blocking wait never suspends, so only a
/// [`Resumable`] port can be `Pending` here, and then the operation stops with
/// [`ProtocolError::WouldBlock`] (the exchange is left midway, as after a wait that gave up).
fn complete<T>(
    port: u32,
    operation: impl Future<Output = Result<T, ProtocolError>>,
) -> Result<T, ProtocolError> {
    let mut operation = core::pin::pin!(operation);
    match operation
        .as_mut()
        .poll(&mut Context::from_waker(Waker::noop()))
    {
        Poll::Ready(result) => result,
        Poll::Pending => Err(ProtocolError::WouldBlock { port }),
    }
}

fn alloc_vec(size: usize) -> Vec<u8> {
    core::iter::repeat_n(0, size).collect()
}

impl<'a> Port<'a, true> {
    /// Checks the header mask: non-empty, no bits at or above `L`.
    pub fn check_mask(&self) -> Result<(), ProtocolError> {
        if self.header_mask == 0 || self.header_mask != self.mask {
            return Err(ProtocolError::BadMask {
                mask: self.header_mask,
                lanes: self.lanes,
            });
        }
        Ok(())
    }

    /// Leaves the port as it is, locked: neither flag changes and the lock bit stays set, so
    /// nobody serves the rest of this exchange as a new request (see [`crate::server::dispatch`]). The
    /// doorbell still counts the request as closed. Returns whether we owned the buffer.
    #[cfg(feature = "std")]
    pub(crate) fn quarantine(self) -> bool {
        let owned = self.owns;
        self.count_closed();
        core::mem::forget(self);
        owned
    }

    /// Abandons the exchange: sets our word equal to the client's (the client-owns state of a
    /// finished exchange) and releases the port, whatever step the script was at.
    pub fn reset(mut self) {
        self.out = normalize(self.inbox.load(Ordering::Relaxed));
        // What the wait deferred goes first: a flip of ours must not overtake the reset.
        self.wait.publish();
        store_own_word(self.outbox, self.out);
        self.owns = false;
    }
}

impl<const SERVER: bool> Port<'_, SERVER> {
    /// Counts the request closed in the v2 doorbell (server ports only have one).
    fn count_closed(&self) {
        count_closed(self.doorbell);
    }
}

impl<const SERVER: bool> Drop for Port<'_, SERVER> {
    fn drop(&mut self) {
        // A client that dies mid-exchange keeps its lock, as a trapped GPU warp does (its lock
        // bit is device memory nobody clears): the server may still be inside the exchange,
        // and a new client on the port would have its packets read as the old script's. So
        // does a client whose wait gave up, or whose `recv_n` refused a length: it stopped
        // midway just the same.
        if !SERVER && self.gave_up {
            return;
        }
        #[cfg(feature = "std")]
        if !SERVER && std::thread::panicking() {
            return;
        }
        // Only the server returns a buffer it still owns; the client just unlocks.
        if SERVER && self.owns {
            self.hand_over();
        }
        self.count_closed();
        if SERVER {
            self.wait.unlock(self.locks, self.index);
        } else {
            unlock(self.locks, self.index);
        }
    }
}

/// Counts a request closed in a server's v2 `doorbell`, if it has one.
#[inline]
pub(crate) fn count_closed(doorbell: Option<&AtomicU64>) {
    if let Some(counter) = doorbell {
        // RMW: one open request fewer (PROTOCOL section 9). Saturating, because the device
        // may have written anything there; Relaxed, as the counter orders no other data.
        let _ = counter.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| v.checked_sub(1));
    }
}

/// The active lanes of a server port the client just handed over, and its packets: what a
/// packet handler rewrites in place (`dispatch`'s `Inner::start`, which makes no [`Port`] for
/// it), and what a port reads its packets through.
#[derive(Clone, Copy)]
pub(crate) struct PortPackets<'a> {
    /// The active lanes: the header's mask restricted to real lanes.
    pub(crate) mask: u64,
    /// The port's `8 * L` packet words.
    pub(crate) packets: &'a [DataWord],
}

impl<'a> PortPackets<'a> {
    /// Lane `lane`'s packet.
    #[inline]
    fn packet(&self, lane: u32) -> Packet<'a> {
        Packet {
            words: &self.packets[8 * lane as usize..][..8],
        }
    }

    /// Asks for every active lane's packet line at once (where there are more than one),
    /// before they are read one after the other: see `Port::poll_packets`.
    #[inline]
    fn prefetch(&self) {
        if self.mask.count_ones() > 1 {
            for lane in lanes(self.mask) {
                prefetch(&self.packets[8 * lane as usize]);
            }
        }
    }

    /// Lets `work` rewrite each active lane's packet in place (the lines asked for first);
    /// the buffer's hand-over sends them back.
    #[cfg(feature = "std")]
    #[inline]
    pub(crate) fn rewrite(self, mut work: impl FnMut(u32, Packet<'_>)) {
        self.prefetch();
        for lane in lanes(self.mask) {
            work(lane, self.packet(lane));
        }
    }
}

/// The most flips, and the most unlocks, that wait before a batch is published.
#[cfg_attr(not(feature = "std"), allow(dead_code))]
pub(crate) const BATCH_MAX: usize = 16;

/// Flips and unlocks waiting to be published: words to store and lock bits to clear.
#[cfg_attr(not(feature = "std"), allow(dead_code))]
pub(crate) struct Batch {
    flips: [(Option<NonNull<AtomicU32>>, u32); BATCH_MAX],
    flipped: usize,
    unlocks: [(Option<NonNull<AtomicU32>>, u32); BATCH_MAX],
    unlocked: usize,
}

// SAFETY: the batch holds pointers to atomics only, which any thread may store to; that they
// are still valid when it publishes is its filler's promise (`flip`, `unlock`), wherever it
// is. (No `Drop`: a thread-local holding one then needs no destructor.)
unsafe impl Send for Batch {}

#[cfg_attr(not(feature = "std"), allow(dead_code))]
impl Batch {
    /// Nothing waits.
    pub(crate) const EMPTY: Batch = Batch {
        flips: [(None, 0); BATCH_MAX],
        flipped: 0,
        unlocks: [(None, 0); BATCH_MAX],
        unlocked: 0,
    };

    /// Adds a store of `value` to `word`; publishes if the list is full.
    ///
    /// # Safety
    /// `word` stays valid until the batch is next published (its owner publishes it before it
    /// lets go of the mailboxes it flipped: no drop does).
    pub(crate) unsafe fn flip(&mut self, word: &AtomicU32, value: u32) {
        self.flips[self.flipped] = (Some(NonNull::from(word)), value);
        self.flipped += 1;
        if self.flipped == BATCH_MAX {
            self.publish();
        }
    }

    /// Adds a clear of server port `index`'s bit in `locks`; publishes if the list is full.
    ///
    /// # Safety
    /// `locks` stays valid until the batch is next published (as for `flip`).
    pub(crate) unsafe fn unlock(&mut self, locks: &[AtomicU32], index: u32) {
        let (word, bit) = crate::protocol::mailbox::lock_bit(locks, index);
        self.unlocks[self.unlocked] = (Some(NonNull::from(word)), bit);
        self.unlocked += 1;
        if self.unlocked == BATCH_MAX {
            self.publish();
        }
    }

    /// Stores every waiting flip, in order, then clears every waiting lock bit.
    pub(crate) fn publish(&mut self) {
        if self.flipped == 0 && self.unlocked == 0 {
            return;
        }
        // Release: every packet and header write before a flip is visible before it.
        fence(Ordering::Release);
        for &(word, value) in &self.flips[..self.flipped] {
            // SAFETY: `flip`'s caller keeps every word it added valid until this publish.
            let word = unsafe { word.expect("a recorded flip").as_ref() };
            word.store(value, Ordering::Relaxed);
        }
        for &(locks, bit) in &self.unlocks[..self.unlocked] {
            // SAFETY: as above, for the lock tables (`unlock`).
            let locks = unsafe { locks.expect("a recorded unlock").as_ref() };
            // RMW: clears our bit alone; `Release` publishes the holder's work to the next.
            locks.fetch_and(!bit, Ordering::Release);
        }
        self.flipped = 0;
        self.unlocked = 0;
    }
}

/// Stores this side's word (a flip, or a reset to the other side's value): `fence(Release)`
/// first, so every header and packet write before it is visible to whoever sees the new word
/// (see `port`'s memory-ordering note). The one place a side's word is written after open
/// outside a [`Batch`] (the caller published its wait's batch first, where it has one).
#[inline]
pub(crate) fn store_own_word(word: &AtomicU32, value: u32) {
    fence(Ordering::Release);
    word.store(value, Ordering::Relaxed);
}

#[cfg(all(test, feature = "std", not(loom)))]
mod crowding_tests {
    use super::*;
    use std::time::Duration;

    /// Two yields of a slice's length in a row mark the next [`CROWDED_WAITS`] waits crowded,
    /// each counted at its first look only; a yield of microseconds (another thread of ours
    /// that waits again) marks nothing, and neither does one long yield between short ones
    /// (the process was stopped, not crowded).
    #[test]
    fn two_long_yields_in_a_row_make_the_next_waits_skip_their_yields() {
        let crowding = Crowding::new();
        crowding.note_yield(Duration::from_micros(40));
        assert!(!crowding.skips_yields(true), "a short yield: not crowded");
        crowding.note_yield(Duration::from_millis(30));
        assert!(!crowding.skips_yields(true), "one long yield: not crowded");
        crowding.note_yield(Duration::from_micros(40));
        crowding.note_yield(Duration::from_millis(3));
        assert!(
            !crowding.skips_yields(true),
            "a short yield between: not crowded"
        );
        crowding.note_yield(Duration::from_millis(3));
        for wait in 0..CROWDED_WAITS {
            assert!(
                crowding.skips_yields(false),
                "before wait {wait}: a look counts none"
            );
            assert!(crowding.skips_yields(true), "wait {wait}");
        }
        assert!(
            !crowding.skips_yields(false),
            "then every look yields again"
        );
        assert!(!crowding.skips_yields(true));
        // The probe after them: one long yield marks them again.
        crowding.note_yield(Duration::from_millis(3));
        assert!(crowding.skips_yields(true), "still crowded");
    }
}

#[cfg(all(test, feature = "std", not(loom)))]
pub(crate) mod batch_tests {
    use super::*;

    /// `n` zeroed words, standing in for a mailbox's flags or lock table (the executor's
    /// tests of its batching use them too).
    pub(crate) fn words(n: usize) -> Vec<AtomicU32> {
        (0..n).map(|_| AtomicU32::new(0)).collect()
    }

    /// The values of `words`, in order.
    pub(crate) fn read(words: &[AtomicU32]) -> Vec<u32> {
        words.iter().map(|w| w.load(Ordering::Relaxed)).collect()
    }

    #[test]
    fn a_batch_publishes_its_flips_in_order_then_its_unlocks() {
        let (flags, locks) = (words(3), words(2));
        locks[0].store(u32::MAX, Ordering::Relaxed);
        locks[1].store(u32::MAX, Ordering::Relaxed);
        let mut batch = Batch::EMPTY;
        // SAFETY: the words outlive the batch.
        unsafe {
            batch.flip(&flags[0], 1);
            batch.flip(&flags[2], 1);
            batch.flip(&flags[0], 0); // A second flip of one port: its last value wins.
            batch.unlock(&locks, 0);
            batch.unlock(&locks, 37);
        }
        assert_eq!(read(&flags), [0, 0, 0], "nothing stored yet");
        assert_eq!(read(&locks), [u32::MAX, u32::MAX], "nothing unlocked yet");
        flags[0].store(7, Ordering::Relaxed); // Overwritten by the publish, in order.
        batch.publish();
        assert_eq!(read(&flags), [0, 0, 1]);
        assert_eq!(read(&locks), [!1, !(1 << 5)]);
    }

    #[test]
    fn a_full_list_and_publish_store_at_once() {
        let (flags, locks) = (words(BATCH_MAX), words(1));
        locks[0].store(u32::MAX, Ordering::Relaxed);
        let mut batch = Batch::EMPTY;
        for word in &flags[..BATCH_MAX - 1] {
            // SAFETY: the words outlive the batch.
            unsafe { batch.flip(word, 1) };
        }
        assert!(read(&flags).iter().all(|&w| w == 0), "{BATCH_MAX} - 1 wait");
        // SAFETY: as above.
        unsafe { batch.flip(&flags[BATCH_MAX - 1], 1) };
        assert!(
            read(&flags).iter().all(|&w| w == 1),
            "the {BATCH_MAX}th publishes"
        );
        // SAFETY: as above.
        unsafe { batch.unlock(&locks, 3) };
        assert_eq!(read(&locks), [u32::MAX]);
        batch.publish();
        assert_eq!(read(&locks), [!(1 << 3)]);
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// The packet's bytes as a plain array, little-endian word by word.
    fn bytes_of(words: &[DataWord]) -> [u8; BUFFER_SIZE] {
        let mut out = [0; BUFFER_SIZE];
        for (i, word) in words.iter().enumerate() {
            out[8 * i..8 * i + 8].copy_from_slice(&word.load(Ordering::Relaxed).to_le_bytes());
        }
        out
    }

    /// Every range of the packet (the word-aligned path and the other): `read_bytes` gives
    /// exactly those bytes, and `write_bytes` changes exactly those, keeping the rest.
    #[test]
    fn byte_ranges_read_and_write_exactly_their_bytes() {
        let before: [u8; BUFFER_SIZE] = core::array::from_fn(|i| i as u8 ^ 0xA5);
        for offset in 0..=BUFFER_SIZE {
            for len in 0..=BUFFER_SIZE - offset {
                let words: Vec<DataWord> = (0..8)
                    .map(|i| {
                        let word: [u8; 8] = before[8 * i..8 * i + 8].try_into().unwrap();
                        DataWord::new(u64::from_le_bytes(word))
                    })
                    .collect();
                let packet = Packet { words: &words };
                let mut read = vec![0xEE; len];
                packet.read_bytes(offset, &mut read);
                assert_eq!(read, before[offset..offset + len], "read {offset}+{len}");

                let data: Vec<u8> = (0..len).map(|i| 0x40 + i as u8).collect();
                packet.write_bytes(offset, &data);
                let mut expected = before;
                expected[offset..offset + len].copy_from_slice(&data);
                assert_eq!(bytes_of(&words), expected, "write {offset}+{len}");
            }
        }
    }
}

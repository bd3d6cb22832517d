//! An adversarial client: a "device" that writes the mailbox's raw words directly, at the
//! layout's offsets, with no regard for the protocol. It models a buggy or hostile GPU kernel:
//! random opcodes, lane masks with bits at or above `L`, garbage headers and packets, stream
//! lengths up to 2^64-1, garbage in both mailbox words (its own and the server's), sends where
//! the script expects a receive, and scripts abandoned at any step.
//!
//! The server must survive all of it: no panic out of a handler, no hang, no leak, and a
//! well-formed request served correctly afterwards (`tests/tests/adversarial.rs`).
//!
//! # Memory ordering
//! Every access is atomic (the server only ever reads the region through atomics too), so the
//! garbage is only garbage values, never a data race. [`RawMailbox::send`] does what a real
//! client does (`fence(Release)`, then a relaxed store of its flipped word) and
//! [`RawMailbox::wait_owned`] pairs with the server's release fence by `fence(Acquire)` after
//! seeing the server's flip; the other writes are deliberately unordered.

use std::marker::PhantomData;
use std::time::{Duration, Instant};

use rpc_core::sync::{fence, AtomicU32, AtomicU64, Ordering};
use rpc_core::{Layout, MailboxMemory};

/// One step of an adversarial script on one port.
#[derive(Clone, Debug)]
pub enum Step {
    /// Writes the port's header: any mask (bits above `L`, 0) and any opcode.
    Header { mask: u64, opcode: u32 },
    /// Writes word `word % 8` of lane `lane % L`'s packet (e.g. a stream length of 2^64-1).
    Word { lane: u32, word: u8, value: u64 },
    /// Writes every word of every lane's packet with values derived from `seed`.
    Fill { seed: u64 },
    /// Writes bytes (e.g. a format string) into every lane's packet from byte 8 on, as the first
    /// packet of a `send_n` would, with `buf[0]` = `len` (which may lie).
    Text { len: u64, bytes: Vec<u8> },
    /// A proper send: flips the client's word (whoever owns the buffer).
    Send,
    /// Waits up to `ms` milliseconds for the server to hand the buffer back, then reads it.
    Receive { ms: u8 },
    /// Stores a garbage value into the client's own word.
    Secondary(u32),
    /// Stores a garbage value into the server's word (a device scribbling where it must not).
    Primary(u32),
    /// Ends the script here, whatever state the exchange is in.
    Abandon,
}

/// The raw words of a mailbox held in a [`MailboxMemory`].
#[derive(Clone, Copy)]
pub struct RawMailbox<'a> {
    base: *mut u8,
    layout: Layout,
    _memory: PhantomData<&'a MailboxMemory>,
}

// SAFETY: the region is only ever accessed through atomics (see the module's ordering note);
// sharing the base pointer between threads shares nothing but atomic access.
unsafe impl Send for RawMailbox<'_> {}
// SAFETY: as above.
unsafe impl Sync for RawMailbox<'_> {}

impl<'a> RawMailbox<'a> {
    pub fn new(memory: &'a MailboxMemory) -> Self {
        RawMailbox {
            base: memory.as_ptr(),
            layout: memory.layout(),
            _memory: PhantomData,
        }
    }

    pub fn layout(&self) -> Layout {
        self.layout
    }

    fn u32_at(&self, offset: usize) -> &'a AtomicU32 {
        assert!(offset % 4 == 0 && offset + 4 <= self.layout.total_size());
        // SAFETY: `offset` lies inside the region (checked above) which `'a` keeps allocated;
        // the region is 64-aligned so the address is 4-aligned; every access to the region in
        // this process is atomic (the server's views and this helper), as `from_ptr` requires.
        unsafe { AtomicU32::from_ptr(self.base.add(offset).cast()) }
    }

    fn u64_at(&self, offset: usize) -> &'a AtomicU64 {
        assert!(offset % 8 == 0 && offset + 8 <= self.layout.total_size());
        // SAFETY: as in `u32_at`, with an 8-aligned offset.
        unsafe { AtomicU64::from_ptr(self.base.add(offset).cast()) }
    }

    /// `primary[port]`, the server's word.
    pub fn primary(&self, port: u32) -> &'a AtomicU32 {
        self.u32_at(self.layout.primary() + 4 * port as usize)
    }
    /// `secondary[port]`, the client's word.
    pub fn secondary(&self, port: u32) -> &'a AtomicU32 {
        self.u32_at(self.layout.secondary() + 4 * port as usize)
    }
    /// Header word `k` (0: mask, 1: opcode) of `port`.
    pub fn header(&self, port: u32, k: usize) -> &'a AtomicU64 {
        self.u64_at(self.layout.header() + 16 * port as usize + 8 * k)
    }
    /// Word `word` of lane `lane`'s packet of `port`.
    pub fn packet(&self, port: u32, lane: u32, word: usize) -> &'a AtomicU64 {
        let lanes = self.layout.lanes() as usize;
        let buffer = port as usize * lanes + lane as usize;
        self.u64_at(self.layout.packet() + 64 * buffer + 8 * word)
    }

    /// True if the client owns `port`'s buffer (the words are equal, any non-zero being 1).
    pub fn client_owns(&self, port: u32) -> bool {
        let c = self.secondary(port).load(Ordering::Relaxed) != 0;
        let s = self.primary(port).load(Ordering::Relaxed) != 0;
        c == s
    }

    /// Hands the buffer over as a client does: release fence, then flip the client's word.
    pub fn send(&self, port: u32) {
        fence(Ordering::Release);
        let word = self.secondary(port);
        let flipped = u32::from(word.load(Ordering::Relaxed) == 0);
        word.store(flipped, Ordering::Relaxed);
    }

    /// Waits (backing off) up to `timeout` for the client to own `port`; true if it does.
    pub fn wait_owned(&self, port: u32, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut attempt = 0u32;
        loop {
            if self.client_owns(port) {
                // Pairs with the server's release fence before its flip.
                fence(Ordering::Acquire);
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            rpc_core::port::Backoff::step(attempt);
            attempt = attempt.saturating_add(1);
        }
    }

    /// Runs `steps` on `port` and returns how many were taken (a script stops at `Abandon`).
    /// Bounded: each step either writes a few words or waits at most 255 ms.
    pub fn run(&self, port: u32, steps: &[Step]) -> usize {
        let lanes = self.layout.lanes();
        for (taken, step) in steps.iter().enumerate() {
            match step {
                Step::Header { mask, opcode } => {
                    self.header(port, 0).store(mask.to_le(), Ordering::Relaxed);
                    self.header(port, 1)
                        .store(u64::from(*opcode).to_le(), Ordering::Relaxed);
                }
                Step::Word { lane, word, value } => self
                    .packet(port, lane % lanes, usize::from(word % 8))
                    .store(value.to_le(), Ordering::Relaxed),
                Step::Fill { seed } => {
                    for lane in 0..lanes {
                        for word in 0..8 {
                            let value = seed
                                .rotate_left(lane * 8 + word as u32)
                                .wrapping_mul(0x9E37_79B9_7F4A_7C15);
                            self.packet(port, lane, word)
                                .store(value, Ordering::Relaxed);
                        }
                    }
                }
                Step::Text { len, bytes } => {
                    let mut first = [0u8; 56];
                    let n = bytes.len().min(56);
                    first[..n].copy_from_slice(&bytes[..n]);
                    for lane in 0..lanes {
                        self.packet(port, lane, 0)
                            .store(len.to_le(), Ordering::Relaxed);
                        for (k, chunk) in first.chunks_exact(8).enumerate() {
                            let word = u64::from_le_bytes(chunk.try_into().expect("8 bytes"));
                            self.packet(port, lane, k + 1)
                                .store(word.to_le(), Ordering::Relaxed);
                        }
                    }
                }
                Step::Send => self.send(port),
                Step::Receive { ms } => {
                    if self.wait_owned(port, Duration::from_millis(u64::from(*ms))) {
                        // Read the reply as a client would (the values do not matter).
                        let mut sum = 0u64;
                        for lane in 0..lanes {
                            sum = sum
                                .wrapping_add(self.packet(port, lane, 0).load(Ordering::Relaxed));
                        }
                        std::hint::black_box(sum);
                    }
                }
                Step::Secondary(value) => self.secondary(port).store(*value, Ordering::Relaxed),
                Step::Primary(value) => self.primary(port).store(*value, Ordering::Relaxed),
                Step::Abandon => return taken,
            }
        }
        steps.len()
    }
}

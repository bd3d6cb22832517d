//! An adversarial client: a "device" that writes the mailbox's raw words directly, at the
//! layout's offsets, with no regard for the protocol. It models a buggy or hostile GPU kernel:
//! random opcodes, lane masks with bits at or above `L`, garbage headers and packets, byte-string
//! lengths up to 2^64-1, garbage in both mailbox words (its own and the server's), sends where
//! the script expects a receive, and scripts abandoned at any step. It can also follow the
//! protocol honestly ([`Step::Open`] to [`Step::Strings`]: multi-packet byte strings, printf's
//! string requests) while sending hostile contents, keep what the server hands it (handles,
//! addresses: [`Loot`]) and use it, forged or on another mailbox, and be slow between packets.
//!
//! The server must survive all of it: no panic out of a handler, no hang, no leak, and a
//! well-formed request served correctly afterwards (`workloads/tests/adversarial.rs`).
//!
//! # Memory ordering
//! Every access is atomic (the server only ever reads the region through atomics too), so the
//! garbage is only garbage values, never a data race. [`RawMailbox::send`] does what a real
//! client does (`fence(Release)`, then a relaxed store of its flipped word) and
//! [`RawMailbox::wait_owned`] pairs with the server's release fence by `fence(Acquire)` after
//! seeing the server's flip; the other writes are deliberately unordered.

use std::marker::PhantomData;
use std::time::{Duration, Instant};

use rpc_core::protocol::{BUFFER_SIZE, FIRST_PACKET_BYTES};
use std::sync::atomic::{fence, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

use plugin_host::lock;
use rpc_core::protocol::{Layout, MailboxMemory};
use rpc_core::MailboxId;

/// One step of an adversarial script on one port.
///
/// The raw steps (`Header` to `Abandon`) write words with no regard for whose turn it is. The
/// honest steps (`Open` to `Strings`) follow the client's side of the protocol as
/// `rpc_core::protocol::Client` does (wait for the buffer, write, flip; a receive after a receive first
/// hands the buffer back), each wait bounded by its `ms`: a wait that runs out ends the script
/// there, as a warp that gave up would. What they send may still be anything.
#[derive(Clone, Debug)]
pub enum Step {
    /// Writes the port's header: any mask (bits above `L`, 0) and any opcode.
    Header { mask: u64, opcode: u32 },
    /// Writes word `word % 8` of lane `lane % L`'s packet (e.g. a byte string's length of 2^64-1).
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
    /// Opens an exchange: waits for the buffer, writes the header (any mask, any opcode).
    Open { mask: u64, opcode: u32, ms: u8 },
    /// An honest send: every lane's packet gets `bytes` from byte 0 (e.g. an fopen mode), then
    /// the `words` (index `% 8`, value), the other bytes unchanged.
    Put {
        words: Vec<(u8, Value)>,
        bytes: Vec<u8>,
        ms: u8,
    },
    /// An honest `send_n` of `bytes` in every lane, claiming `claim` bytes (the true length if
    /// `None`), giving up after `cut` packets if set.
    PutString {
        bytes: Vec<u8>,
        claim: Option<u64>,
        cut: Option<u16>,
        ms: u8,
    },
    /// An honest receive; with `keep`, the first active lane's word 0 goes to the loot (a
    /// handle from OPEN_FILE, an address from MALLOC).
    Get { keep: Option<Kind>, ms: u8 },
    /// An honest `recv_n` (the server's reply to a read), giving up after `packets` packets.
    GetString { packets: u16, ms: u8 },
    /// printf's string requests, up to `lens.len()` of them: receive; while the reply asks for
    /// a string (`buf[0] = 0`, a pointer in `buf[1]` of an active lane), answer it with a
    /// `send_n` of `lens[k]` bytes (NUL-terminated when `nul`); any other reply ends the step.
    Strings { lens: Vec<u16>, nul: bool, ms: u8 },
    /// A slow client: gives up the thread `yields` times, then parks for `park_us`
    /// microseconds (if not 0). Nothing may depend on how long that is.
    Pause { yields: u8, park_us: u8 },
}

/// What a loot value is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A stream handle OPEN_FILE answered.
    Handle,
    /// An address MALLOC answered.
    Address,
}

/// A word an honest step writes.
#[derive(Clone, Debug)]
pub enum Value {
    Plain(u64),
    /// One of the values of this kind the adversaries were handed (three times in four one
    /// handed to the script's own mailbox, if there is one); 0 if there is none.
    Loot {
        kind: Kind,
        k: u16,
    },
    /// A forgery made from such a value: a handle with one tag bit flipped or the next slot,
    /// an address a few bytes off (never where an allocation starts: all are 16-byte aligned).
    Forged {
        kind: Kind,
        k: u16,
    },
}

/// Non-zero values the adversaries were handed, with the mailbox each was handed on, shared
/// by every script (of every mailbox, and of the cases before, whose mailboxes are detached):
/// so what one mailbox got is tried on another. Bounded: the oldest values go first.
#[derive(Default)]
pub struct Loot {
    values: Mutex<Vec<(MailboxId, Kind, u64)>>,
    /// Loot values a script used on a mailbox other than the one that was handed them.
    foreign_uses: AtomicUsize,
}

/// Loot values kept.
const LOOT_KEPT: usize = 64;

impl Loot {
    pub fn new() -> Self {
        Self::default()
    }

    fn keep(&self, mailbox: MailboxId, kind: Kind, value: u64) {
        if value == 0 {
            return;
        }
        let mut values = lock(&self.values);
        if values.len() == LOOT_KEPT {
            values.remove(0);
        }
        values.push((mailbox, kind, value));
    }

    /// A value of `kind` for a script on `user`: for three `k` in four one handed to `user`
    /// itself, if there is one; else any (most likely another mailbox's).
    fn pick(&self, kind: Kind, k: u16, user: MailboxId) -> u64 {
        let values = lock(&self.values);
        let of_kind = |own: bool| -> Vec<(MailboxId, u64)> {
            values
                .iter()
                .filter(|&&(m, kd, _)| kd == kind && (!own || m == user))
                .map(|&(m, _, v)| (m, v))
                .collect()
        };
        let own = of_kind(true);
        let choices = if k % 4 != 0 && !own.is_empty() {
            own
        } else {
            of_kind(false)
        };
        let Some(&(owner, value)) = choices.get(usize::from(k / 4) % choices.len().max(1)) else {
            return 0;
        };
        if owner != user {
            // RMW: one more use (a tally; orders nothing).
            self.foreign_uses.fetch_add(1, Ordering::Relaxed);
        }
        value
    }

    fn resolve(&self, value: &Value, user: MailboxId) -> u64 {
        match *value {
            Value::Plain(v) => v,
            Value::Loot { kind, k } => self.pick(kind, k, user),
            Value::Forged { kind, k } => match (kind, self.pick(kind, k, user)) {
                (_, 0) => 0,
                (Kind::Handle, h) if k % 2 == 0 => h ^ (1 << (32 + u32::from(k) % 32)),
                (Kind::Handle, h) => h.wrapping_add(4),
                (Kind::Address, a) => a.wrapping_add(8 * (1 + 2 * u64::from(k % 4))),
            },
        }
    }

    /// Forgets the addresses (the handles stay): once their mailboxes are detached, the
    /// allocator may hand the same addresses out again, to anyone.
    pub fn forget_addresses(&self) {
        lock(&self.values).retain(|&(_, kind, _)| kind != Kind::Address);
    }

    /// The values of `kind` handed to mailboxes other than `mailbox`.
    pub fn foreign(&self, mailbox: MailboxId, kind: Kind) -> Vec<u64> {
        lock(&self.values)
            .iter()
            .filter(|&&(m, kd, _)| m != mailbox && kd == kind)
            .map(|&(_, _, v)| v)
            .collect()
    }

    /// How often a script used a value handed to another mailbox.
    pub fn foreign_uses(&self) -> usize {
        self.foreign_uses.load(Ordering::Relaxed)
    }
}

/// Where a script runs: its port, its mailbox (for the loot) and the loot.
#[derive(Clone, Copy)]
pub struct Seat<'l> {
    pub port: u32,
    pub mailbox: MailboxId,
    pub loot: &'l Loot,
}

/// An honest wait that ran out: the script ends.
struct GaveUp;

/// The honest side's state on one port, as a `ClientPort` keeps it.
struct Talk {
    /// The last honest operation was a receive (the next one first hands the buffer back).
    receive: bool,
    /// The header's mask within the lanes (for reading replies).
    mask: u64,
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
            rpc_core::protocol::Backoff::step(attempt);
            attempt = attempt.saturating_add(1);
        }
    }

    /// Writes `bytes` from byte `offset` into every lane's packet of `port` (the rest of each
    /// packet unchanged).
    fn write_bytes(&self, port: u32, offset: usize, bytes: &[u8]) {
        let n = bytes.len().min(BUFFER_SIZE - offset);
        for lane in 0..self.layout.lanes() {
            let mut packet = [0u8; BUFFER_SIZE];
            for (k, word) in packet.chunks_exact_mut(8).enumerate() {
                let value = u64::from_le(self.packet(port, lane, k).load(Ordering::Relaxed));
                word.copy_from_slice(&value.to_le_bytes());
            }
            packet[offset..offset + n].copy_from_slice(&bytes[..n]);
            for (k, word) in packet.chunks_exact(8).enumerate() {
                let value = u64::from_le_bytes(word.try_into().expect("8 bytes"));
                self.packet(port, lane, k)
                    .store(value.to_le(), Ordering::Relaxed);
            }
        }
    }

    /// The lanes of `talk.mask` (lane 0 if none: a bad mask's reply is read from lane 0).
    fn active(&self, talk: &Talk) -> impl Iterator<Item = u32> {
        let mask = if talk.mask == 0 { 1 } else { talk.mask };
        rpc_core::protocol::lanes(mask)
    }

    /// The client's send: waits for the buffer, lets `fill` write it, flips.
    fn put(&self, port: u32, talk: &mut Talk, ms: u8, fill: impl FnOnce()) -> Result<(), GaveUp> {
        if !self.wait_owned(port, Duration::from_millis(u64::from(ms))) {
            return Err(GaveUp);
        }
        fill();
        self.send(port);
        talk.receive = false;
        Ok(())
    }

    /// The client's receive: hands the buffer back after a receive, waits for it, reads words 0
    /// and 1 of each active lane.
    fn get(&self, port: u32, talk: &mut Talk, ms: u8) -> Result<Vec<[u64; 2]>, GaveUp> {
        if talk.receive {
            self.send(port);
        }
        if !self.wait_owned(port, Duration::from_millis(u64::from(ms))) {
            return Err(GaveUp);
        }
        talk.receive = true;
        Ok(self
            .active(talk)
            .map(|lane| {
                [0, 1].map(|w| u64::from_le(self.packet(port, lane, w).load(Ordering::Relaxed)))
            })
            .collect())
    }

    /// The client's `send_n` of `bytes` in every lane, claiming `claim` bytes.
    fn put_string(
        &self,
        port: u32,
        talk: &mut Talk,
        (bytes, claim, cut, ms): (&[u8], u64, Option<u16>, u8),
    ) -> Result<(), GaveUp> {
        self.put(port, talk, ms, || {
            for lane in 0..self.layout.lanes() {
                self.packet(port, lane, 0)
                    .store(claim.to_le(), Ordering::Relaxed);
            }
            self.write_bytes(port, 8, &bytes[..bytes.len().min(FIRST_PACKET_BYTES)]);
        })?;
        let mut sent = 1u16;
        let mut offset = FIRST_PACKET_BYTES;
        while offset < bytes.len() {
            if cut.is_some_and(|cut| sent >= cut) {
                return Err(GaveUp);
            }
            let end = bytes.len().min(offset + BUFFER_SIZE);
            self.put(port, talk, ms, || {
                self.write_bytes(port, 0, &bytes[offset..end])
            })?;
            offset = end;
            sent = sent.saturating_add(1);
        }
        Ok(())
    }

    /// The client's `recv_n`: the first packet's lengths, then as many packets as the longest
    /// needs, at most `packets` in all.
    fn get_string(&self, port: u32, talk: &mut Talk, packets: u16, ms: u8) -> Result<(), GaveUp> {
        let first = self.get(port, talk, ms)?;
        let longest = first.iter().map(|[len, _]| *len).max().unwrap_or(0);
        let mut offset = FIRST_PACKET_BYTES as u64;
        let mut taken = 1u16;
        while offset < longest {
            if taken >= packets {
                return Err(GaveUp);
            }
            self.get(port, talk, ms)?;
            offset += BUFFER_SIZE as u64;
            taken += 1;
        }
        Ok(())
    }

    /// printf's string requests (see [`Step::Strings`]).
    fn strings(
        &self,
        port: u32,
        talk: &mut Talk,
        (lens, nul, ms): (&[u16], bool, u8),
    ) -> Result<(), GaveUp> {
        for &len in lens {
            let reply = self.get(port, talk, ms)?;
            let asks = reply.first().is_some_and(|[w0, _]| *w0 == 0)
                && reply.iter().any(|[_, pointer]| *pointer != 0);
            if !asks {
                return Ok(());
            }
            let mut string: Vec<u8> = (0..len).map(|i| b'a' + (i % 26) as u8).collect();
            if nul {
                string.push(0);
            }
            let claim = string.len() as u64;
            self.put_string(port, talk, (&string, claim, None, ms))?;
        }
        Ok(())
    }

    /// Runs `steps` on the seat's port and returns how many were taken (a script stops at
    /// `Abandon` and where an honest step's wait runs out). Bounded: each step writes a few
    /// words or waits at most 255 ms per packet, and a byte string has at most 2^16 packets.
    pub fn run(&self, seat: Seat<'_>, steps: &[Step]) -> usize {
        let port = seat.port;
        let lanes = self.layout.lanes();
        let mut talk = Talk {
            receive: false,
            mask: self.layout.lane_mask(),
        };
        for (taken, step) in steps.iter().enumerate() {
            let honest = match step {
                Step::Header { mask, opcode } => {
                    self.header(port, 0).store(mask.to_le(), Ordering::Relaxed);
                    self.header(port, 1)
                        .store(u64::from(*opcode).to_le(), Ordering::Relaxed);
                    talk.mask = mask & self.layout.lane_mask();
                    Ok(())
                }
                Step::Word { lane, word, value } => {
                    self.packet(port, lane % lanes, usize::from(word % 8))
                        .store(value.to_le(), Ordering::Relaxed);
                    Ok(())
                }
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
                    Ok(())
                }
                Step::Text { len, bytes } => {
                    for lane in 0..lanes {
                        self.packet(port, lane, 0)
                            .store(len.to_le(), Ordering::Relaxed);
                    }
                    let mut first = [0u8; FIRST_PACKET_BYTES];
                    let n = bytes.len().min(FIRST_PACKET_BYTES);
                    first[..n].copy_from_slice(&bytes[..n]);
                    self.write_bytes(port, 8, &first);
                    Ok(())
                }
                Step::Send => {
                    self.send(port);
                    talk.receive = false;
                    Ok(())
                }
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
                    Ok(())
                }
                Step::Secondary(value) => {
                    self.secondary(port).store(*value, Ordering::Relaxed);
                    Ok(())
                }
                Step::Primary(value) => {
                    self.primary(port).store(*value, Ordering::Relaxed);
                    Ok(())
                }
                Step::Abandon => return taken,
                Step::Open { mask, opcode, ms } => {
                    if self.wait_owned(port, Duration::from_millis(u64::from(*ms))) {
                        self.header(port, 0).store(mask.to_le(), Ordering::Relaxed);
                        self.header(port, 1)
                            .store(u64::from(*opcode).to_le(), Ordering::Relaxed);
                        talk = Talk {
                            receive: false,
                            mask: mask & self.layout.lane_mask(),
                        };
                        Ok(())
                    } else {
                        Err(GaveUp)
                    }
                }
                Step::Put { words, bytes, ms } => {
                    let values: Vec<(usize, u64)> = words
                        .iter()
                        .map(|(w, v)| (usize::from(w % 8), seat.loot.resolve(v, seat.mailbox)))
                        .collect();
                    self.put(port, &mut talk, *ms, || {
                        self.write_bytes(port, 0, bytes);
                        for lane in 0..lanes {
                            for &(w, value) in &values {
                                self.packet(port, lane, w)
                                    .store(value.to_le(), Ordering::Relaxed);
                            }
                        }
                    })
                }
                Step::PutString {
                    bytes,
                    claim,
                    cut,
                    ms,
                } => {
                    let claim = claim.unwrap_or(bytes.len() as u64);
                    self.put_string(port, &mut talk, (bytes, claim, *cut, *ms))
                }
                Step::Get { keep, ms } => self.get(port, &mut talk, *ms).map(|reply| {
                    if let (Some(kind), Some([value, _])) = (keep, reply.first()) {
                        seat.loot.keep(seat.mailbox, *kind, *value);
                    }
                }),
                Step::GetString { packets, ms } => self.get_string(port, &mut talk, *packets, *ms),
                Step::Strings { lens, nul, ms } => self.strings(port, &mut talk, (lens, *nul, *ms)),
                Step::Pause { yields, park_us } => {
                    for _ in 0..*yields {
                        std::thread::yield_now();
                    }
                    if *park_us > 0 {
                        std::thread::park_timeout(Duration::from_micros(u64::from(*park_us)));
                    }
                    Ok(())
                }
            };
            if honest.is_err() {
                return taken;
            }
        }
        steps.len()
    }
}

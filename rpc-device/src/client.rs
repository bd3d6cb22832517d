//! The client object and the ports: LLVM libc's client side (`rpc.h`'s `Client`), run by
//! every lane of a warp at once.
//!
//! # The client object
//! [`struct@__llvm_rpc_client`] is the object the runtime fills when it loads the image
//! (PROTOCOL section 8): the port count, the mailbox's addresses and, after them, the port
//! lock bits, which only this device's warps use. Its size names the generation: v2 (2096
//! bytes, LLVM 23+) by default, v1 (552 bytes, LLVM 20-22) with the `v1` feature; the sizes
//! and offsets are rpc-core's ([`Generation`]), checked at compile time.
//!
//! # A port, lane by lane
//! Every lane of the warp runs each call with the same mask (the lanes that reached it). The
//! first lane of the mask does the warp's shared work (the lock bit, the header, the flips);
//! each lane reads and writes its own packet slot; words the warp must agree on (the lock's
//! old bits, the server's flag) are read by the first lane and broadcast.
//!
//! # Memory ordering
//! Each hand-over is PROTOCOL section 3's, at system scope (see `arch`):
//! - taking the lock bit: the first lane's `fetch_or`, then an acquire fence that pairs with
//!   the release `fetch_and` of the last holder's close, so its flips are seen;
//! - before the buffers are used: the server's flag is loaded relaxed, then an acquire fence
//!   pairs with the release fence before the server's last flip, so its writes of the
//!   buffers (a reply) are seen, and its reads of them are done before ours are overwritten;
//! - handing them over: every lane's release fence after its slot's writes, the lanes meet
//!   (`sync_lane`), then the first lane's relaxed store of the flipped word: the server's
//!   acquire after it sees every lane's slot and the header.
//!
//! The packet words are relaxed atomics: the fences order them, and they never race.

use core::cell::UnsafeCell;
use core::mem::{offset_of, size_of};
use core::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};

use rpc_core::protocol::{Generation, Opcode, BUFFER_SIZE};

use crate::arch;

/// The generation of this build's client object: v2, or v1 with the `v1` feature.
pub const GENERATION: Generation = if cfg!(feature = "v1") {
    Generation::V1
} else {
    Generation::V2
};

/// The client object's pointers: \[v2: doorbell\], inbox, outbox, header, packet.
const POINTERS: usize = (GENERATION.client_object_locks() - 8) / 8;
/// The lock words: one bit per port of the generation's largest mailbox.
const LOCK_WORDS: usize = GENERATION.max_port_count() as usize / 32;
/// A packet's words.
pub(crate) const WORDS: usize = BUFFER_SIZE / 8;
/// Bytes of a byte string's first packet (after its length word).
const FIRST_BYTES: usize = BUFFER_SIZE - 8;

/// LLVM libc's client object (PROTOCOL section 8), which the runtime writes when it loads the
/// image. Only the runtime writes the fields before the lock words, and only before any
/// kernel of the image runs.
#[repr(C, align(8))]
pub struct ClientObject {
    port_count: UnsafeCell<u32>,
    _padding: UnsafeCell<u32>,
    pointers: UnsafeCell<[u64; POINTERS]>,
    locks: [AtomicU32; LOCK_WORDS],
}

// SAFETY: the cells are written by the runtime before the image's kernels run and only read
// (volatile) while they run; the lock words are atomics.
unsafe impl Sync for ClientObject {}

const _: () = assert!(size_of::<ClientObject>() == GENERATION.client_object_size());
const _: () = assert!(offset_of!(ClientObject, locks) == GENERATION.client_object_locks());

impl ClientObject {
    const fn new() -> Self {
        ClientObject {
            port_count: UnsafeCell::new(0),
            _padding: UnsafeCell::new(0),
            pointers: UnsafeCell::new([0; POINTERS]),
            locks: [const { AtomicU32::new(0) }; LOCK_WORDS],
        }
    }
}

/// The client object at the symbol a runtime looks for (PROTOCOL section 8): its presence
/// says the image uses RPC, its size the generation.
#[no_mangle]
#[allow(non_upper_case_globals)]
pub static __llvm_rpc_client: ClientObject = ClientObject::new();

/// The mailbox as the client object describes it.
#[derive(Clone, Copy)]
struct Mailbox {
    ports: u32,
    /// The v2 doorbell record's address (0: none, or v1).
    doorbell: u64,
    inbox: *const AtomicU32,
    outbox: *const AtomicU32,
    header: *const AtomicU64,
    packet: *const AtomicU64,
}

impl Mailbox {
    /// The mailbox the runtime wrote into the client object; `None` if it wrote none (the
    /// image was not loaded by an RPC runtime).
    fn get() -> Option<Mailbox> {
        let object = &__llvm_rpc_client;
        // SAFETY: the runtime wrote these before the kernel started; volatile, so that the
        // compiler does not assume the zeros of the static's initialiser.
        let (ports, pointers) = unsafe {
            (
                object.port_count.get().read_volatile(),
                object.pointers.get().read_volatile(),
            )
        };
        if ports == 0 {
            return None;
        }
        let v2 = usize::from(POINTERS == 5);
        let at = |k: usize| pointers[v2 + k] as usize;
        Some(Mailbox {
            ports,
            doorbell: if v2 == 1 { pointers[0] } else { 0 },
            inbox: at(0) as *const AtomicU32,
            outbox: at(1) as *const AtomicU32,
            header: at(2) as *const AtomicU64,
            packet: at(3) as *const AtomicU64,
        })
    }

    /// The server's word of port `index` (< `ports`).
    fn inbox(&self, index: u32) -> &AtomicU32 {
        // SAFETY: the runtime's `ports` words of the mailbox, alive while the image is.
        unsafe { &*self.inbox.add(index as usize) }
    }
    /// The client's word of port `index` (< `ports`).
    fn outbox(&self, index: u32) -> &AtomicU32 {
        // SAFETY: as `inbox`.
        unsafe { &*self.outbox.add(index as usize) }
    }
    /// Port `index`'s header: the lane mask word and the opcode word.
    fn header(&self, index: u32) -> &[AtomicU64; 2] {
        // SAFETY: 16-byte headers, one per port (v1, v2).
        unsafe { &*self.header.add(2 * index as usize).cast::<[AtomicU64; 2]>() }
    }
    /// Port `index`'s packet slot of `lane` (< the lane size `L`).
    fn slot(&self, index: u32, lane: u32) -> &[AtomicU64; WORDS] {
        let words = (index as usize * arch::lane_size() as usize + lane as usize) * WORDS;
        // SAFETY: `L` packets of 64 bytes per port after the headers.
        unsafe { &*self.packet.add(words).cast::<[AtomicU64; WORDS]>() }
    }

    /// Counts an open request in the v2 doorbell, if the runtime set one (PROTOCOL section
    /// 9). The interrupt is not raised: the server polls as well.
    fn ring(&self) {
        if self.doorbell == 0 {
            return;
        }
        let record = self.doorbell as *const u64;
        // SAFETY: the runtime's doorbell record, `value: *u64`, `mailbox: *u64`, `event_id`.
        let (value, mailbox, event) = unsafe {
            (
                record.read_volatile(),
                record.add(1).read_volatile(),
                record.add(2).cast::<u32>().read_volatile(),
            )
        };
        if value == 0 || mailbox == 0 {
            return;
        }
        // SAFETY: the record's words, set by the runtime (both or neither).
        let (value, mailbox) = unsafe {
            (
                &*(value as *const AtomicU64),
                &*(mailbox as *const AtomicU64),
            )
        };
        // RMW: one more open request (n -> n + 1), at system scope: the host decrements it.
        // Relaxed: the flip orders the request itself.
        if arch::fetch_add_system(value, 1) == 0 {
            mailbox.store(u64::from(event), Ordering::Relaxed);
        }
    }
}

/// An open port, one per warp: every lane of its mask holds a copy and makes each call.
/// Dropping it closes the port (releases its lock bit).
pub struct Port {
    mailbox: Mailbox,
    index: u32,
    mask: u64,
    /// The client's word as last stored.
    out: bool,
    /// Whether the last operation was a receive (the next one acknowledges it first).
    receive: bool,
}

/// The lock word of port `index` and its bit.
fn lock_bit(index: u32) -> (&'static AtomicU32, u32) {
    (
        &__llvm_rpc_client.locks[index as usize / 32],
        1 << (index % 32),
    )
}

impl Port {
    /// Opens a port for `opcode` with the lanes running this call, scanning the ports from 0
    /// and waiting (with back-off) until one is free. A program not loaded by an RPC runtime
    /// (no client object written) has no host: the thread stops for good.
    pub fn open(opcode: Opcode) -> Port {
        Self::open_with(opcode, arch::active_mask())
    }

    /// As [`Port::open`] for the lanes of `mask`, every one of which makes this call.
    pub fn open_with(opcode: Opcode, mask: u64) -> Port {
        arch::sync_lane(mask);
        let Some(mailbox) = Mailbox::get() else {
            arch::halt()
        };
        loop {
            for index in 0..mailbox.ports {
                if let Some(port) = Self::try_open(mailbox, index, opcode, mask) {
                    return port;
                }
            }
            arch::pause();
        }
    }

    fn try_open(mailbox: Mailbox, index: u32, opcode: Opcode, mask: u64) -> Option<Port> {
        let (word, bit) = lock_bit(index);
        let before = if arch::is_first_lane(mask) {
            // RMW: sets the port's bit (free -> taken); ours iff it was clear. Relaxed: the
            // fence below is the acquire.
            u64::from(word.fetch_or(bit, Ordering::Relaxed))
        } else {
            0
        };
        if arch::broadcast(mask, before) & u64::from(bit) != 0 {
            return None;
        }
        // Pairs with the release of the last holder's unlock.
        fence(Ordering::Acquire);
        let out = mailbox.outbox(index).load(Ordering::Relaxed) != 0;
        if Self::server_word(mailbox, index, mask) != out {
            // The server still owns the buffers (it is serving the last request).
            Self::unlock(index, mask);
            return None;
        }
        // Pairs with the server's release before its last flip (see the note atop).
        fence(Ordering::Acquire);
        if arch::is_first_lane(mask) {
            let header = mailbox.header(index);
            header[0].store(mask, Ordering::Relaxed);
            header[1].store(u64::from(opcode.0), Ordering::Relaxed);
            mailbox.ring();
        }
        arch::sync_lane(mask);
        Some(Port {
            mailbox,
            index,
            mask,
            out,
            receive: false,
        })
    }

    /// The server's word of port `index` as the first lane of `mask` reads it (any non-zero
    /// value is 1).
    fn server_word(mailbox: Mailbox, index: u32, mask: u64) -> bool {
        let word = mailbox.inbox(index).load(Ordering::Relaxed) != 0;
        arch::broadcast(mask, u64::from(word)) != 0
    }

    fn unlock(index: u32, mask: u64) {
        arch::sync_lane(mask);
        if arch::is_first_lane(mask) {
            let (word, bit) = lock_bit(index);
            // RMW: clears our bit (taken -> free). Release: our flips are done before the
            // next holder's acquire.
            word.fetch_and(!bit, Ordering::Release);
        }
    }

    /// The lanes of this port.
    pub fn mask(&self) -> u64 {
        self.mask
    }

    /// Waits until the client owns the buffers (the server's word equals ours).
    fn wait(&self) {
        while Self::server_word(self.mailbox, self.index, self.mask) != self.out {
            arch::pause();
        }
        fence(Ordering::Acquire);
    }

    /// Hands the buffers to the server: flips the client's word.
    fn flip(&mut self) {
        fence(Ordering::Release);
        arch::sync_lane(self.mask);
        self.out = !self.out;
        if arch::is_first_lane(self.mask) {
            self.mailbox
                .outbox(self.index)
                .store(u32::from(self.out), Ordering::Relaxed);
        }
    }

    /// Sends this lane's packet, which `fill` writes (it starts zeroed).
    pub fn send(&mut self, fill: impl FnOnce(&mut [u64; WORDS])) {
        self.wait();
        let mut packet = [0u64; WORDS];
        fill(&mut packet);
        let slot = self.mailbox.slot(self.index, arch::lane_id());
        for (word, value) in slot.iter().zip(packet) {
            word.store(value, Ordering::Relaxed);
        }
        self.flip();
        self.receive = false;
    }

    /// Receives the server's packet for this lane and hands it to `read`.
    pub fn recv(&mut self, read: impl FnOnce(&[u64; WORDS])) {
        if self.receive {
            // Two receives in a row: the first one's buffer goes back as an acknowledgement.
            self.flip();
        }
        self.wait();
        let slot = self.mailbox.slot(self.index, arch::lane_id());
        let packet: [u64; WORDS] = core::array::from_fn(|i| slot[i].load(Ordering::Relaxed));
        read(&packet);
        self.receive = true;
    }

    /// Sends `bytes` as a byte string (PROTOCOL section 5): the length and the first 56 bytes,
    /// then 64 bytes a packet while any lane of the port has more.
    pub fn send_n(&mut self, bytes: &[u8]) {
        let (first, mut rest) = bytes.split_at(bytes.len().min(FIRST_BYTES));
        self.send(|packet| {
            packet[0] = bytes.len() as u64;
            pack(first, &mut packet[1..]);
        });
        while arch::ballot(self.mask, !rest.is_empty()) != 0 {
            let (now, later) = rest.split_at(rest.len().min(BUFFER_SIZE));
            self.send(|packet| pack(now, packet));
            rest = later;
        }
    }

    /// Receives a byte string (PROTOCOL section 5) into `into`; its length, of which the bytes
    /// past `into`'s end were dropped.
    pub fn recv_n(&mut self, into: &mut [u8]) -> usize {
        let mut len = 0;
        let mut at = 0;
        self.recv(|packet| {
            len = packet[0] as usize;
            at = unpack(&packet[1..], into, 0, len.min(FIRST_BYTES));
        });
        let mut sent = FIRST_BYTES;
        while arch::ballot(self.mask, sent < len) != 0 {
            let take = len.saturating_sub(sent).min(BUFFER_SIZE);
            self.recv(|packet| at = unpack(packet, into, at, take));
            sent += BUFFER_SIZE;
        }
        len
    }
}

impl Drop for Port {
    /// Closes the port: the client only releases its lock bit (the server returns the
    /// buffers when it closes its end).
    fn drop(&mut self) {
        Self::unlock(self.index, self.mask);
    }
}

/// Packs `bytes` into little-endian `words` (as many as they fill).
fn pack(bytes: &[u8], words: &mut [u64]) {
    for (word, chunk) in words.iter_mut().zip(bytes.chunks(8)) {
        let mut le = [0u8; 8];
        le[..chunk.len()].copy_from_slice(chunk);
        *word = u64::from_le_bytes(le);
    }
}

/// Copies the first `take` bytes of little-endian `words` into `into` from `at`, as far as
/// it goes; where the next bytes go.
fn unpack(words: &[u64], into: &mut [u8], at: usize, take: usize) -> usize {
    let bytes = words.iter().flat_map(|w| w.to_le_bytes()).take(take);
    for (slot, byte) in into.iter_mut().skip(at).zip(bytes) {
        *slot = byte;
    }
    at + take
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_client_object_has_the_generations_size() {
        assert_eq!(
            size_of::<ClientObject>(),
            if cfg!(feature = "v1") { 552 } else { 2096 }
        );
    }

    #[test]
    fn packing_is_little_endian_and_unpacking_is_bounded() {
        let mut words = [0u64; 2];
        pack(b"abcdefghij", &mut words);
        assert_eq!(words[0], u64::from_le_bytes(*b"abcdefgh"));
        assert_eq!(words[1], u64::from(b'i') | u64::from(b'j') << 8);
        let mut into = [0u8; 4];
        assert_eq!(unpack(&words, &mut into, 0, 10), 10);
        assert_eq!(&into, b"abcd");
    }
}

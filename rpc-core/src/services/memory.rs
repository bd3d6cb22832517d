//! MALLOC and FREE through the raw allocator the plugin provides, with the server's own books of
//! what each mailbox holds: FREE frees only what MALLOC handed out to the same mailbox and is
//! still live, and a mailbox's memory costs at most `Limits::malloc_bytes`.
//!
//! # What LLVM's GPU allocator asks, and what MALLOC gives
//! LLVM 22's GPU `malloc` (`libc/src/__support/GPU/allocator.cpp`) calls MALLOC only for its
//! 2 MiB slabs and for requests of 1 MiB or more, rounded up to a multiple of 2 MiB; FREE of a
//! 2 MiB-aligned pointer goes to the host, any other pointer belongs to the slab at the 2 MiB
//! boundary below it. So those blocks must be 2 MiB aligned ([`MALLOC_ALIGN`]). Older images
//! (LLVM 18-20) call MALLOC for every `malloc`, of any size. A request of more than
//! [`SMALL_MAX`] bytes therefore gets a block of its own, 2 MiB aligned; a smaller one a chunk
//! of a slab, aligned to its size rounded up to a power of two, at least 16 bytes
//! ([`malloc_alignment`]).
//!
//! # Charged by what is held
//! A plugin's allocator only hands out and takes back blocks of bytes ([`DeviceAllocator`]) at
//! the alignment it states ([`DeviceAllocator::alignment`]); the alignment MALLOC promises is
//! made here, once for every plugin: a block is over-allocated by what its alignment lacks, the
//! device gets the aligned address inside it, and the books remember the block's base to free
//! ([`Block`]). The quota counts each block at what it reserves: its length, padding included,
//! in whole pages ([`cost`]), so the address space a mailbox's allocations take (and with it
//! their resident memory) stays within it. Small requests share slabs ([`SLAB`] bytes of one
//! chunk size each, a power of two; a bit per chunk kept in the books, never in the block,
//! which may be device memory the host cannot touch): a MALLOC(1) costs 16 bytes of a slab, not
//! a block of 2 MiB. A slab is freed with its last chunk.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::vec::Vec;

use super::{active, per_lane, recv_words, send_word0, MailboxState, Refusals};
use crate::server::error::VendorError;
use crate::server::error::{Outcome, ServerError};
use crate::server::limits::device_log;
use crate::server::request::Request;
use crate::sync::lock;

/// Device-accessible memory for the MALLOC/FREE services, raw: blocks of bytes at the alignment
/// the allocator states (the server aligns them further, see the module docs). What kernels
/// forgot to free, the server frees when their mailbox is detached.
pub trait DeviceAllocator: Send + Sync {
    /// A block of `size` bytes (at least 1); returns its device address, 0 if the device has no
    /// memory for it (MALLOC then answers 0, as C's malloc may).
    fn allocate(&self, size: u64) -> Result<u64, VendorError>;
    /// Frees the block of `size` bytes at `addr`.
    ///
    /// # Safety
    /// `addr` and `size` are a block this allocator's `allocate` returned (called with that
    /// `size`) and that was not freed since. (The server's books are what guarantee it: each
    /// block is freed once, by the base and size it was allocated with.)
    unsafe fn deallocate(&self, addr: u64, size: u64) -> Result<(), VendorError>;
    /// The alignment (a power of two) every block `allocate` returns has at least. The server
    /// pads a block by what MALLOC's alignment needs beyond it, and charges the padding to the
    /// mailbox's quota. Default 1: nothing promised, every block padded by the whole alignment.
    fn alignment(&self) -> u64 {
        1
    }
}

/// The largest alignment of MALLOC's memory, that of every block larger than [`SMALL_MAX`]:
/// LLVM's GPU allocator requires 2 MiB.
pub const MALLOC_ALIGN: u64 = 2 << 20;

/// The largest request served from a slab; larger ones get blocks of their own.
pub const SMALL_MAX: u64 = 256 << 10;

/// The smallest chunk of a slab, and the least alignment MALLOC gives (C's `max_align_t`).
const MIN_CHUNK: u64 = 16;

/// The bytes of a slab.
const SLAB: u64 = 2 << 20;

/// The unit the quota counts blocks in: no allocator maps less.
const PAGE: u64 = 4096;

/// Chunk sizes: the powers of two from [`MIN_CHUNK`] to [`SMALL_MAX`].
const CLASSES: usize = (SMALL_MAX.trailing_zeros() - MIN_CHUNK.trailing_zeros() + 1) as usize;

/// The alignment of the address MALLOC answers for `size` bytes: `size` rounded up to a power
/// of two, at least 16 bytes and at most [`MALLOC_ALIGN`] (which every request above
/// [`SMALL_MAX`] gets).
pub fn malloc_alignment(size: u64) -> u64 {
    if size > SMALL_MAX {
        MALLOC_ALIGN
    } else {
        chunk_of(size)
    }
}

/// The chunk a small request gets.
fn chunk_of(size: u64) -> u64 {
    size.max(MIN_CHUNK).next_power_of_two()
}

/// The index of a chunk size among [`CLASSES`].
fn class_of(chunk: u64) -> usize {
    (chunk.trailing_zeros() - MIN_CHUNK.trailing_zeros()) as usize
}

/// What a block of `len` bytes costs the quota: whole pages.
fn cost(len: u64) -> u64 {
    len.saturating_add(PAGE - 1) & !(PAGE - 1)
}

/// A live allocation, as [`super::Services::live_allocations`] reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Allocation {
    /// Device address.
    pub addr: u64,
    /// Bytes the device may use there: what it asked for a block of its own, the chunk (its
    /// request rounded up) in a slab.
    pub size: u64,
}

/// A block of the plugin's allocator: its base and length, as the allocator returned and was
/// asked for them, and the allocator to free it with.
pub(crate) struct Block {
    base: u64,
    len: u64,
    allocator: Arc<dyn DeviceAllocator>,
}

impl Block {
    /// The bytes to ask `allocator` for to hold `size` bytes aligned to `align`: `size` and
    /// what the allocator's own alignment lacks. `None` if that overflows.
    fn length(allocator: &dyn DeviceAllocator, size: u64, align: u64) -> Option<u64> {
        let has = allocator.alignment();
        let has = if has.is_power_of_two() { has } else { 1 };
        size.checked_add(align.saturating_sub(has))
    }

    /// A block holding `size` bytes aligned to `align` (a power of two) from `allocator`, and
    /// the aligned address inside it. `None` if the device had no memory.
    fn allocate(
        allocator: &Arc<dyn DeviceAllocator>,
        size: u64,
        align: u64,
    ) -> core::result::Result<Option<(u64, Block)>, VendorError> {
        let len = Self::length(&**allocator, size, align)
            .ok_or("the size overflows with the alignment")?;
        let base = allocator.allocate(len)?;
        if base == 0 {
            return Ok(None);
        }
        let block = Block {
            base,
            len,
            allocator: allocator.clone(),
        };
        // The aligned bytes must lie inside the block: one that wraps, or an allocator that did
        // not align as it stated, is no block at all (freed again, refused).
        let end = base.checked_add(len);
        let addr = base.checked_add(align - 1).map(|a| a & !(align - 1));
        match (addr, end) {
            (Some(addr), Some(end)) if addr.checked_add(size).is_some_and(|e| e <= end) => {
                Ok(Some((addr, block)))
            }
            _ => {
                block.free()?;
                Err(std::format!(
                    "the allocator returned a block of {len} bytes at {base:#x} that wraps or \
                     holds no {size} bytes aligned to {align:#x}"
                )
                .into())
            }
        }
    }

    /// What the block costs the quota.
    fn cost(&self) -> u64 {
        cost(self.len)
    }

    /// Frees the block through the allocator that made it.
    pub(crate) fn free(self) -> core::result::Result<(), VendorError> {
        // SAFETY: `base` and `len` are what `allocator.allocate(len)` returned and was asked
        // (`Block::allocate`), and `self` is consumed: a `Block` exists once per block, in the
        // books or in the hands of the one who took it out, so the block is freed once.
        unsafe { self.allocator.deallocate(self.base, self.len) }
    }
}

/// A slab: a block of [`SLAB`] bytes cut into chunks of one size, aligned to it, and which of
/// them are live.
struct Slab {
    block: Block,
    /// The first chunk's address.
    start: u64,
    chunk: u64,
    /// Bit `i`: chunk `i` is live (bits past the last chunk are set: never free).
    used: Vec<u64>,
    live: u64,
}

impl Slab {
    fn new(block: Block, start: u64, chunk: u64) -> Slab {
        let chunks = SLAB / chunk;
        let mut used = std::vec![0u64; chunks.div_ceil(64) as usize];
        if chunks % 64 != 0 {
            used[0] = !0 << chunks;
        }
        Slab {
            block,
            start,
            chunk,
            used,
            live: 0,
        }
    }

    /// Takes a free chunk; its address.
    fn take(&mut self) -> Option<u64> {
        let (word, bits) = self
            .used
            .iter_mut()
            .enumerate()
            .find(|(_, bits)| **bits != u64::MAX)?;
        let bit = bits.trailing_ones();
        *bits |= 1 << bit;
        self.live += 1;
        Some(self.start + (word as u64 * 64 + u64::from(bit)) * self.chunk)
    }

    /// Frees the chunk at `addr`; false if no live chunk of this slab starts there.
    fn give(&mut self, addr: u64) -> bool {
        let Some(offset) = addr.checked_sub(self.start) else {
            return false;
        };
        if offset >= SLAB || offset % self.chunk != 0 {
            return false;
        }
        let index = offset / self.chunk;
        let (word, bit) = ((index / 64) as usize, index % 64);
        if self.used[word] & (1 << bit) == 0 {
            return false;
        }
        self.used[word] &= !(1 << bit);
        self.live -= 1;
        true
    }

    fn is_full(&self) -> bool {
        self.used.iter().all(|&bits| bits == u64::MAX)
    }

    /// Its live chunks.
    fn list(&self) -> impl Iterator<Item = Allocation> + '_ {
        let chunks = SLAB / self.chunk;
        (0..chunks)
            .filter(|i| self.used[(i / 64) as usize] & (1 << (i % 64)) != 0)
            .map(|i| Allocation {
                addr: self.start + i * self.chunk,
                size: self.chunk,
            })
    }
}

/// Whether two allocators are the same one.
fn same(a: &Arc<dyn DeviceAllocator>, b: &Arc<dyn DeviceAllocator>) -> bool {
    core::ptr::eq(Arc::as_ptr(a).cast::<()>(), Arc::as_ptr(b).cast::<()>())
}

/// One mailbox's live allocations and what they cost; closed when the mailbox is detached.
#[derive(Default)]
pub(crate) struct Allocations {
    /// Requests above [`SMALL_MAX`], by the address the device got: the size asked, the block.
    blocks: BTreeMap<u64, (u64, Block)>,
    /// Slabs by their first chunk's address.
    slabs: BTreeMap<u64, Slab>,
    /// Per chunk size, the slabs with a free chunk.
    partial: [BTreeSet<u64>; CLASSES],
    /// What the blocks cost, blocks being allocated included (the quota's measure).
    reserved: u64,
    closed: bool,
}

impl Allocations {
    /// Live allocations (blocks and chunks).
    pub(crate) fn len(&self) -> usize {
        let chunks: u64 = self.slabs.values().map(|slab| slab.live).sum();
        self.blocks.len() + chunks as usize
    }

    /// What the mailbox's blocks cost now (see [`cost`]).
    #[cfg(test)]
    fn reserved(&self) -> u64 {
        self.reserved
    }

    /// Live allocations, lowest address first.
    pub(crate) fn list(&self) -> Vec<Allocation> {
        let blocks = self
            .blocks
            .iter()
            .map(|(&addr, &(size, _))| Allocation { addr, size });
        let mut all: Vec<Allocation> = blocks
            .chain(self.slabs.values().flat_map(Slab::list))
            .collect();
        all.sort_by_key(|a| a.addr);
        all
    }

    /// A free chunk of `chunk` bytes in a slab of `allocator`, if one has one.
    fn take_chunk(&mut self, chunk: u64, allocator: &Arc<dyn DeviceAllocator>) -> Option<u64> {
        let partial = &mut self.partial[class_of(chunk)];
        let start = *partial
            .iter()
            .find(|start| same(&self.slabs[start].block.allocator, allocator))?;
        let slab = self.slabs.get_mut(&start)?;
        let addr = slab.take();
        if slab.is_full() {
            partial.remove(&start);
        }
        addr
    }

    /// Counts `cost` more bytes against `quota`; the bytes counted now if they do not fit.
    fn reserve(&mut self, cost: u64, quota: u64) -> core::result::Result<(), u64> {
        match self.reserved.checked_add(cost) {
            Some(total) if total <= quota => {
                self.reserved = total;
                Ok(())
            }
            _ => Err(self.reserved),
        }
    }

    fn unreserve(&mut self, cost: u64) {
        // Saturating: the books may have been closed (emptied) meanwhile.
        self.reserved = self.reserved.saturating_sub(cost);
    }

    /// Records a block of its own for `size` bytes at `addr`; gives it back if the books are
    /// closed (the mailbox was detached while the allocator ran), for the caller to free.
    fn insert_block(&mut self, addr: u64, size: u64, block: Block) -> Result<u64, Block> {
        if self.closed {
            return Err(block);
        }
        if self.blocks.insert(addr, (size, block)).is_some() {
            // The old record's block is dropped unfreed: its address cannot be trusted.
            log::error!("allocator returned {addr:#x}, which is live already");
        }
        Ok(addr)
    }

    /// Records a new slab and takes its first chunk; gives its block back if the books are
    /// closed.
    fn insert_slab(&mut self, mut slab: Slab) -> Result<u64, Block> {
        if self.closed {
            return Err(slab.block);
        }
        let addr = slab.take().expect("a new slab has a free chunk");
        if !slab.is_full() {
            self.partial[class_of(slab.chunk)].insert(slab.start);
        }
        if self.slabs.insert(slab.start, slab).is_some() {
            log::error!("allocator returned {addr:#x}, which is live already");
        }
        Ok(addr)
    }

    /// Frees the allocation at `addr` in the books: `None` if there is none; the block to free
    /// if it was a block of its own or its slab's last chunk.
    fn remove(&mut self, addr: u64) -> Option<Option<Block>> {
        if let Some((_, block)) = self.blocks.remove(&addr) {
            return Some(Some(block));
        }
        let (&start, slab) = self.slabs.range_mut(..=addr).next_back()?;
        if !slab.give(addr) {
            return None;
        }
        let partial = &mut self.partial[class_of(slab.chunk)];
        if slab.live > 0 {
            partial.insert(start);
            return Some(None);
        }
        partial.remove(&start);
        self.slabs.remove(&start).map(|slab| Some(slab.block))
    }

    /// Takes every block out and closes the books: a later insert is refused.
    pub(crate) fn close(&mut self) -> Vec<Block> {
        self.closed = true;
        self.reserved = 0;
        self.partial = Default::default();
        let blocks = std::mem::take(&mut self.blocks)
            .into_values()
            .map(|(_, b)| b);
        let slabs = std::mem::take(&mut self.slabs)
            .into_values()
            .map(|s| s.block);
        blocks.chain(slabs).collect()
    }
}

/// Why a lane's MALLOC got no memory.
enum Denied {
    /// The block it needs would take the mailbox above its quota (what is counted now).
    Quota { cost: u64, reserved: u64 },
    /// The allocator failed.
    Allocator(VendorError),
}

/// `size` bytes (not 0) for `mailbox` from `allocator`: a chunk of a slab if it is small
/// enough, else a block of its own; 0 if the device has no memory or the mailbox was detached.
fn allocate(
    mailbox: &MailboxState,
    allocator: &Arc<dyn DeviceAllocator>,
    size: u64,
    quota: u64,
) -> core::result::Result<u64, Denied> {
    let small = size <= SMALL_MAX;
    let (asked, align) = match small {
        true => (SLAB, chunk_of(size)),
        false => (size, MALLOC_ALIGN),
    };
    let cost = Block::length(&**allocator, asked, align).map_or(u64::MAX, cost);
    {
        let mut books = lock(&mailbox.allocations);
        if small {
            if let Some(addr) = books.take_chunk(align, allocator) {
                return Ok(addr);
            }
        }
        books
            .reserve(cost, quota)
            .map_err(|reserved| Denied::Quota { cost, reserved })?;
    }
    // The allocator runs without the books' lock (a driver call may take long), its cost
    // reserved meanwhile: two MALLOCs of one mailbox never both pass the quota.
    let made = Block::allocate(allocator, asked, align);
    let mut books = lock(&mailbox.allocations);
    let (addr, block) = match made {
        Ok(Some(made)) => made,
        other => {
            books.unreserve(cost);
            return other.map(|_| 0).map_err(Denied::Allocator);
        }
    };
    let recorded = match small {
        true => books.insert_slab(Slab::new(block, addr, align)),
        false => books.insert_block(addr, size, block),
    };
    drop(books);
    recorded.or_else(|block| {
        // Detached meanwhile (its allocations freed): this one is freed now.
        log::debug!("mailbox {}: detached, {addr:#x} freed", mailbox.id.0);
        if let Err(error) = block.free() {
            log::warn!("mailbox {}: freeing {addr:#x}: {error}", mailbox.id.0);
        }
        Ok(0)
    })
}

/// MALLOC: C send buf\[0\] = size; S send buf\[0\] = address (aligned as [`malloc_alignment`]
/// says) or 0. Size 0 and failed allocations answer 0, as C's malloc may; no allocator set, or
/// a request whose memory would take the mailbox above `Limits::malloc_bytes`, is a refusal
/// (0).
pub(crate) async fn malloc(mut req: Request) -> Result<Outcome, ServerError> {
    let words = recv_words(&mut req).await?;
    let context = super::context(&req);
    let services = &context.services();
    let mailbox = super::mailbox_state(&req);
    let quota = context.config.limits.malloc_bytes;
    let allocator = services.allocator_for(&mailbox);
    let mut refusals = Refusals::default();
    let mut replies = per_lane(&req, 0u64);
    for lane in active(&req) {
        let size = words[lane as usize][0];
        let Some(allocator) = &allocator else {
            refusals.lane(lane, "no device allocator is set for MALLOC");
            continue;
        };
        if size == 0 {
            continue;
        }
        match allocate(&mailbox, allocator, size, quota) {
            Ok(addr) => replies[lane as usize] = addr,
            Err(Denied::Quota { cost, reserved }) => refusals.lane(
                lane,
                std::format!(
                    "MALLOC of {size} bytes needs {cost} more bytes of memory, which would take \
                     the mailbox above its limit of {quota} ({reserved} held)"
                ),
            ),
            Err(Denied::Allocator(error)) => device_log!(
                context.log_limit,
                Warn,
                "MALLOC of {size} bytes failed: {error}"
            ),
        }
    }
    send_word0(&mut req, &replies).await?;
    refusals.finish()
}

/// FREE: C send buf\[0\] = address; S frees; no reply. Address 0 is a no-op (`free(NULL)`);
/// anything else that is not a live allocation of this mailbox (foreign, another mailbox's, or
/// freed already) is refused and nothing is freed.
pub(crate) async fn free(mut req: Request) -> Result<Outcome, ServerError> {
    let words = recv_words(&mut req).await?;
    let mailbox = super::mailbox_state(&req);
    let mut refusals = Refusals::default();
    for lane in active(&req) {
        let addr = words[lane as usize][0];
        if addr == 0 {
            continue;
        }
        let removed = lock(&mailbox.allocations).remove(addr);
        match removed {
            Some(None) => {}
            Some(Some(block)) => {
                let cost = block.cost();
                let freed = block.free();
                // Counted until it is freed, so the quota is never passed meanwhile.
                lock(&mailbox.allocations).unreserve(cost);
                if let Err(error) = freed {
                    refusals.lane(
                        lane,
                        std::format!("the allocator failed to free {addr:#x}: {error}"),
                    );
                }
            }
            None => refusals.lane(
                lane,
                std::format!(
                    "FREE of {addr:#x}, which is no live allocation of this mailbox (foreign, \
                     another mailbox's, or freed already)"
                ),
            ),
        }
    }
    refusals.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sync::Mutex;

    /// Blocks at the addresses it is told to give, recording what it is asked.
    struct Scripted {
        next: Mutex<Vec<u64>>,
        asked: Mutex<Vec<u64>>,
        freed: Mutex<Vec<u64>>,
        alignment: u64,
    }

    impl DeviceAllocator for Scripted {
        fn allocate(&self, size: u64) -> core::result::Result<u64, VendorError> {
            lock(&self.asked).push(size);
            Ok(lock(&self.next).pop().unwrap_or(0))
        }
        unsafe fn deallocate(&self, addr: u64, _: u64) -> core::result::Result<(), VendorError> {
            lock(&self.freed).push(addr);
            Ok(())
        }
        fn alignment(&self) -> u64 {
            self.alignment
        }
    }

    fn scripted(bases: &[u64], alignment: u64) -> Arc<Scripted> {
        Arc::new(Scripted {
            next: Mutex::new(bases.iter().rev().copied().collect()),
            asked: Mutex::new(Vec::new()),
            freed: Mutex::new(Vec::new()),
            alignment,
        })
    }

    #[test]
    fn a_block_is_padded_by_what_the_allocator_lacks_and_freed_by_its_base() {
        let bases = [0x7f00_0000_1000, 0x7f00_0020_0000, 0x7f00_001f_fff8, 8];
        let raw = scripted(&bases, 8);
        let allocator: Arc<dyn DeviceAllocator> = raw.clone();
        for base in bases {
            let (addr, block) = Block::allocate(&allocator, 100, MALLOC_ALIGN)
                .unwrap()
                .unwrap();
            assert_eq!(addr % MALLOC_ALIGN, 0, "{addr:#x}");
            assert!(addr >= base && addr + 100 <= base + block.len, "inside");
            assert_eq!(
                block.cost(),
                cost(100 + MALLOC_ALIGN - 8),
                "padding charged"
            );
            block.free().unwrap();
        }
        assert_eq!(*lock(&raw.asked), [100 + MALLOC_ALIGN - 8; 4]);
        assert_eq!(*lock(&raw.freed), bases, "each freed by its base");
        // An allocator that aligns as MALLOC needs is asked no padding.
        let aligned: Arc<dyn DeviceAllocator> = scripted(&[4 << 20], MALLOC_ALIGN);
        let (addr, block) = Block::allocate(&aligned, 100, MALLOC_ALIGN)
            .unwrap()
            .unwrap();
        assert_eq!((addr, block.len, block.cost()), (4 << 20, 100, PAGE));
    }

    #[test]
    fn no_memory_sizes_that_overflow_and_blocks_that_wrap_or_misalign_are_no_allocation() {
        let raw = scripted(&[0, u64::MAX - 50], 1);
        let allocator: Arc<dyn DeviceAllocator> = raw.clone();
        assert!(Block::allocate(&allocator, 100, 16).unwrap().is_none());
        assert!(
            Block::allocate(&allocator, u64::MAX, 16).is_err(),
            "overflows"
        );
        assert!(Block::allocate(&allocator, 100, 16).is_err(), "wraps");
        // It claims 2 MiB alignment and returns a page: the aligned bytes are not inside.
        let liar: Arc<dyn DeviceAllocator> = scripted(&[0x1000], MALLOC_ALIGN);
        assert!(Block::allocate(&liar, 100, MALLOC_ALIGN).is_err());
        assert_eq!(*lock(&raw.freed), [u64::MAX - 50], "freed again");
    }

    #[test]
    fn small_requests_share_slabs_aligned_to_their_size_and_free_them_with_the_last() {
        let slabs = [0x4000_0000, 0x4020_0000, 0x4040_0000];
        let raw = scripted(&slabs, MALLOC_ALIGN);
        let allocator: Arc<dyn DeviceAllocator> = raw.clone();
        let mailbox = MailboxState::new(crate::server::MailboxId(0));
        let quota = 3 * SLAB;
        let one = |size| allocate(&mailbox, &allocator, size, quota).ok().unwrap();
        // 1000 MALLOC(1): 16-byte chunks of one slab.
        let tiny: Vec<u64> = (0..1000).map(|_| one(1)).collect();
        assert!(tiny
            .iter()
            .all(|a| a % 16 == 0 && (slabs[0]..slabs[0] + SLAB).contains(a)));
        let distinct: BTreeSet<u64> = tiny.iter().copied().collect();
        assert_eq!(distinct.len(), 1000);
        // Another size, another slab; its chunks aligned to their size.
        let big = one(SMALL_MAX - 1);
        assert_eq!((big, big % SMALL_MAX), (slabs[1], 0));
        assert_eq!(lock(&raw.asked).len(), 2, "two slabs asked for");
        assert_eq!(lock(&mailbox.allocations).reserved(), 2 * SLAB);
        assert_eq!(lock(&mailbox.allocations).len(), 1001);
        let books = || lock(&mailbox.allocations);
        // Foreign addresses inside a slab: between chunks, a free chunk.
        assert!(books().remove(tiny[0] + 8).is_none());
        assert!(books().remove(slabs[0] + 1000 * 16).is_none());
        for &addr in &tiny[1..] {
            assert!(matches!(books().remove(addr), Some(None)));
        }
        assert!(books().remove(tiny[1]).is_none(), "freed already");
        let Some(Some(block)) = books().remove(tiny[0]) else {
            panic!("the last chunk gives the slab back");
        };
        assert_eq!(block.base, slabs[0]);
        assert_eq!(books().len(), 1);
        assert_eq!(books().close().len(), 1, "the other slab, at the detach");
    }

    #[test]
    fn the_quota_counts_slabs_and_blocks_at_what_they_reserve() {
        let raw = scripted(&[0x4000_0000, 0x8000_0000], 1);
        let allocator: Arc<dyn DeviceAllocator> = raw.clone();
        let mailbox = MailboxState::new(crate::server::MailboxId(0));
        let quota = 2 * SLAB;
        // A slab of 16-byte chunks costs its 2 MiB and 15 bytes of padding, in pages.
        assert_ne!(allocate(&mailbox, &allocator, 1, quota).ok().unwrap(), 0);
        assert_eq!(lock(&mailbox.allocations).reserved(), SLAB + PAGE);
        // A block of its own, 1 MiB padded by 2 MiB - 1: beyond the quota.
        let Err(Denied::Quota { cost: c, reserved }) =
            allocate(&mailbox, &allocator, 1 << 20, quota)
        else {
            panic!("refused");
        };
        assert_eq!(
            (c, reserved),
            (cost((1 << 20) + MALLOC_ALIGN - 1), SLAB + PAGE)
        );
        assert_eq!(lock(&raw.asked).len(), 1, "the allocator was not asked");
        let more = 2 * quota;
        assert_ne!(
            allocate(&mailbox, &allocator, 1 << 20, more).ok().unwrap(),
            0
        );
        assert_eq!(
            lock(&mailbox.allocations).reserved(),
            SLAB + PAGE + cost((1 << 20) + MALLOC_ALIGN - 1)
        );
    }

    #[test]
    fn malloc_alignment_is_the_size_rounded_up_to_a_power_of_two() {
        assert_eq!(malloc_alignment(1), 16);
        assert_eq!(malloc_alignment(17), 32);
        assert_eq!(malloc_alignment(SMALL_MAX), SMALL_MAX);
        assert_eq!(malloc_alignment(SMALL_MAX + 1), MALLOC_ALIGN);
        assert_eq!(malloc_alignment(u64::MAX), MALLOC_ALIGN);
        assert_eq!(CLASSES, 15);
    }
}

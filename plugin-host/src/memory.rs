//! Host memory standing in for device memory: zeroed, 64-byte-aligned regions whose addresses
//! are their "device" addresses, and the table of them that bounds what a copy may touch.
//!
//! # Same-size access
//! The server and the kernels' clients access this memory through atomic words: `u32` for a
//! mailbox's flags and a client object's lock bits, `u64` for everything else (headers,
//! packets, the doorbell's words, the client object's pointers). Rust's memory model does not
//! allow atomic accesses of different sizes to the same bytes when they may race, so every
//! access here uses the word of the size the others use: each [`RawMemory`] knows which of its
//! bytes are `u32` words (one range, `narrow`, whose ends are multiples of 8, so no `u64` word
//! overlaps it) and copies through those words ([`RawMemory::write`], [`RawMemory::read`]).
//! A copy that covers only part of a word (an unaligned head or tail) reads that whole word,
//! or replaces only its own bytes in it with a compare-and-swap of the word's size, so bytes
//! someone else writes meanwhile (a warp's lock bit beside them) are kept.
//!
//! Memory ordering: copies are `Relaxed`. A copy orders nothing: whoever must see what was
//! copied in synchronises by other means (a launch spawns the warps' threads after the copy,
//! the server gets a mailbox through `attach`'s lock). Each word only needs to be atomic, so
//! that a copy racing with a kernel is a garbage value, never undefined behaviour.

use std::ops::Range;
use std::panic::RefUnwindSafe;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use crate::lock;
use rpc_core::plugin::{DeviceAllocator, SharedRegion, VendorError};
use rpc_core::protocol::{Generation, Layout};

/// What keeps borrowed memory alive, whatever it is (this file need not know native images);
/// unwind-safe, as the memory is.
pub(crate) type Owner = Arc<dyn Send + Sync + RefUnwindSafe>;

/// A zeroed, 64-byte-aligned allocation, only ever accessed through atomics once shared, each
/// word with one size (see the module docs).
pub struct RawMemory {
    ptr: *mut u8,
    len: usize,
    /// The bytes accessed as `u32` words; every other word is a `u64`. Both ends multiples of 8.
    narrow: Range<usize>,
    /// What keeps borrowed memory alive (a native image's library); None: ours, freed on drop.
    owner: Option<Owner>,
}

// SAFETY: the memory is plain bytes; every shared access to it is atomic.
unsafe impl Send for RawMemory {}
// SAFETY: as above.
unsafe impl Sync for RawMemory {}

/// One atomic word of a region, of the size everyone accesses it with.
enum Word<'a> {
    U32(&'a AtomicU32),
    U64(&'a AtomicU64),
}

impl Word<'_> {
    fn size(&self) -> usize {
        match self {
            Word::U32(_) => 4,
            Word::U64(_) => 8,
        }
    }

    /// The word's bytes in memory order (the first `size()` of the eight).
    fn load(&self) -> [u8; 8] {
        let mut bytes = [0; 8];
        match self {
            Word::U32(w) => bytes[..4].copy_from_slice(&w.load(Ordering::Relaxed).to_ne_bytes()),
            Word::U64(w) => bytes = w.load(Ordering::Relaxed).to_ne_bytes(),
        }
        bytes
    }

    /// Writes `data` over the word's bytes from `skip` on. The whole word: one store; part of
    /// it: a compare-and-swap loop that changes only those bytes.
    fn store(&self, skip: usize, data: &[u8]) {
        let whole = skip == 0 && data.len() == self.size();
        let splice = |old: &mut [u8]| old[skip..skip + data.len()].copy_from_slice(data);
        match self {
            Word::U32(w) if whole => w.store(
                u32::from_ne_bytes(data.try_into().expect("4 bytes")),
                Ordering::Relaxed,
            ),
            Word::U64(w) if whole => w.store(
                u64::from_ne_bytes(data.try_into().expect("8 bytes")),
                Ordering::Relaxed,
            ),
            // RMW: replaces our bytes of the word, keeping the others as they are now.
            Word::U32(w) => {
                let _ = w.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |old| {
                    let mut bytes = old.to_ne_bytes();
                    splice(&mut bytes);
                    Some(u32::from_ne_bytes(bytes))
                });
            }
            // RMW: as above, for a `u64` word.
            Word::U64(w) => {
                let _ = w.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |old| {
                    let mut bytes = old.to_ne_bytes();
                    splice(&mut bytes);
                    Some(u64::from_ne_bytes(bytes))
                });
            }
        }
    }
}

impl RawMemory {
    /// The allocation: `len` rounded up to whole `u64` words (so a copy's last word is inside).
    fn layout(len: usize) -> std::alloc::Layout {
        std::alloc::Layout::from_size_align(len.max(1).next_multiple_of(8), 64)
            .expect("a valid size")
    }

    /// `len` zeroed bytes accessed as `u64` words, and as `u32` words in `narrow`.
    fn zeroed_with(len: usize, narrow: Range<usize>) -> Arc<Self> {
        assert!(
            narrow.start % 8 == 0 && narrow.end % 8 == 0 && narrow.end <= len.next_multiple_of(8),
            "u32 words in whole u64 words of the region"
        );
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(Self::layout(len)) };
        if ptr.is_null() {
            std::alloc::handle_alloc_error(Self::layout(len));
        }
        Arc::new(RawMemory {
            ptr,
            len,
            narrow,
            owner: None,
        })
    }

    /// `len` bytes at `ptr` that `owner` keeps alive (a native image's client object),
    /// accessed as `u64` words and as `u32` words in `narrow`.
    ///
    /// # Safety
    /// `ptr` is 8-aligned and valid for reads and writes of `len` bytes (a multiple of 8) for
    /// as long as `owner` lives, and this process accesses those bytes only atomically, with
    /// the word sizes above.
    pub(crate) unsafe fn borrowed(
        ptr: *mut u8,
        len: usize,
        narrow: Range<usize>,
        owner: Owner,
    ) -> Arc<Self> {
        assert!(
            ptr as usize % 8 == 0 && len % 8 == 0 && narrow.start % 8 == 0 && narrow.end <= len,
            "8-aligned whole u64 words"
        );
        Arc::new(RawMemory {
            ptr,
            len,
            narrow,
            owner: Some(owner),
        })
    }

    /// `len` zeroed bytes accessed as `u64` words (the doorbell's words, plain device memory).
    pub fn zeroed(len: usize) -> Arc<Self> {
        Self::zeroed_with(len, 0..0)
    }

    /// A zeroed mailbox of `layout`: its flags are `u32` words, the rest `u64` words.
    pub fn mailbox(layout: Layout) -> Arc<Self> {
        // `primary` and `secondary` are the two arrays of N `u32` words; the headers follow.
        Self::zeroed_with(layout.total_size(), layout.primary()..layout.header())
    }

    /// A zeroed client object of `generation`: its lock words are `u32`, the rest `u64` words.
    pub fn client_object(generation: Generation) -> Arc<Self> {
        let size = generation.client_object_size();
        Self::zeroed_with(size, generation.client_object_locks()..size)
    }

    pub(crate) fn addr(&self) -> u64 {
        // An address to compare and look up by, never cast back to a pointer.
        self.ptr.addr() as u64
    }
    pub(crate) fn as_ptr(&self) -> *mut u8 {
        self.ptr
    }
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The word holding byte `at`, and the offset of `at` in it.
    fn word(&self, at: usize) -> (Word<'_>, usize) {
        if self.narrow.contains(&at) {
            let start = at & !3;
            (Word::U32(self.u32_word(start)), at - start)
        } else {
            let start = at & !7;
            (Word::U64(self.u64_word_unchecked(start)), at - start)
        }
    }

    /// The words that the `len` bytes from `offset` lie in, in order: each with how many of its
    /// bytes come before the range, and which of the range's bytes it holds (counted from 0).
    fn spans(
        &self,
        offset: usize,
        len: usize,
    ) -> impl Iterator<Item = (Word<'_>, usize, Range<usize>)> + '_ {
        assert!(
            offset.checked_add(len).is_some_and(|end| end <= self.len),
            "bytes inside the region"
        );
        let mut done = 0;
        std::iter::from_fn(move || {
            (done < len).then(|| {
                let (word, skip) = self.word(offset + done);
                let take = (word.size() - skip).min(len - done);
                let held = done..done + take;
                done += take;
                (word, skip, held)
            })
        })
    }

    /// Copies `bytes` in at `offset`, word by word (see the module docs: kernels may be
    /// reading, and the words keep their sizes).
    pub fn write(&self, offset: usize, bytes: &[u8]) {
        for (word, skip, held) in self.spans(offset, bytes.len()) {
            word.store(skip, &bytes[held]);
        }
    }

    /// Copies out from `offset`, word by word.
    pub fn read(&self, offset: usize, out: &mut [u8]) {
        for (word, skip, held) in self.spans(offset, out.len()) {
            let take = held.len();
            out[held].copy_from_slice(&word.load()[skip..skip + take]);
        }
    }

    /// The `u64` word at `offset`, as an atomic (outside the `u32` words).
    pub fn u64_word(&self, offset: usize) -> &AtomicU64 {
        assert!(
            offset + 8 <= self.len && !self.narrow.contains(&offset),
            "a u64 word inside the region"
        );
        self.u64_word_unchecked(offset)
    }

    /// The `u64` word at `offset` of the allocation (which may end after `len`).
    fn u64_word_unchecked(&self, offset: usize) -> &AtomicU64 {
        assert!(
            offset % 8 == 0 && offset + 8 <= Self::layout(self.len).size(),
            "word inside the allocation"
        );
        // SAFETY: in bounds of the allocation and 8-aligned (64-aligned base, offset checked),
        // alive with `self`, and AtomicU64 has the size and validity of u64. Only ever accessed
        // as a `u64` word: it lies outside `narrow`, whose ends are multiples of 8.
        unsafe { &*(self.ptr.add(offset) as *const AtomicU64) }
    }

    fn u32_word(&self, offset: usize) -> &AtomicU32 {
        &self.u32_words(offset, 1)[0]
    }

    /// The `u32` words from `offset` on, as atomics (inside the `u32` words).
    pub fn u32_words(&self, offset: usize, count: usize) -> &[AtomicU32] {
        assert!(
            offset % 4 == 0
                && self.narrow.start <= offset
                && offset + 4 * count <= self.narrow.end
                && offset + 4 * count <= self.len,
            "u32 words inside the region's u32 words"
        );
        // SAFETY: in bounds and 4-aligned (64-aligned base, offset checked), alive with `self`,
        // and AtomicU32 has the size and validity of u32. Only ever accessed as `u32` words:
        // they lie inside `narrow`.
        unsafe { std::slice::from_raw_parts(self.ptr.add(offset).cast(), count) }
    }
}

impl Drop for RawMemory {
    fn drop(&mut self) {
        if self.owner.is_none() {
            // SAFETY: not borrowed, so allocated in `zeroed_with` with this layout; freed once.
            unsafe { std::alloc::dealloc(self.ptr, Self::layout(self.len)) }
        }
    }
}

/// A mailbox region handed to the server; kernels keep the memory alive through their own `Arc`.
pub struct HostShared(pub Arc<RawMemory>);

// SAFETY: the `RawMemory` is a 64-byte-aligned heap allocation of `len` bytes that lives as
// long as its `Arc`, which this value holds; plugin-host's kernels reach a mailbox only through
// `Client`s over `Mailbox::from_raw`, the same atomic views of the same sizes as the server's,
// and its copies use words of those sizes too (a mailbox's `RawMemory` is made by
// `RawMemory::mailbox`, see the module docs).
unsafe impl SharedRegion for HostShared {
    fn host_ptr(&self) -> *mut u8 {
        self.0.as_ptr()
    }
    fn device_addr(&self) -> u64 {
        self.0.addr()
    }
    fn len(&self) -> usize {
        self.0.len()
    }
}

/// The regions of one device, so a copy or a kernel's view can be checked against them.
#[derive(Default)]
pub(crate) struct MemoryMap {
    regions: Mutex<Vec<Weak<RawMemory>>>,
}

impl MemoryMap {
    pub(crate) fn insert(&self, memory: &Arc<RawMemory>) {
        let mut regions = lock(&self.regions);
        regions.retain(|r| r.strong_count() > 0);
        regions.push(Arc::downgrade(memory));
    }

    /// The live region holding `addr..addr + len`, and the offset of `addr` in it.
    pub(crate) fn find(&self, addr: u64, len: usize) -> Option<(Arc<RawMemory>, usize)> {
        let regions = lock(&self.regions);
        regions.iter().filter_map(Weak::upgrade).find_map(|r| {
            let offset = addr.checked_sub(r.addr())? as usize;
            (offset.checked_add(len)? <= r.len()).then_some((r.clone(), offset))
        })
    }
}

/// The "interrupt" of a host doorbell: a condition variable the client notifies.
#[derive(Default)]
pub struct Signal {
    lock: Mutex<()>,
    rung: std::sync::Condvar,
}

impl Signal {
    /// Raises the interrupt. Taking the lock orders it after the waiter's check of the counter.
    pub fn raise(&self) {
        let _guard = lock(&self.lock);
        self.rung.notify_all();
    }

    /// Blocks until `counter` is non-zero (true) or `timeout` passes (false): a doorbell's
    /// wait, for the counter this signal is raised for.
    pub fn wait_for(&self, counter: &AtomicU64, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut guard = lock(&self.lock);
        loop {
            // Relaxed: the counter only decides whether to keep sleeping.
            if counter.load(Ordering::Relaxed) != 0 {
                return true;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            guard = self
                .rung
                .wait_timeout(guard, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
}

/// A v2 doorbell of a host mailbox (PROTOCOL section 9): the `value` counter and the `mailbox`
/// word live in device memory (a region of the device's map, so a kernel finds them by the
/// addresses in the record), the interrupt is a [`Signal`].
pub struct HostDoorbell {
    pub(crate) words: Arc<RawMemory>,
    pub(crate) signal: Arc<Signal>,
    pub(crate) event_id: u32,
}

impl rpc_core::plugin::Doorbell for HostDoorbell {
    fn record(&self) -> [u8; 64] {
        let mut record = [0u8; 64];
        record[..8].copy_from_slice(&self.words.addr().to_le_bytes());
        record[8..16].copy_from_slice(&(self.words.addr() + 8).to_le_bytes());
        record[16..20].copy_from_slice(&self.event_id.to_le_bytes());
        record
    }

    fn counter(&self) -> &std::sync::atomic::AtomicU64 {
        self.words.u64_word(0)
    }

    fn wait(&self, timeout: std::time::Duration) -> bool {
        self.signal.wait_for(self.counter(), timeout)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A v1 mailbox of 3 ports (odd, so `secondary` ends inside a `u64`'s span): flags at
    /// 0..24 as `u32` words, headers from 24 on.
    fn mailbox() -> Arc<RawMemory> {
        RawMemory::mailbox(Layout::new(Generation::V1, 3, 1).unwrap())
    }

    #[test]
    fn copies_round_trip_at_every_offset_and_length_across_word_sizes() {
        let memory = mailbox();
        let pattern: Vec<u8> = (1..=48).collect();
        // Under miri (which interprets every access) the lengths around the word sizes only.
        let lengths: Vec<usize> = if cfg!(miri) {
            vec![0, 1, 3, 4, 5, 8, 9, 13, 24]
        } else {
            (0..=24).collect()
        };
        for offset in 0..40 {
            for len in lengths.iter().map(|&len| len.min(48 - offset)) {
                memory.write(0, &[0; 64]);
                memory.write(offset, &pattern[..len]);
                let mut all = [0xAA; 64];
                memory.read(0, &mut all);
                assert!(all[..offset].iter().all(|&b| b == 0), "{offset} {len}");
                assert_eq!(
                    &all[offset..offset + len],
                    &pattern[..len],
                    "{offset} {len}"
                );
                assert!(
                    all[offset + len..].iter().all(|&b| b == 0),
                    "{offset} {len}"
                );
            }
        }
    }

    #[test]
    fn a_partial_copy_keeps_the_other_bytes_of_its_words() {
        let memory = mailbox();
        // A lock word a warp holds (u32 at 4) and a header word (u64 at 24).
        memory.u32_words(4, 1)[0].store(0x8000_0001, Ordering::Relaxed);
        memory.u64_word(24).store(u64::MAX, Ordering::Relaxed);
        memory.write(5, &[0x12, 0x34]);
        memory.write(27, &[0; 3]);
        let expect = u32::from_ne_bytes({
            let mut b = 0x8000_0001u32.to_ne_bytes();
            b[1..3].copy_from_slice(&[0x12, 0x34]);
            b
        });
        assert_eq!(memory.u32_words(4, 1)[0].load(Ordering::Relaxed), expect);
        let mut header = u64::MAX.to_ne_bytes();
        header[3..6].fill(0);
        assert_eq!(
            memory.u64_word(24).load(Ordering::Relaxed),
            u64::from_ne_bytes(header)
        );
    }

    #[test]
    fn word_views_keep_to_their_size() {
        let memory = mailbox();
        let u64_in_flags = std::panic::catch_unwind(|| {
            memory.u64_word(8);
        });
        assert!(u64_in_flags.is_err(), "the flags are u32 words");
        let u32_in_headers = std::panic::catch_unwind(|| {
            memory.u32_words(24, 1);
        });
        assert!(u32_in_headers.is_err(), "the headers are u64 words");
        let object = RawMemory::client_object(Generation::V2);
        assert_eq!(object.u32_words(48, 512).len(), 512);
        assert!(std::panic::catch_unwind(|| object.u32_words(40, 1).len()).is_err());
    }

    #[test]
    fn a_region_of_odd_length_copies_its_last_bytes() {
        let memory = RawMemory::zeroed(13);
        memory.write(9, &[1, 2, 3, 4]);
        let mut out = [0; 13];
        memory.read(0, &mut out);
        assert_eq!(out, [0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4]);
    }
}

/// Host memory as "device" memory for MALLOC: each block its own anonymous mapping, 2 MiB
/// aligned (the device is the host; the server cuts small requests out of such blocks and frees
/// what kernels forgot at detach). A block's mapping is exactly its pages: the padding mapped to
/// align it is unmapped again, so its address space is what the server charges the quota, and
/// only the pages a kernel touches become resident.
///
/// The blocks are kept by address with the pointers their mappings gave, and `deallocate`
/// unmaps through that pointer: an address is never turned back into a pointer here (strict
/// provenance). The address handed out is exposed, as a device's kernels reach the block
/// through it.
#[derive(Default)]
pub struct HostAllocator {
    /// The blocks not yet freed, by address.
    blocks: Mutex<std::collections::HashMap<u64, Block>>,
}

/// A block's mapping: its first byte, the bytes asked and the bytes mapped.
struct Block {
    ptr: std::ptr::NonNull<u8>,
    size: u64,
    len: usize,
}

// SAFETY: a block is a private anonymous mapping owned by its allocator's table; it may be
// unmapped from any thread, and the pointer is only read under the table's mutex.
unsafe impl Send for Block {}

/// The alignment of a block: what MALLOC's largest alignment needs, so the server pads nothing.
const BLOCK_ALIGN: u64 = rpc_core::services::MALLOC_ALIGN;

/// The bytes a block of `size` maps: whole pages.
fn block_len(size: u64) -> Result<usize, VendorError> {
    let page = 4096;
    let len = size.max(1).checked_next_multiple_of(page);
    // Room for the padding too, so that `map_aligned`'s sum cannot overflow.
    match len.filter(|len| len.checked_add(BLOCK_ALIGN).is_some()) {
        Some(len) => Ok(usize::try_from(len)?),
        None => Err(format!("{size} bytes is more than an address space holds").into()),
    }
}

impl HostAllocator {
    /// An allocator with nothing allocated yet.
    pub fn new() -> Self {
        Self::default()
    }
    /// Blocks not yet freed.
    pub fn live(&self) -> usize {
        lock(&self.blocks).len()
    }
    /// Bytes the blocks not yet freed map (their address space).
    pub fn mapped(&self) -> u64 {
        lock(&self.blocks).values().map(|b| b.len as u64).sum()
    }
}

/// `len` bytes (whole pages) of fresh anonymous memory at a [`BLOCK_ALIGN`]-aligned address:
/// `len` and the alignment mapped, then the parts before and after the aligned run unmapped.
fn map_aligned(len: usize) -> Result<std::ptr::NonNull<u8>, VendorError> {
    let align = BLOCK_ALIGN as usize;
    let whole = len + align;
    // SAFETY: a new private anonymous mapping at an address the kernel picks; no memory of
    // this process is touched.
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            whole,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if ptr == libc::MAP_FAILED {
        let error = std::io::Error::last_os_error();
        return Err(format!("mapping {len} bytes: {error}").into());
    }
    let ptr = ptr.cast::<u8>();
    let head = ptr.align_offset(align);
    let tail = whole - head - len;
    // SAFETY: `head < align` and `head + len + tail == whole`: every pointer stays inside the
    // mapping just made.
    let (aligned, after) = unsafe { (ptr.add(head), ptr.add(head + len)) };
    for (at, bytes) in [(ptr, head), (after, tail)] {
        if bytes > 0 {
            // SAFETY: the pages before and after the aligned run, inside the mapping just made,
            // which nothing else knows of yet.
            unsafe { libc::munmap(at.cast(), bytes) };
        }
    }
    Ok(std::ptr::NonNull::new(aligned).expect("a mapping is never at address 0"))
}

impl DeviceAllocator for HostAllocator {
    fn allocate(&self, size: u64) -> Result<u64, VendorError> {
        let len = block_len(size)?;
        let ptr = map_aligned(len)?;
        // Exposed: the device reaches the block through its address.
        let addr = ptr.as_ptr().expose_provenance() as u64;
        lock(&self.blocks).insert(addr, Block { ptr, size, len });
        Ok(addr)
    }

    unsafe fn deallocate(&self, addr: u64, size: u64) -> Result<(), VendorError> {
        let mut blocks = lock(&self.blocks);
        let Some(block) = blocks.remove(&addr) else {
            return Err(format!("{addr:#x} is no live block").into());
        };
        if block.size != size {
            let asked = block.size;
            blocks.insert(addr, block);
            return Err(format!("{addr:#x} ({asked} bytes) freed by another size ({size})").into());
        }
        // SAFETY: `block` is a mapping of exactly `block.len` bytes made by `map_aligned` and
        // not unmapped since: it was in the table, which it just left.
        if unsafe { libc::munmap(block.ptr.as_ptr().cast(), block.len) } != 0 {
            let error = std::io::Error::last_os_error();
            return Err(format!("unmapping {} bytes at {addr:#x}: {error}", block.len).into());
        }
        Ok(())
    }

    fn alignment(&self) -> u64 {
        BLOCK_ALIGN
    }
}

// Miri has no partial `munmap`, which `map_aligned` needs.
#[cfg(all(test, not(miri)))]
mod allocator_tests {
    use super::*;

    #[test]
    fn host_blocks_are_aligned_mapped_by_their_pages_and_counted_until_freed() {
        let allocator = HostAllocator::new();
        let addr = allocator.allocate(100).unwrap();
        let big = allocator.allocate((3 << 20) + 1).unwrap();
        for block in [addr, big] {
            assert_eq!(block % BLOCK_ALIGN, 0);
        }
        assert_eq!(allocator.live(), 2);
        assert_eq!(allocator.mapped(), 4096 + (3 << 20) + 4096);
        // It is memory: written and read back.
        // SAFETY: 100 bytes at `addr` were just allocated, and nothing else uses them.
        unsafe {
            std::ptr::write_bytes(addr as *mut u8, 0xab, 100);
            assert_eq!(*(addr as *const u8).add(99), 0xab);
        }
        // SAFETY: each block came from `allocate` with that size just above, freed once.
        unsafe {
            allocator.deallocate(addr, 100).unwrap();
            allocator.deallocate(big, (3 << 20) + 1).unwrap();
        }
        assert_eq!((allocator.live(), allocator.mapped()), (0, 0));
        assert!(allocator.allocate(u64::MAX).is_err());
        assert_eq!(allocator.live(), 0);
    }

    /// A free of an address that is no live block, or by another size, is an error that
    /// leaves the blocks as they were (the address is looked up, never cast to a pointer).
    #[test]
    fn a_free_of_no_live_block_or_by_another_size_is_refused() {
        let allocator = HostAllocator::new();
        let addr = allocator.allocate(64).unwrap();
        // SAFETY: refused before anything is freed (the point of the test).
        unsafe {
            assert!(allocator.deallocate(addr + 16, 48).is_err());
            assert!(allocator.deallocate(addr, 4096).is_err());
        }
        assert_eq!(allocator.live(), 1);
        // SAFETY: the block came from `allocate(64)` above and is freed once.
        unsafe { allocator.deallocate(addr, 64) }.unwrap();
        assert_eq!(allocator.live(), 0);
    }
}

//! A typed view of a mailbox region, and owned regions for host-side use.
//!
//! The region is shared with another party (a GPU, another process, a client thread) that this
//! process cannot make obey Rust's rules, so every access to it is atomic: the flags with the
//! orderings of PROTOCOL section 3, headers and packet words `Relaxed` (ordered by those flags'
//! fences). A misbehaving peer can then only make us read garbage values, never cause a data race.
//! Every access in this process is also same-size: a flag is always a `u32` atomic, a header or
//! packet word always a `u64` one (the scan, the ports, plugin-host's copies alike).
//! On x86-64 and AArch64 a relaxed load or store compiles to a plain move, so this costs nothing.

use crate::protocol::error::ProtocolError;
use crate::protocol::layout::Layout;
use crate::sync::{AtomicU32, DataWord};

/// A view of one mailbox: the arrays of PROTOCOL section 2 as atomics.
#[derive(Clone, Copy)]
pub struct Mailbox<'a> {
    layout: Layout,
    /// Server-written words, one per port.
    pub(crate) primary: &'a [AtomicU32],
    /// Client-written words, one per port.
    pub(crate) secondary: &'a [AtomicU32],
    /// Every `u64` word from port 0's header to the region's end: the headers and packets,
    /// wherever the generation puts them (two arrays in v1 and v2, one of packets holding
    /// their headers in v0), found through the strides below.
    words: &'a [DataWord],
    /// Words from one port's header to the next one's.
    header_stride: usize,
    /// Words from port 0's header to its lane 0 buffer.
    packet_start: usize,
    /// Words from one port's lane 0 buffer to the next one's.
    packet_stride: usize,
}

/// The `u64` words from port 0's header to the end of `layout`'s region.
const fn data_words(layout: &Layout) -> usize {
    (layout.total_size() - layout.header()) / 8
}

impl<'a> Mailbox<'a> {
    fn with_words(
        layout: Layout,
        primary: &'a [AtomicU32],
        secondary: &'a [AtomicU32],
        words: &'a [DataWord],
    ) -> Self {
        let mailbox = Mailbox {
            layout,
            primary,
            secondary,
            words,
            header_stride: layout.header_stride() / 8,
            packet_start: (layout.packet() - layout.header()) / 8,
            packet_stride: layout.packet_stride() / 8,
        };
        mailbox.check_ports_inside();
        mailbox
    }

    /// Asserts that every port's flags, header and packets lie inside the view's arrays (both
    /// constructors size the arrays from the layout that places them, so this holds): what
    /// lets [`Mailbox::flags`], [`Mailbox::header`] and [`Mailbox::packets`] check a port's
    /// index alone, once per open instead of once per array. The last port's words end
    /// furthest, so its are the ones checked.
    fn check_ports_inside(&self) {
        let n = self.layout.ports() as usize;
        assert!(
            self.primary.len() >= n && self.secondary.len() >= n,
            "a port's flags outside the mailbox's arrays"
        );
        if let Some(last) = n.checked_sub(1) {
            let header_end = last * self.header_stride + 2;
            let packets_end = self.packet_start + last * self.packet_stride + self.packet_words();
            assert!(
                header_end <= self.words.len() && packets_end <= self.words.len(),
                "a port's header or packets outside the mailbox's region"
            );
        }
    }

    /// A view over arrays owned elsewhere ([`MailboxMemory`] under loom, which cannot wrap
    /// foreign memory): the flags, and the words from port 0's header to the end.
    #[cfg(loom)]
    pub(crate) fn from_parts(
        layout: Layout,
        primary: &'a [AtomicU32],
        secondary: &'a [AtomicU32],
        words: &'a [DataWord],
    ) -> Result<Self, ProtocolError> {
        let n = layout.ports() as usize;
        let lengths_ok =
            primary.len() == n && secondary.len() == n && words.len() == data_words(&layout);
        if !lengths_ok {
            return Err(ProtocolError::BadRegion {
                addr: 0,
                len: 0,
                need: layout.total_size(),
            });
        }
        Ok(Mailbox::with_words(layout, primary, secondary, words))
    }

    /// A view over raw memory laid out as `layout`.
    ///
    /// Errors if `base` is not 64-byte aligned or `len` is smaller than the layout's size.
    ///
    /// # Safety
    /// - `base..base + len` is valid for reads and writes for `'a` (it stays allocated).
    /// - Within this process, while the view lives, every access to the region is atomic and
    ///   same-size: each word only through an atomic of the size this view gives it (`u32`
    ///   for `primary` and `secondary`, `u64` for the headers and packets; Rust's memory model
    ///   does not allow racing atomic accesses of different sizes to the same bytes), and
    ///   nothing non-atomic. Other processes and devices may write it as they like: that is
    ///   only garbage to us.
    #[cfg(not(loom))]
    pub unsafe fn from_raw(
        base: *mut u8,
        len: usize,
        layout: Layout,
    ) -> Result<Self, ProtocolError> {
        let need = layout.total_size();
        if base.is_null() || base as usize % 64 != 0 || len < need {
            return Err(ProtocolError::BadRegion {
                addr: base as usize,
                len,
                need,
            });
        }
        let n = layout.ports() as usize;
        // SAFETY: each array lies inside the region (the offsets and sizes come from `layout`,
        // whose total size `len` covers), is aligned for its type (the region is 64-aligned and
        // the offsets are multiples of 4 and 8 respectively), and atomics have the size and bit
        // validity of the integers they wrap, so any bytes there are valid. The caller promises
        // the region lives for 'a and is only accessed atomically, with these sizes, in this
        // process.
        unsafe {
            let at = |offset: usize| base.add(offset);
            Ok(Mailbox::with_words(
                layout,
                core::slice::from_raw_parts(at(layout.primary()).cast(), n),
                core::slice::from_raw_parts(at(layout.secondary()).cast(), n),
                core::slice::from_raw_parts(at(layout.header()).cast(), data_words(&layout)),
            ))
        }
    }

    /// The mailbox's layout.
    pub fn layout(&self) -> Layout {
        self.layout
    }

    /// This port's two flags: the server's word (`primary`), then the client's (`secondary`).
    /// Panics if there is no port `index`.
    #[inline(always)]
    pub(crate) fn flags(&self, index: u32) -> (&'a AtomicU32, &'a AtomicU32) {
        assert!(index < self.layout.ports(), "no port {index}");
        let i = index as usize;
        // SAFETY: `i` is a port's index, and both arrays hold a word for every port
        // (`check_ports_inside`, at construction; the fields never change after).
        unsafe {
            (
                self.primary.get_unchecked(i),
                self.secondary.get_unchecked(i),
            )
        }
    }

    /// This port's two header words: `mask`, then `opcode` in the low bits (LLVM 18: 16,
    /// later: 32; padding above). Panics if there is no port `index`.
    #[inline]
    pub(crate) fn header(&self, index: u32) -> &'a [DataWord] {
        assert!(index < self.layout.ports(), "no port {index}");
        let at = index as usize * self.header_stride;
        // SAFETY: `index` is a port's, and every port's header lies inside `words`
        // (`check_ports_inside`, at construction; the fields never change after).
        unsafe { self.words.get_unchecked(at..at + 2) }
    }

    /// This port's `8 * L` packet words. Panics if there is no port `index`.
    #[inline]
    pub(crate) fn packets(&self, index: u32) -> &'a [DataWord] {
        assert!(index < self.layout.ports(), "no port {index}");
        let at = self.packet_start + index as usize * self.packet_stride;
        // SAFETY: `index` is a port's, and every port's packets lie inside `words`
        // (`check_ports_inside`, at construction; the fields never change after).
        unsafe { self.words.get_unchecked(at..at + self.packet_words()) }
    }

    /// The packet words of one port: 8 for each of its `L` lanes.
    fn packet_words(&self) -> usize {
        8 * self.layout.lanes() as usize
    }
}

/// Number of `u32` lock words for `ports` ports.
pub(crate) const fn lock_words(ports: u32) -> usize {
    ports.div_ceil(32) as usize
}

/// Checks that `locks` holds a lock bit for each of `mailbox`'s ports: what both ends of a
/// mailbox ask of the lock table they are given.
pub(crate) fn check_locks(mailbox: &Mailbox, locks: &[AtomicU32]) -> Result<(), ProtocolError> {
    let need = lock_words(mailbox.layout().ports());
    if locks.len() < need {
        return Err(ProtocolError::BadRegion {
            addr: 0,
            len: locks.len() * 4,
            need: need * 4,
        });
    }
    Ok(())
}

/// Port `index`'s lock bit: the word of `locks` that holds it, and the bit.
pub(crate) fn lock_bit(locks: &[AtomicU32], index: u32) -> (&AtomicU32, u32) {
    (&locks[index as usize / 32], 1 << (index % 32))
}

/// Takes port `index`'s lock bit. `Acquire` pairs with the `Release` of the last [`unlock`], so
/// everything the previous holder did with the port (its flips of its own word) is visible.
pub(crate) fn try_lock(locks: &[AtomicU32], index: u32) -> bool {
    let (word, bit) = lock_bit(locks, index);
    // RMW: sets the bit (unlocked -> locked); we hold the lock iff it was clear before.
    word.fetch_or(bit, crate::sync::Ordering::Acquire) & bit == 0
}

/// Releases port `index`'s lock bit. `Release` publishes the holder's work to the next holder.
pub(crate) fn unlock(locks: &[AtomicU32], index: u32) {
    let (word, bit) = lock_bit(locks, index);
    // RMW: clears our bit (locked -> unlocked) without touching the other ports' bits.
    word.fetch_and(!bit, crate::sync::Ordering::Release);
}

/// [`unlock`] for a caller that is the only thread to take or release any lock bit of
/// `locks` (the server thread, of the table it keeps for an attached mailbox): a plain load
/// and store instead of an RMW. An RMW after a flip waits until the flip's store has left the
/// store buffer (on x86 every locked instruction does), a cache-line round trip to the client
/// that polls our word, in which the server looks at nothing; a plain store does not wait. With
/// another thread setting or clearing bits of the same word, its change could be lost.
/// `Release`, as [`unlock`]'s, for whoever locks the port next (the same thread here).
#[cfg(feature = "std")]
pub(crate) fn unlock_alone(locks: &[AtomicU32], index: u32) {
    let (word, bit) = lock_bit(locks, index);
    let bits = word.load(crate::sync::Ordering::Relaxed);
    debug_assert!(bits & bit != 0, "port {index} unlocked but not locked");
    word.store(bits & !bit, crate::sync::Ordering::Release);
}

/// A table of port lock bits, to be shared by every thread serving (or every client thread
/// using) one mailbox.
#[cfg(feature = "std")]
pub struct LockTable {
    words: std::boxed::Box<[AtomicU32]>,
}

#[cfg(feature = "std")]
impl LockTable {
    /// Lock bits for `ports` ports, all unlocked.
    pub fn new(ports: u32) -> Self {
        LockTable {
            words: (0..lock_words(ports)).map(|_| AtomicU32::new(0)).collect(),
        }
    }
    /// The lock words, 32 ports each.
    pub fn words(&self) -> &[AtomicU32] {
        &self.words
    }
}

/// A zeroed, 64-byte-aligned mailbox region owned by this process (plugin-host's device memory,
/// tests, benchmarks). Under loom the arrays are loom atomics instead of one raw region.
#[cfg(feature = "std")]
pub struct MailboxMemory {
    layout: Layout,
    #[cfg(not(loom))]
    region: RawRegion,
    #[cfg(loom)]
    arrays: (
        std::vec::Vec<AtomicU32>,
        std::vec::Vec<AtomicU32>,
        std::vec::Vec<DataWord>,
    ),
}

#[cfg(feature = "std")]
impl MailboxMemory {
    /// Zeroed, 64-byte-aligned host memory for a mailbox of `layout`.
    pub fn new(layout: Layout) -> Self {
        #[cfg(not(loom))]
        {
            MailboxMemory {
                layout,
                region: RawRegion::zeroed(layout.total_size()),
            }
        }
        #[cfg(loom)]
        {
            let n = layout.ports() as usize;
            let u32s = |k: usize| (0..k).map(|_| AtomicU32::new(0)).collect();
            let u64s = |k: usize| (0..k).map(|_| DataWord::new(0)).collect();
            MailboxMemory {
                layout,
                arrays: (u32s(n), u32s(n), u64s(data_words(&layout))),
            }
        }
    }

    /// The memory's layout.
    pub fn layout(&self) -> Layout {
        self.layout
    }

    /// The region's address (also its "device" address for host-side clients).
    #[cfg(not(loom))]
    pub fn as_ptr(&self) -> *mut u8 {
        self.region.ptr
    }

    /// The memory as a mailbox.
    pub fn view(&self) -> Mailbox<'_> {
        #[cfg(not(loom))]
        {
            // SAFETY: the region is ours, 64-aligned, of the layout's size, lives as long as the
            // returned borrow of `self`, and is only ever accessed through such atomic views
            // (same-size: no other view of it exists).
            unsafe { Mailbox::from_raw(self.region.ptr, self.region.len, self.layout) }
                .expect("an owned region matches its layout")
        }
        #[cfg(loom)]
        {
            let (p, s, words) = &self.arrays;
            Mailbox::from_parts(self.layout, p, s, words).expect("arrays sized from the layout")
        }
    }
}

/// A zeroed heap allocation aligned to 64 bytes.
#[cfg(all(feature = "std", not(loom)))]
struct RawRegion {
    ptr: *mut u8,
    len: usize,
}

#[cfg(all(feature = "std", not(loom)))]
impl RawRegion {
    fn zeroed(len: usize) -> Self {
        let layout = std::alloc::Layout::from_size_align(len.max(1), 64).expect("valid size");
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            std::alloc::handle_alloc_error(layout);
        }
        RawRegion { ptr, len }
    }
}

#[cfg(all(feature = "std", not(loom)))]
impl Drop for RawRegion {
    fn drop(&mut self) {
        let layout = std::alloc::Layout::from_size_align(self.len.max(1), 64).expect("valid size");
        // SAFETY: allocated in `zeroed` with this same layout, freed once.
        unsafe { std::alloc::dealloc(self.ptr, layout) }
    }
}

// SAFETY: the region is plain memory only ever accessed through atomics.
#[cfg(all(feature = "std", not(loom)))]
unsafe impl Send for RawRegion {}
// SAFETY: as above: shared access is atomic access.
#[cfg(all(feature = "std", not(loom)))]
unsafe impl Sync for RawRegion {}

#[cfg(all(test, feature = "std", not(loom)))]
mod lock_tests {
    use super::*;
    use crate::sync::Ordering;

    #[test]
    fn unlock_alone_clears_its_own_bit_and_no_other() {
        let table = LockTable::new(64);
        let locks = table.words();
        for index in [0, 5, 31, 32, 63] {
            assert!(try_lock(locks, index));
        }
        assert!(!try_lock(locks, 5), "held");
        unlock_alone(locks, 5);
        unlock_alone(locks, 32);
        let words: std::vec::Vec<u32> = locks.iter().map(|w| w.load(Ordering::Relaxed)).collect();
        assert_eq!(words, [1 | 1 << 31, 1 << 31]);
        assert!(try_lock(locks, 5), "free again");
    }
}

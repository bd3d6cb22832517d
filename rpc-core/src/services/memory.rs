//! MALLOC and FREE through the raw allocator the plugin provides, with the server's own table
//! of live allocations per mailbox: FREE frees only what MALLOC handed out to the same mailbox
//! and is still live, and a mailbox holds at most `Limits::malloc_bytes`.
//!
//! A plugin's allocator only hands out and takes back blocks of bytes ([`DeviceAllocator`]);
//! the alignment MALLOC promises ([`MALLOC_ALIGN`]) is made here, once for every plugin: a
//! block is over-allocated by the alignment, the device gets the aligned address inside it, and
//! the table remembers the block's base to free ([`Live`]).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::vec::Vec;

use super::{active, per_lane, recv_words, send_word0, Refusals};
use crate::server::error::ServerError;
use crate::server::limits::device_log;
use crate::server::registry::Request;
use crate::sync::lock;
use crate::Result;
use crate::VendorError;

/// Device-accessible memory for the MALLOC/FREE services, raw: blocks of bytes at whatever
/// alignment the device gives them (the server aligns them, see the module docs). What kernels
/// forgot to free, the server frees when their mailbox is detached.
pub trait DeviceAllocator: Send + Sync {
    /// A block of `size` bytes (at least 1); returns its device address, 0 if the device has no
    /// memory for it (MALLOC then answers 0, as C's malloc may).
    fn allocate(&self, size: u64) -> Result<u64, VendorError>;
    /// Frees the block of `size` bytes at `addr`.
    ///
    /// # Safety
    /// `addr` and `size` are a block this allocator's `allocate` returned (called with that
    /// `size`) and that was not freed since. (The server's table of live allocations is what
    /// guarantees it: each block is freed once, by the base and size it was allocated with.)
    unsafe fn deallocate(&self, addr: u64, size: u64) -> Result<(), VendorError>;
}

/// The alignment of MALLOC's memory: LLVM's GPU allocator requires 2 MiB.
pub const MALLOC_ALIGN: u64 = 2 << 20;

/// A live allocation, as [`super::Services::live_allocations`] reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Allocation {
    /// Device address.
    pub addr: u64,
    /// Bytes the device asked for.
    pub size: u64,
}

/// The server's record of a live allocation: the size the device asked for, the block it lies
/// in and the allocator to free that with.
pub(crate) struct Live {
    size: u64,
    /// The block's address and length, as the allocator returned and was asked for them.
    base: u64,
    block: u64,
    allocator: Arc<dyn DeviceAllocator>,
}

impl Live {
    /// `size` bytes aligned to [`MALLOC_ALIGN`] from `allocator`: the block over-allocated by
    /// the alignment, and the aligned address inside it. `None` if the device had no memory.
    fn allocate(
        allocator: &Arc<dyn DeviceAllocator>,
        size: u64,
    ) -> core::result::Result<Option<(u64, Live)>, VendorError> {
        let total = size
            .checked_add(MALLOC_ALIGN - 1)
            .ok_or("the size overflows with the alignment")?;
        let base = allocator.allocate(total)?;
        if base == 0 {
            return Ok(None);
        }
        let live = Live {
            size,
            base,
            block: total,
            allocator: allocator.clone(),
        };
        // The block ends at `base + total`; one the allocator placed where that overflows is
        // no block at all (freed again, refused).
        match base.checked_add(total) {
            Some(_) => Ok(Some((align_up(base, MALLOC_ALIGN), live))),
            None => {
                live.free()?;
                Err(std::format!("the allocator returned a block at {base:#x} that wraps").into())
            }
        }
    }

    /// Frees the block through the allocator that made it.
    pub(crate) fn free(self) -> core::result::Result<(), VendorError> {
        // SAFETY: `base` and `block` are what `allocator.allocate(block)` returned and was
        // asked (`Live::allocate`), and `self` is consumed: a `Live` exists once per block, in
        // the table or in the hands of the one who took it out, so the block is freed once.
        unsafe { self.allocator.deallocate(self.base, self.block) }
    }
}

/// `addr` rounded up to `align` (a power of two); the caller has checked that it does not
/// overflow.
fn align_up(addr: u64, align: u64) -> u64 {
    (addr + (align - 1)) & !(align - 1)
}

/// One mailbox's live allocations by the address the device got, and the bytes they hold;
/// closed when the mailbox is detached.
#[derive(Default)]
pub(crate) struct Allocations {
    live: BTreeMap<u64, Live>,
    held: u64,
    closed: bool,
}

impl Allocations {
    pub(crate) fn len(&self) -> usize {
        self.live.len()
    }

    pub(crate) fn list(&self) -> Vec<Allocation> {
        self.live
            .iter()
            .map(|(&addr, live)| Allocation {
                addr,
                size: live.size,
            })
            .collect()
    }

    /// Records a live allocation; gives it back if the books are closed (the mailbox was
    /// detached while the allocator ran), for the caller to free.
    fn insert(&mut self, addr: u64, live: Live) -> Result<(), Live> {
        if self.closed {
            return Err(live);
        }
        self.held += live.size;
        if let Some(old) = self.live.insert(addr, live) {
            log::error!("allocator returned {addr:#x}, which is live already");
            self.held = self.held.saturating_sub(old.size);
        }
        Ok(())
    }

    fn remove(&mut self, addr: u64) -> Option<Live> {
        let live = self.live.remove(&addr)?;
        self.held = self.held.saturating_sub(live.size);
        Some(live)
    }

    /// Takes every allocation out and closes the books: a later `insert` is refused.
    pub(crate) fn close(&mut self) -> Vec<(u64, Live)> {
        self.closed = true;
        self.held = 0;
        std::mem::take(&mut self.live).into_iter().collect()
    }
}

/// MALLOC: C send buf\[0\] = size; S send buf\[0\] = address (2 MiB aligned) or 0. Size 0 and
/// failed allocations answer 0, as C's malloc may; no allocator set, or a size that would take
/// the mailbox above `Limits::malloc_bytes`, is a refusal (0).
pub(crate) async fn malloc(mut req: Request) -> Result<(), ServerError> {
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
        let held = lock(&mailbox.allocations).held;
        if held.saturating_add(size) > quota {
            refusals.lane(
                lane,
                std::format!(
                    "MALLOC of {size} bytes would take the mailbox above its limit of {quota} \
                     ({held} held)"
                ),
            );
            continue;
        }
        match Live::allocate(allocator, size) {
            Ok(None) => {}
            Ok(Some((addr, live))) => {
                // The allocator ran without the table's lock: the mailbox may have been
                // detached meanwhile (its allocations freed), and then this one is freed now.
                let recorded = lock(&mailbox.allocations).insert(addr, live);
                match recorded {
                    Ok(()) => replies[lane as usize] = addr,
                    Err(live) => {
                        log::debug!("mailbox {}: detached, {addr:#x} freed", mailbox.id.0);
                        if let Err(error) = live.free() {
                            log::warn!("mailbox {}: freeing {addr:#x}: {error}", mailbox.id.0);
                        }
                    }
                }
            }
            Err(error) => device_log!(
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
pub(crate) async fn free(mut req: Request) -> Result<(), ServerError> {
    let words = recv_words(&mut req).await?;
    let mailbox = super::mailbox_state(&req);
    let mut refusals = Refusals::default();
    for lane in active(&req) {
        let addr = words[lane as usize][0];
        if addr == 0 {
            continue;
        }
        let live = lock(&mailbox.allocations).remove(addr);
        match live {
            Some(live) => {
                if let Err(error) = live.free() {
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
    }

    fn scripted(bases: &[u64]) -> Arc<Scripted> {
        Arc::new(Scripted {
            next: Mutex::new(bases.iter().rev().copied().collect()),
            asked: Mutex::new(Vec::new()),
            freed: Mutex::new(Vec::new()),
        })
    }

    #[test]
    fn a_block_is_over_allocated_and_the_aligned_address_inside_it_freed_by_its_base() {
        let bases = [0x7f00_0000_1000, 0x7f00_0020_0000, 0x7f00_001f_fff8, 8];
        let raw = scripted(&bases);
        let allocator: Arc<dyn DeviceAllocator> = raw.clone();
        for base in bases {
            let (addr, live) = Live::allocate(&allocator, 100).unwrap().unwrap();
            assert_eq!(addr % MALLOC_ALIGN, 0, "{addr:#x}");
            assert!(
                addr >= base && addr + 100 < base + 100 + MALLOC_ALIGN,
                "inside the block"
            );
            assert_eq!(live.size, 100);
            live.free().unwrap();
        }
        assert_eq!(*lock(&raw.asked), [100 + MALLOC_ALIGN - 1; 4]);
        assert_eq!(
            *lock(&raw.freed),
            bases,
            "each block freed by the base it came at"
        );
    }

    #[test]
    fn no_memory_sizes_that_overflow_and_blocks_that_wrap_are_no_allocation() {
        let raw = scripted(&[0, u64::MAX - 4096]);
        let allocator: Arc<dyn DeviceAllocator> = raw.clone();
        assert!(
            Live::allocate(&allocator, 100).unwrap().is_none(),
            "no memory"
        );
        assert!(Live::allocate(&allocator, u64::MAX).is_err(), "overflows");
        assert!(Live::allocate(&allocator, 100).is_err(), "wraps");
        assert_eq!(
            *lock(&raw.freed),
            [u64::MAX - 4096],
            "the wrapping block freed again"
        );
    }
}

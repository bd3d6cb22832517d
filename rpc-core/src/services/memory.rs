//! MALLOC and FREE through the allocator the plugin provides, with the server's own table of
//! live allocations: FREE frees only what MALLOC handed out and is still live.

use std::alloc::Layout as AllocLayout;
use std::collections::HashMap;
use std::sync::Arc;

use super::{active, per_lane, recv_words, send_word0, Refusals};
use crate::plugin::{DeviceAllocator, VendorError};
use crate::registry::Request;
use crate::sync::{lock, Mutex};
use crate::Result;

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

/// The server's record of a live allocation: its size and the allocator to free it with.
pub(crate) struct Live {
    pub(crate) size: u64,
    allocator: Arc<dyn DeviceAllocator>,
}

/// MALLOC: C send buf\[0\] = size; S send buf\[0\] = address (2 MiB aligned) or 0. Size 0 and
/// failed allocations answer 0, as C's malloc may; no allocator set is a refusal (0).
pub(crate) async fn malloc(mut req: Request) -> Result<()> {
    let words = recv_words(&mut req).await?;
    let context = super::context(&req);
    let services = &context.services;
    let allocator = services.allocator_for(req.mailbox().id);
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
        match allocator.allocate(size, MALLOC_ALIGN) {
            Ok(0) => {}
            Ok(addr) => {
                let live = Live {
                    size,
                    allocator: allocator.clone(),
                };
                if lock(&services.allocations).insert(addr, live).is_some() {
                    log::error!("allocator returned {addr:#x}, which is live already");
                }
                replies[lane as usize] = addr;
            }
            Err(error) => log::warn!("MALLOC of {size} bytes failed: {error}"),
        }
    }
    send_word0(&mut req, &replies).await?;
    refusals.finish()
}

/// FREE: C send buf\[0\] = address; S frees; no reply. Address 0 is a no-op (`free(NULL)`);
/// anything else that is not a live allocation of this server (foreign, or freed already) is
/// refused and nothing is freed.
pub(crate) async fn free(mut req: Request) -> Result<()> {
    let words = recv_words(&mut req).await?;
    let context = super::context(&req);
    let services = &context.services;
    let mut refusals = Refusals::default();
    for lane in active(&req) {
        let addr = words[lane as usize][0];
        if addr == 0 {
            continue;
        }
        let live = lock(&services.allocations).remove(&addr);
        match live {
            Some(live) => {
                if let Err(error) = live.allocator.deallocate(addr) {
                    refusals.lane(
                        lane,
                        std::format!("the allocator failed to free {addr:#x}: {error}"),
                    );
                }
            }
            None => refusals.lane(
                lane,
                std::format!(
                    "FREE of {addr:#x}, which is no live allocation (foreign or freed already)"
                ),
            ),
        }
    }
    refusals.finish()
}

/// Host memory as "device" memory (`std::alloc` with the requested alignment): for plugin-host,
/// where the device is the host, and for tests. Memory still allocated when it is dropped is
/// freed then.
#[derive(Default)]
pub struct HostAllocator {
    live: Mutex<HashMap<u64, AllocLayout>>,
}

impl HostAllocator {
    pub fn new() -> Self {
        Self::default()
    }
    /// Allocations not yet freed.
    pub fn live(&self) -> usize {
        lock(&self.live).len()
    }
}

impl DeviceAllocator for HostAllocator {
    fn allocate(&self, size: u64, align: u64) -> core::result::Result<u64, VendorError> {
        let size = usize::try_from(size.max(1))?;
        let align = usize::try_from(align.max(1))?;
        let layout = AllocLayout::from_size_align(size, align)?;
        // SAFETY: `layout` has a non-zero size.
        let ptr = unsafe { std::alloc::alloc(layout) };
        if ptr.is_null() {
            return Err(std::format!("out of host memory for {size} bytes").into());
        }
        let addr = ptr as u64;
        lock(&self.live).insert(addr, layout);
        Ok(addr)
    }

    fn deallocate(&self, addr: u64) -> core::result::Result<(), VendorError> {
        let layout = lock(&self.live)
            .remove(&addr)
            .ok_or_else(|| std::format!("{addr:#x} was not allocated here"))?;
        // SAFETY: `addr` came from `alloc` with `layout` (recorded together above) and was not
        // freed since (it was still in the table, which we just removed it from).
        unsafe { std::alloc::dealloc(addr as *mut u8, layout) };
        Ok(())
    }
}

impl Drop for HostAllocator {
    fn drop(&mut self) {
        for (addr, layout) in lock(&self.live).drain() {
            // SAFETY: as in `deallocate`: allocated with `layout`, not freed since.
            unsafe { std::alloc::dealloc(addr as *mut u8, layout) };
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn host_allocator_aligns_and_refuses_unknown_addresses() {
        let allocator = HostAllocator::new();
        let addr = allocator.allocate(100, MALLOC_ALIGN).unwrap();
        assert_eq!(addr % MALLOC_ALIGN, 0);
        assert_eq!(allocator.live(), 1);
        assert!(allocator.deallocate(addr + 8).is_err());
        allocator.deallocate(addr).unwrap();
        assert!(allocator.deallocate(addr).is_err());
        assert!(allocator.allocate(u64::MAX, MALLOC_ALIGN).is_err());
        let _leak = allocator.allocate(1, 64).unwrap();
    }
}

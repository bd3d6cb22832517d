//! MALLOC and FREE through the allocator the plugin provides, with the server's own table of
//! live allocations per mailbox: FREE frees only what MALLOC handed out to the same mailbox and
//! is still live, and a mailbox holds at most `Limits::malloc_bytes`.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::vec::Vec;

use super::{active, per_lane, recv_words, send_word0, Refusals};
use crate::protocol::error::VendorError;
use crate::server::limits::device_warn;
use crate::server::registry::Request;
use crate::server::MailboxId;
use crate::sync::lock;
use crate::Result;

/// Device-accessible memory for the MALLOC/FREE services.
pub trait DeviceAllocator: Send + Sync {
    /// `size` bytes aligned to `align` (a power of two); returns the device address.
    fn allocate(&self, size: u64, align: u64) -> Result<u64, VendorError>;
    /// Frees an address `allocate` returned (the server only passes such addresses).
    fn deallocate(&self, addr: u64) -> Result<(), VendorError>;
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

/// The server's record of a live allocation: its size and the allocator to free it with.
pub(crate) struct Live {
    size: u64,
    allocator: Arc<dyn DeviceAllocator>,
}

impl Live {
    pub(crate) fn free(self, addr: u64) -> core::result::Result<(), VendorError> {
        self.allocator.deallocate(addr)
    }
}

/// Every mailbox's live allocations, and the bytes each mailbox holds.
#[derive(Default)]
pub(crate) struct Allocations {
    live: BTreeMap<(MailboxId, u64), Live>,
    held: HashMap<MailboxId, u64>,
}

impl Allocations {
    pub(crate) fn len(&self) -> usize {
        self.live.len()
    }

    pub(crate) fn list(&self) -> Vec<Allocation> {
        self.live
            .iter()
            .map(|(&(_, addr), live)| Allocation {
                addr,
                size: live.size,
            })
            .collect()
    }

    /// Bytes `mailbox` holds.
    fn held(&self, mailbox: MailboxId) -> u64 {
        self.held.get(&mailbox).copied().unwrap_or(0)
    }

    /// Starts the books of an attached mailbox (nothing held).
    pub(crate) fn register(&mut self, mailbox: MailboxId) {
        self.held.entry(mailbox).or_default();
    }

    /// Records a live allocation of `mailbox`; gives it back if the mailbox is not registered
    /// (detached while the allocator ran), for the caller to free.
    fn insert(&mut self, mailbox: MailboxId, addr: u64, live: Live) -> Result<(), Live> {
        let Some(held) = self.held.get_mut(&mailbox) else {
            return Err(live);
        };
        *held += live.size;
        if let Some(old) = self.live.insert((mailbox, addr), live) {
            log::error!("allocator returned {addr:#x}, which is live already");
            self.subtract(mailbox, old.size);
        }
        Ok(())
    }

    fn remove(&mut self, mailbox: MailboxId, addr: u64) -> Option<Live> {
        let live = self.live.remove(&(mailbox, addr))?;
        self.subtract(mailbox, live.size);
        Some(live)
    }

    fn subtract(&mut self, mailbox: MailboxId, size: u64) {
        if let Some(held) = self.held.get_mut(&mailbox) {
            *held = held.saturating_sub(size);
        }
    }

    /// Takes every allocation of `mailbox` out of the table and closes its books: a later
    /// `insert` for it is refused.
    pub(crate) fn take_mailbox(&mut self, mailbox: MailboxId) -> Vec<(u64, Live)> {
        self.held.remove(&mailbox);
        let addrs: Vec<u64> = self
            .live
            .range((mailbox, 0)..=(mailbox, u64::MAX))
            .map(|(&(_, addr), _)| addr)
            .collect();
        addrs
            .into_iter()
            .filter_map(|addr| Some((addr, self.live.remove(&(mailbox, addr))?)))
            .collect()
    }
}

/// MALLOC: C send buf\[0\] = size; S send buf\[0\] = address (2 MiB aligned) or 0. Size 0 and
/// failed allocations answer 0, as C's malloc may; no allocator set, or a size that would take
/// the mailbox above `Limits::malloc_bytes`, is a refusal (0).
pub(crate) async fn malloc(mut req: Request) -> Result<()> {
    let words = recv_words(&mut req).await?;
    let context = super::context(&req);
    let services = &context.services();
    let mailbox = req.mailbox().id;
    let quota = context.config.limits.malloc_bytes;
    let allocator = services.allocator_for(mailbox);
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
        let held = lock(&services.allocations).held(mailbox);
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
        match allocator.allocate(size, MALLOC_ALIGN) {
            Ok(0) => {}
            Ok(addr) => {
                let live = Live {
                    size,
                    allocator: allocator.clone(),
                };
                // The allocator ran without the table's lock: the mailbox may have been
                // detached meanwhile (its allocations freed), and then this one is freed now.
                let recorded = lock(&services.allocations).insert(mailbox, addr, live);
                match recorded {
                    Ok(()) => replies[lane as usize] = addr,
                    Err(live) => {
                        log::debug!("mailbox {}: detached, {addr:#x} freed", mailbox.0);
                        if let Err(error) = live.free(addr) {
                            log::warn!("mailbox {}: freeing {addr:#x}: {error}", mailbox.0);
                        }
                    }
                }
            }
            Err(error) => device_warn!(context, "MALLOC of {size} bytes failed: {error}"),
        }
    }
    send_word0(&mut req, &replies).await?;
    refusals.finish()
}

/// FREE: C send buf\[0\] = address; S frees; no reply. Address 0 is a no-op (`free(NULL)`);
/// anything else that is not a live allocation of this mailbox (foreign, another mailbox's, or
/// freed already) is refused and nothing is freed.
pub(crate) async fn free(mut req: Request) -> Result<()> {
    let words = recv_words(&mut req).await?;
    let context = super::context(&req);
    let services = &context.services();
    let mut refusals = Refusals::default();
    for lane in active(&req) {
        let addr = words[lane as usize][0];
        if addr == 0 {
            continue;
        }
        let live = lock(&services.allocations).remove(req.mailbox().id, addr);
        match live {
            Some(live) => {
                if let Err(error) = live.free(addr) {
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

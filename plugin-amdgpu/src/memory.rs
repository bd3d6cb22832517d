//! Memory from HSA pools: fine-grained host memory the GPU sees coherently (mailboxes, the
//! doorbell, kernel arguments) and coarse-grained device memory (MALLOC/FREE).
//!
//! HSA has one virtual address space for host and agents, so a pool allocation's host pointer
//! is also its device address.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use rpc_core::plugin::{DeviceAllocator, SharedRegion, VendorError};

use crate::error::AmdGpuError;
use crate::loader::{Agent, HsaApi, MemoryPool};

/// The alignment of every MALLOC block (PROTOCOL opcode 10: the GPU allocator needs 2 MiB).
pub const MALLOC_ALIGN: u64 = 2 << 20;

/// `len` bytes (at least 1) from `pool`; if `agents` is not empty, they are allowed to access it.
pub(crate) fn pool_allocate(
    hsa: &dyn HsaApi,
    pool: MemoryPool,
    len: usize,
    agents: &[Agent],
) -> Result<*mut u8, AmdGpuError> {
    let ptr = hsa.pool_allocate(pool, len.max(1))?;
    if !agents.is_empty() {
        // SAFETY: `ptr` was just allocated from a pool and is not shared yet.
        if let Err(e) = unsafe { hsa.agents_allow_access(agents, ptr) } {
            // SAFETY: `ptr` came from `pool_allocate` and was not freed or handed out.
            let _ = unsafe { hsa.pool_free(ptr) };
            return Err(e);
        }
    }
    Ok(ptr)
}

/// Frees a pointer [`pool_allocate`] returned.
///
/// # Safety
/// `ptr` came from [`pool_allocate`] with the same runtime, is not yet freed, and nothing
/// (host or device) uses it any more.
pub(crate) unsafe fn pool_free(hsa: &dyn HsaApi, ptr: *mut u8) -> Result<(), AmdGpuError> {
    // SAFETY: the caller's contract.
    unsafe { hsa.pool_free(ptr) }
}

/// Zeroed host memory from a fine-grained pool that the GPU agent may access: a mailbox.
pub struct AmdGpuRegion {
    hsa: Arc<dyn HsaApi>,
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the region is plain memory owned by this value; concurrent access to its contents
// goes through the atomics of rpc-core's mailbox views, and freeing needs `&mut self` (drop).
unsafe impl Send for AmdGpuRegion {}
// SAFETY: as for `Send`: `&AmdGpuRegion` only hands out the address.
unsafe impl Sync for AmdGpuRegion {}

impl AmdGpuRegion {
    /// `len` zeroed bytes from the fine-grained `pool`, accessible by `gpu`. Pool allocations
    /// are aligned to the pool's granule (a page), so 64-byte alignment holds.
    pub fn new(
        hsa: Arc<dyn HsaApi>,
        pool: MemoryPool,
        gpu: Agent,
        len: usize,
    ) -> Result<Self, AmdGpuError> {
        let ptr = pool_allocate(&*hsa, pool, len, &[gpu])?;
        debug_assert_eq!(ptr as usize % 64, 0);
        // SAFETY: fine-grained system memory is host-addressable; `ptr` is valid for `len` bytes.
        unsafe { core::ptr::write_bytes(ptr, 0, len) };
        Ok(AmdGpuRegion { hsa, ptr, len })
    }
}

// SAFETY: fine-grained memory from `hsa_amd_memory_pool_allocate` is page-aligned, stays at its address until freed in `Drop`, and the host touches it only through the server's atomic views.
unsafe impl SharedRegion for AmdGpuRegion {
    fn host_ptr(&self) -> *mut u8 {
        self.ptr
    }
    fn device_addr(&self) -> u64 {
        self.ptr as u64
    }
    fn len(&self) -> usize {
        self.len
    }
}

impl Drop for AmdGpuRegion {
    fn drop(&mut self) {
        // SAFETY: allocated by `pool_allocate` in `new`, freed only here; the glue detaches a
        // mailbox (and kernels using it have completed) before dropping its region.
        if let Err(e) = unsafe { pool_free(&*self.hsa, self.ptr) } {
            log::warn!("amdgpu: freeing a shared region: {e}");
        }
    }
}

/// MALLOC/FREE from a device's coarse-grained pool, every block [`MALLOC_ALIGN`]-aligned.
///
/// The pool guarantees only its granule (a page), so a block is over-allocated by the
/// alignment and the returned address aligned up; the base is remembered for FREE. Blocks the
/// device never freed are released by [`AmdGpuAllocator::release_all`] (plugin deinit) or drop.
pub struct AmdGpuAllocator {
    hsa: Arc<dyn HsaApi>,
    pool: MemoryPool,
    /// Agents that may access the blocks (the GPU itself; a coarse pool is its own).
    agents: Vec<Agent>,
    /// Aligned address handed out -> base pointer to free.
    live: Mutex<HashMap<u64, u64>>,
}

impl AmdGpuAllocator {
    pub fn new(hsa: Arc<dyn HsaApi>, pool: MemoryPool, agents: Vec<Agent>) -> Self {
        AmdGpuAllocator {
            hsa,
            pool,
            agents,
            live: Mutex::new(HashMap::new()),
        }
    }

    /// Blocks handed out and not yet freed.
    pub fn live_blocks(&self) -> usize {
        lock(&self.live).len()
    }

    /// Frees every block still live (the device forgot them). Returns how many.
    pub fn release_all(&self) -> usize {
        let blocks: Vec<u64> = lock(&self.live).drain().map(|(_, base)| base).collect();
        for &base in &blocks {
            // SAFETY: each base came from `pool_allocate` in `allocate` and was removed from
            // `live` just now, so it is freed once; called when no kernel of the device runs.
            if let Err(e) = unsafe { pool_free(&*self.hsa, base as *mut u8) } {
                log::warn!("amdgpu: freeing a forgotten MALLOC block: {e}");
            }
        }
        blocks.len()
    }
}

/// `(size + align - 1)` bytes hold an `align`-aligned block of `size`; the offset of that block
/// from `base`. Also the arithmetic the tests check.
pub fn over_allocation(size: u64, align: u64) -> Option<u64> {
    size.checked_add(align - 1)
}

/// `base` rounded up to `align` (a power of two).
pub fn align_up(base: u64, align: u64) -> u64 {
    (base + align - 1) & !(align - 1)
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl DeviceAllocator for AmdGpuAllocator {
    fn allocate(&self, size: u64, align: u64) -> Result<u64, VendorError> {
        if !align.is_power_of_two() {
            return Err(AmdGpuError::Invalid("MALLOC alignment is not a power of two").into());
        }
        let align = align.max(MALLOC_ALIGN);
        let total = over_allocation(size.max(1), align)
            .and_then(|t| usize::try_from(t).ok())
            .ok_or(AmdGpuError::Invalid("MALLOC size overflows"))?;
        let base = pool_allocate(&*self.hsa, self.pool, total, &self.agents)? as u64;
        let addr = align_up(base, align);
        lock(&self.live).insert(addr, base);
        Ok(addr)
    }

    fn deallocate(&self, addr: u64) -> Result<(), VendorError> {
        let base = lock(&self.live)
            .remove(&addr)
            .ok_or(AmdGpuError::UnknownAddress(addr))?;
        // SAFETY: `base` came from `pool_allocate` and left `live` just now (freed once); the
        // server passes only addresses it handed out, which the device no longer uses.
        unsafe { pool_free(&*self.hsa, base as *mut u8) }?;
        Ok(())
    }
}

impl Drop for AmdGpuAllocator {
    fn drop(&mut self) {
        let n = self.release_all();
        if n > 0 {
            log::debug!("amdgpu: released {n} MALLOC blocks the device did not free");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn malloc_blocks_are_2_mib_aligned_inside_the_over_allocation() {
        for base in [0x7f00_0000_1000u64, 0x7f00_0020_0000, 0x7f00_001f_f000] {
            let size = 100;
            let total = over_allocation(size, MALLOC_ALIGN).unwrap();
            let addr = align_up(base, MALLOC_ALIGN);
            assert_eq!(addr % MALLOC_ALIGN, 0);
            assert!(addr >= base && addr + size <= base + total);
        }
        assert_eq!(over_allocation(u64::MAX, MALLOC_ALIGN), None);
    }
}

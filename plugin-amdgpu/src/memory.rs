//! Memory from HSA pools: fine-grained host memory the GPU sees coherently (mailboxes, the
//! doorbell, kernel arguments) and coarse-grained device memory (MALLOC/FREE).
//!
//! HSA has one virtual address space for host and agents, so a pool allocation's host pointer
//! is also its device address.

use std::sync::{Arc, Mutex};

use rpc_core::plugin::{DeviceAllocator, SharedRegion, VendorError};

use crate::error::AmdGpuError;
use crate::loader::{Agent, HsaApi, MemoryPool};

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

/// MALLOC/FREE from a device's coarse-grained pool: raw blocks (the server aligns them and
/// frees what kernels forgot when it detaches their mailbox). Once the device is released it
/// refuses, so a server still holding it never calls into a runtime that was shut down.
pub struct AmdGpuAllocator {
    hsa: Arc<dyn HsaApi>,
    pool: MemoryPool,
    /// Agents that may access the blocks (the GPU itself; a coarse pool is its own).
    agents: Vec<Agent>,
    /// Set by `release`; held across each HSA call so none overlaps the release.
    released: Mutex<bool>,
}

impl AmdGpuAllocator {
    pub(crate) fn new(hsa: Arc<dyn HsaApi>, pool: MemoryPool, agents: Vec<Agent>) -> Self {
        AmdGpuAllocator {
            hsa,
            pool,
            agents,
            released: Mutex::new(false),
        }
    }

    /// Refuses every later request (the device is being released).
    pub fn release(&self) {
        *lock(&self.released) = true;
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl DeviceAllocator for AmdGpuAllocator {
    fn allocate(&self, size: u64) -> Result<u64, VendorError> {
        let len =
            usize::try_from(size).map_err(|_| AmdGpuError::Invalid("MALLOC size overflows"))?;
        let released = lock(&self.released);
        if *released {
            return Err(AmdGpuError::Released.into());
        }
        Ok(pool_allocate(&*self.hsa, self.pool, len, &self.agents)? as u64)
    }

    unsafe fn deallocate(&self, addr: u64, _size: u64) -> Result<(), VendorError> {
        let released = lock(&self.released);
        if *released {
            return Err(AmdGpuError::Released.into());
        }
        // SAFETY: the caller's contract: `addr` came from `allocate`, so from `pool_allocate`,
        // and was not freed since; the runtime is alive (not released).
        unsafe { pool_free(&*self.hsa, addr as *mut u8) }?;
        Ok(())
    }
}

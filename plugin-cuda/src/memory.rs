//! Memory: the mailbox region (pinned host memory mapped for the device) and the device
//! allocator behind MALLOC/FREE.

use std::sync::Arc;

use rpc_core::plugin::{DeviceAllocator, SharedRegion, VendorError};
use std::sync::Mutex;

use crate::context::Core;
use crate::error::{CudaError, Result};
use crate::loader::{Stream, MEMHOSTALLOC_DEVICEMAP, MEMHOSTALLOC_PORTABLE};

/// The alignment the mailbox needs (PROTOCOL section 2).
pub const REGION_ALIGN: u64 = 64;

/// Page-locked host memory, mapped into the device's address space (`cuMemHostAlloc` with
/// `DEVICEMAP | PORTABLE`), zeroed at allocation; freed (`cuMemFreeHost`) on drop.
pub struct PinnedRegion {
    core: Arc<Core>,
    host: *mut u8,
    device: u64,
    len: usize,
}

// SAFETY: the region is plain memory owned by this value; the raw pointer is only handed out
// (`host_ptr`), and whoever uses it synchronises through the protocol's atomics. Freeing happens
// once, in `drop`.
unsafe impl Send for PinnedRegion {}
// SAFETY: `&PinnedRegion` only reads the immutable fields.
unsafe impl Sync for PinnedRegion {}

impl PinnedRegion {
    /// Allocates `len` zeroed bytes of mapped pinned memory on `core`'s device.
    pub(crate) fn new(core: &Arc<Core>, len: usize) -> Result<PinnedRegion> {
        if len == 0 {
            return Err(CudaError::InvalidArgument(
                "a shared region of 0 bytes".into(),
            ));
        }
        core.bind()?;
        let driver = core.driver();
        let host = driver
            .mem_host_alloc(len, MEMHOSTALLOC_DEVICEMAP | MEMHOSTALLOC_PORTABLE)
            .map_err(|code| core.fail("cuMemHostAlloc", code))?;
        // From here on `region` owns the allocation and frees it on every error path.
        let mut region = PinnedRegion {
            core: core.clone(),
            host,
            device: 0,
            len,
        };
        if (host as u64) % REGION_ALIGN != 0 {
            return Err(CudaError::Misaligned {
                what: "pinned host memory",
                addr: host as u64,
                align: REGION_ALIGN,
            });
        }
        region.device = driver
            .mem_host_get_device_pointer(host)
            .map_err(|code| core.fail("cuMemHostGetDevicePointer_v2", code))?;
        if region.device % REGION_ALIGN != 0 {
            return Err(CudaError::Misaligned {
                what: "mapped device address",
                addr: region.device,
                align: REGION_ALIGN,
            });
        }
        // SAFETY: `host` points to `len` bytes the driver just allocated for us alone.
        unsafe { std::ptr::write_bytes(host, 0, len) };
        Ok(region)
    }
}

// SAFETY: `cuMemHostAlloc` memory is page-aligned, stays at its address until `cuMemFreeHost` in `Drop`, and the host touches it only through the server's atomic views.
unsafe impl SharedRegion for PinnedRegion {
    fn host_ptr(&self) -> *mut u8 {
        self.host
    }
    fn device_addr(&self) -> u64 {
        self.device
    }
    fn len(&self) -> usize {
        self.len
    }
}

impl Drop for PinnedRegion {
    fn drop(&mut self) {
        // Freeing pinned memory needs a context; a released device has none, and its memory
        // went with the context.
        if self.core.bind().is_err() {
            return;
        }
        // SAFETY: `host` came from `mem_host_alloc` and is freed only here. The glue drops a
        // region only after detaching it (no kernel or server thread still uses it).
        if let Err(code) = unsafe { self.core.driver().mem_free_host(self.host) } {
            log::warn!("cuda: {}", self.core.fail("cuMemFreeHost", code));
        }
    }
}

/// Device memory for MALLOC/FREE: raw blocks of device memory (the server aligns them and
/// frees what kernels forgot when it detaches their mailbox). Once the device is released it
/// refuses, so a server still holding it never touches a dead context.
///
/// Where the device supports memory pools the allocator uses `cuMemAllocAsync` /
/// `cuMemFreeAsync` on its own non-blocking stream: plain `cuMemFree` may synchronise the
/// device, and the server thread calls it while the kernel that asked for the FREE is still
/// running and waiting for the reply, which would deadlock.
pub struct CudaAllocator {
    core: Arc<Core>,
    /// The stream for stream-ordered allocation, when the device has memory pools.
    stream: Option<Stream>,
    /// Set by `release`; held across each driver call so none overlaps the release.
    released: Mutex<bool>,
}

impl CudaAllocator {
    pub(crate) fn new(core: Arc<Core>, stream: Option<Stream>) -> CudaAllocator {
        CudaAllocator {
            core,
            stream,
            released: Mutex::new(false),
        }
    }

    fn allocate_impl(&self, size: u64) -> Result<u64> {
        let total = usize::try_from(size)
            .map_err(|_| CudaError::InvalidArgument(format!("allocation of {size} bytes")))?;
        let released = self.released.lock().unwrap_or_else(|p| p.into_inner());
        if *released {
            return Err(CudaError::Released);
        }
        self.core.bind()?;
        self.alloc_raw(total.max(1))
    }

    fn alloc_raw(&self, total: usize) -> Result<u64> {
        let driver = self.core.driver();
        match self.stream {
            Some(stream) => {
                let base = driver
                    .mem_alloc_async(total, stream)
                    .map_err(|code| self.core.fail("cuMemAllocAsync", code))?;
                // Stream-ordered: the block is usable on other streams once this stream is.
                if let Err(code) = driver.stream_synchronize(stream) {
                    let _ = driver.mem_free_async(base, stream);
                    return Err(self.core.fail("cuStreamSynchronize", code));
                }
                Ok(base)
            }
            None => driver
                .mem_alloc(total)
                .map_err(|code| self.core.fail("cuMemAlloc_v2", code)),
        }
    }

    fn deallocate_impl(&self, base: u64) -> Result<()> {
        let released = self.released.lock().unwrap_or_else(|p| p.into_inner());
        if *released {
            return Err(CudaError::Released);
        }
        self.core.bind()?;
        let driver = self.core.driver();
        match self.stream {
            Some(stream) => driver
                .mem_free_async(base, stream)
                .map_err(|code| self.core.fail("cuMemFreeAsync", code)),
            None => driver
                .mem_free(base)
                .map_err(|code| self.core.fail("cuMemFree_v2", code)),
        }
    }

    /// Refuses later requests and destroys the allocation stream. Called by the device's
    /// release, before its context goes (with which any block still allocated goes too);
    /// idempotent.
    pub(crate) fn release(&self) -> Result<()> {
        let mut released = self.released.lock().unwrap_or_else(|p| p.into_inner());
        if std::mem::replace(&mut *released, true) {
            return Ok(());
        }
        let Some(stream) = self.stream else {
            return Ok(());
        };
        self.core.bind()?;
        let driver = self.core.driver();
        let mut first_error = None;
        if let Err(code) = driver.stream_synchronize(stream) {
            first_error.get_or_insert(self.core.fail("cuStreamSynchronize", code));
        }
        if let Err(code) = driver.stream_destroy(stream) {
            first_error.get_or_insert(self.core.fail("cuStreamDestroy_v2", code));
        }
        first_error.map_or(Ok(()), Err)
    }
}

impl DeviceAllocator for CudaAllocator {
    fn allocate(&self, size: u64) -> Result<u64, VendorError> {
        Ok(self.allocate_impl(size)?)
    }

    unsafe fn deallocate(&self, addr: u64, _size: u64) -> Result<(), VendorError> {
        // The driver checks the address itself (an unknown one is an error, not undefined
        // behaviour), so the caller's contract is not needed for soundness here.
        Ok(self.deallocate_impl(addr)?)
    }
}

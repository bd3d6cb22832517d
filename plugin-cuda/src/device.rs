//! One CUDA device: its primary context, its launch stream, its allocator, and launches whose
//! completion is reported exactly once.
//!
//! # Completions
//! A launch queues the kernel and then a host function (`cuLaunchHostFunc`) on the device's
//! stream; the driver calls it once the kernel has completed. The driver does **not** call it
//! when the context has failed (a faulted kernel is a sticky error), so the `done` callback is
//! not handed to the driver: it waits in a process-wide table under a ticket number, and the
//! host function only carries the ticket. Whoever removes a ticket from the table calls its
//! `done`, so it runs exactly once, by one of:
//! - the host function, after the kernel;
//! - `launch` itself, when the launch or the queueing of the host function fails (in the latter
//!   case after waiting for the already-queued kernel);
//! - `synchronize` or the device's release, when the stream reports a failure: the context is
//!   then unusable, no kernel of it runs any more and no host function of it will be called.
//!
//! `done` usually runs on the driver's callback thread, where CUDA calls are not allowed and
//! the stream waits for it: it should be short and make no CUDA call (the glue's releases a
//! user guard). A panic in it is caught and logged.

use std::collections::HashMap;
use std::ffi::c_void;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, OnceLock};

use rpc_core::plugin::{
    Completion, Device, DeviceAllocator, Grid, SharedRegion, Symbol, VendorError,
};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

use crate::context::{driver_error, Core};
use crate::error::{CudaError, Result};
use crate::image::CudaImage;
use crate::loader::{
    Attribute, DriverApi, DriverResult, Stream, STREAM_DEFAULT, STREAM_NON_BLOCKING,
};
use crate::memory::{CudaAllocator, PinnedRegion};

/// NVPTX warps have 32 lanes.
pub const LANE_SIZE: u32 = 32;

/// The warps resident at once on a device with `sms` multiprocessors of `max_threads_per_sm`
/// resident threads each (the glue makes it the port count, within the generation's bounds).
pub fn resident_warps(sms: u32, max_threads_per_sm: u32) -> u32 {
    sms.saturating_mul(max_threads_per_sm / LANE_SIZE)
}

/// The per-thread stack LLVM's GPU loader sets (`llvm-gpu-loader`, nvptx.cpp): 3 KiB.
pub const LOADER_STACK_SIZE: usize = 3 * 1024;

/// Completions waiting for their kernels, by ticket, with the device each belongs to.
struct Pending {
    next_ticket: AtomicU64,
    waiting: Mutex<HashMap<u64, (u64, Completion)>>,
}

fn pending() -> &'static Pending {
    static PENDING: OnceLock<Pending> = OnceLock::new();
    PENDING.get_or_init(|| Pending {
        next_ticket: AtomicU64::new(1),
        waiting: Mutex::new(HashMap::new()),
    })
}

/// A unique number per device, to find its completions in the table.
fn next_device_key() -> u64 {
    // Relaxed: only uniqueness matters.
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

impl Pending {
    fn park(&self, device_key: u64, done: Completion) -> u64 {
        // Relaxed: only uniqueness matters; the table's mutex orders the rest.
        let ticket = self.next_ticket.fetch_add(1, Ordering::Relaxed);
        self.waiting
            .lock()
            .unwrap()
            .insert(ticket, (device_key, done));
        ticket
    }

    /// Removes and runs the completion of `ticket`, if it is still waiting.
    fn finish(&self, ticket: u64) {
        let entry = self.waiting.lock().unwrap().remove(&ticket);
        if let Some((_, done)) = entry {
            run(done);
        }
    }

    /// Removes and runs every completion of device `device_key`.
    fn finish_device(&self, device_key: u64) -> usize {
        let drained: Vec<Completion> = {
            let mut waiting = self.waiting.lock().unwrap();
            let tickets: Vec<u64> = waiting
                .iter()
                .filter(|(_, (key, _))| *key == device_key)
                .map(|(&t, _)| t)
                .collect();
            tickets
                .iter()
                .filter_map(|t| waiting.remove(t))
                .map(|(_, done)| done)
                .collect()
        };
        let count = drained.len();
        drained.into_iter().for_each(run);
        count
    }
}

/// Runs a completion outside every lock, keeping a panic from unwinding into the driver.
fn run(done: Completion) {
    if std::panic::catch_unwind(AssertUnwindSafe(done)).is_err() {
        log::error!("cuda: a launch completion panicked");
    }
}

/// The host function queued after each kernel; `data` is its ticket.
unsafe extern "C" fn kernel_completed(data: *mut c_void) {
    pending().finish(data as usize as u64);
}

/// One NVIDIA GPU.
pub struct CudaDevice {
    core: Arc<Core>,
    key: u64,
    name: String,
    compute_capability: (i32, i32),
    multiprocessors: u32,
    max_threads_per_multiprocessor: u32,
    stream: Stream,
    /// Keeps each kernel and its host function adjacent on the stream.
    launch_lock: Mutex<()>,
    allocator: Arc<CudaAllocator>,
}

impl std::fmt::Debug for CudaDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaDevice")
            .field("name", &self.name)
            .field("compute_capability", &self.compute_capability)
            .field("multiprocessors", &self.multiprocessors)
            .finish_non_exhaustive()
    }
}

impl CudaDevice {
    /// Opens device `ordinal`: reads its attributes, retains its primary context and creates
    /// its streams. Everything acquired is given back if a later step fails.
    pub(crate) fn open(driver: Arc<dyn DriverApi>, ordinal: i32) -> Result<CudaDevice> {
        let fail = |call, code| driver_error(&*driver, call, code);
        let device = driver
            .device_get(ordinal)
            .map_err(|c| fail("cuDeviceGet", c))?;
        let name = driver
            .device_name(device)
            .map_err(|c| fail("cuDeviceGetName", c))?;
        let attribute = |attribute| {
            driver
                .device_attribute(device, attribute)
                .map_err(|c| fail("cuDeviceGetAttribute", c))
        };
        let major = attribute(Attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
        let minor = attribute(Attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
        let sms = attribute(Attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
        let threads = attribute(Attribute::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR)?;
        let pools = attribute(Attribute::CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED)? != 0;

        let context = driver
            .primary_ctx_retain(device)
            .map_err(|c| fail("cuDevicePrimaryCtxRetain", c))?;
        let core = Arc::new(Core {
            driver: driver.clone(),
            device,
            context,
            released: AtomicBool::new(false),
            aborted: AtomicBool::new(false),
        });
        // From here on a failure releases what was acquired.
        let streams = (|| -> Result<(Stream, Option<Stream>)> {
            core.bind()?;
            let stream = driver
                .stream_create(STREAM_DEFAULT)
                .map_err(|c| fail("cuStreamCreate", c))?;
            if !pools {
                return Ok((stream, None));
            }
            match driver.stream_create(STREAM_NON_BLOCKING) {
                Ok(alloc_stream) => Ok((stream, Some(alloc_stream))),
                Err(code) => {
                    let _ = driver.stream_destroy(stream);
                    Err(fail("cuStreamCreate", code))
                }
            }
        })();
        let (stream, alloc_stream) = match streams {
            Ok(streams) => streams,
            Err(error) => {
                core.released.store(true, Ordering::Relaxed);
                let _ = driver.primary_ctx_release(device);
                return Err(error);
            }
        };
        Ok(CudaDevice {
            allocator: Arc::new(CudaAllocator::new(core.clone(), alloc_stream)),
            core,
            key: next_device_key(),
            name,
            compute_capability: (major, minor),
            multiprocessors: u32::try_from(sms).unwrap_or(0),
            max_threads_per_multiprocessor: u32::try_from(threads).unwrap_or(0),
            stream,
            launch_lock: Mutex::new(()),
        })
    }

    /// `(major, minor)`, e.g. `(9, 0)` for an H100/H200.
    pub fn compute_capability(&self) -> (i32, i32) {
        self.compute_capability
    }

    /// Streaming multiprocessors.
    pub fn multiprocessors(&self) -> u32 {
        self.multiprocessors
    }

    /// Sets the stack of each GPU thread of this device's context (`cuCtxSetLimit` with
    /// `CU_LIMIT_STACK_SIZE`). LLVM's loader sets [`LOADER_STACK_SIZE`] before it launches a
    /// libc program, whose printf needs more than the driver's default 1 KiB.
    pub fn set_stack_size(&self, bytes: usize) -> Result<()> {
        self.core.bind()?;
        self.core
            .driver()
            .ctx_set_stack_limit(bytes)
            .map_err(|code| self.core.fail("cuCtxSetLimit", code))
    }

    /// The device's MALLOC/FREE allocator, with its own type.
    pub fn cuda_allocator(&self) -> &Arc<CudaAllocator> {
        &self.allocator
    }

    /// A copy of `len` bytes between host and device memory by `copy` in the device's
    /// context (none for no bytes); `call` names the driver function in an error.
    fn copy(
        &self,
        len: usize,
        call: &'static str,
        copy: impl FnOnce(&dyn DriverApi) -> DriverResult<()>,
    ) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        self.core.bind()?;
        copy(self.core.driver()).map_err(|code| self.core.fail(call, code))
    }

    fn prepare_launch(
        &self,
        image: &CudaImage,
        kernel: &str,
        grid: Grid,
    ) -> Result<crate::loader::Function> {
        if grid.blocks.contains(&0) || grid.threads.contains(&0) {
            return Err(CudaError::InvalidArgument(format!(
                "an empty grid {grid:?}"
            )));
        }
        self.core.bind()?;
        image.function(kernel)
    }

    fn synchronize_impl(&self) -> Result<()> {
        self.core.bind()?;
        self.core
            .driver()
            .stream_synchronize(self.stream)
            .map_err(|code| {
                // A failed stream means a failed context: no kernel of it runs and no host function
                // of it will be called any more, so report the completions still waiting.
                let drained = pending().finish_device(self.key);
                if drained > 0 {
                    log::warn!("cuda: {drained} launches ended by a failed context");
                }
                self.core.fail("cuStreamSynchronize", code)
            })
    }

    /// Waits for the device's work, reports the completions still waiting, frees what kernels
    /// did not free, and releases the streams and the primary context. Idempotent.
    pub(crate) fn release(&self) -> Result<()> {
        if self.core.released.load(Ordering::Relaxed) {
            return Ok(());
        }
        // Relaxed: set before by this thread or one that handed the device over (deinit).
        let aborted = self.core.aborted.load(Ordering::Relaxed);
        let mut first_error = if aborted {
            None
        } else {
            self.synchronize_impl().err()
        };
        // After a successful synchronize every host function has run; after a failed one the
        // waiting completions were reported. Either way none is left; this is a safeguard.
        pending().finish_device(self.key);
        // After a reset the allocations and the stream are gone with the context: the driver's
        // complaints about freeing them again are expected, and not reported.
        let mut keep = |error: CudaError| {
            if aborted {
                log::debug!("cuda: after the reset: {error}");
            } else {
                first_error.get_or_insert(error);
            }
        };
        if let Err(error) = self.allocator.release() {
            keep(error);
        }
        let driver = self.core.driver();
        if self.core.bind().is_ok() {
            if let Err(code) = driver.stream_destroy(self.stream) {
                keep(self.core.fail("cuStreamDestroy_v2", code));
            }
        }
        // Relaxed: see `Core::bind`.
        self.core.released.store(true, Ordering::Relaxed);
        if let Err(code) = driver.primary_ctx_release(self.core.device) {
            first_error.get_or_insert(self.core.fail("cuDevicePrimaryCtxRelease_v2", code));
        }
        first_error.map_or(Ok(()), Err)
    }
}

impl Drop for CudaDevice {
    fn drop(&mut self) {
        if let Err(error) = self.release() {
            log::warn!("cuda: releasing {}: {error}", self.name);
        }
    }
}

impl Device for CudaDevice {
    type Image = CudaImage;

    fn name(&self) -> String {
        self.name.clone()
    }

    fn detail(&self) -> Option<String> {
        let (major, minor) = self.compute_capability();
        Some(format!("sm_{major}{minor}"))
    }

    fn lane_size(&self) -> u32 {
        LANE_SIZE
    }

    fn parallelism(&self) -> u32 {
        resident_warps(self.multiprocessors, self.max_threads_per_multiprocessor)
    }

    fn alloc_shared(&self, len: usize) -> Result<Box<dyn SharedRegion>, VendorError> {
        Ok(Box::new(PinnedRegion::new(&self.core, len)?))
    }

    fn allocator(&self) -> Arc<dyn DeviceAllocator> {
        self.allocator.clone()
    }

    fn load_image(&self, bytes: &[u8]) -> Result<CudaImage, VendorError> {
        Ok(CudaImage::load(&self.core, bytes)?)
    }

    fn find_symbol(&self, image: &CudaImage, name: &str) -> Option<Symbol> {
        image.global(name)
    }

    fn symbol_size_at(&self, image: &CudaImage, addr: u64) -> Option<usize> {
        image.size_at(addr)
    }

    fn copy_to_device(&self, dst: u64, bytes: &[u8]) -> Result<(), VendorError> {
        let copied = self.copy(bytes.len(), "cuMemcpyHtoD_v2", |driver| {
            // SAFETY: the glue copies only into symbols of loaded images and device
            // allocations; no Rust reference covers device memory. (A device address of a
            // mapped region aliases host memory, as a kernel's stores to it would.)
            unsafe { driver.memcpy_htod(dst, bytes) }
        });
        Ok(copied?)
    }

    fn copy_from_device(&self, src: u64, out: &mut [u8]) -> Result<(), VendorError> {
        let copied = self.copy(out.len(), "cuMemcpyDtoH_v2", |driver| {
            // SAFETY: `out` is borrowed mutably for the call; the driver rejects source ranges
            // that are not device-visible memory.
            unsafe { driver.memcpy_dtoh(out, src) }
        });
        Ok(copied?)
    }

    fn launch(
        &self,
        image: &CudaImage,
        kernel: &str,
        args: &[u8],
        grid: Grid,
        done: Completion,
    ) -> Result<(), VendorError> {
        let function = match self.prepare_launch(image, kernel, grid) {
            Ok(function) => function,
            Err(error) => {
                run(done);
                return Err(error.into());
            }
        };
        let driver = self.core.driver();
        let adjacent = self.launch_lock.lock().unwrap();
        // SAFETY: the caller of `launch` chose the kernel and packed its arguments; the glue
        // passes the block as the image's kernel expects it. What the kernel does with them is
        // the same trust a kernel launch always needs.
        if let Err(code) = unsafe { driver.launch_kernel(function, grid, self.stream, args) } {
            drop(adjacent);
            run(done);
            return Err(self.core.fail("cuLaunchKernel", code).into());
        }
        let ticket = pending().park(self.key, done);
        // SAFETY: `kernel_completed` only looks its ticket up in the process-wide table (a
        // missing ticket is ignored), so calling it once, from any thread, at any time is sound.
        let queued = unsafe {
            driver.launch_host_func(
                self.stream,
                kernel_completed,
                ticket as usize as *mut c_void,
            )
        };
        drop(adjacent);
        if let Err(code) = queued {
            // The kernel is queued but nobody will report its end: wait for it, then report.
            if let Err(sync) = driver.stream_synchronize(self.stream) {
                log::warn!("cuda: {}", self.core.fail("cuStreamSynchronize", sync));
            }
            pending().finish(ticket);
            return Err(self.core.fail("cuLaunchHostFunc", code).into());
        }
        Ok(())
    }

    fn synchronize(&self) -> Result<(), VendorError> {
        // Relaxed: see `release`.
        if self.core.aborted.load(Ordering::Relaxed) {
            return Err(CudaError::Aborted.into());
        }
        Ok(self.synchronize_impl()?)
    }

    /// Resets the primary context, which ends the kernels in flight, and reports their
    /// completions (failed).
    fn abort_launches(&self) {
        self.core.aborted.store(true, Ordering::Relaxed);
        if let Err(code) = self.core.driver().primary_ctx_reset(self.core.device) {
            log::error!(
                "cuda: {}",
                self.core.fail("cuDevicePrimaryCtxReset_v2", code)
            );
        }
        let ended = pending().finish_device(self.key);
        log::warn!("cuda: {}: {ended} launch(es) ended by the reset", self.name);
    }
}

//! GPU agents as [`Device`]s: discovery, memory, images, AQL launches and their completions.
//!
//! # Completions: one waiter thread per device
//! Every dispatch carries the barrier bit, so a device's queue runs kernels one after another
//! and their completion signals drop in submission order. The device's waiter thread takes the
//! oldest launch, blocks in `hsa_signal_wait_scacquire(signal < 1)` (an interrupt signal, so
//! the thread sleeps), then frees the kernarg block, destroys the signal and calls `done`
//! exactly once. It waits in slices of [`WAIT_SLICE`] so that a queue error (reported by the
//! runtime's queue callback: memory fault, illegal instruction) also completes the launches
//! still pending, marked failed, instead of leaving their `done` uncalled forever.
//!
//! Who touches what: `launch` (any thread) pushes onto `Tracker::state.pending` and counts
//! `in_flight` under the mutex; the waiter pops and decrements under the same mutex and
//! notifies the condvar `synchronize` sleeps on. The queue callback writes only `queue_error`.

use core::ffi::c_void;
use core::time::Duration;
use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

use rpc_core::plugin::{
    Completion, Device, DeviceAllocator, Grid, SharedRegion, Symbol, VendorError,
};
use rpc_core::protocol::Generation;
use std::sync::atomic::{AtomicU32, Ordering};

use crate::aql::{kernarg_bytes, kernarg_layout, KernelDispatchPacket, PACKET_SIZE};
use crate::doorbell::AmdGpuDoorbell;
use crate::error::{status_name, AmdGpuError};
use crate::image::AmdGpuImage;
use crate::loader::*;
use crate::memory::{pool_allocate, pool_free, AmdGpuAllocator, AmdGpuRegion};

/// How long the waiter blocks on a completion signal before re-checking for a queue error.
pub const WAIT_SLICE: Duration = Duration::from_millis(100);
/// The most packets a device's queue holds (capped by the agent's maximum).
pub const QUEUE_PACKETS: u32 = 4096;

/// The waves resident at once on a GPU with `compute_units` CUs of `waves_per_cu` waves (the
/// glue makes it the port count, within the generation's bounds: PROTOCOL section 1).
pub fn resident_waves(compute_units: u32, waves_per_cu: u32) -> u32 {
    compute_units.saturating_mul(waves_per_cu)
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The host side every GPU of the system shares: the CPU agent's fine-grained pool (mailboxes,
/// doorbells) and its kernarg pool.
#[derive(Clone, Copy, Debug)]
struct HostPools {
    fine: MemoryPool,
    kernarg: MemoryPool,
}

/// Global-segment pools of `agent` the runtime may allocate from, with their flags.
fn global_pools(hsa: &dyn HsaApi, agent: Agent) -> Result<Vec<(MemoryPool, u32)>, AmdGpuError> {
    let mut out = Vec::new();
    for pool in hsa.memory_pools(agent)? {
        let info = hsa.pool_info(pool)?;
        if info.segment == SEGMENT_GLOBAL && info.runtime_alloc_allowed {
            out.push((pool, info.global_flags));
        }
    }
    Ok(out)
}

fn find_pool(pools: &[(MemoryPool, u32)], flag: u32) -> Option<MemoryPool> {
    pools.iter().find(|(_, f)| f & flag != 0).map(|(p, _)| *p)
}

/// Finds every GPU agent of an initialised runtime and makes it a device.
pub(crate) fn discover(hsa: &Arc<dyn HsaApi>) -> Result<Vec<AmdGpuDevice>, AmdGpuError> {
    let mut cpus = Vec::new();
    let mut gpus = Vec::new();
    for agent in hsa.agents()? {
        match hsa.agent_u32(agent, AgentU32::Device)? {
            DEVICE_TYPE_CPU => cpus.push(agent),
            DEVICE_TYPE_GPU => gpus.push(agent),
            _ => {}
        }
    }
    if gpus.is_empty() {
        return Ok(Vec::new());
    }
    let mut host = None;
    for &cpu in &cpus {
        let pools = global_pools(&**hsa, cpu)?;
        if let (Some(fine), Some(kernarg)) = (
            find_pool(&pools, POOL_FLAG_FINE_GRAINED),
            find_pool(&pools, POOL_FLAG_KERNARG_INIT),
        ) {
            host = Some(HostPools { fine, kernarg });
            break;
        }
    }
    let host = host.ok_or(AmdGpuError::NoPool {
        agent: "CPU".into(),
        what: "fine-grained and kernarg",
    })?;
    gpus.into_iter()
        .map(|gpu| AmdGpuDevice::new(hsa.clone(), gpu, host))
        .collect()
}

/// A launch waiting for its completion signal.
struct Pending {
    signal: Signal,
    kernarg: *mut u8,
    done: Completion,
}

#[derive(Default)]
struct TrackerState {
    pending: VecDeque<Pending>,
    in_flight: usize,
    failure: Option<String>,
    stop: bool,
    /// Set by `abort_launches` (the queue was inactivated): the waiter stops waiting for the
    /// pending launches' signals and reports each as failed.
    aborted: bool,
}

/// What `launch`, the waiter and `synchronize` share (see the module docs).
struct Tracker {
    state: Mutex<TrackerState>,
    changed: Condvar,
    /// A status the queue callback reported (0 = none).
    queue_error: AtomicU32,
}

// SAFETY: `Pending::kernarg` is a pool allocation owned by the pending launch; it is moved,
// never shared, and freed by the one waiter that pops it.
unsafe impl Send for Tracker {}
// SAFETY: all fields are behind the mutex or atomic.
unsafe impl Sync for Tracker {}

unsafe extern "C" fn queue_error(status: Status, _queue: *mut Queue, data: *mut c_void) {
    // SAFETY: `data` is `Arc::as_ptr` of the device's tracker, which outlives the queue (the
    // queue is destroyed first in `Launcher::drop`).
    let tracker = unsafe { &*data.cast::<Tracker>() };
    // Relaxed: the waiter only needs to see it eventually (it polls every WAIT_SLICE).
    tracker.queue_error.store(status, Ordering::Relaxed);
    tracker.changed.notify_all();
}

/// The queue and waiter thread, created by the first launch.
struct Launcher {
    hsa: Arc<dyn HsaApi>,
    queue: *mut Queue,
    tracker: Arc<Tracker>,
    waiter: Option<JoinHandle<()>>,
}

impl Drop for Launcher {
    fn drop(&mut self) {
        lock(&self.tracker.state).stop = true;
        self.tracker.changed.notify_all();
        if let Some(waiter) = self.waiter.take() {
            let _ = waiter.join();
        }
        // SAFETY: created by `queue_create`, destroyed once; the waiter has retired every
        // launch, so nothing is executing from it.
        if let Err(e) = unsafe { self.hsa.queue_destroy(self.queue) } {
            log::warn!("amdgpu: {e}");
        }
    }
}

/// One GPU agent.
pub struct AmdGpuDevice {
    hsa: Arc<dyn HsaApi>,
    agent: Agent,
    name: String,
    lanes: u32,
    compute_units: u32,
    waves_per_cu: u32,
    queue_max: u32,
    host: HostPools,
    allocator: Arc<AmdGpuAllocator>,
    tracker: Arc<Tracker>,
    launcher: Mutex<Option<Launcher>>,
}

// SAFETY: handles are plain numbers usable from any thread; the queue pointer lives in the
// mutex-guarded launcher and the queue's indices are accessed through the runtime's atomics.
unsafe impl Send for AmdGpuDevice {}
// SAFETY: as above.
unsafe impl Sync for AmdGpuDevice {}

impl AmdGpuDevice {
    fn new(hsa: Arc<dyn HsaApi>, agent: Agent, host: HostPools) -> Result<Self, AmdGpuError> {
        let arch = hsa.agent_name(agent, AgentName::Name)?;
        let product = hsa
            .agent_name(agent, AgentName::ProductName)
            .unwrap_or_default();
        let name = if product.is_empty() {
            arch
        } else {
            format!("{product} ({arch})")
        };
        let pools = global_pools(&*hsa, agent)?;
        let coarse =
            find_pool(&pools, POOL_FLAG_COARSE_GRAINED).ok_or_else(|| AmdGpuError::NoPool {
                agent: name.clone(),
                what: "coarse-grained",
            })?;
        Ok(AmdGpuDevice {
            lanes: hsa.agent_u32(agent, AgentU32::WavefrontSize)?,
            compute_units: hsa.agent_u32(agent, AgentU32::ComputeUnitCount)?,
            waves_per_cu: hsa.agent_u32(agent, AgentU32::MaxWavesPerCu)?,
            queue_max: hsa.agent_u32(agent, AgentU32::QueueMaxSize)?,
            host,
            allocator: Arc::new(AmdGpuAllocator::new(hsa.clone(), coarse, vec![agent])),
            tracker: Arc::new(Tracker {
                state: Mutex::new(TrackerState::default()),
                changed: Condvar::new(),
                queue_error: AtomicU32::new(0),
            }),
            launcher: Mutex::new(None),
            name,
            hsa,
            agent,
        })
    }

    /// The HSA agent.
    pub fn agent(&self) -> Agent {
        self.agent
    }

    /// The MALLOC allocator, typed (the plugin frees forgotten blocks at deinit).
    pub fn amdgpu_allocator(&self) -> &Arc<AmdGpuAllocator> {
        &self.allocator
    }

    /// A doorbell for a mailbox of `generation`: `None` for v1 (no doorbell record) and where
    /// the runtime delivers no interrupts (the server polls; the record stays zero).
    pub fn doorbell(&self, generation: Generation) -> Result<Option<AmdGpuDoorbell>, AmdGpuError> {
        if generation == Generation::V1 {
            return Ok(None);
        }
        match AmdGpuDoorbell::new(self.hsa.clone()) {
            Ok(bell) => Ok(Some(bell)),
            Err(AmdGpuError::NoInterrupts) => Ok(None),
            Err(e) => Err(e),
        }
    }

    fn start_launcher(&self) -> Result<Launcher, AmdGpuError> {
        let hsa = self.hsa.clone();
        // Both are powers of two (hsa.h: QUEUE_MAX_SIZE is), so the smaller one is too.
        let size = self.queue_max.clamp(1, QUEUE_PACKETS);
        // SAFETY: `queue_error` casts `data` back to the tracker, which outlives the queue
        // (the launcher holds an `Arc` of it and destroys the queue first, in its drop).
        let queue = unsafe {
            hsa.queue_create(
                self.agent,
                size,
                queue_error,
                Arc::as_ptr(&self.tracker).cast_mut().cast(),
            )
        }?;
        let tracker = Arc::clone(&self.tracker);
        let device = self.name.clone();
        let waiter_hsa = hsa.clone();
        let waiter = std::thread::Builder::new()
            .name(format!("amdgpu-waiter {}", self.name))
            .spawn(move || wait_loop(&*waiter_hsa, &tracker, &device));
        let tracker = Arc::clone(&self.tracker);
        match waiter {
            Ok(waiter) => Ok(Launcher {
                hsa,
                queue,
                tracker,
                waiter: Some(waiter),
            }),
            Err(_) => {
                // Drop destroys the queue.
                drop(Launcher {
                    hsa,
                    queue,
                    tracker,
                    waiter: None,
                });
                Err(AmdGpuError::Invalid(
                    "cannot spawn the completion waiter thread",
                ))
            }
        }
    }
}

/// The waiter thread's body (see the module docs).
fn wait_loop(hsa: &dyn HsaApi, tracker: &Tracker, device: &str) {
    let ticks_per_second = hsa
        .timestamp_frequency()
        .map_or(1_000_000_000, |f| f.max(1));
    let slice = (WAIT_SLICE.as_nanos() * u128::from(ticks_per_second) / 1_000_000_000) as u64;
    loop {
        let next = {
            let mut state = lock(&tracker.state);
            loop {
                if let Some(p) = state.pending.pop_front() {
                    break p;
                }
                if state.stop {
                    return;
                }
                state = tracker
                    .changed
                    .wait(state)
                    .unwrap_or_else(|p| p.into_inner());
            }
        };
        let failure = loop {
            // SAFETY: the signal is live until this thread destroys it below.
            let value =
                unsafe { hsa.signal_wait_scacquire(next.signal, SIGNAL_CONDITION_LT, 1, slice) };
            if value < 1 {
                break None;
            }
            if lock(&tracker.state).aborted {
                break Some("aborted (the queue was inactivated)".into());
            }
            let status = tracker.queue_error.load(Ordering::Relaxed);
            if status != 0 {
                break Some(format!(
                    "queue error {} (0x{status:x})",
                    status_name(status)
                ));
            }
        };
        // SAFETY: the kernel completed (or the queue is dead and will not run it), so nothing
        // reads the kernarg block or signals the signal any more; each is released once.
        unsafe {
            if let Err(e) = pool_free(hsa, next.kernarg) {
                log::warn!("amdgpu: {e}");
            }
            if let Err(e) = hsa.signal_destroy(next.signal) {
                log::warn!("amdgpu: {e}");
            }
        }
        // A panicking completion must not end the waiter: the launches after it would never
        // complete.
        if std::panic::catch_unwind(std::panic::AssertUnwindSafe(next.done)).is_err() {
            log::error!("amdgpu: a launch completion on {device} panicked");
        }
        let mut state = lock(&tracker.state);
        state.in_flight -= 1;
        if let Some(reason) = failure {
            log::error!("amdgpu: kernel on {device} failed: {reason}");
            state.failure.get_or_insert(reason);
        }
        drop(state);
        tracker.changed.notify_all();
    }
}

impl Device for AmdGpuDevice {
    type Image = AmdGpuImage;

    fn name(&self) -> String {
        self.name.clone()
    }

    fn lane_size(&self) -> u32 {
        self.lanes
    }

    /// The image's own wavefront size (an RDNA agent runs wave32 and wave64 code alike).
    fn image_lane_size(&self, image: &AmdGpuImage) -> u32 {
        image.wavefront_size().unwrap_or(self.lanes)
    }

    fn parallelism(&self) -> u32 {
        resident_waves(self.compute_units, self.waves_per_cu)
    }

    fn alloc_shared(&self, len: usize) -> Result<Box<dyn SharedRegion>, VendorError> {
        Ok(Box::new(AmdGpuRegion::new(
            self.hsa.clone(),
            self.host.fine,
            self.agent,
            len,
        )?))
    }

    fn create_doorbell(
        &self,
        generation: Generation,
    ) -> Result<Option<Box<dyn rpc_core::plugin::Doorbell>>, VendorError> {
        let bell = AmdGpuDevice::doorbell(self, generation)?;
        Ok(bell.map(|b| Box::new(b) as Box<dyn rpc_core::plugin::Doorbell>))
    }

    fn allocator(&self) -> Arc<dyn DeviceAllocator> {
        self.allocator.clone()
    }

    fn load_image(&self, bytes: &[u8]) -> Result<AmdGpuImage, VendorError> {
        Ok(AmdGpuImage::load(self.hsa.clone(), self.agent, bytes)?)
    }

    fn find_symbol(&self, image: &AmdGpuImage, name: &str) -> Option<Symbol> {
        image.variable(name)
    }

    fn symbol_size_at(&self, image: &AmdGpuImage, addr: u64) -> Option<usize> {
        // Asked only of the address `__llvm_libc_rpc_client` holds: LLVM's client object.
        let _ = addr;
        image.libc_client_size()
    }

    fn copy_to_device(&self, dst: u64, bytes: &[u8]) -> Result<(), VendorError> {
        // SAFETY: `dst` is a device address the caller got from this device (a symbol or an
        // allocation) with room for `bytes.len()` bytes, which no Rust reference covers.
        Ok(unsafe { self.hsa.copy_to_device(dst, bytes) }?)
    }

    fn copy_from_device(&self, src: u64, out: &mut [u8]) -> Result<(), VendorError> {
        // SAFETY: `src` is a device address the caller got from this device (a symbol or an
        // allocation) with `out.len()` bytes.
        Ok(unsafe { self.hsa.copy_from_device(out, src) }?)
    }

    fn launch(
        &self,
        image: &AmdGpuImage,
        kernel: &str,
        args: &[u8],
        grid: Grid,
        done: Completion,
    ) -> Result<(), VendorError> {
        let hsa = &*self.hsa;
        let info = image.kernel(kernel)?;
        if args.len() > info.kernarg_segment_size as usize {
            return Err(AmdGpuError::BadArguments {
                kernel: kernel.to_owned(),
                expected: info.kernarg_segment_size,
                given: args.len(),
            }
            .into());
        }
        let layout = kernarg_layout(
            args.len(),
            info.kernarg_segment_size,
            info.kernarg_segment_align,
        );
        let block = kernarg_bytes(args, &grid, &layout);
        // Kernarg pool blocks are page aligned, which covers `layout.align` (at most a page).
        let kernarg = pool_allocate(hsa, self.host.kernarg, layout.size, &[self.agent])?;
        // SAFETY: `kernarg` is fresh host-accessible memory of `layout.size` bytes.
        unsafe { core::ptr::copy_nonoverlapping(block.as_ptr(), kernarg, block.len()) };
        let release = |signal: Option<Signal>| {
            // SAFETY: `kernarg` (and `signal`) were created above and never handed to the GPU.
            unsafe {
                let _ = pool_free(hsa, kernarg);
                if let Some(s) = signal {
                    let _ = hsa.signal_destroy(s);
                }
            }
        };
        let signal = match hsa.signal_create(1) {
            Ok(signal) => signal,
            Err(e) => {
                release(None);
                return Err(e.into());
            }
        };
        let packet = match KernelDispatchPacket::new(&info, &grid, kernarg as u64, signal.handle) {
            Ok(p) => p,
            Err(e) => {
                release(Some(signal));
                return Err(e.into());
            }
        };
        let mut launcher = lock(&self.launcher);
        if launcher.is_none() {
            match self.start_launcher() {
                Ok(l) => *launcher = Some(l),
                Err(e) => {
                    release(Some(signal));
                    return Err(e.into());
                }
            }
        }
        let queue = launcher
            .as_ref()
            .map(|l| l.queue)
            .unwrap_or(core::ptr::null_mut());
        {
            let mut state = lock(&self.tracker.state);
            state.in_flight += 1;
            state.pending.push_back(Pending {
                signal,
                kernarg,
                done,
            });
        }
        self.tracker.changed.notify_all();
        // SAFETY: `queue` is live while the launcher (held locked) exists. The queue fields
        // read are immutable after creation.
        unsafe {
            let q = &*queue;
            let index = hsa.queue_add_write_index(queue, 1);
            // Wait for the slot: the packet processor must have consumed the packet `size`
            // places back (the read index passes it). Backs off to the scheduler: a full ring
            // empties at kernel speed.
            while index - hsa.queue_load_read_index(queue) >= u64::from(q.size) {
                std::thread::yield_now();
            }
            let slot = q
                .base_address
                .cast::<u8>()
                .add((index % u64::from(q.size)) as usize * PACKET_SIZE);
            // SAFETY (publish): the slot is this thread's (index from the write index, consumed
            // by the packet processor per the loop above), 64-byte aligned in the ring.
            packet.publish(slot);
            // Ring: a release store of the index, after the header's release store.
            hsa.signal_store_screlease(q.doorbell_signal, index as i64);
        }
        Ok(())
    }

    fn synchronize(&self) -> Result<(), VendorError> {
        let mut state = lock(&self.tracker.state);
        while state.in_flight > 0 {
            state = self
                .tracker
                .changed
                .wait(state)
                .unwrap_or_else(|p| p.into_inner());
        }
        match state.failure.take() {
            Some(reason) => Err(AmdGpuError::KernelFailed {
                device: self.name.clone(),
                reason,
            }
            .into()),
            None => Ok(()),
        }
    }

    fn abort_launches(&self) {
        let launcher = lock(&self.launcher);
        let Some(launcher) = launcher.as_ref() else {
            return; // Nothing was ever launched.
        };
        // SAFETY: the queue is live while the launcher (held locked) exists. Inactivating it
        // aborts the dispatches in flight and makes the packet processor ignore the rest.
        if let Err(e) = unsafe { self.hsa.queue_inactivate(launcher.queue) } {
            log::error!("amdgpu: {e}");
        }
        lock(&launcher.tracker.state).aborted = true;
        launcher.tracker.changed.notify_all();
    }
}

impl Drop for AmdGpuDevice {
    fn drop(&mut self) {
        if let Err(e) = self.synchronize() {
            log::warn!("amdgpu: {e}");
        }
        // Stops the waiter and destroys the queue.
        lock(&self.launcher).take();
        self.allocator.release();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The plugin's figure (the glue caps it: `Generation::ports_for`).
    #[test]
    fn resident_waves_are_cus_times_waves_per_cu_and_never_overflow() {
        // MI300X: 304 CUs x 32 waves; an MI250X GCD: 110 x 32.
        assert_eq!(resident_waves(304, 32), 9728);
        assert_eq!(resident_waves(110, 32), 3520);
        // Nonsense from a driver.
        assert_eq!(resident_waves(0, 0), 0);
        assert_eq!(resident_waves(u32::MAX, u32::MAX), u32::MAX);
    }
}

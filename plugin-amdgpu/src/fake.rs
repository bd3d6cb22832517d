//! A fake HSA runtime for the tests, in host memory: a CPU agent and GPU agents with chosen
//! attributes, their memory pools, code objects in a tiny text format, signals that are real
//! `amd_signal_t` records, and queues whose AQL dispatch packets a packet-processor thread per
//! queue "executes" by running a Rust closure registered for the kernel's name once per wave.
//! A closure speaks the RPC protocol over the image's mailbox as a wave would (a plugin-host
//! [`Warp`] over the client object the runtime wrote into `__llvm_rpc_client`); its packet's
//! completion signal then drops, or, if it returns an HSA status, the queue faults: the queue's
//! error callback gets the status and the queue runs nothing more, as with a memory fault.
//!
//! Code object format: text lines `.kernel NAME ARGS` (a kernel with `ARGS` bytes of explicit
//! arguments and the 256-byte v5 implicit block after them; its symbol is `NAME.kd`) and
//! `.global NAME SIZE` (a zeroed variable).
//!
//! Handles are what ROCr makes them where the plugin relies on it: a signal handle is the
//! address of its `amd_signal_t`, a queue is a `hsa_queue_t` whose ring and doorbell signal are
//! real memory; every pool allocation is host memory whose address is also its device address.
//!
//! # Waiting
//! Signal values, queue indices and the queue states change under the one state mutex and
//! every change notifies the one condvar, so a waiter that checks its condition under the mutex
//! and then waits on the condvar cannot miss a change.

use std::alloc::Layout as AllocLayout;
use std::collections::{HashMap, HashSet};
use std::ffi::{c_void, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use plugin_host::Warp;
use rpc_core::plugin::Grid;
use rpc_core::protocol::{Client, Generation, Layout, Mailbox};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use crate::aql::{PACKET_SIZE, PACKET_TYPE_INVALID, PACKET_TYPE_KERNEL_DISPATCH};
use crate::error::AmdGpuError;
use crate::loader::*;

/// `HSA_STATUS_ERROR_INVALID_ARGUMENT`.
pub const INVALID_ARGUMENT: Status = 0x1001;
/// `HSA_STATUS_ERROR_INVALID_AGENT`.
const INVALID_AGENT: Status = 0x1004;
/// `HSA_STATUS_ERROR_INVALID_QUEUE`.
const INVALID_QUEUE: Status = 0x1007;
/// `HSA_STATUS_ERROR_OUT_OF_RESOURCES`.
pub const OUT_OF_RESOURCES: Status = 0x1008;
/// `HSA_STATUS_ERROR_EXCEPTION`: what a panicking kernel body faults its queue with.
pub const EXCEPTION: Status = 0x1016;
/// `HSA_STATUS_ERROR_MEMORY_FAULT`.
pub const MEMORY_FAULT: Status = 43;

/// The text the fake gives for [`OUT_OF_RESOURCES`], in ROCr's "NAME: text" form.
pub const OUT_OF_RESOURCES_TEXT: &str =
    "HSA_STATUS_ERROR_OUT_OF_RESOURCES: The runtime failed to allocate the necessary resources.";

/// A GPU agent the fake reports.
#[derive(Clone, Debug)]
pub struct FakeAgent {
    pub isa: &'static str,
    pub product: &'static str,
    pub wavefront: u32,
    pub compute_units: u32,
    pub waves_per_cu: u32,
    pub queue_max: u32,
}

impl FakeAgent {
    /// Shaped like an MI300X: 304 CUs of 32 wave64 waves, gfx942.
    pub fn mi300x() -> Self {
        FakeAgent {
            isa: "gfx942",
            product: "Fake MI300X",
            wavefront: 64,
            compute_units: 304,
            waves_per_cu: 32,
            queue_max: 4096,
        }
    }
    /// Shaped like a W7900: 48 CUs of 16 wave32 waves, gfx1100; a small queue.
    pub fn w7900() -> Self {
        FakeAgent {
            isa: "gfx1100",
            product: "Fake W7900",
            wavefront: 32,
            compute_units: 48,
            waves_per_cu: 16,
            queue_max: 64,
        }
    }
}

/// A kernel's body, run once per wave of the grid; `Err(status)` faults the queue.
pub type KernelBody = Arc<dyn Fn(&Warp<'_>) -> Result<(), Status> + Send + Sync>;

#[derive(Clone)]
enum Behaviour {
    Run(KernelBody),
    /// Never completes; ends when the queue is inactivated or destroyed.
    Hang,
}

/// A dispatch packet the fake's packet processor consumed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Dispatch {
    pub kernel: String,
    pub grid: Grid,
    /// The whole kernarg segment (explicit arguments, then the implicit block).
    pub kernarg: Vec<u8>,
    pub header: u16,
}

const CPU: Agent = Agent { handle: 0x10 };
const HOST_POOL: MemoryPool = MemoryPool { handle: 0x100 };
/// A pool of the CPU agent the runtime may not allocate from: the plugin must skip it.
const LOCKED_POOL: MemoryPool = MemoryPool { handle: 0x180 };
const FIRST_GPU: u64 = 0x20;
const FIRST_DEVICE_POOL: u64 = 0x200;
/// Bytes of the v5 implicit argument block the fake's kernels declare.
const IMPLICIT: u32 = 256;

struct Block {
    layout: AllocLayout,
    /// `None`: a variable of a loaded executable.
    pool: Option<MemoryPool>,
}

#[derive(Clone, Copy)]
enum SymbolKind {
    Variable { addr: u64, size: usize },
    Kernel { object: u64, kernarg_size: u32 },
}

#[derive(Default)]
struct FakeExecutable {
    frozen: bool,
    variables: HashMap<String, (u64, usize)>,
    /// Descriptor name (`NAME.kd`) -> kernel object.
    kernels: HashMap<String, u64>,
}

struct KernelObject {
    executable: u64,
    name: String,
    kernarg_size: u32,
}

struct FakeQueue {
    agent: Agent,
    ring: AllocLayout,
    read_index: u64,
    write_index: u64,
    callback: QueueCallback,
    data: usize,
    inactive: bool,
    faulted: bool,
    stop: bool,
    processor: Option<JoinHandle<()>>,
}

#[derive(Default)]
struct State {
    gpus: Vec<FakeAgent>,
    failures: HashMap<&'static str, Status>,
    inits: i32,
    blocks: HashMap<u64, Block>,
    readers: HashMap<u64, Vec<u8>>,
    executables: HashMap<u64, FakeExecutable>,
    symbols: HashMap<u64, SymbolKind>,
    kernel_objects: HashMap<u64, KernelObject>,
    signals: HashSet<u64>,
    /// Queue address -> its state.
    queues: HashMap<usize, FakeQueue>,
    kernels: HashMap<String, Behaviour>,
    dispatches: Vec<Dispatch>,
    completed: usize,
    /// Bumped by a queue fault or inactivation: signal waits return (spuriously, as HSA
    /// allows) so the plugin's waiter looks at the queue's state at once.
    epoch: u64,
    next_handle: u64,
}

struct Inner {
    state: Mutex<State>,
    changed: Condvar,
}

/// The fake runtime.
pub struct FakeHsa {
    inner: Arc<Inner>,
}

fn lock(inner: &Inner) -> MutexGuard<'_, State> {
    inner.state.lock().unwrap_or_else(|p| p.into_inner())
}

/// The `value` word of the `amd_signal_t` at `signal`, as the bits of an `i64`.
///
/// # Safety
/// `signal` is a live signal of the fake (a leaked, 64-byte-aligned `AmdSignal`).
unsafe fn value_of<'a>(signal: Signal) -> &'a AtomicU64 {
    let at = signal.handle as usize + core::mem::offset_of!(AmdSignal, value);
    // SAFETY: the caller's contract: the record is live and 8-byte aligned, and every access
    // to its `value` (the plugin's doorbell counter too) is atomic.
    unsafe { AtomicU64::from_ptr(at as *mut u64) }
}

impl State {
    fn handle(&mut self) -> u64 {
        self.next_handle += 0x10;
        self.next_handle
    }

    fn gpu(&self, agent: Agent) -> Option<&FakeAgent> {
        let index = agent.handle.checked_sub(FIRST_GPU)?;
        self.gpus.get(usize::try_from(index).ok()?)
    }

    fn pool_owner(&self, pool: MemoryPool) -> Option<Agent> {
        if pool == HOST_POOL || pool == LOCKED_POOL {
            return Some(CPU);
        }
        let index = pool.handle.checked_sub(FIRST_DEVICE_POOL)?;
        (index < self.gpus.len() as u64).then_some(Agent {
            handle: FIRST_GPU + index,
        })
    }

    /// Whether `addr..addr + len` lies inside one live block.
    fn covers(&self, addr: u64, len: usize) -> bool {
        self.blocks.iter().any(|(&base, block)| {
            addr >= base && addr + len as u64 <= base + block.layout.size() as u64
        })
    }

    fn new_block(&mut self, len: usize, pool: Option<MemoryPool>) -> Option<u64> {
        let layout = AllocLayout::from_size_align(len.max(1), 4096).ok()?;
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc(layout) };
        if ptr.is_null() {
            return None;
        }
        // Pool memory is garbage, so the plugin's zeroing shows; variables start zeroed.
        let fill = if pool.is_some() { 0xA5 } else { 0 };
        // SAFETY: `ptr` is valid for `layout.size()` bytes.
        unsafe { std::ptr::write_bytes(ptr, fill, layout.size()) };
        self.blocks.insert(ptr as u64, Block { layout, pool });
        Some(ptr as u64)
    }

    fn free_block(&mut self, addr: u64) -> bool {
        let Some(block) = self.blocks.remove(&addr) else {
            return false;
        };
        // SAFETY: allocated in `new_block` with this layout, removed from `blocks` just now,
        // so freed once.
        unsafe { std::alloc::dealloc(addr as *mut u8, block.layout) };
        true
    }

    fn new_signal(&mut self, initial: i64) -> Signal {
        let record = Box::new(AmdSignal {
            kind: AMD_SIGNAL_KIND_USER,
            value: initial,
            // No event mailbox: the runtime delivers no interrupts, so the plugin polls.
            event_mailbox_ptr: 0,
            event_id: 0,
            reserved1: 0,
            start_ts: 0,
            end_ts: 0,
            queue_ptr: 0,
            reserved3: [0; 2],
        });
        let handle = Box::into_raw(record) as u64;
        self.signals.insert(handle);
        Signal { handle }
    }

    fn free_signal(&mut self, signal: Signal) -> bool {
        if !self.signals.remove(&signal.handle) {
            return false;
        }
        // SAFETY: made by `Box::into_raw` in `new_signal`, removed from `signals` just now.
        drop(unsafe { Box::from_raw(signal.handle as *mut AmdSignal) });
        true
    }
}

impl FakeHsa {
    pub fn new(gpus: Vec<FakeAgent>) -> Self {
        FakeHsa {
            inner: Arc::new(Inner {
                state: Mutex::new(State {
                    gpus,
                    next_handle: 0x1_0000,
                    ..State::default()
                }),
                changed: Condvar::new(),
            }),
        }
    }

    /// `call` (an HSA function name) fails with `status` from now on.
    pub fn fail(&self, call: &'static str, status: Status) {
        lock(&self.inner).failures.insert(call, status);
    }
    /// Registers the body of kernel `name` (unregistered kernels complete at once).
    pub fn kernel(
        &self,
        name: &str,
        body: impl Fn(&Warp<'_>) -> Result<(), Status> + Send + Sync + 'static,
    ) {
        lock(&self.inner)
            .kernels
            .insert(name.to_owned(), Behaviour::Run(Arc::new(body)));
    }
    /// Kernel `name` never completes by itself.
    pub fn hang(&self, name: &str) {
        lock(&self.inner)
            .kernels
            .insert(name.to_owned(), Behaviour::Hang);
    }

    /// Successful `hsa_init`s not yet shut down.
    pub fn inits(&self) -> i32 {
        lock(&self.inner).inits
    }
    /// The dispatch packets consumed so far.
    pub fn dispatches(&self) -> Vec<Dispatch> {
        lock(&self.inner).dispatches.clone()
    }
    /// Dispatches whose completion signal was decremented.
    pub fn completed(&self) -> usize {
        lock(&self.inner).completed
    }
    /// Live blocks of the GPUs' coarse-grained pools (MALLOC).
    pub fn live_device_allocations(&self) -> usize {
        let state = lock(&self.inner);
        state
            .blocks
            .values()
            .filter(|b| b.pool.is_some_and(|p| p != HOST_POOL))
            .count()
    }
    /// Live blocks of the host pool (mailboxes, kernel arguments).
    pub fn live_host_allocations(&self) -> usize {
        let state = lock(&self.inner);
        state
            .blocks
            .values()
            .filter(|b| b.pool == Some(HOST_POOL))
            .count()
    }
    pub fn live_signals(&self) -> usize {
        lock(&self.inner).signals.len()
    }
    pub fn live_queues(&self) -> usize {
        lock(&self.inner).queues.len()
    }
    pub fn live_executables(&self) -> usize {
        lock(&self.inner).executables.len()
    }

    fn check(&self, call: &'static str) -> HsaResult<()> {
        let failure = lock(&self.inner).failures.get(call).copied();
        match failure {
            Some(status) => HsaApi::check(self, call, status),
            None => Ok(()),
        }
    }

    fn status(&self, call: &'static str, status: Status) -> AmdGpuError {
        HsaApi::check(self, call, status).expect_err("an error status")
    }

    /// The fake GPU `agent` names, or `call`'s `HSA_STATUS_ERROR_INVALID_AGENT`.
    fn gpu<'s>(
        &self,
        state: &'s State,
        agent: Agent,
        call: &'static str,
    ) -> HsaResult<&'s FakeAgent> {
        state
            .gpu(agent)
            .ok_or_else(|| self.status(call, INVALID_AGENT))
    }

    /// The live queue `queue`, or `call`'s `HSA_STATUS_ERROR_INVALID_QUEUE`.
    fn queue<'s>(
        &self,
        state: &'s mut State,
        queue: *mut Queue,
        call: &'static str,
    ) -> HsaResult<&'s mut FakeQueue> {
        state
            .queues
            .get_mut(&(queue as usize))
            .ok_or_else(|| self.status(call, INVALID_QUEUE))
    }
}

impl Drop for FakeHsa {
    fn drop(&mut self) {
        // Queues the test left (a failed test) stop their processors.
        let queues: Vec<usize> = lock(&self.inner).queues.keys().copied().collect();
        for queue in queues {
            // SAFETY: a live queue of this fake; the plugin is gone with the test.
            let _ = unsafe { self.queue_destroy(queue as *mut Queue) };
        }
    }
}

/// One queue's packet processor: takes the packets in order as the doorbell announces them and
/// runs each (see the module docs).
fn process(inner: Arc<Inner>, queue: usize) {
    loop {
        // Wait for the packet at the read index to be announced and published.
        let (slot, index) = {
            let mut state = lock(&inner);
            loop {
                let Some(q) = state.queues.get(&queue) else {
                    return;
                };
                if q.stop {
                    return;
                }
                if !q.inactive && !q.faulted {
                    // SAFETY: the queue is live (in `queues`), so its `Queue` record is.
                    let record = unsafe { &*(queue as *const Queue) };
                    // SAFETY: the doorbell signal lives as long as the queue.
                    let rung =
                        unsafe { value_of(record.doorbell_signal) }.load(Ordering::Acquire) as i64;
                    if rung >= q.read_index as i64 {
                        let offset = (q.read_index % u64::from(record.size)) as usize * PACKET_SIZE;
                        let slot = record.base_address as usize + offset;
                        // SAFETY: the slot is in the live ring, 64-byte aligned; the plugin
                        // writes its header word only atomically.
                        let header = unsafe { AtomicU32::from_ptr(slot as *mut u32) };
                        // Acquire: pairs with `publish`'s release store of the header, so the
                        // packet's other 60 bytes are visible below.
                        if header.load(Ordering::Acquire) & 0xFF
                            == u32::from(PACKET_TYPE_KERNEL_DISPATCH)
                        {
                            break (slot, q.read_index);
                        }
                    }
                }
                state = inner.changed.wait(state).unwrap_or_else(|p| p.into_inner());
            }
        };
        let mut packet = [0u8; PACKET_SIZE];
        // SAFETY: the slot is this processor's until it advances the read index: the plugin
        // writes it again only after that (it waits on the read index).
        unsafe {
            std::ptr::copy_nonoverlapping(slot as *const u8, packet.as_mut_ptr(), PACKET_SIZE)
        };
        let word = |at: usize| u64::from_le_bytes(packet[at..at + 8].try_into().expect("8"));
        let half = |at: usize| u16::from_le_bytes(packet[at..at + 2].try_into().expect("2"));
        let quad = |at: usize| u32::from_le_bytes(packet[at..at + 4].try_into().expect("4"));
        let threads = [half(4), half(6), half(8)].map(u32::from);
        let sizes = [quad(12), quad(16), quad(20)];
        let grid = Grid {
            blocks: [0, 1, 2].map(|d| sizes[d] / threads[d].max(1)),
            threads,
        };
        let (kernel_object, kernarg, completion) = (word(32), word(40), word(56));

        let (behaviour, client, lanes, dispatch) = {
            let mut state = lock(&inner);
            let lanes = state
                .queues
                .get(&queue)
                .and_then(|q| state.gpu(q.agent))
                .map_or(64, |gpu| gpu.wavefront);
            let object = state.kernel_objects.get(&kernel_object);
            let name = object.map_or_else(|| "?".to_owned(), |o| o.name.clone());
            let kernarg_size = object.map_or(0, |o| o.kernarg_size) as usize;
            let client = object.and_then(|o| {
                let executable = state.executables.get(&o.executable)?;
                let &(addr, size) = executable.variables.get(rpc_core::plugin::CLIENT_SYMBOL)?;
                Some((addr, Generation::from_client_object_size(size).ok()?))
            });
            let mut bytes = vec![0u8; kernarg_size];
            if state.covers(kernarg, kernarg_size) {
                // SAFETY: a live block of the fake holds the range; the plugin wrote the block
                // before the packet and frees it only after the completion.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        kernarg as *const u8,
                        bytes.as_mut_ptr(),
                        kernarg_size,
                    )
                };
            }
            let dispatch = Dispatch {
                kernel: name.trim_end_matches(".kd").to_owned(),
                grid,
                kernarg: bytes,
                header: half(0),
            };
            state.dispatches.push(dispatch.clone());
            let behaviour = state.kernels.get(&dispatch.kernel).cloned();
            (behaviour, client, lanes, dispatch)
        };

        let result = match behaviour {
            None => Ok(()),
            Some(Behaviour::Run(body)) => run_waves(&inner, &body, client, lanes, &dispatch),
            Some(Behaviour::Hang) => {
                let mut state = lock(&inner);
                while state
                    .queues
                    .get(&queue)
                    .is_some_and(|q| !q.inactive && !q.stop)
                {
                    state = inner.changed.wait(state).unwrap_or_else(|p| p.into_inner());
                }
                continue;
            }
        };

        let mut state = lock(&inner);
        let Some(q) = state.queues.get_mut(&queue) else {
            return;
        };
        match result {
            Ok(()) => {
                // SAFETY: as above; the slot goes back to the plugin with the read index below.
                let header = unsafe { AtomicU32::from_ptr(slot as *mut u32) };
                // Relaxed: the state mutex, held here and by `queue_load_read_index`, orders
                // this store and the index before the plugin writes the slot again.
                header.store(u32::from(PACKET_TYPE_INVALID), Ordering::Relaxed);
                q.read_index = index + 1;
                let signal = Signal { handle: completion };
                if state.signals.contains(&completion) {
                    // Release: the kernel's effects before the signal, as the packet's
                    // system-scope release fence promises; the plugin's wait acquires.
                    // SAFETY: a live signal of this fake (checked just now).
                    unsafe { value_of(signal) }.fetch_sub(1, Ordering::Release);
                }
                state.completed += 1;
                drop(state);
                inner.changed.notify_all();
            }
            Err(status) => {
                q.faulted = true;
                let (callback, data) = (q.callback, q.data);
                state.epoch += 1;
                drop(state);
                inner.changed.notify_all();
                // SAFETY: `queue_create`'s caller made calling `callback(data)` sound until
                // the queue is destroyed, which waits for this thread.
                unsafe { callback(status, queue as *mut Queue, data as *mut c_void) };
                inner.changed.notify_all();
            }
        }
    }
}

/// Runs `body` once per wave of the dispatch, each wave a [`Warp`] over the image's mailbox.
fn run_waves(
    inner: &Inner,
    body: &KernelBody,
    client: Option<(u64, Generation)>,
    lanes: u32,
    dispatch: &Dispatch,
) -> Result<(), Status> {
    let view = match client {
        Some((addr, generation)) => mailbox_of(inner, addr, generation, lanes)?,
        None => None,
    };
    let grid = dispatch.grid;
    let threads = grid.threads_per_block();
    let waves_per_block = threads.div_ceil(u64::from(lanes)) as u32;
    // The explicit arguments: everything before the implicit block.
    let explicit = dispatch.kernarg.len().saturating_sub(IMPLICIT as usize);
    let args = &dispatch.kernarg[..explicit];
    for block in 0..grid.total_blocks() as u32 {
        for wave in 0..waves_per_block {
            let active = (threads - u64::from(wave) * u64::from(lanes)).min(u64::from(lanes));
            let mask = if active == 64 {
                u64::MAX
            } else {
                (1u64 << active) - 1
            };
            let client = match &view {
                Some((mailbox, locks)) => {
                    Some(Client::new(*mailbox, locks).map_err(|_| INVALID_ARGUMENT)?)
                }
                None => None,
            };
            let warp = Warp::new(client, mask, lanes, (block, wave, waves_per_block), args);
            match catch_unwind(AssertUnwindSafe(|| body(&warp))) {
                Ok(Ok(())) => {}
                Ok(Err(status)) => return Err(status),
                Err(payload) => {
                    // `exit` and `abort` end a wave by unwinding with a private marker; a
                    // panic with a message is a broken kernel.
                    if payload.is::<&str>() || payload.is::<String>() {
                        let text = rpc_core::plugin::panic_message(payload.as_ref());
                        log::error!("fake hsa: {} panicked: {text}", dispatch.kernel);
                        return Err(EXCEPTION);
                    }
                }
            }
        }
    }
    Ok(())
}

type MailboxView = (Mailbox<'static>, &'static [AtomicU32]);

/// The mailbox and lock words the client object at `addr` names, checked against the fake's
/// memory; `None` while the object is unwritten (no port count: no runtime attached a
/// mailbox, so the waves' RPC calls fail). The views are `'static` because the blocks outlive every dispatch that uses them:
/// the runtime detaches a mailbox and drops an image only after their kernels completed.
fn mailbox_of(
    inner: &Inner,
    addr: u64,
    generation: Generation,
    lanes: u32,
) -> Result<Option<MailboxView>, Status> {
    let state = lock(inner);
    if !state.covers(addr, generation.client_object_size()) {
        return Err(MEMORY_FAULT);
    }
    let mut object = vec![0u8; generation.client_object_locks()];
    // SAFETY: the range is in a live block (checked above); nothing writes the port count and
    // pointers while kernels run.
    unsafe { std::ptr::copy_nonoverlapping(addr as *const u8, object.as_mut_ptr(), object.len()) };
    let ports = u32::from_le_bytes(object[..4].try_into().expect("4 bytes"));
    if ports == 0 {
        return Ok(None);
    }
    let primary_at = if generation == Generation::V2 { 16 } else { 8 };
    let primary = u64::from_le_bytes(object[primary_at..primary_at + 8].try_into().expect("8"));
    let layout = Layout::new(generation, ports, lanes).map_err(|_| INVALID_ARGUMENT)?;
    let base = primary.wrapping_sub(layout.primary() as u64);
    if !state.covers(base, layout.total_size()) {
        return Err(MEMORY_FAULT);
    }
    // SAFETY: a live block of the fake holds the region (checked above) and stays allocated
    // while this dispatch runs (see above); in this process the server and these waves touch
    // it only through atomics of the sizes the view uses.
    let mailbox = unsafe { Mailbox::from_raw(base as *mut u8, layout.total_size(), layout) }
        .map_err(|_| INVALID_ARGUMENT)?;
    let words = generation.max_port_count() as usize / 32;
    let locks_at = addr as usize + generation.client_object_locks();
    // SAFETY: the lock words are the tail of the client object, inside the checked block,
    // 4-byte aligned (the block is page aligned, the offset a multiple of 8), and only the
    // waves touch them while kernels run, atomically.
    let locks = unsafe { std::slice::from_raw_parts(locks_at as *const AtomicU32, words) };
    Ok(Some((mailbox, locks)))
}

impl HsaApi for FakeHsa {
    fn init(&self) -> HsaResult<()> {
        self.check("hsa_init")?;
        lock(&self.inner).inits += 1;
        Ok(())
    }
    unsafe fn shut_down(&self) -> HsaResult<()> {
        let mut state = lock(&self.inner);
        if state.inits == 0 {
            drop(state);
            return Err(self.status("hsa_shut_down", 0x100B));
        }
        state.inits -= 1;
        Ok(())
    }
    fn status_string(&self, status: Status) -> Option<String> {
        (status == OUT_OF_RESOURCES).then(|| OUT_OF_RESOURCES_TEXT.to_owned())
    }
    fn timestamp_frequency(&self) -> HsaResult<u64> {
        Ok(1_000_000_000)
    }

    fn agents(&self) -> HsaResult<Vec<Agent>> {
        self.check("hsa_iterate_agents")?;
        let gpus = lock(&self.inner).gpus.len() as u64;
        Ok(std::iter::once(CPU)
            .chain((0..gpus).map(|i| Agent {
                handle: FIRST_GPU + i,
            }))
            .collect())
    }
    fn agent_u32(&self, agent: Agent, attribute: AgentU32) -> HsaResult<u32> {
        let state = lock(&self.inner);
        if agent == CPU {
            return match attribute {
                AgentU32::Device => Ok(DEVICE_TYPE_CPU),
                _ => Err(self.status("hsa_agent_get_info", INVALID_ARGUMENT)),
            };
        }
        let gpu = self.gpu(&state, agent, "hsa_agent_get_info")?;
        Ok(match attribute {
            AgentU32::WavefrontSize => gpu.wavefront,
            AgentU32::QueueMaxSize => gpu.queue_max,
            AgentU32::Device => DEVICE_TYPE_GPU,
            AgentU32::ComputeUnitCount => gpu.compute_units,
            AgentU32::MaxWavesPerCu => gpu.waves_per_cu,
        })
    }
    fn agent_name(&self, agent: Agent, attribute: AgentName) -> HsaResult<String> {
        let state = lock(&self.inner);
        if agent == CPU {
            return Ok("Fake CPU".to_owned());
        }
        let gpu = self.gpu(&state, agent, "hsa_agent_get_info")?;
        Ok(match attribute {
            AgentName::Name => gpu.isa,
            AgentName::ProductName => gpu.product,
        }
        .to_owned())
    }
    fn memory_pools(&self, agent: Agent) -> HsaResult<Vec<MemoryPool>> {
        let state = lock(&self.inner);
        if agent == CPU {
            return Ok(vec![LOCKED_POOL, HOST_POOL]);
        }
        self.gpu(&state, agent, "hsa_amd_agent_iterate_memory_pools")?;
        Ok(vec![MemoryPool {
            handle: FIRST_DEVICE_POOL + (agent.handle - FIRST_GPU),
        }])
    }
    fn pool_info(&self, pool: MemoryPool) -> HsaResult<PoolInfo> {
        let state = lock(&self.inner);
        let owner = state.pool_owner(pool);
        Ok(match (pool, owner) {
            (HOST_POOL, _) => PoolInfo {
                segment: SEGMENT_GLOBAL,
                global_flags: POOL_FLAG_FINE_GRAINED | POOL_FLAG_KERNARG_INIT,
                runtime_alloc_allowed: true,
            },
            (LOCKED_POOL, _) => PoolInfo {
                segment: SEGMENT_GLOBAL,
                global_flags: POOL_FLAG_FINE_GRAINED | POOL_FLAG_KERNARG_INIT,
                runtime_alloc_allowed: false,
            },
            (_, Some(_)) => PoolInfo {
                segment: SEGMENT_GLOBAL,
                global_flags: POOL_FLAG_COARSE_GRAINED,
                runtime_alloc_allowed: true,
            },
            (_, None) => return Err(self.status("hsa_amd_memory_pool_get_info", 40)),
        })
    }

    fn pool_allocate(&self, pool: MemoryPool, len: usize) -> HsaResult<*mut u8> {
        self.check("hsa_amd_memory_pool_allocate")?;
        let call = "hsa_amd_memory_pool_allocate";
        let mut state = lock(&self.inner);
        if state.pool_owner(pool).is_none() || pool == LOCKED_POOL {
            return Err(self.status(call, 0x1003));
        }
        let addr = state
            .new_block(len, Some(pool))
            .ok_or_else(|| self.status(call, OUT_OF_RESOURCES))?;
        Ok(addr as *mut u8)
    }
    unsafe fn pool_free(&self, ptr: *mut u8) -> HsaResult<()> {
        let mut state = lock(&self.inner);
        let is_pool_block = state
            .blocks
            .get(&(ptr as u64))
            .is_some_and(|b| b.pool.is_some());
        if !is_pool_block || !state.free_block(ptr as u64) {
            return Err(self.status("hsa_amd_memory_pool_free", INVALID_ARGUMENT));
        }
        Ok(())
    }
    unsafe fn agents_allow_access(&self, agents: &[Agent], ptr: *mut u8) -> HsaResult<()> {
        self.check("hsa_amd_agents_allow_access")?;
        let state = lock(&self.inner);
        let known = agents.iter().all(|&a| a == CPU || state.gpu(a).is_some());
        if !known || !state.blocks.contains_key(&(ptr as u64)) {
            return Err(self.status("hsa_amd_agents_allow_access", INVALID_ARGUMENT));
        }
        Ok(())
    }
    unsafe fn copy_to_device(&self, dst: u64, src: &[u8]) -> HsaResult<()> {
        if !lock(&self.inner).covers(dst, src.len()) {
            return Err(self.status("hsa_memory_copy", INVALID_ARGUMENT));
        }
        // SAFETY: a live block holds the destination (checked) and, by the caller, no Rust
        // reference covers it.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst as *mut u8, src.len()) };
        Ok(())
    }
    unsafe fn copy_from_device(&self, dst: &mut [u8], src: u64) -> HsaResult<()> {
        if !lock(&self.inner).covers(src, dst.len()) {
            return Err(self.status("hsa_memory_copy", INVALID_ARGUMENT));
        }
        // SAFETY: a live block holds the source (checked); `dst` is borrowed mutably.
        unsafe { std::ptr::copy_nonoverlapping(src as *const u8, dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }

    unsafe fn code_object_reader_create(&self, bytes: &[u8]) -> HsaResult<CodeObjectReader> {
        self.check("hsa_code_object_reader_create_from_memory")?;
        if std::str::from_utf8(bytes).is_err() {
            return Err(self.status("hsa_code_object_reader_create_from_memory", 0x1010));
        }
        let mut state = lock(&self.inner);
        let handle = state.handle();
        state.readers.insert(handle, bytes.to_vec());
        Ok(CodeObjectReader { handle })
    }
    fn code_object_reader_destroy(&self, reader: CodeObjectReader) -> HsaResult<()> {
        let removed = lock(&self.inner).readers.remove(&reader.handle).is_some();
        removed
            .then_some(())
            .ok_or_else(|| self.status("hsa_code_object_reader_destroy", 0x1021))
    }
    fn executable_create(&self) -> HsaResult<Executable> {
        self.check("hsa_executable_create_alt")?;
        let mut state = lock(&self.inner);
        let handle = state.handle();
        state.executables.insert(handle, FakeExecutable::default());
        Ok(Executable { handle })
    }
    fn executable_load_agent_code_object(
        &self,
        executable: Executable,
        agent: Agent,
        reader: CodeObjectReader,
    ) -> HsaResult<()> {
        let call = "hsa_executable_load_agent_code_object";
        self.check(call)?;
        let mut state = lock(&self.inner);
        let text = state
            .readers
            .get(&reader.handle)
            .map(|b| String::from_utf8_lossy(b).into_owned())
            .ok_or_else(|| self.status(call, 0x1021))?;
        self.gpu(&state, agent, call)?;
        match state.executables.get(&executable.handle) {
            None => return Err(self.status(call, 0x1011)),
            Some(e) if e.frozen => return Err(self.status(call, 0x1012)),
            Some(_) => {}
        }
        let mut loaded = FakeExecutable::default();
        for line in text.lines() {
            let words: Vec<&str> = line.split_whitespace().collect();
            let number = |w: &str| w.parse::<usize>().map_err(|_| self.status(call, 0x1010));
            match words.as_slice() {
                [".kernel", name, args] => {
                    let kernarg_size = number(args)? as u32 + IMPLICIT;
                    let object = state.handle() << 8;
                    state.kernel_objects.insert(
                        object,
                        KernelObject {
                            executable: executable.handle,
                            name: format!("{name}.kd"),
                            kernarg_size,
                        },
                    );
                    loaded.kernels.insert(format!("{name}.kd"), object);
                }
                [".global", name, size] => {
                    let size = number(size)?;
                    let addr = state
                        .new_block(size, None)
                        .ok_or_else(|| self.status(call, OUT_OF_RESOURCES))?;
                    loaded.variables.insert((*name).to_owned(), (addr, size));
                }
                [] => {}
                _ => return Err(self.status(call, 0x1010)),
            }
        }
        state.executables.insert(executable.handle, loaded);
        Ok(())
    }
    fn executable_freeze(&self, executable: Executable) -> HsaResult<()> {
        let mut state = lock(&self.inner);
        let exe = state
            .executables
            .get_mut(&executable.handle)
            .ok_or_else(|| self.status("hsa_executable_freeze", 0x1011))?;
        exe.frozen = true;
        Ok(())
    }
    unsafe fn executable_destroy(&self, executable: Executable) -> HsaResult<()> {
        let mut state = lock(&self.inner);
        let exe = state
            .executables
            .remove(&executable.handle)
            .ok_or_else(|| self.status("hsa_executable_destroy", 0x1011))?;
        for (addr, _) in exe.variables.values() {
            state.free_block(*addr);
        }
        state
            .kernel_objects
            .retain(|_, o| o.executable != executable.handle);
        Ok(())
    }
    fn executable_symbol(
        &self,
        executable: Executable,
        name: &CStr,
        agent: Agent,
    ) -> HsaResult<ExecutableSymbol> {
        let call = "hsa_executable_get_symbol_by_name";
        let mut state = lock(&self.inner);
        self.gpu(&state, agent, call)?;
        let exe = state
            .executables
            .get(&executable.handle)
            .ok_or_else(|| self.status(call, 0x1011))?;
        let name = name.to_str().map_err(|_| self.status(call, 0x1013))?;
        let kind = if let Some(&(addr, size)) = exe.variables.get(name) {
            SymbolKind::Variable { addr, size }
        } else if let Some(&object) = exe.kernels.get(name) {
            let kernarg_size = state.kernel_objects[&object].kernarg_size;
            SymbolKind::Kernel {
                object,
                kernarg_size,
            }
        } else {
            return Err(self.status(call, 0x1013));
        };
        let handle = state.handle();
        state.symbols.insert(handle, kind);
        Ok(ExecutableSymbol { handle })
    }
    unsafe fn executable_symbol_get_info(
        &self,
        symbol: ExecutableSymbol,
        attribute: u32,
        value: *mut c_void,
    ) -> HsaResult<()> {
        let call = "hsa_executable_symbol_get_info";
        let kind = lock(&self.inner).symbols.get(&symbol.handle).copied();
        let kind = kind.ok_or_else(|| self.status(call, 0x1019))?;
        enum Value {
            U8(u8),
            U32(u32),
            U64(u64),
        }
        let answer = match (kind, attribute) {
            (SymbolKind::Variable { .. }, SYMBOL_INFO_TYPE) => Value::U32(SYMBOL_KIND_VARIABLE),
            (SymbolKind::Kernel { .. }, SYMBOL_INFO_TYPE) => Value::U32(SYMBOL_KIND_KERNEL),
            (SymbolKind::Variable { size, .. }, SYMBOL_INFO_VARIABLE_SIZE) => {
                Value::U32(size as u32)
            }
            (SymbolKind::Variable { addr, .. }, SYMBOL_INFO_VARIABLE_ADDRESS) => Value::U64(addr),
            (SymbolKind::Kernel { object, .. }, SYMBOL_INFO_KERNEL_OBJECT) => Value::U64(object),
            (SymbolKind::Kernel { kernarg_size, .. }, SYMBOL_INFO_KERNEL_KERNARG_SEGMENT_SIZE) => {
                Value::U32(kernarg_size)
            }
            (SymbolKind::Kernel { .. }, SYMBOL_INFO_KERNEL_KERNARG_SEGMENT_ALIGNMENT) => {
                Value::U32(8)
            }
            (SymbolKind::Kernel { .. }, SYMBOL_INFO_KERNEL_GROUP_SEGMENT_SIZE) => Value::U32(0),
            (SymbolKind::Kernel { .. }, SYMBOL_INFO_KERNEL_PRIVATE_SEGMENT_SIZE) => Value::U32(0),
            // HSA_EXECUTABLE_SYMBOL_INFO_KERNEL_DYNAMIC_CALLSTACK (a bool): no dynamic stack.
            (SymbolKind::Kernel { .. }, 15) => Value::U8(0),
            _ => return Err(self.status(call, INVALID_ARGUMENT)),
        };
        // SAFETY: the caller guarantees `value` has the attribute's size, which is the size
        // written here (hsa.h's type for each attribute).
        unsafe {
            match answer {
                Value::U8(v) => value.cast::<u8>().write_unaligned(v),
                Value::U32(v) => value.cast::<u32>().write_unaligned(v),
                Value::U64(v) => value.cast::<u64>().write_unaligned(v),
            }
        }
        Ok(())
    }

    fn signal_create(&self, initial: i64) -> HsaResult<Signal> {
        self.check("hsa_signal_create")?;
        Ok(lock(&self.inner).new_signal(initial))
    }
    unsafe fn signal_destroy(&self, signal: Signal) -> HsaResult<()> {
        let freed = lock(&self.inner).free_signal(signal);
        freed
            .then_some(())
            .ok_or_else(|| self.status("hsa_signal_destroy", 0x1006))
    }
    unsafe fn signal_store_screlease(&self, signal: Signal, value: i64) {
        let state = lock(&self.inner);
        assert!(
            state.signals.contains(&signal.handle),
            "a store to a dead signal"
        );
        // Release: what the storer wrote before (a published packet) is visible to whoever
        // acquires the value (the packet processor).
        // SAFETY: a live signal of this fake (asserted).
        unsafe { value_of(signal) }.store(value as u64, Ordering::Release);
        drop(state);
        self.inner.changed.notify_all();
    }
    unsafe fn signal_wait_scacquire(
        &self,
        signal: Signal,
        condition: u32,
        compare: i64,
        timeout_ticks: u64,
    ) -> i64 {
        let deadline = Instant::now() + Duration::from_nanos(timeout_ticks);
        let mut state = lock(&self.inner);
        assert!(
            state.signals.contains(&signal.handle),
            "a wait on a dead signal"
        );
        let epoch = state.epoch;
        loop {
            // Acquire: pairs with the release that changed the value (a completion).
            // SAFETY: a live signal of this fake (asserted; destroying it needs this mutex).
            let value = unsafe { value_of(signal) }.load(Ordering::Acquire) as i64;
            let met = match condition {
                SIGNAL_CONDITION_EQ => value == compare,
                SIGNAL_CONDITION_NE => value != compare,
                SIGNAL_CONDITION_LT => value < compare,
                _ => value >= compare,
            };
            let now = Instant::now();
            if met || now >= deadline || state.epoch != epoch {
                return value;
            }
            state = self
                .inner
                .changed
                .wait_timeout(state, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    unsafe fn queue_create(
        &self,
        agent: Agent,
        size: u32,
        callback: QueueCallback,
        data: *mut c_void,
    ) -> HsaResult<*mut Queue> {
        let call = "hsa_queue_create";
        self.check(call)?;
        let mut state = lock(&self.inner);
        let max = self.gpu(&state, agent, call)?.queue_max;
        if !size.is_power_of_two() || size > max {
            return Err(self.status(call, INVALID_ARGUMENT));
        }
        let ring = AllocLayout::from_size_align(size as usize * PACKET_SIZE, PACKET_SIZE)
            .map_err(|_| self.status(call, OUT_OF_RESOURCES))?;
        // SAFETY: a non-zero size.
        let base = unsafe { std::alloc::alloc(ring) };
        if base.is_null() {
            return Err(self.status(call, OUT_OF_RESOURCES));
        }
        for slot in 0..size as usize {
            // SAFETY: `base` holds `size` packets; every header starts INVALID (hsa.h), the
            // rest of a slot is the producer's to write.
            unsafe {
                std::ptr::write_bytes(base.add(slot * PACKET_SIZE), 0, PACKET_SIZE);
                base.add(slot * PACKET_SIZE)
                    .cast::<u16>()
                    .write(PACKET_TYPE_INVALID);
            }
        }
        // The doorbell holds the last announced index; none yet.
        let doorbell_signal = state.new_signal(-1);
        let id = state.handle();
        let queue = Box::into_raw(Box::new(Queue {
            queue_type: 0,
            features: 1,
            base_address: base.cast(),
            doorbell_signal,
            size,
            reserved1: 0,
            id,
        }));
        state.queues.insert(
            queue as usize,
            FakeQueue {
                agent,
                ring,
                read_index: 0,
                write_index: 0,
                callback,
                data: data as usize,
                inactive: false,
                faulted: false,
                stop: false,
                processor: None,
            },
        );
        let inner = self.inner.clone();
        let key = queue as usize;
        let processor = std::thread::Builder::new()
            .name("fake-hsa-queue".into())
            .spawn(move || process(inner, key))
            .map_err(|_| self.status(call, OUT_OF_RESOURCES));
        match processor {
            Ok(handle) => {
                if let Some(q) = state.queues.get_mut(&key) {
                    q.processor = Some(handle);
                }
                Ok(queue)
            }
            Err(e) => {
                drop(state);
                // SAFETY: just created, used by nobody.
                let _ = unsafe { self.queue_destroy(queue) };
                Err(e)
            }
        }
    }
    unsafe fn queue_destroy(&self, queue: *mut Queue) -> HsaResult<()> {
        let processor = {
            let mut state = lock(&self.inner);
            let q = self.queue(&mut state, queue, "hsa_queue_destroy")?;
            q.stop = true;
            q.processor.take()
        };
        self.inner.changed.notify_all();
        if let Some(processor) = processor {
            let _ = processor.join();
        }
        let mut state = lock(&self.inner);
        let q = state
            .queues
            .remove(&(queue as usize))
            .expect("the queue is still listed");
        // SAFETY: made by `Box::into_raw` in `queue_create`, removed from `queues` just now;
        // its processor has ended.
        let record = unsafe { Box::from_raw(queue) };
        state.free_signal(record.doorbell_signal);
        // SAFETY: allocated in `queue_create` with this layout; freed once, with the queue.
        unsafe { std::alloc::dealloc(record.base_address.cast(), q.ring) };
        Ok(())
    }
    unsafe fn queue_inactivate(&self, queue: *mut Queue) -> HsaResult<()> {
        let mut state = lock(&self.inner);
        self.queue(&mut state, queue, "hsa_queue_inactivate")?
            .inactive = true;
        state.epoch += 1;
        drop(state);
        self.inner.changed.notify_all();
        Ok(())
    }
    unsafe fn queue_add_write_index(&self, queue: *mut Queue, count: u64) -> u64 {
        let mut state = lock(&self.inner);
        let q = state
            .queues
            .get_mut(&(queue as usize))
            .expect("a live queue");
        let index = q.write_index;
        q.write_index += count;
        index
    }
    unsafe fn queue_load_read_index(&self, queue: *mut Queue) -> u64 {
        lock(&self.inner)
            .queues
            .get(&(queue as usize))
            .expect("a live queue")
            .read_index
    }
}

/// What the contract's suite asks of the fake: one MI300X (its pools' memory garbage until
/// the plugin zeroes it), and the fake's counts.
impl plugin_contract::Fake for FakeHsa {
    type Plugin = crate::AmdGpuPlugin;
    const IMAGE: &'static [u8] = b".kernel main 16\n.kernel other 16\n.kernel spin 16\n\
                                   .global __llvm_rpc_client 552\n.global data 16\n";
    fn one_gpu() -> (Arc<Self>, crate::AmdGpuPlugin) {
        let fake = FakeHsa::new(vec![FakeAgent::mi300x()]);
        plugin_contract::suite::initialised(fake, |fake| crate::AmdGpuPlugin::with_api(fake))
    }
    fn loaded_images(&self) -> usize {
        self.live_executables()
    }
    fn launched(&self) -> Vec<(String, Grid)> {
        let dispatches = self.dispatches().into_iter();
        dispatches.map(|d| (d.kernel, d.grid)).collect()
    }
    fn host_allocations(&self) -> usize {
        self.live_host_allocations()
    }
    fn device_allocations(&self) -> usize {
        self.live_device_allocations()
    }
}

//! A CPU "device": launches run a grid of warps on host threads, each warp one thread speaking
//! the client protocol over the mailbox its image's client object names.
//!
//! `abort_launches` is this device's reset: it cannot stop a thread, so every warp's waits for
//! the server give up from then on (the kernel's next RPC call fails, and the kernel ends at
//! it), and `synchronize` stops waiting for launches still running.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use crate::lock;
use rpc_core::plugin::CLIENT_SYMBOL;
use rpc_core::plugin::{
    Completion, Device, DeviceAllocator, Doorbell, Grid, SharedRegion, Symbol, VendorError,
};
use rpc_core::protocol::ClientDoorbell;
use rpc_core::protocol::{Client, Generation, Layout, Mailbox};

use crate::error::HostError;
use crate::image::LoadedImage;
use crate::kernel::{KernelEnded, Warp};
use crate::memory::HostAllocator;
use crate::memory::{HostDoorbell, HostShared, MemoryMap, RawMemory, Signal};

/// Most warps (threads) one launch may run.
pub const MAX_WARPS_PER_LAUNCH: u64 = 1024;

/// One CPU device.
pub struct HostDevice {
    index: usize,
    lanes: u32,
    ports: u32,
    allocator: Arc<HostAllocator>,
    memory: Arc<MemoryMap>,
    launches: Arc<Launches>,
    /// The interrupt of each doorbell, by the address of its counter.
    signals: Mutex<Vec<(u64, Arc<Signal>)>>,
}

/// What a kernel needs to ring its mailbox's doorbell: the counter and mailbox words, the
/// interrupt, the event id.
type BellParts = (Arc<RawMemory>, Arc<Signal>, u32);

/// Launches in flight and the failures of finished ones, for `synchronize`.
#[derive(Default)]
struct Launches {
    state: Mutex<(usize, Vec<String>)>,
    done: Condvar,
    /// Set by `abort_launches`: warps' waits give up, `synchronize` waits no more.
    aborted: AtomicBool,
}

/// The wait of every warp's client: backs off, and gives up once the device was aborted.
struct Abortable(Arc<Launches>);

impl rpc_core::protocol::Wait for Abortable {
    fn pause(&self, port: u32, attempt: u32) -> Result<(), rpc_core::ProtocolError> {
        // Relaxed: a flag read on its own; a late sight costs one more back-off step.
        if self.0.aborted.load(Ordering::Relaxed) {
            return Err(rpc_core::ProtocolError::Abandoned {
                port,
                reason: "the device was aborted",
            });
        }
        rpc_core::protocol::Backoff::step(attempt);
        Ok(())
    }
}

impl HostDevice {
    pub(crate) fn new(index: usize, lanes: u32, ports: u32) -> Self {
        HostDevice {
            index,
            lanes,
            ports,
            allocator: Arc::new(HostAllocator::new()),
            memory: Arc::default(),
            launches: Arc::default(),
            signals: Mutex::default(),
        }
    }

    /// The doorbell a v2 mailbox's record names, if it is one of ours (as a kernel reads it).
    fn doorbell_of(&self, mailbox: &RawMemory, layout: Layout) -> Option<BellParts> {
        if layout.generation() != Generation::V2 {
            return None;
        }
        let mut record = [0u8; 20];
        mailbox.read(0, &mut record);
        let value = u64::from_le_bytes(record[..8].try_into().expect("8 bytes"));
        let event_id = u32::from_le_bytes(record[16..20].try_into().expect("4 bytes"));
        let (words, 0) = self.memory.find(value, 16)? else {
            return None;
        };
        let signal = lock(&self.signals)
            .iter()
            .find(|(addr, _)| *addr == value)?
            .1
            .clone();
        Some((words, signal, event_id))
    }

    /// The region `len` bytes at `addr` lie in, and their offset in it.
    fn region_at(&self, addr: u64, len: usize) -> Result<(Arc<RawMemory>, usize), HostError> {
        self.memory
            .find(addr, len)
            .ok_or(HostError::BadAddress { addr, len })
    }

    /// The mailbox named by a client object, checked against this device's memory.
    fn mailbox_of(
        &self,
        object: &RawMemory,
        generation: Generation,
    ) -> Result<(Arc<RawMemory>, Layout), HostError> {
        // The port count and the pointers, not the lock words (which running warps use).
        let mut bytes = vec![0u8; generation.client_object_locks()];
        object.read(0, &mut bytes);
        let word = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"));
        let ports = u32::from_le_bytes(bytes[..4].try_into().expect("4 bytes"));
        let layout = Layout::new(generation, ports, self.lanes)
            .map_err(|e| HostError::Config(e.to_string()))?;
        // The inbox (primary) pointer follows the port count, and the doorbell on v2.
        let primary = word(if generation == Generation::V2 { 16 } else { 8 });
        let base = primary.wrapping_sub(layout.primary() as u64);
        let (region, offset) = self.region_at(base, layout.total_size())?;
        if offset != 0 {
            return Err(HostError::BadAddress {
                addr: base,
                len: layout.total_size(),
            });
        }
        Ok((region, layout))
    }
}

impl Device for HostDevice {
    type Image = LoadedImage;

    fn name(&self) -> String {
        format!("cpu{}", self.index)
    }
    fn lane_size(&self) -> u32 {
        self.lanes
    }
    fn parallelism(&self) -> u32 {
        self.ports
    }

    fn alloc_shared(&self, len: usize) -> Result<Box<dyn SharedRegion>, VendorError> {
        let memory = RawMemory::zeroed(len);
        self.memory.insert(&memory);
        Ok(Box::new(HostShared(memory)))
    }

    /// A mailbox's memory knows where its `u32` flags are, so that copies into it access every
    /// word with the server's size (see `memory`).
    fn alloc_mailbox(&self, layout: Layout) -> Result<Box<dyn SharedRegion>, VendorError> {
        let memory = RawMemory::mailbox(layout);
        self.memory.insert(&memory);
        Ok(Box::new(HostShared(memory)))
    }

    /// Host devices can always "interrupt": v2 mailboxes get a doorbell.
    fn create_doorbell(
        &self,
        generation: Generation,
    ) -> Result<Option<Box<dyn Doorbell>>, VendorError> {
        if generation != Generation::V2 {
            return Ok(None);
        }
        let words = RawMemory::zeroed(16);
        self.memory.insert(&words);
        let signal = Arc::new(Signal::default());
        let mut signals = lock(&self.signals);
        signals.push((words.addr(), signal.clone()));
        let event_id = signals.len() as u32;
        Ok(Some(Box::new(HostDoorbell {
            words,
            signal,
            event_id,
        })))
    }

    fn allocator(&self) -> Arc<dyn DeviceAllocator> {
        self.allocator.clone()
    }

    fn load_image(&self, bytes: &[u8]) -> Result<LoadedImage, VendorError> {
        let (image, native_client) = crate::loader::resolve(bytes)?;
        let client_symbol = native_client
            .or_else(|| image.rpc.map(RawMemory::client_object))
            .inspect(|memory| self.memory.insert(memory));
        Ok(LoadedImage {
            image,
            client_symbol,
        })
    }

    fn find_symbol(&self, image: &LoadedImage, name: &str) -> Option<Symbol> {
        let memory = image
            .client_symbol
            .as_ref()
            .filter(|_| name == CLIENT_SYMBOL)?;
        Some(Symbol {
            addr: memory.addr(),
            size: memory.len(),
        })
    }

    fn copy_to_device(&self, dst: u64, bytes: &[u8]) -> Result<(), VendorError> {
        let (region, offset) = self.region_at(dst, bytes.len())?;
        region.write(offset, bytes);
        Ok(())
    }

    fn copy_from_device(&self, src: u64, out: &mut [u8]) -> Result<(), VendorError> {
        let (region, offset) = self.region_at(src, out.len())?;
        region.read(offset, out);
        Ok(())
    }

    fn launch(
        &self,
        image: &LoadedImage,
        kernel: &str,
        args: &[u8],
        grid: Grid,
        done: Completion,
    ) -> Result<(), VendorError> {
        let body = image
            .image
            .find_kernel(kernel)
            .ok_or_else(|| HostError::UnknownKernel {
                image: image.image.name.clone(),
                kernel: kernel.into(),
            })?;
        let threads = grid.threads_per_block();
        let warps_per_block = threads.div_ceil(u64::from(self.lanes));
        let warps = grid.total_blocks() * warps_per_block;
        if threads == 0 || warps == 0 || warps > MAX_WARPS_PER_LAUNCH {
            return Err(HostError::BadLaunch(format!(
                "{} blocks x {threads} threads is {warps} warps (1..={MAX_WARPS_PER_LAUNCH})",
                grid.total_blocks()
            ))
            .into());
        }
        let symbol = image.client_symbol.clone();
        let mailbox = match (&symbol, image.image.rpc) {
            (Some(object), Some(generation)) => Some(self.mailbox_of(object, generation)?),
            _ => None,
        };
        let bell = mailbox
            .as_ref()
            .and_then(|(memory, layout)| self.doorbell_of(memory, *layout));
        let name = format!("{}::{kernel}", image.image.name);
        let args = args.to_vec();
        let lanes = self.lanes;
        let launches = self.launches.clone();
        lock(&launches.state).0 += 1;
        let spawned = std::thread::Builder::new()
            .name(format!("launch-{kernel}"))
            .spawn(move || {
                let failures = Job {
                    body,
                    name,
                    grid,
                    lanes,
                    warps_per_block: warps_per_block as u32,
                    args,
                    symbol,
                    mailbox,
                    bell,
                    wait: Abortable(launches.clone()),
                }
                .run();
                // The kernel is complete: release the launch's user guard, then report. A
                // panicking `done` must not skip the count below, or `synchronize` would wait
                // for this launch forever.
                if catch_unwind(AssertUnwindSafe(done)).is_err() {
                    log::error!("host: a launch completion panicked");
                }
                let mut state = lock(&launches.state);
                state.0 -= 1;
                state.1.extend(failures);
                launches.done.notify_all();
            });
        if let Err(error) = spawned {
            let mut state = lock(&self.launches.state);
            state.0 -= 1;
            return Err(HostError::Spawn(error).into());
        }
        Ok(())
    }

    fn synchronize(&self) -> Result<(), VendorError> {
        let launches = &self.launches;
        let mut state = lock(&launches.state);
        // The flag is set under this lock (see `abort_launches`), so Relaxed reads suffice.
        while state.0 > 0 && !launches.aborted.load(Ordering::Relaxed) {
            state = launches.done.wait(state).unwrap_or_else(|e| e.into_inner());
        }
        if state.0 > 0 {
            let running = state.0;
            state
                .1
                .push(format!("{running} launch(es) aborted while running"));
        }
        let failures = std::mem::take(&mut state.1);
        if failures.is_empty() {
            Ok(())
        } else {
            Err(HostError::KernelFailed(failures.join("; ")).into())
        }
    }

    fn abort_launches(&self) {
        let state = lock(&self.launches.state);
        self.launches.aborted.store(true, Ordering::Relaxed);
        drop(state);
        self.launches.done.notify_all();
    }
}

/// One launch: the kernel, its grid and what its warps need to reach the server.
struct Job {
    body: crate::kernel::Kernel,
    name: String,
    grid: Grid,
    lanes: u32,
    warps_per_block: u32,
    args: Vec<u8>,
    /// The image's client object (its lock array is the clients' lock bits, as on a GPU).
    symbol: Option<Arc<RawMemory>>,
    mailbox: Option<(Arc<RawMemory>, Layout)>,
    bell: Option<BellParts>,
    wait: Abortable,
}

impl Job {
    /// Runs every warp of the grid on its own thread; returns the failures.
    fn run(self) -> Vec<String> {
        let Job {
            body,
            name,
            grid,
            lanes,
            warps_per_block,
            args,
            symbol,
            mailbox,
            bell,
            wait,
        } = self;
        let threads = grid.threads_per_block();
        let failures = Mutex::new(Vec::new());
        let lock_words = match (&symbol, &mailbox) {
            (Some(symbol), Some((_, layout))) => {
                let generation = layout.generation();
                Some(symbol.u32_words(
                    generation.client_object_locks(),
                    generation.max_port_count() as usize / 32,
                ))
            }
            _ => None,
        };
        let view = mailbox.as_ref().map(|(memory, layout)| {
            // SAFETY: the region is one of this device's live allocations (checked by
            // `mailbox_of`, and kept alive by the `Arc` for the whole grid), 64-aligned, of the
            // layout's size, and this process touches it only through atomic views of these sizes
            // (the server's, this one, and `RawMemory`'s copies, which use the same words).
            unsafe { Mailbox::from_raw(memory.as_ptr(), memory.len(), *layout) }
        });
        let client_bell = bell.as_ref().map(|(words, signal, event_id)| {
            (
                words.u64_word(0),
                words.u64_word(8),
                *event_id,
                signal.as_ref(),
            )
        });
        std::thread::scope(|scope| {
            for block in 0..grid.total_blocks() as u32 {
                for warp in 0..warps_per_block {
                    let first_thread = u64::from(warp) * u64::from(lanes);
                    let active = (threads - first_thread).min(u64::from(lanes));
                    let mask = if active == 64 {
                        u64::MAX
                    } else {
                        (1u64 << active) - 1
                    };
                    let (failures, view, body, name, args, wait) =
                        (&failures, &view, &body, &name, &args, &wait);
                    let client_bell = &client_bell;
                    scope.spawn(move || {
                        let result = catch_unwind(AssertUnwindSafe(|| {
                            let client = match (view, lock_words) {
                                (Some(Ok(view)), Some(words)) => {
                                    Some(Client::new(*view, words).map(|c| c.with_wait(wait)))
                                }
                                (Some(Err(e)), _) => Some(Err(e.clone())),
                                _ => None,
                            };
                            let mut client = client
                                .transpose()
                                .unwrap_or_else(|e| panic!("no RPC client: {e}"));
                            let raise = client_bell.map(|(_, _, _, signal)| move || signal.raise());
                            if let (Some(c), Some((value, mailbox, event_id, _)), Some(raise)) =
                                (client.as_mut(), client_bell, raise.as_ref())
                            {
                                *c = c.with_doorbell(ClientDoorbell {
                                    value,
                                    mailbox,
                                    event_id: *event_id,
                                    raise,
                                });
                            }
                            body(
                                &mut Warp::new(
                                    client,
                                    mask,
                                    lanes,
                                    (block, warp, warps_per_block),
                                    args,
                                )
                                .with_abort(&wait.0.aborted),
                            )
                        }));
                        if let Err(payload) = result {
                            if payload.downcast_ref::<KernelEnded>().is_none() {
                                let text = rpc_core::plugin::panic_message(payload.as_ref());
                                lock(failures).push(format!(
                                    "{name}: block {block} warp {warp} panicked: {text}"
                                ));
                            }
                        }
                    });
                }
            }
        });
        failures.into_inner().unwrap_or_else(|e| e.into_inner())
    }
}

//! The generic glue between a vendor [`Plugin`] and its own [`RpcServer`] (STYLE 3: these
//! public methods do the bookkeeping, the plugin's hooks do the vendor work).
//!
//! - [`PluginRuntime::load_image`]: loads the image; if it has the client symbol
//!   (`__llvm_rpc_client`, whose size names the generation: 552 -> v1, 2096 -> v2; or LLVM
//!   18/19's `__llvm_libc_rpc_client`, a pointer to the client object, whose size the plugin
//!   reads from the image ([`Device::symbol_size_at`]): 96 -> v0 (LLVM 18), 552 -> v1 (LLVM
//!   19), both of whose clients number opcodes 0, 1, 2... in 16 bits:
//!   [`crate::protocol::opcode::Numbering::Llvm19`]; any other size, or one the plugin cannot
//!   read, is refused as an unknown generation), allocates the mailbox in memory the
//!   device sees, writes the client object with the device's addresses, attaches the mailbox to
//!   this plugin's server with the device's allocator for MALLOC, and starts the server
//!   (idempotent). Images without the symbol get no mailbox and start nothing.
//! - [`PluginRuntime::launch`]: a launch of an RPC image holds a user guard of the server until
//!   the plugin reports the kernel complete.
//! - [`PluginRuntime::deinit`] (and dropping the runtime): waits up to
//!   [`PluginRuntime::set_deinit_wait`] for the kernels still running, aborts the ones left
//!   (naming them in its error), detaches every mailbox, shuts the server down once, then
//!   deinitialises the plugin. Calling it twice is fine.
//!
//! # Lifecycle
//! One rule for the server: it serves whenever an RPC image is loaded or launched. `load_image`
//! and `launch` of an RPC image start it if it is stopped (also after the embedder's own
//! `server().shutdown()`), so a kernel never runs unserved; `start` and `shutdown` twice answer
//! `AlreadyRunning` / `AlreadyStopped`. After `deinit`, `server().start()` fails with
//! [`ServerError::Deinitialised`](crate::ServerError::Deinitialised) and `load_image` /
//! `launch` find no device.
//!
//! # Exit policy
//! A kernel's `exit(n)` or `abort()` ends the *host process* under the default
//! [`crate::ExitPolicy::Process`], as LLVM's loader does; an embedding program that must outlive
//! its kernels sets [`crate::ExitPolicy::Record`] (in [`ServerConfig::services`], or later with
//! `server().context().services().set_exit_policy`): `synchronize` then returns the exit as a
//! value (`Ok(Some(KernelExit::Exit(status)))`, `exit(0)` included; an error is only a failed
//! kernel or device).

use std::boxed::Box;
use std::string::String;
use std::vec::Vec;

use crate::plugin::error::PluginError;
use crate::plugin::{Device, Grid, Plugin, SharedRegion, Symbol, VendorError};
use crate::protocol::error::ProtocolError;
use crate::protocol::layout::{Generation, Layout};
use crate::protocol::opcode::{Dialect, Numbering};
use crate::protocol::Opcode;
use crate::server::stats::StatsSnapshot;
use crate::server::thread::{Started, Stopped};
use crate::server::{
    AttachOptions, MailboxId, RegionMailbox, RpcServer, ServerConfig, ShutdownPolicy,
};
use crate::services::KernelExit;
use crate::sync::{lock, wait_until, Arc, Mutex};
use crate::{Error, Result};
use std::sync::Condvar;
use std::time::{Duration, Instant};

/// The client symbol of current images.
pub const CLIENT_SYMBOL: &str = "__llvm_rpc_client";
/// The older symbol: a pointer to the client object.
pub const LEGACY_CLIENT_SYMBOL: &str = "__llvm_libc_rpc_client";

/// The namespace of a mangled `NAMESPACE::rpc::client` (`_ZN19__llvm_libc_18_1_8_3rpc6clientE`
/// -> `__llvm_libc_18_1_8_`): the object LLVM 18's and 19's [`LEGACY_CLIENT_SYMBOL`] points to
/// (`libc/src/__support/RPC/rpc_client.cpp`: `Client client; void *__llvm_libc_rpc_client =
/// &client;`). Both releases require the namespace to start with `__llvm_libc`. How plugins
/// and loaders find that object's size ([`Device::symbol_size_at`]), which names the release.
pub fn libc_rpc_client_namespace(name: &str) -> Option<&str> {
    let rest = name.strip_prefix("_ZN")?.strip_suffix("3rpc6clientE")?;
    let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
    let len: usize = rest[..digits].parse().ok()?;
    let namespace = &rest[digits..];
    (namespace.len() == len && namespace.starts_with("__llvm_libc")).then_some(namespace)
}

/// Every distinct `__llvm_libc*::rpc::client` name ([`libc_rpc_client_namespace`]) written in
/// `bytes`, an image in any format: PTX text names its globals, an ELF its symbols' string
/// table. No parse: a byte scan for `_ZN` and the identifier after it.
pub fn libc_rpc_client_names(bytes: &[u8]) -> Vec<String> {
    let identifier = |b: &u8| b.is_ascii_alphanumeric() || *b == b'_';
    let mut names: Vec<String> = Vec::new();
    let mut at = 0;
    while let Some(found) = bytes[at..].windows(3).position(|w| w == b"_ZN") {
        let start = at + found;
        let len = bytes[start..].iter().take_while(|b| identifier(b)).count();
        let word = std::str::from_utf8(&bytes[start..start + len]).unwrap_or("");
        if libc_rpc_client_namespace(word).is_some() && !names.iter().any(|n| n == word) {
            names.push(word.to_owned());
        }
        at = start + len.max(3);
    }
    names
}

/// How long `synchronize` waits for the server to finish a completed kernel's last requests.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

/// How long `deinit` waits for running kernels by default.
pub(crate) const DEFAULT_DEINIT_WAIT: Duration = Duration::from_secs(10);

/// A launch not yet complete.
struct Running {
    id: u64,
    device: usize,
    kernel: String,
}

/// The launches not yet complete; each launch's completion removes its entry and notifies.
#[derive(Default)]
struct Launches {
    running: std::sync::Mutex<(u64, Vec<Running>)>,
    completed: Condvar,
}

impl Launches {
    fn begin(&self, device: usize, kernel: &str) -> u64 {
        let mut running = lock(&self.running);
        running.0 += 1;
        let id = running.0;
        running.1.push(Running {
            id,
            device,
            kernel: kernel.into(),
        });
        id
    }

    fn end(&self, id: u64) {
        lock(&self.running).1.retain(|r| r.id != id);
        self.completed.notify_all();
    }

    /// Waits until no launch runs or `wait` has passed; the ones still running.
    fn wait(&self, wait: Duration) -> Vec<(usize, String)> {
        let deadline = Instant::now() + wait;
        let running = wait_until(&self.completed, lock(&self.running), deadline, |r| {
            !r.1.is_empty()
        });
        running
            .1
            .iter()
            .map(|r| (r.device, r.kernel.clone()))
            .collect()
    }
}

/// An image loaded by a [`PluginRuntime`] (or a loaded plugin: its index crosses the C ABI).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ImageId(usize);

impl ImageId {
    /// The image of index `index` (the `n`th image its runtime loaded, from 0).
    pub const fn from_index(index: usize) -> Self {
        ImageId(index)
    }
    /// The image's index.
    pub const fn index(self) -> usize {
        self.0
    }
}

struct Loaded<I> {
    device: usize,
    image: I,
    mailbox: Option<MailboxId>,
}

type LoadedOf<P> = Loaded<<<P as Plugin>::Device as Device>::Image>;

/// A plugin, its devices and its own RPC server.
pub struct PluginRuntime<P: Plugin> {
    plugin: P,
    server: RpcServer,
    /// Loaded images by id (entries are taken at deinit).
    images: Mutex<Vec<Option<LoadedOf<P>>>>,
    launches: Arc<Launches>,
    deinit_wait: Duration,
    initialised: bool,
}

fn vendor(plugin: &'static str, what: &'static str) -> impl FnOnce(VendorError) -> Error {
    move |error| {
        Error::Plugin(PluginError::Vendor {
            plugin,
            what,
            source: error.into(),
        })
    }
}

impl<P: Plugin> PluginRuntime<P> {
    /// Initialises `plugin` and creates its server (named after the plugin unless `config`
    /// names it). No devices is not an error: see [`PluginRuntime::reason`].
    pub fn new(mut plugin: P, mut config: ServerConfig) -> Result<Self> {
        if config.name == ServerConfig::default().name {
            config.name = plugin.name().into();
        }
        plugin.init().map_err(vendor(plugin.name(), "init"))?;
        Ok(PluginRuntime {
            server: RpcServer::new(config),
            plugin,
            images: Mutex::new(Vec::new()),
            launches: Arc::default(),
            deinit_wait: DEFAULT_DEINIT_WAIT,
            initialised: true,
        })
    }

    /// How long `deinit` (and dropping the runtime) waits for kernels still running before it
    /// aborts them. Default 10 s.
    pub fn set_deinit_wait(&mut self, wait: Duration) {
        self.deinit_wait = wait;
    }

    /// The plugin this runtime drives.
    pub fn plugin(&self) -> &P {
        &self.plugin
    }
    /// The plugin's devices, in index order.
    pub fn devices(&self) -> &[P::Device] {
        self.plugin.devices()
    }
    /// Why there are no devices, when there are none.
    pub fn reason(&self) -> Option<String> {
        self.plugin.reason()
    }
    /// This plugin's own server (register custom handlers here).
    pub fn server(&self) -> &RpcServer {
        &self.server
    }

    fn device(&self, index: usize) -> Result<&P::Device> {
        let name = self.plugin.name();
        let missing = || PluginError::NotFound(std::format!("{name}: no device {index}")).into();
        self.plugin.devices().get(index).ok_or_else(missing)
    }

    /// Loads an image on device `device`, attaching a mailbox if the image uses RPC (and
    /// starting the server if it is stopped, see the module docs).
    pub fn load_image(&self, device: usize, bytes: &[u8]) -> Result<ImageId> {
        let name = self.plugin.name();
        let dev = self.device(device)?;
        let image = dev.load_image(bytes).map_err(vendor(name, "load image"))?;
        let mailbox = match self.client_object_address(dev, &image)? {
            None => None,
            Some((addr, generation, numbering)) => {
                let lanes = dev.image_lane_size(&image);
                Some(self.attach_mailbox(dev, addr, generation, numbering, lanes)?)
            }
        };
        let mut images = lock(&self.images);
        images.push(Some(Loaded {
            device,
            image,
            mailbox,
        }));
        Ok(ImageId(images.len() - 1))
    }

    /// Where the image wants its client object, of which generation and opcode numbering;
    /// None without RPC.
    fn client_object_address(
        &self,
        dev: &P::Device,
        image: &<P::Device as Device>::Image,
    ) -> Result<Option<(u64, Generation, Numbering)>> {
        if let Some(symbol) = dev.find_symbol(image, CLIENT_SYMBOL) {
            // LLVM 20+: v1 or v2; a 96-byte object is LLVM 18's, which no image names so.
            return match Generation::from_client_object_size(symbol.size)? {
                Generation::V0 => Err(ProtocolError::BadClientObjectSize(symbol.size).into()),
                generation => Ok(Some((symbol.addr, generation, Numbering::Current))),
            };
        }
        let Some(symbol) = dev.find_symbol(image, LEGACY_CLIENT_SYMBOL) else {
            return Ok(None);
        };
        if symbol.size != 8 {
            return Err(ProtocolError::BadClientObjectSize(symbol.size).into());
        }
        let mut pointer = [0u8; 8];
        dev.copy_from_device(symbol.addr, &mut pointer)
            .map_err(vendor(self.plugin.name(), "read client pointer"))?;
        let pointer = u64::from_le_bytes(pointer);
        // LLVM 18 (v0, 96 bytes) and 19 (v1, 552 bytes) both use the pointer: only the size of
        // the object it points to tells them apart. Never guessed: an unknown size is refused
        // before anything is written there. Both number opcodes in 16 bits.
        let size = dev.symbol_size_at(image, pointer).unwrap_or(0);
        match Generation::from_client_object_size(size)? {
            generation @ (Generation::V0 | Generation::V1) => {
                Ok(Some((pointer, generation, Numbering::Llvm19)))
            }
            Generation::V2 => Err(ProtocolError::BadClientObjectSize(size).into()),
        }
    }

    fn attach_mailbox(
        &self,
        dev: &P::Device,
        object_addr: u64,
        generation: Generation,
        numbering: Numbering,
        lanes: u32,
    ) -> Result<MailboxId> {
        let name = self.plugin.name();
        let layout = Layout::new(generation, generation.ports_for(dev.parallelism()), lanes)?;
        let region = dev
            .alloc_mailbox(layout)
            .map_err(vendor(name, "allocate mailbox"))?;
        let bell = dev
            .create_doorbell(generation)
            .map_err(vendor(name, "create doorbell"))?;
        // The region's size and alignment, checked before anything is written to it.
        // SAFETY: a validating view only; the region outlives this statement.
        unsafe { crate::protocol::Mailbox::from_raw(region.host_ptr(), region.len(), layout) }?;
        if let Some(bell) = &bell {
            let record = bell.record();
            // SAFETY: the region is ours, at least the layout's size (checked above; a v2 layout
            // starts with the 64-byte record), and nobody else knows it yet: the client object
            // is written below.
            unsafe {
                std::ptr::copy_nonoverlapping(record.as_ptr(), region.host_ptr(), record.len())
            };
        }
        let object = layout.client_object(region.device_addr());
        dev.copy_to_device(object_addr, &object)
            .map_err(vendor(name, "write client object"))?;
        // LLVM 19-22's servers format with LLVM libc's printf core, 23+'s with the host's
        // (LLVM 18 has no printf opcodes: the dialect never matters there).
        let printf = match generation {
            Generation::V0 | Generation::V1 => Dialect::LlvmLibc,
            Generation::V2 => Dialect::HostC,
        };
        let id = self.server.attach(
            Box::new(RegionMailbox::new(region, layout)?),
            AttachOptions {
                doorbell: bell,
                ..AttachOptions::default()
            }
            .clients(numbering, printf),
        );
        self.server
            .context()
            .services()
            .set_mailbox_allocator(id, dev.allocator());
        let _ = self.server.start()?;
        log::debug!(
            "{name}: {} attached mailbox {} ({layout})",
            dev.name(),
            id.0
        );
        Ok(id)
    }

    /// A global variable of a loaded image (a loader fills some: NVPTX constructor tables).
    pub fn find_symbol(&self, image: ImageId, name: &str) -> Option<Symbol> {
        let images = lock(&self.images);
        let loaded = images.get(image.0)?.as_ref()?;
        self.plugin
            .devices()
            .get(loaded.device)?
            .find_symbol(&loaded.image, name)
    }

    /// The mailbox serving `image`, if it uses RPC.
    pub fn mailbox(&self, image: ImageId) -> Option<MailboxId> {
        lock(&self.images)
            .get(image.0)
            .and_then(|l| l.as_ref())
            .and_then(|l| l.mailbox)
    }

    /// Launches `kernel` of `image`; an RPC image's launch holds a user guard until it
    /// completes, and starts the server if it was stopped (see the module docs).
    pub fn launch(&self, image: ImageId, kernel: &str, args: &[u8], grid: Grid) -> Result<()> {
        let images = lock(&self.images);
        let loaded = images
            .get(image.0)
            .and_then(|l| l.as_ref())
            .ok_or_else(|| PluginError::NotFound(std::format!("no image {}", image.0)))?;
        let device = self.device(loaded.device)?;
        if loaded.mailbox.is_some() {
            let _ = self.server.start()?;
        }
        let guard = loaded.mailbox.map(|id| self.server.user_for(id));
        let launches = self.launches.clone();
        let id = launches.begin(loaded.device, kernel);
        let done = Box::new(move || {
            drop(guard);
            launches.end(id);
        });
        let launched = device
            .launch(&loaded.image, kernel, args, grid, done)
            .map_err(vendor(self.plugin.name(), "launch"));
        if launched.is_err() {
            // `done` was called or dropped: either way the launch is not running.
            self.launches.end(id);
        }
        launched
    }

    /// Waits for every launch on `device`; reports a failed kernel as an error, and a kernel
    /// that called EXIT or ABORT (under [`crate::ExitPolicy::Record`]) as a value: `exit(0)` is
    /// `Ok(Some(KernelExit::Exit(0)))`, a kernel that just returned `Ok(None)`. Once it
    /// returns `Ok`, the statistics count every request of the device's mailboxes (a failed
    /// device returns its error at once, without waiting for them).
    pub fn synchronize(&self, device: usize) -> Result<Option<KernelExit>> {
        let dev = self.device(device)?;
        dev.synchronize()
            .map_err(vendor(self.plugin.name(), "synchronize"))?;
        let mailboxes: Vec<MailboxId> = lock(&self.images)
            .iter()
            .flatten()
            .filter(|l| l.device == device)
            .filter_map(|l| l.mailbox)
            .collect();
        // Every mailbox of the device drains before any exit is reported, so the counts read
        // after `synchronize` cover every image's requests, not only those up to the exit's.
        for &id in &mailboxes {
            if !self.server.wait_drained(id, DRAIN_TIMEOUT) {
                log::warn!(
                    "{}: mailbox {} still has requests pending after synchronize",
                    self.plugin.name(),
                    id.0
                );
            }
        }
        let services = self.server.context().services();
        Ok(mailboxes.into_iter().find_map(|id| services.take_exit(id)))
    }

    /// Waits up to the deinit wait for running kernels and aborts those left, detaches every
    /// mailbox, shuts the server down once (for good: it cannot start again), deinitialises
    /// the plugin. Returns [`PluginError::KernelsAborted`] naming the kernels it aborted (after
    /// finishing all of the above). Calling it again does nothing.
    pub fn deinit(&mut self) -> Result<()> {
        if !self.initialised {
            return Ok(());
        }
        let left = self.launches.wait(self.deinit_wait);
        let aborted = if left.is_empty() {
            None
        } else {
            let names: Vec<String> = left
                .iter()
                .map(|(device, kernel)| std::format!("{kernel} on device {device}"))
                .collect();
            let names = names.join(", ");
            log::error!(
                "{}: deinit: kernels still running after {:?}, aborted: {names}",
                self.plugin.name(),
                self.deinit_wait
            );
            let mut devices: Vec<usize> = left.iter().map(|(device, _)| *device).collect();
            devices.dedup();
            for device in devices {
                if let Some(dev) = self.plugin.devices().get(device) {
                    dev.abort_launches();
                }
            }
            Some(names)
        };
        self.server.retire();
        let images: Vec<_> = lock(&self.images).drain(..).flatten().collect();
        for loaded in &images {
            if let Some(id) = loaded.mailbox {
                self.server.detach(id)?;
            }
        }
        drop(images);
        let _ = self.server.shutdown_with(ShutdownPolicy::Force)?;
        self.initialised = false;
        let released = self
            .plugin
            .deinit()
            .map_err(vendor(self.plugin.name(), "deinit"));
        match aborted {
            Some(names) => {
                // The aborted kernels' failures are what the plugin reports: logged, and the
                // error names the kernels instead.
                if let Err(error) = released {
                    log::warn!("{}: {error}", self.plugin.name());
                }
                Err(PluginError::KernelsAborted(names).into())
            }
            None => released,
        }
    }
}

impl<P: Plugin> Drop for PluginRuntime<P> {
    fn drop(&mut self) {
        if let Err(error) = self.deinit() {
            log::error!("{}: deinit failed: {error}", self.plugin.name());
        }
    }
}

/// One request of a one-packet opcode, as a [`PacketHandler`] sees it: the client sent one
/// packet per active lane and reads back what the handler leaves in `buffers`.
#[derive(Debug)]
pub struct PacketRequest<'a> {
    /// The request's opcode.
    pub opcode: Opcode,
    /// `L`: the warp's lane count (`buffers.len()`).
    pub lane_size: u32,
    /// The active lanes (bit `i`: lane `i`).
    pub mask: u64,
    /// Each lane's 64-byte buffer, by lane index: the request in, the reply out (inactive
    /// lanes' buffers are ignored).
    pub buffers: &'a mut [[u64; 8]],
}

/// A handler of a one-packet opcode registered through [`Runtime::register_packet_handler`]:
/// it rewrites the request's buffers in place. It runs on the plugin's server thread.
pub type PacketHandler = Arc<dyn Fn(&mut PacketRequest<'_>) + Send + Sync>;

/// A runtime of any plugin, as an embedder drives it: object-safe, so that one program can hold
/// a host, a CUDA and an AMD GPU runtime side by side (`Vec<Box<dyn Runtime>>`), whether the
/// plugin is linked in ([`PluginRuntime`]) or loaded from its shared library (crate
/// `plugin-loader`). Each method is [`PluginRuntime`]'s of the same name, or its server's;
/// what needs the plugin's own types (`plugin()`, `devices()`, `server()`) stays on
/// [`PluginRuntime`], since a loaded plugin's server lives in another copy of this crate.
pub trait Runtime: Send + Sync {
    /// The plugin's name (`host`, `cuda`, `amdgpu`).
    fn plugin_name(&self) -> &'static str;
    /// How many devices the plugin found.
    fn device_count(&self) -> usize;
    /// Device `device`'s name, if it exists.
    fn device_name(&self, device: usize) -> Option<String>;
    /// Why the plugin found no device, if it found none.
    fn reason(&self) -> Option<String>;
    /// Registers `handler` for the one-packet opcode `opcode` on the plugin's server, ahead of
    /// the standard handlers and of those registered before.
    fn register_packet_handler(&self, opcode: Opcode, handler: PacketHandler);
    /// Starts the plugin's server ([`RpcServer::start`]): `AlreadyRunning` if it runs.
    fn start_server(&self) -> Result<Started>;
    /// Shuts the plugin's server down ([`RpcServer::shutdown`]): `AlreadyStopped` if it was
    /// stopped. Loading or launching an RPC image starts it again.
    fn shutdown_server(&self) -> Result<Stopped>;
    /// The plugin's server's statistics.
    fn stats(&self) -> StatsSnapshot;
    /// See [`PluginRuntime::load_image`].
    fn load_image(&self, device: usize, bytes: &[u8]) -> Result<ImageId>;
    /// See [`PluginRuntime::mailbox`].
    fn mailbox(&self, image: ImageId) -> Option<MailboxId>;
    /// See [`PluginRuntime::launch`].
    fn launch(&self, image: ImageId, kernel: &str, args: &[u8], grid: Grid) -> Result<()>;
    /// See [`PluginRuntime::synchronize`].
    fn synchronize(&self, device: usize) -> Result<Option<KernelExit>>;
    /// See [`PluginRuntime::find_symbol`].
    fn find_symbol(&self, image: ImageId, name: &str) -> Option<Symbol>;
    /// `len` zeroed bytes device `device` sees ([`Device::alloc_shared`]), freed when the
    /// region is dropped (before the runtime's `deinit`).
    fn alloc_shared(&self, device: usize, len: usize) -> Result<Box<dyn SharedRegion>>;
    /// Copies `bytes` to address `dst` of device `device` ([`Device::copy_to_device`]).
    fn copy_to_device(&self, device: usize, dst: u64, bytes: &[u8]) -> Result<()>;
    /// Copies from address `src` of device `device` into `out` ([`Device::copy_from_device`]).
    fn copy_from_device(&self, device: usize, src: u64, out: &mut [u8]) -> Result<()>;
    /// See [`PluginRuntime::deinit`].
    fn deinit(&mut self) -> Result<()>;
}

impl<P: Plugin> Runtime for PluginRuntime<P> {
    fn plugin_name(&self) -> &'static str {
        self.plugin().name()
    }
    fn device_count(&self) -> usize {
        self.devices().len()
    }
    fn device_name(&self, device: usize) -> Option<String> {
        self.devices().get(device).map(Device::name)
    }
    fn reason(&self) -> Option<String> {
        PluginRuntime::reason(self)
    }
    fn register_packet_handler(&self, opcode: Opcode, handler: PacketHandler) {
        self.server.register(opcode, move |mut request| {
            let handler = handler.clone();
            async move {
                let lane_size = request.lane_size();
                let mut buffers = std::vec![[0u64; 8]; lane_size as usize];
                request
                    .recv(|lane, packet| {
                        buffers[lane as usize] = core::array::from_fn(|i| packet.word(i))
                    })
                    .await?;
                handler(&mut PacketRequest {
                    opcode: request.opcode(),
                    lane_size,
                    mask: request.mask(),
                    buffers: &mut buffers,
                });
                request
                    .send(|lane, packet| {
                        for (i, &word) in buffers[lane as usize].iter().enumerate() {
                            packet.set_word(i, word);
                        }
                    })
                    .await
            }
        });
    }
    fn start_server(&self) -> Result<Started> {
        Ok(self.server.start()?)
    }
    fn shutdown_server(&self) -> Result<Stopped> {
        Ok(self.server.shutdown()?)
    }
    fn stats(&self) -> StatsSnapshot {
        self.server.stats()
    }
    fn load_image(&self, device: usize, bytes: &[u8]) -> Result<ImageId> {
        PluginRuntime::load_image(self, device, bytes)
    }
    fn mailbox(&self, image: ImageId) -> Option<MailboxId> {
        PluginRuntime::mailbox(self, image)
    }
    fn launch(&self, image: ImageId, kernel: &str, args: &[u8], grid: Grid) -> Result<()> {
        PluginRuntime::launch(self, image, kernel, args, grid)
    }
    fn synchronize(&self, device: usize) -> Result<Option<KernelExit>> {
        PluginRuntime::synchronize(self, device)
    }
    fn find_symbol(&self, image: ImageId, name: &str) -> Option<Symbol> {
        PluginRuntime::find_symbol(self, image, name)
    }
    fn alloc_shared(&self, device: usize, len: usize) -> Result<Box<dyn SharedRegion>> {
        self.device(device)?
            .alloc_shared(len)
            .map_err(vendor(self.plugin.name(), "allocate shared memory"))
    }
    fn copy_to_device(&self, device: usize, dst: u64, bytes: &[u8]) -> Result<()> {
        self.device(device)?
            .copy_to_device(dst, bytes)
            .map_err(vendor(self.plugin.name(), "copy to device"))
    }
    fn copy_from_device(&self, device: usize, src: u64, out: &mut [u8]) -> Result<()> {
        self.device(device)?
            .copy_from_device(src, out)
            .map_err(vendor(self.plugin.name(), "copy from device"))
    }
    fn deinit(&mut self) -> Result<()> {
        PluginRuntime::deinit(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn llvm_libcs_client_object_is_found_by_its_mangled_name() {
        let name = "_ZN19__llvm_libc_18_1_8_3rpc6clientE";
        assert_eq!(libc_rpc_client_namespace(name), Some("__llvm_libc_18_1_8_"));
        for not in [
            "_ZN20__llvm_libc_18_1_8_3rpc6clientE", // the length is wrong
            "_ZN5mylib3rpc6clientE",                // LLVM wants `__llvm_libc` first
            "_ZN19__llvm_libc_18_1_8_3rpc6clientEx",
            "__llvm_libc_rpc_client",
        ] {
            assert_eq!(libc_rpc_client_namespace(not), None, "{not}");
        }
        // In PTX text and in an ELF string table alike, each name once.
        let ptx = format!(".global .b8 {name}[96];\n.global .u64 x = generic({name});\n");
        assert_eq!(libc_rpc_client_names(ptx.as_bytes()), [name]);
        let strtab = format!("\0_ZN3foo3barE\0{name}\0_ZN\0");
        assert_eq!(libc_rpc_client_names(strtab.as_bytes()), [name]);
        assert!(libc_rpc_client_names(b"_ZN").is_empty());
    }
}

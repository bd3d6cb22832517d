//! The generic glue between a vendor [`Plugin`] and its own [`RpcServer`] (STYLE 3: these
//! public methods do the bookkeeping, the plugin's hooks do the vendor work).
//!
//! - [`PluginRuntime::load_image`]: loads the image; if it has the client symbol
//!   (`__llvm_rpc_client`, whose size names the generation: 552 -> v1, 2096 -> v2; or the older
//!   `__llvm_libc_rpc_client`, a pointer to a v1 object), allocates the mailbox in memory the
//!   device sees, writes the client object with the device's addresses, attaches the mailbox to
//!   this plugin's server with the device's allocator for MALLOC, and starts the server
//!   (idempotent). Images without the symbol get no mailbox and start nothing.
//! - [`PluginRuntime::launch`]: a launch of an RPC image holds a user guard of the server until
//!   the plugin reports the kernel complete.
//! - [`PluginRuntime::deinit`]: detaches every mailbox first, then shuts the server down once,
//!   then deinitialises the plugin. Calling it twice is fine.

use std::boxed::Box;
use std::string::{String, ToString};
use std::vec::Vec;

use crate::error::{Error, Result};
use crate::layout::{Generation, Layout};
use crate::plugin::{Device, Grid, Plugin, VendorError};
use crate::rpc_server::{MailboxId, RpcServer, ServerConfig, ShutdownPolicy};
use crate::services::KernelExit;
use crate::sync::{lock, Mutex};

/// The client symbol of current images.
pub const CLIENT_SYMBOL: &str = "__llvm_rpc_client";
/// The older symbol: a pointer to the client object.
pub const LEGACY_CLIENT_SYMBOL: &str = "__llvm_libc_rpc_client";

/// How long `synchronize` waits for the server to finish a completed kernel's last requests.
const DRAIN_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// An image loaded by a [`PluginRuntime`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ImageId(usize);

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
    initialised: bool,
}

fn vendor(plugin: &'static str, what: &'static str) -> impl FnOnce(VendorError) -> Error {
    move |error| Error::Vendor {
        plugin,
        what,
        message: error.to_string(),
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
            initialised: true,
        })
    }

    pub fn plugin(&self) -> &P {
        &self.plugin
    }
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
        self.plugin.devices().get(index).ok_or_else(|| {
            Error::NotFound(std::format!("{}: no device {index}", self.plugin.name()))
        })
    }

    /// Loads an image on device `device`, attaching a mailbox if the image uses RPC.
    pub fn load_image(&self, device: usize, bytes: &[u8]) -> Result<ImageId> {
        let name = self.plugin.name();
        let dev = self.device(device)?;
        let image = dev.load_image(bytes).map_err(vendor(name, "load image"))?;
        let mailbox = match self.client_object_address(dev, &image)? {
            None => None,
            Some((addr, generation)) => Some(self.attach_mailbox(dev, addr, generation)?),
        };
        let mut images = lock(&self.images);
        images.push(Some(Loaded {
            device,
            image,
            mailbox,
        }));
        Ok(ImageId(images.len() - 1))
    }

    /// Where the image wants its client object, and of which generation; None without RPC.
    fn client_object_address(
        &self,
        dev: &P::Device,
        image: &<P::Device as Device>::Image,
    ) -> Result<Option<(u64, Generation)>> {
        if let Some(symbol) = dev.find_symbol(image, CLIENT_SYMBOL) {
            return Ok(Some((
                symbol.addr,
                Generation::from_client_object_size(symbol.size)?,
            )));
        }
        let Some(symbol) = dev.find_symbol(image, LEGACY_CLIENT_SYMBOL) else {
            return Ok(None);
        };
        if symbol.size != 8 {
            return Err(Error::BadClientObjectSize(symbol.size));
        }
        let mut pointer = [0u8; 8];
        dev.copy_from_device(symbol.addr, &mut pointer)
            .map_err(vendor(self.plugin.name(), "read client pointer"))?;
        // Images old enough to use the pointer symbol speak the pre-doorbell layout.
        Ok(Some((u64::from_le_bytes(pointer), Generation::V1)))
    }

    fn attach_mailbox(
        &self,
        dev: &P::Device,
        object_addr: u64,
        generation: Generation,
    ) -> Result<MailboxId> {
        let name = self.plugin.name();
        let layout = Layout::new(generation, dev.port_count(generation), dev.lane_size())?;
        let region = dev
            .alloc_shared(layout.total_size())
            .map_err(vendor(name, "allocate mailbox"))?;
        let bell = dev
            .create_doorbell(generation)
            .map_err(vendor(name, "create doorbell"))?;
        // The region's size and alignment, checked before anything is written to it.
        // SAFETY: a validating view only; the region outlives this statement.
        unsafe { crate::Mailbox::from_raw(region.host_ptr(), region.len(), layout) }?;
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
        let id = match bell {
            Some(bell) => self
                .server
                .attach_region_with_doorbell(region, layout, bell)?,
            None => self.server.attach_region(region, layout)?,
        };
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

    /// The mailbox serving `image`, if it uses RPC.
    pub fn mailbox(&self, image: ImageId) -> Option<MailboxId> {
        lock(&self.images)
            .get(image.0)
            .and_then(|l| l.as_ref())
            .and_then(|l| l.mailbox)
    }

    /// Launches `kernel` of `image`; an RPC image's launch holds a user guard until it completes.
    pub fn launch(&self, image: ImageId, kernel: &str, args: &[u8], grid: Grid) -> Result<()> {
        let images = lock(&self.images);
        let loaded = images
            .get(image.0)
            .and_then(|l| l.as_ref())
            .ok_or_else(|| Error::NotFound(std::format!("no image {}", image.0)))?;
        let guard = loaded.mailbox.map(|id| self.server.user_for(id));
        let done = Box::new(move || drop(guard));
        self.device(loaded.device)?
            .launch(&loaded.image, kernel, args, grid, done)
            .map_err(vendor(self.plugin.name(), "launch"))
    }

    /// Waits for every launch on `device`; reports a failed kernel, and a kernel that called
    /// EXIT or ABORT (under [`crate::ExitPolicy::Record`]).
    pub fn synchronize(&self, device: usize) -> Result<()> {
        let dev = self.device(device)?;
        dev.synchronize()
            .map_err(vendor(self.plugin.name(), "synchronize"))?;
        let mailboxes: Vec<MailboxId> = lock(&self.images)
            .iter()
            .flatten()
            .filter(|l| l.device == device)
            .filter_map(|l| l.mailbox)
            .collect();
        for id in mailboxes {
            if !self.server.wait_drained(id, DRAIN_TIMEOUT) {
                log::warn!(
                    "{}: mailbox {} still has requests pending after synchronize",
                    self.plugin.name(),
                    id.0
                );
            }
            match self.server.context().services().take_exit(id) {
                Some(KernelExit::Exit(status)) => {
                    return Err(Error::KernelExited(std::format!("exit({status})")));
                }
                Some(KernelExit::Abort) => return Err(Error::KernelExited("abort()".into())),
                None => {}
            }
        }
        Ok(())
    }

    /// Detaches every mailbox, shuts the server down once, deinitialises the plugin.
    /// Calling it again does nothing.
    pub fn deinit(&mut self) -> Result<()> {
        if !self.initialised {
            return Ok(());
        }
        let images: Vec<_> = lock(&self.images).drain(..).flatten().collect();
        for loaded in &images {
            if let Some(id) = loaded.mailbox {
                self.server.detach(id)?;
            }
        }
        drop(images);
        let _ = self.server.shutdown_with(ShutdownPolicy::Force)?;
        self.initialised = false;
        self.plugin
            .deinit()
            .map_err(vendor(self.plugin.name(), "deinit"))
    }
}

impl<P: Plugin> Drop for PluginRuntime<P> {
    fn drop(&mut self) {
        if let Err(error) = self.deinit() {
            log::error!("{}: deinit failed: {error}", self.plugin.name());
        }
    }
}

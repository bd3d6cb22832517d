//! `plugin-loader`: finds plugin libraries, opens them and presents each as the same
//! [`rpc_core::Runtime`] the linked-in plugins are.
//!
//! - [`find_plugins`]: the `libplugin_<name>.so` files of the folders of `RPC_PLUGIN_PATH`
//!   (colon-separated) and then of one given folder (say, the one beside the program).
//! - [`LoadedPlugin::open`]: opens a library with `libloading`, calls its entry symbol
//!   (`rpc_plugin_entry`), checks that the table's ABI version is [`RPC_PLUGIN_ABI_VERSION`]
//!   (a mismatch names both), and initialises the plugin. A plugin whose driver is missing
//!   opens fine: zero devices, and the reason.
//!
//! A library once opened stays loaded until the process ends. A [`LoadedPlugin`] is its own
//! plugin instance with its own server thread, independent of a linked-in instance of the
//! same plugin (the library carries its own copy of rpc-core, and of the plugin: a loaded
//! `libplugin_host.so` runs native shared objects, not the program's `plugin_host::HostImage`
//! kernels, which a linked-in `PluginRuntime<HostPlugin>` runs). The rules of the ABI are in
//! `docs/plugins.md`.
//!
//! The `init` flags [`LoadedPlugin::open`] takes are re-exported here from `plugin-abi`:
//! [`RPC_INIT_RECORD_EXIT`] (a kernel's `exit`/`abort` comes back from `synchronize`
//! instead of ending the process) and [`RPC_INIT_LOADER_SETTINGS`] (devices set up as LLVM's
//! GPU loader sets them up); 0 for neither.
//!
//! ```no_run
//! use plugin_loader::{find_plugins, plugin_name_of, LoadedPlugin, RPC_INIT_RECORD_EXIT};
//! use rpc_core::Runtime;
//!
//! // `libplugin_host.so` from RPC_PLUGIN_PATH, else from the folder of this program.
//! let here = std::env::current_exe()?.parent().map(std::path::Path::to_path_buf);
//! let path = find_plugins(here.as_deref())
//!     .into_iter()
//!     .find(|path| plugin_name_of(path) == Some("host"))
//!     .ok_or("no libplugin_host.so")?;
//! let mut plugin = LoadedPlugin::open(&path, RPC_INIT_RECORD_EXIT)?;
//! println!("{}: {} device(s)", plugin.plugin_name(), plugin.device_count());
//! plugin.deinit()?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![warn(missing_docs)]

use std::ffi::{c_char, c_void, CStr, CString};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use libloading::Library;
use plugin_abi::*;
use rpc_core::plugin::{Grid, SharedRegion, Symbol};
use rpc_core::KernelExit;
use rpc_core::{
    ImageId, MailboxId, Opcode, PacketHandler, PluginError, Result, Runtime, ServerError, Started,
    StatsSnapshot, Stopped,
};

pub use plugin_abi::{RPC_INIT_LOADER_SETTINGS, RPC_INIT_RECORD_EXIT, RPC_PLUGIN_ABI_VERSION};

/// The environment variable of the folders searched first (colon-separated).
pub const PLUGIN_PATH_VAR: &str = "RPC_PLUGIN_PATH";

/// Why a library could not be loaded as a plugin.
#[derive(Debug)]
pub enum LoadError {
    /// The library could not be opened (the loader's message).
    Open(PathBuf, String),
    /// It has no entry symbol `rpc_plugin_entry`.
    NoEntry(PathBuf, String),
    /// Its ABI version is not ours.
    Version {
        /// The library.
        path: PathBuf,
        /// The version it was built for.
        found: u32,
        /// Ours.
        expected: u32,
    },
    /// Its `init` failed.
    Init(PathBuf, String),
}

impl std::fmt::Display for LoadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LoadError::Open(path, e) => write!(f, "{}: cannot open: {e}", path.display()),
            LoadError::NoEntry(path, e) => write!(
                f,
                "{}: not a plugin: no entry symbol `{ENTRY_SYMBOL}` ({e})",
                path.display()
            ),
            LoadError::Version {
                path,
                found,
                expected,
            } => write!(
                f,
                "{}: plugin ABI version {found}, but this loader speaks version {expected}",
                path.display()
            ),
            LoadError::Init(path, e) => write!(f, "{}: init failed: {e}", path.display()),
        }
    }
}

impl std::error::Error for LoadError {}

/// The plugin libraries found: `libplugin_<name>.so` in each folder of `RPC_PLUGIN_PATH`, then
/// in `dir`, in that order (sorted by name within a folder), each name once (the first found).
pub fn find_plugins(dir: Option<&Path>) -> Vec<PathBuf> {
    let from_env = std::env::var_os(PLUGIN_PATH_VAR).unwrap_or_default();
    let mut folders: Vec<PathBuf> = std::env::split_paths(&from_env)
        .filter(|p| !p.as_os_str().is_empty())
        .collect();
    folders.extend(dir.map(Path::to_path_buf));
    let mut found: Vec<PathBuf> = Vec::new();
    for folder in folders {
        let Ok(entries) = std::fs::read_dir(&folder) else {
            continue;
        };
        let mut here: Vec<PathBuf> = entries
            .flatten()
            .map(|e| e.path())
            .filter(|p| plugin_name_of(p).is_some())
            .collect();
        here.sort();
        for path in here {
            if !found
                .iter()
                .any(|f| plugin_name_of(f) == plugin_name_of(&path))
            {
                found.push(path);
            }
        }
    }
    found
}

/// `NAME` of a path `.../libplugin_NAME.so`.
pub fn plugin_name_of(path: &Path) -> Option<&str> {
    let file = path.file_name()?.to_str()?;
    let name = file.strip_prefix("libplugin_")?.strip_suffix(".so")?;
    (!name.is_empty()).then_some(name)
}

/// A handler registered through the ABI: the loader's trampoline gets it back as `ctx`.
type HandlerBox = Box<PacketHandler>;

/// A plugin opened from its shared library: a [`Runtime`].
pub struct LoadedPlugin {
    /// Null once deinitialised.
    plugin: *mut RpcPlugin,
    table: &'static RpcPluginTable,
    name: &'static str,
    /// The handlers the library's server holds pointers to: freed after its `deinit`.
    handlers: Mutex<Vec<*mut PacketHandler>>,
    path: PathBuf,
}

// SAFETY: the ABI lets every function but `init` and `deinit` be called from any thread at
// once (`deinit` takes `&mut self`); the handler pointers are only touched under their mutex
// and at drop.
unsafe impl Send for LoadedPlugin {}
// SAFETY: as above.
unsafe impl Sync for LoadedPlugin {}

impl LoadedPlugin {
    /// Opens the plugin library at `path` and initialises it with `flags`: 0, or
    /// [`RPC_INIT_RECORD_EXIT`] and [`RPC_INIT_LOADER_SETTINGS`] or'ed together.
    pub fn open(path: &Path, flags: u32) -> std::result::Result<Self, LoadError> {
        let open_error = |e: libloading::Error| LoadError::Open(path.into(), e.to_string());
        // SAFETY: loading a library runs its initialisers; a plugin library's are Rust's and
        // the C library's own. That is the trust a program gives any plugin it loads.
        let library = unsafe { Library::new(path) }.map_err(open_error)?;
        // SAFETY: the entry symbol's type is the ABI's `RpcPluginEntryFn`.
        let entry = *unsafe { library.get::<RpcPluginEntryFn>(ENTRY_SYMBOL.as_bytes()) }
            .map_err(|e| LoadError::NoEntry(path.into(), e.to_string()))?;
        // SAFETY: the entry takes nothing and returns a pointer to the library's static table.
        let table = unsafe { entry() };
        // A plugin library stays loaded for the rest of the process: threads it started may
        // outlive its `deinit` (an I/O thread abandoned in a stuck call), and its table is
        // `'static` only so.
        std::mem::forget(library);
        // SAFETY: the table is static in the library, which stays loaded (above). Its version
        // is read first: every version starts with it.
        let table: &'static RpcPluginTable = unsafe { table.as_ref() }
            .ok_or_else(|| LoadError::NoEntry(path.into(), "the entry returned no table".into()))?;
        if table.abi_version != RPC_PLUGIN_ABI_VERSION {
            return Err(LoadError::Version {
                path: path.into(),
                found: table.abi_version,
                expected: RPC_PLUGIN_ABI_VERSION,
            });
        }
        // SAFETY: the name is a static NUL-terminated string of the library (the ABI).
        let name = unsafe { CStr::from_ptr(table.name) }
            .to_string_lossy()
            .into_owned();
        let mut plugin = std::ptr::null_mut();
        // SAFETY: `init`'s contract: flags and a valid out pointer.
        let code = unsafe { (table.init)(flags, &mut plugin) };
        if code != RPC_OK {
            return Err(LoadError::Init(path.into(), last_error(table)));
        }
        Ok(LoadedPlugin {
            plugin,
            table,
            // PluginError::Vendor names a plugin with a static string: one small copy per library
            // opened.
            name: Box::leak(name.into_boxed_str()),
            handlers: Mutex::new(Vec::new()),
            path: path.into(),
        })
    }

    /// Every plugin [`find_plugins`] finds, opened (those that failed, with why).
    pub fn open_all(dir: Option<&Path>, flags: u32) -> Vec<std::result::Result<Self, LoadError>> {
        find_plugins(dir)
            .iter()
            .map(|path| Self::open(path, flags))
            .collect()
    }

    /// The library this plugin came from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `code` as a result: this thread's last error of the library on a failure.
    fn check(&self, what: &'static str, code: i32) -> Result<i32> {
        if code >= RPC_OK {
            return Ok(code);
        }
        let message = last_error(self.table);
        Err(match code {
            RPC_ERR_NOT_FOUND => PluginError::NotFound(message).into(),
            RPC_ERR_DEINITIALISED => ServerError::Deinitialised.into(),
            _ => PluginError::Vendor {
                plugin: self.name,
                what,
                source: rpc_core::VendorError::from(message).into(),
            }
            .into(),
        })
    }

    /// `device` as the ABI's index.
    fn device_index(&self, device: usize) -> Result<u32> {
        u32::try_from(device)
            .map_err(|_| PluginError::NotFound(format!("{}: no device {device}", self.name)).into())
    }

    /// The plugin pointer, or the error of a deinitialised plugin.
    fn live(&self) -> Result<*mut RpcPlugin> {
        if self.plugin.is_null() {
            Err(ServerError::Deinitialised.into())
        } else {
            Ok(self.plugin)
        }
    }

    /// A text the library writes as `snprintf` (`device_name`, `no_device_reason`).
    fn text(&self, write: impl Fn(*mut c_char, usize) -> usize) -> Option<String> {
        let mut buf = vec![0u8; 256];
        let mut len = write(buf.as_mut_ptr().cast(), buf.len());
        if len == 0 {
            return None;
        }
        if len >= buf.len() {
            buf = vec![0u8; len + 1];
            len = write(buf.as_mut_ptr().cast(), buf.len()).min(len);
        }
        buf.truncate(len);
        Some(String::from_utf8_lossy(&buf).into_owned())
    }
}

/// A region of a loaded plugin's `alloc_shared`, freed through its table when dropped.
struct LoadedRegion {
    region: *mut RpcRegion,
    info: RpcRegionInfo,
    free: unsafe extern "C" fn(*mut RpcRegion),
}

// SAFETY: the region is plain memory the plugin keeps allocated until `free_shared`; its
// handle may be freed from any thread.
unsafe impl Send for LoadedRegion {}
// SAFETY: as above; nothing here is mutated through `&self`.
unsafe impl Sync for LoadedRegion {}

// SAFETY: the library's `alloc_shared` promises a region of `SharedRegion`'s kind (it is one,
// boxed, in the library): the same 64-aligned pointer and length, allocated until freed.
unsafe impl SharedRegion for LoadedRegion {
    fn host_ptr(&self) -> *mut u8 {
        self.info.host_ptr
    }
    fn device_addr(&self) -> u64 {
        self.info.device_addr
    }
    fn len(&self) -> usize {
        self.info.len
    }
}

impl Drop for LoadedRegion {
    fn drop(&mut self) {
        // SAFETY: the handle `alloc_shared` made, freed once.
        unsafe { (self.free)(self.region) }
    }
}

/// The table's last error on this thread.
fn last_error(table: &RpcPluginTable) -> String {
    // SAFETY: `last_error` returns a NUL-terminated string the library owns, valid until this
    // thread's next call into it; it is copied at once.
    unsafe { CStr::from_ptr((table.last_error)()) }
        .to_string_lossy()
        .into_owned()
}

/// The C handler every Rust handler registered through the ABI runs behind.
unsafe extern "C" fn trampoline(ctx: *mut c_void, request: *mut RpcPacketRequest) {
    // No panic unwinds into the library: the handler's is caught and logged (the client then
    // reads back what the buffers held).
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        // SAFETY: `ctx` is a `*mut PacketHandler` this loader registered, freed only after
        // the library's deinit; `request` is valid for this call (the ABI).
        let (handler, request) = unsafe { (&*ctx.cast::<PacketHandler>(), request.as_ref()) };
        // SAFETY: the request's buffers are valid and ours for this call (the ABI).
        if let Some(mut request) = request.and_then(|r| unsafe { r.as_request() }) {
            handler(&mut request);
        }
    }));
    if let Err(payload) = result {
        log::error!(
            "a packet handler panicked: {}",
            rpc_core::plugin::panic_message(payload.as_ref())
        );
    }
}

impl Runtime for LoadedPlugin {
    fn plugin_name(&self) -> &'static str {
        self.name
    }
    fn device_count(&self) -> usize {
        match self.live() {
            // SAFETY: a live plugin pointer (the ABI).
            Ok(plugin) => unsafe { (self.table.device_count)(plugin) as usize },
            Err(_) => 0,
        }
    }
    fn device_name(&self, device: usize) -> Option<String> {
        let plugin = self.live().ok()?;
        let device = u32::try_from(device).ok()?;
        // SAFETY: a live plugin pointer and a buffer of `len` bytes (the ABI).
        self.text(|buf, len| unsafe { (self.table.device_name)(plugin, device, buf, len) })
    }
    fn reason(&self) -> Option<String> {
        let Ok(plugin) = self.live() else {
            return Some("the plugin was deinitialised".into());
        };
        // SAFETY: a live plugin pointer and a buffer of `len` bytes (the ABI).
        self.text(|buf, len| unsafe { (self.table.no_device_reason)(plugin, buf, len) })
    }
    fn register_packet_handler(&self, opcode: Opcode, handler: PacketHandler) {
        let Ok(plugin) = self.live() else {
            log::warn!(
                "{}: handler for {opcode} not registered: deinitialised",
                self.name
            );
            return;
        };
        let ctx = Box::into_raw(HandlerBox::new(handler));
        // SAFETY: a live plugin pointer; `trampoline` and `ctx` stay valid until after the
        // library's deinit (`ctx` is freed in `deinit`).
        let code =
            unsafe { (self.table.register_handler)(plugin, opcode.0, trampoline, ctx.cast()) };
        let mut handlers = self.handlers.lock().unwrap_or_else(|e| e.into_inner());
        handlers.push(ctx);
        if let Err(error) = self.check("register handler", code) {
            log::error!("{error}");
        }
    }
    fn start_server(&self) -> Result<Started> {
        // SAFETY: a live plugin pointer (the ABI).
        let code = unsafe { (self.table.start_server)(self.live()?) };
        Ok(match self.check("start server", code)? {
            RPC_ALREADY_RUNNING => Started::AlreadyRunning,
            _ => Started::Started,
        })
    }
    fn shutdown_server(&self) -> Result<Stopped> {
        // SAFETY: a live plugin pointer (the ABI).
        let code = unsafe { (self.table.shutdown_server)(self.live()?) };
        Ok(match self.check("shut down server", code)? {
            RPC_ALREADY_STOPPED => Stopped::AlreadyStopped,
            _ => Stopped::Stopped,
        })
    }
    fn stats(&self) -> StatsSnapshot {
        let Ok(plugin) = self.live() else {
            return StatsSnapshot::default();
        };
        let mut stats = RpcStats::default();
        let mut served = vec![RpcServedCount::default(); 64];
        loop {
            // SAFETY: a live plugin pointer, an out pointer and room for `served.len()`.
            let n = unsafe {
                (self.table.stats)(plugin, &mut stats, served.as_mut_ptr(), served.len())
            };
            if n <= served.len() {
                served.truncate(n);
                return stats.snapshot(&served);
            }
            served.resize(n, RpcServedCount::default());
        }
    }
    fn load_image(&self, device: usize, bytes: &[u8]) -> Result<ImageId> {
        let device = self.device_index(device)?;
        let mut image = 0u64;
        // SAFETY: a live plugin pointer, `bytes` valid for its length, an out pointer.
        let code = unsafe {
            (self.table.load_image)(
                self.live()?,
                device,
                bytes.as_ptr(),
                bytes.len(),
                &mut image,
            )
        };
        self.check("load image", code)?;
        Ok(ImageId::from_index(image as usize))
    }
    fn mailbox(&self, image: ImageId) -> Option<MailboxId> {
        let mut id = 0u64;
        // SAFETY: a live plugin pointer and an out pointer.
        let code =
            unsafe { (self.table.mailbox)(self.live().ok()?, image.index() as u64, &mut id) };
        (code == RPC_OK).then_some(MailboxId(id))
    }
    fn launch(&self, image: ImageId, kernel: &str, args: &[u8], grid: Grid) -> Result<()> {
        let kernel = CString::new(kernel).map_err(|_| {
            PluginError::NotFound(format!("no kernel {kernel:?} (a NUL in its name)"))
        })?;
        let grid = RpcGrid::from(grid);
        // SAFETY: a live plugin pointer, a NUL-terminated name, `args` valid for its length
        // and a grid (the ABI).
        let code = unsafe {
            (self.table.launch)(
                self.live()?,
                image.index() as u64,
                kernel.as_ptr(),
                args.as_ptr(),
                args.len(),
                &grid,
            )
        };
        self.check("launch", code).map(drop)
    }
    fn synchronize(&self, device: usize) -> Result<Option<KernelExit>> {
        let device = self.device_index(device)?;
        let mut exit = RpcKernelExit::default();
        // SAFETY: a live plugin pointer and an out pointer.
        let code = unsafe { (self.table.synchronize)(self.live()?, device, &mut exit) };
        self.check("synchronize", code)?;
        Ok(match exit.kind {
            RPC_EXIT_EXIT => Some(KernelExit::Exit(exit.status)),
            RPC_EXIT_ABORT => Some(KernelExit::Abort),
            _ => None,
        })
    }
    fn find_symbol(&self, image: ImageId, name: &str) -> Option<Symbol> {
        let plugin = self.live().ok()?;
        let name = CString::new(name).ok()?;
        let (mut addr, mut size) = (0u64, 0usize);
        // SAFETY: a live plugin pointer, a NUL-terminated name and out pointers.
        let code = unsafe {
            (self.table.find_symbol)(
                plugin,
                image.index() as u64,
                name.as_ptr(),
                &mut addr,
                &mut size,
            )
        };
        (code == RPC_OK).then_some(Symbol { addr, size })
    }
    fn alloc_shared(&self, device: usize, len: usize) -> Result<Box<dyn SharedRegion>> {
        let device = self.device_index(device)?;
        let mut region = std::ptr::null_mut();
        let mut info = RpcRegionInfo {
            host_ptr: std::ptr::null_mut(),
            device_addr: 0,
            len: 0,
        };
        // SAFETY: a live plugin pointer and out pointers.
        let code =
            unsafe { (self.table.alloc_shared)(self.live()?, device, len, &mut region, &mut info) };
        self.check("allocate shared memory", code)?;
        Ok(Box::new(LoadedRegion {
            region,
            info,
            free: self.table.free_shared,
        }))
    }
    fn copy_to_device(&self, device: usize, dst: u64, bytes: &[u8]) -> Result<()> {
        let device = self.device_index(device)?;
        // SAFETY: a live plugin pointer and `bytes` valid for its length.
        let code = unsafe {
            (self.table.copy_to_device)(self.live()?, device, dst, bytes.as_ptr(), bytes.len())
        };
        self.check("copy to device", code).map(drop)
    }
    fn copy_from_device(&self, device: usize, src: u64, out: &mut [u8]) -> Result<()> {
        let device = self.device_index(device)?;
        // SAFETY: a live plugin pointer and `out` valid for its length.
        let code = unsafe {
            (self.table.copy_from_device)(self.live()?, device, src, out.as_mut_ptr(), out.len())
        };
        self.check("copy from device", code).map(drop)
    }
    fn deinit(&mut self) -> Result<()> {
        if self.plugin.is_null() {
            return Ok(());
        }
        let plugin = std::mem::replace(&mut self.plugin, std::ptr::null_mut());
        // SAFETY: a live plugin pointer, freed by this call (the ABI), never used again.
        let code = unsafe { (self.table.deinit)(plugin) };
        // The library's server is gone: nothing calls the handlers any more.
        let handlers = std::mem::take(self.handlers.get_mut().unwrap_or_else(|e| e.into_inner()));
        for handler in handlers {
            // SAFETY: made by `Box::into_raw` in `register_packet_handler`, freed once here.
            drop(unsafe { Box::from_raw(handler) });
        }
        self.check("deinit", code).map(drop)
    }
}

impl Drop for LoadedPlugin {
    fn drop(&mut self) {
        if let Err(error) = self.deinit() {
            log::error!("{}: deinit failed: {error}", self.name);
        }
    }
}

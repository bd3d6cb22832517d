//! The functions behind a plugin library's table, generic over the [`Loadable`] plugin: each
//! wraps [`PluginRuntime`]'s method of the same name, runs it under `catch_unwind` (a panic
//! becomes [`RPC_ERR_PANIC`], never an unwind into C) and turns an error into its code and
//! this thread's last error message.

use std::cell::RefCell;
use std::ffi::{c_char, c_void, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use rpc_core::plugin::panic_message;
use rpc_core::KernelExit;
use rpc_core::{
    Error, ExitPolicy, ImageId, Opcode, PluginError, PluginRuntime, ProtocolError, Runtime,
    ServerConfig, ServerError, Started, Stopped,
};

use crate::*;

thread_local! {
    /// The message of this thread's last failed call (see `RpcPluginTable::last_error`).
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

/// Records `message` as this thread's last error.
fn set_last_error(message: String) {
    // A message with a NUL in it is cut there rather than lost.
    let message = CString::new(message).unwrap_or_else(|e| {
        let end = e.nul_position();
        CString::new(&e.into_vec()[..end]).unwrap_or_default()
    });
    LAST_ERROR.with(|last| *last.borrow_mut() = message);
}

/// The code an error crosses the ABI as.
pub fn code_of(error: &Error) -> i32 {
    match error {
        Error::Plugin(PluginError::NotFound(_)) | Error::Server(ServerError::NoSuchMailbox(_)) => {
            RPC_ERR_NOT_FOUND
        }
        Error::Server(ServerError::Deinitialised) => RPC_ERR_DEINITIALISED,
        Error::Plugin(PluginError::Vendor { .. }) => RPC_ERR_DEVICE,
        Error::Protocol(
            ProtocolError::BadClientObjectSize(_) | ProtocolError::BadGeneration(_),
        ) => RPC_ERR_BAD_IMAGE,
        Error::Plugin(PluginError::KernelsAborted(_)) => RPC_ERR_KERNELS_ABORTED,
        _ => RPC_ERR_OTHER,
    }
}

/// A failure of one call: its code and message.
struct Failure(i32, String);

impl From<Error> for Failure {
    fn from(error: Error) -> Self {
        let message = match &error {
            // The vendor's own words only: the caller knows which plugin and which call it
            // made (the Rust loader rebuilds `PLUGIN: CALL: ...` from them), so the prefix is
            // not said twice.
            Error::Plugin(PluginError::Vendor { source, .. }) => source.to_string(),
            _ => error.to_string(),
        };
        Failure(code_of(&error), message)
    }
}

fn invalid(what: &str) -> Failure {
    Failure(RPC_ERR_INVALID, what.into())
}

/// Runs `call` with panics caught; its code, recording the message of a failure.
fn guarded(what: &str, call: impl FnOnce() -> Result<i32, Failure>) -> i32 {
    match catch_unwind(AssertUnwindSafe(call)) {
        Ok(Ok(code)) => code,
        Ok(Err(Failure(code, message))) => {
            set_last_error(message);
            code
        }
        Err(payload) => {
            set_last_error(format!(
                "{what} panicked: {}",
                panic_message(payload.as_ref())
            ));
            RPC_ERR_PANIC
        }
    }
}

/// The runtime `plugin` points to.
///
/// # Safety
/// `plugin` is null or a pointer `init::<P>` made and `deinit` has not freed.
unsafe fn runtime<'a, P: Loadable>(
    plugin: *const RpcPlugin,
) -> Result<&'a PluginRuntime<P>, Failure> {
    // SAFETY: the caller's contract: null or a live `PluginRuntime<P>` boxed by `init`.
    unsafe { plugin.cast::<PluginRuntime<P>>().as_ref() }.ok_or_else(|| invalid("plugin is null"))
}

/// `text` into `buf` as `snprintf` does; its full length.
///
/// # Safety
/// `buf` is null or valid for `len` bytes of writes.
unsafe fn write_text(text: &str, buf: *mut c_char, len: usize) -> usize {
    if !buf.is_null() && len > 0 {
        let n = text.len().min(len - 1);
        // SAFETY: `buf` has room for `len` > n bytes (the caller's contract); `text` is ours.
        unsafe {
            std::ptr::copy_nonoverlapping(text.as_ptr(), buf.cast::<u8>(), n);
            *buf.add(n) = 0;
        }
    }
    text.len()
}

/// The bytes at `ptr`, or an empty slice for a null `ptr` of length 0.
///
/// # Safety
/// `ptr` is null or valid for `len` bytes of reads for `'a`.
unsafe fn bytes<'a>(ptr: *const u8, len: usize, what: &str) -> Result<&'a [u8], Failure> {
    if ptr.is_null() {
        return if len == 0 {
            Ok(&[])
        } else {
            Err(invalid(&format!("{what} is null")))
        };
    }
    // SAFETY: the caller's contract.
    Ok(unsafe { std::slice::from_raw_parts(ptr, len) })
}

unsafe extern "C" fn last_error() -> *const c_char {
    // The pointer stays valid until this thread's next failed call replaces the string.
    LAST_ERROR.with(|last| last.borrow().as_ptr())
}

unsafe extern "C" fn init<P: Loadable>(flags: u32, out: *mut *mut RpcPlugin) -> i32 {
    guarded("init", || {
        if out.is_null() {
            return Err(invalid("init: out is null"));
        }
        if flags & !(RPC_INIT_RECORD_EXIT | RPC_INIT_LOADER_SETTINGS) != 0 {
            return Err(invalid(&format!("init: unknown flags {flags:#x}")));
        }
        let mut config = ServerConfig::default();
        if flags & RPC_INIT_RECORD_EXIT != 0 {
            config.services.exit = ExitPolicy::Record;
        }
        let runtime = PluginRuntime::new(P::for_library(), config)?;
        if flags & RPC_INIT_LOADER_SETTINGS != 0 {
            P::prepare_for_loader(&runtime)?;
        }
        // SAFETY: `out` is non-null and, by the ABI, valid for a write.
        unsafe { *out = Box::into_raw(Box::new(runtime)).cast() };
        Ok(RPC_OK)
    })
}

unsafe extern "C" fn device_count<P: Loadable>(plugin: *const RpcPlugin) -> u32 {
    let count = guarded("device_count", || {
        // SAFETY: the ABI's contract on `plugin`.
        let runtime = unsafe { runtime::<P>(plugin) }?;
        Ok(i32::try_from(runtime.device_count()).unwrap_or(i32::MAX))
    });
    count.max(0) as u32
}

unsafe extern "C" fn device_name<P: Loadable>(
    plugin: *const RpcPlugin,
    device: u32,
    buf: *mut c_char,
    len: usize,
) -> usize {
    let name = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: the ABI's contract on `plugin`.
        let runtime = unsafe { runtime::<P>(plugin) }.ok()?;
        runtime.device_name(device as usize)
    }));
    match name {
        // SAFETY: the ABI's contract on `buf`.
        Ok(Some(name)) => unsafe { write_text(&name, buf, len) },
        _ => 0,
    }
}

unsafe extern "C" fn no_device_reason<P: Loadable>(
    plugin: *const RpcPlugin,
    buf: *mut c_char,
    len: usize,
) -> usize {
    let reason = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: the ABI's contract on `plugin`.
        let runtime = unsafe { runtime::<P>(plugin) }.ok()?;
        Runtime::reason(runtime)
    }));
    match reason {
        // SAFETY: the ABI's contract on `buf`.
        Ok(Some(reason)) => unsafe { write_text(&reason, buf, len) },
        _ => 0,
    }
}

unsafe extern "C" fn load_image<P: Loadable>(
    plugin: *const RpcPlugin,
    device: u32,
    image: *const u8,
    len: usize,
    out: *mut u64,
) -> i32 {
    guarded("load_image", || {
        // SAFETY: the ABI's contract on `plugin` and `image`.
        let (runtime, image) = unsafe { (runtime::<P>(plugin)?, bytes(image, len, "image")?) };
        if out.is_null() {
            return Err(invalid("load_image: out is null"));
        }
        let id = runtime.load_image(device as usize, image)?;
        // SAFETY: `out` is non-null and valid for a write (the ABI).
        unsafe { *out = id.index() as u64 };
        Ok(RPC_OK)
    })
}

unsafe extern "C" fn mailbox<P: Loadable>(
    plugin: *const RpcPlugin,
    image: u64,
    out: *mut u64,
) -> i32 {
    guarded("mailbox", || {
        // SAFETY: the ABI's contract on `plugin`.
        let runtime = unsafe { runtime::<P>(plugin) }?;
        if out.is_null() {
            return Err(invalid("mailbox: out is null"));
        }
        let id = runtime
            .mailbox(ImageId::from_index(image as usize))
            .ok_or_else(|| Failure(RPC_ERR_NOT_FOUND, format!("image {image} has no mailbox")))?;
        // SAFETY: `out` is non-null and valid for a write (the ABI).
        unsafe { *out = id.0 };
        Ok(RPC_OK)
    })
}

unsafe extern "C" fn launch<P: Loadable>(
    plugin: *const RpcPlugin,
    image: u64,
    kernel: *const c_char,
    args: *const u8,
    args_len: usize,
    grid: *const RpcGrid,
) -> i32 {
    guarded("launch", || {
        // SAFETY: the ABI's contract on `plugin` and `args`.
        let (runtime, args) = unsafe { (runtime::<P>(plugin)?, bytes(args, args_len, "args")?) };
        if kernel.is_null() || grid.is_null() {
            return Err(invalid("launch: kernel or grid is null"));
        }
        // SAFETY: `kernel` is a NUL-terminated string and `grid` a valid grid (the ABI).
        let (kernel, grid) = unsafe { (CStr::from_ptr(kernel), *grid) };
        let kernel = kernel
            .to_str()
            .map_err(|_| invalid("launch: the kernel's name is not UTF-8"))?;
        runtime.launch(
            ImageId::from_index(image as usize),
            kernel,
            args,
            grid.into(),
        )?;
        Ok(RPC_OK)
    })
}

unsafe extern "C" fn synchronize<P: Loadable>(
    plugin: *const RpcPlugin,
    device: u32,
    out: *mut RpcKernelExit,
) -> i32 {
    guarded("synchronize", || {
        // SAFETY: the ABI's contract on `plugin`.
        let runtime = unsafe { runtime::<P>(plugin) }?;
        let exit = match runtime.synchronize(device as usize)? {
            None => RpcKernelExit::default(),
            Some(KernelExit::Exit(status)) => RpcKernelExit {
                kind: RPC_EXIT_EXIT,
                status,
            },
            Some(KernelExit::Abort) => RpcKernelExit {
                kind: RPC_EXIT_ABORT,
                status: 0,
            },
        };
        if !out.is_null() {
            // SAFETY: `out` is non-null and valid for a write (the ABI).
            unsafe { *out = exit };
        }
        Ok(RPC_OK)
    })
}

unsafe extern "C" fn find_symbol<P: Loadable>(
    plugin: *const RpcPlugin,
    image: u64,
    name: *const c_char,
    addr: *mut u64,
    size: *mut usize,
) -> i32 {
    guarded("find_symbol", || {
        // SAFETY: the ABI's contract on `plugin`.
        let runtime = unsafe { runtime::<P>(plugin) }?;
        if name.is_null() || addr.is_null() || size.is_null() {
            return Err(invalid("find_symbol: a null pointer"));
        }
        // SAFETY: a NUL-terminated string (the ABI).
        let name = unsafe { CStr::from_ptr(name) }
            .to_str()
            .map_err(|_| invalid("find_symbol: the name is not UTF-8"))?;
        let symbol = runtime
            .find_symbol(ImageId::from_index(image as usize), name)
            .ok_or_else(|| Failure(RPC_ERR_NOT_FOUND, format!("image {image} has no `{name}`")))?;
        // SAFETY: non-null out pointers, valid for writes (the ABI).
        unsafe {
            *addr = symbol.addr;
            *size = symbol.size;
        }
        Ok(RPC_OK)
    })
}

unsafe extern "C" fn alloc_shared<P: Loadable>(
    plugin: *const RpcPlugin,
    device: u32,
    len: usize,
    out: *mut *mut RpcRegion,
    info: *mut RpcRegionInfo,
) -> i32 {
    guarded("alloc_shared", || {
        // SAFETY: the ABI's contract on `plugin`.
        let runtime = unsafe { runtime::<P>(plugin) }?;
        if out.is_null() || info.is_null() {
            return Err(invalid("alloc_shared: a null pointer"));
        }
        let region = runtime.alloc_shared(device as usize, len)?;
        let where_ = RpcRegionInfo {
            host_ptr: region.host_ptr(),
            device_addr: region.device_addr(),
            len: region.len(),
        };
        // SAFETY: non-null out pointers, valid for writes (the ABI); the region is boxed
        // again so the C side holds a thin pointer, freed by `free_shared`.
        unsafe {
            *info = where_;
            *out = Box::into_raw(Box::new(region)).cast();
        }
        Ok(RPC_OK)
    })
}

unsafe extern "C" fn free_shared(region: *mut RpcRegion) {
    if region.is_null() {
        return;
    }
    let freed = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: made by `alloc_shared` from this box, freed once (the ABI).
        drop(unsafe { Box::from_raw(region.cast::<Box<dyn rpc_core::plugin::SharedRegion>>()) })
    }));
    if freed.is_err() {
        log::error!("free_shared: the region's drop panicked");
    }
}

unsafe extern "C" fn copy_to_device<P: Loadable>(
    plugin: *const RpcPlugin,
    device: u32,
    dst: u64,
    src: *const u8,
    len: usize,
) -> i32 {
    guarded("copy_to_device", || {
        // SAFETY: the ABI's contract on `plugin` and `src`.
        let (runtime, src) = unsafe { (runtime::<P>(plugin)?, bytes(src, len, "src")?) };
        runtime.copy_to_device(device as usize, dst, src)?;
        Ok(RPC_OK)
    })
}

unsafe extern "C" fn copy_from_device<P: Loadable>(
    plugin: *const RpcPlugin,
    device: u32,
    src: u64,
    dst: *mut u8,
    len: usize,
) -> i32 {
    guarded("copy_from_device", || {
        // SAFETY: the ABI's contract on `plugin`.
        let runtime = unsafe { runtime::<P>(plugin) }?;
        if dst.is_null() && len > 0 {
            return Err(invalid("copy_from_device: dst is null"));
        }
        let mut out = vec![0u8; len];
        runtime.copy_from_device(device as usize, src, &mut out)?;
        if len > 0 {
            // SAFETY: `dst` is valid for `len` bytes of writes (the ABI).
            unsafe { std::ptr::copy_nonoverlapping(out.as_ptr(), dst, len) };
        }
        Ok(RPC_OK)
    })
}

/// A C handler and its context, called on the server thread.
struct CHandler {
    handler: RpcHandlerFn,
    ctx: *mut c_void,
}

// SAFETY: `register_handler`'s contract: the handler and its `ctx` may be called from the
// server thread, at any time until `deinit` returns.
unsafe impl Send for CHandler {}
// SAFETY: as above; the server calls a handler from its one worker thread.
unsafe impl Sync for CHandler {}

impl CHandler {
    fn call(&self, request: &mut rpc_core::PacketRequest<'_>) {
        let mut request = RpcPacketRequest::of(request);
        // SAFETY: the handler's contract (the ABI): it is given a request whose buffers are
        // valid for this call, with the context it was registered with.
        unsafe { (self.handler)(self.ctx, &mut request) }
    }
}

unsafe extern "C" fn register_handler<P: Loadable>(
    plugin: *const RpcPlugin,
    opcode: u32,
    handler: RpcHandlerFn,
    ctx: *mut c_void,
) -> i32 {
    guarded("register_handler", || {
        // SAFETY: the ABI's contract on `plugin`.
        let runtime = unsafe { runtime::<P>(plugin) }?;
        let handler = CHandler { handler, ctx };
        runtime.register_packet_handler(
            Opcode(opcode),
            Arc::new(move |request| handler.call(request)),
        );
        Ok(RPC_OK)
    })
}

unsafe extern "C" fn start_server<P: Loadable>(plugin: *const RpcPlugin) -> i32 {
    guarded("start_server", || {
        // SAFETY: the ABI's contract on `plugin`.
        Ok(match unsafe { runtime::<P>(plugin) }?.start_server()? {
            Started::Started => RPC_OK,
            Started::AlreadyRunning => RPC_ALREADY_RUNNING,
        })
    })
}

unsafe extern "C" fn shutdown_server<P: Loadable>(plugin: *const RpcPlugin) -> i32 {
    guarded("shutdown_server", || {
        // SAFETY: the ABI's contract on `plugin`.
        Ok(match unsafe { runtime::<P>(plugin) }?.shutdown_server()? {
            Stopped::Stopped => RPC_OK,
            Stopped::AlreadyStopped => RPC_ALREADY_STOPPED,
        })
    })
}

unsafe extern "C" fn stats<P: Loadable>(
    plugin: *const RpcPlugin,
    out: *mut RpcStats,
    served: *mut RpcServedCount,
    cap: usize,
) -> usize {
    let counts = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: the ABI's contract on `plugin`.
        let snapshot = unsafe { runtime::<P>(plugin) }.ok()?.stats();
        if !out.is_null() {
            // SAFETY: `out` is non-null and valid for a write (the ABI).
            unsafe { *out = RpcStats::of(&snapshot) };
        }
        for (i, (opcode, &count)) in snapshot.served.iter().enumerate().take(cap) {
            if served.is_null() {
                break;
            }
            let entry = RpcServedCount {
                opcode: opcode.0,
                count,
            };
            // SAFETY: `served` has room for `cap` > i entries (the ABI).
            unsafe { *served.add(i) = entry };
        }
        Some(snapshot.served.len())
    }));
    counts.ok().flatten().unwrap_or(0)
}

unsafe extern "C" fn deinit<P: Loadable>(plugin: *mut RpcPlugin) -> i32 {
    guarded("deinit", || {
        if plugin.is_null() {
            return Err(invalid("plugin is null"));
        }
        // SAFETY: `plugin` was made by `init::<P>` from a `Box` and is freed only here (the ABI).
        let mut runtime = unsafe { Box::from_raw(plugin.cast::<PluginRuntime<P>>()) };
        runtime.deinit()?;
        Ok(RPC_OK)
    })
}

/// The table of plugin `P`, as [`crate::export_plugin!`] exports it.
pub const fn table<P: Loadable>() -> RpcPluginTable {
    RpcPluginTable {
        abi_version: RPC_PLUGIN_ABI_VERSION,
        name: P::NAME.as_ptr(),
        last_error,
        init: init::<P>,
        device_count: device_count::<P>,
        device_name: device_name::<P>,
        no_device_reason: no_device_reason::<P>,
        load_image: load_image::<P>,
        mailbox: mailbox::<P>,
        launch: launch::<P>,
        synchronize: synchronize::<P>,
        find_symbol: find_symbol::<P>,
        alloc_shared: alloc_shared::<P>,
        free_shared,
        copy_to_device: copy_to_device::<P>,
        copy_from_device: copy_from_device::<P>,
        register_handler: register_handler::<P>,
        start_server: start_server::<P>,
        shutdown_server: shutdown_server::<P>,
        stats: stats::<P>,
        deinit: deinit::<P>,
    }
}

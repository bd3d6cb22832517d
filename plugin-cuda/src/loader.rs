//! The CUDA driver, loaded at run time (STYLE 11).
//!
//! [`DriverApi`] is the typed table of the only driver functions this plugin uses, with Rust
//! signatures (slices, `CStr`, `Result<_, code>`). [`LibCuda`] implements it over `libcuda`
//! opened with `libloading`, every symbol resolved up front: a missing library or symbol is an
//! `Err(reason)` that the plugin reports as zero devices, never a panic. Tests implement the
//! same trait with a fake driver.
//!
//! The function-pointer types come from cudarc's `driver::sys` bindings, and a compile-time
//! assertion per function checks that our signature is the one cudarc's bindgen produced from
//! `cuda.h`. We do not call cudarc's own wrappers, for two reasons:
//! - they resolve each symbol lazily on first call and panic when `libcuda` or the symbol is
//!   missing (`culib()` and `load()` in `cudarc::driver::sys`), so "no driver" would be a panic
//!   at an arbitrary later call instead of zero devices at `init`;
//! - they return `CUresult` as a Rust enum; a newer driver returning a code the enum lacks
//!   would be undefined behaviour. Our table declares the return as `c_int`, which has the
//!   same ABI as the C enum, and names codes through `cuGetErrorName`.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::sync::{Arc, OnceLock};

use cudarc::driver::sys;
use libloading::Library;
use rpc_core::plugin::Grid;

/// A driver status other than `CUDA_SUCCESS`.
pub type Code = i32;
/// What every [`DriverApi`] call returns.
pub type DriverResult<T> = Result<T, Code>;

/// `CUdevice`: a device ordinal handle.
pub type CuDevice = sys::CUdevice;
/// The device attributes this plugin reads.
pub use sys::CUdevice_attribute as Attribute;
/// The host function the driver calls after the work queued before it (`CUhostFn`).
pub type HostFn = unsafe extern "C" fn(*mut c_void);

macro_rules! handle {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        ///
        /// An opaque driver handle, kept as an integer: this crate never dereferences it.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub struct $name(pub usize);
    };
}
handle!(
    /// `CUcontext`.
    Context
);
handle!(
    /// `CUmodule`.
    Module
);
handle!(
    /// `CUfunction`.
    Function
);
handle!(
    /// `CUstream`.
    Stream
);

/// `CU_MEMHOSTALLOC_PORTABLE`: the pinned memory is pinned for every context.
pub const MEMHOSTALLOC_PORTABLE: u32 = sys::CU_MEMHOSTALLOC_PORTABLE;
/// `CU_MEMHOSTALLOC_DEVICEMAP`: the pinned memory is mapped into the device's address space.
pub const MEMHOSTALLOC_DEVICEMAP: u32 = sys::CU_MEMHOSTALLOC_DEVICEMAP;
/// `CU_STREAM_DEFAULT`: a stream ordered with the legacy default stream.
pub const STREAM_DEFAULT: u32 = 0;
/// `CU_STREAM_NON_BLOCKING`: a stream not ordered with the legacy default stream.
pub const STREAM_NON_BLOCKING: u32 = 1;
/// Bytes of the JIT error log kept when a module fails to load (ptxas's messages are a few
/// lines; more is cut).
const JIT_LOG_BYTES: usize = 16 * 1024;

/// The driver functions the plugin uses, as safe Rust where the call cannot break memory safety
/// on the host and `unsafe` where it can. Every method is one driver call; `Err(code)` is the
/// `CUresult` it returned. Calls that use a context need it current on the calling thread
/// ([`DriverApi::ctx_set_current`]).
pub trait DriverApi: Send + Sync {
    /// `cuInit(0)`.
    fn init(&self) -> DriverResult<()>;
    /// `cuDeviceGetCount`.
    fn device_count(&self) -> DriverResult<i32>;
    /// `cuDeviceGet`.
    fn device_get(&self, ordinal: i32) -> DriverResult<CuDevice>;
    /// `cuDeviceGetName`.
    fn device_name(&self, device: CuDevice) -> DriverResult<String>;
    /// `cuDeviceGetAttribute`.
    fn device_attribute(&self, device: CuDevice, attribute: Attribute) -> DriverResult<i32>;
    /// `cuDevicePrimaryCtxRetain`.
    fn primary_ctx_retain(&self, device: CuDevice) -> DriverResult<Context>;
    /// `cuDevicePrimaryCtxRelease_v2`.
    fn primary_ctx_release(&self, device: CuDevice) -> DriverResult<()>;
    /// `cuDevicePrimaryCtxReset_v2`: destroys the primary context's state, ending the work in
    /// flight (the retain count is unchanged).
    fn primary_ctx_reset(&self, device: CuDevice) -> DriverResult<()>;
    /// `cuCtxSetCurrent`.
    fn ctx_set_current(&self, context: Context) -> DriverResult<()>;
    /// `cuCtxSetLimit(CU_LIMIT_STACK_SIZE, bytes)` on the current context: the stack of each
    /// GPU thread.
    fn ctx_set_stack_limit(&self, bytes: usize) -> DriverResult<()>;

    /// `cuMemHostAlloc`: `len` bytes of page-locked host memory.
    fn mem_host_alloc(&self, len: usize, flags: u32) -> DriverResult<*mut u8>;
    /// `cuMemFreeHost`.
    ///
    /// # Safety
    /// `ptr` came from [`DriverApi::mem_host_alloc`], is not freed yet, and nothing uses the
    /// memory any more (no host reference, no running kernel).
    unsafe fn mem_free_host(&self, ptr: *mut u8) -> DriverResult<()>;
    /// `cuMemHostGetDevicePointer_v2`: the device address of mapped pinned memory.
    fn mem_host_get_device_pointer(&self, ptr: *mut u8) -> DriverResult<u64>;
    /// `cuMemAlloc_v2`.
    fn mem_alloc(&self, size: usize) -> DriverResult<u64>;
    /// `cuMemFree_v2`. The driver rejects addresses it did not allocate.
    fn mem_free(&self, addr: u64) -> DriverResult<()>;
    /// `cuMemAllocAsync` on `stream` (stream-ordered, from the device's default pool).
    fn mem_alloc_async(&self, size: usize, stream: Stream) -> DriverResult<u64>;
    /// `cuMemFreeAsync` on `stream`.
    fn mem_free_async(&self, addr: u64, stream: Stream) -> DriverResult<()>;

    /// `cuModuleLoadDataEx` with an error log buffer (`CU_JIT_ERROR_LOG_BUFFER`): the module,
    /// or the status code and what the JIT (or the cubin loader) wrote to the log.
    ///
    /// # Safety
    /// `image` is a whole cubin or fatbin (the driver reads as far as its headers say), or PTX
    /// text ending in a NUL byte (the driver reads up to the first NUL).
    unsafe fn module_load_data(&self, image: &[u8]) -> Result<Module, (Code, String)>;
    /// `cuModuleUnload`.
    fn module_unload(&self, module: Module) -> DriverResult<()>;
    /// `cuModuleGetGlobal_v2`: device address and size of a global variable.
    fn module_get_global(&self, module: Module, name: &CStr) -> DriverResult<(u64, usize)>;
    /// `cuModuleGetFunction`.
    fn module_get_function(&self, module: Module, name: &CStr) -> DriverResult<Function>;

    /// `cuMemcpyHtoD_v2`.
    ///
    /// # Safety
    /// `dst..dst + src.len()` is device-visible memory that no live Rust reference covers (for
    /// mapped host memory, the device address aliases host memory).
    unsafe fn memcpy_htod(&self, dst: u64, src: &[u8]) -> DriverResult<()>;
    /// `cuMemcpyDtoH_v2`.
    ///
    /// # Safety
    /// `src..src + dst.len()` is device-visible memory (the driver rejects unknown ranges).
    unsafe fn memcpy_dtoh(&self, dst: &mut [u8], src: u64) -> DriverResult<()>;

    /// `cuStreamCreate`.
    fn stream_create(&self, flags: u32) -> DriverResult<Stream>;
    /// `cuStreamDestroy_v2`.
    fn stream_destroy(&self, stream: Stream) -> DriverResult<()>;
    /// `cuStreamSynchronize`: waits for the stream's work; reports a failed kernel.
    fn stream_synchronize(&self, stream: Stream) -> DriverResult<()>;

    /// `cuLaunchKernel` with `args` passed as one packed buffer through `extra`
    /// (`CU_LAUNCH_PARAM_BUFFER_POINTER` / `_SIZE` / `_END`); the driver copies it at launch.
    ///
    /// # Safety
    /// `args` has the layout of `function`'s parameters, and the kernel, run with them, only
    /// touches memory it may (device allocations, mapped regions that are still alive).
    unsafe fn launch_kernel(
        &self,
        function: Function,
        grid: Grid,
        stream: Stream,
        args: &[u8],
    ) -> DriverResult<()>;
    /// `cuLaunchHostFunc`: calls `function(data)` on a driver thread once the work queued on
    /// `stream` before it has completed. The driver does not call it when the context has
    /// failed (a faulted kernel), and never when this returns `Err`.
    ///
    /// # Safety
    /// Calling `function(data)` once, from any thread, at any later time, is sound.
    unsafe fn launch_host_func(
        &self,
        stream: Stream,
        function: HostFn,
        data: *mut c_void,
    ) -> DriverResult<()>;

    /// `cuGetErrorName`, or `None` when the driver does not know the code.
    fn error_name(&self, code: Code) -> Option<String>;
}

/// The library names tried, in order.
#[cfg(windows)]
pub const LIBRARY_NAMES: &[&str] = &["nvcuda.dll"];
/// The library names tried, in order.
#[cfg(not(windows))]
pub const LIBRARY_NAMES: &[&str] = &["libcuda.so.1", "libcuda.so"];

/// The system's driver, loaded once per process; `Err` says why there is none.
pub fn system_driver() -> Result<Arc<dyn DriverApi>, String> {
    static DRIVER: OnceLock<Result<Arc<LibCuda>, String>> = OnceLock::new();
    match DRIVER.get_or_init(|| LibCuda::open(LIBRARY_NAMES).map(Arc::new)) {
        Ok(driver) => Ok(driver.clone()),
        Err(reason) => Err(reason.clone()),
    }
}

/// Status from a driver call's `c_int` return.
fn check(code: c_int) -> DriverResult<()> {
    if code == 0 {
        Ok(())
    } else {
        Err(code)
    }
}

macro_rules! driver_table {
    ($($(#[$raw:ident])? $name:ident($($arg:ty),* $(,)?);)*) => {
        /// The driver's entry points, resolved once from the library. Returns are `c_int`
        /// (`CUresult`'s ABI, without trusting the driver to return only known codes).
        #[allow(non_snake_case)]
        struct Table {
            $($name: unsafe extern "C" fn($($arg),*) -> c_int,)*
        }

        impl Table {
            /// Resolves every entry point, or names the first missing one.
            ///
            /// # Safety
            /// `lib` is the CUDA driver: each symbol named here is a function of the type given
            /// here (checked against cudarc's bindings below, the return aside).
            unsafe fn load(lib: &Library) -> Result<Table, String> {
                Ok(Table {
                    $($name: {
                        let symbol = concat!(stringify!($name), "\0").as_bytes();
                        // SAFETY: the caller guarantees the symbol has this function type.
                        let function = unsafe {
                            lib.get::<unsafe extern "C" fn($($arg),*) -> c_int>(symbol)
                        };
                        *function.map_err(|_| format!("missing symbol {}", stringify!($name)))?
                    },)*
                })
            }
        }

        $(driver_table!(@check $($raw)? $name($($arg),*));)*
    };
    (@check raw $name:ident($($arg:ty),*)) => {};
    (@check $name:ident($($arg:ty),*)) => {
        // Our parameter types are those of cudarc's bindings of cuda.h.
        const _: unsafe fn($($arg),*) -> sys::CUresult = sys::$name;
    };
}

driver_table! {
    cuInit(c_uint);
    cuDeviceGetCount(*mut c_int);
    cuDeviceGet(*mut sys::CUdevice, c_int);
    cuDeviceGetName(*mut c_char, c_int, sys::CUdevice);
    cuDeviceGetAttribute(*mut c_int, sys::CUdevice_attribute, sys::CUdevice);
    cuDevicePrimaryCtxRetain(*mut sys::CUcontext, sys::CUdevice);
    cuDevicePrimaryCtxRelease_v2(sys::CUdevice);
    cuDevicePrimaryCtxReset_v2(sys::CUdevice);
    cuCtxSetCurrent(sys::CUcontext);
    cuCtxSetLimit(sys::CUlimit, usize);
    cuMemHostAlloc(*mut *mut c_void, usize, c_uint);
    cuMemFreeHost(*mut c_void);
    cuMemHostGetDevicePointer_v2(*mut sys::CUdeviceptr, *mut c_void, c_uint);
    cuMemAlloc_v2(*mut sys::CUdeviceptr, usize);
    cuMemFree_v2(sys::CUdeviceptr);
    cuMemAllocAsync(*mut sys::CUdeviceptr, usize, sys::CUstream);
    cuMemFreeAsync(sys::CUdeviceptr, sys::CUstream);
    cuModuleLoadDataEx(
        *mut sys::CUmodule, *const c_void, c_uint, *mut sys::CUjit_option, *mut *mut c_void,
    );
    cuModuleUnload(sys::CUmodule);
    cuModuleGetGlobal_v2(*mut sys::CUdeviceptr, *mut usize, sys::CUmodule, *const c_char);
    cuModuleGetFunction(*mut sys::CUfunction, sys::CUmodule, *const c_char);
    cuMemcpyHtoD_v2(sys::CUdeviceptr, *const c_void, usize);
    cuMemcpyDtoH_v2(*mut c_void, sys::CUdeviceptr, usize);
    cuStreamCreate(*mut sys::CUstream, c_uint);
    cuStreamDestroy_v2(sys::CUstream);
    cuStreamSynchronize(sys::CUstream);
    cuLaunchKernel(
        sys::CUfunction, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint,
        sys::CUstream, *mut *mut c_void, *mut *mut c_void,
    );
    cuLaunchHostFunc(sys::CUstream, sys::CUhostFn, *mut c_void);
    // Takes the code as `c_int`, not cudarc's enum, so any code can be asked about.
    #[raw] cuGetErrorName(c_int, *mut *const c_char);
}

/// The real driver: `libcuda` and its resolved table. The library stays loaded as long as the
/// table exists, so the function pointers stay valid.
pub struct LibCuda {
    table: Table,
    name: String,
    _library: Library,
}

impl std::fmt::Debug for LibCuda {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LibCuda")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl LibCuda {
    /// Opens the first of `names` that loads and resolves the table from it. `Err` is the
    /// reason there is no driver: `libcuda.so.1 not found`, or
    /// `missing symbol cuLaunchHostFunc in libcuda.so.1` (a driver older than CUDA 11.2).
    /// A library that is there but does not load (a broken install, a missing dependency, the
    /// wrong architecture) says so with the loader's own message, not "not found".
    pub fn open(names: &[&str]) -> Result<LibCuda, String> {
        let mut broken = None;
        for &name in names {
            // SAFETY: loading a library runs its initialisers; libcuda's (and any library
            // installed under these names) are the vendor's and are meant to be loaded so.
            let library = match unsafe { Library::new(name) } {
                Ok(library) => library,
                Err(error) => {
                    // libloading's own text is "dlopen failed"; the reason is its source.
                    let error = match std::error::Error::source(&error) {
                        Some(source) => source.to_string(),
                        None => error.to_string(),
                    };
                    log::debug!("cuda: cannot load {name}: {error}");
                    // dlerror's text for "no such file": the one failure that means absent.
                    if !error.contains("No such file or directory") && broken.is_none() {
                        broken = Some(format!("cannot load {name}: {error}"));
                    }
                    continue;
                }
            };
            // SAFETY: a library under a CUDA driver name exports the driver API; the table's
            // types are checked against cudarc's bindings of cuda.h.
            let table = unsafe { Table::load(&library) }.map_err(|e| format!("{e} in {name}"))?;
            return Ok(LibCuda {
                table,
                name: name.to_owned(),
                _library: library,
            });
        }
        Err(broken.unwrap_or_else(|| {
            format!("{} not found", names.first().copied().unwrap_or("libcuda"))
        }))
    }

    /// The library name that was loaded.
    pub fn name(&self) -> &str {
        &self.name
    }
}

fn raw<T>(handle: usize) -> *mut T {
    handle as *mut T
}

// Each method below makes one call through the table. The common argument for every `unsafe`
// block: the function pointer is the driver's entry point of exactly this type (`Table::load`),
// and the library is loaded while `self` exists. Per call, the pointer arguments are added.
impl DriverApi for LibCuda {
    fn init(&self) -> DriverResult<()> {
        // SAFETY: no pointer arguments.
        check(unsafe { (self.table.cuInit)(0) })
    }

    fn device_count(&self) -> DriverResult<i32> {
        let mut count = 0;
        // SAFETY: `count` is a valid out-parameter.
        check(unsafe { (self.table.cuDeviceGetCount)(&mut count) })?;
        Ok(count)
    }

    fn device_get(&self, ordinal: i32) -> DriverResult<CuDevice> {
        let mut device = 0;
        // SAFETY: `device` is a valid out-parameter.
        check(unsafe { (self.table.cuDeviceGet)(&mut device, ordinal) })?;
        Ok(device)
    }

    fn device_name(&self, device: CuDevice) -> DriverResult<String> {
        let mut buffer = [0 as c_char; 256];
        // SAFETY: the driver writes at most `len` bytes, NUL included, into `buffer`.
        check(unsafe {
            (self.table.cuDeviceGetName)(buffer.as_mut_ptr(), buffer.len() as c_int, device)
        })?;
        let bytes: Vec<u8> = buffer
            .iter()
            .take_while(|&&c| c != 0)
            .map(|&c| c as u8)
            .collect();
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }

    fn device_attribute(&self, device: CuDevice, attribute: Attribute) -> DriverResult<i32> {
        let mut value = 0;
        // SAFETY: `value` is a valid out-parameter; `attribute` is a valid enum value.
        check(unsafe { (self.table.cuDeviceGetAttribute)(&mut value, attribute, device) })?;
        Ok(value)
    }

    fn primary_ctx_retain(&self, device: CuDevice) -> DriverResult<Context> {
        let mut context = std::ptr::null_mut();
        // SAFETY: `context` is a valid out-parameter.
        check(unsafe { (self.table.cuDevicePrimaryCtxRetain)(&mut context, device) })?;
        Ok(Context(context as usize))
    }

    fn primary_ctx_release(&self, device: CuDevice) -> DriverResult<()> {
        // SAFETY: no pointer arguments.
        check(unsafe { (self.table.cuDevicePrimaryCtxRelease_v2)(device) })
    }

    fn primary_ctx_reset(&self, device: CuDevice) -> DriverResult<()> {
        // SAFETY: no pointer arguments.
        check(unsafe { (self.table.cuDevicePrimaryCtxReset_v2)(device) })
    }

    fn ctx_set_current(&self, context: Context) -> DriverResult<()> {
        // SAFETY: the handle is passed back to the driver as it gave it.
        check(unsafe { (self.table.cuCtxSetCurrent)(raw(context.0)) })
    }

    fn ctx_set_stack_limit(&self, bytes: usize) -> DriverResult<()> {
        // SAFETY: no pointer arguments.
        check(unsafe { (self.table.cuCtxSetLimit)(sys::CUlimit::CU_LIMIT_STACK_SIZE, bytes) })
    }

    fn mem_host_alloc(&self, len: usize, flags: u32) -> DriverResult<*mut u8> {
        let mut ptr = std::ptr::null_mut();
        // SAFETY: `ptr` is a valid out-parameter.
        check(unsafe { (self.table.cuMemHostAlloc)(&mut ptr, len, flags) })?;
        Ok(ptr.cast())
    }

    unsafe fn mem_free_host(&self, ptr: *mut u8) -> DriverResult<()> {
        // SAFETY: the caller guarantees `ptr` is a live pinned allocation nobody uses.
        check(unsafe { (self.table.cuMemFreeHost)(ptr.cast()) })
    }

    fn mem_host_get_device_pointer(&self, ptr: *mut u8) -> DriverResult<u64> {
        let mut addr = 0;
        // SAFETY: `addr` is a valid out-parameter; the driver only looks `ptr` up.
        check(unsafe { (self.table.cuMemHostGetDevicePointer_v2)(&mut addr, ptr.cast(), 0) })?;
        Ok(addr)
    }

    fn mem_alloc(&self, size: usize) -> DriverResult<u64> {
        let mut addr = 0;
        // SAFETY: `addr` is a valid out-parameter.
        check(unsafe { (self.table.cuMemAlloc_v2)(&mut addr, size) })?;
        Ok(addr)
    }

    fn mem_free(&self, addr: u64) -> DriverResult<()> {
        // SAFETY: device memory only; the driver rejects addresses it did not allocate.
        check(unsafe { (self.table.cuMemFree_v2)(addr) })
    }

    fn mem_alloc_async(&self, size: usize, stream: Stream) -> DriverResult<u64> {
        let mut addr = 0;
        // SAFETY: `addr` is a valid out-parameter; the stream handle is the driver's.
        check(unsafe { (self.table.cuMemAllocAsync)(&mut addr, size, raw(stream.0)) })?;
        Ok(addr)
    }

    fn mem_free_async(&self, addr: u64, stream: Stream) -> DriverResult<()> {
        // SAFETY: device memory only; the driver rejects addresses it did not allocate.
        check(unsafe { (self.table.cuMemFreeAsync)(addr, raw(stream.0)) })
    }

    unsafe fn module_load_data(&self, image: &[u8]) -> Result<Module, (Code, String)> {
        let mut module = std::ptr::null_mut();
        let mut log = vec![0u8; JIT_LOG_BYTES];
        let mut options = [
            sys::CUjit_option::CU_JIT_ERROR_LOG_BUFFER,
            sys::CUjit_option::CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
        ];
        // The size goes by value in the pointer-sized slot; the driver writes the bytes it
        // used back there.
        let mut values: [*mut c_void; 2] = [log.as_mut_ptr().cast(), log.len() as *mut c_void];
        // SAFETY: `module` is a valid out-parameter; the two options and their values are as
        // the driver API documents them (a buffer of `log.len()` bytes we own, and that
        // size); the caller guarantees the driver reads no further than `image` reaches.
        let status = unsafe {
            (self.table.cuModuleLoadDataEx)(
                &mut module,
                image.as_ptr().cast(),
                options.len() as c_uint,
                options.as_mut_ptr(),
                values.as_mut_ptr(),
            )
        };
        match check(status) {
            Ok(()) => Ok(Module(module as usize)),
            Err(code) => {
                let used = (values[1] as usize).min(log.len());
                let end = log[..used].iter().position(|&b| b == 0).unwrap_or(used);
                let text = String::from_utf8_lossy(&log[..end]).trim_end().to_owned();
                Err((code, text))
            }
        }
    }

    fn module_unload(&self, module: Module) -> DriverResult<()> {
        // SAFETY: the handle is passed back to the driver as it gave it.
        check(unsafe { (self.table.cuModuleUnload)(raw(module.0)) })
    }

    fn module_get_global(&self, module: Module, name: &CStr) -> DriverResult<(u64, usize)> {
        let (mut addr, mut size) = (0, 0);
        // SAFETY: valid out-parameters; `name` is NUL-terminated.
        check(unsafe {
            (self.table.cuModuleGetGlobal_v2)(&mut addr, &mut size, raw(module.0), name.as_ptr())
        })?;
        Ok((addr, size))
    }

    fn module_get_function(&self, module: Module, name: &CStr) -> DriverResult<Function> {
        let mut function = std::ptr::null_mut();
        // SAFETY: a valid out-parameter; `name` is NUL-terminated.
        check(unsafe {
            (self.table.cuModuleGetFunction)(&mut function, raw(module.0), name.as_ptr())
        })?;
        Ok(Function(function as usize))
    }

    unsafe fn memcpy_htod(&self, dst: u64, src: &[u8]) -> DriverResult<()> {
        // SAFETY: the driver reads `src.len()` bytes of `src`; the caller vouches for `dst`.
        check(unsafe { (self.table.cuMemcpyHtoD_v2)(dst, src.as_ptr().cast(), src.len()) })
    }

    unsafe fn memcpy_dtoh(&self, dst: &mut [u8], src: u64) -> DriverResult<()> {
        // SAFETY: the driver writes `dst.len()` bytes into `dst`, which we borrow mutably;
        // the caller vouches for `src`.
        check(unsafe { (self.table.cuMemcpyDtoH_v2)(dst.as_mut_ptr().cast(), src, dst.len()) })
    }

    fn stream_create(&self, flags: u32) -> DriverResult<Stream> {
        let mut stream = std::ptr::null_mut();
        // SAFETY: a valid out-parameter.
        check(unsafe { (self.table.cuStreamCreate)(&mut stream, flags) })?;
        Ok(Stream(stream as usize))
    }

    fn stream_destroy(&self, stream: Stream) -> DriverResult<()> {
        // SAFETY: the handle is passed back to the driver as it gave it.
        check(unsafe { (self.table.cuStreamDestroy_v2)(raw(stream.0)) })
    }

    fn stream_synchronize(&self, stream: Stream) -> DriverResult<()> {
        // SAFETY: the handle is passed back to the driver as it gave it.
        check(unsafe { (self.table.cuStreamSynchronize)(raw(stream.0)) })
    }

    unsafe fn launch_kernel(
        &self,
        function: Function,
        grid: Grid,
        stream: Stream,
        args: &[u8],
    ) -> DriverResult<()> {
        let mut size = args.len();
        // CU_LAUNCH_PARAM_BUFFER_POINTER, the block, CU_LAUNCH_PARAM_BUFFER_SIZE, &size, END.
        let mut extra: [*mut c_void; 5] = [
            sys::CU_LAUNCH_PARAM_BUFFER_POINTER_AS_INT as usize as *mut c_void,
            args.as_ptr().cast_mut().cast(),
            sys::CU_LAUNCH_PARAM_BUFFER_SIZE_AS_INT as usize as *mut c_void,
            (&mut size as *mut usize).cast(),
            sys::CU_LAUNCH_PARAM_END_AS_INT as usize as *mut c_void,
        ];
        // An empty block is passed as no parameters at all.
        let extra_ptr = if args.is_empty() {
            std::ptr::null_mut()
        } else {
            extra.as_mut_ptr()
        };
        let [gx, gy, gz] = grid.blocks;
        let [bx, by, bz] = grid.threads;
        // SAFETY: `extra` and `size` outlive the call, and the driver only reads `args` (it
        // copies the block at launch). The caller vouches for what the kernel does with it.
        check(unsafe {
            (self.table.cuLaunchKernel)(
                raw(function.0),
                gx,
                gy,
                gz,
                bx,
                by,
                bz,
                0,
                raw(stream.0),
                std::ptr::null_mut(),
                extra_ptr,
            )
        })
    }

    unsafe fn launch_host_func(
        &self,
        stream: Stream,
        function: HostFn,
        data: *mut c_void,
    ) -> DriverResult<()> {
        // SAFETY: the caller guarantees `function(data)` may be called once from any thread.
        check(unsafe { (self.table.cuLaunchHostFunc)(raw(stream.0), Some(function), data) })
    }

    fn error_name(&self, code: Code) -> Option<String> {
        let mut name: *const c_char = std::ptr::null();
        // SAFETY: a valid out-parameter; any code may be asked about (it is a plain `int`).
        check(unsafe { (self.table.cuGetErrorName)(code, &mut name) }).ok()?;
        if name.is_null() {
            return None;
        }
        // SAFETY: on success the driver points `name` at a static NUL-terminated string.
        Some(
            unsafe { CStr::from_ptr(name) }
                .to_string_lossy()
                .into_owned(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_library_is_a_reason_not_a_panic() {
        let error = LibCuda::open(&["libcuda-not-installed.so.1"]).unwrap_err();
        assert_eq!(error, "libcuda-not-installed.so.1 not found");
    }

    #[test]
    fn a_library_that_does_not_load_says_why() {
        let dir = std::env::temp_dir().join(format!("cuda-loader-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let broken = dir.join("libcuda.so.1");
        std::fs::write(&broken, b"not an ELF file").unwrap();
        let path = broken.to_str().unwrap();
        let error = LibCuda::open(&["libcuda-not-installed.so.1", path]).unwrap_err();
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(
            error.starts_with(&format!("cannot load {path}: ")),
            "{error}"
        );
        assert!(!error.contains("not found"), "{error}");
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_library_without_the_driver_api_is_a_missing_symbol() {
        // libc loads everywhere but has no cuInit.
        let error = LibCuda::open(&["libc.so.6"]).unwrap_err();
        assert_eq!(error, "missing symbol cuInit in libc.so.6");
    }
}

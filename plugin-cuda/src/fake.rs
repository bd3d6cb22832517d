//! A fake driver table for the tests: devices with chosen attributes, modules described by a
//! tiny text format, device memory as bookkeeping, streams whose queued host functions run at
//! `stream_synchronize` (the fake's "kernel completes" moment), and failures on request.
//!
//! Image format (the text must end in NUL, as the real driver requires of PTX):
//! `.entry NAME` lines declare kernels, `.global NAME SIZE` lines declare globals.

use std::alloc::Layout;
use std::collections::HashMap;
use std::ffi::{c_void, CStr};

use rpc_core::plugin::Grid;
use std::sync::Mutex;

use crate::loader::{
    Attribute, Code, Context, CuDevice, DriverApi, DriverResult, Function, HostFn, Module, Stream,
};

/// A device the fake reports.
#[derive(Clone, Debug)]
pub struct FakeGpu {
    /// What `cuDeviceGetName` returns.
    pub name: &'static str,
    /// `CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT`.
    pub multiprocessors: i32,
    /// `CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR`.
    pub max_threads_per_multiprocessor: i32,
    /// `CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_{MAJOR,MINOR}`.
    pub compute_capability: (i32, i32),
    /// `CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED`: whether MALLOC/FREE go through
    /// `cuMemAllocAsync`/`cuMemFreeAsync`.
    pub memory_pools: bool,
}

impl FakeGpu {
    /// Shaped like an H200: 132 SMs of 2048 threads (64 warps), sm_90.
    pub fn h200() -> Self {
        FakeGpu {
            name: "Fake H200",
            multiprocessors: 132,
            max_threads_per_multiprocessor: 2048,
            compute_capability: (9, 0),
            memory_pools: true,
        }
    }
}

/// A kernel launch the fake saw.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Launch {
    /// The kernel's name in its module.
    pub kernel: String,
    /// The launch's grid and block dimensions.
    pub grid: Grid,
    /// The packed argument block (`CU_LAUNCH_PARAM_BUFFER_POINTER`).
    pub args: Vec<u8>,
}

type FakeModule = (Vec<String>, HashMap<String, (u64, usize)>);

#[derive(Default)]
struct State {
    gpus: Vec<FakeGpu>,
    /// Driver call name -> the code it fails with.
    failures: HashMap<&'static str, Code>,
    /// Set by a "faulted kernel": every synchronize fails with it and host functions are dropped.
    sticky: Option<Code>,
    init_error: Option<Code>,
    contexts: HashMap<CuDevice, i32>,
    host: HashMap<usize, Layout>,
    misalign_host: bool,
    device_allocs: HashMap<u64, usize>,
    next_device_addr: u64,
    async_allocs: usize,
    /// Module -> its kernels and its globals (name -> address, size).
    modules: HashMap<usize, FakeModule>,
    functions: HashMap<usize, String>,
    streams: HashMap<usize, Vec<(HostFn, usize)>>,
    next_handle: usize,
    memory: HashMap<u64, Vec<u8>>,
    launches: Vec<Launch>,
    host_funcs_run: usize,
    /// `cuDevicePrimaryCtxReset_v2` calls.
    resets: usize,
    /// The last `cuCtxSetLimit(CU_LIMIT_STACK_SIZE)`.
    stack_limit: Option<usize>,
}

/// The fake driver.
pub struct FakeDriver {
    state: Mutex<State>,
}

impl FakeDriver {
    /// A driver reporting `gpus`, in order, with nothing allocated and no failures set.
    pub fn new(gpus: Vec<FakeGpu>) -> Self {
        FakeDriver {
            state: Mutex::new(State {
                gpus,
                next_device_addr: 0x7f00_0000_0100,
                next_handle: 0x1000,
                ..State::default()
            }),
        }
    }

    /// `call` (a driver function name) fails with `code` from now on.
    pub fn fail(&self, call: &'static str, code: Code) {
        self.state.lock().unwrap().failures.insert(call, code);
    }
    /// `cuInit` fails with `code`.
    pub fn fail_init(&self, code: Code) {
        self.state.lock().unwrap().init_error = Some(code);
    }
    /// A kernel faults: the context is broken for good.
    pub fn fault(&self, code: Code) {
        self.state.lock().unwrap().sticky = Some(code);
    }
    /// `cuMemHostAlloc` returns memory 8 bytes past a 64-byte boundary.
    pub fn misalign_host_memory(&self) {
        self.state.lock().unwrap().misalign_host = true;
    }
    /// Every launch so far, in order.
    pub fn launches(&self) -> Vec<Launch> {
        self.state.lock().unwrap().launches.clone()
    }
    /// Device allocations not yet freed (`cuMemAlloc` and `cuMemAllocAsync` both).
    pub fn live_device_allocations(&self) -> usize {
        self.state.lock().unwrap().device_allocs.len()
    }
    /// How many allocations were stream-ordered (`cuMemAllocAsync`), freed or not.
    pub fn async_allocations(&self) -> usize {
        self.state.lock().unwrap().async_allocs
    }
    /// Pinned host allocations (`cuMemHostAlloc`) not yet freed.
    pub fn live_host_allocations(&self) -> usize {
        self.state.lock().unwrap().host.len()
    }
    /// Modules loaded and not yet unloaded.
    pub fn live_modules(&self) -> usize {
        self.state.lock().unwrap().modules.len()
    }
    /// Streams created and not yet destroyed.
    pub fn live_streams(&self) -> usize {
        self.state.lock().unwrap().streams.len()
    }
    /// Primary-context retains not yet released, summed over the devices.
    pub fn retained_contexts(&self) -> i32 {
        self.state.lock().unwrap().contexts.values().sum()
    }
    /// How many times a primary context was reset.
    pub fn resets(&self) -> usize {
        self.state.lock().unwrap().resets
    }
    /// The stack size limit last set, if any.
    pub fn stack_limit(&self) -> Option<usize> {
        self.state.lock().unwrap().stack_limit
    }
    /// How many queued host functions (launch completions) have run.
    pub fn host_funcs_run(&self) -> usize {
        self.state.lock().unwrap().host_funcs_run
    }
    /// Bytes last copied to `addr`.
    pub fn memory_at(&self, addr: u64) -> Option<Vec<u8>> {
        self.state.lock().unwrap().memory.get(&addr).cloned()
    }
    /// The length of every copy into device memory so far (and of every pointer the JIT
    /// initialised), in address order.
    pub fn copy_sizes(&self) -> Vec<usize> {
        let state = self.state.lock().unwrap();
        let mut copies: Vec<(u64, usize)> = state
            .memory
            .iter()
            .map(|(&at, bytes)| (at, bytes.len()))
            .collect();
        copies.sort();
        copies.into_iter().map(|(_, len)| len).collect()
    }
    /// Runs the host functions queued on every stream, as if the kernels before them completed
    /// on their own (without anyone synchronising).
    pub fn complete_kernels(&self) {
        let queued: Vec<(HostFn, usize)> = {
            let mut state = self.state.lock().unwrap();
            let queued: Vec<_> = state
                .streams
                .values_mut()
                .flat_map(std::mem::take)
                .collect();
            state.host_funcs_run += queued.len();
            queued
        };
        for (function, data) in queued {
            // SAFETY: `launch_host_func`'s caller guaranteed one call from any thread is sound.
            unsafe { function(data as *mut c_void) };
        }
    }

    fn check(&self, call: &'static str) -> DriverResult<()> {
        match self.state.lock().unwrap().failures.get(call) {
            Some(&code) => Err(code),
            None => Ok(()),
        }
    }

    fn handle(state: &mut State) -> usize {
        state.next_handle += 0x10;
        state.next_handle
    }

    fn gpu(&self, device: CuDevice) -> DriverResult<FakeGpu> {
        let state = self.state.lock().unwrap();
        usize::try_from(device)
            .ok()
            .and_then(|d| state.gpus.get(d).cloned())
            .ok_or(101)
    }
}

impl DriverApi for FakeDriver {
    fn init(&self) -> DriverResult<()> {
        self.state.lock().unwrap().init_error.map_or(Ok(()), Err)
    }
    fn device_count(&self) -> DriverResult<i32> {
        Ok(self.state.lock().unwrap().gpus.len() as i32)
    }
    fn device_get(&self, ordinal: i32) -> DriverResult<CuDevice> {
        self.gpu(ordinal).map(|_| ordinal)
    }
    fn device_name(&self, device: CuDevice) -> DriverResult<String> {
        self.gpu(device).map(|gpu| gpu.name.to_owned())
    }
    fn device_attribute(&self, device: CuDevice, attribute: Attribute) -> DriverResult<i32> {
        let gpu = self.gpu(device)?;
        Ok(match attribute {
            Attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT => gpu.multiprocessors,
            Attribute::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR => {
                gpu.max_threads_per_multiprocessor
            }
            Attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR => gpu.compute_capability.0,
            Attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR => gpu.compute_capability.1,
            Attribute::CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED => i32::from(gpu.memory_pools),
            _ => return Err(1),
        })
    }
    fn primary_ctx_retain(&self, device: CuDevice) -> DriverResult<Context> {
        self.gpu(device)?;
        *self
            .state
            .lock()
            .unwrap()
            .contexts
            .entry(device)
            .or_default() += 1;
        Ok(Context(0xC000 + device as usize))
    }
    fn primary_ctx_release(&self, device: CuDevice) -> DriverResult<()> {
        let mut state = self.state.lock().unwrap();
        let count = state.contexts.get_mut(&device).ok_or(201)?;
        *count -= 1;
        Ok(())
    }
    fn primary_ctx_reset(&self, device: CuDevice) -> DriverResult<()> {
        self.gpu(device)?;
        self.check("cuDevicePrimaryCtxReset_v2")?;
        let mut state = self.state.lock().unwrap();
        state.resets += 1;
        // The kernels in flight end with the context: their host functions never run.
        state.streams.values_mut().for_each(Vec::clear);
        Ok(())
    }
    fn ctx_set_current(&self, _context: Context) -> DriverResult<()> {
        self.check("cuCtxSetCurrent")
    }

    fn ctx_set_stack_limit(&self, bytes: usize) -> DriverResult<()> {
        self.check("cuCtxSetLimit")?;
        self.state.lock().unwrap().stack_limit = Some(bytes);
        Ok(())
    }

    fn mem_host_alloc(&self, len: usize, _flags: u32) -> DriverResult<*mut u8> {
        self.check("cuMemHostAlloc")?;
        let layout = Layout::from_size_align(len + 64, 4096).map_err(|_| 1)?;
        // SAFETY: the layout has a non-zero size.
        let base = unsafe { std::alloc::alloc(layout) };
        if base.is_null() {
            return Err(2);
        }
        // Garbage, so the plugin's zeroing shows.
        // SAFETY: `base` has `len + 64` bytes.
        unsafe { std::ptr::write_bytes(base, 0xA5, len + 64) };
        let mut state = self.state.lock().unwrap();
        let ptr = if state.misalign_host {
            base.wrapping_add(8)
        } else {
            base
        };
        state.host.insert(ptr as usize, layout);
        Ok(ptr)
    }
    unsafe fn mem_free_host(&self, ptr: *mut u8) -> DriverResult<()> {
        let mut state = self.state.lock().unwrap();
        let layout = state.host.remove(&(ptr as usize)).ok_or(1)?;
        let base = if state.misalign_host {
            ptr.wrapping_sub(8)
        } else {
            ptr
        };
        // SAFETY: `base` was allocated with `layout` by `mem_host_alloc` and is freed once.
        unsafe { std::alloc::dealloc(base, layout) };
        Ok(())
    }
    fn mem_host_get_device_pointer(&self, ptr: *mut u8) -> DriverResult<u64> {
        // Unified addressing: the device sees mapped memory at its host address.
        if self
            .state
            .lock()
            .unwrap()
            .host
            .contains_key(&(ptr as usize))
        {
            Ok(ptr as u64)
        } else {
            Err(1)
        }
    }
    fn mem_alloc(&self, size: usize) -> DriverResult<u64> {
        self.check("cuMemAlloc_v2")?;
        let mut state = self.state.lock().unwrap();
        let addr = state.next_device_addr;
        // 256-byte granules, deliberately not 2 MiB aligned.
        state.next_device_addr += (size as u64).div_ceil(256) * 256 + 256;
        state.device_allocs.insert(addr, size);
        Ok(addr)
    }
    fn mem_free(&self, addr: u64) -> DriverResult<()> {
        self.state
            .lock()
            .unwrap()
            .device_allocs
            .remove(&addr)
            .map(|_| ())
            .ok_or(1)
    }
    fn mem_alloc_async(&self, size: usize, stream: Stream) -> DriverResult<u64> {
        if !self.state.lock().unwrap().streams.contains_key(&stream.0) {
            return Err(400);
        }
        let addr = self.mem_alloc(size)?;
        self.state.lock().unwrap().async_allocs += 1;
        Ok(addr)
    }
    fn mem_free_async(&self, addr: u64, _stream: Stream) -> DriverResult<()> {
        self.mem_free(addr)
    }

    unsafe fn module_load_data(&self, image: &[u8]) -> Result<Module, (Code, String)> {
        self.check("cuModuleLoadDataEx")
            .map_err(|code| (code, String::new()))?;
        // The real driver reads PTX up to its NUL: demand one. Its JIT explains a bad image
        // in the error log, as ptxas does.
        const INVALID_PTX: Code = 218;
        let text = CStr::from_bytes_until_nul(image)
            .map_err(|_| (INVALID_PTX, "fake JIT: the image has no NUL".to_owned()))?;
        let text = text
            .to_str()
            .map_err(|_| (INVALID_PTX, "fake JIT: the image is not UTF-8".to_owned()))?;
        let (mut entries, mut globals) = (Vec::new(), HashMap::new());
        let mut pointers = Vec::new();
        let mut state = self.state.lock().unwrap();
        for (number, line) in text.lines().enumerate() {
            let words: Vec<&str> = line.split_whitespace().collect();
            match words.as_slice() {
                [".entry", name] => entries.push((*name).to_owned()),
                [".global", name, size] => {
                    let size: usize = size.parse().map_err(|_| {
                        let log = format!(
                            "ptxas application ptx input, line {}; error   : bad size \
                             {size:?} of .global {name}\nptxas fatal   : Ptx assembly aborted \
                             due to errors",
                            number + 1
                        );
                        (INVALID_PTX, log)
                    })?;
                    let addr = state.next_device_addr;
                    state.next_device_addr += (size as u64).div_ceil(256) * 256 + 256;
                    globals.insert((*name).to_owned(), (addr, size));
                }
                // `.global NAME 8 = TARGET`: a pointer the JIT initialises with TARGET's
                // address, as PTX's `= generic(TARGET)` is (LLVM 18/19's client pointer).
                [".global", name, "8", "=", target] => pointers.push((*name, *target)),
                _ => {}
            }
        }
        for (name, target) in pointers {
            let addr = state.next_device_addr;
            state.next_device_addr += 256;
            globals.insert(name.to_owned(), (addr, 8));
            let value = globals.get(target).map_or(0, |&(at, _)| at);
            state.memory.insert(addr, value.to_le_bytes().to_vec());
        }
        let handle = Self::handle(&mut state);
        state.modules.insert(handle, (entries, globals));
        Ok(Module(handle))
    }
    fn module_unload(&self, module: Module) -> DriverResult<()> {
        self.state
            .lock()
            .unwrap()
            .modules
            .remove(&module.0)
            .map(|_| ())
            .ok_or(400)
    }
    fn module_get_global(&self, module: Module, name: &CStr) -> DriverResult<(u64, usize)> {
        let state = self.state.lock().unwrap();
        let (_, globals) = state.modules.get(&module.0).ok_or(400)?;
        globals
            .get(name.to_str().map_err(|_| 500)?)
            .copied()
            .ok_or(500)
    }
    fn module_get_function(&self, module: Module, name: &CStr) -> DriverResult<Function> {
        let mut state = self.state.lock().unwrap();
        let (entries, _) = state.modules.get(&module.0).ok_or(400)?;
        let name = name.to_str().map_err(|_| 500)?;
        if !entries.iter().any(|e| e == name) {
            return Err(500);
        }
        let handle = Self::handle(&mut state);
        state.functions.insert(handle, name.to_owned());
        Ok(Function(handle))
    }

    unsafe fn memcpy_htod(&self, dst: u64, src: &[u8]) -> DriverResult<()> {
        self.state.lock().unwrap().memory.insert(dst, src.to_vec());
        Ok(())
    }
    unsafe fn memcpy_dtoh(&self, dst: &mut [u8], src: u64) -> DriverResult<()> {
        // From the copy that covers `src..src + len` (a copy in, then a read of a part of it).
        let state = self.state.lock().unwrap();
        let (start, bytes) = state
            .memory
            .iter()
            .find(|(&start, bytes)| {
                src >= start && src + dst.len() as u64 <= start + bytes.len() as u64
            })
            .ok_or(1)?;
        let at = (src - start) as usize;
        dst.copy_from_slice(&bytes[at..at + dst.len()]);
        Ok(())
    }

    fn stream_create(&self, _flags: u32) -> DriverResult<Stream> {
        self.check("cuStreamCreate")?;
        let mut state = self.state.lock().unwrap();
        let handle = Self::handle(&mut state);
        state.streams.insert(handle, Vec::new());
        Ok(Stream(handle))
    }
    fn stream_destroy(&self, stream: Stream) -> DriverResult<()> {
        let mut state = self.state.lock().unwrap();
        let queued = state.streams.remove(&stream.0).ok_or(400)?;
        assert!(
            queued.is_empty(),
            "a stream destroyed with host functions still queued"
        );
        Ok(())
    }
    fn stream_synchronize(&self, stream: Stream) -> DriverResult<()> {
        let queued = {
            let mut state = self.state.lock().unwrap();
            let sticky = state.sticky;
            let queue = state.streams.get_mut(&stream.0).ok_or(400)?;
            let queued = std::mem::take(queue);
            if let Some(code) = sticky {
                // Like the real driver: a failed context calls no host function.
                return Err(code);
            }
            state.host_funcs_run += queued.len();
            queued
        };
        for (function, data) in queued {
            // SAFETY: `launch_host_func`'s caller guaranteed one call from any thread is sound.
            unsafe { function(data as *mut c_void) };
        }
        Ok(())
    }

    unsafe fn launch_kernel(
        &self,
        function: Function,
        grid: Grid,
        stream: Stream,
        args: &[u8],
    ) -> DriverResult<()> {
        self.check("cuLaunchKernel")?;
        let mut state = self.state.lock().unwrap();
        if !state.streams.contains_key(&stream.0) {
            return Err(400);
        }
        let kernel = state.functions.get(&function.0).ok_or(400)?.clone();
        state.launches.push(Launch {
            kernel,
            grid,
            args: args.to_vec(),
        });
        Ok(())
    }
    unsafe fn launch_host_func(
        &self,
        stream: Stream,
        function: HostFn,
        data: *mut c_void,
    ) -> DriverResult<()> {
        self.check("cuLaunchHostFunc")?;
        let mut state = self.state.lock().unwrap();
        state
            .streams
            .get_mut(&stream.0)
            .ok_or(400)?
            .push((function, data as usize));
        Ok(())
    }

    fn error_name(&self, code: Code) -> Option<String> {
        // The fake driver knows one name, so both naming paths are exercised.
        (code == 700).then(|| "CUDA_ERROR_ILLEGAL_ADDRESS".to_owned())
    }
}

/// What the contract's suite asks of the fake: one H200, and the fake's counts.
#[cfg(test)]
impl plugin_contract::Fake for FakeDriver {
    type Plugin = crate::CudaPlugin;
    const IMAGE: &'static [u8] =
        b".entry main\n.entry other\n.global __llvm_rpc_client 552\n.global data 16\n";
    fn one_gpu() -> (std::sync::Arc<Self>, crate::CudaPlugin) {
        let fake = FakeDriver::new(vec![FakeGpu::h200()]);
        plugin_contract::suite::initialised(fake, |fake| crate::CudaPlugin::with_driver(fake))
    }
    fn loaded_images(&self) -> usize {
        self.live_modules()
    }
    fn launched(&self) -> Vec<(String, Grid)> {
        let launches = self.launches().into_iter();
        launches.map(|l| (l.kernel, l.grid)).collect()
    }
    fn host_allocations(&self) -> usize {
        self.live_host_allocations()
    }
    fn device_allocations(&self) -> usize {
        self.live_device_allocations()
    }
}

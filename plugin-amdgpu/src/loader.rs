//! The HSA runtime, loaded at run time (STYLE 11).
//!
//! [`HsaApi`] is the typed table of the only HSA functions this crate uses, with Rust
//! signatures (slices, `CStr`, typed attributes, `Result<_, AmdGpuError>`): every `unsafe` call
//! into the runtime is behind it. [`LibHsa`] implements it over `libhsa-runtime64.so.1` opened
//! with `libloading`, every symbol resolved up front; tests implement the same trait with a
//! fake HSA (`src/fake.rs`). Nothing here links against HSA, so the crate builds and its tests
//! run on machines without ROCm. A missing library or symbol is an [`AmdGpuError::NoRuntime`]
//! value, never a panic; the plugin turns it into "zero devices" plus the reason.
//!
//! The types and constants below are declared from `hsa.h`, `hsa_ext_amd.h` and
//! `amd_hsa_signal.h` (ROCm 5.2, as Debian packages it); only what the crate uses.
//! C enums are passed as `u32` (an `int`-sized enum in the SysV ABI).

use core::ffi::{c_char, c_void, CStr};
use std::sync::{Arc, OnceLock};

use libloading::Library;
use static_assertions::const_assert_eq;

pub use crate::error::Status;
use crate::error::{status_name, AmdGpuError};

/// The soname the runtime is loaded from.
pub const LIBRARY: &str = "libhsa-runtime64.so.1";

const STATUS_SUCCESS: Status = 0x0;
/// `HSA_STATUS_INFO_BREAK`: an iteration callback stopped the iteration (not an error).
const STATUS_INFO_BREAK: Status = 0x1;

macro_rules! handle {
    ($($(#[$doc:meta])* $name:ident;)*) => {$(
        $(#[$doc])*
        #[repr(C)]
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
        pub struct $name {
            /// The runtime's opaque handle (0 is no object).
            pub handle: u64,
        }
    )*};
}

handle! {
    /// `hsa_agent_t`.
    Agent;
    /// `hsa_amd_memory_pool_t`.
    MemoryPool;
    /// `hsa_signal_t`: with ROCr the handle is the address of an [`AmdSignal`].
    Signal;
    /// `hsa_executable_t`.
    Executable;
    /// `hsa_executable_symbol_t`.
    ExecutableSymbol;
    /// `hsa_code_object_reader_t`.
    CodeObjectReader;
    /// `hsa_loaded_code_object_t`.
    LoadedCodeObject;
}

/// `hsa_queue_t` (64-bit "large model" layout).
#[repr(C)]
#[derive(Debug)]
pub struct Queue {
    /// `hsa_queue_type32_t`: single or multiple producers (this plugin asks for multiple).
    pub queue_type: u32,
    /// `hsa_queue_feature_t` bits: kernel dispatch, agent dispatch.
    pub features: u32,
    /// The ring of `size` 64-byte AQL packets.
    pub base_address: *mut c_void,
    /// Stores of the last written packet index ring the packet processor.
    pub doorbell_signal: Signal,
    /// Packets in the ring (a power of two).
    pub size: u32,
    /// `reserved1`: unused.
    pub reserved1: u32,
    /// The queue's id, unique in the process.
    pub id: u64,
}
const_assert_eq!(core::mem::size_of::<Queue>(), 40);
const_assert_eq!(core::mem::offset_of!(Queue, doorbell_signal), 16);
const_assert_eq!(core::mem::offset_of!(Queue, size), 24);

/// `amd_signal_t` (`amd_hsa_signal.h`): what an AMD [`Signal`] handle points at. Device code
/// (and the command processor) signal by an atomic on `value`, then, if `event_mailbox_ptr` is
/// non-null, storing `event_id` there and raising an interrupt (`s_sendmsg`), which wakes host
/// threads blocked in `hsa_signal_wait_*`.
#[repr(C, align(64))]
#[derive(Debug)]
pub struct AmdSignal {
    /// `amd_signal_kind64_t`: [`AMD_SIGNAL_KIND_USER`] for the signals this plugin makes;
    /// negative for a hardware doorbell.
    pub kind: i64,
    /// The signal's value, which device code and the host change atomically.
    pub value: i64,
    /// Where the signaller stores `event_id` before raising an interrupt (0: it raises none).
    pub event_mailbox_ptr: u64,
    /// The interrupt's event id.
    pub event_id: u32,
    /// `reserved1`: unused.
    pub reserved1: u32,
    /// `start_ts`: when the dispatch it completes started (profiling; unused here).
    pub start_ts: u64,
    /// `end_ts`: when it ended (profiling; unused here).
    pub end_ts: u64,
    /// `queue_ptr`: the queue whose completion signal it is (for the runtime; unused here).
    pub queue_ptr: u64,
    /// `reserved3`: unused.
    pub reserved3: [u32; 2],
}
const_assert_eq!(core::mem::size_of::<AmdSignal>(), 64);
const_assert_eq!(core::mem::offset_of!(AmdSignal, value), 8);
const_assert_eq!(core::mem::offset_of!(AmdSignal, event_mailbox_ptr), 16);
const_assert_eq!(core::mem::offset_of!(AmdSignal, event_id), 24);
/// `AMD_SIGNAL_KIND_USER`: a signal whose `value` is memory (not a hardware doorbell).
pub const AMD_SIGNAL_KIND_USER: i64 = 1;

// hsa_system_info_t
const SYSTEM_INFO_TIMESTAMP_FREQUENCY: u32 = 3; // u64

/// The `u32` (or `u32`-sized enum) agent attributes read (`hsa_agent_info_t`,
/// `hsa_amd_agent_info_t`): typed, so a safe call cannot ask for an attribute of another size.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AgentU32 {
    /// `HSA_AGENT_INFO_WAVEFRONT_SIZE`: lanes per wave, 32 or 64.
    WavefrontSize = 6,
    /// `HSA_AGENT_INFO_QUEUE_MAX_SIZE`: the most packets a queue of the agent may hold.
    QueueMaxSize = 14,
    /// `hsa_device_type_t`.
    Device = 17,
    /// `HSA_AMD_AGENT_INFO_COMPUTE_UNIT_COUNT`.
    ComputeUnitCount = 0xA002,
    /// `HSA_AMD_AGENT_INFO_MAX_WAVES_PER_CU`: resident waves one compute unit holds.
    MaxWavesPerCu = 0xA00A,
}

/// The `char[64]` agent attributes read.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AgentName {
    /// The ISA name (`gfx942`).
    Name = 0,
    /// The marketing name (`AMD Instinct MI300X`).
    ProductName = 0xA009,
}

/// `HSA_DEVICE_TYPE_CPU` (`hsa_device_type_t`): the host's agent, owner of the system pools.
pub const DEVICE_TYPE_CPU: u32 = 0;
/// `HSA_DEVICE_TYPE_GPU`: an agent this plugin makes a device of.
pub const DEVICE_TYPE_GPU: u32 = 1;

// hsa_amd_memory_pool_info_t, hsa_amd_segment_t, hsa_amd_memory_pool_global_flag_t
const POOL_INFO_SEGMENT: u32 = 0; // hsa_amd_segment_t
const POOL_INFO_GLOBAL_FLAGS: u32 = 1; // u32
const POOL_INFO_RUNTIME_ALLOC_ALLOWED: u32 = 5; // bool
/// `HSA_AMD_SEGMENT_GLOBAL` (`hsa_amd_segment_t`): a pool of global memory, the only kind used.
pub const SEGMENT_GLOBAL: u32 = 0;
/// `HSA_AMD_MEMORY_POOL_GLOBAL_FLAG_KERNARG_INIT`: the pool can hold kernarg blocks.
pub const POOL_FLAG_KERNARG_INIT: u32 = 1;
/// `HSA_AMD_MEMORY_POOL_GLOBAL_FLAG_FINE_GRAINED`: memory coherent between host and GPU while
/// a kernel runs (the mailbox's).
pub const POOL_FLAG_FINE_GRAINED: u32 = 2;
/// `HSA_AMD_MEMORY_POOL_GLOBAL_FLAG_COARSE_GRAINED`: memory coherent only at dispatch
/// boundaries (a GPU's own VRAM; MALLOC's blocks).
pub const POOL_FLAG_COARSE_GRAINED: u32 = 4;

// hsa_profile_t, hsa_default_float_rounding_mode_t
const PROFILE_FULL: u32 = 1;
const DEFAULT_FLOAT_ROUNDING_MODE_DEFAULT: u32 = 0;

/// `HSA_EXECUTABLE_SYMBOL_INFO_TYPE` (`hsa_executable_symbol_info_t`): the symbol's
/// `hsa_symbol_kind_t`, a `u32`.
pub const SYMBOL_INFO_TYPE: u32 = 0;
/// `HSA_EXECUTABLE_SYMBOL_INFO_VARIABLE_SIZE`: a variable's bytes, a `u32`.
pub const SYMBOL_INFO_VARIABLE_SIZE: u32 = 9;
/// `HSA_EXECUTABLE_SYMBOL_INFO_KERNEL_KERNARG_SEGMENT_SIZE`: a kernel's kernarg bytes, a `u32`.
pub const SYMBOL_INFO_KERNEL_KERNARG_SEGMENT_SIZE: u32 = 11;
/// `HSA_EXECUTABLE_SYMBOL_INFO_KERNEL_KERNARG_SEGMENT_ALIGNMENT`: its alignment, a `u32`.
pub const SYMBOL_INFO_KERNEL_KERNARG_SEGMENT_ALIGNMENT: u32 = 12;
/// `HSA_EXECUTABLE_SYMBOL_INFO_KERNEL_GROUP_SEGMENT_SIZE`: its static LDS bytes, a `u32`.
pub const SYMBOL_INFO_KERNEL_GROUP_SEGMENT_SIZE: u32 = 13;
/// `HSA_EXECUTABLE_SYMBOL_INFO_KERNEL_PRIVATE_SEGMENT_SIZE`: its fixed scratch bytes per
/// work-item, a `u32`.
pub const SYMBOL_INFO_KERNEL_PRIVATE_SEGMENT_SIZE: u32 = 14;
/// `HSA_EXECUTABLE_SYMBOL_INFO_KERNEL_DYNAMIC_CALLSTACK`: whether its call stack is unbounded,
/// a `bool` (one byte).
pub const SYMBOL_INFO_KERNEL_DYNAMIC_CALLSTACK: u32 = 15;
/// `HSA_EXECUTABLE_SYMBOL_INFO_VARIABLE_ADDRESS`: a variable's device address, a `u64`.
pub const SYMBOL_INFO_VARIABLE_ADDRESS: u32 = 21;
/// `HSA_EXECUTABLE_SYMBOL_INFO_KERNEL_OBJECT`: a kernel's code descriptor, a `u64`.
pub const SYMBOL_INFO_KERNEL_OBJECT: u32 = 22;
/// `HSA_SYMBOL_KIND_VARIABLE` (`hsa_symbol_kind_t`).
pub const SYMBOL_KIND_VARIABLE: u32 = 0;
/// `HSA_SYMBOL_KIND_KERNEL`.
pub const SYMBOL_KIND_KERNEL: u32 = 1;

/// `HSA_SIGNAL_CONDITION_EQ` (`hsa_signal_condition_t`): wait until the value equals the operand.
pub const SIGNAL_CONDITION_EQ: u32 = 0;
/// `HSA_SIGNAL_CONDITION_NE`: wait until it differs from the operand.
pub const SIGNAL_CONDITION_NE: u32 = 1;
/// `HSA_SIGNAL_CONDITION_LT`: wait until it is less than the operand.
pub const SIGNAL_CONDITION_LT: u32 = 2;
// hsa_wait_state_t
const WAIT_STATE_BLOCKED: u32 = 0;

// hsa_queue_type_t
const QUEUE_TYPE_MULTI: u32 = 0;

/// `hsa_queue_create` error callback: the runtime calls it on one of its threads with the
/// queue's error (memory fault, illegal instruction); the queue is unusable afterwards.
pub type QueueCallback = unsafe extern "C" fn(Status, *mut Queue, *mut c_void);

/// What every [`HsaApi`] call returns; an error names the HSA function and its status.
pub type HsaResult<T> = Result<T, AmdGpuError>;

/// A memory pool's attributes (`hsa_amd_memory_pool_get_info`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolInfo {
    /// `hsa_amd_segment_t`.
    pub segment: u32,
    /// `hsa_amd_memory_pool_global_flag_t` bits.
    pub global_flags: u32,
    /// Whether `hsa_amd_memory_pool_allocate` may be used on it.
    pub runtime_alloc_allowed: bool,
}

/// The HSA functions the plugin uses, as safe Rust where the call cannot break memory safety
/// on the host and `unsafe` where it can (a dangling handle the runtime dereferences, memory
/// the runtime or the GPU writes). Every method is one runtime call (two or three for the
/// typed queries); `Err` names the function and the status it returned.
pub trait HsaApi: Send + Sync {
    /// `hsa_init` (reference-counted: every success is owed one [`HsaApi::shut_down`]).
    fn init(&self) -> HsaResult<()>;
    /// `hsa_shut_down`.
    ///
    /// # Safety
    /// Balances a successful [`HsaApi::init`]; when it is the last, every object of the
    /// runtime (queues, signals, memory, executables) is gone and none is used afterwards.
    unsafe fn shut_down(&self) -> HsaResult<()>;
    /// `hsa_status_string`: the runtime's text for `status`, if it has one.
    fn status_string(&self, status: Status) -> Option<String>;
    /// `hsa_system_get_info(HSA_SYSTEM_INFO_TIMESTAMP_FREQUENCY)`: ticks per second, the unit
    /// of signal wait timeouts.
    fn timestamp_frequency(&self) -> HsaResult<u64>;

    /// `hsa_iterate_agents`, collected.
    fn agents(&self) -> HsaResult<Vec<Agent>>;
    /// `hsa_agent_get_info` of a `u32` attribute.
    fn agent_u32(&self, agent: Agent, attribute: AgentU32) -> HsaResult<u32>;
    /// `hsa_agent_get_info` of a `char[64]` attribute, trimmed.
    fn agent_name(&self, agent: Agent, attribute: AgentName) -> HsaResult<String>;
    /// `hsa_amd_agent_iterate_memory_pools`, collected.
    fn memory_pools(&self, agent: Agent) -> HsaResult<Vec<MemoryPool>>;
    /// `hsa_amd_memory_pool_get_info` of the attributes in [`PoolInfo`].
    fn pool_info(&self, pool: MemoryPool) -> HsaResult<PoolInfo>;

    /// `hsa_amd_memory_pool_allocate` of `len` bytes (flags 0); aligned to the pool's granule.
    fn pool_allocate(&self, pool: MemoryPool, len: usize) -> HsaResult<*mut u8>;
    /// `hsa_amd_memory_pool_free`.
    ///
    /// # Safety
    /// `ptr` came from [`HsaApi::pool_allocate`], is not freed yet, and nothing (host or
    /// device) uses the memory any more.
    unsafe fn pool_free(&self, ptr: *mut u8) -> HsaResult<()>;
    /// `hsa_amd_agents_allow_access`: `agents` may access the allocation at `ptr`.
    ///
    /// # Safety
    /// `ptr` is a live [`HsaApi::pool_allocate`] block: the agents may then write it.
    unsafe fn agents_allow_access(&self, agents: &[Agent], ptr: *mut u8) -> HsaResult<()>;
    /// `hsa_memory_copy` from host bytes to the address `dst`.
    ///
    /// # Safety
    /// `dst..dst + src.len()` is memory of the runtime (an allocation or a loaded variable)
    /// that no live Rust reference covers.
    unsafe fn copy_to_device(&self, dst: u64, src: &[u8]) -> HsaResult<()>;
    /// `hsa_memory_copy` from the address `src` into host bytes.
    ///
    /// # Safety
    /// `src..src + dst.len()` is memory of the runtime (an allocation or a loaded variable).
    unsafe fn copy_from_device(&self, dst: &mut [u8], src: u64) -> HsaResult<()>;

    /// `hsa_code_object_reader_create_from_memory`.
    ///
    /// # Safety
    /// `bytes` outlives the reader (hsa.h: the buffer must stay until the reader is destroyed).
    unsafe fn code_object_reader_create(&self, bytes: &[u8]) -> HsaResult<CodeObjectReader>;
    /// `hsa_code_object_reader_destroy`.
    fn code_object_reader_destroy(&self, reader: CodeObjectReader) -> HsaResult<()>;
    /// `hsa_executable_create_alt` (full profile, default rounding, no options).
    fn executable_create(&self) -> HsaResult<Executable>;
    /// `hsa_executable_load_agent_code_object` (no options).
    fn executable_load_agent_code_object(
        &self,
        executable: Executable,
        agent: Agent,
        reader: CodeObjectReader,
    ) -> HsaResult<()>;
    /// `hsa_executable_freeze` (no options).
    fn executable_freeze(&self, executable: Executable) -> HsaResult<()>;
    /// `hsa_executable_destroy`.
    ///
    /// # Safety
    /// No kernel of the executable runs any more, and nothing uses its variables.
    unsafe fn executable_destroy(&self, executable: Executable) -> HsaResult<()>;
    /// `hsa_executable_get_symbol_by_name` for `agent`.
    fn executable_symbol(
        &self,
        executable: Executable,
        name: &CStr,
        agent: Agent,
    ) -> HsaResult<ExecutableSymbol>;
    /// `hsa_executable_symbol_get_info`.
    ///
    /// # Safety
    /// `value` is valid for writes of the size hsa.h gives `attribute` (noted beside the
    /// `SYMBOL_INFO_*` constants).
    unsafe fn executable_symbol_get_info(
        &self,
        symbol: ExecutableSymbol,
        attribute: u32,
        value: *mut c_void,
    ) -> HsaResult<()>;

    /// `hsa_signal_create` with no consumers (so ROCr makes an interrupt signal).
    fn signal_create(&self, initial: i64) -> HsaResult<Signal>;
    /// `hsa_signal_destroy`.
    ///
    /// # Safety
    /// `signal` is live and nothing (host, GPU, packet processor) uses it any more.
    unsafe fn signal_destroy(&self, signal: Signal) -> HsaResult<()>;
    /// `hsa_signal_store_screlease`.
    ///
    /// # Safety
    /// `signal` is live (with ROCr the handle is a pointer the runtime dereferences).
    unsafe fn signal_store_screlease(&self, signal: Signal, value: i64);
    /// `hsa_signal_wait_scacquire`, blocked (not spinning): returns the value observed when
    /// `value <condition> compare` held, the timeout (in [`HsaApi::timestamp_frequency`]
    /// ticks) passed, or spuriously; callers re-check.
    ///
    /// # Safety
    /// `signal` is live.
    unsafe fn signal_wait_scacquire(
        &self,
        signal: Signal,
        condition: u32,
        compare: i64,
        timeout_ticks: u64,
    ) -> i64;

    /// `hsa_queue_create` (multi-producer, no segment size hints) of `size` packets on
    /// `agent`; `callback(status, queue, data)` reports a queue error.
    ///
    /// # Safety
    /// Calling `callback` with `data`, once, from a runtime thread, at any time until
    /// [`HsaApi::queue_destroy`] returns, is sound.
    unsafe fn queue_create(
        &self,
        agent: Agent,
        size: u32,
        callback: QueueCallback,
        data: *mut c_void,
    ) -> HsaResult<*mut Queue>;
    /// `hsa_queue_destroy`.
    ///
    /// # Safety
    /// `queue` came from [`HsaApi::queue_create`], is not destroyed yet, and nothing uses it.
    unsafe fn queue_destroy(&self, queue: *mut Queue) -> HsaResult<()>;
    /// `hsa_queue_inactivate`: aborts the dispatches in flight; the queue runs nothing more.
    ///
    /// # Safety
    /// `queue` is live.
    unsafe fn queue_inactivate(&self, queue: *mut Queue) -> HsaResult<()>;
    /// `hsa_queue_add_write_index_scacq_screl`: reserves `count` slots; the first's index.
    ///
    /// # Safety
    /// `queue` is live.
    unsafe fn queue_add_write_index(&self, queue: *mut Queue, count: u64) -> u64;
    /// `hsa_queue_load_read_index_scacquire`: the packets consumed so far.
    ///
    /// # Safety
    /// `queue` is live.
    unsafe fn queue_load_read_index(&self, queue: *mut Queue) -> u64;

    /// `Ok(())` for `HSA_STATUS_SUCCESS` (and `INFO_BREAK`, which ends an iteration early),
    /// otherwise an [`AmdGpuError::Status`] naming `call`, with the runtime's text.
    fn check(&self, call: &'static str, status: Status) -> HsaResult<()> {
        if status == STATUS_SUCCESS || status == STATUS_INFO_BREAK {
            return Ok(());
        }
        let name = status_name(status);
        // ROCr's text repeats the name ("HSA_STATUS_ERROR_...: text"); keep only the text.
        let detail = self
            .status_string(status)
            .map(|t| match t.strip_prefix(name) {
                Some(rest) => rest.trim_start_matches(':').trim().to_owned(),
                None => t,
            });
        Err(AmdGpuError::Status {
            call,
            code: status,
            name,
            detail,
        })
    }
}

/// `hsa_iterate_agents` callback.
type AgentCallback = unsafe extern "C" fn(Agent, *mut c_void) -> Status;
/// `hsa_amd_agent_iterate_memory_pools` callback.
type PoolCallback = unsafe extern "C" fn(MemoryPool, *mut c_void) -> Status;

macro_rules! hsa_table {
    ($($name:ident: fn($($arg:ty),*) $(-> $ret:ty)?;)*) => {
        /// The HSA functions this crate calls, resolved from one loaded library.
        ///
        /// Every field is a function of the runtime kept alive by [`LibHsa`]'s library;
        /// calling one is `unsafe` with the preconditions `hsa.h` states for it.
        #[allow(non_snake_case)]
        struct Table {
            $($name: unsafe extern "C" fn($($arg),*) $(-> $ret)?,)*
        }

        /// The names of the functions in the table, in table order.
        pub const FUNCTIONS: &[&str] = &[$(stringify!($name)),*];

        impl Table {
            fn resolve(library: &Library, soname: &str) -> Result<Table, AmdGpuError> {
                $(
                    // SAFETY: the type is the prototype `hsa.h` / `hsa_ext_amd.h` declare for
                    // this name (checked by hand against the ROCm 5.2 headers); the copied
                    // function pointer stays valid because the library moves into `LibHsa`
                    // beside the table.
                    let $name = unsafe {
                        *library
                            .get::<unsafe extern "C" fn($($arg),*) $(-> $ret)?>(
                                concat!(stringify!($name), "\0").as_bytes(),
                            )
                            .map_err(|e| AmdGpuError::NoRuntime(format!(
                                "{soname} lacks {}: {e}", stringify!($name)
                            )))?
                    };
                )*
                Ok(Table { $($name,)* })
            }
        }
    };
}

hsa_table! {
    hsa_init: fn() -> Status;
    hsa_shut_down: fn() -> Status;
    hsa_status_string: fn(Status, *mut *const c_char) -> Status;
    hsa_system_get_info: fn(u32, *mut c_void) -> Status;
    hsa_iterate_agents: fn(AgentCallback, *mut c_void) -> Status;
    hsa_agent_get_info: fn(Agent, u32, *mut c_void) -> Status;
    hsa_amd_agent_iterate_memory_pools: fn(Agent, PoolCallback, *mut c_void) -> Status;
    hsa_amd_memory_pool_get_info: fn(MemoryPool, u32, *mut c_void) -> Status;
    hsa_amd_memory_pool_allocate: fn(MemoryPool, usize, u32, *mut *mut c_void) -> Status;
    hsa_amd_memory_pool_free: fn(*mut c_void) -> Status;
    hsa_amd_agents_allow_access: fn(u32, *const Agent, *const u32, *const c_void) -> Status;
    hsa_memory_copy: fn(*mut c_void, *const c_void, usize) -> Status;
    hsa_code_object_reader_create_from_memory: fn(*const c_void, usize, *mut CodeObjectReader) -> Status;
    hsa_code_object_reader_destroy: fn(CodeObjectReader) -> Status;
    hsa_executable_create_alt: fn(u32, u32, *const c_char, *mut Executable) -> Status;
    hsa_executable_load_agent_code_object:
        fn(Executable, Agent, CodeObjectReader, *const c_char, *mut LoadedCodeObject) -> Status;
    hsa_executable_freeze: fn(Executable, *const c_char) -> Status;
    hsa_executable_destroy: fn(Executable) -> Status;
    hsa_executable_get_symbol_by_name:
        fn(Executable, *const c_char, *const Agent, *mut ExecutableSymbol) -> Status;
    hsa_executable_symbol_get_info: fn(ExecutableSymbol, u32, *mut c_void) -> Status;
    hsa_signal_create: fn(i64, u32, *const Agent, *mut Signal) -> Status;
    hsa_signal_destroy: fn(Signal) -> Status;
    hsa_signal_store_screlease: fn(Signal, i64);
    hsa_signal_wait_scacquire: fn(Signal, u32, i64, u64, u32) -> i64;
    hsa_queue_create:
        fn(Agent, u32, u32, Option<QueueCallback>, *mut c_void, u32, u32, *mut *mut Queue) -> Status;
    hsa_queue_destroy: fn(*mut Queue) -> Status;
    hsa_queue_inactivate: fn(*mut Queue) -> Status;
    hsa_queue_add_write_index_scacq_screl: fn(*const Queue, u64) -> u64;
    hsa_queue_load_read_index_scacquire: fn(*const Queue) -> u64;
}

/// The real runtime: `libhsa-runtime64` and its resolved table. The library stays loaded as
/// long as the table exists, so the function pointers stay valid.
pub struct LibHsa {
    table: Table,
    _library: Library,
}

impl std::fmt::Debug for LibHsa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LibHsa").finish_non_exhaustive()
    }
}

impl LibHsa {
    /// Loads `soname` and resolves every function of the table.
    pub fn load(soname: &str) -> Result<LibHsa, AmdGpuError> {
        // SAFETY: loading a shared object runs its ELF initialisers. The HSA runtime's only set
        // up the runtime's own globals (it does nothing until `hsa_init`), and we unload it only
        // when the table drops, after the plugin has shut the runtime down.
        let library = unsafe { Library::new(soname) }
            .map_err(|e| AmdGpuError::NoRuntime(format!("cannot load {soname}: {e}")))?;
        let table = Table::resolve(&library, soname)?;
        Ok(LibHsa {
            table,
            _library: library,
        })
    }
}

/// Pushes each item an HSA iteration hands out onto the `Vec<T>` behind `data`.
unsafe extern "C" fn push<T>(item: T, data: *mut c_void) -> Status {
    // SAFETY: `data` is the `&mut Vec<T>` the iterating call passed, alive for the iteration
    // (iterations are synchronous and call back on the calling thread).
    let list = unsafe { &mut *data.cast::<Vec<T>>() };
    list.push(item);
    STATUS_SUCCESS
}

// Each method below makes one call through the table. The common argument for every `unsafe`
// block: the function pointer is the runtime's entry point of exactly this type
// (`Table::resolve`), and the library is loaded while `self` exists. Per call, the pointer
// arguments are added.
impl HsaApi for LibHsa {
    fn init(&self) -> HsaResult<()> {
        // SAFETY: no arguments; `hsa_init` may be called repeatedly (reference-counted).
        let rc = unsafe { (self.table.hsa_init)() };
        self.check("hsa_init", rc)
    }

    unsafe fn shut_down(&self) -> HsaResult<()> {
        // SAFETY: the caller balances a successful `hsa_init` and uses no object afterwards.
        let rc = unsafe { (self.table.hsa_shut_down)() };
        self.check("hsa_shut_down", rc)
    }

    fn status_string(&self, status: Status) -> Option<String> {
        let mut text: *const c_char = core::ptr::null();
        // SAFETY: `hsa_status_string` may be called before `hsa_init`; it writes a pointer to a
        // static NUL-terminated string into `text`, which outlives this call.
        let rc = unsafe { (self.table.hsa_status_string)(status, &mut text) };
        if rc != STATUS_SUCCESS || text.is_null() {
            return None;
        }
        // SAFETY: non-null and NUL-terminated per `hsa.h`; static storage in the runtime.
        Some(
            unsafe { CStr::from_ptr(text) }
                .to_string_lossy()
                .into_owned(),
        )
    }

    fn timestamp_frequency(&self) -> HsaResult<u64> {
        let mut ticks = 0u64;
        // SAFETY: TIMESTAMP_FREQUENCY is a u64 attribute; valid out-pointer.
        let rc = unsafe {
            (self.table.hsa_system_get_info)(
                SYSTEM_INFO_TIMESTAMP_FREQUENCY,
                (&raw mut ticks).cast(),
            )
        };
        self.check("hsa_system_get_info", rc)?;
        Ok(ticks)
    }

    fn agents(&self) -> HsaResult<Vec<Agent>> {
        let mut list: Vec<Agent> = Vec::new();
        // SAFETY: `push::<Agent>` matches the callback prototype and casts `data` back to this
        // Vec, which outlives the synchronous iteration.
        let rc = unsafe { (self.table.hsa_iterate_agents)(push::<Agent>, (&raw mut list).cast()) };
        self.check("hsa_iterate_agents", rc)?;
        Ok(list)
    }

    fn agent_u32(&self, agent: Agent, attribute: AgentU32) -> HsaResult<u32> {
        let mut value = 0u32;
        // SAFETY: every `AgentU32` attribute is a u32 or u32-sized enum; valid out-pointer.
        let rc = unsafe {
            (self.table.hsa_agent_get_info)(agent, attribute as u32, (&raw mut value).cast())
        };
        self.check("hsa_agent_get_info", rc)?;
        Ok(value)
    }

    fn agent_name(&self, agent: Agent, attribute: AgentName) -> HsaResult<String> {
        let mut buf = [0u8; 65];
        // SAFETY: every `AgentName` attribute is a char[64]; `buf` has 65 bytes, the last
        // stays NUL.
        let rc = unsafe {
            (self.table.hsa_agent_get_info)(agent, attribute as u32, buf.as_mut_ptr().cast())
        };
        self.check("hsa_agent_get_info", rc)?;
        let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
        Ok(String::from_utf8_lossy(&buf[..end]).trim().to_owned())
    }

    fn memory_pools(&self, agent: Agent) -> HsaResult<Vec<MemoryPool>> {
        let mut list: Vec<MemoryPool> = Vec::new();
        // SAFETY: as in `agents`.
        let rc = unsafe {
            (self.table.hsa_amd_agent_iterate_memory_pools)(
                agent,
                push::<MemoryPool>,
                (&raw mut list).cast(),
            )
        };
        self.check("hsa_amd_agent_iterate_memory_pools", rc)?;
        Ok(list)
    }

    fn pool_info(&self, pool: MemoryPool) -> HsaResult<PoolInfo> {
        let (mut segment, mut global_flags, mut allowed) = (0u32, 0u32, false);
        let get = self.table.hsa_amd_memory_pool_get_info;
        // SAFETY: SEGMENT is an enum (u32), GLOBAL_FLAGS a u32, RUNTIME_ALLOC_ALLOWED a bool;
        // each out-pointer has that type.
        unsafe {
            let call = "hsa_amd_memory_pool_get_info";
            self.check(
                call,
                get(pool, POOL_INFO_SEGMENT, (&raw mut segment).cast()),
            )?;
            self.check(
                call,
                get(pool, POOL_INFO_GLOBAL_FLAGS, (&raw mut global_flags).cast()),
            )?;
            self.check(
                call,
                get(
                    pool,
                    POOL_INFO_RUNTIME_ALLOC_ALLOWED,
                    (&raw mut allowed).cast(),
                ),
            )?;
        }
        Ok(PoolInfo {
            segment,
            global_flags,
            runtime_alloc_allowed: allowed,
        })
    }

    fn pool_allocate(&self, pool: MemoryPool, len: usize) -> HsaResult<*mut u8> {
        let mut ptr: *mut c_void = core::ptr::null_mut();
        // SAFETY: a valid out-pointer; flags must be 0; the runtime rejects unknown pools.
        let rc = unsafe { (self.table.hsa_amd_memory_pool_allocate)(pool, len, 0, &mut ptr) };
        self.check("hsa_amd_memory_pool_allocate", rc)?;
        Ok(ptr.cast())
    }

    unsafe fn pool_free(&self, ptr: *mut u8) -> HsaResult<()> {
        // SAFETY: the caller guarantees a live pool block nobody uses.
        let rc = unsafe { (self.table.hsa_amd_memory_pool_free)(ptr.cast()) };
        self.check("hsa_amd_memory_pool_free", rc)
    }

    unsafe fn agents_allow_access(&self, agents: &[Agent], ptr: *mut u8) -> HsaResult<()> {
        // SAFETY: `agents` is a live slice of `agents.len()` agents; null flags are allowed
        // (hsa_ext_amd.h: "reserved, must be NULL"); the caller vouches for `ptr`.
        let rc = unsafe {
            (self.table.hsa_amd_agents_allow_access)(
                agents.len() as u32,
                agents.as_ptr(),
                core::ptr::null(),
                ptr.cast(),
            )
        };
        self.check("hsa_amd_agents_allow_access", rc)
    }

    unsafe fn copy_to_device(&self, dst: u64, src: &[u8]) -> HsaResult<()> {
        // SAFETY: the runtime reads `src.len()` bytes of `src`; the caller vouches for `dst`.
        let rc = unsafe {
            (self.table.hsa_memory_copy)(dst as *mut c_void, src.as_ptr().cast(), src.len())
        };
        self.check("hsa_memory_copy", rc)
    }

    unsafe fn copy_from_device(&self, dst: &mut [u8], src: u64) -> HsaResult<()> {
        // SAFETY: the runtime writes `dst.len()` bytes into `dst`, which we borrow mutably;
        // the caller vouches for `src`.
        let rc = unsafe {
            (self.table.hsa_memory_copy)(dst.as_mut_ptr().cast(), src as *const c_void, dst.len())
        };
        self.check("hsa_memory_copy", rc)
    }

    unsafe fn code_object_reader_create(&self, bytes: &[u8]) -> HsaResult<CodeObjectReader> {
        let mut reader = CodeObjectReader::default();
        // SAFETY: `bytes` is valid for `bytes.len()` bytes and, by the caller, outlives the
        // reader; valid out-pointer.
        let rc = unsafe {
            (self.table.hsa_code_object_reader_create_from_memory)(
                bytes.as_ptr().cast(),
                bytes.len(),
                &mut reader,
            )
        };
        self.check("hsa_code_object_reader_create_from_memory", rc)?;
        Ok(reader)
    }

    fn code_object_reader_destroy(&self, reader: CodeObjectReader) -> HsaResult<()> {
        // SAFETY: a handle; executables do not depend on their readers.
        let rc = unsafe { (self.table.hsa_code_object_reader_destroy)(reader) };
        self.check("hsa_code_object_reader_destroy", rc)
    }

    fn executable_create(&self) -> HsaResult<Executable> {
        let mut executable = Executable::default();
        // SAFETY: valid enum values, null options allowed, valid out-pointer.
        let rc = unsafe {
            (self.table.hsa_executable_create_alt)(
                PROFILE_FULL,
                DEFAULT_FLOAT_ROUNDING_MODE_DEFAULT,
                core::ptr::null(),
                &mut executable,
            )
        };
        self.check("hsa_executable_create_alt", rc)?;
        Ok(executable)
    }

    fn executable_load_agent_code_object(
        &self,
        executable: Executable,
        agent: Agent,
        reader: CodeObjectReader,
    ) -> HsaResult<()> {
        let mut loaded = LoadedCodeObject::default();
        // SAFETY: handles (the runtime validates them), null options, valid out-pointer.
        let rc = unsafe {
            (self.table.hsa_executable_load_agent_code_object)(
                executable,
                agent,
                reader,
                core::ptr::null(),
                &mut loaded,
            )
        };
        self.check("hsa_executable_load_agent_code_object", rc)
    }

    fn executable_freeze(&self, executable: Executable) -> HsaResult<()> {
        // SAFETY: a handle; null options allowed.
        let rc = unsafe { (self.table.hsa_executable_freeze)(executable, core::ptr::null()) };
        self.check("hsa_executable_freeze", rc)
    }

    unsafe fn executable_destroy(&self, executable: Executable) -> HsaResult<()> {
        // SAFETY: the caller guarantees no kernel of it runs and nothing uses its variables.
        let rc = unsafe { (self.table.hsa_executable_destroy)(executable) };
        self.check("hsa_executable_destroy", rc)
    }

    fn executable_symbol(
        &self,
        executable: Executable,
        name: &CStr,
        agent: Agent,
    ) -> HsaResult<ExecutableSymbol> {
        let mut symbol = ExecutableSymbol::default();
        // SAFETY: `name` is NUL-terminated, `agent` a live local, valid out-pointer.
        let rc = unsafe {
            (self.table.hsa_executable_get_symbol_by_name)(
                executable,
                name.as_ptr(),
                &agent,
                &mut symbol,
            )
        };
        self.check("hsa_executable_get_symbol_by_name", rc)?;
        Ok(symbol)
    }

    unsafe fn executable_symbol_get_info(
        &self,
        symbol: ExecutableSymbol,
        attribute: u32,
        value: *mut c_void,
    ) -> HsaResult<()> {
        // SAFETY: the caller guarantees `value` has the attribute's size.
        let rc = unsafe { (self.table.hsa_executable_symbol_get_info)(symbol, attribute, value) };
        self.check("hsa_executable_symbol_get_info", rc)
    }

    fn signal_create(&self, initial: i64) -> HsaResult<Signal> {
        let mut signal = Signal::default();
        // SAFETY: a null consumer list with count 0 is allowed (hsa.h); valid out-pointer.
        let rc =
            unsafe { (self.table.hsa_signal_create)(initial, 0, core::ptr::null(), &mut signal) };
        self.check("hsa_signal_create", rc)?;
        Ok(signal)
    }

    unsafe fn signal_destroy(&self, signal: Signal) -> HsaResult<()> {
        // SAFETY: the caller guarantees the signal is live and unused.
        let rc = unsafe { (self.table.hsa_signal_destroy)(signal) };
        self.check("hsa_signal_destroy", rc)
    }

    unsafe fn signal_store_screlease(&self, signal: Signal, value: i64) {
        // SAFETY: the caller guarantees the signal is live.
        unsafe { (self.table.hsa_signal_store_screlease)(signal, value) }
    }

    unsafe fn signal_wait_scacquire(
        &self,
        signal: Signal,
        condition: u32,
        compare: i64,
        timeout_ticks: u64,
    ) -> i64 {
        // SAFETY: the caller guarantees the signal is live; valid enum values.
        unsafe {
            (self.table.hsa_signal_wait_scacquire)(
                signal,
                condition,
                compare,
                timeout_ticks,
                WAIT_STATE_BLOCKED,
            )
        }
    }

    unsafe fn queue_create(
        &self,
        agent: Agent,
        size: u32,
        callback: QueueCallback,
        data: *mut c_void,
    ) -> HsaResult<*mut Queue> {
        let mut queue: *mut Queue = core::ptr::null_mut();
        // SAFETY: the callback matches the prototype and the caller vouches for `data`;
        // u32::MAX segment sizes mean "no hint" (hsa.h); valid out-pointer.
        let rc = unsafe {
            (self.table.hsa_queue_create)(
                agent,
                size,
                QUEUE_TYPE_MULTI,
                Some(callback),
                data,
                u32::MAX,
                u32::MAX,
                &mut queue,
            )
        };
        self.check("hsa_queue_create", rc)?;
        Ok(queue)
    }

    unsafe fn queue_destroy(&self, queue: *mut Queue) -> HsaResult<()> {
        // SAFETY: the caller guarantees a live queue nothing uses.
        let rc = unsafe { (self.table.hsa_queue_destroy)(queue) };
        self.check("hsa_queue_destroy", rc)
    }

    unsafe fn queue_inactivate(&self, queue: *mut Queue) -> HsaResult<()> {
        // SAFETY: the caller guarantees a live queue.
        let rc = unsafe { (self.table.hsa_queue_inactivate)(queue) };
        self.check("hsa_queue_inactivate", rc)
    }

    unsafe fn queue_add_write_index(&self, queue: *mut Queue, count: u64) -> u64 {
        // SAFETY: the caller guarantees a live queue.
        unsafe { (self.table.hsa_queue_add_write_index_scacq_screl)(queue, count) }
    }

    unsafe fn queue_load_read_index(&self, queue: *mut Queue) -> u64 {
        // SAFETY: the caller guarantees a live queue.
        unsafe { (self.table.hsa_queue_load_read_index_scacquire)(queue) }
    }
}

static DEFAULT: OnceLock<Result<Arc<LibHsa>, String>> = OnceLock::new();

/// The runtime for [`LIBRARY`], loaded on first use and kept for the process's lifetime (the
/// runtime spawns threads of its own; unloading it under them is not worth the risk).
pub fn table() -> Result<Arc<dyn HsaApi>, AmdGpuError> {
    match DEFAULT.get_or_init(|| {
        LibHsa::load(LIBRARY)
            .map(Arc::new)
            .map_err(|e| e.to_string())
    }) {
        Ok(hsa) => Ok(hsa.clone()),
        Err(reason) => Err(AmdGpuError::NoRuntime(reason.clone())),
    }
}

/// The runtime from another library name (tests, or a runtime outside the loader's search
/// path). The default name goes through [`table`]; any other name is loaded anew and, like the
/// default one, never unloaded (one reference is leaked on purpose).
pub fn table_for(soname: &str) -> Result<Arc<dyn HsaApi>, AmdGpuError> {
    if soname == LIBRARY {
        return table();
    }
    let hsa = Arc::new(LibHsa::load(soname)?);
    std::mem::forget(Arc::clone(&hsa));
    Ok(hsa)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_library_is_an_error_value_naming_the_library() {
        let err = LibHsa::load("libhsa-runtime-does-not-exist.so.7").expect_err("must not load");
        let text = err.to_string();
        assert!(matches!(err, AmdGpuError::NoRuntime(_)));
        assert!(
            text.contains("libhsa-runtime-does-not-exist.so.7"),
            "{text}"
        );
    }

    #[test]
    fn a_library_without_the_hsa_symbols_names_the_first_missing_one() {
        // libc is loaded in every process and exports none of the HSA functions.
        let err = LibHsa::load("libc.so.6").expect_err("libc is not an HSA runtime");
        assert!(err.to_string().contains("lacks hsa_init"), "{err}");
    }

    #[test]
    fn the_table_lists_each_function_once() {
        let mut names = FUNCTIONS.to_vec();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), FUNCTIONS.len());
        assert!(FUNCTIONS.iter().all(|n| n.starts_with("hsa_")));
    }
}

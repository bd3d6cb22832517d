//! The HSA runtime, loaded at run time (STYLE 11): one typed table of only the functions this
//! crate calls, resolved from `libhsa-runtime64.so.1` with `libloading`, built once.
//!
//! Nothing here links against HSA, so the crate builds and its tests run on machines without
//! ROCm. A missing library or symbol is an [`HsaError::NoRuntime`] value, never a panic; the
//! plugin turns it into "zero devices" plus the reason.
//!
//! The types and constants below are declared from `hsa.h`, `hsa_ext_amd.h` and
//! `amd_hsa_signal.h` (ROCm 5.2, as Debian packages it); only what the crate uses.
//! C enums are passed as `u32` (an `int`-sized enum in the SysV ABI).

use core::ffi::{c_char, c_void, CStr};
use std::sync::OnceLock;

use libloading::Library;
use static_assertions::const_assert_eq;

use crate::error::{status_name, HsaError};

/// The soname the runtime is loaded from.
pub const LIBRARY: &str = "libhsa-runtime64.so.1";

/// `hsa_status_t`.
pub type Status = u32;
pub const STATUS_SUCCESS: Status = 0x0;
pub const STATUS_INFO_BREAK: Status = 0x1;

macro_rules! handle {
    ($($(#[$doc:meta])* $name:ident;)*) => {$(
        $(#[$doc])*
        #[repr(C)]
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
        pub struct $name {
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
    pub queue_type: u32,
    pub features: u32,
    /// The ring of `size` 64-byte AQL packets.
    pub base_address: *mut c_void,
    /// Stores of the last written packet index ring the packet processor.
    pub doorbell_signal: Signal,
    /// Packets in the ring (a power of two).
    pub size: u32,
    pub reserved1: u32,
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
    pub kind: i64,
    pub value: i64,
    pub event_mailbox_ptr: u64,
    pub event_id: u32,
    pub reserved1: u32,
    pub start_ts: u64,
    pub end_ts: u64,
    pub queue_ptr: u64,
    pub reserved3: [u32; 2],
}
const_assert_eq!(core::mem::size_of::<AmdSignal>(), 64);
const_assert_eq!(core::mem::offset_of!(AmdSignal, value), 8);
const_assert_eq!(core::mem::offset_of!(AmdSignal, event_mailbox_ptr), 16);
const_assert_eq!(core::mem::offset_of!(AmdSignal, event_id), 24);
/// `AMD_SIGNAL_KIND_USER`: a signal whose `value` is memory (not a hardware doorbell).
pub const AMD_SIGNAL_KIND_USER: i64 = 1;

// hsa_system_info_t
pub const SYSTEM_INFO_TIMESTAMP_FREQUENCY: u32 = 3;

// hsa_agent_info_t / hsa_amd_agent_info_t
pub const AGENT_INFO_NAME: u32 = 0; // char[64]
pub const AGENT_INFO_WAVEFRONT_SIZE: u32 = 6; // u32
pub const AGENT_INFO_QUEUE_MAX_SIZE: u32 = 14; // u32
pub const AGENT_INFO_DEVICE: u32 = 17; // hsa_device_type_t
pub const AMD_AGENT_INFO_COMPUTE_UNIT_COUNT: u32 = 0xA002; // u32
pub const AMD_AGENT_INFO_PRODUCT_NAME: u32 = 0xA009; // char[64]
pub const AMD_AGENT_INFO_MAX_WAVES_PER_CU: u32 = 0xA00A; // u32

// hsa_device_type_t
pub const DEVICE_TYPE_CPU: u32 = 0;
pub const DEVICE_TYPE_GPU: u32 = 1;

// hsa_amd_memory_pool_info_t, hsa_amd_segment_t, hsa_amd_memory_pool_global_flag_t
pub const POOL_INFO_SEGMENT: u32 = 0; // hsa_amd_segment_t
pub const POOL_INFO_GLOBAL_FLAGS: u32 = 1; // u32
pub const POOL_INFO_RUNTIME_ALLOC_ALLOWED: u32 = 5; // bool
pub const SEGMENT_GLOBAL: u32 = 0;
pub const POOL_FLAG_KERNARG_INIT: u32 = 1;
pub const POOL_FLAG_FINE_GRAINED: u32 = 2;
pub const POOL_FLAG_COARSE_GRAINED: u32 = 4;

// hsa_profile_t, hsa_default_float_rounding_mode_t
pub const PROFILE_FULL: u32 = 1;
pub const DEFAULT_FLOAT_ROUNDING_MODE_DEFAULT: u32 = 0;

// hsa_executable_symbol_info_t, hsa_symbol_kind_t
pub const SYMBOL_INFO_TYPE: u32 = 0; // hsa_symbol_kind_t
pub const SYMBOL_INFO_VARIABLE_SIZE: u32 = 9; // u32
pub const SYMBOL_INFO_KERNEL_KERNARG_SEGMENT_SIZE: u32 = 11; // u32
pub const SYMBOL_INFO_KERNEL_KERNARG_SEGMENT_ALIGNMENT: u32 = 12; // u32
pub const SYMBOL_INFO_KERNEL_GROUP_SEGMENT_SIZE: u32 = 13; // u32
pub const SYMBOL_INFO_KERNEL_PRIVATE_SEGMENT_SIZE: u32 = 14; // u32
pub const SYMBOL_INFO_KERNEL_DYNAMIC_CALLSTACK: u32 = 15; // bool (1 byte)
pub const SYMBOL_INFO_VARIABLE_ADDRESS: u32 = 21; // u64
pub const SYMBOL_INFO_KERNEL_OBJECT: u32 = 22; // u64
pub const SYMBOL_KIND_VARIABLE: u32 = 0;
pub const SYMBOL_KIND_KERNEL: u32 = 1;

// hsa_signal_condition_t, hsa_wait_state_t
pub const SIGNAL_CONDITION_NE: u32 = 1;
pub const SIGNAL_CONDITION_LT: u32 = 2;
pub const WAIT_STATE_BLOCKED: u32 = 0;

// hsa_queue_type_t
pub const QUEUE_TYPE_MULTI: u32 = 0;

/// `hsa_iterate_agents` callback.
pub type AgentCallback = unsafe extern "C" fn(Agent, *mut c_void) -> Status;
/// `hsa_amd_agent_iterate_memory_pools` callback.
pub type PoolCallback = unsafe extern "C" fn(MemoryPool, *mut c_void) -> Status;
/// `hsa_queue_create` error callback.
pub type QueueCallback = unsafe extern "C" fn(Status, *mut Queue, *mut c_void);

macro_rules! hsa_table {
    ($($name:ident: fn($($arg:ty),*) $(-> $ret:ty)?;)*) => {
        /// The HSA functions this crate calls, resolved from one loaded library.
        ///
        /// Every field is a function of the runtime kept alive by `_library`; calling one is
        /// `unsafe` with the preconditions `hsa.h` states for it.
        pub struct Hsa {
            $(pub $name: unsafe extern "C" fn($($arg),*) $(-> $ret)?,)*
            _library: Library,
        }

        /// The names of the functions in [`Hsa`], in table order.
        pub const FUNCTIONS: &[&str] = &[$(stringify!($name)),*];

        impl Hsa {
            fn resolve(library: Library, soname: &str) -> Result<Hsa, HsaError> {
                $(
                    // SAFETY: the type is the prototype `hsa.h` / `hsa_ext_amd.h` declare for
                    // this name (checked by hand against the ROCm 5.2 headers); the copied
                    // function pointer stays valid because `library` moves into the table.
                    let $name = unsafe {
                        *library
                            .get::<unsafe extern "C" fn($($arg),*) $(-> $ret)?>(
                                concat!(stringify!($name), "\0").as_bytes(),
                            )
                            .map_err(|e| HsaError::NoRuntime(format!(
                                "{soname} lacks {}: {e}", stringify!($name)
                            )))?
                    };
                )*
                Ok(Hsa { $($name,)* _library: library })
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

impl Hsa {
    /// Loads `soname` and resolves every function of the table.
    pub fn load(soname: &str) -> Result<Hsa, HsaError> {
        // SAFETY: loading a shared object runs its ELF initialisers. The HSA runtime's only set
        // up the runtime's own globals (it does nothing until `hsa_init`), and we unload it only
        // when the table drops, after the plugin has shut the runtime down.
        let library = unsafe { Library::new(soname) }
            .map_err(|e| HsaError::NoRuntime(format!("cannot load {soname}: {e}")))?;
        Hsa::resolve(library, soname)
    }

    /// `Ok(())` for `HSA_STATUS_SUCCESS` (and `INFO_BREAK`, which ends an iteration early),
    /// otherwise an [`HsaError::Status`] naming `call`.
    pub fn check(&self, call: &'static str, status: Status) -> Result<(), HsaError> {
        if status == STATUS_SUCCESS || status == STATUS_INFO_BREAK {
            return Ok(());
        }
        let name = status_name(status);
        // ROCr's text repeats the name ("HSA_STATUS_ERROR_...: text"); keep only the text.
        let detail = self
            .status_text(status)
            .map(|t| match t.strip_prefix(name) {
                Some(rest) => rest.trim_start_matches(':').trim().to_owned(),
                None => t,
            });
        Err(HsaError::Status {
            call,
            code: status,
            name,
            detail,
        })
    }

    /// The runtime's description of `status` (`hsa_status_string`), if it gives one.
    pub fn status_text(&self, status: Status) -> Option<String> {
        let mut text: *const c_char = core::ptr::null();
        // SAFETY: `hsa_status_string` may be called before `hsa_init`; it writes a pointer to a
        // static NUL-terminated string into `text`, which outlives this call.
        let rc = unsafe { (self.hsa_status_string)(status, &mut text) };
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
}

static DEFAULT: OnceLock<Result<Hsa, String>> = OnceLock::new();

/// The table for [`LIBRARY`], loaded on first use and kept for the process's lifetime (the
/// runtime spawns threads of its own; unloading it under them is not worth the risk).
pub fn table() -> Result<&'static Hsa, HsaError> {
    DEFAULT
        .get_or_init(|| Hsa::load(LIBRARY).map_err(|e| e.to_string()))
        .as_ref()
        .map_err(|reason| HsaError::NoRuntime(reason.clone()))
}

/// The table for another library name (tests, or a runtime outside the loader's search path).
/// The default name goes through [`table`]; any other name is loaded anew and kept for the
/// process's lifetime (leaked), like the default one.
pub fn table_for(soname: &str) -> Result<&'static Hsa, HsaError> {
    if soname == LIBRARY {
        return table();
    }
    Ok(Box::leak(Box::new(Hsa::load(soname)?)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_library_is_an_error_value_naming_the_library() {
        let err = Hsa::load("libhsa-runtime-does-not-exist.so.7")
            .err()
            .expect("must not load");
        let text = err.to_string();
        assert!(matches!(err, HsaError::NoRuntime(_)));
        assert!(
            text.contains("libhsa-runtime-does-not-exist.so.7"),
            "{text}"
        );
    }

    #[test]
    fn a_library_without_the_hsa_symbols_names_the_first_missing_one() {
        // libc is loaded in every process and exports none of the HSA functions.
        let err = Hsa::load("libc.so.6")
            .err()
            .expect("libc is not an HSA runtime");
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

//! Native host images: an ELF shared object (what `cc -shared` makes) as an image, so a C
//! program can hand the host plugin kernels (see `docs/plugins.md`, "Native host images").
//!
//! - Loading writes the bytes to a memfd and `dlopen`s it (`RTLD_NOW | RTLD_LOCAL`), so each
//!   load is an object of its own, with its own globals (the memfd stays open while the
//!   object is loaded, so its `/proc/self/fd/N` path names no other image meanwhile).
//! - A kernel is an exported function (`STT_FUNC`) of [`plugin_abi::RpcHostKernelFn`]'s type,
//!   called once per warp with a [`plugin_abi::RpcHostWarp`] and the launch's arguments.
//! - The image's `__llvm_rpc_client` data symbol, if it exports one (of a client object's
//!   size, 552 bytes for v1 or 2096 for v2, 8-aligned), is where the glue writes the
//!   mailbox's client object, as on a GPU; its lock words are the warps' lock bits. Without
//!   it the image uses no RPC.

use std::ffi::{c_int, c_void, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use plugin_abi::{
    RpcHostKernelFn, RpcHostWarp, RPC_ERR_INVALID, RPC_ERR_OTHER, RPC_ERR_PANIC, RPC_OK,
};
use rpc_core::plugin::CLIENT_SYMBOL;
use rpc_core::protocol::{Generation, Opcode};

use crate::error::HostError;
use crate::kernel::{Kernel, Warp};
use crate::memory::RawMemory;

/// glibc's `RTLD_DL_SYMENT`: `dladdr1` returns the symbol's ELF entry.
const RTLD_DL_SYMENT: c_int = 1;
/// An ELF symbol of a function.
const STT_FUNC: u8 = 2;

/// Whether `bytes` are an ELF object (rather than the name of a registered image).
pub(crate) fn is_elf(bytes: &[u8]) -> bool {
    bytes.starts_with(b"\x7fELF")
}

/// The text of the calling thread's last `dl*` failure.
fn dl_error() -> String {
    // SAFETY: `dlerror` returns null or a NUL-terminated string valid until the next `dl*`
    // call on this thread; it is copied at once.
    let text = unsafe { libc::dlerror() };
    if text.is_null() {
        "unknown error".into()
    } else {
        // SAFETY: non-null, NUL-terminated (above).
        unsafe { CStr::from_ptr(text) }
            .to_string_lossy()
            .into_owned()
    }
}

/// A native image `dlopen`ed from its bytes; `dlclose`d when the last user (a loaded image,
/// a kernel, its client object) lets it go.
pub(crate) struct NativeLibrary {
    handle: *mut c_void,
    /// The memfd it was loaded from, open while the object is loaded: the dynamic loader
    /// knows an object by the path it was opened with (`/proc/self/fd/N`), so no other image
    /// may get this `N` while this one is loaded, or `dlopen` would return this one.
    _memfd: std::fs::File,
}

// SAFETY: a `dlopen` handle may be used (`dlsym`) and closed from any thread.
unsafe impl Send for NativeLibrary {}
// SAFETY: as above; `dlsym` is thread-safe.
unsafe impl Sync for NativeLibrary {}

impl Drop for NativeLibrary {
    fn drop(&mut self) {
        // SAFETY: the handle `open` got, closed once, when nothing found in it is used (every
        // user holds this library's `Arc`).
        unsafe { libc::dlclose(self.handle) };
    }
}

impl NativeLibrary {
    /// Loads the shared object `bytes`.
    pub(crate) fn open(bytes: &[u8]) -> Result<Arc<Self>, HostError> {
        let fail = |what: &str, why: String| HostError::NativeImage(format!("{what}: {why}"));
        // SAFETY: a NUL-terminated name and a valid flag.
        let fd = unsafe { libc::memfd_create(c"rpc-host-image".as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(fail(
                "memfd_create",
                std::io::Error::last_os_error().to_string(),
            ));
        }
        // SAFETY: `fd` is ours, open, and owned by this `File` from here on.
        let mut file = unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        std::io::Write::write_all(&mut file, bytes).map_err(|e| fail("write", e.to_string()))?;
        let path = CString::new(format!("/proc/self/fd/{fd}")).expect("no NUL in a path of digits");
        // SAFETY: a NUL-terminated path and valid flags. Loading runs the object's
        // initialisers: the trust a program gives any image it loads.
        let handle = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if handle.is_null() {
            return Err(fail("dlopen", dl_error()));
        }
        Ok(Arc::new(NativeLibrary {
            handle,
            _memfd: file,
        }))
    }

    /// The address of `name` and its ELF symbol's type and size, if this object defines it.
    fn symbol(&self, name: &str) -> Option<(*mut c_void, u8, usize)> {
        let name = CString::new(name).ok()?;
        // SAFETY: a live handle and a NUL-terminated name.
        let addr = unsafe { libc::dlsym(self.handle, name.as_ptr()) };
        if addr.is_null() {
            return None;
        }
        // SAFETY: a zeroed `Dl_info` is a valid value of it (pointers and integers).
        let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
        let mut entry: *mut c_void = std::ptr::null_mut();
        // SAFETY: `addr` came from `dlsym`; `info` and `entry` are valid out pointers, and
        // with RTLD_DL_SYMENT `entry` receives a pointer to the symbol's `Elf64_Sym`.
        let found = unsafe { libc::dladdr1(addr, &mut info, &mut entry, RTLD_DL_SYMENT) };
        if found == 0 || entry.is_null() {
            return None;
        }
        // SAFETY: `entry` points to the object's symbol table entry, alive while it is loaded.
        let sym = unsafe { &*entry.cast::<libc::Elf64_Sym>() };
        Some((addr, sym.st_info & 0xf, sym.st_size as usize))
    }

    /// The image's client object (its `__llvm_rpc_client`) as memory the glue writes into,
    /// and its generation; None if the image uses no RPC.
    pub(crate) fn client_object(
        self: &Arc<Self>,
    ) -> Result<Option<(Generation, Arc<RawMemory>)>, HostError> {
        let Some((addr, _, size)) = self.symbol(CLIENT_SYMBOL) else {
            return Ok(None);
        };
        let generation = Generation::from_client_object_size(size).map_err(|_| {
            HostError::NativeImage(format!(
                "{CLIENT_SYMBOL} is {size} bytes, not a v1 ({}) or v2 ({}) client object",
                Generation::V1.client_object_size(),
                Generation::V2.client_object_size()
            ))
        })?;
        if addr as usize % 8 != 0 {
            return Err(HostError::NativeImage(format!(
                "{CLIENT_SYMBOL} at {addr:p} is not 8-byte aligned"
            )));
        }
        // SAFETY: the symbol is `size` bytes of the object's writable data (a client object
        // the image exports for the host to fill), 8-aligned, alive while `self` is: the
        // memory keeps this library's `Arc`. Only atomics of the client object's word sizes
        // touch it in this process.
        let memory = unsafe {
            RawMemory::borrowed(
                addr.cast(),
                size,
                generation.client_object_locks()..size,
                self.clone(),
            )
        };
        Ok(Some((generation, memory)))
    }

    /// The kernel `name`, if the image exports a function of that name.
    pub(crate) fn kernel(self: &Arc<Self>, name: &str) -> Option<Kernel> {
        let (addr, kind, _) = self.symbol(name)?;
        if kind != STT_FUNC {
            return None;
        }
        // SAFETY: an exported function of the image; the ABI says kernels have this type.
        let kernel: RpcHostKernelFn =
            unsafe { std::mem::transmute::<*mut c_void, RpcHostKernelFn>(addr) };
        let library = self.clone();
        Some(Arc::new(move |warp: &mut Warp<'_>| {
            let _loaded = &library;
            run(kernel, warp)
        }))
    }
}

/// Runs `kernel` for one warp.
fn run(kernel: RpcHostKernelFn, warp: &mut Warp<'_>) {
    let args = warp.args();
    let c_warp = RpcHostWarp {
        lane_size: warp.lane_size(),
        block: warp.block(),
        warp: warp.warp(),
        warps_per_block: warp.warps_per_block(),
        mask: warp.mask(),
        call,
        state: (warp as *mut Warp<'_>).cast(),
    };
    // SAFETY: the kernel's ABI: a warp valid for the call (it lives on this frame, and its
    // `state` is the `Warp` borrowed for the call) and the argument block's bytes.
    unsafe { kernel(&c_warp, args.as_ptr().cast(), args.len()) }
}

/// `RpcHostWarp::call`: one one-packet exchange through the warp's client.
unsafe extern "C" fn call(warp: *const RpcHostWarp, opcode: u32, buffers: *mut [u64; 8]) -> i32 {
    // No panic unwinds into the C kernel.
    let result = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: `warp` is the warp `run` passed this kernel, valid during its call.
        let Some(c_warp) = (unsafe { warp.as_ref() }) else {
            return RPC_ERR_INVALID;
        };
        if buffers.is_null() {
            return RPC_ERR_INVALID;
        }
        // SAFETY: `state` is the `Warp` `run` borrowed for the kernel's call, used only on
        // this thread; the kernel passes `lane_size` buffers (the ABI).
        let (warp, buffers) = unsafe {
            (
                &*c_warp.state.cast::<Warp<'_>>(),
                std::slice::from_raw_parts_mut(buffers, c_warp.lane_size as usize),
            )
        };
        let exchange = warp.open(Opcode(opcode)).and_then(|mut port| {
            let mut reply = vec![[0u64; 8]; buffers.len()];
            port.send_and_recv(
                |lane, packet| {
                    for (i, &word) in buffers[lane as usize].iter().enumerate() {
                        packet.set_word(i, word);
                    }
                },
                |lane, packet| reply[lane as usize] = std::array::from_fn(|i| packet.word(i)),
            )?;
            Ok(reply)
        });
        match exchange {
            Ok(reply) => {
                for lane in warp.lanes() {
                    buffers[lane as usize] = reply[lane as usize];
                }
                RPC_OK
            }
            Err(error) => {
                log::warn!("native kernel: call of opcode {opcode:#x}: {error}");
                RPC_ERR_OTHER
            }
        }
    }));
    result.unwrap_or(RPC_ERR_PANIC)
}

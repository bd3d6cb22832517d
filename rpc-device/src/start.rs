//! LLVM's start protocol for a Rust program ([`main!`](crate::main)): `_begin(argc, argv,
//! envp)` on one thread, `_start(argc, argv, envp, ret)` on the grid, where every thread runs
//! `main` and ors its result into `*ret` (the program's exit status), then `_end()` on one
//! thread. A Rust program has no constructors or `atexit` functions, so `_begin` and `_end`
//! do nothing on the GPUs.
//!
//! On the host the kernels are native kernels (`docs/plugins.md`): each is called once per
//! warp with the plugin's warp and the launch's argument block, which holds the same
//! arguments (`int argc` padded to 8 bytes, then `argv`, `envp` and `ret` as 8-byte
//! addresses).

use core::ffi::{c_char, CStr};
use core::sync::atomic::{AtomicI32, Ordering};

/// The program's command line and environment, as `main` gets them.
#[derive(Clone, Copy, Debug)]
pub struct Args {
    argc: i32,
    argv: *const *const c_char,
    envp: *const *const c_char,
}

impl Args {
    /// The number of arguments (`argv[0]` is the image).
    pub fn len(&self) -> usize {
        self.argc.max(0) as usize
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Argument `index`.
    pub fn get(&self, index: usize) -> Option<&'static CStr> {
        if index >= self.len() {
            return None;
        }
        // SAFETY: the loader's `argc` non-null, NUL-terminated strings, alive for the run.
        unsafe { Some(CStr::from_ptr(*self.argv.add(index))) }
    }

    /// The arguments.
    pub fn iter(&self) -> impl Iterator<Item = &'static CStr> + '_ {
        (0..self.len()).filter_map(|i| self.get(i))
    }

    /// The environment's `NAME=VALUE` strings.
    pub fn env(&self) -> impl Iterator<Item = &'static CStr> + '_ {
        let envp = self.envp;
        (0..)
            .map_while(move |i| {
                // SAFETY: the loader's null-terminated array of strings, alive for the run;
                // read up to its null.
                (!envp.is_null()).then(|| unsafe { *envp.add(i) })
            })
            .take_while(|p| !p.is_null())
            // SAFETY: a non-null entry: a NUL-terminated string.
            .map(|p| unsafe { CStr::from_ptr(p) })
    }
}

/// A program's `main`: its result is the exit status (or-ed over the threads, as LLVM's).
pub type Main = fn(Args) -> i32;

/// `_start`'s work on a GPU thread.
///
/// # Safety
/// The loader's arguments: `argc` strings at `argv`, a null-terminated `envp`, and `ret`, an
/// `int` every thread of the grid may or into.
#[doc(hidden)]
pub unsafe fn start(
    argc: i32,
    argv: *const *const c_char,
    envp: *const *const c_char,
    ret: *mut i32,
    main: Main,
) {
    let status = main(Args { argc, argv, envp });
    // SAFETY: the caller's; the loader reads it after the launch ends.
    let ret = unsafe { AtomicI32::from_ptr(ret) };
    // RMW: ors this thread's status in; relaxed, as the launch's end orders it for the host.
    ret.fetch_or(status, Ordering::Relaxed);
}

#[cfg(not(any(target_arch = "nvptx64", target_arch = "amdgpu")))]
pub use host::*;

#[cfg(not(any(target_arch = "nvptx64", target_arch = "amdgpu")))]
mod host {
    use super::*;
    pub use crate::arch::host::RpcHostWarp as HostWarp;

    /// The start arguments in a host launch's argument block, if it holds them.
    fn read(args: *const u8, len: usize) -> Option<[u64; 4]> {
        if args.is_null() || len < 32 {
            return None;
        }
        // SAFETY: `len` >= 32 bytes of the launch's argument block (the plugin's promise).
        let bytes = unsafe { core::slice::from_raw_parts(args, 32) };
        Some(core::array::from_fn(|i| {
            u64::from_le_bytes(bytes[8 * i..8 * i + 8].try_into().unwrap_or_default())
        }))
    }

    /// `_begin` on the host: installs the panic hook.
    #[doc(hidden)]
    pub fn host_begin() {
        crate::panic::install_hook();
    }

    /// `_start` on the host: every active lane of the warp runs `main`.
    ///
    /// # Safety
    /// The plugin's call of a native kernel: `warp` valid for it, `len` bytes at `args`
    /// holding the loader's start arguments.
    #[doc(hidden)]
    pub unsafe fn host_start(warp: *const HostWarp, args: *const u8, len: usize, main: Main) {
        crate::panic::install_hook();
        let Some([argc, argv, envp, ret]) = read(args, len) else {
            return;
        };
        let lane = || {
            // SAFETY: the loader's arguments (this function's contract), lane by lane.
            unsafe {
                start(
                    argc as u32 as i32,
                    argv as usize as *const *const c_char,
                    envp as usize as *const *const c_char,
                    ret as usize as *mut i32,
                    main,
                )
            }
        };
        // SAFETY: the plugin's warp (the caller's).
        unsafe { crate::arch::host::run_lanes(warp, lane) };
    }
}

/// Emits the start kernels `_begin`, `_start` and `_end` of LLVM's start protocol around
/// `main` (a [`Main`]: `fn(Args) -> i32`), so that the program runs under `rpc-run` (and
/// LLVM's loader) as a clang-built one does. On the GPU targets the crate enables the kernel
/// ABI: `#![cfg_attr(any(target_arch = "nvptx64", target_arch = "amdgpu"), feature(abi_gpu_kernel))]`.
#[macro_export]
macro_rules! main {
    ($main:path) => {
        #[cfg(not(any(target_arch = "nvptx64", target_arch = "amdgpu")))]
        const _: () = {
            /// LLVM's `_begin`, as a native host kernel.
            #[no_mangle]
            pub extern "C" fn _begin(
                _warp: *const $crate::start::HostWarp,
                _args: *const u8,
                _len: usize,
            ) {
                $crate::start::host_begin()
            }
            /// LLVM's `_start`, as a native host kernel.
            ///
            /// # Safety
            /// The plugin's call (docs/plugins.md).
            #[no_mangle]
            pub unsafe extern "C" fn _start(
                warp: *const $crate::start::HostWarp,
                args: *const u8,
                len: usize,
            ) {
                let main: $crate::start::Main = $main;
                // SAFETY: the plugin's call of a native kernel with the loader's arguments.
                unsafe { $crate::start::host_start(warp, args, len, main) }
            }
            /// LLVM's `_end`, as a native host kernel: nothing to run.
            #[no_mangle]
            pub extern "C" fn _end(
                _warp: *const $crate::start::HostWarp,
                _args: *const u8,
                _len: usize,
            ) {
            }
        };
        #[cfg(any(target_arch = "nvptx64", target_arch = "amdgpu"))]
        const _: () = {
            /// LLVM's `_begin`: no constructors to run.
            #[no_mangle]
            pub extern "gpu-kernel" fn _begin(
                _argc: i32,
                _argv: *const *const core::ffi::c_char,
                _envp: *const *const core::ffi::c_char,
            ) {
            }
            /// LLVM's `_start`: every thread runs `main` and ors its status into `*ret`.
            ///
            /// # Safety
            /// The loader's arguments.
            #[no_mangle]
            pub unsafe extern "gpu-kernel" fn _start(
                argc: i32,
                argv: *const *const core::ffi::c_char,
                envp: *const *const core::ffi::c_char,
                ret: *mut i32,
            ) {
                let main: $crate::start::Main = $main;
                // SAFETY: the loader's arguments.
                unsafe { $crate::start::start(argc, argv, envp, ret, main) }
            }
            /// LLVM's `_end`: no `atexit` functions to run.
            #[no_mangle]
            pub extern "gpu-kernel" fn _end() {}
        };
    };
}

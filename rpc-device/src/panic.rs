//! What a panic does in a kernel: the message and its `file:line:column` go to the host's
//! stderr as one line per lane (`thread T of block B panicked at FILE:LINE:COL:` and the
//! message), then the program aborts (ABORT: rpc-run, as LLVM's loader, aborts the process).
//!
//! On the GPU targets this is the `#[panic_handler]` (the `panic-handler` feature; a program
//! may bring its own). On the host the image has std's handler, and [`main!`](crate::main)'s
//! `_begin` / `_start` install a panic hook that does the same.

use core::fmt::Display;

use crate::arch;

/// Sends `info` (a panic's `Display`: "panicked at FILE:LINE:COL:\nMESSAGE") to the host's
/// stderr, naming the thread, and aborts.
pub fn report_and_abort(info: &dyn Display) -> ! {
    crate::eprintln!(
        "thread {} of block {} {info}",
        arch::thread_index(),
        arch::block_index()
    );
    crate::process::abort()
}

#[cfg(all(
    feature = "panic-handler",
    any(target_arch = "nvptx64", target_arch = "amdgpu")
))]
#[panic_handler]
fn panic(info: &core::panic::PanicInfo<'_>) -> ! {
    report_and_abort(info)
}

/// Installs the panic hook of the host image's std (once).
#[cfg(not(any(target_arch = "nvptx64", target_arch = "amdgpu")))]
pub(crate) fn install_hook() {
    extern crate std;
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        std::panic::set_hook(std::boxed::Box::new(|info| {
            if arch::host::in_lane() {
                report_and_abort(info)
            }
            // Outside a lane no port can be opened: the process's own stderr.
            std::eprintln!("rpc-device: {info}");
        }))
    });
}

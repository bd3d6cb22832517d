//! [`Malloc`], a `GlobalAlloc` over the host's MALLOC and FREE (PROTOCOL section 6), so that
//! `alloc`'s `Vec`, `String` and `Box` work in kernels (in the kernel image's crate, so not a
//! doctest):
//!
//! ```ignore
//! #[global_allocator]
//! static HEAP: rpc_device::Malloc = rpc_device::Malloc;
//! ```
//!
//! The host aligns a block to its size rounded up to a power of two (at least 16 bytes), and a
//! block above 256 KiB to 2 MiB (`rpc_core::services::malloc_alignment`): a request of at least
//! a layout's alignment is aligned for it. The runtime frees what a program leaves when its
//! image is unloaded.
//!
//! On the host the same image is a shared object with its own `std`, which allocates too
//! where no lane runs (its start-up, its panic hook): there every block carries a tag word
//! before it saying whose it is, and a block made outside a lane comes from the system's
//! allocator.

use core::alloc::{GlobalAlloc, Layout};
use core::ptr;

use rpc_core::protocol::Opcode;

use crate::client::Port;

/// The allocator of the host's MALLOC / FREE.
#[derive(Clone, Copy, Debug, Default)]
pub struct Malloc;

/// The host's MALLOC: `size` bytes, or null.
pub fn malloc(size: usize) -> *mut u8 {
    let mut port = Port::open(Opcode::MALLOC);
    port.send(|packet| packet[0] = size as u64);
    let mut addr = 0;
    port.recv(|packet| addr = packet[0]);
    addr as usize as *mut u8
}

/// The host's FREE of a block [`malloc`] returned.
pub fn free(block: *mut u8) {
    let mut port = Port::open(Opcode::FREE);
    port.send(|packet| packet[0] = block as usize as u64);
}

#[cfg(any(target_arch = "nvptx64", target_arch = "amdgpu"))]
// SAFETY: `malloc(n)` returns a fresh block of at least `n` bytes (or null), aligned to `n`
// rounded up to a power of two or to 2 MiB, which `free` gives back: asked for at least the
// layout's alignment (a power of two of at most 2 MiB), it is aligned for the layout.
unsafe impl GlobalAlloc for Malloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if layout.align() > 1 << 21 {
            return ptr::null_mut();
        }
        malloc(layout.size().max(layout.align()))
    }

    unsafe fn dealloc(&self, block: *mut u8, _layout: Layout) {
        free(block);
    }
}

#[cfg(not(any(target_arch = "nvptx64", target_arch = "amdgpu")))]
mod host {
    use super::*;
    extern crate std;
    use std::alloc::System;

    /// The tag of a block from the host's MALLOC.
    const RPC: u64 = 0x7270_635f_6d61_6c6c;
    /// The tag of a block from the system's allocator.
    const SYSTEM: u64 = 0x7379_735f_6d61_6c6c;

    /// Bytes before the block: room for the tag, keeping the block's alignment.
    fn prefix(layout: Layout) -> usize {
        layout.align().max(8)
    }

    /// The whole allocation of a block of `layout`.
    fn whole(layout: Layout) -> Option<Layout> {
        let size = layout.size().checked_add(prefix(layout))?;
        Layout::from_size_align(size, layout.align().max(8)).ok()
    }

    // SAFETY: each block is `prefix` bytes into an allocation of `whole(layout)` bytes aligned
    // to at least the layout's alignment (the host's MALLOC of at least the alignment, which
    // `prefix` is, is aligned for it: see the module docs), whose tag word right
    // before the block says which allocator `dealloc` gives it back to.
    unsafe impl GlobalAlloc for Malloc {
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            let Some(whole) = whole(layout) else {
                return ptr::null_mut();
            };
            let (base, tag) = if crate::arch::host::in_lane() && layout.align() <= 1 << 21 {
                (malloc(whole.size()), RPC)
            } else {
                // SAFETY: a layout of non-zero size (it holds the prefix).
                (unsafe { System.alloc(whole) }, SYSTEM)
            };
            if base.is_null() {
                return base;
            }
            // SAFETY: `prefix` bytes into an allocation of `whole` bytes; the tag word is
            // the 8 bytes before it, inside the prefix and 8-aligned.
            unsafe {
                let block = base.add(prefix(layout));
                block.cast::<u64>().sub(1).write(tag);
                block
            }
        }

        unsafe fn dealloc(&self, block: *mut u8, layout: Layout) {
            // SAFETY: `block` came from `alloc` with this layout (GlobalAlloc's contract), so
            // its tag and base are as `alloc` made them.
            let (tag, base) =
                unsafe { (block.cast::<u64>().sub(1).read(), block.sub(prefix(layout))) };
            match (tag, whole(layout)) {
                // Outside a lane there is no port: the runtime frees it when the image goes.
                (RPC, _) if crate::arch::host::in_lane() => free(base),
                // SAFETY: the system allocator's block of this whole layout.
                (SYSTEM, Some(whole)) => unsafe { System.dealloc(base, whole) },
                _ => {}
            }
        }
    }
}

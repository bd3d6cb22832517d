//! panic: thread 1 panics; its message and `file:line` reach the host's stderr, and the
//! program aborts.
#![cfg_attr(any(target_arch = "nvptx64", target_arch = "amdgpu"), no_std)]
#![cfg_attr(
    any(target_arch = "nvptx64", target_arch = "amdgpu"),
    feature(abi_gpu_kernel)
)]

use rpc_device::{println, thread_index, Args};

// `alloc` is linked (rpc-core's protocol layer uses it), so a GPU image needs an allocator.
#[global_allocator]
static HEAP: rpc_device::Malloc = rpc_device::Malloc;

fn main(_args: Args) -> i32 {
    let thread = thread_index();
    println!("thread {thread} before the panic");
    if thread == 1 {
        let found: Option<u32> = None;
        panic!("thread {thread} looked for a value and found {found:?}");
    }
    0
}

rpc_device::main!(main);

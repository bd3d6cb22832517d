//! hello: every thread prints a formatted line with a `Vec` it filled from the host's heap;
//! thread 0 prints the arguments; the program ends with status 3 (`main`'s result), or, given
//! the argument `exit`, through `exit(4)`.
#![cfg_attr(any(target_arch = "nvptx64", target_arch = "amdgpu"), no_std)]
#![cfg_attr(
    any(target_arch = "nvptx64", target_arch = "amdgpu"),
    feature(abi_gpu_kernel)
)]

extern crate alloc;

use alloc::vec::Vec;

use rpc_device::{block_index, println, thread_index, Args};

#[global_allocator]
static HEAP: rpc_device::Malloc = rpc_device::Malloc;

fn main(args: Args) -> i32 {
    let thread = thread_index();
    let squares: Vec<u32> = (0..=thread).map(|i| i * i).collect();
    println!(
        "hello from thread {thread:>2} of block {}: {} squares, the last {:?}, sum {:#x}",
        block_index(),
        squares.len(),
        squares.last(),
        squares.iter().sum::<u32>()
    );
    if thread == 0 {
        let rest: Vec<&str> = args
            .iter()
            .skip(1)
            .filter_map(|a| a.to_str().ok())
            .collect();
        println!("arguments: {rest:?}");
        if rest.first() == Some(&"exit") {
            rpc_device::exit(4);
        }
    }
    3
}

rpc_device::main!(main);

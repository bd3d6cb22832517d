//! hello: every thread prints a formatted line with a `Vec` it filled from the host's heap;
//! with `RPC_DEVICE_HELLO_DIR` in the environment each thread also writes a file of its own
//! there, reads it back, prints what it read and renames it to `thread-B-T.txt`, then makes a
//! second file and removes it; given the argument `stdin`, thread 0 reads the host's standard
//! input to its end and prints it; with `RPC_DEVICE_HELLO_LONG` each prints a
//! line of 1000 bytes, four times the device's line buffer; given the argument `typed`, each
//! thread calls four of PROTOCOL section 12's test functions (a runtime serving them:
//! `rpc-run --dispatch-tests`) and prints what they gave; thread 0 prints the arguments; the
//! program ends with status 3 (`main`'s result), or, given the argument `exit`, through
//! `exit(4)`.
#![cfg_attr(any(target_arch = "nvptx64", target_arch = "amdgpu"), no_std)]
#![cfg_attr(
    any(target_arch = "nvptx64", target_arch = "amdgpu"),
    feature(abi_gpu_kernel)
)]

extern crate alloc;

use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;
use core::ffi::CStr;

use rpc_device::{block_index, call, println, thread_index, Arg, Args, File, Opcode, SeekFrom};

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
    let dir = args
        .env()
        .find_map(|e| e.to_bytes().strip_prefix(b"RPC_DEVICE_HELLO_DIR="));
    if let Some(dir) = dir {
        let path = |ending: &str| {
            let dir = String::from_utf8_lossy(dir);
            format!("{dir}/thread-{}-{thread}.{ending}\0", block_index())
        };
        let (scratch, kept, gone) = (path("tmp"), path("txt"), path("gone"));
        let [scratch, kept, gone] =
            [&scratch, &kept, &gone].map(|p| CStr::from_bytes_with_nul(p.as_bytes()).unwrap());
        println!("{}", write_and_read_back(scratch));
        println!("{}", rename_and_remove(scratch, kept, gone));
    }
    if thread == 0 && block_index() == 0 && args.iter().any(|a| a.to_bytes() == b"stdin") {
        println!("{}", read_stdin());
    }
    if args
        .env()
        .any(|e| e.to_bytes().starts_with(b"RPC_DEVICE_HELLO_LONG="))
    {
        println!("{thread}{:-<999}", "");
    }
    if args.iter().any(|a| a.to_bytes() == b"typed") {
        println!("{}", typed_calls(thread));
    }
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

/// Calls `add`, `fill`, `negate` and `length` of the typed test functions (PROTOCOL section
/// 12: opcode 0x64000000 + n) with arguments of this thread's, and says what they gave.
fn typed_calls(thread: u32) -> String {
    let test = |n: u32| Opcode(0x6400_0000 + n);
    let sum: u64 = call(
        test(0),
        &mut [Arg::value(&u64::from(thread)), Arg::value(&40u32)],
    );
    let mut out = [0u32; 4];
    let filled: u32 = call(
        test(7),
        &mut [
            Arg::slice(&mut out),
            Arg::value(&4u32),
            Arg::value(&(thread * 10)),
        ],
    );
    let mut x = i64::from(thread) + 1;
    call::<()>(test(3), &mut [Arg::pointer(&mut x)]);
    let mut text = *b"typed\0";
    let length: u64 = call(test(2), &mut [Arg::Pointer(Some(&mut text))]);
    format!("thread {thread} typed: add {sum}, fill {filled} {out:?}, negate {x}, length {length}")
}

/// Writes a line to the file at `path`, reads it back and says what it read.
fn write_and_read_back(path: &CStr) -> String {
    let (block, thread) = (block_index(), thread_index());
    let Ok(mut file) = File::open(path, c"w+") else {
        return format!("thread {thread} of block {block}: the host refused {path:?}");
    };
    let line = format!("thread {thread} of block {block} was here");
    let mut back = [0u8; 64];
    let read = file
        .write(line.as_bytes())
        .and_then(|_| file.flush())
        .and_then(|_| file.seek(SeekFrom::Start(0)))
        .and_then(|_| file.read(&mut back));
    let end = file.seek(SeekFrom::End(0));
    match (read, end, file.close()) {
        (Ok(n), Ok(end), Ok(())) => format!(
            "thread {thread} of block {block} read back {:?} of {end} bytes",
            String::from_utf8_lossy(&back[..n])
        ),
        failed => format!("thread {thread} of block {block}: {failed:?}"),
    }
}

/// Renames `scratch` to `kept`, then makes `gone` and removes it; says whether all went well.
fn rename_and_remove(scratch: &CStr, kept: &CStr, gone: &CStr) -> String {
    let (block, thread) = (block_index(), thread_index());
    let made = File::open(gone, c"w").and_then(File::close);
    match (
        rpc_device::rename(scratch, kept),
        made,
        rpc_device::remove(gone),
    ) {
        (Ok(()), Ok(()), Ok(())) => format!("thread {thread} of block {block} renamed and removed"),
        failed => format!("thread {thread} of block {block}: {failed:?}"),
    }
}

/// The host's standard input to its end, as text.
fn read_stdin() -> String {
    let (mut text, mut piece) = (Vec::new(), [0u8; 16]);
    loop {
        match rpc_device::stdin().read(&mut piece) {
            Ok(0) => break,
            Ok(n) => text.extend_from_slice(&piece[..n]),
            Err(e) => return format!("stdin: {e}"),
        }
    }
    format!(
        "stdin gave {} bytes: {:?}",
        text.len(),
        String::from_utf8_lossy(&text)
    )
}

rpc_device::main!(main);

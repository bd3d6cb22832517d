//! A typed call: a kernel calls a Rust function, the host side of LLVM 23's
//! `rpc::dispatch<TAG, tag>(client, name, rpc::span{out, n}, origin)` for the C function
//! `uint32_t tag(const char *name, uint32_t *out, struct Point origin)`. The function gets the
//! lane's string, a slice it fills (copied back to the kernel) and a struct by value; the host
//! prints what it got once the kernel is done.
//!
//! `cargo run -p examples --example typed_call`

use std::ffi::CStr;
use std::sync::{Arc, Mutex};

use plugin_host::{HostConfig, HostImage, HostPlugin};
use rpc_core::plugin::Grid;
use rpc_core::protocol::CallArg;
use rpc_core::services::typed::Plain;
use rpc_core::{Opcode, PluginRuntime, ServerConfig};

/// The example's own opcode (class `u`, so it never meets libc's).
const TAG: Opcode = Opcode::user(2);

/// `struct Point { int32_t x, y; }`, passed by value.
#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::AnyBitPattern, bytemuck::NoUninit)]
struct Point {
    x: i32,
    y: i32,
}

impl Plain for Point {}

/// Runs the kernel; returns what the host function was given and what the kernel got back.
fn run() -> rpc_core::Result<(Vec<String>, Vec<String>)> {
    // One device of 32 lanes.
    let mut runtime = PluginRuntime::new(
        HostPlugin::new(HostConfig::default()),
        ServerConfig::default(),
    )?;
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    // The host function: its signature is the call's. It runs on the server thread, so it
    // keeps a note rather than printing (a write may block).
    runtime.server().register_typed(
        TAG,
        move |name: &CStr, out: &mut [u32], origin: Point| -> u32 {
            let name = name.to_string_lossy();
            for (i, x) in out.iter_mut().enumerate() {
                *x = (origin.x + origin.y) as u32 * 100 + i as u32;
            }
            log.lock().unwrap().push(format!(
                "host: tag({name:?}, {} slots, {origin:?})",
                out.len()
            ));
            name.len() as u32
        },
    )?;
    let got = Arc::new(Mutex::new(Vec::new()));
    let kernel_got = got.clone();
    let image = HostImage::new("typed")
        .kernel("main", move |warp| {
            // Per lane: its name, a span of lane + 1 slots, a point.
            let mut names: Vec<Vec<u8>> = (0..64)
                .map(|l| format!("lane-{l}\0").into_bytes())
                .collect();
            let mut slots: Vec<Vec<u8>> = (0..64).map(|l| vec![0; 4 * (l + 1)]).collect();
            let replies = {
                let mut args: Vec<Vec<CallArg<'_>>> = names
                    .iter_mut()
                    .zip(&mut slots)
                    .enumerate()
                    .map(|(l, (name, out))| {
                        let origin = Point { x: l as i32, y: 1 };
                        vec![
                            CallArg::Pointer(Some(&mut name[..])),
                            CallArg::Pointer(Some(&mut out[..])),
                            CallArg::value(origin),
                        ]
                    })
                    .collect();
                warp.dispatch(TAG, &mut args, 4).unwrap()
            };
            for lane in warp.lanes() {
                let l = lane as usize;
                let filled: Vec<u32> = slots[l]
                    .chunks(4)
                    .map(|b| u32::from_le_bytes(b.try_into().unwrap()))
                    .collect();
                let length = u32::from_le_bytes(replies[l][..].try_into().unwrap());
                kernel_got
                    .lock()
                    .unwrap()
                    .push(format!("lane {lane}: tag() = {length}, slots {filled:?}"));
            }
        })
        .into_bytes();
    let image = runtime.load_image(0, &image)?;
    runtime.launch(image, "main", &[], Grid::linear(1, 4))?;
    runtime.synchronize(0)?;
    runtime.deinit()?;
    let seen = seen.lock().unwrap().clone();
    let got = got.lock().unwrap().clone();
    Ok((seen, got))
}

fn main() {
    match run() {
        Ok((seen, got)) => {
            for line in seen.iter().chain(&got) {
                println!("{line}");
            }
        }
        Err(why) => {
            eprintln!("typed_call: {why}");
            std::process::exit(1);
        }
    }
}

#[test]
fn the_example_runs() {
    let (seen, got) = run().unwrap();
    // One warp of four active lanes: the function ran once per lane.
    assert_eq!(seen.len(), 4, "{seen:?}");
    assert!(
        seen.contains(&"host: tag(\"lane-2\", 3 slots, Point { x: 2, y: 1 })".to_string()),
        "{seen:?}"
    );
    assert_eq!(got[3], "lane 3: tag() = 6, slots [400, 401, 402, 403]");
}

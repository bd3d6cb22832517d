//! A custom opcode: the host answers `buf[0]` squared for opcode `user(1)`, and a kernel on
//! the host plugin (CPU warps of 32 lanes speaking the real protocol) calls it from eight lanes and prints
//! the answers with printf.
//!
//! `cargo run -p examples --example custom_opcode`

use plugin_host::{Arg, HostConfig, HostImage, HostPlugin};
use rpc_core::plugin::Grid;
use rpc_core::PluginRuntime;
use rpc_core::{Opcode, ServerConfig};

/// The example's own opcode (class `u`, so it never meets libc's).
const SQUARE: Opcode = Opcode::user(1);

fn run() -> rpc_core::Result<u64> {
    // One device of 32 lanes.
    let mut runtime = PluginRuntime::new(
        HostPlugin::new(HostConfig::default()),
        ServerConfig::default(),
    )?;
    // A one-packet opcode: a plain closure over the lane's packet, run on the server thread.
    runtime
        .server()
        .register_packet(SQUARE, |_lane, p| p.set_word(0, p.word(0) * p.word(0)));
    let image = HostImage::new("squares")
        .kernel("main", |warp| {
            let squares = warp.call(SQUARE, u64::from).unwrap();
            warp.printf("lane %d: %d squared is %d\n", |lane| {
                vec![
                    Arg::Int(lane.into()),
                    Arg::Int(lane.into()),
                    Arg::UInt(squares[lane as usize]),
                ]
            })
            .unwrap();
        })
        .into_bytes();
    let image = runtime.load_image(0, &image)?;
    runtime.launch(image, "main", &[], Grid::linear(1, 8))?;
    runtime.synchronize(0)?;
    let served = runtime.server().stats().served_of(SQUARE);
    runtime.deinit()?;
    Ok(served)
}

fn main() {
    match run() {
        Ok(served) => println!("the server answered {served} SQUARE request(s)"),
        Err(why) => {
            eprintln!("custom_opcode: {why}");
            std::process::exit(1);
        }
    }
}

#[test]
fn the_example_runs() {
    // One warp (eight of its 32 lanes active): one request.
    assert_eq!(run(), Ok(1));
}

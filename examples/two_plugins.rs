//! Two plugin instances in one process, each with its own server thread and its own handlers:
//! the same opcode means "add one" to the first and "double" to the second, and shutting the
//! first server down leaves the second serving. (This is what lets an AMD and an NVIDIA image
//! run side by side; here both are host plugins, so it runs anywhere.)
//!
//! `cargo run -p examples --example two_plugins`

use plugin_host::{HostConfig, HostImage, HostPlugin};
use rpc_core::plugin::Grid;
use rpc_core::PluginRuntime;
use rpc_core::{Opcode, ServerConfig};

const OP: Opcode = Opcode::user(7);

fn runtime(name: &str, answer: fn(u64) -> u64) -> rpc_core::Result<PluginRuntime<HostPlugin>> {
    let config = HostConfig {
        devices: 1,
        lanes: 1,
        ports: 4,
    };
    let server = ServerConfig {
        name: name.into(),
        ..ServerConfig::default()
    };
    let runtime = PluginRuntime::new(HostPlugin::new(config), server)?;
    runtime
        .server()
        .register_packet(OP, move |_, p| p.set_word(0, answer(p.word(0))));
    Ok(runtime)
}

/// Loads a kernel that calls OP with 20 and records the answer, runs it, and returns the answer.
fn ask(runtime: &mut PluginRuntime<HostPlugin>) -> rpc_core::Result<u64> {
    let answer = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let seen = answer.clone();
    let image = HostImage::new("ask")
        .kernel("main", move |warp| {
            let got = warp.call(OP, |_| 20).unwrap()[0];
            seen.store(got, std::sync::atomic::Ordering::Relaxed);
        })
        .into_bytes();
    let image = runtime.load_image(0, &image)?;
    runtime.launch(image, "main", &[], Grid::linear(1, 1))?;
    runtime.synchronize(0)?;
    // The kernel's thread stored it before synchronize saw the kernel end.
    Ok(answer.load(std::sync::atomic::Ordering::Relaxed))
}

fn run() -> rpc_core::Result<(u64, u64, u64)> {
    let mut first = runtime("adds-one", |x| x + 1)?;
    let mut second = runtime("doubles", |x| x * 2)?;
    let (a, b) = (ask(&mut first)?, ask(&mut second)?);
    // The first server stops; the second is not touched.
    let _ = first.server().shutdown()?;
    let c = ask(&mut second)?;
    first.deinit()?;
    second.deinit()?;
    Ok((a, b, c))
}

fn main() {
    match run() {
        Ok((a, b, c)) => println!(
            "adds-one answered {a}, doubles answered {b}; with adds-one shut down, doubles answered {c}"
        ),
        Err(why) => {
            eprintln!("two_plugins: {why}");
            std::process::exit(1);
        }
    }
}

#[test]
fn the_example_runs() {
    assert_eq!(run(), Ok((21, 40, 40)));
}

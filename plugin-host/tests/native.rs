//! Native host images: a shared object built here with `cc` (tests/c/kernel.c) as an image of
//! the linked-in host plugin: its exported functions are the kernels, its `__llvm_rpc_client`
//! the client object the runtime fills, and a bad one is a clear error.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use plugin_host::{HostConfig, HostPlugin};
use rpc_core::plugin::Grid;
use rpc_core::{Opcode, PluginRuntime, Runtime, ServerConfig};

const DOUBLE: Opcode = Opcode::user(3);

/// `cc -shared` of tests/c/kernel.c with `defines`; the object's bytes.
fn kernel_image(name: &str, defines: &[&str]) -> Vec<u8> {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("{name}.so"));
    let status = Command::new("cc")
        .args([
            "-std=c11", "-Wall", "-Wextra", "-Werror", "-O1", "-shared", "-fPIC",
        ])
        .args(defines)
        .arg("-I")
        .arg(manifest.join("../include"))
        .arg(manifest.join("tests/c/kernel.c"))
        .arg("-o")
        .arg(&out)
        .status()
        .expect("cc runs");
    assert!(status.success(), "cc kernel.c {defines:?}: {status}");
    std::fs::read(&out).unwrap()
}

fn runtime(lanes: u32) -> PluginRuntime<HostPlugin> {
    let config = HostConfig {
        devices: 1,
        lanes,
        ports: 8,
    };
    let runtime = PluginRuntime::new(HostPlugin::new(config), ServerConfig::default()).unwrap();
    runtime.register_packet_handler(
        DOUBLE,
        Arc::new(|request| {
            for lane in rpc_core::protocol::lanes(request.mask) {
                request.buffers[lane as usize][0] *= 2;
            }
        }),
    );
    runtime
}

/// `kernel.c`'s `ask` over `grid`: each thread's reply (u64::MAX where the call failed).
fn ask(runtime: &PluginRuntime<HostPlugin>, image: rpc_core::ImageId, grid: Grid) -> Vec<u64> {
    let threads = (grid.total_blocks() * grid.threads_per_block()) as usize;
    let mut out = vec![0u64; threads];
    let mut args = DOUBLE.0.to_le_bytes().to_vec();
    args.extend([0; 4]);
    args.extend(7u64.to_le_bytes());
    args.extend((out.as_mut_ptr() as u64).to_le_bytes());
    runtime.launch(image, "ask", &args, grid).unwrap();
    runtime.synchronize(0).unwrap();
    out
}

#[test]
fn a_native_images_kernels_call_the_server_through_its_client_object() {
    for (lanes, generation, defines) in [
        (32, 2096, &[][..]),
        (64, 552, &["-DCLIENT_SIZE=552"][..]),
        (1, 2096, &[][..]),
    ] {
        let runtime = runtime(lanes);
        let image = runtime
            .load_image(0, &kernel_image(&format!("kernel-{generation}"), defines))
            .unwrap();
        assert!(runtime.mailbox(image).is_some());
        let client = runtime.find_symbol(image, "__llvm_rpc_client").unwrap();
        assert_eq!(client.size, generation);
        // The client object was written into the image's own global: its port count first.
        let mut ports = [0u8; 4];
        rpc_core::plugin::Device::copy_from_device(&runtime.devices()[0], client.addr, &mut ports)
            .unwrap();
        assert_eq!(u32::from_le_bytes(ports), 8);
        // Two blocks of 64 threads, so several warps share the 8 ports.
        let out = ask(&runtime, image, Grid::linear(2, 64));
        // kernel.c numbers a warp's lanes from (block * warps_per_block + warp) * lanes.
        let expected: Vec<u64> = (0..128).map(|thread| 2 * (7 + thread)).collect();
        assert_eq!(out, expected, "lanes {lanes}");
        let warps = 128 / u64::from(lanes);
        assert_eq!(runtime.stats().served_of(DOUBLE), warps);
    }
}

#[test]
fn an_image_without_the_client_symbol_uses_no_rpc() {
    let runtime = runtime(32);
    let image = runtime
        .load_image(0, &kernel_image("no-client", &["-DNO_CLIENT"]))
        .unwrap();
    assert_eq!(runtime.mailbox(image), None);
    assert!(!runtime.server().is_running());
    // The kernel runs; its calls fail (kernel.c stores u64::MAX then).
    assert_eq!(
        ask(&runtime, image, Grid::linear(1, 32)),
        vec![u64::MAX; 32]
    );
}

#[test]
fn bad_native_images_and_kernels_are_clear_errors() {
    let runtime = runtime(32);
    let error = runtime
        .load_image(0, &kernel_image("odd-client", &["-DCLIENT_SIZE=100"]))
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("__llvm_rpc_client is 100 bytes, not a v1 (552) or v2 (2096) client object"),
        "{error}"
    );
    let error = runtime
        .load_image(0, b"\x7fELF but not really")
        .unwrap_err()
        .to_string();
    assert!(error.contains("native image: dlopen"), "{error}");
    let image = runtime
        .load_image(0, &kernel_image("kernels", &[]))
        .unwrap();
    for kernel in ["not_a_kernel", "missing"] {
        let error = runtime
            .launch(image, kernel, &[], Grid::linear(1, 1))
            .unwrap_err()
            .to_string();
        assert!(error.contains(kernel), "{error}");
    }
    // The server still serves the image's good kernel.
    assert_eq!(
        ask(&runtime, image, Grid::linear(1, 32)),
        (0..32).map(|thread| 2 * (7 + thread)).collect::<Vec<u64>>()
    );
}

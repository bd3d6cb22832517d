//! The plugin through a fake HSA runtime (no GPU, no ROCm): devices, images, memory, AQL
//! launches and their completions, and kernels that speak RPC, served through `PluginRuntime`.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use plugin_contract::{calls, counted, Capture, Fake};
use plugin_host::{Arg, Warp};
use rpc_core::plugin::{Device, Grid, Plugin};
use rpc_core::services::malloc_alignment;
use rpc_core::KernelExit;
use rpc_core::{Error, PluginError};
use rpc_core::{ImageId, PluginRuntime};

use crate::fake::{FakeAgent, FakeHsa, MEMORY_FAULT, OUT_OF_RESOURCES};
use crate::loader::Status;
use crate::{AmdGpuError, AmdGpuPlugin};

plugin_contract::suite!(crate::fake::FakeHsa);

/// A v1 image with three kernels (16 bytes of explicit arguments each) and a variable.
const IMAGE: &[u8] = FakeHsa::IMAGE;

fn plugin_with(gpus: Vec<FakeAgent>) -> (Arc<FakeHsa>, AmdGpuPlugin) {
    plugin_contract::suite::initialised(FakeHsa::new(gpus), |hsa| AmdGpuPlugin::with_api(hsa))
}

fn hsa_error(error: &rpc_core::plugin::VendorError) -> &AmdGpuError {
    error.downcast_ref::<AmdGpuError>().expect("an AmdGpuError")
}

/// The plugin over `hsa` in a runtime that records exits and captures stdout.
fn runtime(hsa: &Arc<FakeHsa>) -> (PluginRuntime<AmdGpuPlugin>, Capture) {
    plugin_contract::runtime_capturing_stdout(AmdGpuPlugin::with_api(hsa.clone()))
}

/// A runtime over one fake `agent` whose kernel `main` runs `body` once per wave, `image`
/// loaded on its device and `main` launched on `grid`.
fn launch_main(
    agent: FakeAgent,
    image: &[u8],
    grid: Grid,
    body: impl Fn(&Warp<'_>) -> Result<(), Status> + Send + Sync + 'static,
) -> (Arc<FakeHsa>, PluginRuntime<AmdGpuPlugin>, Capture, ImageId) {
    let hsa = Arc::new(FakeHsa::new(vec![agent]));
    hsa.kernel("main", body);
    let (runtime, out) = runtime(&hsa);
    let image = runtime.load_image(0, image).unwrap();
    runtime.launch(image, "main", &[], grid).unwrap();
    (hsa, runtime, out, image)
}

fn vendor_message(error: Error) -> String {
    match error {
        Error::Plugin(PluginError::Vendor { source, .. }) => source.to_string(),
        other => panic!("not a vendor error: {other:?}"),
    }
}

// --- No runtime -------------------------------------------------------------------------------

#[test]
fn a_runtime_whose_init_fails_is_zero_devices_and_names_the_status() {
    let hsa = Arc::new(FakeHsa::new(vec![FakeAgent::mi300x()]));
    hsa.fail("hsa_init", OUT_OF_RESOURCES);
    let mut plugin = AmdGpuPlugin::with_api(hsa.clone());
    plugin_contract::zero_devices_with_a_reason(
        &mut plugin,
        "hsa_init failed: HSA_STATUS_ERROR_OUT_OF_RESOURCES (0x1008): \
         The runtime failed to allocate the necessary resources.",
    );
    assert_eq!(hsa.inits(), 0);
    plugin.deinit().unwrap();
}

#[test]
fn a_runtime_without_gpu_agents_is_zero_devices_and_shuts_down() {
    let hsa = Arc::new(FakeHsa::new(Vec::new()));
    let mut plugin = AmdGpuPlugin::with_api(hsa.clone());
    plugin_contract::zero_devices_with_a_reason(&mut plugin, "the HSA runtime found no GPU agents");
    assert_eq!(hsa.inits(), 0, "hsa_shut_down balanced the hsa_init");
}

// --- Devices ----------------------------------------------------------------------------------

#[test]
fn devices_are_enumerated_with_name_wavefront_and_ports() {
    let (hsa, plugin) = plugin_with(vec![FakeAgent::mi300x(), FakeAgent::w7900()]);
    assert_eq!(hsa.inits(), 1);
    plugin_contract::devices_are_described(
        &plugin,
        "amdgpu",
        &[64, 32],
        "amdgpu: 2 devices (Fake MI300X (gfx942): L=64, ports v1=4096 v2=9728; \
         Fake W7900 (gfx1100): L=32, ports v1=768 v2=768)",
    );
}

#[test]
fn deinit_shuts_the_runtime_down_and_leaves_no_queue_signal_or_block() {
    let (hsa, mut plugin) = plugin_with(vec![FakeAgent::mi300x(), FakeAgent::w7900()]);
    for device in plugin.devices() {
        let image = device.load_image(IMAGE).unwrap();
        let region = device.alloc_shared(4096).unwrap();
        device
            .launch(&image, "main", &[], Grid::linear(1, 64), Box::new(|| ()))
            .unwrap();
        device.synchronize().unwrap();
        drop((image, region));
    }
    assert_eq!(
        hsa.live_queues(),
        2,
        "one queue per device, made by its first launch"
    );
    plugin_contract::deinit_leaves_nothing(&mut plugin, || {
        vec![
            ("inits", hsa.inits().into()),
            ("queues", hsa.live_queues() as i64),
            ("signals", hsa.live_signals() as i64),
            ("host allocations", hsa.live_host_allocations() as i64),
            ("executables", hsa.live_executables() as i64),
        ]
    });
}

// --- Errors -----------------------------------------------------------------------------------

#[test]
fn runtime_errors_name_the_call_the_status_and_the_runtimes_text() {
    let (hsa, plugin) = FakeHsa::one_gpu();
    let device = &plugin.devices()[0];
    hsa.fail("hsa_amd_memory_pool_allocate", OUT_OF_RESOURCES);
    let error = device.alloc_shared(64).err().unwrap();
    assert_eq!(
        error.to_string(),
        "hsa_amd_memory_pool_allocate failed: HSA_STATUS_ERROR_OUT_OF_RESOURCES (0x1008): \
         The runtime failed to allocate the necessary resources."
    );
    hsa.fail("hsa_executable_create_alt", 0x1000);
    let error = device.load_image(IMAGE).err().unwrap();
    assert_eq!(
        error.to_string(),
        "hsa_executable_create_alt failed: HSA_STATUS_ERROR (0x1000)"
    );
}

// --- Images -----------------------------------------------------------------------------------

#[test]
fn a_kernel_is_no_variable_and_a_copy_past_one_is_refused() {
    let (_hsa, plugin) = FakeHsa::one_gpu();
    let (device, image) = plugin_contract::first_device_with_image(&plugin, IMAGE);
    // A kernel's descriptor symbol is not a variable.
    assert_eq!(device.find_symbol(&image, "main.kd"), None);
    // A copy past the variable is refused by the runtime, not done.
    let data = device.find_symbol(&image, "data").unwrap();
    assert!(device.copy_to_device(data.addr + 4090, &[1; 16]).is_err());
}

#[test]
fn a_bad_code_object_is_an_error_naming_the_call() {
    let (hsa, plugin) = FakeHsa::one_gpu();
    let device = &plugin.devices()[0];
    let error = device.load_image(&[0xFF, 0xFE, 0x00]).err().unwrap();
    assert!(
        error
            .to_string()
            .starts_with("hsa_code_object_reader_create_from_memory failed: HSA_STATUS_ERROR_INVALID_CODE_OBJECT"),
        "{error}"
    );
    let error = device.load_image(b".kernel main many\n").err().unwrap();
    assert!(
        error
            .to_string()
            .starts_with("hsa_executable_load_agent_code_object failed"),
        "{error}"
    );
    assert!(device.load_image(b"").is_err());
    assert_eq!(
        hsa.live_executables(),
        0,
        "failed loads destroy their executables"
    );
}

// --- Launches and completions -----------------------------------------------------------------

#[test]
fn launch_writes_an_aql_packet_with_the_grid_and_the_kernarg_segment() {
    let (hsa, plugin) = FakeHsa::one_gpu();
    let (device, image) = plugin_contract::first_device_with_image(&plugin, IMAGE);
    let args: Vec<u8> = (1..=12).collect();
    let grid = Grid {
        blocks: [4, 2, 1],
        threads: [64, 1, 1],
    };
    device
        .launch(&image, "other", &args, grid, Box::new(|| ()))
        .unwrap();
    device.synchronize().unwrap();
    let dispatch = &hsa.dispatches()[0];
    assert_eq!(dispatch.header, crate::aql::DISPATCH_HEADER);
    // 16 bytes of explicit arguments (12 given, zero-padded), then the implicit block.
    assert_eq!(dispatch.kernarg.len(), 16 + 256);
    assert_eq!(&dispatch.kernarg[..12], &args[..]);
    assert_eq!(&dispatch.kernarg[12..16], &[0; 4]);
    assert_eq!(
        &dispatch.kernarg[16..28],
        &[4, 0, 0, 0, 2, 0, 0, 0, 1, 0, 0, 0],
        "hidden block counts"
    );
    // More argument bytes than the kernel takes are refused before anything is queued.
    let error = device
        .launch(&image, "main", &[0; 300], grid, Box::new(|| ()))
        .unwrap_err();
    assert!(matches!(
        hsa_error(&error),
        AmdGpuError::BadArguments {
            expected: 272,
            given: 300,
            ..
        }
    ));
    assert_eq!(hsa.dispatches().len(), 1);
}

#[test]
fn completed_launches_destroy_their_completion_signals() {
    let (hsa, plugin) = FakeHsa::one_gpu();
    let (device, image) = plugin_contract::first_device_with_image(&plugin, IMAGE);
    for _ in 0..3 {
        device
            .launch(&image, "main", &[], Grid::linear(1, 64), Box::new(|| ()))
            .unwrap();
    }
    device.synchronize().unwrap();
    assert_eq!(hsa.completed(), 3);
    assert_eq!(
        hsa.live_signals(),
        1,
        "only the queue's doorbell: completions destroyed"
    );
}

#[test]
fn a_launch_that_fails_queues_nothing_and_never_calls_done() {
    let (no_queue, done) = counted();
    let [(unknown_error, unknown), (empty_error, empty)] =
        plugin_contract::suite::unknown_kernels_and_empty_grids_launch_nothing(
            |hsa: &FakeHsa, device, image| {
                hsa.fail("hsa_queue_create", OUT_OF_RESOURCES);
                let error = device
                    .launch(image, "main", &[], Grid::linear(1, 64), done)
                    .unwrap_err();
                assert_eq!(
                    error.to_string(),
                    "hsa_queue_create failed: HSA_STATUS_ERROR_OUT_OF_RESOURCES (0x1008): \
                     The runtime failed to allocate the necessary resources."
                );
                device.synchronize().unwrap();
                assert!(hsa.dispatches().is_empty());
                assert_eq!(hsa.live_host_allocations(), 0, "kernarg blocks freed");
                assert_eq!(hsa.live_signals(), 0, "completion signals destroyed");
            },
        );
    assert!(matches!(
        hsa_error(&unknown_error),
        AmdGpuError::NoSymbol { .. }
    ));
    assert!(matches!(hsa_error(&empty_error), AmdGpuError::BadGrid(_)));
    // `done` was dropped with the failed launch (the Device contract): never called.
    for counter in [unknown, empty, no_queue] {
        assert_eq!(calls(&counter), 0);
    }
}

#[test]
fn a_faulting_queue_fails_its_launches_once_each() {
    let (hsa, plugin) = FakeHsa::one_gpu();
    hsa.kernel("main", |_| Err(MEMORY_FAULT));
    let (device, image) = plugin_contract::first_device_with_image(&plugin, IMAGE);
    let (first, done) = counted();
    device
        .launch(&image, "main", &[], Grid::linear(1, 64), done)
        .unwrap();
    let (second, done) = counted();
    device
        .launch(&image, "other", &[], Grid::linear(1, 64), done)
        .unwrap();
    let error = device.synchronize().unwrap_err();
    assert_eq!(
        error.to_string(),
        "kernel failed on Fake MI300X (gfx942): \
         queue error HSA_STATUS_ERROR_MEMORY_FAULT (0x2b)"
    );
    assert_eq!(calls(&first), 1);
    assert_eq!(calls(&second), 1);
    assert_eq!(hsa.completed(), 0, "the faulted queue completed nothing");
    assert_eq!(
        hsa.dispatches().len(),
        1,
        "nor ran the packet after the fault"
    );
    device.synchronize().unwrap(); // the failure is reported once
}

#[test]
fn more_launches_than_queue_slots_wrap_the_ring() {
    // The W7900's queue holds 64 packets: 200 launches go round it three times, each
    // waiting for its slot to be consumed.
    let (hsa, plugin) = plugin_with(vec![FakeAgent::w7900()]);
    let (device, image) = plugin_contract::first_device_with_image(&plugin, IMAGE);
    let counters: Vec<_> = (0..200u32)
        .map(|i| {
            let (calls, done) = counted();
            device
                .launch(&image, "main", &i.to_le_bytes(), Grid::linear(1, 32), done)
                .unwrap();
            calls
        })
        .collect();
    device.synchronize().unwrap();
    assert!(counters.iter().all(|c| calls(c) == 1));
    let order: Vec<u32> = hsa
        .dispatches()
        .iter()
        .map(|d| u32::from_le_bytes(d.kernarg[..4].try_into().unwrap()))
        .collect();
    assert_eq!(order, (0..200).collect::<Vec<_>>(), "in submission order");
}

#[test]
fn a_panicking_kernel_body_faults_its_queue() {
    let (hsa, plugin) = FakeHsa::one_gpu();
    hsa.kernel("main", |_| panic!("a broken kernel"));
    let (device, image) = plugin_contract::first_device_with_image(&plugin, IMAGE);
    device
        .launch(&image, "main", &[], Grid::linear(1, 64), Box::new(|| ()))
        .unwrap();
    let error = device.synchronize().unwrap_err();
    assert!(
        error
            .to_string()
            .ends_with("queue error HSA_STATUS_ERROR_EXCEPTION (0x1016)"),
        "{error}"
    );
}

// --- Memory -----------------------------------------------------------------------------------

#[test]
fn once_the_plugin_is_dropped_its_allocator_refuses() {
    let (_hsa, plugin) = FakeHsa::one_gpu();
    let allocator = plugin.devices()[0].allocator();
    drop(plugin);
    let error = allocator.allocate(8).unwrap_err();
    assert!(matches!(hsa_error(&error), AmdGpuError::Released));
}

// --- Kernels that speak RPC, through the runtime ----------------------------------------------

#[test]
fn a_kernels_printf_is_served_and_done_runs_once() {
    // Two blocks of 96 threads: two waves each, the second half full (32 lanes).
    let grid = Grid::linear(2, 96);
    let (hsa, mut runtime, out, image) = launch_main(FakeAgent::mi300x(), IMAGE, grid, |warp| {
        let wave = warp.global_warp();
        warp.printf("wave %d lane %2d\n", |lane| {
            vec![Arg::Int(wave.into()), Arg::Int(lane.into())]
        })
        .expect("printf");
        Ok(())
    });
    assert!(
        runtime.mailbox(image).is_some(),
        "the client symbol got a mailbox"
    );
    runtime.synchronize(0).unwrap();
    let text = out.text();
    assert_eq!(text.lines().count(), 2 * 96, "{text}");
    assert!(text.contains("wave 0 lane  0\n") && text.contains("wave 3 lane 31\n"));
    assert!(
        !text.contains("wave 1 lane 32"),
        "the half wave has 32 lanes"
    );
    assert_eq!(hsa.completed(), 1);
    runtime.deinit().unwrap();
    assert_eq!(hsa.inits(), 0);
}

#[test]
fn a_v2_image_is_served_by_polling_when_the_runtime_gives_no_interrupts() {
    // The fake's signals have no event mailbox, so no doorbell: the server polls.
    let v2 = b".kernel main 0\n.global __llvm_rpc_client 2096\n";
    let (_hsa, mut runtime, out, _) =
        launch_main(FakeAgent::mi300x(), v2, Grid::linear(1, 2), |warp| {
            warp.puts(|lane| format!("v2 lane {lane}")).expect("puts");
            Ok(())
        });
    runtime.synchronize(0).unwrap();
    assert_eq!(out.text(), "v2 lane 0\nv2 lane 1\n");
    runtime.deinit().unwrap();
}

#[test]
fn a_kernels_exit_is_reported_by_synchronize() {
    let one = Grid::linear(1, 1);
    let (_hsa, mut runtime, out, _) = launch_main(FakeAgent::w7900(), IMAGE, one, |warp| {
        warp.puts(|_| "bye".into()).expect("puts");
        warp.exit(3)
    });
    // An exit is the kernel's status, a value, not an error.
    assert_eq!(runtime.synchronize(0), Ok(Some(KernelExit::Exit(3))));
    assert_eq!(out.text(), "bye\n");
    runtime.deinit().unwrap();
}

#[test]
fn deinit_waits_for_launches_still_running() {
    let one = Grid::linear(1, 1);
    let (hsa, mut runtime, out, _) = launch_main(FakeAgent::mi300x(), IMAGE, one, |warp| {
        warp.puts(|_| "done".into()).expect("puts");
        Ok(())
    });
    // No synchronize: deinit itself waits for the kernel, which is served to its end.
    runtime.deinit().unwrap();
    assert_eq!(out.text(), "done\n");
    assert_eq!(hsa.completed(), 1);
    assert_eq!((hsa.live_queues(), hsa.live_signals()), (0, 0));
}

#[test]
fn mallocs_the_kernel_forgot_are_freed_at_deinit() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let record = seen.clone();
    let two = Grid::linear(2, 1);
    let (hsa, mut runtime, _out, _) = launch_main(FakeAgent::mi300x(), IMAGE, two, move |warp| {
        let addrs = warp.malloc(|_| 4096).expect("malloc");
        record.lock().unwrap().extend(addrs.into_iter().take(1));
        Ok(())
    });
    runtime.synchronize(0).unwrap();
    let addrs = seen.lock().unwrap().clone();
    assert_eq!(addrs.len(), 2);
    assert!(
        addrs
            .iter()
            .all(|a| *a != 0 && a % malloc_alignment(4096) == 0),
        "{addrs:x?}"
    );
    // Both 4 KiB chunks of one 2 MiB slab: one device allocation.
    assert_eq!(hsa.live_device_allocations(), 1);
    runtime.deinit().unwrap();
    assert_eq!(hsa.live_device_allocations(), 0);
}

#[test]
fn a_faulting_queue_is_reported_through_the_runtime() {
    let one = Grid::linear(1, 1);
    let (hsa, mut runtime, out, _) = launch_main(FakeAgent::mi300x(), IMAGE, one, |warp| {
        warp.puts(|_| "before the fault".into()).expect("puts");
        Err(MEMORY_FAULT)
    });
    let message = vendor_message(runtime.synchronize(0).unwrap_err());
    assert!(
        message.ends_with("queue error HSA_STATUS_ERROR_MEMORY_FAULT (0x2b)"),
        "{message}"
    );
    assert_eq!(out.text(), "before the fault\n");
    // The failed launch completed (its done ran): deinit has nothing to wait for or abort.
    runtime.deinit().unwrap();
    assert_eq!(hsa.live_queues(), 0);
}

#[test]
fn kernels_that_outlive_the_deinit_wait_are_aborted_and_named() {
    let hsa = Arc::new(FakeHsa::new(vec![FakeAgent::mi300x()]));
    hsa.hang("spin");
    let (mut runtime, _out) = runtime(&hsa);
    runtime.set_deinit_wait(Duration::from_millis(20));
    let image = runtime.load_image(0, IMAGE).unwrap();
    runtime
        .launch(image, "spin", &[], Grid::linear(1, 64))
        .unwrap();
    assert_eq!(
        runtime.deinit(),
        Err(PluginError::KernelsAborted("spin on device 0".into()).into())
    );
    assert_eq!(hsa.completed(), 0);
    assert_eq!((hsa.live_queues(), hsa.live_signals()), (0, 0));
    assert_eq!(hsa.inits(), 0);
}

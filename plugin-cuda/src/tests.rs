//! The plugin through a fake driver table (no GPU, no libcuda), and without any driver.

use std::sync::Arc;

use plugin_contract::{calls, counted, Calls, Fake};
use rpc_core::plugin::{Completion, Device, Grid, Plugin, VendorError};
use rpc_core::protocol::Generation;

use crate::fake::{FakeDriver, FakeGpu};
use crate::{CudaDevice, CudaError, CudaImage, CudaPlugin};

plugin_contract::suite!(crate::fake::FakeDriver);

const IMAGE: &[u8] = FakeDriver::IMAGE;

fn plugin_with(gpus: Vec<FakeGpu>) -> (Arc<FakeDriver>, CudaPlugin) {
    plugin_contract::suite::initialised(FakeDriver::new(gpus), |driver| {
        CudaPlugin::with_driver(driver)
    })
}

/// Launches kernel `main` of `image` on one warp.
fn launch_main(
    device: &CudaDevice,
    image: &CudaImage,
    done: Completion,
) -> Result<(), VendorError> {
    device.launch(image, "main", &[], Grid::linear(1, 32), done)
}

/// One GPU with `IMAGE` loaded and kernel `main` launched on one warp with a counted `done`
/// (after `before` readied the driver: a failure to inject), where the tests of completions
/// start.
struct Launched {
    driver: Arc<FakeDriver>,
    plugin: CudaPlugin,
    image: CudaImage,
    calls: Calls,
    launch: Result<(), VendorError>,
}

fn launched(before: impl FnOnce(&FakeDriver)) -> Launched {
    let (driver, plugin) = FakeDriver::one_gpu();
    let image = plugin.devices()[0].load_image(IMAGE).unwrap();
    before(&driver);
    let (calls, done) = counted();
    let launch = launch_main(&plugin.devices()[0], &image, done);
    Launched {
        driver,
        plugin,
        image,
        calls,
        launch,
    }
}

fn cuda_error(error: &VendorError) -> &CudaError {
    error.downcast_ref::<CudaError>().expect("a CudaError")
}

// --- No driver --------------------------------------------------------------------------------

#[test]
fn no_driver_library_is_zero_devices_and_a_reason() {
    let mut plugin = CudaPlugin::with_library_names(&["libcuda-not-installed.so.1"]);
    plugin_contract::zero_devices_with_a_reason(
        &mut plugin,
        "libcuda-not-installed.so.1 not found",
    );
    plugin.deinit().unwrap();
}

#[test]
fn the_system_driver_never_panics_and_always_explains_zero_devices() {
    let mut plugin = CudaPlugin::new();
    plugin.init().unwrap();
    assert_eq!(plugin.devices().is_empty(), plugin.reason().is_some());
    plugin.deinit().unwrap();
    // Here (no libcuda) `cuda: 0 devices (libcuda.so.1 not found)`; on a GPU machine the list.
    let line = rpc_core::plugin::probe(CudaPlugin::new());
    assert!(line.starts_with("cuda: ") && line.ends_with(')'), "{line}");
    println!("{line}");
}

#[test]
fn a_driver_that_finds_no_gpu_is_zero_devices_and_names_the_code() {
    let driver = Arc::new(FakeDriver::new(vec![FakeGpu::h200()]));
    driver.fail_init(100);
    let mut plugin = CudaPlugin::with_driver(driver);
    plugin_contract::zero_devices_with_a_reason(
        &mut plugin,
        "cuInit failed: CUDA_ERROR_NO_DEVICE (100)",
    );
}

// --- Devices ----------------------------------------------------------------------------------

#[test]
fn devices_are_enumerated_with_name_lane_width_and_ports() {
    let small = FakeGpu {
        name: "Fake Small",
        multiprocessors: 2,
        max_threads_per_multiprocessor: 1024,
        compute_capability: (7, 5),
        memory_pools: false,
    };
    let (_driver, plugin) = plugin_with(vec![FakeGpu::h200(), small]);
    plugin_contract::devices_are_described(
        &plugin,
        "cuda",
        &[32, 32],
        "cuda: 2 devices (Fake H200: sm_90, L=32, ports v1=4096 v2=8448; \
         Fake Small: sm_75, L=32, ports v1=64 v2=64)",
    );
}

/// The plugin's figure (the glue caps it: `Generation::ports_for`).
#[test]
fn resident_warps_are_sms_times_warps_per_sm_and_never_overflow() {
    use crate::device::resident_warps;
    // H200: 132 SMs x 64 warps.
    assert_eq!(resident_warps(132, 2048), 8448);
    assert_eq!(resident_warps(2, 1024), 64);
    // Nonsense attributes.
    assert_eq!(resident_warps(0, 2048), 0);
    assert_eq!(resident_warps(u32::MAX, u32::MAX), u32::MAX);
}

#[test]
fn deinit_releases_every_context_and_stream() {
    let (driver, mut plugin) = plugin_with(vec![FakeGpu::h200(), FakeGpu::h200()]);
    assert_eq!(driver.retained_contexts(), 2);
    assert_eq!(driver.live_streams(), 4); // launch + allocation stream each
    plugin_contract::deinit_leaves_nothing(&mut plugin, || {
        vec![
            ("contexts", driver.retained_contexts().into()),
            ("streams", driver.live_streams() as i64),
        ]
    });
}

#[test]
fn a_device_that_fails_to_open_fails_init_and_leaks_nothing() {
    let driver = Arc::new(FakeDriver::new(vec![FakeGpu::h200()]));
    driver.fail("cuStreamCreate", 2);
    let mut plugin = CudaPlugin::with_driver(driver.clone());
    let error = plugin.init().unwrap_err();
    assert_eq!(cuda_error(&error).code(), Some(2));
    assert_eq!(driver.retained_contexts(), 0);
}

// --- Errors -----------------------------------------------------------------------------------

#[test]
fn driver_errors_carry_the_call_the_code_and_its_name() {
    let (driver, plugin) = FakeDriver::one_gpu();
    let (device, image) = plugin_contract::first_device_with_image(&plugin, IMAGE);

    // A code the driver cannot name: the built-in table names it.
    driver.fail("cuMemHostAlloc", 2);
    let error = device.alloc_shared(64).err().unwrap();
    match cuda_error(&error) {
        CudaError::Driver { call, code, name } => {
            assert_eq!(
                (*call, *code, name.as_str()),
                ("cuMemHostAlloc", 2, "CUDA_ERROR_OUT_OF_MEMORY")
            );
        }
        other => panic!("{other:?}"),
    }
    // A code the driver names (cuGetErrorName).
    driver.fail("cuLaunchKernel", 700);
    let error = launch_main(device, &image, Box::new(|| ())).unwrap_err();
    assert_eq!(
        error.to_string(),
        "cuLaunchKernel failed: CUDA_ERROR_ILLEGAL_ADDRESS (700)"
    );
    // Neither knows it.
    driver.fail("cuModuleLoadDataEx", 4242);
    let error = device.load_image(IMAGE).unwrap_err();
    assert_eq!(
        error.to_string(),
        "cuModuleLoadDataEx failed: CUDA_ERROR_4242 (4242)"
    );
}

#[test]
fn a_failed_load_reports_the_jit_error_log() {
    let (_driver, plugin) = FakeDriver::one_gpu();
    let device = &plugin.devices()[0];
    let bad = ".entry main\n.global __llvm_rpc_client many\n";
    let error = device.load_image(bad.as_bytes()).unwrap_err();
    assert_eq!(cuda_error(&error).code(), Some(218));
    match cuda_error(&error) {
        CudaError::Load { log, .. } => assert_eq!(
            log,
            "ptxas application ptx input, line 2; error   : bad size \"many\" of .global \
             __llvm_rpc_client\nptxas fatal   : Ptx assembly aborted due to errors"
        ),
        other => panic!("{other:?}"),
    }
    let text = error.to_string();
    assert!(
        text.starts_with(
            "cuModuleLoadDataEx failed: CUDA_ERROR_INVALID_PTX (218); the JIT's error log: \
             ptxas application ptx input, line 2"
        ),
        "{text}"
    );
    // The device still loads a good image afterwards.
    assert!(device.load_image(IMAGE).is_ok());
}

// --- Images -----------------------------------------------------------------------------------

#[test]
fn the_client_symbol_size_names_the_generation() {
    let (_driver, plugin) = FakeDriver::one_gpu();
    let device = &plugin.devices()[0];
    let cases = [
        (552, Some(Generation::V1)),
        (2096, Some(Generation::V2)),
        (100, None),
    ];
    for (size, generation) in cases {
        let image = format!(".global __llvm_rpc_client {size}\n");
        let image = device.load_image(image.as_bytes()).unwrap();
        let symbol = device.find_symbol(&image, "__llvm_rpc_client").unwrap();
        assert_eq!(symbol.size, size);
        assert_eq!(
            Generation::from_client_object_size(symbol.size).ok(),
            generation
        );
    }
    let image = device.load_image(b".entry main\n").unwrap();
    assert_eq!(device.find_symbol(&image, "__llvm_rpc_client"), None);
    assert_eq!(device.find_symbol(&image, "bad\0name"), None);
}

/// LLVM 18 and 19 images point `__llvm_libc_rpc_client` to their `rpc::client` object: the
/// plugin gives the size of that object at the address the pointer holds (96 bytes: LLVM 18,
/// 552: LLVM 19), and nothing for another address.
#[test]
fn the_size_of_llvm_libcs_client_object_is_found_at_its_address() {
    let (_driver, plugin) = FakeDriver::one_gpu();
    let device = &plugin.devices()[0];
    for (namespace, size) in [("__llvm_libc_18_1_8_", 96), ("__llvm_libc_19_1_7_", 552)] {
        let object = format!("_ZN{}{namespace}3rpc6clientE", namespace.len());
        let text = format!(".global __llvm_libc_rpc_client 8\n.global {object} {size}\n");
        let image = device.load_image(text.as_bytes()).unwrap();
        let at = device.find_symbol(&image, &object).unwrap().addr;
        assert_eq!(device.symbol_size_at(&image, at), Some(size), "{object}");
        let pointer = device
            .find_symbol(&image, "__llvm_libc_rpc_client")
            .unwrap();
        assert_eq!(device.symbol_size_at(&image, pointer.addr), None);
    }
    let image = device
        .load_image(b".global __llvm_libc_rpc_client 8\n")
        .unwrap();
    assert_eq!(
        device.symbol_size_at(&image, 0x1000),
        None,
        "no client object"
    );
}

/// The runtime over an LLVM 18 or 19 image writes exactly that release's client object where
/// the pointer points (96 bytes, v0; 552, v1), and over an image whose object it cannot tell
/// refuses it, writing nothing.
#[test]
fn the_runtime_writes_llvm_18s_or_19s_client_object_and_nothing_it_cannot_tell() {
    use rpc_core::protocol::Layout;
    for (namespace, size, generation) in [
        ("__llvm_libc_18_1_8_", 96, Generation::V0),
        ("__llvm_libc_19_1_7_", 552, Generation::V1),
    ] {
        let (driver, plugin) = FakeDriver::one_gpu();
        let mut runtime = rpc_core::PluginRuntime::new(plugin, Default::default()).unwrap();
        let object = format!("_ZN{}{namespace}3rpc6clientE", namespace.len());
        let text = format!(
            ".global {object} {size}\n.global __llvm_libc_rpc_client 8 = {object}\n.entry _start\n"
        );
        let image = runtime.load_image(0, text.as_bytes()).unwrap();
        let at = runtime.find_symbol(image, &object).unwrap().addr;
        let written = driver.memory_at(at).expect("the client object was written");
        assert_eq!(written.len(), size, "{object}");
        let ports = u32::from_le_bytes(written[..4].try_into().unwrap());
        let base = u64::from_le_bytes(written[8..16].try_into().unwrap());
        let layout = Layout::new(generation, ports, 32).unwrap();
        assert_eq!(written, layout.client_object(base), "{object}");
        runtime.deinit().unwrap();
    }
    let (driver, plugin) = FakeDriver::one_gpu();
    let runtime = rpc_core::PluginRuntime::new(plugin, Default::default()).unwrap();
    let object = "_ZN13__llvm_libc_x3rpc6clientE";
    let text = format!(".global {object} 100\n.global __llvm_libc_rpc_client 8 = {object}\n");
    let error = runtime.load_image(0, text.as_bytes()).unwrap_err();
    assert_eq!(
        error,
        rpc_core::Error::Protocol(rpc_core::ProtocolError::BadClientObjectSize(100))
    );
    assert_eq!(
        driver.copy_sizes(),
        [8],
        "only the JIT's pointer initialiser: nothing written to an unknown object"
    );
}

/// The fake, like the driver, reads PTX up to a NUL (the plugin adds it: the contract's
/// images load), and a copy to a variable lands in the driver's memory.
#[test]
fn a_copy_to_a_variable_reaches_the_drivers_memory() {
    let (driver, plugin) = FakeDriver::one_gpu();
    let (device, image) = plugin_contract::first_device_with_image(&plugin, IMAGE);
    let data = device.find_symbol(&image, "data").unwrap();
    device.copy_to_device(data.addr, &[7; 16]).unwrap();
    assert_eq!(driver.memory_at(data.addr), Some(vec![7; 16]));
}

// --- Launches and completions -----------------------------------------------------------------

#[test]
fn launch_passes_the_packed_argument_block() {
    let (driver, plugin) = FakeDriver::one_gpu();
    let (device, image) = plugin_contract::first_device_with_image(&plugin, IMAGE);
    let args: Vec<u8> = (0..24).collect();
    device
        .launch(&image, "other", &args, Grid::linear(1, 32), Box::new(|| ()))
        .unwrap();
    assert_eq!(driver.launches()[0].args, args);
}

#[test]
fn done_runs_once_after_the_kernel_completes() {
    let run = launched(|_| ());
    run.launch.unwrap();
    assert_eq!(calls(&run.calls), 0, "done before the kernel completed");
    run.driver.complete_kernels();
    assert_eq!(calls(&run.calls), 1);
    run.plugin.devices()[0].synchronize().unwrap();
    run.driver.complete_kernels();
    assert_eq!(calls(&run.calls), 1);
}

#[test]
fn done_runs_once_when_the_launch_fails() {
    let run = launched(|driver| driver.fail("cuLaunchKernel", 701));
    assert_eq!(cuda_error(&run.launch.unwrap_err()).code(), Some(701));
    assert_eq!(calls(&run.calls), 1);
    run.plugin.devices()[0].synchronize().unwrap();
    run.driver.complete_kernels();
    assert_eq!(calls(&run.calls), 1);
    assert_eq!(run.driver.host_funcs_run(), 0);
}

#[test]
fn done_runs_once_when_the_kernel_is_unknown_or_the_grid_empty() {
    let [(error, unknown), (_, empty)] =
        plugin_contract::suite::unknown_kernels_and_empty_grids_launch_nothing::<FakeDriver>(
            |_, _, _| (),
        );
    assert_eq!(cuda_error(&error).code(), Some(500));
    assert_eq!((calls(&unknown), calls(&empty)), (1, 1));
}

#[test]
fn done_runs_once_after_the_kernel_when_queueing_the_callback_fails() {
    let run = launched(|driver| driver.fail("cuLaunchHostFunc", 999));
    assert_eq!(
        run.launch.unwrap_err().to_string(),
        "cuLaunchHostFunc failed: CUDA_ERROR_UNKNOWN (999)"
    );
    // The kernel was launched, waited for, and then reported.
    assert_eq!(run.driver.launches().len(), 1);
    assert_eq!(calls(&run.calls), 1);
    run.plugin.devices()[0].synchronize().unwrap();
    assert_eq!(calls(&run.calls), 1);
}

#[test]
fn done_runs_once_when_a_kernel_faults_the_context() {
    let run = launched(|_| ());
    run.launch.unwrap();
    run.driver.fault(700);
    // The driver drops the host function of a failed context; synchronize reports it instead.
    let device = &run.plugin.devices()[0];
    let error = device.synchronize().unwrap_err();
    assert_eq!(cuda_error(&error).code(), Some(700));
    assert_eq!(calls(&run.calls), 1);
    assert!(device.synchronize().is_err());
    assert_eq!(calls(&run.calls), 1);
    assert_eq!(run.driver.host_funcs_run(), 0);
}

#[test]
fn deinit_waits_for_launches_and_reports_their_completion() {
    let mut run = launched(|_| ());
    run.launch.unwrap();
    run.plugin.deinit().unwrap();
    assert_eq!(calls(&run.calls), 1);
    assert_eq!(run.driver.host_funcs_run(), 1);
    drop(run.image); // after release: the context took the module with it
}

// --- Memory -----------------------------------------------------------------------------------

#[test]
fn a_shared_region_of_no_bytes_is_refused() {
    let (_driver, plugin) = FakeDriver::one_gpu();
    assert!(plugin.devices()[0].alloc_shared(0).is_err());
}

#[test]
fn a_misaligned_shared_region_is_refused_and_freed() {
    let (driver, plugin) = FakeDriver::one_gpu();
    driver.misalign_host_memory();
    let error = plugin.devices()[0].alloc_shared(4096).err().unwrap();
    assert!(matches!(
        cuda_error(&error),
        CudaError::Misaligned { align: 64, .. }
    ));
    assert_eq!(driver.live_host_allocations(), 0);
}

#[test]
fn once_the_device_is_released_its_allocator_refuses() {
    let (_driver, mut plugin) = FakeDriver::one_gpu();
    let allocator = plugin.devices()[0].allocator();
    let addr = allocator.allocate(1000).unwrap();
    plugin.deinit().unwrap();
    // The glue may still hold the allocator: it refuses, it does not touch a dead context.
    let error = allocator.allocate(8).unwrap_err();
    assert!(matches!(cuda_error(&error), CudaError::Released));
    // SAFETY: the block came from `allocate` and was not freed.
    let error = unsafe { allocator.deallocate(addr, 1000) }.unwrap_err();
    assert!(matches!(cuda_error(&error), CudaError::Released));
}

/// An H200 has memory pools: the allocator allocates from them on its stream; a GPU without
/// allocates with plain `cuMemAlloc`, whose failures it reports.
#[test]
fn the_allocator_uses_memory_pools_where_the_gpu_has_them_else_plain_cumemalloc() {
    for memory_pools in [true, false] {
        let gpu = FakeGpu {
            memory_pools,
            ..FakeGpu::h200()
        };
        let (driver, plugin) = plugin_with(vec![gpu]);
        let allocator = plugin.devices()[0].allocator();
        assert_ne!(allocator.allocate(64).unwrap(), 0);
        assert_eq!(driver.async_allocations(), usize::from(memory_pools));
        assert_eq!(driver.live_device_allocations(), 1);
        if !memory_pools {
            driver.fail("cuMemAlloc_v2", 2);
            let error = allocator.allocate(64).unwrap_err();
            assert_eq!(cuda_error(&error).code(), Some(2));
        }
    }
}

#[test]
fn abort_launches_resets_the_context_reports_the_launches_and_deinit_waits_no_more() {
    let mut run = launched(|_| ());
    run.launch.unwrap();
    // The kernel never completes by itself (the fake runs it only at a synchronize).
    run.plugin.devices()[0].abort_launches();
    assert_eq!(run.driver.resets(), 1);
    assert_eq!(calls(&run.calls), 1, "the completion reported");
    let error = run.plugin.devices()[0].synchronize().unwrap_err();
    assert!(matches!(cuda_error(&error), CudaError::Aborted), "{error}");
    run.plugin.deinit().unwrap();
    let host_funcs_run = run.driver.host_funcs_run();
    assert_eq!(host_funcs_run, 0, "the kernel's host function never ran");
    assert_eq!(calls(&run.calls), 1, "once");
    assert_eq!(run.driver.retained_contexts(), 0);
    drop(run.image);
}

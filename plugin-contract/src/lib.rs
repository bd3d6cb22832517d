//! `plugin-contract`: what every plugin promises through `rpc_core::plugin`'s traits, checked
//! once. Each function here is one behaviour of the contract, generic over [`Plugin`] or
//! [`Device`], and panics (an assertion) where a plugin breaks it; each plugin's tests call it
//! with the plugin set up over its fake driver (plugin-cuda's `fake`, plugin-amdgpu's fake HSA)
//! or its real devices (plugin-host), and keep what is vendor-specific (error codes, what the
//! fake recorded) in their own tests. The fake's counters come in as closures, so this crate
//! knows no vendor: it depends on rpc-core alone, and only as a dev-dependency of the plugins.
//!
//! [`suite!`] makes the behaviours that need nothing of the vendor `#[test]`s of a plugin
//! over its fake ([`suite::Fake`]), so a plugin states them by one line.
//!
//! Also the test furniture the plugins' suites share: [`counted`] completions and a runtime
//! whose stdout a test reads back ([`runtime_capturing_stdout`], [`Capture`]).

#![warn(missing_docs)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use rpc_core::plugin::{describe, Completion, Device, DeviceAllocator, Grid, Plugin, Symbol};
use rpc_core::protocol::Generation;
use rpc_core::{ExitPolicy, PluginRuntime, Runtime, ServerConfig, ServerError, ServicesConfig};

pub mod suite;
pub use suite::Fake;

/// How many times a [`counted`] completion ran.
pub type Calls = Arc<AtomicUsize>;

/// A completion that counts its calls.
pub fn counted() -> (Calls, Completion) {
    let calls = Arc::new(AtomicUsize::new(0));
    let inner = calls.clone();
    (
        calls,
        Box::new(move || {
            // SeqCst: a counter read by the test thread after the launch it counts; no data
            // rides on it, and the strongest ordering keeps the test's reasoning simple.
            inner.fetch_add(1, Ordering::SeqCst);
        }),
    )
}

/// How many times `calls` ran.
pub fn calls(calls: &Calls) -> usize {
    calls.load(Ordering::SeqCst)
}

/// A writer the test reads back (the server's stdout): rpc-core's tests' own.
#[path = "../../rpc-core/tests/common/capture.rs"]
mod capture;
pub use capture::Capture;

/// A runtime over `plugin` that records kernels' exits (so a test sees them as
/// `synchronize`'s value) and captures the server's stdout.
pub fn runtime_capturing_stdout<P: Plugin>(plugin: P) -> (PluginRuntime<P>, Capture) {
    let config = ServerConfig {
        services: ServicesConfig {
            exit: ExitPolicy::Record,
            ..ServicesConfig::default()
        },
        ..ServerConfig::default()
    };
    let runtime = PluginRuntime::new(plugin, config).unwrap();
    let out = Capture::default();
    runtime
        .server()
        .context()
        .services()
        .set_stdout(Box::new(out.clone()));
    (runtime, out)
}

/// The first device of an initialised `plugin` and `bytes` loaded on it: where most tests of
/// one device start.
pub fn first_device_with_image<'a, P: Plugin>(
    plugin: &'a P,
    bytes: &[u8],
) -> (&'a P::Device, <P::Device as Device>::Image) {
    let device = &plugin.devices()[0];
    let image = device.load_image(bytes).unwrap();
    (device, image)
}

// --- Plugins --------------------------------------------------------------------------------

/// No driver, no device or a failed init is not an error: `init` succeeds with zero devices,
/// the reason says why, and `describe` says both, as every plugin does.
pub fn zero_devices_with_a_reason<P: Plugin>(plugin: &mut P, reason: &str) {
    plugin.init().unwrap();
    assert!(plugin.devices().is_empty());
    assert_eq!(plugin.reason().as_deref(), Some(reason));
    assert_eq!(
        describe(plugin),
        format!("{}: 0 devices ({reason})", plugin.name())
    );
}

/// An initialised plugin named `name` has one device per entry of `lanes`, each of that lane
/// width, no reason for having none, and `describe` gives `line`.
pub fn devices_are_described<P: Plugin>(plugin: &P, name: &str, lanes: &[u32], line: &str) {
    assert_eq!(plugin.name(), name);
    assert_eq!(plugin.reason(), None);
    let found: Vec<u32> = plugin.devices().iter().map(Device::lane_size).collect();
    assert_eq!(found, lanes);
    assert_eq!(describe(plugin), line);
}

/// `deinit` releases every device and everything the driver gave it (each of `left`'s
/// counts, read from the fake after the deinit, is zero), and a second `deinit` is harmless.
pub fn deinit_leaves_nothing<P: Plugin>(
    plugin: &mut P,
    left: impl Fn() -> Vec<(&'static str, i64)>,
) {
    plugin.deinit().unwrap();
    assert!(plugin.devices().is_empty());
    for (what, count) in left() {
        assert_eq!(count, 0, "{what} left after deinit");
    }
    plugin.deinit().unwrap();
}

/// A runtime's `deinit` is final: it succeeds, and starting the server again is refused.
pub fn deinit_is_final(runtime: &mut dyn Runtime) {
    runtime.deinit().unwrap();
    assert_eq!(
        runtime.start_server().unwrap_err(),
        rpc_core::Error::Server(ServerError::Deinitialised)
    );
}

// --- Images ---------------------------------------------------------------------------------

/// An image (`bytes`: a v1 `__llvm_rpc_client` of 552 bytes and a 16-byte variable `data`)
/// loads, its variables are found with their sizes, unknown or unrepresentable names are no
/// symbol, bytes copied to a variable come back, and dropping the image unloads it
/// (`live_images`: the fake's count). `more` checks what the vendor adds, before the drop.
pub fn images_load_find_variables_copy_and_unload<D: Device>(
    device: &D,
    bytes: &[u8],
    live_images: impl Fn() -> usize,
    more: impl FnOnce(&D::Image, Symbol),
) {
    let image = device.load_image(bytes).unwrap();
    assert_eq!(live_images(), 1);
    let client = device.find_symbol(&image, "__llvm_rpc_client").unwrap();
    assert_eq!(
        Generation::from_client_object_size(client.size),
        Ok(Generation::V1)
    );
    let data = device.find_symbol(&image, "data").unwrap();
    assert_eq!(data.size, 16);
    device.copy_to_device(data.addr, &[7; 16]).unwrap();
    let mut back = [0u8; 16];
    device.copy_from_device(data.addr, &mut back).unwrap();
    assert_eq!(back, [7; 16]);
    assert_eq!(device.find_symbol(&image, "missing"), None);
    assert_eq!(device.find_symbol(&image, "bad\0name"), None);
    more(&image, data);
    drop(image);
    assert_eq!(live_images(), 0);
}

// --- Launches and completions ---------------------------------------------------------------

/// A launch of kernel `other` of `image` with `args` reaches the driver with that kernel and
/// that grid (`launches`: what the fake recorded, kernel and grid each); the vendor checks
/// how `args` arrived.
pub fn launch_reaches_the_driver_with_the_kernel_and_the_grid<D: Device>(
    device: &D,
    image: &D::Image,
    args: &[u8],
    launches: impl Fn() -> Vec<(String, Grid)>,
) -> Grid {
    let grid = Grid {
        blocks: [4, 2, 1],
        threads: [64, 1, 1],
    };
    device
        .launch(image, "other", args, grid, Box::new(|| ()))
        .unwrap();
    device.synchronize().unwrap();
    assert_eq!(launches(), [("other".to_string(), grid)]);
    grid
}

/// Each launch's `done` runs exactly once by the time `synchronize` returns, and a second
/// `synchronize` runs none again (kernel `main` of `image`, one block of `lanes` threads).
pub fn done_runs_once_by_synchronize<D: Device>(device: &D, image: &D::Image, lanes: u32) {
    let counters: Vec<Calls> = (0..3)
        .map(|_| {
            let (calls, done) = counted();
            device
                .launch(image, "main", &[], Grid::linear(1, lanes), done)
                .unwrap();
            calls
        })
        .collect();
    device.synchronize().unwrap();
    device.synchronize().unwrap();
    assert!(counters.iter().all(|c| calls(c) == 1));
}

/// A `done` that panics takes nothing down: `synchronize` succeeds and the next launch's
/// `done` runs once.
pub fn a_panicking_completion_is_contained<D: Device>(device: &D, image: &D::Image, lanes: u32) {
    device
        .launch(
            image,
            "main",
            &[],
            Grid::linear(1, lanes),
            Box::new(|| panic!("boom")),
        )
        .unwrap();
    device.synchronize().unwrap();
    let (count, done) = counted();
    device
        .launch(image, "main", &[], Grid::linear(1, lanes), done)
        .unwrap();
    device.synchronize().unwrap();
    assert_eq!(calls(&count), 1, "the completions' thread lived on");
}

/// A launch of an unknown kernel and one of an empty grid are errors that launch nothing
/// (`launched`: the fake's count of launches); their errors and `done` counters, in that order,
/// for the vendor to check (a failed launch calls `done` or drops it).
pub fn unknown_kernels_and_empty_grids_launch_nothing<D: Device>(
    device: &D,
    image: &D::Image,
    lanes: u32,
    launched: impl Fn() -> usize,
) -> [(rpc_core::plugin::VendorError, Calls); 2] {
    let (unknown, done) = counted();
    let unknown_error = device
        .launch(image, "missing", &[], Grid::linear(1, lanes), done)
        .unwrap_err();
    let (empty, done) = counted();
    let empty_error = device
        .launch(image, "main", &[], Grid::linear(0, lanes), done)
        .unwrap_err();
    assert_eq!(launched(), 0);
    [(unknown_error, unknown), (empty_error, empty)]
}

// --- Memory ---------------------------------------------------------------------------------

/// Shared regions are of the length asked, zeroed, 64-byte aligned on both sides, mapped at
/// the same address (the fakes' unified addressing) and freed on drop (`live`: the fake's
/// count of host allocations).
pub fn shared_regions_are_zeroed_aligned_and_freed_on_drop<D: Device>(
    device: &D,
    live: impl Fn() -> usize,
) {
    let region = device.alloc_shared(132_608).unwrap();
    assert_eq!(region.len(), 132_608);
    assert_eq!(region.host_ptr() as usize % 64, 0);
    assert_eq!(region.device_addr() % 64, 0);
    assert_eq!(region.device_addr(), region.host_ptr() as u64);
    // SAFETY: the region owns `len` bytes at `host_ptr` and nothing else uses them.
    let bytes = unsafe { std::slice::from_raw_parts(region.host_ptr(), region.len()) };
    assert!(bytes.iter().all(|&b| b == 0), "the memory was zeroed");
    assert_eq!(live(), 1);
    drop(region);
    assert_eq!(live(), 0);
}

/// MALLOC's blocks (of 0 bytes too) are non-null and disjoint, and each is freed by its
/// address (`live`: the fake's count of device allocations).
pub fn device_blocks_are_disjoint_and_freed_by_address(
    allocator: &dyn DeviceAllocator,
    live: impl Fn() -> usize,
) {
    let mut blocks = Vec::new();
    for size in [1, 100, 3 << 20, 0, 10] {
        let addr = allocator.allocate(size).unwrap();
        assert_ne!(addr, 0);
        blocks.push((addr, size.max(1)));
    }
    blocks.sort();
    assert!(
        blocks.windows(2).all(|w| w[0].0 + w[0].1 <= w[1].0),
        "{blocks:x?}"
    );
    assert_eq!(live(), 5);
    for &(addr, size) in &blocks {
        // SAFETY: each block came from `allocate` just above, freed once here.
        unsafe { allocator.deallocate(addr, size) }.unwrap();
    }
    assert_eq!(live(), 0);
}

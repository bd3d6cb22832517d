//! The contract run against a plugin's fake driver: what the fake must tell ([`Fake`]), and
//! one function per behaviour over a fresh fake of one GPU, each a `#[test]` of the plugin's
//! through [`suite!`](crate::suite!). What a vendor adds to a behaviour (its error codes, what
//! its fake recorded) stays in the plugin's own tests.

use std::sync::Arc;

use rpc_core::plugin::{Device, Grid, Plugin, VendorError};

use crate::{first_device_with_image, Calls};

/// The device type of a fake's plugin.
pub type DeviceOf<F> = <<F as Fake>::Plugin as Plugin>::Device;
/// The image type of a fake's plugin.
pub type ImageOf<F> = <DeviceOf<F> as Device>::Image;

/// A plugin's fake driver, as the suite drives it.
pub trait Fake: Sized + 'static {
    /// The plugin over the fake.
    type Plugin: Plugin;
    /// An image the fake loads: kernels `main` and `other`, a v1 `__llvm_rpc_client` (552
    /// bytes) and a 16-byte variable `data`.
    const IMAGE: &'static [u8];
    /// A fake of one typical GPU and the plugin over it, initialised.
    fn one_gpu() -> (Arc<Self>, Self::Plugin);
    /// Images loaded and not yet unloaded.
    fn loaded_images(&self) -> usize;
    /// Each launch that reached the driver: its kernel and its grid.
    fn launched(&self) -> Vec<(String, Grid)>;
    /// Host allocations (shared regions) not yet freed.
    fn host_allocations(&self) -> usize;
    /// Device allocations (MALLOC's blocks) not yet freed.
    fn device_allocations(&self) -> usize;
}

/// `plugin` made over `fake` and initialised, with the fake for the test to look into.
pub fn initialised<F, P: Plugin>(fake: F, plugin: impl FnOnce(Arc<F>) -> P) -> (Arc<F>, P) {
    let fake = Arc::new(fake);
    let mut plugin = plugin(fake.clone());
    plugin.init().unwrap();
    (fake, plugin)
}

/// See [`crate::images_load_find_variables_copy_and_unload`].
pub fn images_load_find_variables_copy_and_unload<F: Fake>() {
    let (fake, plugin) = F::one_gpu();
    let device = &plugin.devices()[0];
    crate::images_load_find_variables_copy_and_unload(
        device,
        F::IMAGE,
        || fake.loaded_images(),
        |_, _| (),
    );
}

/// See [`crate::launch_reaches_the_driver_with_the_kernel_and_the_grid`] (no arguments).
pub fn launch_reaches_the_driver_with_the_kernel_and_the_grid<F: Fake>() {
    let (fake, plugin) = F::one_gpu();
    let (device, image) = first_device_with_image(&plugin, F::IMAGE);
    crate::launch_reaches_the_driver_with_the_kernel_and_the_grid(device, &image, &[], || {
        fake.launched()
    });
}

/// See [`crate::done_runs_once_by_synchronize`] (a block of one warp).
pub fn done_runs_once_by_synchronize<F: Fake>() {
    let (_fake, plugin) = F::one_gpu();
    let (device, image) = first_device_with_image(&plugin, F::IMAGE);
    crate::done_runs_once_by_synchronize(device, &image, device.lane_size());
}

/// See [`crate::a_panicking_completion_is_contained`] (a block of one warp).
pub fn a_panicking_completion_is_contained<F: Fake>() {
    let (_fake, plugin) = F::one_gpu();
    let (device, image) = first_device_with_image(&plugin, F::IMAGE);
    crate::a_panicking_completion_is_contained(device, &image, device.lane_size());
}

/// [`crate::unknown_kernels_and_empty_grids_launch_nothing`] on a fresh fake's device, then
/// `more` with the fake, the device and the image (the vendor's checks of what the failures
/// left behind): the two errors and `done` counters, for the vendor to check.
pub fn unknown_kernels_and_empty_grids_launch_nothing<F: Fake>(
    more: impl FnOnce(&F, &DeviceOf<F>, &ImageOf<F>),
) -> [(VendorError, Calls); 2] {
    let (fake, plugin) = F::one_gpu();
    let (device, image) = first_device_with_image(&plugin, F::IMAGE);
    let failed = crate::unknown_kernels_and_empty_grids_launch_nothing(
        device,
        &image,
        device.lane_size(),
        || fake.launched().len(),
    );
    more(&fake, device, &image);
    failed
}

/// See [`crate::shared_regions_are_zeroed_aligned_and_freed_on_drop`].
pub fn shared_regions_are_zeroed_aligned_and_freed_on_drop<F: Fake>() {
    let (fake, plugin) = F::one_gpu();
    crate::shared_regions_are_zeroed_aligned_and_freed_on_drop(&plugin.devices()[0], || {
        fake.host_allocations()
    });
}

/// See [`crate::device_blocks_are_disjoint_and_freed_by_address`].
pub fn device_blocks_are_disjoint_and_freed_by_address<F: Fake>() {
    let (fake, plugin) = F::one_gpu();
    let allocator = plugin.devices()[0].allocator();
    crate::device_blocks_are_disjoint_and_freed_by_address(&*allocator, || {
        fake.device_allocations()
    });
}

/// The suite's functions as `#[test]`s of a plugin over its [`Fake`] `$fake` (a path), in a
/// module `contract`: `plugin_contract::suite!(crate::fake::FakeDriver);` in its tests.
#[macro_export]
macro_rules! suite {
    ($fake:ty) => {
        $crate::suite!(
            @tests $fake:
            images_load_find_variables_copy_and_unload,
            launch_reaches_the_driver_with_the_kernel_and_the_grid,
            done_runs_once_by_synchronize,
            a_panicking_completion_is_contained,
            shared_regions_are_zeroed_aligned_and_freed_on_drop,
            device_blocks_are_disjoint_and_freed_by_address,
        );
    };
    (@tests $fake:ty: $($behaviour:ident,)*) => {
        /// The plugin contract over the fake driver.
        mod contract {
            $(
                #[test]
                fn $behaviour() {
                    $crate::suite::$behaviour::<$fake>();
                }
            )*
        }
    };
}

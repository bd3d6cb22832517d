//! The plugin's behaviour where no AMD GPU can be used: zero devices and a reason, no panic.

use plugin_amdgpu::{loader, AmdGpuPlugin};
use rpc_core::plugin::{probe, Plugin};

#[test]
fn missing_library_is_zero_devices_with_the_reason() {
    let mut plugin = AmdGpuPlugin::with_library("libhsa-runtime-missing.so.99");
    plugin.init().expect("no runtime is not an error");
    assert!(plugin.devices().is_empty());
    let reason = plugin.reason().expect("a reason");
    assert!(
        reason.contains("cannot load libhsa-runtime-missing.so.99"),
        "{reason}"
    );
    plugin.deinit().expect("deinit without init is fine");
    assert_eq!(plugin.name(), "amdgpu");
}

#[test]
fn a_library_lacking_hsa_symbols_is_zero_devices_with_the_reason() {
    let mut plugin = AmdGpuPlugin::with_library("libc.so.6");
    plugin.init().unwrap();
    assert!(plugin.devices().is_empty());
    assert!(plugin.reason().unwrap().contains("lacks hsa_init"));
}

#[test]
fn describe_names_the_reason_when_there_are_no_devices() {
    let line = probe(AmdGpuPlugin::with_library("libhsa-runtime-missing.so.99"));
    assert!(
        line.starts_with("amdgpu: 0 devices (cannot load libhsa-runtime-missing.so.99"),
        "{line}"
    );
}

/// With the real runtime: on a machine without a usable GPU (no `/dev/kfd`), Debian's
/// ROCm 5.2 `hsa_init` fails with HSA_STATUS_ERROR_OUT_OF_RESOURCES; where the library is not
/// installed the reason says so; where a GPU exists, devices are found. Never a panic.
#[test]
fn the_system_runtime_gives_devices_or_a_reason() {
    let mut plugin = AmdGpuPlugin::new();
    plugin.init().unwrap();
    let line = probe(AmdGpuPlugin::new());
    eprintln!("{line}");
    if plugin.devices().is_empty() {
        let reason = plugin.reason().unwrap();
        match loader::table() {
            Err(_) => assert!(
                reason.contains("cannot load libhsa-runtime64.so.1"),
                "{reason}"
            ),
            Ok(_) if !std::path::Path::new("/dev/kfd").exists() => {
                assert!(
                    reason.starts_with("hsa_init failed: HSA_STATUS_ERROR"),
                    "{reason}"
                );
            }
            Ok(_) => assert!(!reason.is_empty()),
        }
        assert!(line.starts_with("amdgpu: 0 devices ("), "{line}");
    } else {
        assert!(plugin.reason().is_none());
        assert!(
            line.starts_with(&format!("amdgpu: {} device", plugin.devices().len())),
            "{line}"
        );
    }
    // init twice and deinit twice are harmless.
    plugin.init().unwrap();
    plugin.deinit().unwrap();
    plugin.deinit().unwrap();
}

//! `libplugin_amdgpu.so`: the amdgpu plugin behind plugin-abi's C ABI (its entry symbol
//! `rpc_plugin_entry`; see `docs/plugins.md`).

#![warn(missing_docs)]

plugin_abi::export_plugin!(plugin_amdgpu::AmdGpuPlugin);

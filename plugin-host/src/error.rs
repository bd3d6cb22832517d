//! The host plugin's one error type.

/// What can go wrong in the host plugin.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    /// A configuration the plugin cannot honour.
    #[error("bad host plugin configuration: {0}")]
    Config(String),
    /// Image bytes that name no host image registered with this copy of plugin-host (a
    /// loaded `libplugin_host.so` has a registry of its own: it runs native shared objects).
    #[error(
        "not a host image registered in this copy of plugin-host (a loaded libplugin_host.so \
         runs native shared objects, not the program's HostImages): {0}"
    )]
    UnknownImage(String),
    /// A native image (a shared object) that cannot be loaded, and why.
    #[error("native image: {0}")]
    NativeImage(String),
    /// A kernel name the image does not have.
    #[error("image {image} has no kernel {kernel:?}")]
    UnknownKernel {
        /// The image's name (as given to `HostImage::new`; `native` for a shared object).
        image: String,
        /// The name asked for.
        kernel: String,
    },
    /// A launch shape the plugin refuses (no threads, too many warps).
    #[error("bad launch: {0}")]
    BadLaunch(String),
    /// An address range that is no memory of this device.
    #[error("{len} bytes at {addr:#x} are not memory of this device")]
    BadAddress {
        /// The range's first byte, a device (here: host) address.
        addr: u64,
        /// The range's length in bytes.
        len: usize,
    },
    /// One or more warps of a kernel panicked.
    #[error("kernel failed: {0}")]
    KernelFailed(String),
    /// A warp's call in an image that does not use RPC (it has no mailbox).
    #[error("this image does not use RPC")]
    NoRpc,
    /// A warp's call after its device was aborted (`deinit` with kernels still running).
    #[error("the device was aborted")]
    Aborted,
    /// A thread could not be spawned.
    #[error("could not spawn a warp thread: {0}")]
    Spawn(#[from] std::io::Error),
}

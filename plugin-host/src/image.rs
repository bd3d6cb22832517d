//! Host images: a set of named kernels written in Rust (or a native shared object's exported
//! functions, see [`crate::native`]), and whether the image uses RPC (then it
//! carries a `__llvm_rpc_client` global of the generation's size, as a GPU image would).
//! A registered image's bytes are only its name in this process's registry (host kernels are
//! Rust closures, so there is no binary to load).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use rpc_core::protocol::Generation;

use crate::error::HostError;
use crate::kernel::{Kernel, Warp};
use crate::lock;
use crate::memory::RawMemory;

/// What the bytes of a registered image start with; its key follows.
const MAGIC: &[u8] = b"rpc-host-image:";

/// An image before loading: its kernels and its RPC generation.
#[derive(Clone)]
pub struct HostImage {
    pub(crate) name: String,
    pub(crate) kernels: HashMap<String, Kernel>,
    pub(crate) rpc: Option<Generation>,
    /// A native image's library (its kernels are its exported functions).
    pub(crate) native: Option<Arc<crate::native::NativeLibrary>>,
}

impl HostImage {
    /// An image that uses RPC with the current (v2) mailbox layout.
    pub fn new(name: &str) -> Self {
        HostImage {
            name: name.into(),
            kernels: HashMap::new(),
            rpc: Some(Generation::V2),
            native: None,
        }
    }

    /// Uses the mailbox layout of `generation` (v1: LLVM 22 and older).
    pub fn generation(mut self, generation: Generation) -> Self {
        self.rpc = Some(generation);
        self
    }

    /// An image without the client symbol: loading it attaches no mailbox and starts no server.
    pub fn without_rpc(mut self) -> Self {
        self.rpc = None;
        self
    }

    /// Adds a kernel.
    pub fn kernel(
        mut self,
        name: &str,
        kernel: impl Fn(&mut Warp<'_>) + Send + Sync + 'static,
    ) -> Self {
        self.kernels.insert(name.into(), Arc::new(kernel));
        self
    }

    /// The kernel `name`: a registered closure, or a native image's exported function.
    pub(crate) fn find_kernel(&self, name: &str) -> Option<Kernel> {
        match &self.native {
            Some(library) => library.kernel(name),
            None => self.kernels.get(name).cloned(),
        }
    }

    /// Registers the image in this process and returns the bytes that load it.
    pub fn into_bytes(self) -> Vec<u8> {
        let mut images = lock(registry());
        let key = format!("{}#{}", self.name, images.len());
        images.insert(key.clone(), Arc::new(self));
        [MAGIC, key.as_bytes()].concat()
    }

    /// The registered image that `bytes` (from [`HostImage::into_bytes`]) name.
    pub(crate) fn registered(bytes: &[u8]) -> Result<Arc<HostImage>, HostError> {
        let key = bytes
            .strip_prefix(MAGIC)
            .and_then(|k| std::str::from_utf8(k).ok())
            .ok_or_else(|| {
                HostError::UnknownImage(format!(
                    "{} bytes without the host image header",
                    bytes.len()
                ))
            })?;
        lock(registry())
            .get(key)
            .cloned()
            .ok_or_else(|| HostError::UnknownImage(key.into()))
    }

    /// The name given to [`HostImage::new`] (`native` for a shared object): what errors call
    /// the image.
    pub fn name(&self) -> &str {
        &self.name
    }
}

/// The images registered in this process, by key.
fn registry() -> &'static Mutex<HashMap<String, Arc<HostImage>>> {
    static REGISTRY: OnceLock<Mutex<HashMap<String, Arc<HostImage>>>> = OnceLock::new();
    REGISTRY.get_or_init(Default::default)
}

/// A loaded image: the image and its global memory (the client object lives there).
pub struct LoadedImage {
    pub(crate) image: Arc<HostImage>,
    /// `__llvm_rpc_client`, if the image uses RPC.
    pub(crate) client_symbol: Option<Arc<RawMemory>>,
}

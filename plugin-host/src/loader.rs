//! The host plugin's loader: image bytes name an image registered in this process
//! ([`HostImage::into_bytes`]: host kernels are Rust closures, so the "binary" is a name; no
//! real driver is loaded), or are a native shared object ([`crate::native`]: its kernels are
//! C functions).

use std::collections::HashMap;
use std::sync::Arc;

use crate::error::HostError;
use crate::image::HostImage;
use crate::memory::RawMemory;
use crate::native::{is_elf, NativeLibrary};

/// The image that `bytes` name, or are, and a native image's client object.
pub(crate) fn resolve(bytes: &[u8]) -> Result<(Arc<HostImage>, Option<Arc<RawMemory>>), HostError> {
    if is_elf(bytes) {
        let library = NativeLibrary::open(bytes)?;
        let client = library.client_object()?;
        let image = HostImage {
            name: "native".into(),
            kernels: HashMap::new(),
            rpc: client.as_ref().map(|(generation, _)| *generation),
            native: Some(library),
        };
        return Ok((Arc::new(image), client.map(|(_, memory)| memory)));
    }
    Ok((HostImage::registered(bytes)?, None))
}

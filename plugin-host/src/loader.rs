//! The host plugin's loader: image bytes name an image registered in this process (host kernels
//! are Rust closures, so the "binary" is a name; no real driver is loaded), or are a native
//! shared object ([`crate::native`]: its kernels are C functions).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use crate::lock;

use crate::error::HostError;
use crate::image::HostImage;

const MAGIC: &[u8] = b"rpc-host-image:";

fn registry() -> &'static Mutex<HashMap<String, Arc<HostImage>>> {
    static REGISTRY: OnceLock<Mutex<HashMap<String, Arc<HostImage>>>> = OnceLock::new();
    REGISTRY.get_or_init(Default::default)
}

/// Registers `image` under a key unique in this process and returns the bytes naming it.
pub(crate) fn register(image: HostImage) -> Vec<u8> {
    let mut images = lock(registry());
    let key = format!("{}#{}", image.name, images.len());
    images.insert(key.clone(), Arc::new(image));
    [MAGIC, key.as_bytes()].concat()
}

/// The image that `bytes` name, or are, and a native image's client object.
pub(crate) fn resolve(
    bytes: &[u8],
) -> Result<(Arc<HostImage>, Option<Arc<crate::memory::RawMemory>>), HostError> {
    if crate::native::is_elf(bytes) {
        let library = crate::native::NativeLibrary::open(bytes)?;
        let client = library.client_object()?;
        let image = HostImage {
            name: "native".into(),
            kernels: HashMap::new(),
            rpc: client.as_ref().map(|(generation, _)| *generation),
            native: Some(library),
        };
        return Ok((Arc::new(image), client.map(|(_, memory)| memory)));
    }
    Ok((resolve_registered(bytes)?, None))
}

/// The registered image that `bytes` name.
fn resolve_registered(bytes: &[u8]) -> Result<Arc<HostImage>, HostError> {
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

//! The plugin layer's error: what the glue over a vendor plugin fails with of its own, the
//! vendor's error kept whole.

use std::string::String;
use std::sync::Arc;

use crate::VendorError;

/// A failure of a plugin's hook or of the glue over it (`PluginRuntime`): the vendor's error,
/// an unknown device, image or kernel, kernels that had to be aborted or ended the program.
/// The glue returns the embedder's [`Error`](crate::Error), which holds one of these as
/// [`Error::Plugin`](crate::Error::Plugin) beside the server's and the protocol's failures.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PluginError {
    /// A vendor plugin's hook failed: the vendor's error (its code and name) is this error's
    /// `source()`.
    #[error("{plugin}: {what}: {source}")]
    Vendor {
        /// The plugin (`cuda`, `amdgpu`, `host`).
        plugin: &'static str,
        /// What it was doing.
        what: &'static str,
        /// The vendor's error, kept whole.
        source: VendorSource,
    },
    /// A device index, image or kernel that does not exist.
    #[error("{0}")]
    NotFound(String),
    /// `deinit` found kernels still running after its wait; they were aborted (named here).
    #[error("kernels still running at deinit were aborted: {0}")]
    KernelsAborted(String),
    /// A kernel ended through EXIT or ABORT under the record policy.
    #[error("a kernel ended the program: {0}")]
    KernelExited(String),
}

/// The vendor's error inside [`PluginError::Vendor`]: the plugin's own error value (its type,
/// its text, its own `source()` chain), shared so that [`PluginError`] stays `Clone`. It reads
/// as the vendor's error and its `source()` is the vendor error's; [`VendorSource::get`] gives
/// the error itself, to downcast to the plugin's type. Two are equal when they are the same
/// error or read the same.
#[derive(Clone)]
pub struct VendorSource(Arc<dyn std::error::Error + Send + Sync + 'static>);

impl VendorSource {
    /// The vendor's error itself (`downcast_ref` to the plugin's error type).
    pub fn get(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
        &*self.0
    }
}

impl From<VendorError> for VendorSource {
    fn from(error: VendorError) -> Self {
        VendorSource(error.into())
    }
}

impl core::fmt::Display for VendorSource {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        core::fmt::Display::fmt(&self.0, f)
    }
}

impl core::fmt::Debug for VendorSource {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        core::fmt::Debug::fmt(&self.0, f)
    }
}

impl std::error::Error for VendorSource {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.source()
    }
}

impl PartialEq for VendorSource {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0) || self.0.to_string() == other.0.to_string()
    }
}

impl Eq for VendorSource {}

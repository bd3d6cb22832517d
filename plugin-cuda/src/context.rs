//! What a CUDA device, its images, regions and allocator share ([`Core`]: the driver, the
//! device and its primary context), and the error of a failed driver call. Its own file, below
//! `device`, `image` and `memory`, so that none of them reaches into another for it.
//!
//! # Memory ordering
//! `released` and `aborted` are flags read and written `Relaxed`: each only turns a later call
//! into an error or skips a free, and publishes no data.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::error::{code_name, CudaError, Result};
use crate::loader::{Code, Context, CuDevice, DriverApi};

/// What the device, its images, regions and allocator share: the driver, the device and its
/// primary context, which every call binds to the calling thread first (the server thread and
/// the driver's callback thread have no current context of their own).
pub(crate) struct Core {
    pub(crate) driver: Arc<dyn DriverApi>,
    pub(crate) device: CuDevice,
    pub(crate) context: Context,
    /// Set when the primary context has been released: later calls fail with `Released`
    /// instead of naming a context that no longer exists.
    pub(crate) released: AtomicBool,
    /// Set by `abort_launches` (the primary context was reset): nothing waits for the
    /// device's work any more, and what the reset destroyed is not freed again.
    pub(crate) aborted: AtomicBool,
}

impl Core {
    pub(crate) fn driver(&self) -> &dyn DriverApi {
        &*self.driver
    }

    /// Makes the device's context current on this thread.
    pub(crate) fn bind(&self) -> Result<()> {
        // Relaxed: the flag only turns a late call into an error; it publishes no data.
        if self.released.load(Ordering::Relaxed) {
            return Err(CudaError::Released);
        }
        self.driver
            .ctx_set_current(self.context)
            .map_err(|code| self.fail("cuCtxSetCurrent", code))
    }

    /// The error for `call` returning `code`.
    pub(crate) fn fail(&self, call: &'static str, code: Code) -> CudaError {
        driver_error(&*self.driver, call, code)
    }
}

/// The error for `call` returning `code`, named by the driver or by the built-in table.
pub(crate) fn driver_error(driver: &dyn DriverApi, call: &'static str, code: Code) -> CudaError {
    let name = driver.error_name(code).unwrap_or_else(|| code_name(code));
    CudaError::Driver { call, code, name }
}

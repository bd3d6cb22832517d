//! The crate's one error type (STYLE 12) and the names of the driver's status codes.

/// What can go wrong in the CUDA plugin.
#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    /// The driver library or one of its functions could not be loaded; the plugin has zero
    /// devices. The string says why (`libcuda.so.1 not found`, `missing symbol cuLaunchHostFunc`).
    #[error("no CUDA driver: {0}")]
    NoDriver(String),
    /// A driver call returned a status other than `CUDA_SUCCESS`.
    #[error("{call} failed: {name} ({code})")]
    Driver {
        /// The driver function, e.g. `cuMemAlloc_v2`.
        call: &'static str,
        /// The `CUresult` the driver returned.
        code: i32,
        /// Its name, from `cuGetErrorName` or [`code_name`].
        name: String,
    },
    /// The driver could not load an image (`cuModuleLoadDataEx`); `log` is what its JIT
    /// compiler or cubin loader wrote to `CU_JIT_ERROR_LOG_BUFFER` (empty where it said
    /// nothing).
    #[error("cuModuleLoadDataEx failed: {name} ({code}){}", jit_log(.log))]
    Load {
        /// The `CUresult` the driver returned.
        code: i32,
        /// Its name, from `cuGetErrorName` or [`code_name`].
        name: String,
        /// The error log the driver wrote (empty where it wrote none).
        log: String,
    },
    /// The caller passed something the driver cannot be asked to do.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// Memory the driver handed out does not have the alignment the protocol needs.
    #[error("{what} at {addr:#x} is not {align}-byte aligned")]
    Misaligned {
        /// Which memory (e.g. "pinned host memory").
        what: &'static str,
        /// The address the driver returned.
        addr: u64,
        /// The alignment needed, in bytes.
        align: u64,
    },
    /// The device (and so its allocator) has been released by `deinit`.
    #[error("the CUDA device has been released")]
    Released,
    /// The device's launches were aborted (its primary context reset) by `deinit`.
    #[error("the device's launches were aborted (its context was reset)")]
    Aborted,
}

impl CudaError {
    /// The driver's status code, for a [`CudaError::Driver`] or [`CudaError::Load`].
    pub fn code(&self) -> Option<i32> {
        match self {
            CudaError::Driver { code, .. } | CudaError::Load { code, .. } => Some(*code),
            _ => None,
        }
    }
}

/// The JIT's error log as the end of a message.
fn jit_log(log: &str) -> String {
    if log.is_empty() {
        String::new()
    } else {
        format!("; the JIT's error log: {log}")
    }
}

/// The crate's result type.
pub type Result<T, E = CudaError> = std::result::Result<T, E>;

/// `CUDA_SUCCESS`.
pub const SUCCESS: i32 = 0;
/// `CUDA_ERROR_NOT_FOUND`: a named symbol or function is not in the module.
pub const ERROR_NOT_FOUND: i32 = 500;

/// Names of the status codes this plugin is likely to see, for when `cuGetErrorName` itself
/// fails (an unknown code, or a driver too broken to answer). Values from the driver API's
/// `cudaError_enum`, which is append-only.
const NAMES: &[(i32, &str)] = &[
    (0, "CUDA_SUCCESS"),
    (1, "CUDA_ERROR_INVALID_VALUE"),
    (2, "CUDA_ERROR_OUT_OF_MEMORY"),
    (3, "CUDA_ERROR_NOT_INITIALIZED"),
    (4, "CUDA_ERROR_DEINITIALIZED"),
    (34, "CUDA_ERROR_STUB_LIBRARY"),
    (100, "CUDA_ERROR_NO_DEVICE"),
    (101, "CUDA_ERROR_INVALID_DEVICE"),
    (200, "CUDA_ERROR_INVALID_IMAGE"),
    (201, "CUDA_ERROR_INVALID_CONTEXT"),
    (209, "CUDA_ERROR_NO_BINARY_FOR_GPU"),
    (218, "CUDA_ERROR_INVALID_PTX"),
    (222, "CUDA_ERROR_UNSUPPORTED_PTX_VERSION"),
    (300, "CUDA_ERROR_INVALID_SOURCE"),
    (400, "CUDA_ERROR_INVALID_HANDLE"),
    (500, "CUDA_ERROR_NOT_FOUND"),
    (600, "CUDA_ERROR_NOT_READY"),
    (700, "CUDA_ERROR_ILLEGAL_ADDRESS"),
    (701, "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES"),
    (702, "CUDA_ERROR_LAUNCH_TIMEOUT"),
    (710, "CUDA_ERROR_ASSERT"),
    (715, "CUDA_ERROR_ILLEGAL_INSTRUCTION"),
    (716, "CUDA_ERROR_MISALIGNED_ADDRESS"),
    (719, "CUDA_ERROR_LAUNCH_FAILED"),
    (801, "CUDA_ERROR_NOT_SUPPORTED"),
    (999, "CUDA_ERROR_UNKNOWN"),
];

/// The name of status `code` from the built-in table, or `CUDA_ERROR_<code>` for one it lacks.
pub fn code_name(code: i32) -> String {
    match NAMES.iter().find(|&&(c, _)| c == code) {
        Some(&(_, name)) => name.to_owned(),
        None => format!("CUDA_ERROR_{code}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn code_names_come_from_the_table_or_fall_back_to_the_number() {
        assert_eq!(code_name(2), "CUDA_ERROR_OUT_OF_MEMORY");
        assert_eq!(code_name(719), "CUDA_ERROR_LAUNCH_FAILED");
        assert_eq!(code_name(12345), "CUDA_ERROR_12345");
    }

    #[test]
    fn the_name_table_is_sorted_and_has_no_duplicate_codes() {
        assert!(NAMES.windows(2).all(|w| w[0].0 < w[1].0));
    }

    #[test]
    fn driver_errors_show_call_name_and_code() {
        let e = CudaError::Driver {
            call: "cuMemAlloc_v2",
            code: 2,
            name: code_name(2),
        };
        assert_eq!(
            e.to_string(),
            "cuMemAlloc_v2 failed: CUDA_ERROR_OUT_OF_MEMORY (2)"
        );
        assert_eq!(e.code(), Some(2));
    }
}

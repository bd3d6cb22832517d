//! The crate's one error type (STYLE 12) and the names of HSA status codes.

/// `hsa_status_t`.
pub type Status = u32;

/// What can go wrong talking to the HSA runtime.
#[derive(Debug, thiserror::Error)]
pub enum AmdGpuError {
    /// The runtime could not be used at all: the library or one of its symbols is missing, or
    /// `hsa_init` failed (no `/dev/kfd`, no GPU). The plugin reports zero devices with this reason.
    #[error("no HSA runtime: {0}")]
    NoRuntime(String),
    /// An HSA call returned an error status.
    #[error("{call} failed: {name} (0x{code:x}){}", detail_suffix(.detail))]
    Status {
        /// The HSA function that failed.
        call: &'static str,
        /// The raw `hsa_status_t`.
        code: u32,
        /// The code's name from [`status_name`].
        name: &'static str,
        /// The runtime's own text (`hsa_status_string`), when it had one.
        detail: Option<String>,
    },
    /// An image has no symbol of that name (or it is not of the expected kind).
    #[error("no {kind} symbol `{name}` in the image")]
    NoSymbol {
        /// The kind looked for (e.g. "kernel").
        kind: &'static str,
        /// The symbol's name as looked up (a kernel's descriptor, `NAME.kd`).
        name: String,
    },
    /// The argument block does not match the kernel's kernarg segment.
    #[error("kernel `{kernel}` takes {expected} bytes of arguments, {given} given")]
    BadArguments {
        /// The kernel's name.
        kernel: String,
        /// The kernel's kernarg segment size in bytes, the most it takes.
        expected: u32,
        /// The length of the argument block the caller passed.
        given: usize,
    },
    /// A launch whose dimensions AQL cannot express (work-group size over 65535 per dimension,
    /// grid over 2^32 - 1 work-items per dimension, or a zero dimension).
    #[error("launch dimensions out of range: {0}")]
    BadGrid(&'static str),
    /// The agent lacks a memory pool this plugin needs.
    #[error("agent {agent} has no {what} memory pool")]
    NoPool {
        /// The agent's name (`HSA_AGENT_INFO_NAME`, e.g. `gfx942`; `CPU` for the host's).
        agent: String,
        /// The pool looked for (e.g. "coarse-grained").
        what: &'static str,
    },
    /// A kernel or the queue reported an error (memory fault, illegal instruction, ...).
    #[error("kernel failed on {device}: {reason}")]
    KernelFailed {
        /// The device's name.
        device: String,
        /// The first launch failure since the last `synchronize` (a memory fault, a dead queue).
        reason: String,
    },
    /// The device (and so its allocator) has been released.
    #[error("the AMD GPU device has been released")]
    Released,
    /// An interrupt signal without an event mailbox: the runtime does not deliver interrupts
    /// (e.g. `HSA_ENABLE_INTERRUPT=0`), so no doorbell; the server polls.
    #[error("the HSA runtime gave a signal without an event mailbox (interrupts disabled?)")]
    NoInterrupts,
    /// Anything else that is a bug in the caller (named in the text).
    #[error("{0}")]
    Invalid(&'static str),
}

fn detail_suffix(detail: &Option<String>) -> String {
    match detail {
        Some(text) if !text.is_empty() => format!(": {text}"),
        _ => String::new(),
    }
}

/// The `HSA_STATUS_*` name of `code` (hsa.h, hsa_ext_amd.h); `"HSA_STATUS_UNKNOWN"` otherwise.
pub fn status_name(code: Status) -> &'static str {
    match code {
        0x0 => "HSA_STATUS_SUCCESS",
        0x1 => "HSA_STATUS_INFO_BREAK",
        0x1000 => "HSA_STATUS_ERROR",
        0x1001 => "HSA_STATUS_ERROR_INVALID_ARGUMENT",
        0x1002 => "HSA_STATUS_ERROR_INVALID_QUEUE_CREATION",
        0x1003 => "HSA_STATUS_ERROR_INVALID_ALLOCATION",
        0x1004 => "HSA_STATUS_ERROR_INVALID_AGENT",
        0x1005 => "HSA_STATUS_ERROR_INVALID_REGION",
        0x1006 => "HSA_STATUS_ERROR_INVALID_SIGNAL",
        0x1007 => "HSA_STATUS_ERROR_INVALID_QUEUE",
        0x1008 => "HSA_STATUS_ERROR_OUT_OF_RESOURCES",
        0x1009 => "HSA_STATUS_ERROR_INVALID_PACKET_FORMAT",
        0x100A => "HSA_STATUS_ERROR_RESOURCE_FREE",
        0x100B => "HSA_STATUS_ERROR_NOT_INITIALIZED",
        0x100C => "HSA_STATUS_ERROR_REFCOUNT_OVERFLOW",
        0x100D => "HSA_STATUS_ERROR_INCOMPATIBLE_ARGUMENTS",
        0x100E => "HSA_STATUS_ERROR_INVALID_INDEX",
        0x100F => "HSA_STATUS_ERROR_INVALID_ISA",
        0x1010 => "HSA_STATUS_ERROR_INVALID_CODE_OBJECT",
        0x1011 => "HSA_STATUS_ERROR_INVALID_EXECUTABLE",
        0x1012 => "HSA_STATUS_ERROR_FROZEN_EXECUTABLE",
        0x1013 => "HSA_STATUS_ERROR_INVALID_SYMBOL_NAME",
        0x1014 => "HSA_STATUS_ERROR_VARIABLE_ALREADY_DEFINED",
        0x1015 => "HSA_STATUS_ERROR_VARIABLE_UNDEFINED",
        0x1016 => "HSA_STATUS_ERROR_EXCEPTION",
        0x1017 => "HSA_STATUS_ERROR_INVALID_ISA_NAME",
        0x1018 => "HSA_STATUS_ERROR_INVALID_CODE_SYMBOL",
        0x1019 => "HSA_STATUS_ERROR_INVALID_EXECUTABLE_SYMBOL",
        0x1020 => "HSA_STATUS_ERROR_INVALID_FILE",
        0x1021 => "HSA_STATUS_ERROR_INVALID_CODE_OBJECT_READER",
        0x1022 => "HSA_STATUS_ERROR_INVALID_CACHE",
        0x1023 => "HSA_STATUS_ERROR_INVALID_WAVEFRONT",
        0x1024 => "HSA_STATUS_ERROR_INVALID_SIGNAL_GROUP",
        0x1025 => "HSA_STATUS_ERROR_INVALID_RUNTIME_STATE",
        0x1026 => "HSA_STATUS_ERROR_FATAL",
        // hsa_ext_amd.h: decimal values, not 0x10xx.
        40 => "HSA_STATUS_ERROR_INVALID_MEMORY_POOL",
        41 => "HSA_STATUS_ERROR_MEMORY_APERTURE_VIOLATION",
        42 => "HSA_STATUS_ERROR_ILLEGAL_INSTRUCTION",
        43 => "HSA_STATUS_ERROR_MEMORY_FAULT",
        44 => "HSA_STATUS_CU_MASK_REDUCED",
        45 => "HSA_STATUS_ERROR_OUT_OF_REGISTERS",
        46 => "HSA_STATUS_ERROR_RESOURCE_BUSY",
        47 => "HSA_STATUS_ERROR_NOT_SUPPORTED",
        _ => "HSA_STATUS_UNKNOWN",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_names_match_hsa_h_values() {
        assert_eq!(status_name(0), "HSA_STATUS_SUCCESS");
        assert_eq!(status_name(1), "HSA_STATUS_INFO_BREAK");
        assert_eq!(status_name(0x1000), "HSA_STATUS_ERROR");
        assert_eq!(status_name(0x1008), "HSA_STATUS_ERROR_OUT_OF_RESOURCES");
        assert_eq!(status_name(0x100B), "HSA_STATUS_ERROR_NOT_INITIALIZED");
        // 0x1017 is out of numeric order in hsa.h: ISA_NAME was appended later.
        assert_eq!(status_name(0x1017), "HSA_STATUS_ERROR_INVALID_ISA_NAME");
        assert_eq!(status_name(0x1026), "HSA_STATUS_ERROR_FATAL");
        assert_eq!(status_name(43), "HSA_STATUS_ERROR_MEMORY_FAULT");
        assert_eq!(status_name(0xdead), "HSA_STATUS_UNKNOWN");
    }

    #[test]
    fn every_known_code_has_a_distinct_name() {
        let codes: Vec<u32> = (0..2)
            .chain(0x1000..=0x1026)
            .chain(40..=47)
            .filter(|&c| status_name(c) != "HSA_STATUS_UNKNOWN")
            .collect();
        let mut names: Vec<&str> = codes.iter().map(|&c| status_name(c)).collect();
        // 0 and 1, 0x1000..=0x1019, 0x1020..=0x1026 (0x101A..=0x101F are unused), AMD 40..=47.
        assert_eq!(codes.len(), 2 + 26 + 7 + 8);
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), codes.len());
    }

    #[test]
    fn status_error_display_names_call_and_code() {
        let e = AmdGpuError::Status {
            call: "hsa_init",
            code: 0x1008,
            name: status_name(0x1008),
            detail: None,
        };
        assert_eq!(
            e.to_string(),
            "hsa_init failed: HSA_STATUS_ERROR_OUT_OF_RESOURCES (0x1008)"
        );
    }
}

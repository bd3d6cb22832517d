//! The crate's one error type.

use crate::protocol::layout::Generation;
use crate::protocol::opcode::Opcode;

/// Everything in `rpc-core` that can fail says so with one of these.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Lane size other than 1, 32 or 64.
    #[error("lane size {0} is not 1, 32 or 64")]
    BadLaneSize(u32),
    /// Port count outside `1..=MAX_PORT_COUNT` of the generation.
    #[error("port count {ports} is outside 1..={max} for layout {generation}")]
    BadPortCount {
        /// The port count asked for.
        ports: u32,
        /// The generation's most ports.
        max: u32,
        /// The generation asked for.
        generation: Generation,
    },
    /// A client object size of no known generation: not 552 (v1) or 2096 (v2), or behind LLVM
    /// 18/19's pointer not 96 (v0) or 552 (v1); 0 when the plugin cannot say.
    #[error(
        "unknown RPC generation: a client object of {0} bytes (known: `__llvm_rpc_client` of 552 \
         bytes, LLVM 20-22, or 2096 bytes, LLVM 23+; `__llvm_libc_rpc_client`, an 8-byte \
         pointer to an object of 96 bytes, LLVM 18, or 552 bytes, LLVM 19; 0: the size of the \
         object it points to could not be read)"
    )]
    BadClientObjectSize(usize),
    /// Mailbox memory that is not 64-byte aligned or has the wrong size.
    #[error(
        "mailbox memory at {addr:#x} ({len} bytes) is not a 64-byte-aligned region of {need} bytes"
    )]
    BadRegion {
        /// The region's host address.
        addr: usize,
        /// Its length in bytes.
        len: usize,
        /// The bytes the layout needs.
        need: usize,
    },
    /// An unknown layout generation name.
    #[error("unknown layout generation {0:?} (expected v1 or v2)")]
    BadGeneration(RefusalText),
    /// A header lane mask that is empty or has bits at or above the lane size.
    #[error("lane mask {mask:#x} is empty or has bits at or above the lane size {lanes}")]
    BadMask {
        /// The mask.
        mask: u64,
        /// The lane size.
        lanes: u32,
    },
    /// A lane claimed a stream longer than the bound.
    #[error("lane {lane} sent a length of {len} bytes, above the bound of {bound}")]
    TooLong {
        /// The lane.
        lane: u32,
        /// The length it claimed.
        len: u64,
        /// The bound.
        bound: u64,
    },
    /// A request's streams claimed more bytes, all lanes together, than it has left.
    #[error("the request's streams claim {len} bytes, above its remaining {bound}")]
    RequestTooLong {
        /// The bytes claimed.
        len: u64,
        /// What the request has left.
        bound: u64,
    },
    /// Fixed-size data whose length differs between lanes or from the expected size.
    #[error("lane {lane} has {len} bytes where {expected} were expected")]
    BadLength {
        /// The lane.
        lane: u32,
        /// The bytes it has.
        len: usize,
        /// The bytes expected.
        expected: usize,
    },
    /// The other side stopped answering and the wait was abandoned.
    #[error("wait abandoned on port {port}: {reason}")]
    Abandoned {
        /// The port.
        port: u32,
        /// Why.
        reason: &'static str,
    },
    /// A synchronous operation on a resumable port found the buffer not ours yet: a handler
    /// that waits for a client's next packet must be an async one (`RpcServer::register`).
    #[error("port {port}: the client has not answered yet; a plain handler cannot wait (register an async one)")]
    WouldBlock {
        /// The port.
        port: u32,
    },
    /// A handler panicked (the panic's message).
    #[error("the handler panicked: {0}")]
    Panicked(RefusalText),
    /// No handler accepted the opcode.
    #[error("no handler for opcode {0}")]
    UnknownOpcode(Opcode),
    /// `shutdown` found kernels still holding user guards and the policy refused.
    #[error("{0} user guard(s) still live: kernels are running")]
    LiveUsers(usize),
    /// No attached mailbox has this id.
    #[error("no mailbox {0} is attached")]
    NoSuchMailbox(u64),
    /// The worker thread could not be spawned.
    #[error("could not spawn the server thread: {0}")]
    Spawn(RefusalText),
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
    NotFound(RefusalText),
    /// `deinit` found kernels still running after its wait; they were aborted (named here).
    #[error("kernels still running at deinit were aborted: {0}")]
    KernelsAborted(RefusalText),
    /// The server of a runtime that was deinitialised: it cannot start again.
    #[error("the runtime was deinitialised: its server cannot start again")]
    Deinitialised,
    /// A kernel ended through EXIT or ABORT under the record policy.
    #[error("a kernel ended the program: {0}")]
    KernelExited(RefusalText),
    /// A request the server refused (bad handle, policy, ...).
    #[error("request refused: {0}")]
    Refused(RefusalText),
}

/// The text of a refusal. A `String` with `std`, a static text without.
#[cfg(feature = "std")]
pub(crate) type RefusalText = std::string::String;
/// The text of a refusal. A `String` with `std`, a static text without.
#[cfg(not(feature = "std"))]
pub(crate) type RefusalText = &'static str;

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = core::result::Result<T, E>;

#[cfg(feature = "std")]
/// A vendor error, kept whole as the source of the glue's errors.
pub type VendorError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// The vendor's error inside [`Error::Vendor`]: the plugin's own error value (its type, its
/// text, its own `source()` chain), shared so that [`Error`] stays `Clone`. It reads as the
/// vendor's error and its `source()` is the vendor error's; [`VendorSource::get`] gives the
/// error itself, to downcast to the plugin's type. Two are equal when they are the same error
/// or read the same.
#[derive(Clone)]
pub struct VendorSource(
    #[cfg(feature = "std")] std::sync::Arc<dyn std::error::Error + Send + Sync + 'static>,
    #[cfg(not(feature = "std"))] &'static str,
);

#[cfg(feature = "std")]
impl VendorSource {
    /// The vendor's error itself (`downcast_ref` to the plugin's error type).
    pub fn get(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
        &*self.0
    }
}

#[cfg(feature = "std")]
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

impl core::error::Error for VendorSource {
    #[cfg(feature = "std")]
    fn source(&self) -> Option<&(dyn core::error::Error + 'static)> {
        self.0.source()
    }
}

impl PartialEq for VendorSource {
    fn eq(&self, other: &Self) -> bool {
        #[cfg(feature = "std")]
        {
            std::sync::Arc::ptr_eq(&self.0, &other.0) || self.0.to_string() == other.0.to_string()
        }
        #[cfg(not(feature = "std"))]
        {
            self.0 == other.0
        }
    }
}

impl Eq for VendorSource {}

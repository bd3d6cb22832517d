//! The protocol layer's error: what the layouts, the mailbox views and the ports of either
//! side refuse or give up on.

use crate::protocol::layout::Generation;

/// A failure of the protocol itself: a layout or region that cannot be, a lane mask or a
/// length a peer sent that breaks the rules, a wait that gave up. The server's errors
/// ([`ServerError`](crate::ServerError)) carry it whole, and so does the embedder's
/// [`Error`](crate::Error).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
// An 8-byte tag, so that every variant's fields start at offset 8. With a one-byte tag a
// `Generation` sat at offset 1, and every `Result` carrying this error (a `ServerError` holds
// one: every service's step returns one) was moved as the 31 bytes after its tag, in two
// overlapping 16-byte moves. The store buffer cannot forward such a load, so each waited for
// the exchange's stores to shared memory to leave it (see `protocol::deferred`): 4-7% of the
// pipelined printf row in A/B runs.
#[repr(u64)]
pub enum ProtocolError {
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
    #[error("unknown layout generation {0:?} (expected v0, v1 or v2)")]
    BadGeneration(RefusalText),
    /// A header lane mask that is empty or has bits at or above the lane size.
    #[error("lane mask {mask:#x} is empty or has bits at or above the lane size {lanes}")]
    BadMask {
        /// The mask.
        mask: u64,
        /// The lane size.
        lanes: u32,
    },
    /// A lane claimed a byte string (`send_n`) longer than the bound.
    #[error("lane {lane} sent a length of {len} bytes, above the bound of {bound}")]
    TooLong {
        /// The lane.
        lane: u32,
        /// The length it claimed.
        len: u64,
        /// The bound.
        bound: u64,
    },
    /// A request's byte strings claimed more bytes, all lanes together, than it has left.
    #[error("the request's byte strings claim {len} bytes, above its remaining {bound}")]
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
}

/// The text of a refusal. A `String` with `std`, a static text without.
#[cfg(feature = "std")]
pub(crate) type RefusalText = std::string::String;
/// The text of a refusal. A `String` with `std`, a static text without.
#[cfg(not(feature = "std"))]
pub(crate) type RefusalText = &'static str;

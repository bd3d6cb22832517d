//! The server layer's error: what the server, its handlers and the standard services fail
//! with, a protocol failure among them.

use std::string::String;

use crate::protocol::error::ProtocolError;
use crate::protocol::Opcode;

/// A vendor hook's error, boxed: what the traits a plugin implements return (the services'
/// `DeviceAllocator`, the plugin layer's `Plugin` and `Device`), kept whole by the plugin
/// layer as the `source()` of its `PluginError::Vendor`. Defined here, the lowest layer that
/// calls a vendor's hook, so that no layer names the crate root's types.
pub type VendorError = std::boxed::Box<dyn std::error::Error + Send + Sync + 'static>;

/// A failure of the server (starting, stopping, attaching, detaching) or of one request it
/// serves (a handler's refusal or panic). A protocol failure under it is kept whole as
/// [`ServerError::Protocol`]; the embedder's [`Error`](crate::Error) holds that one as its
/// own [`Error::Protocol`](crate::Error::Protocol).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ServerError {
    /// The protocol failed under the server (a bad region, a bad lane mask, a byte string above
    /// its bound, a wait given up).
    #[error(transparent)]
    Protocol(#[from] ProtocolError),
    /// A handler panicked (the panic's message).
    #[error("the handler panicked: {0}")]
    Panicked(String),
    /// No handler accepted the opcode.
    #[error("no handler for opcode {0}")]
    UnknownOpcode(Opcode),
    /// `shutdown` found kernels still holding user guards and the policy refused.
    #[error("{0} user guard(s) still live: kernels are running")]
    LiveUsers(usize),
    /// No attached mailbox has this id.
    #[error("no mailbox {0} is attached")]
    NoSuchMailbox(u64),
    /// A thread of the server (the worker, an I/O thread) could not be spawned.
    #[error("could not spawn the server thread: {0}")]
    Spawn(String),
    /// The server of a runtime that was deinitialised: it cannot start again.
    #[error("the runtime was deinitialised: its server cannot start again")]
    Deinitialised,
    /// A call refused: a start or shutdown from the server's own worker thread, or an
    /// embedder's refusal. (A request a handler refused, its script complete, is no error:
    /// [`Outcome::Refused`].)
    #[error("request refused: {0}")]
    Refused(String),
    /// A handler that must own its opcode alone (a typed one) found it taken: by a user
    /// handler already registered, or by the standard services' classes.
    #[error("opcode {opcode} is taken by {owner}")]
    OpcodeTaken {
        /// The opcode.
        opcode: Opcode,
        /// Who holds it.
        owner: String,
    },
}

/// How a handler's request ended when it did not fail: served, or refused with its script
/// complete (a bad handle, a policy: the device got its error values, the host a log line).
/// Both are counted as served; a refusal is also counted as one (`StatsSnapshot::refused`).
/// A handler returns `Result<Outcome, ServerError>`, its failures the error; one returning
/// `Result<(), ServerError>` serves (`Outcome::from(())`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The request was served.
    Served,
    /// The request was refused, why.
    Refused(String),
}

impl From<()> for Outcome {
    fn from((): ()) -> Self {
        Outcome::Served
    }
}

//! The embedder's one error: each layer's error as a variant of its own.

#[cfg(feature = "std")]
use crate::plugin::error::PluginError;
use crate::protocol::error::ProtocolError;
#[cfg(feature = "std")]
use crate::server::error::ServerError;

/// What the front door's functions (the runtime, the server, a client's `?`) fail with: one
/// layer's error, whole, reading as that error. A failure of the protocol is always
/// [`Error::Protocol`], also when it came up through the server (`From<ServerError>` lifts
/// [`ServerError::Protocol`] out), so each failure matches one pattern.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The protocol layer's: a layout, region, lane mask or length it refused, a wait that
    /// gave up.
    #[error(transparent)]
    Protocol(ProtocolError),
    /// The server layer's: starting, stopping, attaching, a handler's refusal or panic.
    #[cfg(feature = "std")]
    #[error(transparent)]
    Server(ServerError),
    /// The plugin layer's: the vendor's error (its `source()`), an unknown device, image or
    /// kernel, kernels aborted or ended the program.
    #[cfg(feature = "std")]
    #[error(transparent)]
    Plugin(PluginError),
}

/// `Result` with the embedder's [`Error`]; each layer names its own error as `E`.
pub type Result<T, E = Error> = core::result::Result<T, E>;

impl From<ProtocolError> for Error {
    fn from(error: ProtocolError) -> Self {
        Error::Protocol(error)
    }
}

#[cfg(feature = "std")]
impl From<ServerError> for Error {
    fn from(error: ServerError) -> Self {
        match error {
            ServerError::Protocol(error) => Error::Protocol(error),
            error => Error::Server(error),
        }
    }
}

#[cfg(feature = "std")]
impl From<PluginError> for Error {
    fn from(error: PluginError) -> Self {
        Error::Plugin(error)
    }
}

#[cfg(all(test, feature = "std"))]
mod tests {
    use std::string::ToString;

    use super::*;

    #[test]
    fn a_protocol_failure_is_error_protocol_whichever_layer_it_came_up_through() {
        let failure = ProtocolError::BadMask { mask: 0, lanes: 32 };
        let through_server = ServerError::from(failure.clone());
        assert_eq!(
            Error::from(through_server),
            Error::Protocol(failure.clone())
        );
        assert_eq!(Error::from(failure.clone()), Error::Protocol(failure));
    }

    #[test]
    fn each_layers_error_reads_the_same_through_the_embedders() {
        let server = ServerError::LiveUsers(2);
        let error = Error::from(server.clone());
        assert_eq!(error, Error::Server(server));
        assert_eq!(
            error.to_string(),
            "2 user guard(s) still live: kernels are running"
        );
        let protocol = ServerError::from(ProtocolError::BadLaneSize(16));
        assert_eq!(protocol.to_string(), "lane size 16 is not 1, 32 or 64");
        assert_eq!(
            Error::from(protocol).to_string(),
            "lane size 16 is not 1, 32 or 64"
        );
        let plugin = Error::from(PluginError::NotFound("no image 3".into()));
        assert_eq!(plugin.to_string(), "no image 3");
    }

    #[test]
    fn question_mark_lifts_each_layers_error() {
        fn protocol() -> Result<(), ProtocolError> {
            Err(ProtocolError::BadLaneSize(3))
        }
        fn server() -> Result<(), ServerError> {
            protocol()?;
            Ok(())
        }
        fn embedder() -> Result<()> {
            server()?;
            Ok(())
        }
        assert_eq!(
            embedder(),
            Err(Error::Protocol(ProtocolError::BadLaneSize(3)))
        );
    }
}

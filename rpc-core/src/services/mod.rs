//! The standard services: the handlers every server registers after the user's (PROTOCOL
//! section 6), and the host-side state they share.

use crate::registry::{entry, Matcher, Registry, Request};
use crate::rpc_server::ServerConfig;
use crate::{Opcode, Result};

mod test_ops;

/// Host-side state of the standard services of one server.
pub struct Services {}

impl Services {
    pub(crate) fn new(_config: &ServerConfig) -> Self {
        Services {}
    }
}

/// Registers the standard handlers, in lookup order after the user's.
pub(crate) fn register_standard(registry: &mut Registry) {
    let mut add = |op: Opcode, handler: fn(&mut Request<'_, '_>) -> Result<()>| {
        registry.push_standard(entry(
            op.name().unwrap_or("?"),
            Matcher::Opcode(op),
            handler,
        ));
    };
    add(Opcode::NOOP, test_ops::noop);
    add(Opcode::TEST_INCREMENT, test_ops::increment);
    add(Opcode::TEST_INTERFACE, test_ops::interface);
    add(Opcode::TEST_STREAM, test_ops::stream);
}

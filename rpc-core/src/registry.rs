//! The handler registry: an ordered list of handlers, user handlers first, then the standard
//! services. The first handler whose matcher accepts a request's opcode serves it; a handler
//! declines simply by not matching (it cannot decline after touching the port, since the script
//! would already have moved on).

use std::boxed::Box;
use std::string::String;
use std::sync::Arc;
use std::vec::Vec;

use crate::error::Result;
use crate::layout::Layout;
use crate::opcode::Opcode;
use crate::rpc_server::{MailboxId, ServerContext};
use crate::ServerPort;

/// What a handler runs: the request's script, over its port.
pub type HandlerFn = dyn Fn(&mut Request<'_, '_>) -> Result<()> + Send + Sync;

/// Which opcodes a handler accepts.
#[derive(Clone)]
pub enum Matcher {
    Opcode(Opcode),
    Predicate(Arc<dyn Fn(Opcode) -> bool + Send + Sync>),
}

impl Matcher {
    fn accepts(&self, opcode: Opcode) -> bool {
        match self {
            Matcher::Opcode(op) => *op == opcode,
            Matcher::Predicate(accepts) => accepts(opcode),
        }
    }
}

/// One registered handler.
#[derive(Clone)]
pub struct Entry {
    pub(crate) name: String,
    pub(crate) matcher: Matcher,
    pub(crate) handler: Arc<HandlerFn>,
}

/// The ordered handlers of one server.
#[derive(Clone, Default)]
pub struct Registry {
    user: Vec<Entry>,
    standard: Vec<Entry>,
    /// For each opcode of the table (by [`Opcode::table_index`]), the first standard entry
    /// registered for exactly that opcode: the lookup of a standard opcode is one index.
    standard_by_table: Vec<Option<usize>>,
    /// Whether any standard entry matches by predicate (then the order must be searched).
    standard_predicates: bool,
}

impl Registry {
    pub(crate) fn push_user(&mut self, entry: Entry) {
        self.user.push(entry);
    }
    pub(crate) fn push_standard(&mut self, entry: Entry) {
        match entry.matcher {
            Matcher::Opcode(op) => {
                if let Some(i) = op.table_index() {
                    self.standard_by_table.resize(Opcode::ALL.len(), None);
                    self.standard_by_table[i].get_or_insert(self.standard.len());
                }
            }
            Matcher::Predicate(_) => self.standard_predicates = true,
        }
        self.standard.push(entry);
    }
    /// The first handler accepting `opcode`: user handlers in registration order, then the
    /// standard ones.
    pub(crate) fn find(&self, opcode: Opcode) -> Option<&Entry> {
        if let Some(entry) = self.user.iter().find(|e| e.matcher.accepts(opcode)) {
            return Some(entry);
        }
        let indexed = opcode
            .table_index()
            .and_then(|i| *self.standard_by_table.get(i)?);
        if !self.standard_predicates {
            return indexed.map(|i| &self.standard[i]);
        }
        // In registration order, an entry before the indexed one may accept it first.
        let before = indexed.unwrap_or(self.standard.len());
        let earlier = self.standard[..before]
            .iter()
            .find(|e| e.matcher.accepts(opcode));
        earlier.or_else(|| indexed.map(|i| &self.standard[i]))
    }
    /// Names of the handlers, in lookup order.
    pub fn names(&self) -> Vec<&str> {
        self.user
            .iter()
            .chain(&self.standard)
            .map(|e| e.name.as_str())
            .collect()
    }
}

/// Builds an entry from a closure.
pub(crate) fn entry(
    name: impl Into<String>,
    matcher: Matcher,
    handler: impl Fn(&mut Request<'_, '_>) -> Result<()> + Send + Sync + 'static,
) -> Entry {
    Entry {
        name: name.into(),
        matcher,
        handler: Arc::new(handler),
    }
}

/// Which mailbox a request came from.
#[derive(Clone, Copy, Debug)]
pub struct MailboxInfo {
    pub id: MailboxId,
    pub layout: Layout,
}

/// One request being served: its port (the request derefs to it), where it came from, and the
/// server's shared services.
pub struct Request<'r, 'a> {
    pub(crate) port: &'r mut ServerPort<'a>,
    pub(crate) mailbox: MailboxInfo,
    pub(crate) context: &'r ServerContext,
}

impl<'a> Request<'_, 'a> {
    pub fn mailbox(&self) -> MailboxInfo {
        self.mailbox
    }
    pub fn context(&self) -> &ServerContext {
        self.context
    }
    /// `recv_n` bounded by the server's configured stream bound.
    pub fn recv_n(&mut self) -> Result<Vec<Vec<u8>>> {
        let bound = self.context.config.stream_bound;
        self.port.recv_n(bound)
    }
}

impl<'a> core::ops::Deref for Request<'_, 'a> {
    type Target = ServerPort<'a>;
    fn deref(&self) -> &Self::Target {
        self.port
    }
}

impl core::ops::DerefMut for Request<'_, '_> {
    fn deref_mut(&mut self) -> &mut Self::Target {
        self.port
    }
}

/// A boxed handler, for APIs that take one.
pub type BoxedHandler = Box<HandlerFn>;

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    fn named(name: &str, matcher: Matcher) -> Entry {
        entry(name, matcher, |_| Ok(()))
    }

    #[test]
    fn user_handlers_come_first_then_standard_in_order() {
        let mut registry = Registry::default();
        crate::services::register_standard(&mut registry);
        let found = |r: &Registry, op| r.find(op).map(|e| e.name.clone());
        assert_eq!(
            found(&registry, Opcode::TEST_INCREMENT).as_deref(),
            Some("TEST_INCREMENT")
        );
        assert_eq!(found(&registry, Opcode::user(1)), None);
        // A user handler overrides a standard opcode; a predicate catches a whole class.
        registry.push_user(named("mine", Matcher::Opcode(Opcode::TEST_INCREMENT)));
        registry.push_user(named(
            "class u",
            Matcher::Predicate(Arc::new(|op: Opcode| op.class() == b'u')),
        ));
        assert_eq!(
            found(&registry, Opcode::TEST_INCREMENT).as_deref(),
            Some("mine")
        );
        assert_eq!(
            found(&registry, Opcode::user(9)).as_deref(),
            Some("class u")
        );
        // A standard predicate registered before an indexed entry wins, as the order says.
        let mut registry = Registry::default();
        registry.push_standard(named("any", Matcher::Predicate(Arc::new(|_| true))));
        registry.push_standard(named("noop", Matcher::Opcode(Opcode::NOOP)));
        assert_eq!(found(&registry, Opcode::NOOP).as_deref(), Some("any"));
        assert_eq!(registry.names(), ["any", "noop"]);
    }
}

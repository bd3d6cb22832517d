//! The handler registry: an ordered list of handlers, user handlers first, then the standard
//! services. The first handler whose matcher accepts a request's opcode serves it; a handler
//! declines simply by not matching (it cannot decline after touching the port, since the script
//! would already have moved on).
//!
//! A handler is one of two kinds ([`Handler`]), user and standard alike:
//! - a **packet** handler, a plain closure for one-packet opcodes: it rewrites each lane's packet
//!   in place and the server sends it back (`C send; S recv; S send; C recv`). The client's packet
//!   is there when the port opens, so it runs to completion at once, on the server thread;
//! - a **script**, an `async` function of a [`Request`] (`request.rs`) for everything else.
//!   Each `.await` on a port operation suspends the exchange until the client has answered, and
//!   the server thread serves the other ports meanwhile (see [`crate::server::exec`]).

use std::future::Future;
use std::string::String;
use std::vec::Vec;

use crate::protocol::opcode::Opcode;
use crate::protocol::port::{Packet, PortPackets};
use crate::server::error::{Outcome, ServerError};
use crate::server::exec::{catch, Exchange};
use crate::server::limits::device_log;
use crate::server::stats::bump;
use crate::server::{Attached, ServerContext};
use crate::sync::Arc;
// Re-exported: the services name the request by this path too.
pub(crate) use crate::server::request::Request;

/// A packet handler as the server runs it: rewrites every active lane's packet of the port
/// just taken in place (it never waits: the client's packet is there when the port opens), and the
/// server sends them back once it has counted the request (`dispatch`'s `Inner::start`).
/// Built by [`Handler::packet`] from a per-lane closure, which is called directly (one dynamic
/// call per request, not per lane).
pub(crate) type PacketFn = dyn Fn(PortPackets<'_>) + Send + Sync;

/// A script handler: starts the exchange of one request.
pub(crate) type ScriptFn = dyn Fn(Request) -> Exchange + Send + Sync;

/// The two kinds of handler (see the module docs).
#[derive(Clone)]
pub(crate) enum Handler {
    /// One packet in, one packet out per lane, run at once.
    Packet(std::sync::Arc<PacketFn>),
    /// A multi-packet script, resumable.
    Script(std::sync::Arc<ScriptFn>),
}

impl Handler {
    /// A script handler from an async function or closure.
    /// Its script ends with an [`Outcome`], or with `()` for served.
    pub(crate) fn script<F, Fut, R>(script: F) -> Self
    where
        F: Fn(Request) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<R, ServerError>> + Send + 'static,
        R: Into<Outcome> + 'static,
    {
        Handler::Script(std::sync::Arc::new(move |request| {
            let script = script(request);
            Exchange::new(async move { script.await.map(Into::into) })
        }))
    }

    /// A packet handler from a closure that rewrites each active lane's packet in place.
    pub(crate) fn packet(reply: impl Fn(u32, Packet<'_>) + Send + Sync + 'static) -> Self {
        Handler::Packet(std::sync::Arc::new(move |packets: PortPackets<'_>| {
            packets.rewrite(&reply)
        }))
    }
}

/// Which opcodes a handler accepts.
#[derive(Clone)]
pub(crate) enum Matcher {
    Opcode(Opcode),
    Predicate(std::sync::Arc<dyn Fn(Opcode) -> bool + Send + Sync>),
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
pub(crate) struct Entry {
    pub(crate) name: String,
    pub(crate) matcher: Matcher,
    pub(crate) handler: Handler,
}

/// The ordered handlers of one server.
#[derive(Clone, Default)]
pub(crate) struct Registry {
    user: Vec<Entry>,
    standard: Vec<Entry>,
    /// For each opcode of the table (by [`Opcode::table_index`]), the handler
    /// [`Registry::find`] finds for it, made again at each push: while no entry matches by
    /// predicate, a request's lookup is one index ([`Registry::indexed`]).
    by_table: Vec<Option<Handler>>,
    /// For each opcode of the table, the first standard entry registered for exactly it.
    standard_by_table: Vec<Option<usize>>,
    /// Whether any user entry matches by predicate (then the user entries must be searched).
    user_predicates: bool,
    /// Whether any standard entry matches by predicate (then the order must be searched).
    standard_predicates: bool,
}

/// Notes entry `at` in `by_table` if it is the first registered for exactly its opcode of the
/// table; true if it matches by predicate instead.
fn index(by_table: &mut Vec<Option<usize>>, matcher: &Matcher, at: usize) -> bool {
    match matcher {
        Matcher::Opcode(op) => {
            if let Some(i) = op.table_index() {
                by_table.resize(Opcode::ALL.len(), None);
                by_table[i].get_or_insert(at);
            }
            false
        }
        Matcher::Predicate(_) => true,
    }
}

impl Registry {
    pub(crate) fn push_user(&mut self, entry: Entry) {
        self.user_predicates |= matches!(entry.matcher, Matcher::Predicate(_));
        self.user.push(entry);
        self.index_table();
    }
    /// Pushes a user entry that owns its one opcode alone, unless a user entry accepts it
    /// already (or it is one of the standard classes'). Returns the name of who holds it.
    pub(crate) fn push_owner(&mut self, opcode: Opcode, entry: Entry) -> Result<(), String> {
        if !opcode.is_user() {
            return Err("the standard services (classes 'c', 'o' and 0xFF)".into());
        }
        if let Some(owner) = self.user.iter().find(|e| e.matcher.accepts(opcode)) {
            return Err(format!("the handler {:?}", owner.name));
        }
        self.push_user(entry);
        Ok(())
    }
    pub(crate) fn push_standard(&mut self, entry: Entry) {
        let at = self.standard.len();
        self.standard_predicates |= index(&mut self.standard_by_table, &entry.matcher, at);
        self.standard.push(entry);
        self.index_table();
    }
    /// Makes `by_table` again (after a push). Once an entry matches by predicate the table is
    /// never read ([`Registry::indexed`]), and filling it would ask every predicate of every
    /// opcode here, on the registering thread, outside the catch a matcher's panic needs.
    fn index_table(&mut self) {
        if self.asks_predicates() {
            self.by_table = Vec::new();
            return;
        }
        let handlers = Opcode::ALL
            .iter()
            .map(|&op| Some(self.find(op)?.handler.clone()));
        self.by_table = handlers.collect();
    }
    /// Whether finding a handler may ask a predicate, which may panic (a user's matcher).
    /// Without one, [`Registry::find`] compares opcodes only.
    pub(crate) fn asks_predicates(&self) -> bool {
        self.user_predicates || self.standard_predicates
    }
    /// The handler of the table's opcode at `slot` (its [`Opcode::table_index`]) where one
    /// index finds it: while no entry matches by predicate (whose answer only asking it
    /// tells, and which may panic). None: [`Registry::find`] must look. Inlined into the one
    /// place that serves a request (`Inner::start`). The table is empty while an entry
    /// matches by predicate (`index_table`), so one bounds check says both.
    #[inline]
    pub(crate) fn indexed(&self, slot: Option<usize>) -> Option<&Handler> {
        debug_assert!(self.by_table.is_empty() || !self.asks_predicates());
        self.by_table.get(slot?)?.as_ref()
    }
    /// The first handler accepting `opcode`: user handlers in registration order, then the
    /// standard ones.
    pub(crate) fn find(&self, opcode: Opcode) -> Option<&Entry> {
        let user = self.user.iter().find(|e| e.matcher.accepts(opcode));
        if user.is_some() {
            return user;
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
    pub(crate) fn names(&self) -> Vec<&str> {
        self.user
            .iter()
            .chain(&self.standard)
            .map(|e| e.name.as_str())
            .collect()
    }
}

/// Builds an entry.
pub(crate) fn entry(name: impl Into<String>, matcher: Matcher, handler: Handler) -> Entry {
    Entry {
        name: name.into(),
        matcher,
        handler,
    }
}

/// The handler of `opcode` for port `index` of `mailbox` where one look at the pass's copy
/// `registry` did not find it (`Inner::start`): a user's matcher is asked under a catch, and the
/// copy may predate a handler registered just before this request was sent (the pass began
/// first), so an opcode it does not know is looked up again in the current registry, kept in
/// `current`. `register` published it before the client's flip, which `try_take`'s acquire
/// fence ordered before this lock of the snapshot. None: no handler (an unknown opcode, or a
/// matcher panicked), logged and counted; the request is closed unanswered.
#[inline(never)]
pub(crate) fn find_slowly<'r>(
    context: &ServerContext,
    registry: &'r Registry,
    current: &'r mut Option<Arc<Registry>>,
    (mailbox, index): (&Attached, u32),
    opcode: Opcode,
) -> Option<&'r Entry> {
    let name = &context.config.name;
    let found = match find_caught(registry, opcode) {
        Ok(None) => find_caught(current.insert(context.registry.get()), opcode),
        found => found,
    };
    match found {
        Ok(Some(entry)) => Some(entry),
        Ok(None) => {
            device_log!(
                context.log_limit,
                Warn,
                "{name}: mailbox {} port {index}: unknown opcode {opcode}; closed unanswered",
                mailbox.id.0
            );
            bump(&context.stats.unknown);
            None
        }
        Err(error) => {
            log::error!(
                "{name}: mailbox {} port {index}: finding the handler for {opcode}: {error}; \
                 closed unanswered",
                mailbox.id.0
            );
            bump(&context.stats.panics);
            None
        }
    }
}

/// The handler of `opcode` in `registry`, for [`find_slowly`]. A user's matcher may panic: then
/// that request alone goes unanswered, as an unknown one (the error). A registry with no
/// matcher (every standard opcode, and user handlers of one opcode each) compares opcodes
/// only, which cannot panic: no catch.
fn find_caught(registry: &Registry, opcode: Opcode) -> Result<Option<&Entry>, ServerError> {
    if registry.asks_predicates() {
        catch(|| Ok(registry.find(opcode)))
    } else {
        Ok(registry.find(opcode))
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn named(name: &str, matcher: Matcher) -> Entry {
        entry(name, matcher, Handler::packet(|_, _| {}))
    }

    #[test]
    fn user_handlers_come_first_then_standard_in_order() {
        let mut registry = Registry::default();
        registry.push_standard(named(
            "TEST_INCREMENT",
            Matcher::Opcode(Opcode::TEST_INCREMENT),
        ));
        let found = |r: &Registry, op| r.find(op).map(|e| e.name.clone());
        assert_eq!(
            found(&registry, Opcode::TEST_INCREMENT).as_deref(),
            Some("TEST_INCREMENT")
        );
        assert_eq!(found(&registry, Opcode::user(1)), None);
        // A user handler overrides a standard opcode; a predicate catches a whole class.
        registry.push_user(named("mine", Matcher::Opcode(Opcode::TEST_INCREMENT)));
        registry.push_user(named("mine too", Matcher::Opcode(Opcode::TEST_INCREMENT)));
        registry.push_user(named("user 9", Matcher::Opcode(Opcode::user(9))));
        // Found by one index (no predicate yet): the first user entry, ahead of the standard.
        assert!(!registry.asks_predicates());
        assert_eq!(
            found(&registry, Opcode::TEST_INCREMENT).as_deref(),
            Some("mine")
        );
        let is_mine = |handler: Option<&Handler>| match (handler, &registry.user[0].handler) {
            (Some(Handler::Packet(a)), Handler::Packet(b)) => Arc::ptr_eq(a, b),
            _ => false,
        };
        assert!(is_mine(
            registry.indexed(Opcode::TEST_INCREMENT.table_index())
        ));
        assert!(registry.indexed(Opcode::NOOP.table_index()).is_none());
        assert!(registry.indexed(Opcode::user(9).table_index()).is_none());
        assert_eq!(found(&registry, Opcode::user(9)).as_deref(), Some("user 9"));
        assert_eq!(found(&registry, Opcode::NOOP), None);
        registry.push_user(named(
            "class u",
            Matcher::Predicate(Arc::new(|op: Opcode| op.class() == b'u')),
        ));
        assert_eq!(
            found(&registry, Opcode::TEST_INCREMENT).as_deref(),
            Some("mine")
        );
        assert!(registry.asks_predicates());
        assert!(registry
            .indexed(Opcode::TEST_INCREMENT.table_index())
            .is_none());
        assert_eq!(found(&registry, Opcode::user(9)).as_deref(), Some("user 9"));
        assert_eq!(
            found(&registry, Opcode::user(10)).as_deref(),
            Some("class u")
        );
        // A standard predicate registered before an indexed entry wins, as the order says.
        let mut registry = Registry::default();
        registry.push_standard(named("any", Matcher::Predicate(Arc::new(|_| true))));
        registry.push_standard(named("noop", Matcher::Opcode(Opcode::NOOP)));
        assert_eq!(found(&registry, Opcode::NOOP).as_deref(), Some("any"));
        assert_eq!(registry.names(), ["any", "noop"]);
    }

    /// Registering asks no matcher: a request's lookup asks it, under the catch of its panic
    /// (the table of handlers by opcode, made at each push, is not made once one exists).
    #[test]
    fn registering_asks_no_matcher() {
        let asked = Arc::new(crate::sync::AtomicUsize::new(0));
        let count = Arc::clone(&asked);
        let mut registry = Registry::default();
        registry.push_user(named(
            "counted",
            Matcher::Predicate(Arc::new(move |_| {
                count.fetch_add(1, crate::sync::Ordering::Relaxed);
                false
            })),
        ));
        registry.push_standard(named("noop", Matcher::Opcode(Opcode::NOOP)));
        registry.push_user(named("mine", Matcher::Opcode(Opcode::TEST_INCREMENT)));
        assert_eq!(asked.load(crate::sync::Ordering::Relaxed), 0);
        assert!(registry.find(Opcode::NOOP).is_some());
        assert_eq!(asked.load(crate::sync::Ordering::Relaxed), 1);
    }
}

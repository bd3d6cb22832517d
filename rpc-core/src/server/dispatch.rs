//! The pass: what the worker runs over every attached mailbox, again and again. It refreshes
//! its copies of the mailbox list and the registry (`PassCache`), ends the exchanges of
//! detached mailboxes, polls the exchanges in flight that are not waiting on their ports, and
//! sweeps each mailbox's pending ports in index order (`protocol::scan`): a port whose
//! exchange is in flight has that exchange polled, any other is opened and its request
//! started (`Inner::start`: a late packet of a drained exchange answered, a bad header or an
//! unknown opcode closed unanswered, a packet handler run whole, a script's exchange handed to
//! the executor, [`crate::server::exec`], which keeps it in flight and ends it). At each
//! checkpoint of the scan it polls the exchanges that can advance, and yields the CPU while
//! the worker says so (`PassCache::yield_every`); once the scan is done, a sweep that served
//! one port watches it a moment for its client's next request (`Sweep::dwell`). Every
//! [`HOUSEKEEPING_PASSES`] passes (every [`IDLE_HOUSEKEEPING_PASSES`] while passes find
//! nothing to do) it also looks whether the waiting exchanges' kernels are gone or their
//! clients timed out, and it lifts the quarantine of ports whose kernels are gone. A pass
//! that begins with two or more exchanges in flight runs under a [`Batching`] guard
//! (`protocol::deferred`).

use std::vec::Vec;

use crate::protocol::mailbox::unlock_alone;
use crate::protocol::server_end::{HotPorts, Step, Taken};
use crate::protocol::{ProtocolError, ServerEnd, Wait};
use crate::server::error::ServerError;
use crate::server::exec::{
    self, carry_out, catch, count, finish, yield_to_others, Batching, ExchangeWait, Fate, Flights,
    InFlight, Look, Site,
};
use crate::server::limits::device_log;
use crate::server::mailboxes::{Marks, Opened};
use crate::server::registry::{find_slowly, Handler, Registry, ScriptFn};
use crate::server::request::Request;
use crate::server::stats::bump;
use crate::server::{Attached, Inner, ServerContext};
use crate::sync::{lock, Arc, AtomicU32, Ordering};

/// The wait of a packet handler's reply outside a batch: its flip stored at once, its unlock a
/// plain store ([`unlock_alone`]), as this thread, the server's worker, is the only one that
/// takes or releases the lock bits of an attached mailbox's table (`Attached::server`; every
/// port of it is taken, drained, closed and released in a pass, on this thread). The unlock's
/// RMW would wait for the flip to leave the store buffer before the worker looks at any port
/// again (docs/performance.md, "The server's blind time after a reply").
struct AloneAtOnce;

impl Wait for AloneAtOnce {
    fn pause(&self, _port: u32, _attempt: u32) -> Result<(), ProtocolError> {
        Ok(())
    }
    fn resumable(&self) -> bool {
        true
    }
    fn unlock(&self, locks: &[AtomicU32], index: u32) {
        unlock_alone(locks, index);
    }
}

/// How often (in passes) the exchanges waiting for a client that has not answered are looked
/// at for a kernel gone or a client timed out: at least every this many passes (and more often
/// while idle, [`IDLE_HOUSEKEEPING_PASSES`]). Between those, such an exchange costs a pass
/// nothing (the sweep polls it once its port is pending); looking reads its flags and the
/// users' marks and, with a client timeout, the clock.
const HOUSEKEEPING_PASSES: u32 = 32;

/// How many passes apart the waiting exchanges are looked at while passes find nothing to do:
/// the worker polls back to back before it backs off, and a look at every waiting exchange on
/// each idle pass would cost O(exchanges) a pass just when a client's answer may come (with 64
/// in flight, most of what an idle pass cost). Once the worker parks, a pass is a park, so a
/// kernel gone or a client timed out is then seen up to 8 parks late (rpc-serve's longest
/// park is 250 ms, so 2 s; its client timeout 10 s). None under loom, whose passes are few.
#[cfg(not(loom))]
const IDLE_HOUSEKEEPING_PASSES: u32 = 8;
#[cfg(loom)]
const IDLE_HOUSEKEEPING_PASSES: u32 = 0;

impl Attached {
    /// Releases the quarantined ports whose kernels are all gone. Inlined, so that a pass over
    /// a mailbox with none (nearly every pass) costs a load, not a call.
    #[inline]
    fn release_quarantined(&self, context: &ServerContext) {
        // Relaxed: a hint that saves the lock on every pass; a port quarantined meanwhile is
        // looked at in the next pass.
        if self.quarantined.load(Ordering::Relaxed) != 0 {
            self.drain_quarantined(context);
        }
    }

    /// [`Attached::release_quarantined`] once some port is quarantined.
    #[inline(never)]
    fn drain_quarantined(&self, context: &ServerContext) {
        let mut quarantine = lock(&self.quarantine);
        if quarantine.is_empty() {
            return;
        }
        let server = self.server();
        quarantine.retain(|q| {
            if !q.marks.gone(self, context) {
                return true;
            }
            server.drain(q.index, q.opcode.failure_word(), &ExchangeWait);
            // RMW: one quarantined port fewer (written only under `quarantine`'s lock).
            self.quarantined.fetch_sub(1, Ordering::Relaxed);
            log::debug!(
                "{}: mailbox {} port {}: quarantine lifted, its kernels are gone; port drained",
                context.config.name,
                self.id.0,
                q.index
            );
            false
        });
    }
}

/// The worker's state between passes: its copies of the mailbox list and the registry
/// (refreshed when they change) and the exchanges in flight.
pub(crate) struct PassCache {
    mailboxes: Option<Arc<Vec<Arc<Attached>>>>,
    registry: Option<Arc<Registry>>,
    /// The recently served ports of each mailbox of `mailboxes`, in the same order.
    hot: Vec<HotPorts>,
    /// The ports of all of `mailboxes` together (what one pass scans).
    ports: usize,
    versions: (u64, u64),
    in_flight: Flights,
    /// Passes since the waiting exchanges were last looked at (see [`HOUSEKEEPING_PASSES`]),
    /// and whether the last pass made progress.
    since_housekeeping: u32,
    last_progress: bool,
    /// The ports the last pass scanned after its last progress (all of them if it made none).
    quiet_ports: usize,
    /// While set, a pass yields the CPU each time it has scanned this many more ports of a
    /// mailbox with no progress. The worker sets it while its yields run other threads: one
    /// may be a client waiting for this CPU, which would otherwise wait for the rest of a scan
    /// of many ports (some 3 µs over 16384) after its answer (the loaded regime,
    /// `docs/performance.md`).
    pub(crate) yield_every: Option<usize>,
}

impl PassCache {
    pub(crate) fn new() -> Self {
        PassCache {
            mailboxes: None,
            registry: None,
            hot: Vec::new(),
            ports: 0,
            versions: (u64::MAX, u64::MAX),
            in_flight: Flights::new(),
            since_housekeeping: 0,
            last_progress: false,
            quiet_ports: 0,
            yield_every: None,
        }
    }

    /// Takes new copies if the list or the registry changed; true if the mailbox list did
    /// (the old copy, and with it any detached mailbox, is let go). Inlined, so that a pass
    /// with nothing new (nearly every pass) costs two loads and compares, not a call.
    #[inline]
    fn refresh(&mut self, context: &ServerContext) -> bool {
        let versions = (context.mailboxes.version(), context.registry.version());
        if self.mailboxes.is_none() || versions != self.versions {
            return self.take_copies(context, versions);
        }
        false
    }

    /// [`PassCache::refresh`] once something changed: new copies, as of `versions`.
    #[inline(never)]
    fn take_copies(&mut self, context: &ServerContext, versions: (u64, u64)) -> bool {
        let changed = versions.0 != self.versions.0;
        let mailboxes = context.mailboxes.get();
        self.hot = std::vec![Default::default(); mailboxes.len()];
        self.ports = mailboxes.iter().map(|m| m.layout.ports() as usize).sum();
        self.mailboxes = Some(mailboxes);
        self.registry = Some(context.registry.get());
        self.versions = versions;
        changed
    }

    /// The ports one pass scans (as of the last pass).
    pub(crate) fn ports(&self) -> usize {
        self.ports
    }

    /// [`quiet_ports`](Self::quiet_ports) of the last pass.
    pub(crate) fn quiet_ports(&self) -> usize {
        self.quiet_ports
    }

    /// A doorbell to sleep on: only when every attached mailbox has one and no request is open
    /// in any (each counter 0). Then an open request rings one of them (waiting on the first,
    /// the others are seen at the next poll, at most `doorbell_sleep` later).
    #[cfg(not(loom))]
    pub(crate) fn quiet_doorbell(&self) -> Option<&dyn crate::server::mailboxes::Doorbell> {
        let mailboxes = self.mailboxes.as_ref()?;
        let mut bells = mailboxes.iter().map(|m| m.doorbell());
        let first = bells.next()??;
        let all_quiet = std::iter::once(Some(first))
            .chain(bells)
            .all(|bell| bell.is_some_and(|b| b.counter().load(Ordering::Relaxed) == 0));
        all_quiet.then_some(first)
    }

    #[cfg(loom)]
    pub(crate) fn quiet_doorbell(&self) -> Option<&'static dyn crate::server::mailboxes::Doorbell> {
        None
    }

    /// Ends every exchange still in flight with `reason` (the worker is about to sleep, with no
    /// user left, or to exit) and lets go of every mailbox, so `detach` never waits on a
    /// sleeping or finished worker.
    pub(crate) fn clear(&mut self, context: &ServerContext, fate: Fate, reason: &str) {
        self.in_flight
            .abandon_where(context, |_| true, fate, reason);
        self.mailboxes = None;
    }

    /// At the end of a stretch (no user was left when the worker looked): resets the ports of
    /// the exchanges whose kernels are all gone and lets go of every mailbox. An exchange of a
    /// kernel that arrived after the worker looked (the stretch's last pass may have opened its
    /// request) stays in flight: resetting it midway would make the kernel's next packet read
    /// as a new request. The worker serves it before it sleeps, since that kernel's arrival
    /// changed the epoch `wait_for_users` compares.
    pub(crate) fn clear_gone(&mut self, context: &ServerContext, reason: &str) {
        let gone = |flight: &InFlight| flight.opened.marks.gone(&flight.mailbox, context);
        self.in_flight
            .abandon_where(context, gone, Fate::Drain, reason);
        self.mailboxes = None;
    }
}

impl Inner {
    /// One pass: the exchanges in flight, then every attached mailbox's pending ports (unless a
    /// shutdown is under way: those wait for the next worker). Returns how many exchanges made
    /// progress (opened, advanced or ended).
    /// (An associated function: loom's `Arc` cannot be a method receiver.)
    pub(crate) fn serve_pass(inner: &Arc<Inner>, cache: &mut PassCache) -> usize {
        let context = &inner.context;
        if cache.refresh(context) {
            // A `detach` may be waiting for us to let go of its mailbox.
            inner.thread.notify();
        }
        let since = cache.since_housekeeping;
        let housekeeping = since >= HOUSEKEEPING_PASSES
            || (!cache.last_progress && since >= IDLE_HOUSEKEEPING_PASSES);
        cache.since_housekeeping = if housekeeping {
            0
        } else {
            cache.since_housekeeping + 1
        };
        let PassCache {
            mailboxes,
            registry,
            hot,
            in_flight,
            last_progress,
            quiet_ports,
            yield_every,
            ..
        } = cache;
        let (Some(mailboxes), Some(registry)) = (mailboxes, registry) else {
            return 0;
        };
        let mut progress = inner.drop_detached(in_flight);
        // A pass that begins with two or more exchanges in flight (a client that pipelines, or
        // many warps) publishes its flips and unlocks in batches: see `protocol::port`'s
        // batches, which say why that pays and what it costs. Published at the latest when
        // `batch` drops, at the end of this function.
        // SAFETY: the mailboxes whose ports the pass flips and unlocks are held by `mailboxes`
        // (and by the exchanges in flight) until after it returns.
        let batch = (in_flight.len() >= 2).then(|| unsafe { Batching::enter() });
        let batching = batch.is_some();
        // Ports scanned since the last progress of this pass (see `quiet_ports`).
        let mut quiet = 0;
        let stopping = inner.thread.stopping();
        // The exchanges waiting on their ports are polled by the sweep, where it finds their
        // ports pending; a pass with no sweep (a shutdown under way) polls them here. Worked
        // out only where exchanges are in flight (not in the common pass with none).
        let look = || {
            if housekeeping {
                Look::Housekeeping
            } else if stopping {
                Look::Ready
            } else {
                Look::OffPort
            }
        };
        for (mailbox, hot) in mailboxes.iter().zip(hot.iter_mut()) {
            if mailbox.detached.load(Ordering::Acquire) {
                continue;
            }
            // Where in this mailbox's scan its last progress came (0: before the scan; None:
            // none, or a shutdown under way).
            let mut last_at = None;
            // One view of the mailbox for its whole part of the pass; a panic in that part (its
            // memory source, a matcher) costs this mailbox only.
            progress += exec::in_part(inner, mailbox, |site| {
                let server = site.server;
                // No call at all in the common pass with nothing in flight.
                let mut found = if in_flight.len() == 0 {
                    0
                } else {
                    in_flight.poll_of(site, look())
                };
                if stopping {
                    return found;
                }
                mailbox.release_quarantined(context);
                // Every pending port in index order, plus the recently served ports re-checked on
                // the way, and the exchanges in flight polled at each checkpoint (see `scan`).
                let mut sweep = server.sweep(hot);
                // `found` as of `last_at`: each step's progress is placed where the scan stood
                // after it, at the top of the next turn (the scan moves only in `sweep.next`).
                let mut placed = 0;
                // Where the scan stood at its last progress or yield (see `yield_every`).
                let mut calm_from = 0;
                loop {
                    if found > placed {
                        placed = found;
                        last_at = Some(sweep.position());
                        calm_from = sweep.position();
                    }
                    if mailbox.detached.load(Ordering::Acquire) {
                        break;
                    }
                    let index = match sweep.next() {
                        // A client in a loop on the one port this pass served may be about
                        // to send its next request: see `Sweep::dwell`. Not while exchanges
                        // are in flight (they are polled between passes), nor while the
                        // worker takes turns with another thread on its CPU (`yield_every`:
                        // a client there sends nothing while we watch).
                        None if in_flight.len() == 0 && yield_every.is_none() => {
                            match sweep.dwell() {
                                Some(index) => index,
                                None => break,
                            }
                        }
                        None => break,
                        Some(Step::Checkpoint) => {
                            found += in_flight.poll_all(inner, mailboxes, Look::Ready);
                            let calm = sweep.position() - calm_from;
                            if found == placed && yield_every.is_some_and(|every| calm >= every) {
                                // The flips this pass deferred go out first: the client that
                                // runs may be waiting for one of them.
                                exec::publish();
                                if !yield_to_others() {
                                    *yield_every = None;
                                }
                                calm_from = sweep.position();
                            }
                            continue;
                        }
                        Some(Step::Pending(index)) => index,
                    };
                    // A port whose exchange is in flight looks pending each time its client
                    // answers: the exchange is polled here, not opened again. One not waiting
                    // on its port (yielded, or on an I/O call) was polled at the start of the
                    // pass, and is left for the next.
                    // With none in flight (a client that waits for each reply), no look at
                    // the table of positions.
                    let position = if in_flight.len() == 0 {
                        None
                    } else {
                        mailbox.flight_of(index)
                    };
                    if let Some(k) = position {
                        let flight = in_flight.get(k);
                        // `Flights` keeps the table current; checked all the same, as polling
                        // another port's exchange would close that port through this view.
                        let found_it =
                            flight.opened.index == index && Arc::ptr_eq(&flight.mailbox, mailbox);
                        debug_assert!(found_it, "the table of positions is out of date");
                        if found_it && flight.on_port {
                            found += in_flight.step(site, k, false).0;
                        }
                        continue;
                    }
                    let opened =
                        Inner::start(inner, server, index, mailbox, registry, batching, in_flight);
                    if opened {
                        sweep.served(index);
                        found += 1;
                    }
                }
                found
            });
            let ports = mailbox.layout.ports() as usize;
            quiet = match last_at {
                Some(at) => ports.saturating_sub(at),
                None => quiet + ports,
            };
        }
        *quiet_ports = quiet;
        // Only the worker writes this counter: a plain load and store, no RMW needed.
        let passes = &context.stats.passes;
        passes.store(passes.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
        *last_progress = progress > 0;
        progress
    }

    /// Opens port `index` on `server`, `mailbox`'s view, and starts serving it, in a pass with
    /// the copy `registry` that defers its flips or not (`batching`); puts its exchange in
    /// flight if it suspended. False if the port did not open (not pending any more, or held
    /// by another server thread). Not inlined, so the sweep's loop in `serve_pass` stays small
    /// (the pipelined rows gained, docs/performance.md); the port is opened here, where it
    /// stays, not returned by the sweep and copied in; an exchange in flight likewise is
    /// written once, where it stays.
    #[inline(never)]
    fn start(
        inner: &Arc<Inner>,
        server: &ServerEnd<'_>,
        index: u32,
        mailbox: &Arc<Attached>,
        registry: &Registry,
        batching: bool,
        in_flight: &mut Flights,
    ) -> bool {
        let context = &inner.context;
        // Taken, not opened: a packet handler's request needs no port, only its packets and
        // the hand-over back (`ServerEnd::answer`); the other paths make the port.
        let Some(mut taken) = server.try_take(index) else {
            return false;
        };
        // Everything after this sees the opcode in today's numbering.
        taken.opcode = mailbox.numbering.translate(taken.opcode.0);
        let name = &context.config.name;
        let opcode = taken.opcode;
        if taken.header_mask == 0 {
            // The no-request mark: a late packet of an exchange the server drained (or a flip
            // that opened nothing). Answered as the drain answered, never run (PROTOCOL
            // section 11). No port is made: its client opened nothing, so the doorbell must
            // not count a request closed, as the port's drop would; the drain unlocks it.
            server.drain(index, opcode.failure_word(), &ExchangeWait);
            log::debug!(
                "{name}: mailbox {} port {index}: a late packet of {opcode} answered, not run",
                mailbox.id.0
            );
            return true;
        }
        let packets = server.packets(&taken);
        if packets.mask != taken.header_mask {
            // Lanes at or above `L`: closed unanswered, by the port's drop (the client reads
            // its own request back).
            let port = server.port(taken, &ExchangeWait);
            let error = port
                .check_mask()
                .expect_err("a mask with lanes at or above L");
            device_log!(
                context.log_limit,
                Warn,
                "{name}: mailbox {} port {index}: {opcode}: {error}; closed unanswered",
                mailbox.id.0
            );
            bump(&context.stats.bad_headers);
            return true;
        }
        // One index into the pass's copy of the registry where no matcher may panic (every
        // standard opcode, user handlers of one opcode each): no catch, nothing returned
        // through a `Result`. The rest, out of line.
        let slot = opcode.table_index();
        let mut current = None;
        let handler = match registry.indexed(slot) {
            Some(handler) => handler,
            None => match find_slowly(context, registry, &mut current, (mailbox, index), opcode) {
                Some(entry) => &entry.handler,
                None => {
                    // Closed unanswered: the client reads its own request back.
                    server.answer(&taken, &ExchangeWait);
                    return true;
                }
            },
        };
        log::debug!(
            "{name}: mailbox {} port {index}: {opcode} mask {:#x}",
            mailbox.id.0,
            packets.mask
        );
        match handler {
            Handler::Packet(reply) => {
                // The client's packet is there (the port opened because it flipped), and the
                // reply is that packet rewritten in place: this never suspends, so it needs no
                // exchange, nor a port, only the one catch of a panic. Caught here, not
                // through `catch`: inlined, a catch costs nothing until a panic, where the
                // call of `catch` cost its frame and a `Result` through memory.
                let rewritten = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    reply(packets);
                }));
                if let Err(panic) = rewritten {
                    let error = ServerError::Panicked(crate::server::panic_message(panic.as_ref()));
                    // Counted, then drained: left locked, as `Request`'s drop leaves a port
                    // (the doorbell counts it closed).
                    let fate = count(context, mailbox, index, opcode, Err(error));
                    server.port(taken, &ExchangeWait).quarantine();
                    let marks = Marks::now(mailbox, context);
                    let opened = Opened {
                        index,
                        opcode,
                        marks,
                    };
                    carry_out(mailbox, Some(server), opened, false, fate);
                    return true;
                }
                // Counted before its one hand-over, the reply: whoever has the reply (the
                // client, `wait_drained` seeing the port no longer pending) finds it counted,
                // so it needs none of a script's settling (`Attached`'s ordering note).
                context.stats.served_at(slot, opcode);
                // The reply: the flip and the unlock through the executor's wait where the
                // pass defers its flips, else stored at once (`AloneAtOnce`), without asking
                // this thread's context twice whether they wait in a batch.
                if batching {
                    server.answer(&taken, &ExchangeWait);
                } else {
                    server.answer(&taken, &AloneAtOnce);
                }
                true
            }
            Handler::Script(script) => {
                let site = Site {
                    inner,
                    mailbox,
                    server,
                };
                Inner::start_script(site, taken, &**script, in_flight);
                true
            }
        }
    }

    /// [`Inner::start`]'s script: the port `taken` made and handed to `script`, whose exchange
    /// is put in flight. Out of line: the packet handlers' path, in `start`, keeps fewer
    /// values alive (a script's request costs hundreds of instructions; this call, some ten).
    #[inline(never)]
    fn start_script(site: Site<'_>, taken: Taken, script: &ScriptFn, in_flight: &mut Flights) {
        let Site {
            mailbox, server, ..
        } = site;
        let context = site.context();
        // Until it is counted (`finish`, `abandon`), the request keeps its mailbox from
        // looking drained: its last hand-over lets the kernel go on first.
        mailbox.begin_request();
        // Read once the port is open, after `try_take`'s acquire fence: the kernel that sent
        // the request took its ticket before its flip (release), so the marks include it; read
        // before, a stale mark could make a live kernel look gone. (A packet handler's port is
        // never quarantined: its marks are never needed.)
        let opened = Opened {
            index: taken.index,
            opcode: taken.opcode,
            marks: Marks::now(mailbox, context),
        };
        let port = server.port(taken, &ExchangeWait);
        // SAFETY: `port` was opened on `mailbox.server()`: its references point into the
        // mailbox's region, lock table and doorbell, all owned by `*mailbox`.
        let request = unsafe { Request::new(port, mailbox.clone(), site.inner.clone()) };
        match catch(|| Ok(script(request))) {
            Ok(exchange) => in_flight.run(site, opened, exchange),
            // The request went in the unwinding, leaving the port locked.
            Err(error) => finish(site, opened, Err(error), false),
        }
    }

    /// Ends the exchanges of detached mailboxes (no pass touches their memory again). Asked of
    /// every exchange, not only of the listed mailboxes: `detach` takes its mailbox off the
    /// list before it marks it detached. Returns how many ended.
    fn drop_detached(&self, in_flight: &mut Flights) -> usize {
        let detached = |flight: &InFlight| flight.mailbox.detached.load(Ordering::Acquire);
        let ended = in_flight.abandon_where(
            &self.context,
            detached,
            Fate::Quarantine,
            "mailbox detached",
        );
        if ended > 0 {
            // A `detach` may be waiting for these exchanges to let go of its mailbox.
            self.thread.notify();
        }
        ended
    }
}

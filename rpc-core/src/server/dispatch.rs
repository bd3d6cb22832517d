//! Serving requests: one pass over every attached mailbox, and the exchanges kept in flight
//! between passes.
//!
//! # Resumable exchanges
//! A port's exchange is a script of packets. A packet handler's script is one packet each way
//! and runs to completion when the port opens (the client's packet is already there). A script
//! handler's exchange is a future (an `async` function of its [`Request`], see
//! [`crate::server::registry`]): it runs until it needs a packet the client has not sent yet (or the
//! result of a call on the I/O threads), and then *suspends*. The pass keeps it in flight and
//! moves on to the other ports; later passes poll it again whenever it can advance, so an
//! exchange whose client answers quickly still advances about as fast as if it had the thread
//! alone, while one whose client is slow costs its port's slot, and nobody waits for it.
//!
//! We poll rather than wake: a device cannot signal the host, so the pass looks at every port
//! anyway. Polls run with a no-op waker. An exchange suspended in a port operation waits until
//! its port is pending again (the client answered): the sweep that finds the port pending polls
//! it there, found through the mailbox's table of positions (`Attached::in_flight`), so a pass
//! other than a housekeeping one (below) spends nothing on the exchanges whose clients are
//! silent, however many there are. One
//! suspended on something else (yielded, an I/O call's result, a user's future) is polled at the
//! start of every pass and at every checkpoint of the scan (`scan::HOT_STRIDE` ports), as are,
//! at checkpoints, those whose ports turned pending (in a mailbox of more ports than a stride).
//! Whether a waiting exchange's kernels are gone, or its client timed out, is looked at every
//! [`HOUSEKEEPING_PASSES`] passes, and every [`IDLE_HOUSEKEEPING_PASSES`] while passes find
//! nothing to do.
//! An exchange alone in flight is polled with a budget of spin waits (`exec`'s context): its
//! port operations spin briefly for the client's answer instead of suspending, so a lone
//! stream's packets go by inside one poll, not one poll (and a return here) per packet.
//!
//! A port looks free from outside while its exchange waits for the client (both flags equal).
//! A client that takes such a port with lock bits of its own (a new process; never a GPU, whose
//! dead warps keep their lock bits set in device memory) would have its packets read as the old
//! exchange's next ones: it must wait until the server has ended that exchange (for rpc-serve,
//! the client timeout; the server logs it).
//!
//! # Ending an exchange
//! | how it ends | the port | counted |
//! |---|---|---|
//! | completed, or refused with its script complete | closed: our buffer handed back, unlocked | `served` (+ `refused`) |
//! | an error (a stream claim above the bound, ...) or a panic midway | drained | `errors` / `panics` |
//! | no kernel that could answer runs any more | drained | `abandoned` |
//! | the client timed out (`client_timeout`, rpc-serve; counted only while the exchange waits on its port) | drained | `abandoned` |
//! | server shutting down | quarantined, drained once its kernels are gone | `abandoned` |
//! | mailbox detached | left untouched | `abandoned` |
//!
//! A *drained* port (PROTOCOL section 11, `ServerEnd::drain`) gets the no-request mark in its
//! header (lane mask 0), the drained reply if the buffer is ours (the opcode's failure word,
//! `Opcode::failure_word`, in every lane, and our flip), and is unlocked. The server keeps
//! nothing about it: the mark is its state. What the client sends next without opening a new
//! request (a late packet: its header still has the mark) is answered the same way, in
//! `Inner::start`, and never run; its next open writes a fresh header, and is served at once.
//! So an abandoned client runs the rest of its script on failure replies and gives the port
//! back, and none is lost, however slow the client or whatever it claimed.
//!
//! A *quarantined* port keeps the server's lock bit and both flags as they are: a shutdown
//! hands nothing back (the server is going away; a client waits, as a warp whose server stopped
//! does). Once every kernel that could be inside that exchange is gone, a pass drains it. A
//! quarantined port is no user: the worker sleeps when the kernels are gone, and the next
//! stretch drains it.
//!
//! A request's port outlives nothing: the exchange's future owns the request, and the request
//! is dropped when the script returns (inside the poll that completes it) or when the pass drops
//! a suspended exchange. Dropping it leaves the port locked, as it is, noting whether it owned
//! the buffer; the pass then carries out the port's `Fate`: closing hands a buffer we owned
//! back (a flip of our word) and unlocks; draining marks, answers if the buffer is ours, and
//! unlocks. A timed-out client process may be alive after all, and other processes may take the
//! port the moment it looks free: the mark serves both (their fresh headers are requests, the
//! slow client's packets are not).

use std::time::Instant;
use std::vec::Vec;

use crate::protocol::opcode::Opcode;
use crate::protocol::scan::{HotPorts, Step};
use crate::server::error::ServerError;
use crate::server::exec::{self, catch, poll, yield_to_others, Batching, ExchangeWait, Polled};
use crate::server::limits::device_log;
use crate::server::mailboxes::{Marks, Quarantined};
use crate::server::registry::{Exchange, Handler, Registry};
use crate::server::request::Request;
use crate::server::stats::bump;
use crate::server::{panic_message, Attached, Inner, ServerContext};
use crate::sync::{lock, Arc, Ordering};
use crate::Result;

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

/// What ending an exchange does to its port.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fate {
    /// Close it: hand back a buffer we own, unlock.
    Close,
    /// Drain it: the no-request mark, the drained reply if the buffer is ours, unlock (see the
    /// module docs).
    Drain,
    /// Leave it locked and untouched until its kernels are gone, then drain it.
    Quarantine,
}

impl Attached {
    /// Where port `index`'s exchange is in the worker's [`Flights`], if it has one in flight.
    /// Relaxed: only the worker writes and reads these words; they order nothing.
    fn flight_of(&self, index: u32) -> Option<usize> {
        let word = self.in_flight[index as usize].load(Ordering::Relaxed);
        (word as usize).checked_sub(1)
    }

    /// Records where port `index`'s exchange is in the worker's [`Flights`] (`None`: it has
    /// none). Relaxed: as `flight_of`.
    fn set_flight(&self, index: u32, position: Option<usize>) {
        let word = position.map_or(0, |k| k as u32 + 1);
        self.in_flight[index as usize].store(word, Ordering::Relaxed);
    }

    /// Records whether port `index`'s request owned the buffer when it was dropped. Relaxed: set
    /// and read by the worker, in that order, on the same thread (a request a handler moved
    /// elsewhere may leave a stale value; the protocol then only sees a late or a missing flip).
    pub(crate) fn note_owned(&self, index: u32, owned: bool) {
        self.owned[index as usize].store(owned, Ordering::Relaxed);
    }

    /// Stops serving a mailbox whose part of a pass panicked (a plugin's memory source, say):
    /// logged once and counted in `panics`; its exchanges end as if it were detached (its
    /// memory untouched), and the other mailboxes are served on. The owner should detach it.
    fn fail(&self, context: &ServerContext, panic: &(dyn std::any::Any + Send)) {
        log::error!(
            "{}: mailbox {} panicked while being served ({}); it is no longer served",
            context.config.name,
            self.id.0,
            panic_message(panic)
        );
        bump(&context.stats.panics);
        // Release: as `detach`'s store (the flag is all that changes).
        self.detached.store(true, Ordering::Release);
    }

    /// Releases the quarantined ports whose kernels are all gone.
    fn release_quarantined(&self, context: &ServerContext) {
        // Relaxed: a hint that saves the lock on every pass; a port quarantined meanwhile is
        // looked at in the next pass.
        if self.quarantined.load(Ordering::Relaxed) == 0 {
            return;
        }
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

/// Which exchanges in flight a poll of them looks at.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Look {
    /// Those that can advance (see `Inner::step`), and of the others whether their kernels
    /// are gone or their client timed out.
    Housekeeping,
    /// Those that can advance: not waiting on their port, or their client has answered.
    Ready,
    /// Those not waiting on their port: a yielded exchange or one waiting on an I/O call. The
    /// sweep that follows polls the others where it finds their ports pending.
    OffPort,
}

/// One exchange in flight.
struct InFlight {
    /// The rest of the script; owns its `Request` and so the port.
    exchange: Exchange,
    mailbox: Arc<Attached>,
    index: u32,
    opcode: Opcode,
    marks: Marks,
    /// Both flags of the port when last seen changing.
    flags: (u32, u32),
    /// For `client_timeout`: when a poll first found the exchange waiting on its port without
    /// progress since it last advanced (`None`: it advanced, or left its port, at the last
    /// look). Read from the clock only then, so an exchange that keeps advancing (a stream:
    /// a packet per poll) never reads it.
    since: Option<Instant>,
    /// The last poll suspended in a port operation: no use polling again until the client
    /// has answered (the port is pending again).
    on_port: bool,
}

/// The exchanges in flight, each found from its port through `Attached::in_flight`, which
/// every change of the list keeps current (the one place positions change).
pub(crate) struct Flights(Vec<InFlight>);

impl Flights {
    fn len(&self) -> usize {
        self.0.len()
    }

    fn get(&self, k: usize) -> &InFlight {
        &self.0[k]
    }

    fn get_mut(&mut self, k: usize) -> &mut InFlight {
        &mut self.0[k]
    }

    fn push(&mut self, flight: InFlight) {
        flight.mailbox.set_flight(flight.index, Some(self.0.len()));
        self.0.push(flight);
    }

    /// Takes exchange `k` out of the list (the last one takes its place).
    fn swap_remove(&mut self, k: usize) -> InFlight {
        let flight = self.0.swap_remove(k);
        flight.mailbox.set_flight(flight.index, None);
        if let Some(moved) = self.0.get(k) {
            moved.mailbox.set_flight(moved.index, Some(k));
        }
        flight
    }

    /// Ends every exchange that `ends` picks ([`abandon`] with `fate` and `reason`); returns
    /// how many.
    fn abandon_where(
        &mut self,
        context: &ServerContext,
        ends: impl Fn(&InFlight) -> bool,
        fate: Fate,
        reason: &str,
    ) -> usize {
        let mut ended = 0;
        let mut k = 0;
        while k < self.len() {
            if ends(self.get(k)) {
                abandon(context, self.swap_remove(k), fate, reason);
                ended += 1;
            } else {
                k += 1;
            }
        }
        ended
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
            in_flight: Flights(Vec::new()),
            since_housekeeping: 0,
            last_progress: false,
            quiet_ports: 0,
            yield_every: None,
        }
    }

    /// Takes new copies if the list or the registry changed; true if the mailbox list did
    /// (the old copy, and with it any detached mailbox, is let go).
    fn refresh(&mut self, context: &ServerContext) -> bool {
        let versions = (context.mailboxes.version(), context.registry.version());
        let changed = versions.0 != self.versions.0;
        if self.mailboxes.is_none() || versions != self.versions {
            let mailboxes = context.mailboxes.get();
            self.hot = std::vec![Default::default(); mailboxes.len()];
            self.ports = mailboxes.iter().map(|m| m.layout.ports() as usize).sum();
            self.mailboxes = Some(mailboxes);
            self.registry = Some(context.registry.get());
            self.versions = versions;
        }
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
        let gone = |flight: &InFlight| flight.marks.gone(&flight.mailbox, context);
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
        // many warps) publishes its flips and unlocks in batches: see `deferred`, which is why
        // that pays and what it costs. Published at the latest when `batch` drops, at the end
        // of this function.
        // SAFETY: the mailboxes whose ports the pass flips and unlocks are held by `mailboxes`
        // (and by the exchanges in flight) until after it returns.
        let _batch = (in_flight.len() >= 2).then(|| unsafe { Batching::enter() });
        // Ports scanned since the last progress of this pass (see `quiet_ports`).
        let mut quiet = 0;
        let stopping = inner.thread.stopping();
        // The exchanges waiting on their ports are polled by the sweep, where it finds their
        // ports pending; a pass with no sweep (a shutdown under way) polls them here.
        let look = if housekeeping {
            Look::Housekeeping
        } else if stopping {
            Look::Ready
        } else {
            Look::OffPort
        };
        for (mailbox, hot) in mailboxes.iter().zip(hot.iter_mut()) {
            if mailbox.detached.load(Ordering::Acquire) {
                continue;
            }
            // Where in this mailbox's scan its last progress came (0: before the scan; None:
            // none, or a shutdown under way).
            let mut last_at = None;
            // A panic in this mailbox's part of the pass (its memory source, a matcher) costs
            // this mailbox only: see `Attached::fail`.
            let swept = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                // One view of the mailbox for its whole part of the pass.
                let server = mailbox.server();
                let mut found = inner.poll_exchanges_of(mailbox, &server, in_flight, look);
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
                        None => break,
                        Some(Step::Checkpoint) => {
                            found += inner.poll_in_flight(mailboxes, in_flight, Look::Ready);
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
                    if let Some(k) = mailbox.flight_of(index) {
                        let flight = in_flight.get(k);
                        // `Flights` keeps the table current; checked all the same, as polling
                        // another port's exchange would close that port through this view.
                        let found_it =
                            flight.index == index && Arc::ptr_eq(&flight.mailbox, mailbox);
                        debug_assert!(found_it, "the table of positions is out of date");
                        if found_it && flight.on_port {
                            found += inner.step(mailbox, &server, in_flight, k, false).0;
                        }
                        continue;
                    }
                    let Some(mut port) = server.try_open(index, &ExchangeWait) else {
                        continue;
                    };
                    // Everything after this sees the opcode in today's numbering.
                    port.opcode = mailbox.numbering.translate(port.opcode.0);
                    // Read once the port is open, after `try_open`'s acquire fence: the kernel that
                    // sent the request took its ticket before its flip (release), so the marks
                    // include it; read before, a stale mark could make a live kernel look gone.
                    let marks = Marks::now(mailbox, context);
                    sweep.served(index);
                    found += 1;
                    Inner::start(inner, &server, port, mailbox, marks, registry, in_flight);
                }
                found
            }));
            match swept {
                Ok(found) => progress += found,
                Err(panic) => mailbox.fail(context, panic.as_ref()),
            }
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

    /// Starts serving a port just opened on `server`, `mailbox`'s view; puts its exchange in
    /// flight if it suspended. Not inlined, so the sweep's loop in `serve_pass` stays small
    /// (the pipelined rows gained, docs/performance.md); an exchange in flight is written
    /// once, where it stays, not returned and copied.
    #[inline(never)]
    fn start(
        inner: &Arc<Inner>,
        server: &crate::protocol::ServerEnd<'_>,
        mut port: crate::protocol::ServerPort<'_>,
        mailbox: &Arc<Attached>,
        marks: Marks,
        registry: &Registry,
        in_flight: &mut Flights,
    ) {
        let context = &inner.context;
        let name = &context.config.name;
        let (opcode, index) = (port.opcode(), port.index());
        if port.header_mask() == 0 {
            // The no-request mark: a late packet of an exchange the server drained (or a flip
            // that opened nothing). Answered as the drain answered, never run (PROTOCOL
            // section 11). Forgotten, not dropped: its client opened nothing, so the doorbell
            // must not count a request closed, as the port's drop would (it holds nothing
            // else; the drain unlocks it).
            core::mem::forget(port);
            server.drain(index, opcode.failure_word(), &ExchangeWait);
            log::debug!(
                "{name}: mailbox {} port {index}: a late packet of {opcode} answered, not run",
                mailbox.id.0
            );
            return;
        }
        if let Err(error) = port.check_mask() {
            device_log!(
                context.log_limit,
                Warn,
                "{name}: mailbox {} port {index}: {opcode}: {error}; closed unanswered",
                mailbox.id.0
            );
            bump(&context.stats.bad_headers);
            return; // Dropping the port closes it: the client reads its own request back.
        }
        // A user's matcher may panic: that request alone goes unanswered, as an unknown one.
        // The pass's copy of the registry may predate a handler registered just before this
        // request was sent (the pass began first): an opcode it does not know is looked up
        // again in the current registry. `register` published it before the client's flip,
        // which `try_open`'s acquire fence ordered before this lock of the snapshot.
        let current: Arc<Registry>;
        let found = match catch(|| Ok(registry.find(opcode))) {
            Ok(None) => {
                current = context.registry.get();
                catch(|| Ok(current.find(opcode)))
            }
            found => found,
        };
        let entry = match found {
            Ok(entry) => entry,
            Err(error) => {
                log::error!(
                    "{name}: mailbox {} port {index}: finding the handler for {opcode}: {error}; \
                     closed unanswered",
                    mailbox.id.0
                );
                bump(&context.stats.panics);
                return;
            }
        };
        let Some(entry) = entry else {
            device_log!(
                context.log_limit,
                Warn,
                "{name}: mailbox {} port {index}: unknown opcode {opcode}; closed unanswered",
                mailbox.id.0
            );
            bump(&context.stats.unknown);
            return;
        };
        log::debug!(
            "{name}: mailbox {} port {index}: {opcode} mask {:#x}",
            mailbox.id.0,
            port.mask()
        );
        // Until it is counted (`finish`, `abandon`), the request keeps its mailbox from
        // looking drained: its last hand-over lets the kernel go on first.
        mailbox.begin_request();
        let mut exchange = match &entry.handler {
            Handler::Packet(reply) => {
                // The client's packet is there (the port opened because it flipped), and the
                // reply only needs the buffer we hold: this never suspends.
                let result = catch(|| reply(&mut port));
                let fate = inner.finish(mailbox, index, opcode, result);
                if fate != Fate::Close {
                    // Its drop would close it: let go of it as `Request`'s drop does.
                    port.quarantine();
                    carry_out(mailbox, Some(server), index, opcode, marks, fate);
                }
                return;
            }
            Handler::Script(script) => {
                // SAFETY: `port` was opened on `mailbox.server()`: its references point into the
                // mailbox's region, lock table and doorbell, all owned by `*mailbox`.
                let request = unsafe { Request::new(port, mailbox.clone(), inner.clone()) };
                match catch(|| Ok(script(request))) {
                    Ok(exchange) => exchange,
                    Err(error) => {
                        // The request went in the unwinding, leaving the port locked.
                        let fate = inner.finish(mailbox, index, opcode, Err(error));
                        carry_out(mailbox, Some(server), index, opcode, marks, fate);
                        return;
                    }
                }
            }
        };
        let on_port = match poll(&mut exchange, false) {
            Polled::OnPort => true,
            Polled::Elsewhere | Polled::Yielded => false,
            Polled::Done(result) => {
                inner.end(mailbox, server, index, opcode, marks, exchange, result);
                return;
            }
        };
        in_flight.push(InFlight {
            exchange,
            on_port,
            mailbox: mailbox.clone(),
            index,
            opcode,
            marks,
            flags: server.flags(index),
            since: None,
        });
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

    /// Polls the exchanges in flight of every mailbox that `look` picks, with one view of
    /// each mailbox. Returns how many made progress.
    fn poll_in_flight(
        &self,
        mailboxes: &[Arc<Attached>],
        in_flight: &mut Flights,
        look: Look,
    ) -> usize {
        if in_flight.len() == 0 {
            return 0;
        }
        let mut progress = 0;
        for mailbox in mailboxes {
            if mailbox.detached.load(Ordering::Acquire) {
                continue;
            }
            let polled = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                let server = mailbox.server();
                self.poll_exchanges_of(mailbox, &server, in_flight, look)
            }));
            match polled {
                Ok(found) => progress += found,
                Err(panic) => mailbox.fail(&self.context, panic.as_ref()),
            }
        }
        progress
    }

    /// [`Inner::poll_in_flight`] for the exchanges of one attached mailbox, `server` its view.
    fn poll_exchanges_of(
        &self,
        mailbox: &Arc<Attached>,
        server: &crate::protocol::ServerEnd<'_>,
        in_flight: &mut Flights,
        look: Look,
    ) -> usize {
        let mut progress = 0;
        let mut k = 0;
        while k < in_flight.len() {
            let flight = in_flight.get(k);
            let skip =
                !Arc::ptr_eq(&flight.mailbox, mailbox) || (look == Look::OffPort && flight.on_port);
            if skip {
                k += 1;
                continue;
            }
            let (found, ended) =
                self.step(mailbox, server, in_flight, k, look == Look::Housekeeping);
            progress += found;
            if !ended {
                k += 1;
            }
        }
        progress
    }

    /// Polls exchange `k` of `in_flight` (of `mailbox`, `server` its view) unless it waits for
    /// a client that has not answered, and ends it if it completed or, with `housekeeping`,
    /// can no longer be answered. Returns how much progress it made and whether it ended (then
    /// the list's last exchange took its place).
    fn step(
        &self,
        mailbox: &Arc<Attached>,
        server: &crate::protocol::ServerEnd<'_>,
        in_flight: &mut Flights,
        k: usize,
        housekeeping: bool,
    ) -> (usize, bool) {
        let context = &self.context;
        let alone = in_flight.len() == 1;
        let flight = in_flight.get_mut(k);
        // Polled before asking whether its kernel is gone: a kernel's last packet (EXIT's
        // status) may come just before it ends. Not polled while it waits for a client that
        // has not answered (the port not pending): that poll could only suspend again, and
        // its flags cannot have changed, so only housekeeping has anything to look at.
        let waiting = flight.on_port && !server.is_pending(flight.index);
        if waiting && !housekeeping {
            return (0, false);
        }
        let mut progress = 0;
        let polled = if waiting {
            Polled::OnPort
        } else {
            poll(&mut flight.exchange, alone)
        };
        let was_on_port = flight.on_port;
        flight.on_port = matches!(polled, Polled::OnPort);
        if matches!(polled, Polled::Yielded) {
            // It asked to be polled again soon: the thread must not back off meanwhile.
            progress += 1;
        }
        if !(was_on_port && flight.on_port) {
            // The client is timed only while the exchange waits on its port (the clock
            // starts again each time it does): time spent on an I/O thread (a 400 MB
            // printf, a slow file) is the server's, not the client's.
            flight.since = None;
        }
        if let Polled::Done(result) = polled {
            let flight = in_flight.swap_remove(k);
            self.end(
                &flight.mailbox,
                server,
                flight.index,
                flight.opcode,
                flight.marks,
                flight.exchange,
                result,
            );
            return (progress + 1, true);
        }
        let flags = server.flags(flight.index);
        if flags != flight.flags {
            flight.flags = flags;
            flight.since = None;
            return (progress + 1, false);
        }
        if flight.marks.gone(mailbox, context) {
            let flight = in_flight.swap_remove(k);
            abandon(context, flight, Fate::Drain, "no running kernel can answer");
            return (progress + 1, true);
        }
        let timed_out = flight.on_port
            && context
                .config
                .client_timeout
                .is_some_and(|t| flight.since.get_or_insert_with(Instant::now).elapsed() > t);
        if timed_out {
            // Drained: the client may be slow, not gone, and its next packet must not be read
            // as a request; other client processes may take the port from the moment it looks
            // free, and their fresh headers are.
            let flight = in_flight.swap_remove(k);
            abandon(context, flight, Fate::Drain, "the client timed out");
            return (progress, true);
        }
        (progress, false)
    }

    /// Ends a completed exchange: logs and counts its result, then drops it with the fate that
    /// result calls for.
    #[allow(clippy::too_many_arguments)] // The exchange's parts, taken apart by its owner.
    fn end(
        &self,
        mailbox: &Arc<Attached>,
        server: &crate::protocol::ServerEnd<'_>,
        index: u32,
        opcode: Opcode,
        marks: Marks,
        exchange: Exchange,
        result: Result<(), ServerError>,
    ) {
        let fate = self.finish(mailbox, index, opcode, result);
        drop(exchange);
        carry_out(mailbox, Some(server), index, opcode, marks, fate);
    }

    /// Logs and counts how a request ended (settling it: see `Attached::settle_request`); the
    /// fate of its port.
    fn finish(
        &self,
        mailbox: &Attached,
        index: u32,
        opcode: Opcode,
        result: Result<(), ServerError>,
    ) -> Fate {
        let fate = self.count(mailbox, index, opcode, result);
        mailbox.settle_request();
        fate
    }

    /// [`Inner::finish`]'s logging and counting.
    fn count(
        &self,
        mailbox: &Attached,
        index: u32,
        opcode: Opcode,
        result: Result<(), ServerError>,
    ) -> Fate {
        let context = &self.context;
        let name = &context.config.name;
        let id = mailbox.id.0;
        match result {
            Ok(()) => {
                context.stats.served(opcode);
                Fate::Close
            }
            Err(ServerError::Refused(why)) => {
                device_log!(
                    context.log_limit,
                    Warn,
                    "{name}: mailbox {id} port {index}: {opcode} refused: {why}"
                );
                bump(&context.stats.refused);
                context.stats.served(opcode);
                Fate::Close
            }
            Err(ServerError::Panicked(text)) => {
                // A device may make a handler panic again and again: within the budget too.
                device_log!(
                    context.log_limit,
                    Error,
                    "{name}: mailbox {id} port {index}: handler for {opcode} panicked: {text}; \
                     port drained"
                );
                bump(&context.stats.panics);
                Fate::Drain
            }
            Err(error) => {
                // A stream claim above the bounds, a broken exchange: the device's doing.
                device_log!(
                    context.log_limit,
                    Error,
                    "{name}: mailbox {id} port {index}: {opcode} failed: {error}; port drained"
                );
                bump(&context.stats.errors);
                Fate::Drain
            }
        }
    }
}

/// Ends an exchange that can no longer go on, logging and counting it.
fn abandon(context: &ServerContext, flight: InFlight, fate: Fate, reason: &str) {
    let InFlight {
        exchange,
        mailbox,
        index,
        opcode,
        marks,
        ..
    } = flight;
    let action = match fate {
        Fate::Drain => "port drained",
        Fate::Close => "port freed",
        Fate::Quarantine => "port left locked",
    };
    drop(exchange);
    carry_out(&mailbox, None, index, opcode, marks, fate);
    // Logged once done, so whoever reads the line finds the port as it says. A device (a
    // client that went silent or timed out) can cause any number of these: within the budget.
    device_log!(
        context.log_limit,
        Warn,
        "{}: mailbox {} port {index}: {opcode} abandoned: {reason}; {action}",
        context.config.name,
        mailbox.id.0
    );
    bump(&context.stats.abandoned);
    mailbox.settle_request();
}

/// Does to the port of an `opcode` exchange what its fate says, once its request is gone (see
/// the module docs), through `server`, the mailbox's view, if the caller has one. A detached
/// mailbox's ports are left untouched: the server no longer writes that memory.
fn carry_out(
    mailbox: &Attached,
    server: Option<&crate::protocol::ServerEnd<'_>>,
    index: u32,
    opcode: Opcode,
    marks: Marks,
    fate: Fate,
) {
    if mailbox.detached.load(Ordering::Acquire) {
        return;
    }
    if fate == Fate::Quarantine {
        let mut quarantine = lock(&mailbox.quarantine);
        quarantine.push(Quarantined {
            index,
            opcode,
            marks,
        });
        // RMW: one quarantined port more, under the lock (see `release_quarantined`).
        mailbox.quarantined.fetch_add(1, Ordering::Relaxed);
        return;
    }
    let built;
    let server = match server {
        Some(server) => server,
        None => {
            built = mailbox.server();
            &built
        }
    };
    if fate == Fate::Close {
        let owned = mailbox.owned[index as usize].load(Ordering::Relaxed);
        server.close(index, owned, &ExchangeWait)
    } else {
        server.drain(index, opcode.failure_word(), &ExchangeWait)
    }
}

/// Registers, for the tests and models of the passes, a script for `user(1)`: two packets in,
/// their sum back (the second recv suspends until the client sends it).
#[cfg(test)]
pub(crate) fn register_two_packet_sum(server: &crate::RpcServer) {
    server.register(Opcode::user(1), |mut req| async move {
        let (mut a, mut b) = (0, 0);
        req.recv(|_, p| a = p.word(0)).await?;
        req.recv(|_, p| b = p.word(0)).await?;
        req.send(|_, p| p.set_word(0, a + b)).await
    });
}

/// Opens `opcode` on port `index` for one lane, yielding until the port is free.
#[cfg(test)]
pub(crate) fn open_when_free<'a>(
    client: &'a crate::protocol::Client<'a>,
    index: u32,
    opcode: Opcode,
) -> crate::protocol::ClientPort<'a> {
    loop {
        if let Some(port) = client.try_open_at(index, opcode, 1).unwrap() {
            return port;
        }
        crate::sync::thread::yield_now();
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::protocol::scan::HOT_STRIDE;
    use crate::protocol::{Client, Generation, Layout, LockTable, MailboxMemory, Spin};
    use crate::sync::AtomicBool;
    use crate::RpcServer;

    /// Passes that yield at every quiet checkpoint, as in the loaded regime, serve every port
    /// of a mailbox of two strides, also while two exchanges wait in flight (so the passes
    /// defer their flips, which go out before each yield).
    #[test]
    fn passes_that_yield_within_the_scan_serve_every_port() {
        const PORTS: u32 = 2 * HOT_STRIDE as u32;
        let server = RpcServer::new(Default::default());
        register_two_packet_sum(&server);
        let memory = Arc::new(MailboxMemory::new(
            Layout::new(Generation::V1, PORTS, 1).unwrap(),
        ));
        server.attach(std::boxed::Box::new(memory.clone()));
        let _user = server.user();
        let locks = LockTable::new(PORTS);
        let done = AtomicBool::new(false);
        std::thread::scope(|s| {
            s.spawn(|| {
                let mut cache = PassCache::new();
                while !done.load(Ordering::Relaxed) {
                    // A yield that ran nobody clears it; here every pass yields.
                    cache.yield_every = Some(HOT_STRIDE);
                    Inner::serve_pass(&server.inner, &mut cache);
                }
                cache.clear(&server.inner.context, Fate::Drain, "test over");
            });
            let client = Client::new(memory.view(), locks.words())
                .unwrap()
                .with_wait(&Spin);
            let waiting = [300, PORTS - 300].map(|index| {
                let mut port = open_when_free(&client, index, Opcode::user(1));
                port.send(|_, p| p.set_word(0, u64::from(index))).unwrap();
                (index, port)
            });
            for index in [0, HOT_STRIDE as u32 - 1, HOT_STRIDE as u32, PORTS - 1] {
                let mut port = open_when_free(&client, index, Opcode::TEST_INCREMENT);
                let mut got = 0;
                port.send_and_recv(
                    |_, p| p.set_word(0, u64::from(index)),
                    |_, p| got = p.word(0),
                )
                .unwrap();
                assert_eq!(got, u64::from(index) + 1, "port {index}");
            }
            for (index, mut port) in waiting {
                let mut sum = 0;
                port.send_and_recv(|_, p| p.set_word(0, 1), |_, p| sum = p.word(0))
                    .unwrap();
                assert_eq!(sum, u64::from(index) + 1, "port {index}");
            }
            done.store(true, Ordering::Relaxed);
        });
    }
}

//! The executor: the exchanges of script handlers kept in flight between passes, polled,
//! and ended (the pass that opens ports and drives this is `dispatch`), each in a block of
//! memory its thread reuses (its `Exchange` block), with the per-thread context through which the
//! executor and the exchange it polls talk (`context.rs`).
//!
//! # Resumable exchanges
//! A port's exchange is a script of packets. A packet handler's script is one packet each way
//! and runs to completion when the port opens (the client's packet is already there). A script
//! handler's exchange is a future (an `async` function of its `Request`, see
//! [`crate::server::registry`]): it runs until it needs a packet the client has not sent yet
//! (or the result of a call on the I/O threads), and then *suspends*. The pass keeps it in flight and
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
//! Whether a waiting exchange's kernels are gone, or its client timed out, is looked at in the
//! housekeeping passes (`dispatch::HOUSEKEEPING_PASSES`).
//! An exchange alone in flight is polled with a budget of spin waits (`context`): its
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
//! `dispatch`'s `Inner::start`, and never run; its next open writes a fresh header, and is
//! served at once. So an abandoned client runs the rest of its script on failure replies and gives the port
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
//! the buffer (in the executor's context: the poll it was dropped in returns it); the executor
//! then carries out the port's [`Fate`]: closing hands a buffer we owned back (a flip of our
//! word) and unlocks; draining marks, answers if the buffer is ours, and
//! unlocks. A timed-out client process may be alive after all, and other processes may take the
//! port the moment it looks free: the mark serves both (their fresh headers are requests, the
//! slow client's packets are not).
//!
//! # An exchange's block
//! The block an exchange lives in: a script handler's future, pinned in memory that goes back
//! to this thread's pool (the recycled memory below) when the exchange ends, for the next exchange of its
//! layout, instead of to the allocator.
//!
//! # Recycled memory
//! Memory a finished exchange leaves behind, kept for the next exchanges of the same thread:
//! the block that held its future (`exec`'s `Exchange`, through [`take_block`] and
//! [`give_block`]), the buffers of its `recv_n` results ([`Received`]) and of the vectors a
//! service made for it ([`PooledVec`]).
//!
//! Why: a server thread with many exchanges in flight (the pipelined rows of
//! docs/performance.md) ends a score of them in one pass and begins as many in the next. The C
//! library's per-thread cache keeps only a few blocks of each size (glibc: 7, and none above
//! 1 KiB), so most of those allocations took the allocator's slow path: a fifth of the server
//! thread's instructions on a printf of one lane. The pool is per thread (no lock; memory freed
//! on another thread, an I/O thread's, joins that thread's pool) and bounded in bytes
//! ([`KEEP_BYTES`]); what does not fit goes back to the allocator.
//!
//! Besides, the server thread keeps the buffers of the last `recv_n` too large for that budget
//! (1 MiB byte strings: [`keep_large_received`]), until it has served nothing for
//! [`KEEP_LARGE_FOR`] ([`release_large`]). A `recv_n` grows its vectors as the bytes come
//! (never by the length a client claims, `docs/reliability.md`), so each 1 MiB byte string into
//! new vectors reallocated and copied them some 5 times: about a tenth of a 32-lane
//! TEST_STREAM's time (`docs/performance.md`). What is kept grew to hold bytes a client really
//! sent, so it is at most about twice what a request may carry (`Limits::request_bytes`), and
//! kept only while large byte strings keep coming.

use crate::protocol::opcode::Opcode;
use crate::protocol::ServerEnd;
use crate::server::error::{Outcome, ServerError};
use crate::server::limits::device_log;
use crate::server::limits::Charge;
use crate::server::mailboxes::Opened;
use crate::server::stats::bump;
use crate::server::{panic_message, Attached, Inner, ServerContext};
use crate::sync::{lock, Arc, Ordering};
use std::alloc::Layout;
use std::cell::RefCell;
use std::future::Future;
use std::mem::ManuallyDrop;
use std::ops::{Deref, DerefMut};
use std::pin::Pin;
use std::ptr::NonNull;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use std::vec::Vec;

mod context;

pub(super) use context::{alone, note_dropped, note_yielded};
pub(crate) use context::{publish, Batching, ExchangeWait};

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
    pub(crate) fn flight_of(&self, index: u32) -> Option<usize> {
        let word = self.in_flight[index as usize].load(Ordering::Relaxed);
        (word as usize).checked_sub(1)
    }

    /// Records where port `index`'s exchange is in the worker's [`Flights`] (`None`: it has
    /// none). Relaxed: as `flight_of`.
    fn set_flight(&self, index: u32, position: Option<usize>) {
        let word = position.map_or(0, |k| k as u32 + 1);
        self.in_flight[index as usize].store(word, Ordering::Relaxed);
    }

    /// Stops serving a mailbox whose part of a pass panicked (a plugin's memory source, say):
    /// logged once and counted in `panics`; its exchanges end as if it were detached (its
    /// memory untouched), and the other mailboxes are served on. The owner should detach it.
    pub(crate) fn fail(&self, context: &ServerContext, panic: &(dyn std::any::Any + Send)) {
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
}

/// Which exchanges in flight a poll of them looks at.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Look {
    /// Those that can advance (see `Inner::step`), and of the others whether their kernels
    /// are gone or their client timed out.
    Housekeeping,
    /// Those that can advance: not waiting on their port, or their client has answered.
    Ready,
    /// Those not waiting on their port: a yielded exchange or one waiting on an I/O call. The
    /// sweep that follows polls the others where it finds their ports pending.
    OffPort,
}

/// Where a pass stands: the server, the attached mailbox it serves and its one view of that
/// mailbox (`server`), which every port of that mailbox is opened, polled and closed through.
#[derive(Clone, Copy)]
pub(crate) struct Site<'a> {
    pub(crate) inner: &'a Arc<Inner>,
    pub(crate) mailbox: &'a Arc<Attached>,
    pub(crate) server: &'a ServerEnd<'a>,
}

impl<'a> Site<'a> {
    pub(crate) fn context(&self) -> &'a ServerContext {
        &self.inner.context
    }
}

/// Runs `part` of a pass at `mailbox`, through one view of it made for the part. A panic there
/// (its memory source, a matcher) costs this mailbox only: see `Attached::fail`; the part then
/// made no progress. Returns the part's progress.
pub(crate) fn in_part(
    inner: &Arc<Inner>,
    mailbox: &Arc<Attached>,
    part: impl FnOnce(Site<'_>) -> usize,
) -> usize {
    let served = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let server = mailbox.server();
        part(Site {
            inner,
            mailbox,
            server: &server,
        })
    }));
    served.unwrap_or_else(|panic| {
        mailbox.fail(&inner.context, panic.as_ref());
        0
    })
}

/// One exchange in flight.
pub(crate) struct InFlight {
    /// The rest of the script; owns its `Request` and so the port.
    exchange: Exchange,
    pub(crate) mailbox: Arc<Attached>,
    /// Its port, opcode and users' marks.
    pub(crate) opened: Opened,
    /// Both flags of the port when last seen changing.
    flags: (u32, u32),
    /// For `client_timeout`: when a poll first found the exchange waiting on its port without
    /// progress since it last advanced (`None`: it advanced, or left its port, at the last
    /// look). Read from the clock only then, so an exchange that keeps advancing (a stream:
    /// a packet per poll) never reads it.
    since: Option<Instant>,
    /// The last poll suspended in a port operation: no use polling again until the client
    /// has answered (the port is pending again).
    pub(crate) on_port: bool,
    /// Whether its request owned the buffer when it was dropped (false while it lives): the
    /// poll it was dropped in says so.
    owned: bool,
}

/// The exchanges in flight, each found from its port through `Attached::in_flight`, which
/// every change of the list keeps current (the one place positions change).
pub(crate) struct Flights(Vec<InFlight>);

impl Flights {
    pub(crate) fn len(&self) -> usize {
        self.0.len()
    }

    pub(crate) fn get(&self, k: usize) -> &InFlight {
        &self.0[k]
    }

    fn get_mut(&mut self, k: usize) -> &mut InFlight {
        &mut self.0[k]
    }

    fn push(&mut self, flight: InFlight) {
        flight
            .mailbox
            .set_flight(flight.opened.index, Some(self.0.len()));
        self.0.push(flight);
    }

    /// Takes exchange `k` out of the list (the last one takes its place).
    pub(crate) fn swap_remove(&mut self, k: usize) -> InFlight {
        let flight = self.0.swap_remove(k);
        flight.mailbox.set_flight(flight.opened.index, None);
        if let Some(moved) = self.0.get(k) {
            moved.mailbox.set_flight(moved.opened.index, Some(k));
        }
        flight
    }

    /// Ends every exchange that `ends` picks ([`abandon`] with `fate` and `reason`); returns
    /// how many.
    pub(crate) fn abandon_where(
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

impl Flights {
    /// The exchanges in flight: none.
    pub(crate) fn new() -> Self {
        Flights(Vec::new())
    }

    /// Polls the exchange just started on the port `opened` of `site`'s mailbox once: ends it
    /// if it completed, keeps it in flight if it suspended (written once, where it stays, not
    /// returned and copied).
    #[inline]
    pub(crate) fn run(&mut self, site: Site<'_>, opened: Opened, mut exchange: Exchange) {
        let mut owned = false;
        let port = (&**site.mailbox, opened.index);
        let on_port = match poll(&mut exchange, false, port, &mut owned) {
            Polled::OnPort => true,
            Polled::Elsewhere | Polled::Yielded => false,
            Polled::Done(result) => {
                end(site, opened, (exchange, result, owned));
                return;
            }
        };
        self.push(InFlight {
            exchange,
            on_port,
            owned,
            mailbox: site.mailbox.clone(),
            opened,
            flags: site.server.flags(opened.index),
            since: None,
        });
    }

    /// Polls the exchanges in flight of every mailbox that `look` picks, with one view of
    /// each mailbox. Returns how many made progress.
    pub(crate) fn poll_all(
        &mut self,
        inner: &Arc<Inner>,
        mailboxes: &[Arc<Attached>],
        look: Look,
    ) -> usize {
        if self.len() == 0 {
            return 0;
        }
        let mut progress = 0;
        for mailbox in mailboxes {
            if mailbox.detached.load(Ordering::Acquire) {
                continue;
            }
            progress += in_part(inner, mailbox, |site| self.poll_of(site, look));
        }
        progress
    }

    /// [`Flights::poll_all`] for the exchanges of `site`'s mailbox.
    pub(crate) fn poll_of(&mut self, site: Site<'_>, look: Look) -> usize {
        let mut progress = 0;
        let mut k = 0;
        while k < self.len() {
            let flight = self.get(k);
            let skip = !Arc::ptr_eq(&flight.mailbox, site.mailbox)
                || (look == Look::OffPort && flight.on_port);
            if skip {
                k += 1;
                continue;
            }
            let (found, ended) = self.step(site, k, look == Look::Housekeeping);
            progress += found;
            if !ended {
                k += 1;
            }
        }
        progress
    }

    /// Polls exchange `k` (of `site`'s mailbox) unless it waits for a client that has not
    /// answered, and ends it if it completed or, with `housekeeping`, can no longer be
    /// answered. Returns how much progress it made and whether it ended (then the list's last
    /// exchange took its place).
    pub(crate) fn step(&mut self, site: Site<'_>, k: usize, housekeeping: bool) -> (usize, bool) {
        let Site {
            mailbox, server, ..
        } = site;
        let context = site.context();
        let alone = self.len() == 1;
        let flight = self.get_mut(k);
        // Polled before asking whether its kernel is gone: a kernel's last packet (EXIT's
        // status) may come just before it ends. Not polled while it waits for a client that
        // has not answered (the port not pending): that poll could only suspend again, and
        // its flags cannot have changed, so only housekeeping has anything to look at.
        let waiting = flight.on_port && !server.is_pending(flight.opened.index);
        if waiting && !housekeeping {
            return (0, false);
        }
        let mut progress = 0;
        let polled = if waiting {
            Polled::OnPort
        } else {
            let port = (&**mailbox, flight.opened.index);
            poll(&mut flight.exchange, alone, port, &mut flight.owned)
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
            let flight = self.swap_remove(k);
            end(site, flight.opened, (flight.exchange, result, flight.owned));
            return (progress + 1, true);
        }
        let flags = server.flags(flight.opened.index);
        if flags != flight.flags {
            flight.flags = flags;
            flight.since = None;
            return (progress + 1, false);
        }
        if flight.opened.marks.gone(mailbox, context) {
            let flight = self.swap_remove(k);
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
            let flight = self.swap_remove(k);
            abandon(context, flight, Fate::Drain, "the client timed out");
            return (progress, true);
        }
        (progress, false)
    }
}

/// Ends a completed exchange (`ended`: the exchange, its result, and whether its request owned
/// the buffer when dropped): its block goes back to the thread's pool (its request went when
/// the script returned), then [`finish`].
fn end(site: Site<'_>, opened: Opened, ended: (Exchange, Result<Outcome, ServerError>, bool)) {
    let (exchange, result, owned) = ended;
    drop(exchange);
    finish(site, opened, result, owned);
}

/// Logs and counts how the request on the port `opened` of `site`'s mailbox ended (settling
/// it: see `Attached::settle_request`), then carries out the fate that result calls for;
/// `owned`: whether the request owned the buffer when it was dropped.
pub(crate) fn finish(
    site: Site<'_>,
    opened: Opened,
    result: Result<Outcome, ServerError>,
    owned: bool,
) {
    let (index, opcode) = (opened.index, opened.opcode);
    let fate = count(site.context(), site.mailbox, index, opcode, result);
    site.mailbox.settle_request();
    carry_out(site.mailbox, Some(site.server), opened, owned, fate);
}

/// [`finish`]'s logging and counting, without the settling: for a request counted before its
/// hand-overs (a packet handler's), which never began to settle.
pub(crate) fn count(
    context: &ServerContext,
    mailbox: &Attached,
    index: u32,
    opcode: Opcode,
    result: Result<Outcome, ServerError>,
) -> Fate {
    let name = &context.config.name;
    let id = mailbox.id.0;
    match result {
        Ok(Outcome::Served) => {
            context.stats.served(opcode);
            Fate::Close
        }
        Ok(Outcome::Refused(why)) => {
            device_log!(
                context.log_limit,
                Warn,
                "{name}: mailbox {id} port {index}: {opcode} refused: {why}"
            );
            bump(&context.stats.refused);
            context.stats.served(opcode);
            Fate::Close
        }
        Err(error) => {
            // A stream claim above the bounds, a broken exchange, a handler's panic: the
            // device's doing (it may make a handler panic again and again: within the log's
            // budget too).
            device_log!(
                context.log_limit,
                Error,
                "{name}: mailbox {id} port {index}: {opcode} failed: {error}; port drained"
            );
            let stats = &context.stats;
            let counter = match error {
                ServerError::Panicked(_) => &stats.panics,
                _ => &stats.errors,
            };
            bump(counter);
            Fate::Drain
        }
    }
}

/// Ends an exchange that can no longer go on, logging and counting it. Its port is drained or
/// quarantined, never closed: its request is dropped here, outside any poll, so whether it owned
/// the buffer is not known (nor needed).
pub(crate) fn abandon(context: &ServerContext, flight: InFlight, fate: Fate, reason: &str) {
    debug_assert!(fate != Fate::Close, "an abandoned exchange is not closed");
    let InFlight {
        exchange,
        mailbox,
        opened,
        ..
    } = flight;
    let (index, opcode) = (opened.index, opened.opcode);
    let action = match fate {
        Fate::Drain => "port drained",
        Fate::Close => "port freed",
        Fate::Quarantine => "port left locked",
    };
    drop(exchange);
    carry_out(&mailbox, None, opened, false, fate);
    // Logged once done, so whoever reads the line finds the port as it says. A device (a
    // client that went silent or timed out) can cause any number of these: within the budget.
    device_log!(
        context.log_limit,
        Warn,
        "{}: mailbox {} port {index}: {opcode} abandoned: {reason}; {action}",
        context.config.name,
        mailbox.id.0
    );
    // Release, not `bump`: the exchange's drop (its calls still queued for an I/O thread see
    // it: `io_pool::run`) happens before whatever a reader of the count does next (a test
    // that sees it counted and then lets the I/O thread go on); pairs with the snapshot's
    // acquire. (On x86 the same locked add as `bump`.)
    context.stats.abandoned.fetch_add(1, Ordering::Release);
    mailbox.settle_request();
}

/// Does to the port `opened` what its exchange's fate says, once its request is gone (see the
/// module docs), through `server`, the mailbox's view, if the caller has one; `owned`: whether
/// the request owned the buffer, which a close hands back. A detached mailbox's ports are left
/// untouched: the server no longer writes that memory.
pub(crate) fn carry_out(
    mailbox: &Attached,
    server: Option<&ServerEnd<'_>>,
    opened: Opened,
    owned: bool,
    fate: Fate,
) {
    if mailbox.detached.load(Ordering::Acquire) {
        return;
    }
    if fate == Fate::Quarantine {
        let mut quarantine = lock(&mailbox.quarantine);
        quarantine.push(opened);
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
        server.close(opened.index, owned, &ExchangeWait)
    } else {
        server.drain(opened.index, opened.opcode.failure_word(), &ExchangeWait)
    }
}

/// How a poll of an exchange went.
enum Polled {
    Done(Result<Outcome, ServerError>),
    /// Suspended in a port operation: the client has not answered.
    OnPort,
    /// Suspended on something else (an I/O call, a user's future).
    Elsewhere,
    /// Suspended in `Request::yield_now`, to be polled again soon.
    Yielded,
}

/// Polls the exchange of `port` (its mailbox and index) once, with a no-op waker (nothing
/// wakes an exchange: the passes look at every port anyway). One `alone` in flight may spin for
/// its client's answer (`context::ALONE_SPIN_WAITS`) before suspending, and goes on at once
/// from a `Request::yield_unless_alone`. A panic inside it ends it as
/// [`ServerError::Panicked`]. If its request is dropped in this poll, `owned` says whether the
/// request owned the buffer.
fn poll(
    exchange: &mut Exchange,
    alone: bool,
    (mailbox, index): (&Attached, u32),
    owned: &mut bool,
) -> Polled {
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    let polling = context::Polling::enter(alone);
    let polled = catch(|| Ok(exchange.poll(&mut cx)));
    let seen = polling.leave(mailbox, index);
    if let Some(was) = seen.owned {
        *owned = was;
    }
    match polled {
        Ok(std::task::Poll::Pending) if seen.on_port => Polled::OnPort,
        Ok(std::task::Poll::Pending) if seen.yielded => Polled::Yielded,
        Ok(std::task::Poll::Pending) => Polled::Elsewhere,
        Ok(std::task::Poll::Ready(result)) => Polled::Done(result),
        Err(error) => Polled::Done(Err(error)),
    }
}

/// Runs `f`, turning a panic into [`ServerError::Panicked`] with its message.
pub(crate) fn catch<T>(f: impl FnOnce() -> Result<T, ServerError>) -> Result<T, ServerError> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f))
        .unwrap_or_else(|panic| Err(ServerError::Panicked(panic_message(panic.as_ref()))))
}

/// Yields the CPU, and says whether another thread ran meanwhile: a yield that finds no other
/// thread ready is a system call (some 170 ns here), one that runs another is two context
/// switches and that thread's turn, some µs. Only how soon the worker yields depends on the
/// answer (its back-off, `PassCache::yield_every`): a wrong one costs some yields or spins,
/// never a request.
pub(crate) fn yield_to_others() -> bool {
    crate::protocol::port::CROWDING.yield_now() > YIELD_ALONE
}

/// The longest yield counted as one that ran nobody else (see [`yield_to_others`]).
const YIELD_ALONE: Duration = Duration::from_micros(1);

/// The future of a script handler's exchange.
type Script = dyn Future<Output = Result<Outcome, ServerError>> + Send + 'static;

/// What a script handler returns: the rest of the exchange, pinned in a block of memory that
/// goes back to this thread's pool when the exchange ends (a `Pin<Box<dyn Future>>` whose
/// block is reused).
pub(crate) struct Exchange(NonNull<Script>);

// SAFETY: the future is `Send` (`Exchange::new` requires it) and only the `Exchange` reaches
// it, so the `Exchange` may move to another thread with it.
unsafe impl Send for Exchange {}

impl Exchange {
    pub(crate) fn new<F>(future: F) -> Self
    where
        F: Future<Output = Result<Outcome, ServerError>> + Send + 'static,
    {
        let layout = Layout::new::<F>();
        let block: NonNull<F> = if layout.size() == 0 {
            NonNull::dangling()
        } else {
            take_block(layout)
                .unwrap_or_else(|| {
                    // SAFETY: `layout` has a nonzero size.
                    let raw = unsafe { std::alloc::alloc(layout) };
                    NonNull::new(raw).unwrap_or_else(|| std::alloc::handle_alloc_error(layout))
                })
                .cast()
        };
        // SAFETY: `block` is valid for a write of an `F` and aligned for it: allocated (now or
        // for an earlier exchange) with `F`'s layout, or dangling and `F` has no size.
        unsafe { block.as_ptr().write(future) };
        Exchange(block)
    }

    /// Polls the future once.
    pub(crate) fn poll(&mut self, cx: &mut Context<'_>) -> Poll<Result<Outcome, ServerError>> {
        // SAFETY: the future lives in its block, never moved, until `drop` drops it in place:
        // it is pinned. `&mut self` makes this the only reference to it.
        unsafe { Pin::new_unchecked(self.0.as_mut()) }.poll(cx)
    }
}

impl Drop for Exchange {
    fn drop(&mut self) {
        // SAFETY: the future is alive until the line after (see `poll`).
        let layout = Layout::for_value(unsafe { self.0.as_ref() });
        // SAFETY: as above; it is dropped once, here, and its block not read again but to be
        // reused or freed. (Should its destructor panic, the block leaks: no harm.)
        unsafe { self.0.as_ptr().drop_in_place() };
        if layout.size() == 0 {
            return;
        }
        let block = self.0.cast::<u8>();
        let kept = give_block(block, layout);
        if !kept {
            // SAFETY: `block` was allocated by the global allocator with `layout` and is no
            // longer used.
            unsafe { std::alloc::dealloc(block.as_ptr(), layout) };
        }
    }
}

#[cfg(test)]
mod exchange_tests {
    use super::*;

    fn exchange_of(bytes: [u8; 100]) -> Exchange {
        Exchange::new(async move {
            if bytes[99] == 7 {
                Ok(Outcome::Served)
            } else {
                Ok(Outcome::Refused("not seven".into()))
            }
        })
    }

    fn poll_once(exchange: &mut Exchange) -> Poll<Result<Outcome, ServerError>> {
        exchange.poll(&mut Context::from_waker(std::task::Waker::noop()))
    }

    #[test]
    fn an_ended_exchange_block_serves_the_next_exchange_of_its_layout() {
        let first = exchange_of([7; 100]);
        let block = first.0.cast::<u8>();
        drop(first);
        let mut second = exchange_of([1; 100]);
        assert_eq!(second.0.cast::<u8>(), block, "the freed block was reused");
        assert!(matches!(
            poll_once(&mut second),
            Poll::Ready(Ok(Outcome::Refused(_)))
        ));
        let mut third = exchange_of([7; 100]);
        assert_ne!(
            third.0.cast::<u8>(),
            block,
            "a block in use is not handed out"
        );
        assert!(matches!(
            poll_once(&mut third),
            Poll::Ready(Ok(Outcome::Served))
        ));
    }
}

/// The most bytes one thread's pool keeps (blocks and buffer capacity together): a few hundred
/// exchanges' worth of printf state.
pub(crate) const KEEP_BYTES: usize = 256 << 10;

/// How long a silent server thread keeps the buffers of a `recv_n` larger than its budget.
pub(crate) const KEEP_LARGE_FOR: std::time::Duration = std::time::Duration::from_secs(1);

/// A vector whose buffer comes from this thread's pool of blocks, and goes back to it when
/// the vector is dropped (emptied): for the vectors a busy service makes for every request
/// (printf's active lanes and parsed formats), which the C library's per-thread cache could
/// not keep with dozens of exchanges in flight (docs/performance.md).
pub(crate) struct PooledVec<T>(ManuallyDrop<Vec<T>>);

impl<T> PooledVec<T> {
    /// An empty vector with room for `capacity` elements, in a kept block where there is one.
    pub(crate) fn with_capacity(capacity: usize) -> Self {
        let kept = Layout::array::<T>(capacity)
            .ok()
            .filter(|layout| layout.size() > 0)
            .and_then(|layout| with_pool(|pool| pool.take_block(layout)).flatten());
        PooledVec(ManuallyDrop::new(match kept {
            // SAFETY: the block was allocated by the global allocator with the layout of
            // `capacity` `T`s (by `Drop` below, from a vector of that capacity, or by the
            // allocator for one), which is what a vector of that capacity owns; it is unused.
            Some(block) => unsafe { Vec::from_raw_parts(block.as_ptr().cast(), 0, capacity) },
            None => Vec::with_capacity(capacity),
        }))
    }
}

impl<T> Deref for PooledVec<T> {
    type Target = Vec<T>;
    fn deref(&self) -> &Vec<T> {
        &self.0
    }
}

impl<T> DerefMut for PooledVec<T> {
    fn deref_mut(&mut self) -> &mut Vec<T> {
        &mut self.0
    }
}

impl<'v, T> IntoIterator for &'v PooledVec<T> {
    type Item = &'v T;
    type IntoIter = core::slice::Iter<'v, T>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

impl<'v, T> IntoIterator for &'v mut PooledVec<T> {
    type Item = &'v mut T;
    type IntoIter = core::slice::IterMut<'v, T>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.iter_mut()
    }
}

impl<T> Drop for PooledVec<T> {
    fn drop(&mut self) {
        // SAFETY: taken once, here; the field is not used again.
        let mut vec = unsafe { ManuallyDrop::take(&mut self.0) };
        vec.clear();
        let Some(layout) = Layout::array::<T>(vec.capacity())
            .ok()
            .filter(|layout| layout.size() > 0)
        else {
            return;
        };
        let block = NonNull::new(vec.as_mut_ptr().cast::<u8>()).expect("a buffer of that size");
        if with_pool(|pool| pool.give_block(block, layout)).unwrap_or(false) {
            // The pool owns the block now (a vector allocates exactly its capacity's layout).
            core::mem::forget(vec);
        }
    }
}

/// The byte strings one `recv_n` received, one per lane (index = lane; inactive lanes'
/// strings are empty). Read it as a slice of vectors; its buffers go back to this thread's
/// pool when it is dropped ([`Received::into_vec`] keeps them instead), and with them the
/// charge they hold on the server's memory budget (`Limits::held_bytes`).
#[derive(Debug, Default)]
pub struct Received {
    strings: Vec<Vec<u8>>,
    /// What the strings hold of the memory budget (none if they fit their first packet).
    _charge: Option<Charge>,
    refused: bool,
}

impl Received {
    /// Buffers from this thread's pool where it has some, for a `recv_n` to empty and fill.
    /// The large set kept (see the module docs) comes first: a `recv_n` cannot know how much
    /// it will receive, and one that gets a small set grows it again (a printf between two
    /// large ones would leave only small sets on top); a small request that takes the large set
    /// gives it back when it ends.
    pub(crate) fn buffers() -> Vec<Vec<u8>> {
        with_pool(|pool| {
            pool.large.take().or_else(|| {
                let buffers = pool.received.pop()?;
                pool.bytes -= kept_bytes(&buffers);
                Some(buffers)
            })
        })
        .flatten()
        .unwrap_or_default()
    }

    /// Strings received under `charge`; `refused`: the memory budget had no room for them,
    /// so they were dropped as they came (every lane empty).
    pub(crate) fn new(strings: Vec<Vec<u8>>, charge: Option<Charge>, refused: bool) -> Self {
        Received {
            strings,
            _charge: charge,
            refused,
        }
    }

    /// Whether the server's memory budget (`Limits::held_bytes`) refused these strings: they
    /// were received and dropped, and every lane's is empty. The handler answers with its
    /// error value.
    pub fn refused(&self) -> bool {
        self.refused
    }

    /// The strings as vectors of their own (not returned to the pool; their charge on the
    /// memory budget is released now).
    pub fn into_vec(mut self) -> Vec<Vec<u8>> {
        std::mem::take(&mut self.strings)
    }
}

impl Deref for Received {
    type Target = [Vec<u8>];
    fn deref(&self) -> &[Vec<u8>] {
        &self.strings
    }
}

impl DerefMut for Received {
    fn deref_mut(&mut self) -> &mut [Vec<u8>] {
        &mut self.strings
    }
}

impl Drop for Received {
    fn drop(&mut self) {
        let buffers = std::mem::take(&mut self.strings);
        if buffers.capacity() == 0 {
            return;
        }
        let bytes = kept_bytes(&buffers);
        with_pool(|pool| {
            if pool.bytes + bytes <= KEEP_BYTES {
                pool.bytes += bytes;
                pool.received.push(buffers);
            } else if pool.keeps_large && bytes > KEEP_BYTES {
                // The last one kept: a set kept before is freed.
                pool.large = Some(buffers);
            }
        });
    }
}

/// The bytes a set of `recv_n` buffers holds, as the pool counts them. Found again when the set
/// is taken rather than kept beside it: a pushed `(buffers, bytes)` pair was written field by
/// field and copied in wider moves, a load the store buffer cannot forward, which waited for
/// the exchange's stores to shared memory (see `protocol::deferred`): 3% of the server's time
/// in the pipelined printf row.
fn kept_bytes(buffers: &Vec<Vec<u8>>) -> usize {
    buffers.capacity() * core::mem::size_of::<Vec<u8>>()
        + buffers.iter().map(Vec::capacity).sum::<usize>()
}

/// This thread keeps the buffers of the last `recv_n` too large for [`KEEP_BYTES`], until
/// [`release_large`]: only for a thread that calls that when it goes quiet (the server
/// thread; an I/O thread would keep them for ever).
pub(crate) fn keep_large_received() {
    with_pool(|pool| pool.keeps_large = true);
}

/// Frees the `recv_n` buffers kept beyond [`KEEP_BYTES`], if any.
pub(crate) fn release_large() {
    let large = with_pool(|pool| pool.large.take()).flatten();
    // Freed outside the pool's borrow.
    drop(large);
}

/// A free block of `layout` from this thread's pool, if it keeps one (it is the caller's now:
/// allocated by the global allocator with `layout`, unused).
pub(crate) fn take_block(layout: Layout) -> Option<NonNull<u8>> {
    with_pool(|pool| pool.take_block(layout)).flatten()
}

/// Gives `block` (allocated by the global allocator with `layout`, no longer used) to this
/// thread's pool; false if the pool has no room for it (the caller frees it).
pub(crate) fn give_block(block: NonNull<u8>, layout: Layout) -> bool {
    with_pool(|pool| pool.give_block(block, layout)).unwrap_or(false)
}

/// One thread's kept memory.
#[derive(Default)]
struct Pool {
    /// Free blocks by layout (one entry per kind of future served on this thread, and per
    /// size of [`PooledVec`]).
    blocks: Vec<(Layout, Vec<NonNull<u8>>)>,
    /// Dropped `recv_n` results (their bytes not yet cleared).
    received: Vec<Vec<Vec<u8>>>,
    /// Bytes kept, blocks and buffers together (at most [`KEEP_BYTES`]).
    bytes: usize,
    /// The last dropped `recv_n` result too large for `bytes`, where `keeps_large`.
    large: Option<Vec<Vec<u8>>>,
    /// Set by [`keep_large_received`].
    keeps_large: bool,
}

impl Pool {
    fn take_block(&mut self, layout: Layout) -> Option<NonNull<u8>> {
        let (_, free) = self.blocks.iter_mut().find(|(kept, _)| *kept == layout)?;
        let block = free.pop()?;
        self.bytes -= layout.size();
        Some(block)
    }

    /// Keeps a free block of `layout` if the budget allows; says whether it did.
    fn give_block(&mut self, block: NonNull<u8>, layout: Layout) -> bool {
        if self.bytes + layout.size() > KEEP_BYTES {
            return false;
        }
        let free = match self.blocks.iter().position(|(kept, _)| *kept == layout) {
            Some(k) => &mut self.blocks[k].1,
            None => {
                self.blocks.push((layout, Vec::new()));
                &mut self.blocks.last_mut().expect("just pushed").1
            }
        };
        free.push(block);
        self.bytes += layout.size();
        true
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        for (layout, free) in &self.blocks {
            for block in free {
                // SAFETY: every kept block was allocated by the global allocator with its
                // entry's layout, and nothing uses it.
                unsafe { std::alloc::dealloc(block.as_ptr(), *layout) };
            }
        }
    }
}

std::thread_local! {
    static POOL: RefCell<Pool> = RefCell::new(Pool::default());
}

/// Runs `f` on this thread's pool; `None` while the thread is being torn down (its pool is
/// gone: the caller uses the allocator).
fn with_pool<T>(f: impl FnOnce(&mut Pool) -> T) -> Option<T> {
    POOL.try_with(|pool| pool.try_borrow_mut().ok().map(|mut pool| f(&mut pool)))
        .ok()
        .flatten()
}

#[cfg(test)]
mod recycle_tests {
    use super::*;

    #[test]
    fn a_dropped_pooled_vector_gives_its_buffer_to_the_next_of_its_capacity() {
        let live = std::rc::Rc::new(());
        let mut first = PooledVec::with_capacity(5);
        first.extend((0..3).map(|_| live.clone()));
        let buffer = first.as_ptr();
        drop(first);
        assert_eq!(
            std::rc::Rc::strong_count(&live),
            1,
            "its elements were dropped"
        );
        let second: PooledVec<std::rc::Rc<()>> = PooledVec::with_capacity(5);
        assert_eq!(second.as_ptr(), buffer, "the buffer was reused");
        assert_eq!((second.len(), second.capacity()), (0, 5));
        let other: PooledVec<std::rc::Rc<()>> = PooledVec::with_capacity(5);
        assert_ne!(other.as_ptr(), buffer, "a buffer in use is not handed out");
        // One that grew gives back the buffer it has, under that capacity's layout.
        let mut grown = PooledVec::with_capacity(1);
        grown.extend((0..40).map(|_| live.clone()));
        let (buffer, capacity) = (grown.as_ptr(), grown.capacity());
        drop(grown);
        let again: PooledVec<std::rc::Rc<()>> = PooledVec::with_capacity(capacity);
        assert_eq!(again.as_ptr(), buffer);
        assert_eq!(std::rc::Rc::strong_count(&live), 1);
    }

    #[test]
    fn the_pool_keeps_at_most_its_budget() {
        let blocks: Vec<PooledVec<u8>> = (0..2 * KEEP_BYTES / 8192)
            .map(|_| PooledVec::with_capacity(8192))
            .collect();
        drop(blocks);
        let kept = with_pool(|pool| pool.bytes).unwrap();
        assert!(kept <= KEEP_BYTES, "{kept} bytes kept");
        assert!(kept > KEEP_BYTES / 2, "{kept} bytes kept");
        let received: Vec<Received> = (0..64)
            .map(|_| Received::new(std::vec![std::vec![0u8; 8 << 10]], None, false))
            .collect();
        drop(received);
        let kept = with_pool(|pool| pool.bytes).unwrap();
        assert!(kept <= KEEP_BYTES, "{kept} bytes kept");
    }

    #[test]
    fn a_large_recv_n_is_kept_only_where_asked_and_until_released() {
        let large = || Received::new(std::vec![std::vec![9u8; 2 * KEEP_BYTES]], None, false);
        let capacity_of = |buffers: &[Vec<u8>]| buffers.first().map_or(0, Vec::capacity);
        // Run on threads of their own: the pool is per thread.
        std::thread::spawn(move || {
            drop(large());
            assert_eq!(capacity_of(&Received::buffers()), 0, "not kept unasked");
        })
        .join()
        .unwrap();
        std::thread::spawn(move || {
            keep_large_received();
            drop(large());
            let kept = Received::buffers();
            assert!(capacity_of(&kept) >= 2 * KEEP_BYTES, "kept when asked");
            drop(Received::new(kept, None, false));
            // The large set comes first, then the small ones.
            drop(Received::new(std::vec![std::vec![1u8; 10]], None, false));
            assert!(capacity_of(&Received::buffers()) >= 2 * KEEP_BYTES);
            assert!(capacity_of(&Received::buffers()) < KEEP_BYTES);
            drop(large());
            release_large();
            assert_eq!(capacity_of(&Received::buffers()), 0, "released");
        })
        .join()
        .unwrap();
    }

    #[test]
    fn dropped_received_strings_come_back_with_their_capacity() {
        let received = Received::new(
            std::vec![std::vec![5u8; 40], std::vec![6u8; 3]],
            None,
            false,
        );
        let capacity = received[0].capacity();
        drop(received);
        let buffers = Received::buffers();
        assert_eq!(buffers.len(), 2);
        assert_eq!(buffers[0].capacity(), capacity);
        // Taken out with `into_vec`, they stay with the caller.
        let out = Received::new(std::vec![std::vec![1, 2, 3]], None, false).into_vec();
        assert_eq!(out, std::vec![std::vec![1, 2, 3]]);
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// Pins the calling thread to `cpu`.
    #[cfg(all(target_os = "linux", not(miri)))]
    fn pin_to(cpu: usize) {
        // SAFETY: a zeroed `cpu_set_t` is an empty bit set; CPU_SET sets one bit of it, and
        // sched_setaffinity reads `size_of::<cpu_set_t>()` bytes of it for this thread only.
        let pinned = unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(cpu, &mut set);
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set)
        };
        assert_eq!(pinned, 0, "sched_setaffinity to CPU {cpu}");
    }

    #[test]
    #[cfg(all(target_os = "linux", not(miri)))]
    fn a_yield_that_lets_a_thread_on_this_cpu_run_says_so() {
        use crate::sync::AtomicBool;
        use Ordering::Relaxed;
        // SAFETY: sched_getcpu takes no arguments; it returns the CPU this thread is on.
        let cpu = usize::try_from(unsafe { libc::sched_getcpu() }).expect("sched_getcpu");
        pin_to(cpu);
        let (ready, stop) = (AtomicBool::new(false), AtomicBool::new(false));
        std::thread::scope(|s| {
            s.spawn(|| {
                pin_to(cpu);
                ready.store(true, Relaxed);
                while !stop.load(Relaxed) {
                    std::hint::spin_loop();
                }
            });
            while !ready.load(Relaxed) {
                std::thread::yield_now();
            }
            // The spinner is always ready on this CPU: the scheduler's fairness runs it at one
            // of these yields, however it picks (EEVDF may run the yielder again at first,
            // while the spinner is ahead of its share).
            let ran = (0..10_000).any(|_| yield_to_others());
            stop.store(true, Relaxed);
            assert!(ran, "no yield let the thread on this CPU run");
        });
    }
}

//! The one per-thread context through which the executor and the exchange it polls talk.
//!
//! A port operation that suspends, a `Request::yield_now`, a printf that asks whether it is
//! alone in flight, and every server port's flip and unlock happen deep inside an exchange's
//! poll, where only the port's [`Wait`] and the `Request` are at hand. The executor's wait,
//! [`ExchangeWait`], and the request reach this thread's [`Context`] (one `thread_local!`
//! holding one struct of cells, as tokio's `CONTEXT`), which the executor sets with a guard
//! that restores it when dropped:
//! - [`Polling`], for one poll of one exchange: whether it is alone in flight, the spin waits
//!   it may make ([`ALONE_SPIN_WAITS`]), and, once the poll returns, how it suspended (on its
//!   port, or yielded) and, if its request was dropped, whether the request owned the buffer
//!   (the port's state the executor needs to close it: returned by the poll as a value);
//! - [`Batching`], for a pass that begins with two or more exchanges in flight: the server
//!   ports' flips and unlocks wait in the context's [`Batch`] (`protocol::deferred`, which says
//!   why and when it goes out) and are published when the guard drops, at the latest.
//!
//! Another thread (an I/O thread, a thread a handler moved a request to) has a context of its
//! own, never entered: its flips are stored at once, it never spins, and nothing it notes is
//! read. Under loom the context is a `loom::thread_local!`, one per model thread (loom runs
//! them all on one thread of ours, whose `std` thread-local they would share), so the models
//! run the real guards.
//!
//! | field | written by | read by |
//! |---|---|---|
//! | `batch`, `batching` | [`Batching`]; the wait's `flip`, `unlock`, `publish` | the wait |
//! | `alone`, `spin_waits` | [`Polling`]; the wait's spins | the wait, `Request::yield_unless_alone` |
//! | `on_port`, `yielded` | the wait's `before_suspending`; `Request::yield_now` | [`Polling::leave`] |
//! | `dropped` | a `Request`'s drop | [`Polling::leave`] |

use crate::protocol::mailbox::unlock;
use crate::protocol::port::{store_own_word, Batch, CROWDING};
use crate::protocol::{ProtocolError, Wait};
use crate::server::Attached;
use crate::sync::{spin_hint, AtomicU32};
use core::cell::{Cell, RefCell};

/// The spin waits of an exchange alone in flight per poll: some 64 packets of a stream go by
/// in one poll, and a new request waits at most that many short spins. None under loom, where
/// each spin is a scheduling point.
#[cfg(not(loom))]
const ALONE_SPIN_WAITS: u32 = 64;
#[cfg(loom)]
const ALONE_SPIN_WAITS: u32 = 0;

/// The spin hints of one round of a spin wait (some 3 µs on this project's CPUs).
const SPINS_PER_WAIT: u32 = 128;

/// The rounds of spin hints in one wait, a `yield_now` between each two: some 30 µs in all.
/// With one round, a 32-lane stream's client (which writes and reads 32 packet lines a hand-
/// over, some 2 µs) often took longer now and then, its exchange suspended, and the worker's
/// back-off (its yields, then a park and a timer's wake-up) made that hand-over slow: with 8
/// rounds the L=32 stream row read 1.23-1.37x as much in A/B runs. The yields give the CPU
/// to a client that shares it; where the CPUs are crowded (`protocol::port::Crowding`) a
/// wait ends after its first round instead: each yield would hand a busy process a time
/// slice.
const ROUNDS_PER_WAIT: u32 = 8;

/// What the executor and the exchange it polls tell each other on this thread (see the module
/// docs for who writes and reads each field).
struct Context {
    /// The flips and unlocks deferred while `batching`.
    batch: RefCell<Batch>,
    /// Set while a [`Batching`] guard lives.
    batching: Cell<bool>,
    /// Whether the exchange being polled is alone in flight.
    alone: Cell<bool>,
    /// How many more times the exchange being polled may spin for its client's answer (up to
    /// [`SPINS_PER_WAIT`] spin hints a round) before it suspends. Zero but for an exchange
    /// alone in flight, whose client (a stream, say) usually answers within a cross-core
    /// transfer: its packets then go by inside one poll, without a return to the executor and
    /// a re-poll per packet.
    spin_waits: Cell<u32>,
    /// The exchange being polled suspended because its client has not answered: no use
    /// polling it again until the port's flags say the client answered.
    on_port: Cell<bool>,
    /// The exchange being polled suspended in `Request::yield_now`: it is polled again soon,
    /// and the poll counts as progress (nothing else would wake it).
    yielded: Cell<bool>,
    /// The last request dropped on this thread since a poll last took the note: its port, and
    /// whether it owned the buffer (the executor closes the port once the exchange ends).
    dropped: Cell<Option<Dropped>>,
}

/// A request dropped: its port (mailbox and index) and whether it owned the buffer.
#[derive(Clone, Copy)]
struct Dropped {
    /// The mailbox's address, compared only.
    mailbox: *const Attached,
    index: u32,
    owned: bool,
}

/// What a poll left in the context (read once it returned).
pub(super) struct Seen {
    /// It suspended because its client has not answered.
    pub(super) on_port: bool,
    /// It suspended in `Request::yield_now`.
    pub(super) yielded: bool,
    /// If its request was dropped: whether it owned the buffer.
    pub(super) owned: Option<bool>,
}

impl Context {
    /// Nothing entered.
    const fn new() -> Context {
        Context {
            batch: RefCell::new(Batch::EMPTY),
            batching: Cell::new(false),
            alone: Cell::new(false),
            spin_waits: Cell::new(0),
            on_port: Cell::new(false),
            yielded: Cell::new(false),
            dropped: Cell::new(None),
        }
    }

    /// Publishes the deferred flips and unlocks, if any.
    fn publish(&self) {
        self.batch.borrow_mut().publish();
    }

    /// Spins (and yields between rounds of spins) while `spin_waits` allows, until `answered`.
    /// A wait that runs out ends the spinning for the rest of the poll: that client is slow,
    /// and the server has other ports to look at.
    fn spin(&self, answered: &dyn Fn() -> bool) -> bool {
        let left = self.spin_waits.get();
        if left == 0 {
            return false;
        }
        self.spin_waits.set(left - 1);
        // The answer may wait on a flip of ours still deferred.
        self.publish();
        for round in 0..ROUNDS_PER_WAIT {
            if round > 0 {
                // Where the CPUs are crowded a yield costs a time slice: suspend instead.
                if CROWDING.skips_yields(round == 1) {
                    break;
                }
                let _ = CROWDING.yield_now();
            }
            for _ in 0..SPINS_PER_WAIT {
                spin_hint();
                if answered() {
                    return true;
                }
            }
        }
        self.spin_waits.set(0);
        false
    }
}

#[cfg(not(loom))]
std::thread_local! {
    static CONTEXT: Context = const { Context::new() };
}

// One per model thread (see the module docs).
#[cfg(loom)]
loom::thread_local! {
    static CONTEXT: Context = Context::new();
}

/// The context of one poll of an exchange, entered by [`Polling::enter`] and restored when
/// dropped (also when the poll panicked): no other exchange spins on what this one left, or
/// takes itself to be alone.
pub(super) struct Polling {
    /// What the context held before.
    alone: bool,
    spin_waits: u32,
}

impl Polling {
    /// Enters the poll of an exchange, `alone` in flight or not.
    pub(super) fn enter(alone: bool) -> Polling {
        CONTEXT.with(|c| {
            c.on_port.set(false);
            c.yielded.set(false);
            let spin_waits = if alone { ALONE_SPIN_WAITS } else { 0 };
            Polling {
                alone: c.alone.replace(alone),
                spin_waits: c.spin_waits.replace(spin_waits),
            }
        })
    }

    /// Leaves the poll of the exchange of port `index` of `mailbox`, restoring the context
    /// (as dropping the guard does), and says what the poll left: how it suspended and, if its
    /// request was dropped (in this poll, or before the first: a script that did not keep it),
    /// whether it owned the buffer. The note is taken either way: one of another port (a
    /// request a handler smuggled out of its exchange, or dropped outside any poll) tells
    /// nothing.
    pub(super) fn leave(self, mailbox: &Attached, index: u32) -> Seen {
        let seen = CONTEXT.with(|c| {
            c.alone.set(self.alone);
            c.spin_waits.set(self.spin_waits);
            Seen {
                on_port: c.on_port.get(),
                yielded: c.yielded.get(),
                owned: c
                    .dropped
                    .take()
                    .filter(|d| core::ptr::eq(d.mailbox, mailbox) && d.index == index)
                    .map(|d| d.owned),
            }
        });
        // Restored above, in the same visit of the context.
        core::mem::forget(self);
        seen
    }
}

impl Drop for Polling {
    fn drop(&mut self) {
        CONTEXT.with(|c| {
            c.alone.set(self.alone);
            c.spin_waits.set(self.spin_waits);
        });
    }
}

/// While it lives, this thread's server ports (those of [`ExchangeWait`]) defer their flips and
/// unlocks; dropped, it publishes them (see `protocol::deferred`).
pub(crate) struct Batching {
    /// A batch belongs to the thread whose context it turned on.
    _thread: core::marker::PhantomData<*const ()>,
}

impl Batching {
    /// Starts deferring this thread's server-side flips and unlocks.
    ///
    /// # Safety
    /// Every mailbox and lock table whose ports this thread flips or unlocks while the guard
    /// lives must stay valid until it is dropped (the server thread's pass holds its mailboxes
    /// for the whole pass).
    pub(crate) unsafe fn enter() -> Batching {
        CONTEXT.with(|c| {
            debug_assert!(!c.batching.get(), "one batch at a time");
            c.batching.set(true);
        });
        Batching {
            _thread: core::marker::PhantomData,
        }
    }
}

impl Drop for Batching {
    fn drop(&mut self) {
        CONTEXT.with(|c| {
            c.publish();
            c.batching.set(false);
        });
    }
}

/// Publishes what this thread deferred now (the sweep, before it yields the CPU).
pub(crate) fn publish() {
    CONTEXT.with(Context::publish);
}

/// Notes that the exchange being polled suspended in `Request::yield_now`.
pub(crate) fn note_yielded() {
    CONTEXT.with(|c| c.yielded.set(true));
}

/// Notes that the request of port `index` of `mailbox` was dropped, owning the buffer or not
/// (read by the poll it was dropped in, if any: see [`Polling::seen`]).
pub(crate) fn note_dropped(mailbox: &Attached, index: u32, owned: bool) {
    let mailbox = mailbox as *const Attached;
    CONTEXT.with(|c| {
        c.dropped.set(Some(Dropped {
            mailbox,
            index,
            owned,
        }))
    });
}

/// Whether the exchange being polled on this thread is alone in flight.
pub(crate) fn alone() -> bool {
    CONTEXT.with(|c| c.alone.get())
}

/// The wait of the exchanges the executor polls: suspends (after the spin waits the context
/// allows), notes that the exchange waits on its port, and defers its port's flips and unlocks
/// into the context's batch while one is entered. Only the server thread's poll enters the
/// context; elsewhere it is [`crate::protocol::Resumable`] that stores at once.
pub(crate) struct ExchangeWait;

impl Wait for ExchangeWait {
    fn pause(&self, _port: u32, _attempt: u32) -> Result<(), ProtocolError> {
        Ok(())
    }
    fn resumable(&self) -> bool {
        true
    }
    fn before_suspending(&self, answered: &dyn Fn() -> bool) -> bool {
        CONTEXT.with(|c| {
            let came = c.spin(answered);
            if !came {
                c.on_port.set(true);
            }
            came
        })
    }
    fn flip(&self, word: &AtomicU32, value: u32) {
        CONTEXT.with(|c| {
            if c.batching.get() {
                // SAFETY: the batch is on only while a `Batching` guard lives, whose maker keeps
                // every mailbox flipped under it valid until it drops, and it publishes then.
                unsafe { c.batch.borrow_mut().flip(word, value) };
            } else {
                store_own_word(word, value);
            }
        });
    }
    fn unlock(&self, locks: &[AtomicU32], index: u32) {
        CONTEXT.with(|c| {
            if c.batching.get() {
                // SAFETY: as in `flip`, for the lock tables.
                unsafe { c.batch.borrow_mut().unlock(locks, index) };
            } else {
                unlock(locks, index);
            }
        });
    }
    fn publish(&self) {
        publish();
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::protocol::port::batch_tests::{read, words};
    use crate::sync::Ordering;

    /// An exchange's wait spins only as its poll's context allows: not at all without a
    /// budget, until the answer within one, and a wait that runs out ends the spinning for the
    /// whole poll.
    #[test]
    fn spin_waits_bound_the_spinning_of_an_exchanges_waits() {
        let calls = Cell::new(0u32);
        let answered_at = |n: u32| {
            let calls = &calls;
            move || {
                calls.set(calls.get() + 1);
                calls.get() >= n
            }
        };
        let polling = Polling::enter(false);
        assert!(!ExchangeWait.before_suspending(&answered_at(1)));
        assert_eq!(calls.get(), 0, "no budget: not even one look");
        assert_eq!(
            CONTEXT.with(|c| (c.on_port.get(), c.yielded.get())),
            (true, false),
            "noted as waiting on its port"
        );
        drop(polling);

        let polling = Polling::enter(true);
        CONTEXT.with(|c| c.spin_waits.set(2));
        assert!(ExchangeWait.before_suspending(&answered_at(5)));
        assert_eq!(calls.get(), 5);
        assert_eq!(CONTEXT.with(|c| c.spin_waits.get()), 1, "one wait used");
        assert_eq!(
            CONTEXT.with(|c| (c.on_port.get(), c.yielded.get())),
            (false, false),
            "the answer came"
        );

        calls.set(0);
        assert!(!ExchangeWait.before_suspending(&answered_at(u32::MAX)));
        // A whole round at least; fewer than all where a crowded yield (of any test of this
        // process: the note is the process's) ended the rounds early.
        assert!(
            calls.get() % SPINS_PER_WAIT == 0
                && (SPINS_PER_WAIT..=SPINS_PER_WAIT * ROUNDS_PER_WAIT).contains(&calls.get()),
            "a wait looks SPINS_PER_WAIT times a round: {}",
            calls.get()
        );
        assert_eq!(
            CONTEXT.with(|c| c.spin_waits.get()),
            0,
            "a wait that ran out ends the spinning"
        );
        assert!(alone());
        drop(polling);
        assert!(!alone(), "the guard restores the context");
        assert_eq!(CONTEXT.with(|c| c.spin_waits.get()), 0);
    }

    /// Outside a `Batching` guard an exchange's flips and unlocks are stored at once; inside,
    /// they wait until the guard drops or the thread publishes (and a server port's reset, a
    /// store of its own word, publishes first: see `Port::reset`).
    #[test]
    fn an_exchanges_flips_wait_only_inside_a_batching_guard() {
        let (flags, locks) = (words(2), words(1));
        locks[0].store(0b111, Ordering::Relaxed);
        ExchangeWait.flip(&flags[1], 1);
        ExchangeWait.unlock(&locks, 0);
        assert_eq!(read(&flags), [0, 1]);
        assert_eq!(read(&locks), [0b110]);

        // SAFETY: the words outlive the guard.
        let batching = unsafe { Batching::enter() };
        ExchangeWait.flip(&flags[0], 1);
        ExchangeWait.unlock(&locks, 1);
        assert_eq!(read(&flags), [0, 1], "deferred");
        ExchangeWait.publish();
        assert_eq!(read(&flags), [1, 1]);
        assert_eq!(read(&locks), [0b100]);
        ExchangeWait.flip(&flags[0], 0);
        ExchangeWait.unlock(&locks, 2);
        assert_eq!((read(&flags), read(&locks)), (vec![1, 1], vec![0b100]));
        drop(batching);
        assert_eq!((read(&flags), read(&locks)), (vec![0, 1], vec![0]));
        ExchangeWait.flip(&flags[1], 0);
        assert_eq!(read(&flags), [0, 0], "ended: stored at once");
    }
}

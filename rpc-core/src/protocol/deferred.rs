//! Hand-overs published in batches: a server thread serving many exchanges at once stores its
//! flips (PROTOCOL section 3), and the unlocks of the ports whose exchanges they ended, a few
//! at a time instead of one by one.
//!
//! Why: a flip is a store to a cache line the client keeps reading (it polls for our word), so
//! the store waits in the CPU's store buffer while that line comes back, a cross-core round
//! trip. Stores leave the buffer in order, so the next locked instruction (a port's lock bit,
//! an `Arc` count, the allocator's lock) or the next load the buffer cannot forward (the moves
//! of odd-sized values after a hand-over are full of them) waits for that round trip too:
//! about one stall per flip: batching them made the pipelined printf row 17-25% faster
//! (docs/performance.md). Deferred, the flips of several exchanges go out together: their
//! lines are fetched at once, and the thread stalls once per batch.
//!
//! The price is latency, each deferred flip reaching its client later by the work done before
//! the batch is published: so the dispatcher defers only in passes that begin with two or more
//! exchanges in flight (a client that pipelines, or many warps), never for a request alone, and
//! at most [`MAX`] flips or unlocks wait.
//!
//! # Rules
//! - Only a live [`Batch`] defers, only on its own thread, and only server ports' flips and
//!   unlocks (`Port::hand_over`, a server port's drop, `ServerEnd::close`).
//! - A batch is published behind one release fence, the flips in the order they were made,
//!   then the unlocks: every packet written before a flip is visible before it (as with
//!   [`store_own_word`]), and a port's flips before its unlock, so whoever locks the port next
//!   reads our word as we left it.
//! - It is published when [`MAX`] flips or unlocks wait, when the batch ends (dropped), and
//!   before this thread waits for a client (`Port::poll_take`), writes its own word otherwise
//!   (`store_own_word`: a reset) or reads it to flip it (`ServerEnd::close` of a buffer we own).
//! - Until then our word in memory is the old one. The scan then sees the port still pending
//!   and the sweep polls its exchange, which finds the buffer not ours (the port's own state
//!   is current) and suspends again; and `ServerEnd::flags` reads the old word, so an exchange's
//!   snapshot of its flags (`dispatch`) may see one change more than there was: a pass counted
//!   as progress, nothing else.
//!
//! Without `std` nothing is deferred. Under loom the list is a `loom::thread_local!`, one per
//! model thread (loom runs them all on one thread of ours, whose `std` thread-local they would
//! share), so the models run the batch itself: `protocol::loom`'s `a_batch_*` models.

use crate::protocol::mailbox::unlock as unlock_now;
use crate::sync::{fence, AtomicU32, Ordering};

/// The most flips, and the most unlocks, that wait before a batch is published.
pub(crate) const MAX: usize = 16;

#[cfg(feature = "std")]
mod pending {
    use super::MAX;
    use crate::sync::{fence, AtomicU32, Ordering};
    use core::cell::RefCell;
    use core::ptr::NonNull;

    /// What waits on this thread: words to store and lock bits to clear.
    pub(super) struct Pending {
        /// Whether a [`super::Batch`] lives on this thread.
        pub(super) on: bool,
        flips: [(Option<NonNull<AtomicU32>>, u32); MAX],
        flipped: usize,
        unlocks: [(Option<NonNull<AtomicU32>>, u32); MAX],
        unlocked: usize,
    }

    /// Nothing waits, no batch lives.
    const EMPTY: Pending = Pending {
        on: false,
        flips: [(None, 0); MAX],
        flipped: 0,
        unlocks: [(None, 0); MAX],
        unlocked: 0,
    };

    #[cfg(not(loom))]
    std::thread_local! {
        pub(super) static PENDING: RefCell<Pending> = const { RefCell::new(EMPTY) };
    }

    // One list per model thread (see the module's note on loom).
    #[cfg(loom)]
    loom::thread_local! {
        pub(super) static PENDING: RefCell<Pending> = RefCell::new(EMPTY);
    }

    impl Pending {
        /// Adds a store of `value` to `word`; publishes if the list is full.
        pub(super) fn flip(&mut self, word: &AtomicU32, value: u32) {
            self.flips[self.flipped] = (Some(NonNull::from(word)), value);
            self.flipped += 1;
            if self.flipped == MAX {
                self.publish();
            }
        }

        /// Adds a clear of `bit` in the lock word `locks`; publishes if the list is full.
        pub(super) fn unlock(&mut self, locks: &AtomicU32, bit: u32) {
            self.unlocks[self.unlocked] = (Some(NonNull::from(locks)), bit);
            self.unlocked += 1;
            if self.unlocked == MAX {
                self.publish();
            }
        }

        /// Stores every waiting flip, in order, then clears every waiting lock bit.
        pub(super) fn publish(&mut self) {
            if self.flipped == 0 && self.unlocked == 0 {
                return;
            }
            // Release: every packet and header write before a flip is visible before it.
            fence(Ordering::Release);
            for &(word, value) in &self.flips[..self.flipped] {
                // SAFETY: `Batch::begin`'s caller keeps every word flipped under the batch
                // valid until the batch is dropped, and the batch publishes before that.
                let word = unsafe { word.expect("a recorded flip").as_ref() };
                word.store(value, Ordering::Relaxed);
            }
            for &(locks, bit) in &self.unlocks[..self.unlocked] {
                // SAFETY: as above, for the lock tables.
                let locks = unsafe { locks.expect("a recorded unlock").as_ref() };
                // RMW: clears our bit alone; `Release` publishes the holder's work to the next.
                locks.fetch_and(!bit, Ordering::Release);
            }
            self.flipped = 0;
            self.unlocked = 0;
        }
    }
}

/// Defers this thread's server-side flips and unlocks while it lives, and publishes them when
/// dropped (see the module's rules).
pub(crate) struct Batch {
    /// A batch belongs to the thread whose list it turned on.
    _thread: core::marker::PhantomData<*const ()>,
}

impl Batch {
    /// Starts deferring this thread's server-side flips and unlocks.
    ///
    /// # Safety
    /// Every mailbox and lock table whose ports this thread flips or unlocks while the batch
    /// lives must stay valid until it is dropped (the server thread's pass holds its mailboxes
    /// for the whole pass).
    pub(crate) unsafe fn begin() -> Batch {
        #[cfg(feature = "std")]
        pending::PENDING.with(|p| {
            let mut p = p.borrow_mut();
            debug_assert!(!p.on, "one batch at a time");
            p.on = true;
        });
        Batch {
            _thread: core::marker::PhantomData,
        }
    }
}

impl Drop for Batch {
    fn drop(&mut self) {
        #[cfg(feature = "std")]
        pending::PENDING.with(|p| {
            let mut p = p.borrow_mut();
            p.publish();
            p.on = false;
        });
    }
}

/// Stores this side's word (a flip, or a reset to the other side's value): `fence(Release)`
/// first, so every header and packet write before it is visible to whoever sees the new word
/// (see `port`'s memory-ordering note). The one place a side's word is written after open,
/// deferred or not: what waits in a batch is published first.
#[inline]
pub(crate) fn store_own_word(word: &AtomicU32, value: u32) {
    publish();
    store_now(word, value);
}

/// The store of [`store_own_word`], for a thread with nothing deferred.
#[inline]
fn store_now(word: &AtomicU32, value: u32) {
    fence(Ordering::Release);
    word.store(value, Ordering::Relaxed);
}

/// Runs `add` on this thread's list if a batch lives on the thread; says whether one did
/// (if not, the list is empty: nothing to publish first).
#[cfg(feature = "std")]
#[inline]
fn into_batch(add: impl FnOnce(&mut pending::Pending)) -> bool {
    pending::PENDING.with(|p| {
        let mut p = p.borrow_mut();
        if p.on {
            add(&mut p);
        }
        p.on
    })
}

/// Stores `value` to our `word` (a server port's flip), or defers it under a batch.
#[inline]
pub(crate) fn flip(word: &AtomicU32, value: u32) {
    #[cfg(feature = "std")]
    if into_batch(|p| p.flip(word, value)) {
        return;
    }
    store_now(word, value);
}

/// Unlocks server port `index` of `locks`, or defers it under a batch (after the port's flips).
#[inline]
pub(crate) fn unlock(locks: &[AtomicU32], index: u32) {
    #[cfg(feature = "std")]
    if into_batch(|p| {
        let (word, bit) = crate::protocol::mailbox::lock_bit(locks, index);
        p.unlock(word, bit)
    }) {
        return;
    }
    unlock_now(locks, index);
}

/// Publishes what waits on this thread now: before it waits for a client, or writes or reads
/// its own word outside a flip.
#[inline]
pub(crate) fn publish() {
    #[cfg(feature = "std")]
    pending::PENDING.with(|p| p.borrow_mut().publish());
}

#[cfg(all(test, feature = "std", not(loom)))]
mod tests {
    use super::*;

    fn words(n: usize) -> Vec<AtomicU32> {
        (0..n).map(|_| AtomicU32::new(0)).collect()
    }

    fn read(words: &[AtomicU32]) -> Vec<u32> {
        words.iter().map(|w| w.load(Ordering::Relaxed)).collect()
    }

    #[test]
    fn outside_a_batch_flips_and_unlocks_are_stored_at_once() {
        let (flags, locks) = (words(2), words(1));
        locks[0].store(0b11, Ordering::Relaxed);
        flip(&flags[1], 1);
        unlock(&locks, 0);
        assert_eq!(read(&flags), [0, 1]);
        assert_eq!(read(&locks), [0b10]);
    }

    #[test]
    fn a_batch_publishes_its_flips_in_order_then_its_unlocks_when_dropped() {
        let (flags, locks) = (words(3), words(2));
        locks[0].store(u32::MAX, Ordering::Relaxed);
        locks[1].store(u32::MAX, Ordering::Relaxed);
        // SAFETY: the words outlive the batch.
        let batch = unsafe { Batch::begin() };
        flip(&flags[0], 1);
        flip(&flags[2], 1);
        flip(&flags[0], 0); // A second flip of one port: its last value wins.
        unlock(&locks, 0);
        unlock(&locks, 37);
        assert_eq!(read(&flags), [0, 0, 0], "nothing stored yet");
        assert_eq!(read(&locks), [u32::MAX, u32::MAX], "nothing unlocked yet");
        flags[0].store(7, Ordering::Relaxed); // Overwritten by the publish, in order.
        drop(batch);
        assert_eq!(read(&flags), [0, 0, 1]);
        assert_eq!(read(&locks), [!1, !(1 << 5)]);
        // Ended: the next flip is stored at once.
        flip(&flags[1], 1);
        assert_eq!(read(&flags), [0, 1, 1]);
    }

    #[test]
    fn a_full_list_and_publish_store_at_once() {
        let (flags, locks) = (words(MAX), words(1));
        locks[0].store(u32::MAX, Ordering::Relaxed);
        // SAFETY: the words outlive the batch.
        let _batch = unsafe { Batch::begin() };
        for word in &flags[..MAX - 1] {
            flip(word, 1);
        }
        assert!(read(&flags).iter().all(|&w| w == 0), "{MAX} - 1 wait");
        flip(&flags[MAX - 1], 1);
        assert!(
            read(&flags).iter().all(|&w| w == 1),
            "the {MAX}th publishes"
        );
        unlock(&locks, 3);
        assert_eq!(read(&locks), [u32::MAX]);
        publish();
        assert_eq!(read(&locks), [!(1 << 3)]);
    }

    #[test]
    fn a_store_of_our_own_word_publishes_what_waits_first() {
        let flags = words(1);
        // SAFETY: the word outlives the batch.
        let _batch = unsafe { Batch::begin() };
        flip(&flags[0], 1);
        // A reset to the client's word (0) must not be overtaken by the deferred flip.
        store_own_word(&flags[0], 0);
        publish();
        assert_eq!(read(&flags), [0]);
    }
}

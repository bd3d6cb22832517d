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
//! the batch is published: so the server's executor defers only in passes that begin with two
//! or more exchanges in flight (a client that pipelines, or many warps), never for a request
//! alone, and at most [`MAX`] flips or unlocks wait.
//!
//! # Rules
//! - A server port's flips and unlocks go through its [`Wait`](crate::protocol::Wait)
//!   (`Wait::flip`, `Wait::unlock`; `Port::hand_over`, a server port's drop,
//!   `ServerEnd::close` and `ServerEnd::drain`): a wait that batches puts them in a [`Batch`]
//!   it keeps, the others store them at once ([`store_own_word`], [`crate::protocol::mailbox`]'s
//!   unlock). This layer keeps no batch of its own: the server keeps one per thread.
//! - A batch is published behind one release fence, the flips in the order they were made,
//!   then the unlocks: every packet written before a flip is visible before it (as with
//!   [`store_own_word`]), and a port's flips before its unlock, so whoever locks the port next
//!   reads our word as we left it.
//! - It is published when [`MAX`] flips or unlocks wait, when its owner ends it, and before its
//!   thread waits for a client (a wait's pause or spin), writes its own word otherwise (a
//!   reset) or reads it to flip it (`ServerEnd::close` of a buffer we own): `Wait::publish`.
//! - Until then our word in memory is the old one. The scan then sees the port still pending
//!   and the sweep polls its exchange, which finds the buffer not ours (the port's own state
//!   is current) and suspends again; and `ServerEnd::flags` reads the old word, so an exchange's
//!   snapshot of its flags may see one change more than there was: a pass counted as progress,
//!   nothing else.

use crate::sync::{fence, AtomicU32, Ordering};
use core::ptr::NonNull;

/// The most flips, and the most unlocks, that wait before a batch is published.
pub(crate) const MAX: usize = 16;

/// Flips and unlocks waiting to be published: words to store and lock bits to clear.
pub(crate) struct Batch {
    flips: [(Option<NonNull<AtomicU32>>, u32); MAX],
    flipped: usize,
    unlocks: [(Option<NonNull<AtomicU32>>, u32); MAX],
    unlocked: usize,
}

// SAFETY: the batch holds pointers to atomics only, which any thread may store to; that they
// are still valid when it publishes is its filler's promise (`flip`, `unlock`), wherever it
// is. (No `Drop`: a thread-local holding one then needs no destructor.)
unsafe impl Send for Batch {}

impl Batch {
    /// Nothing waits.
    pub(crate) const EMPTY: Batch = Batch {
        flips: [(None, 0); MAX],
        flipped: 0,
        unlocks: [(None, 0); MAX],
        unlocked: 0,
    };

    /// Adds a store of `value` to `word`; publishes if the list is full.
    ///
    /// # Safety
    /// `word` stays valid until the batch is next published (its owner publishes it before it
    /// lets go of the mailboxes it flipped: no drop does).
    pub(crate) unsafe fn flip(&mut self, word: &AtomicU32, value: u32) {
        self.flips[self.flipped] = (Some(NonNull::from(word)), value);
        self.flipped += 1;
        if self.flipped == MAX {
            self.publish();
        }
    }

    /// Adds a clear of server port `index`'s bit in `locks`; publishes if the list is full.
    ///
    /// # Safety
    /// `locks` stays valid until the batch is next published (as for `flip`).
    pub(crate) unsafe fn unlock(&mut self, locks: &[AtomicU32], index: u32) {
        let (word, bit) = crate::protocol::mailbox::lock_bit(locks, index);
        self.unlocks[self.unlocked] = (Some(NonNull::from(word)), bit);
        self.unlocked += 1;
        if self.unlocked == MAX {
            self.publish();
        }
    }

    /// Stores every waiting flip, in order, then clears every waiting lock bit.
    pub(crate) fn publish(&mut self) {
        if self.flipped == 0 && self.unlocked == 0 {
            return;
        }
        // Release: every packet and header write before a flip is visible before it.
        fence(Ordering::Release);
        for &(word, value) in &self.flips[..self.flipped] {
            // SAFETY: `flip`'s caller keeps every word it added valid until this publish.
            let word = unsafe { word.expect("a recorded flip").as_ref() };
            word.store(value, Ordering::Relaxed);
        }
        for &(locks, bit) in &self.unlocks[..self.unlocked] {
            // SAFETY: as above, for the lock tables (`unlock`).
            let locks = unsafe { locks.expect("a recorded unlock").as_ref() };
            // RMW: clears our bit alone; `Release` publishes the holder's work to the next.
            locks.fetch_and(!bit, Ordering::Release);
        }
        self.flipped = 0;
        self.unlocked = 0;
    }
}

/// Stores this side's word (a flip, or a reset to the other side's value): `fence(Release)`
/// first, so every header and packet write before it is visible to whoever sees the new word
/// (see `port`'s memory-ordering note). The one place a side's word is written after open
/// outside a [`Batch`] (the caller published its wait's batch first, where it has one).
#[inline]
pub(crate) fn store_own_word(word: &AtomicU32, value: u32) {
    fence(Ordering::Release);
    word.store(value, Ordering::Relaxed);
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
    fn a_batch_publishes_its_flips_in_order_then_its_unlocks() {
        let (flags, locks) = (words(3), words(2));
        locks[0].store(u32::MAX, Ordering::Relaxed);
        locks[1].store(u32::MAX, Ordering::Relaxed);
        let mut batch = Batch::EMPTY;
        // SAFETY: the words outlive the batch.
        unsafe {
            batch.flip(&flags[0], 1);
            batch.flip(&flags[2], 1);
            batch.flip(&flags[0], 0); // A second flip of one port: its last value wins.
            batch.unlock(&locks, 0);
            batch.unlock(&locks, 37);
        }
        assert_eq!(read(&flags), [0, 0, 0], "nothing stored yet");
        assert_eq!(read(&locks), [u32::MAX, u32::MAX], "nothing unlocked yet");
        flags[0].store(7, Ordering::Relaxed); // Overwritten by the publish, in order.
        batch.publish();
        assert_eq!(read(&flags), [0, 0, 1]);
        assert_eq!(read(&locks), [!1, !(1 << 5)]);
    }

    #[test]
    fn a_full_list_and_publish_store_at_once() {
        let (flags, locks) = (words(MAX), words(1));
        locks[0].store(u32::MAX, Ordering::Relaxed);
        let mut batch = Batch::EMPTY;
        for word in &flags[..MAX - 1] {
            // SAFETY: the words outlive the batch.
            unsafe { batch.flip(word, 1) };
        }
        assert!(read(&flags).iter().all(|&w| w == 0), "{MAX} - 1 wait");
        // SAFETY: as above.
        unsafe { batch.flip(&flags[MAX - 1], 1) };
        assert!(
            read(&flags).iter().all(|&w| w == 1),
            "the {MAX}th publishes"
        );
        // SAFETY: as above.
        unsafe { batch.unlock(&locks, 3) };
        assert_eq!(read(&locks), [u32::MAX]);
        batch.publish();
        assert_eq!(read(&locks), [!(1 << 3)]);
    }
}

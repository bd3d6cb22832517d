//! Users: the kernels (or other clients) that may send requests, which keep the worker awake.
//! A [`UserGuard`] is one user; the count and the wake-ups it causes belong to the worker's
//! state machine ([`ServerThread::add_user`], [`ServerThread::remove_user`]), so that the
//! argument why no wake-up is lost is in one file (`thread.rs`).

use std::collections::BTreeSet;

use crate::server::Inner;
use crate::sync::{lock, Arc, AtomicU64, Mutex, Ordering};

/// A kernel (or other client) that may send requests: while any guard lives the worker stays
/// awake. Dropping it ends the use.
#[must_use = "the worker sleeps again once the guard is dropped"]
pub struct UserGuard {
    inner: Arc<Inner>,
    covered: Arc<Coverage>,
    ticket: u64,
}

/// The users covering some mailboxes (one mailbox, or all of them). Each user gets a ticket in
/// arrival order; a port opened when `arrivals` was A belongs to a kernel holding a ticket
/// below A, so once the oldest live ticket is A or more, no kernel that could own the port runs.
///
/// Changed only under the server thread's `control` lock; the worker reads the atomics without
/// it (Relaxed: a stale value only delays abandoning a wait by one poll).
pub(crate) struct Coverage {
    live: Mutex<BTreeSet<u64>>,
    arrivals: AtomicU64,
    /// The smallest live ticket, or `u64::MAX` when there is none.
    oldest_live: AtomicU64,
}

impl Default for Coverage {
    fn default() -> Self {
        Coverage {
            live: Mutex::new(BTreeSet::new()),
            arrivals: AtomicU64::new(0),
            oldest_live: AtomicU64::new(u64::MAX),
        }
    }
}

impl Coverage {
    pub(super) fn arrive(&self) -> u64 {
        // RMW: hands out each ticket once.
        let ticket = self.arrivals.fetch_add(1, Ordering::Relaxed);
        let mut live = lock(&self.live);
        live.insert(ticket);
        self.oldest_live
            .store(*live.first().expect("just inserted"), Ordering::Relaxed);
        ticket
    }
    pub(super) fn leave(&self, ticket: u64) {
        let mut live = lock(&self.live);
        live.remove(&ticket);
        self.oldest_live
            .store(live.first().copied().unwrap_or(u64::MAX), Ordering::Relaxed);
    }
    /// The mark to test a port opened now against.
    pub(crate) fn mark(&self) -> u64 {
        self.arrivals.load(Ordering::Relaxed)
    }
    /// True if every user that had arrived at `mark` has left.
    pub(crate) fn gone_since(&self, mark: u64) -> bool {
        self.oldest_live.load(Ordering::Relaxed) >= mark
    }
}

impl UserGuard {
    pub(crate) fn new(inner: &Arc<Inner>, covered: Arc<Coverage>) -> Self {
        let ticket = inner.thread.add_user(&covered);
        UserGuard {
            inner: inner.clone(),
            covered,
            ticket,
        }
    }
}

impl Drop for UserGuard {
    fn drop(&mut self) {
        self.inner.thread.remove_user(&self.covered, self.ticket);
    }
}

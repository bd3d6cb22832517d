//! The one sync shim: every other file takes its atomics, locks and threads from here, so the
//! same code runs on std/core and under `loom` (`RUSTFLAGS="--cfg loom"`), where loom's types
//! explore every interleaving of a small model.

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{
    fence, AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering,
};
#[cfg(all(feature = "std", loom))]
pub(crate) use loom::{
    sync::{Arc, Condvar, Mutex, MutexGuard},
    thread,
};

#[cfg(not(loom))]
pub(crate) use core::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
// Only the server (`std`) uses these.
#[cfg(all(feature = "std", not(loom)))]
pub(crate) use core::sync::atomic::{AtomicBool, AtomicUsize};
#[cfg(all(feature = "std", not(loom)))]
pub(crate) use std::{
    sync::{Arc, Condvar, Mutex, MutexGuard},
    thread,
};

/// A word of a port's header or packets: the data the protocol's flags hand from one side to
/// the other. Outside loom it is an `AtomicU64` (relaxed loads and stores, ordered by the
/// fences around the flags: see `port`'s memory-ordering note).
#[cfg(not(loom))]
pub(crate) type DataWord = AtomicU64;

/// A word of a port's header or packets, under loom: the atomic, shadowed by a
/// `loom::cell::UnsafeCell` that every load reads and every store writes. Relaxed atomics
/// never race, so without the shadow loom could not tell whether the fences order one side's
/// use of a buffer before the other side's; with it, an access not ordered after the other
/// side's last one (a missing or misplaced acquire or release fence) is a data race on the
/// cell, which loom reports in the interleaving where it happens.
#[cfg(loom)]
pub(crate) struct DataWord {
    value: AtomicU64,
    shadow: loom::cell::UnsafeCell<()>,
}

// SAFETY: the shadow cell holds `()`: nothing is ever read or written through it, it only
// gives loom an access to check (loom's own bookkeeping of it is synchronised by loom).
#[cfg(loom)]
unsafe impl Sync for DataWord {}

#[cfg(loom)]
impl DataWord {
    pub(crate) fn new(value: u64) -> Self {
        DataWord {
            value: AtomicU64::new(value),
            shadow: loom::cell::UnsafeCell::new(()),
        }
    }
    #[track_caller]
    pub(crate) fn load(&self, order: Ordering) -> u64 {
        self.shadow.with(|_| ());
        self.value.load(order)
    }
    #[track_caller]
    pub(crate) fn store(&self, value: u64, order: Ordering) {
        self.shadow.with_mut(|_| ());
        self.value.store(value, order)
    }
}

/// One step of a busy wait. Under loom this yields, so the model checker can run the thread
/// being waited for; elsewhere it is a CPU spin hint.
#[inline]
pub(crate) fn spin_hint() {
    #[cfg(loom)]
    loom::thread::yield_now();
    #[cfg(not(loom))]
    core::hint::spin_loop();
}

/// Locks a mutex, ignoring poisoning: every critical section in this crate leaves its data
/// consistent before anything that can panic, so a poisoned lock holds valid data.
#[cfg(feature = "std")]
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Waits on `cv` (`guard` released meanwhile) while `waiting` holds of the guarded value, but
/// not past `deadline`: a deadline, not a timeout per wake-up, so notifications and spurious
/// wake-ups do not restart it. Returns the guard; `waiting` may still hold (the deadline
/// passed).
#[cfg(feature = "std")]
pub(crate) fn wait_until<'a, T>(
    cv: &Condvar,
    mut guard: MutexGuard<'a, T>,
    deadline: std::time::Instant,
    mut waiting: impl FnMut(&T) -> bool,
) -> MutexGuard<'a, T> {
    while waiting(&guard) {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            break;
        }
        guard = cv
            .wait_timeout(guard, left)
            .unwrap_or_else(|e| e.into_inner())
            .0;
    }
    guard
}

/// Spawns a named thread (loom's threads have no names).
#[cfg(all(feature = "std", not(loom)))]
pub(crate) fn spawn(
    name: std::string::String,
    body: impl FnOnce() + Send + 'static,
) -> std::io::Result<thread::JoinHandle<()>> {
    thread::Builder::new().name(name).spawn(body)
}

/// Spawns a thread (loom's threads have no names).
#[cfg(all(feature = "std", loom))]
pub(crate) fn spawn(
    _name: String,
    body: impl FnOnce() + Send + 'static,
) -> std::io::Result<thread::JoinHandle<()>> {
    Ok(thread::spawn(body))
}

//! The one sync shim: every other file takes its atomics, locks and threads from here, so the
//! same code runs on std/core and under `loom` (`RUSTFLAGS="--cfg loom"`), where loom's types
//! explore every interleaving of a small model.

#[cfg(loom)]
pub use loom::sync::atomic::{
    fence, AtomicBool, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering,
};
#[cfg(all(feature = "std", loom))]
pub use loom::{
    sync::{Arc, Condvar, Mutex, MutexGuard},
    thread,
};

#[cfg(not(loom))]
pub use core::sync::atomic::{
    fence, AtomicBool, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering,
};
#[cfg(all(feature = "std", not(loom)))]
pub use std::{
    sync::{Arc, Condvar, Mutex, MutexGuard},
    thread,
};

/// One step of a busy wait. Under loom this yields, so the model checker can run the thread
/// being waited for; elsewhere it is a CPU spin hint.
#[inline]
pub fn spin_hint() {
    #[cfg(loom)]
    loom::thread::yield_now();
    #[cfg(not(loom))]
    core::hint::spin_loop();
}

/// Locks a mutex, ignoring poisoning: every critical section in this crate leaves its data
/// consistent before anything that can panic, so a poisoned lock holds valid data.
#[cfg(feature = "std")]
pub fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

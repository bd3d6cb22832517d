//! The I/O threads of one server: blocking calls (opening and reading files, FIFOs and
//! terminals, SYSTEM, host calls) run here, so the server thread never blocks in a syscall.
//!
//! A handler hands a call over with [`crate::Request::blocking`]; its exchange suspends, the
//! port held, until a thread has run the call and left the result in the call's slot, which
//! the exchange finds at its next poll. Threads are started as calls come, up to
//! `ServerConfig::io_threads`, and wait on a condition variable when there is nothing to do.
//!
//! A call whose exchange was dropped while it waited in the queue (abandoned: its kernel
//! gone, its mailbox detached) is not run. A shutdown stops the threads: queued calls are
//! dropped (their exchanges are being abandoned anyway), idle threads leave at once, and a thread inside a call leaves when it returns.
//! `shutdown` waits `ServerConfig::io_grace` for that and then *abandons* the threads still
//! inside a call (stuck in a `read` on a FIFO nobody writes, say): they are logged, counted in
//! `io_threads_abandoned`, never joined; each leaves by itself if its call ever returns. Each
//! start of the server begins a new *generation*: a thread serves only the generation it was
//! started for.
//!
//! | field | written by | when |
//! |---|---|---|
//! | `calls`, `threads`, `idle`, `generation`, `lingering` | submit, threads, stop | under `state` |
//! | a call's slot | the thread that ran it, then the exchange that takes it | under the slot's lock |

use std::boxed::Box;
use std::collections::VecDeque;
use std::string::String;
use std::time::Instant;

use crate::server::error::ServerError;
use crate::server::stats::bump;
use crate::server::{panic_message, Inner, ServerContext};
use crate::sync::{lock, wait_until, Arc, Condvar, Mutex};

type Call = Box<dyn FnOnce() + Send>;

#[derive(Default)]
struct PoolState {
    calls: VecDeque<Call>,
    /// Threads of the current generation, and how many of them wait for a call.
    threads: usize,
    idle: usize,
    generation: u64,
    /// Threads of stopped generations not yet gone (finishing or stuck in a call).
    lingering: usize,
}

/// The I/O threads of one server (see the module docs).
#[derive(Default)]
pub(crate) struct IoPool {
    state: Mutex<PoolState>,
    /// Signalled on a new call and on a stop.
    work: Condvar,
    /// Signalled when a thread of a stopped generation leaves.
    left: Condvar,
}

/// Where a thread leaves a call's result for the exchange that waits for it.
type Slot<R> = Mutex<Option<core::result::Result<R, String>>>;

/// Runs `call` on one of `inner`'s I/O threads; resolves to its result once it ran (a panic in
/// it becomes [`ServerError::Panicked`]).
pub(crate) async fn run<R: Send + 'static>(
    inner: &Arc<Inner>,
    call: impl FnOnce(&ServerContext) -> R + Send + 'static,
) -> Result<R, ServerError> {
    let slot: Arc<Slot<R>> = Arc::new(Mutex::new(None));
    let job: Call = {
        let (inner, slot) = (inner.clone(), slot.clone());
        Box::new(move || {
            // The exchange holds the other reference until it takes the result: alone, the
            // exchange was dropped (abandoned, its mailbox detached) while this call waited in
            // the queue, and nobody wants it. Not run, so it cannot act for a gone client
            // (open a file, read the next client's stdin). A hint: an exchange dropped later
            // finds the call running, which runs to its end.
            if Arc::strong_count(&slot) == 1 {
                return;
            }
            let result =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| call(&inner.context)));
            *lock(&slot) = Some(result.map_err(|panic| panic_message(panic.as_ref())));
        })
    };
    inner.io.submit(inner, job)?;
    bump(&inner.context.stats.blocking_calls);
    let result = core::future::poll_fn(|_| match lock(&slot).take() {
        Some(result) => core::task::Poll::Ready(result),
        None => core::task::Poll::Pending,
    })
    .await;
    result.map_err(ServerError::Panicked)
}

impl IoPool {
    /// Queues a call, starting a thread if none is idle and the limit allows.
    fn submit(&self, inner: &Arc<Inner>, call: Call) -> Result<(), ServerError> {
        let mut state = lock(&self.state);
        state.calls.push_back(call);
        if state.idle >= state.calls.len()
            || state.threads >= inner.context.config.io_threads.max(1)
        {
            self.work.notify_one();
            return Ok(());
        }
        let generation = state.generation;
        let thread_inner = inner.clone();
        let name = std::format!("rpc-{}-io", inner.context.config.name);
        match crate::sync::spawn(name, move || io_thread(thread_inner, generation)) {
            Ok(_detached) => {
                state.threads += 1;
                Ok(())
            }
            Err(error) if state.threads > 0 => {
                log::warn!("{}: no new I/O thread: {error}", inner.context.config.name);
                Ok(())
            }
            Err(error) => {
                state.calls.pop_back();
                Err(ServerError::Spawn(error.to_string()))
            }
        }
    }

    /// Ends the current generation: drops queued calls and tells its threads to leave. Returns
    /// what [`IoPool::wait_stopped`] waits for.
    pub(crate) fn begin_stop(&self) -> Stopping {
        let mut state = lock(&self.state);
        let before = state.lingering;
        state.generation += 1;
        state.lingering += state.threads;
        state.threads = 0;
        state.idle = 0;
        state.calls.clear();
        self.work.notify_all();
        Stopping(before)
    }

    /// Waits until `deadline` for the threads of the generation `begin_stop` ended to leave,
    /// and returns how many are still inside a call (abandoned).
    pub(crate) fn wait_stopped(&self, Stopping(before): Stopping, deadline: Instant) -> usize {
        let state = wait_until(&self.left, lock(&self.state), deadline, |s| {
            s.lingering > before
        });
        state.lingering.saturating_sub(before)
    }

    /// [`IoPool::begin_stop`], then [`IoPool::wait_stopped`] up to `grace`.
    #[cfg(all(test, loom))]
    pub(crate) fn stop(&self, grace: std::time::Duration) -> usize {
        let stopping = self.begin_stop();
        self.wait_stopped(stopping, Instant::now() + grace)
    }
}

/// Threads of stopped generations that had not left when a stop began.
pub(crate) struct Stopping(usize);

fn io_thread(inner: Arc<Inner>, generation: u64) {
    let pool = &inner.io;
    let mut state = lock(&pool.state);
    while state.generation == generation {
        if let Some(call) = state.calls.pop_front() {
            drop(state);
            call();
            state = lock(&pool.state);
            continue;
        }
        state.idle += 1;
        state = pool.work.wait(state).unwrap_or_else(|e| e.into_inner());
        if state.generation != generation {
            break; // `stop` counted this thread out of `idle` already.
        }
        state.idle -= 1;
    }
    state.lingering -= 1;
    pool.left.notify_all();
}

use std::string::ToString;

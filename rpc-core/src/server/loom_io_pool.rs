//! loom models of the hand-off to the I/O threads (see `io_pool.rs`), on the pool alone: an
//! exchange's call runs on an I/O thread and its result comes back to the exchange's poll; a
//! stop while a call is queued or running either lets it finish or drops it unrun, never
//! both, and a later start serves again; two calls on a pool of one thread both run (no call is
//! lost between the queue, the idle count and the condition variable); a queued call whose
//! exchange was dropped never runs. The server's passes are
//! left out (`loom_dispatch` models those; a model with both did not finish within minutes):
//! what a pass does with an exchange that waits for its call is to poll it, as the models do.

use core::future::Future;
use core::pin::Pin;
use core::task::{Context, Poll, Waker};
use std::boxed::Box;
use std::time::Duration;

use crate::server::error::ServerError;
use crate::server::Inner;
use crate::sync::{thread, Arc, AtomicUsize, Ordering};
use crate::{RpcServer, ServerConfig};

/// Long enough that `stop` waits for every thread (loom's timed waits never time out).
const GRACE: Duration = Duration::from_secs(3600);

/// `loom::model` of `body` over a server with one I/O thread: `body` gets the server's state
/// and a tally for the runs of its `call`s.
fn model_one_io_thread(body: impl Fn(&Arc<Inner>, &Arc<AtomicUsize>) + Sync + Send + 'static) {
    loom::model(move || {
        let server = RpcServer::new(ServerConfig {
            io_threads: 1,
            ..ServerConfig::default()
        });
        let inner = server.inner.clone();
        let runs = Arc::new(AtomicUsize::new(0));
        body(&inner, &runs);
    });
}

/// Polls `call` as a pass polls a suspended exchange (no-op waker) until it is ready.
fn poll_until_ready<R>(call: &mut Pin<Box<impl Future<Output = Result<R, ServerError>>>>) -> R {
    let mut cx = Context::from_waker(Waker::noop());
    loop {
        match call.as_mut().poll(&mut cx) {
            Poll::Ready(result) => return result.unwrap(),
            Poll::Pending => thread::yield_now(),
        }
    }
}

/// A blocking call that counts its runs in `runs`.
fn call<'a>(
    inner: &'a Arc<Inner>,
    runs: &Arc<AtomicUsize>,
    value: u64,
) -> impl Future<Output = Result<u64, ServerError>> + 'a {
    let runs = runs.clone();
    crate::server::io_pool::run(inner, move |_| {
        // RMW: a tally of runs; the result slot's lock orders it before the exchange reads it.
        runs.fetch_add(1, Ordering::Relaxed);
        value
    })
}

#[test]
fn a_call_runs_on_an_io_thread_and_its_result_comes_back() {
    model_one_io_thread(|inner, runs| {
        let mut exchange = Box::pin(call(inner, runs, 42));
        assert_eq!(poll_until_ready(&mut exchange), 42);
        assert_eq!(runs.load(Ordering::Relaxed), 1);
        assert_eq!(inner.io.stop(GRACE), 0, "no thread is left inside a call");
    });
}

#[test]
fn a_stop_lets_a_call_finish_or_drops_it_unrun_and_a_new_start_serves() {
    model_one_io_thread(|inner, runs| {
        let mut exchange = Box::pin(call(inner, runs, 1));
        let mut cx = Context::from_waker(Waker::noop());
        // The first poll queues the call (and starts a thread); the stop races that thread.
        let first = exchange.as_mut().poll(&mut cx);
        assert_eq!(
            inner.io.stop(GRACE),
            0,
            "stop waited for the call it let run"
        );
        // Every thread of the stopped generation is gone: the call ran once, or not at all.
        let ran = runs.load(Ordering::Relaxed);
        assert!(ran <= 1);
        let outcome = match first {
            Poll::Pending => exchange.as_mut().poll(&mut cx),
            ready => ready,
        };
        match outcome {
            Poll::Ready(result) => {
                assert_eq!(result.unwrap(), 1);
                assert_eq!(ran, 1);
            }
            // Dropped unrun: its exchange is abandoned by the shutdown that stopped the pool.
            Poll::Pending => assert_eq!(ran, 0),
        }
        // The next generation serves a new call.
        let mut next = Box::pin(call(inner, runs, 2));
        assert_eq!(poll_until_ready(&mut next), 2);
        assert_eq!(runs.load(Ordering::Relaxed), ran + 1);
        assert_eq!(inner.io.stop(GRACE), 0);
    });
}

#[test]
fn two_calls_on_one_thread_both_run() {
    model_one_io_thread(|inner, runs| {
        let mut first = Box::pin(call(inner, runs, 3));
        let mut second = Box::pin(call(inner, runs, 4));
        let mut cx = Context::from_waker(Waker::noop());
        // Both queued before either is waited for: the second may find the thread busy, idle
        // or not yet started.
        let early = (first.as_mut().poll(&mut cx), second.as_mut().poll(&mut cx));
        let finish = |early: Poll<Result<u64, ServerError>>, call: &mut Pin<Box<_>>| match early {
            Poll::Ready(result) => result.unwrap(),
            Poll::Pending => poll_until_ready(call),
        };
        assert_eq!(finish(early.0, &mut first), 3);
        assert_eq!(finish(early.1, &mut second), 4);
        assert_eq!(runs.load(Ordering::Relaxed), 2);
        assert_eq!(inner.io.stop(GRACE), 0);
    });
}

#[test]
fn a_queued_call_whose_exchange_was_dropped_does_not_run() {
    model_one_io_thread(|inner, runs| {
        // The one thread is held in a first call until `open` is set.
        let open = Arc::new(AtomicUsize::new(0));
        let gate = open.clone();
        let mut first = Box::pin(crate::server::io_pool::run(inner, move |_| {
            // Acquire: pairs with the Release below (a plain flag, nothing rides on it).
            while gate.load(Ordering::Acquire) == 0 {
                thread::yield_now();
            }
        }));
        let mut second = Box::pin(call(inner, runs, 5));
        let mut cx = Context::from_waker(Waker::noop());
        let _ = first.as_mut().poll(&mut cx);
        // Queued behind the first call: the only thread is (or will be) inside that one.
        assert!(second.as_mut().poll(&mut cx).is_pending());
        drop(second); // Its exchange is abandoned.
        open.store(1, Ordering::Release);
        poll_until_ready(&mut first);
        assert_eq!(inner.io.stop(GRACE), 0);
        assert_eq!(runs.load(Ordering::Relaxed), 0, "the dropped call ran");
    });
}

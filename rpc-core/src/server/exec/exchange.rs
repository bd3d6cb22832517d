//! The block an exchange lives in: a script handler's future, pinned in memory that goes back
//! to this thread's pool (`recycle`) when the exchange ends, for the next exchange of its
//! layout, instead of to the allocator.

use std::alloc::Layout;
use std::future::Future;
use std::pin::Pin;
use std::ptr::NonNull;
use std::task::{Context, Poll};

use crate::server::error::{Outcome, ServerError};
use crate::server::recycle::{give_block, take_block};

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
mod tests {
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

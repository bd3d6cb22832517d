//! Memory a finished exchange leaves behind, kept for the next exchanges of the same thread:
//! the block that held its future (`exec`'s `Exchange`, through [`take_block`] and
//! [`give_block`]), the buffers of its `recv_n` results ([`Streams`]) and of the vectors a
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
//! Besides, the server thread keeps the buffers of the last stream too large for that budget
//! (a 1 MiB stream: [`keep_large_streams`]), until it has served nothing for
//! [`KEEP_LARGE_FOR`] ([`release_large`]). A `recv_n` grows its vectors as the bytes come
//! (never by the length a client claims, `docs/reliability.md`), so each 1 MiB stream into new
//! vectors reallocated and copied them some 5 times: about a tenth of a 32-lane stream's time
//! (`docs/performance.md`). What is kept grew to hold bytes a client really sent, so it is at
//! most about twice what a request may carry (`Limits::request_bytes`), and kept only while
//! streams keep coming.

use std::alloc::Layout;
use std::cell::RefCell;
use std::mem::ManuallyDrop;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;
use std::vec::Vec;

use crate::server::limits::Charge;

/// The most bytes one thread's pool keeps (blocks and buffer capacity together): a few hundred
/// exchanges' worth of printf state.
pub(crate) const KEEP_BYTES: usize = 256 << 10;

/// How long a silent server thread keeps the buffers of a stream larger than its budget.
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
/// pool when it is dropped ([`Streams::into_vec`] keeps them instead), and with them the
/// charge they hold on the server's memory budget (`Limits::held_bytes`).
#[derive(Debug, Default)]
pub struct Streams {
    strings: Vec<Vec<u8>>,
    /// What the strings hold of the memory budget (none if they fit their first packet).
    _charge: Option<Charge>,
    refused: bool,
}

impl Streams {
    /// Buffers from this thread's pool where it has some, for a `recv_n` to empty and fill.
    /// The large set kept (see the module docs) comes first: a `recv_n` cannot know how much
    /// it will receive, and one that gets a small set grows it again (a printf between two
    /// streams would leave only small sets on top); a small request that takes the large set
    /// gives it back when it ends.
    pub(crate) fn buffers() -> Vec<Vec<u8>> {
        with_pool(|pool| {
            pool.large.take().or_else(|| {
                let buffers = pool.streams.pop()?;
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
        Streams {
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

impl Deref for Streams {
    type Target = [Vec<u8>];
    fn deref(&self) -> &[Vec<u8>] {
        &self.strings
    }
}

impl DerefMut for Streams {
    fn deref_mut(&mut self) -> &mut [Vec<u8>] {
        &mut self.strings
    }
}

impl Drop for Streams {
    fn drop(&mut self) {
        let buffers = std::mem::take(&mut self.strings);
        if buffers.capacity() == 0 {
            return;
        }
        let bytes = kept_bytes(&buffers);
        with_pool(|pool| {
            if pool.bytes + bytes <= KEEP_BYTES {
                pool.bytes += bytes;
                pool.streams.push(buffers);
            } else if pool.keeps_large && bytes > KEEP_BYTES {
                // The last one kept: a set kept before is freed.
                pool.large = Some(buffers);
            }
        });
    }
}

/// The bytes a set of stream buffers holds, as the pool counts them. Found again when the set
/// is taken rather than kept beside it: a pushed `(buffers, bytes)` pair was written field by
/// field and copied in wider moves, a load the store buffer cannot forward, which waited for
/// the exchange's stores to shared memory (see `protocol::deferred`): 3% of the server's time
/// in the pipelined printf row.
fn kept_bytes(buffers: &Vec<Vec<u8>>) -> usize {
    buffers.capacity() * core::mem::size_of::<Vec<u8>>()
        + buffers.iter().map(Vec::capacity).sum::<usize>()
}

/// This thread keeps the buffers of the last stream too large for [`KEEP_BYTES`], until
/// [`release_large`]: only for a thread that calls that when it goes quiet (the server
/// thread; an I/O thread would keep them for ever).
pub(crate) fn keep_large_streams() {
    with_pool(|pool| pool.keeps_large = true);
}

/// Frees the stream buffers kept beyond [`KEEP_BYTES`], if any.
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
    streams: Vec<Vec<Vec<u8>>>,
    /// Bytes kept, blocks and buffers together (at most [`KEEP_BYTES`]).
    bytes: usize,
    /// The last dropped `recv_n` result too large for `bytes`, where `keeps_large`.
    large: Option<Vec<Vec<u8>>>,
    /// Set by [`keep_large_streams`].
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
mod tests {
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
        let streams: Vec<Streams> = (0..64)
            .map(|_| Streams::new(std::vec![std::vec![0u8; 8 << 10]], None, false))
            .collect();
        drop(streams);
        let kept = with_pool(|pool| pool.bytes).unwrap();
        assert!(kept <= KEEP_BYTES, "{kept} bytes kept");
    }

    #[test]
    fn a_large_stream_is_kept_only_where_asked_and_until_released() {
        let large = || Streams::new(std::vec![std::vec![9u8; 2 * KEEP_BYTES]], None, false);
        let capacity_of = |buffers: &[Vec<u8>]| buffers.first().map_or(0, Vec::capacity);
        // Run on threads of their own: the pool is per thread.
        std::thread::spawn(move || {
            drop(large());
            assert_eq!(capacity_of(&Streams::buffers()), 0, "not kept unasked");
        })
        .join()
        .unwrap();
        std::thread::spawn(move || {
            keep_large_streams();
            drop(large());
            let kept = Streams::buffers();
            assert!(capacity_of(&kept) >= 2 * KEEP_BYTES, "kept when asked");
            drop(Streams::new(kept, None, false));
            // The large set comes first, then the small ones.
            drop(Streams::new(std::vec![std::vec![1u8; 10]], None, false));
            assert!(capacity_of(&Streams::buffers()) >= 2 * KEEP_BYTES);
            assert!(capacity_of(&Streams::buffers()) < KEEP_BYTES);
            drop(large());
            release_large();
            assert_eq!(capacity_of(&Streams::buffers()), 0, "released");
        })
        .join()
        .unwrap();
    }

    #[test]
    fn dropped_streams_come_back_with_their_capacity() {
        let streams = Streams::new(
            std::vec![std::vec![5u8; 40], std::vec![6u8; 3]],
            None,
            false,
        );
        let capacity = streams[0].capacity();
        drop(streams);
        let buffers = Streams::buffers();
        assert_eq!(buffers.len(), 2);
        assert_eq!(buffers[0].capacity(), capacity);
        // Taken out with `into_vec`, they stay with the caller.
        let out = Streams::new(std::vec![std::vec![1, 2, 3]], None, false).into_vec();
        assert_eq!(out, std::vec![std::vec![1, 2, 3]]);
    }
}

//! The host: a native image's kernels run on plugin-host's CPU warps (`docs/plugins.md`,
//! "Native host images"). Each warp is one host thread, called with an [`RpcHostWarp`]; it runs
//! the program once per active lane, one lane after the other, and while a lane runs it is a
//! one-lane warp of the protocol (its mask is its own bit, its packet its own slot).

use core::cell::Cell;
use core::sync::atomic::{AtomicU64, Ordering};

/// What the plugin passes each call of a native kernel (its `call`, the plugin's one-packet
/// exchange, is unused here: this crate speaks the protocol itself).
pub use rpc_core::protocol::RpcHostWarp;

/// The lane the calling thread runs.
#[derive(Clone, Copy)]
struct Lane {
    lane: u32,
    lane_size: u32,
    block: u32,
    thread: u32,
}

std::thread_local! {
    static LANE: Cell<Option<Lane>> = const { Cell::new(None) };
}

fn current() -> Lane {
    LANE.with(Cell::get)
        .expect("rpc-device: called outside a kernel (no lane runs on this thread)")
}

/// Runs `lane` once for each active lane of `warp`, in order, with that lane current.
///
/// # Safety
/// `warp` is the warp the plugin passed this kernel, valid for the call.
pub unsafe fn run_lanes(warp: *const RpcHostWarp, mut lane: impl FnMut()) {
    // SAFETY: the caller's.
    let warp = unsafe { &*warp };
    for id in (0..warp.lane_size.min(64)).filter(|l| warp.mask >> l & 1 == 1) {
        LANE.with(|c| {
            c.set(Some(Lane {
                lane: id,
                lane_size: warp.lane_size,
                block: warp.block,
                thread: warp.warp * warp.lane_size + id,
            }))
        });
        lane();
    }
    LANE.with(|c| c.set(None));
}

pub(crate) fn lane_size() -> u32 {
    current().lane_size
}

pub(crate) fn lane_id() -> u32 {
    current().lane
}

pub(crate) fn active_mask() -> u64 {
    1 << current().lane
}

pub(crate) fn ballot(mask: u64, predicate: bool) -> u64 {
    if predicate {
        mask
    } else {
        0
    }
}

pub(crate) fn broadcast(_mask: u64, value: u64) -> u64 {
    value
}

pub(crate) fn fetch_add_system(word: &AtomicU64, value: u64) -> u64 {
    // A Rust RMW has no narrower scope than the default, which is system scope here.
    word.fetch_add(value, Ordering::Relaxed)
}

pub(crate) fn sync_lane(_mask: u64) {}

pub(crate) fn pause() {
    std::thread::yield_now();
}

pub(crate) fn thread_index() -> u32 {
    current().thread
}

pub(crate) fn block_index() -> u32 {
    current().block
}

pub(crate) fn halt() -> ! {
    loop {
        std::thread::park();
    }
}

/// Whether a lane runs on this thread (so ports can be opened).
pub(crate) fn in_lane() -> bool {
    LANE.with(Cell::get).is_some()
}

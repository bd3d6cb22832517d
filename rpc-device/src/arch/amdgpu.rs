//! AMDGPU (`amdgcn-amd-amdhsa`; wave64 as on gfx9, or wave32): `core::arch::amdgpu`'s
//! intrinsics.

use core::arch::amdgpu as gcn;
use core::sync::atomic::{AtomicU64, Ordering};

pub(crate) fn lane_size() -> u32 {
    // The mailbox's `L` is the code object's `.wavefront_size`, which this is.
    gcn::wavefrontsize()
}

pub(crate) fn lane_id() -> u32 {
    gcn::mbcnt_hi(u32::MAX, gcn::mbcnt_lo(u32::MAX, 0))
}

pub(crate) fn active_mask() -> u64 {
    // On wave32 the high half is zero.
    gcn::ballot(true)
}

pub(crate) fn ballot(mask: u64, predicate: bool) -> u64 {
    gcn::ballot(predicate) & mask
}

pub(crate) fn broadcast(_mask: u64, value: u64) -> u64 {
    // The first active lane is the first of the mask: callers pass the active lanes.
    gcn::readfirstlane_u64(value)
}

pub(crate) fn fetch_add_system(word: &AtomicU64, value: u64) -> u64 {
    // A Rust RMW has no narrower scope than the default, which is system scope here.
    word.fetch_add(value, Ordering::Relaxed)
}

pub(crate) fn sync_lane(_mask: u64) {
    // A wavefront runs in lockstep; this keeps the compiler from moving memory accesses
    // across the meeting point.
    gcn::wave_barrier();
}

pub(crate) fn pause() {
    gcn::s_sleep::<2>();
}

pub(crate) fn thread_index() -> u32 {
    gcn::workitem_id_x()
}

pub(crate) fn block_index() -> u32 {
    gcn::workgroup_id_x()
}

pub(crate) fn halt() -> ! {
    loop {
        pause();
    }
}

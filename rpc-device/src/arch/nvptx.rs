//! NVPTX (`nvptx64-nvidia-cuda`, sm_70 and later: `activemask`, `nanosleep` and the `.sync`
//! warp instructions): inline PTX for the warp, `core::arch::nvptx` for the ids.

use core::arch::asm;
use core::sync::atomic::AtomicU64;

pub(crate) fn lane_size() -> u32 {
    32
}

pub(crate) fn lane_id() -> u32 {
    let id: u32;
    // SAFETY: reads a special register; no memory, no side effect.
    unsafe { asm!("mov.u32 {0}, %laneid;", out(reg32) id, options(nomem, nostack, pure)) };
    id
}

pub(crate) fn active_mask() -> u64 {
    let mask: u32;
    // SAFETY: `activemask` only reads which lanes execute it.
    unsafe { asm!("activemask.b32 {0};", out(reg32) mask, options(nomem, nostack)) };
    u64::from(mask)
}

pub(crate) fn ballot(mask: u64, predicate: bool) -> u64 {
    let votes: u32;
    // SAFETY: a warp vote among the lanes of `mask`, every one of which runs this call (the
    // callers pass the mask of the lanes that reached it together).
    unsafe {
        asm!(
            "{{ .reg .pred %p; setp.ne.u32 %p, {1}, 0; vote.sync.ballot.b32 {0}, %p, {2}; }}",
            out(reg32) votes,
            in(reg32) u32::from(predicate),
            in(reg32) mask as u32,
            options(nomem, nostack),
        )
    };
    u64::from(votes)
}

pub(crate) fn broadcast(mask: u64, value: u64) -> u64 {
    let source = super::first_lane(mask);
    let shuffle = |half: u32| -> u32 {
        let out: u32;
        // SAFETY: a shuffle among the lanes of `mask`, all of which run it (as `ballot`).
        unsafe {
            asm!(
                "shfl.sync.idx.b32 {0}, {1}, {2}, 31, {3};",
                out(reg32) out,
                in(reg32) half,
                in(reg32) source,
                in(reg32) mask as u32,
                options(nomem, nostack),
            )
        };
        out
    };
    u64::from(shuffle(value as u32)) | u64::from(shuffle((value >> 32) as u32)) << 32
}

pub(crate) fn fetch_add_system(word: &AtomicU64, value: u64) -> u64 {
    let old: u64;
    // SAFETY: an atomic add on a live `AtomicU64`. Explicit: NVPTX lowers a Rust RMW to `atom`
    // without a scope, which is GPU scope, and the host changes this word too.
    unsafe {
        asm!(
            "atom.relaxed.sys.add.u64 {0}, [{1}], {2};",
            out(reg64) old,
            in(reg64) word.as_ptr(),
            in(reg64) value,
            options(nostack),
        )
    };
    old
}

pub(crate) fn sync_lane(mask: u64) {
    // SAFETY: a warp barrier among the lanes of `mask`, all of which run it; it also orders
    // their memory accesses before it against those after it.
    unsafe { asm!("bar.warp.sync {0};", in(reg32) mask as u32, options(nostack)) };
}

pub(crate) fn pause() {
    // SAFETY: sleeps this thread briefly; no memory.
    unsafe { asm!("nanosleep.u32 64;", options(nomem, nostack)) };
}

pub(crate) fn thread_index() -> u32 {
    // SAFETY: reads `%tid.x`, a special register.
    unsafe { core::arch::nvptx::_thread_idx_x() as u32 }
}

pub(crate) fn block_index() -> u32 {
    // SAFETY: reads `%ctaid.x`, a special register.
    unsafe { core::arch::nvptx::_block_idx_x() as u32 }
}

pub(crate) fn halt() -> ! {
    loop {
        pause();
    }
}

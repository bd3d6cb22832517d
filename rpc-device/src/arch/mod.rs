//! What is particular to each target, one small module each, all with the same functions:
//!
//! | function | meaning | NVPTX | AMDGPU | host |
//! |---|---|---|---|---|
//! | `lane_size()` | `L`, the warp's lanes | 32 | `wavefrontsize` (64 on gfx942) | the plugin's `lane_size` |
//! | `lane_id()` | this lane's index in its warp | `%laneid` | `mbcnt` | the lane being run |
//! | `active_mask()` | the lanes running this code | `activemask` | `ballot(true)` | this lane's bit |
//! | `ballot(mask, p)` | the lanes of `mask` where `p` holds | `vote.sync.ballot` | `ballot` | `p` for this lane |
//! | `broadcast(mask, v)` | the first lane of `mask`'s `v` | `shfl.sync.idx` | `readfirstlane` | `v` |
//! | `sync_lane(mask)` | the lanes of `mask` meet (and see each other's writes) | `bar.warp.sync` | `wave_barrier` | nothing |
//! | `fetch_add_system(w, v)` | an atomic add the host sees atomic | `atom.relaxed.sys.add` | `fetch_add` | `fetch_add` |
//! | `pause()` | a short back-off in a spin | `nanosleep` | `s_sleep` | `yield_now` |
//! | `thread_index()`, `block_index()` | x ids in the grid | `%tid.x`, `%ctaid.x` | workitem, workgroup | the plugin's |
//! | `halt()` | this thread stops for good | `trap`-free spin | `s_sleep` spin | parks |
//!
//! The orderings are not here: every hand-over uses `core::sync::atomic` with no scope
//! narrower than the default, which LLVM lowers to system scope on both GPUs
//! (`fence.acq_rel.sys`, `ld.relaxed.sys` / `st.relaxed.sys` on NVPTX; no `syncscope`, which
//! is system, on AMDGPU), so the host sees every hand-over in order. The exception is an NVPTX
//! read-modify-write, lowered to `atom` without a scope (GPU scope): fine for the port lock
//! bits, which only this device's warps touch, not for the doorbell's counter, which the host
//! decrements (`fetch_add_system`).
//!
//! On the host, a warp of the plugin (`RpcHostWarp`) runs its lanes one after the other on its
//! thread, each lane a one-lane warp of the protocol (its mask is its own bit): the program
//! sees SIMT lanes, the server sees ports opened by lanes of the real lane size.

#[cfg(target_arch = "amdgpu")]
mod amdgpu;
#[cfg(target_arch = "amdgpu")]
pub(crate) use amdgpu::*;

#[cfg(target_arch = "nvptx64")]
mod nvptx;
#[cfg(target_arch = "nvptx64")]
pub(crate) use nvptx::*;

#[cfg(not(any(target_arch = "nvptx64", target_arch = "amdgpu")))]
pub(crate) mod host;
#[cfg(not(any(target_arch = "nvptx64", target_arch = "amdgpu")))]
pub(crate) use host::{
    active_mask, ballot, block_index, broadcast, fetch_add_system, halt, lane_id, lane_size, pause,
    sync_lane, thread_index,
};

/// The first lane of `mask` (which is never empty: the running lane is in it).
pub(crate) fn first_lane(mask: u64) -> u32 {
    mask.trailing_zeros()
}

/// Whether the running lane is the first of `mask`, the one that does a warp's shared work.
pub(crate) fn is_first_lane(mask: u64) -> bool {
    lane_id() == first_lane(mask)
}
